"""mHC (spec/mhc.md): pre, post, fused post+pre and the head, with the implementation picked per device.

Each op goes to the first backend of BACKEND_ORDER[arch family] that can serve the call:
  * "dsv4ops"   -- this package's kernel, where built for the device and the call fits it (hc_mult 4,
                   hidden a multiple of 64, bf16 streams, fp32 parameters); DSV4OPS_DISABLE / DSV4OPS_FORCE
                   apply as for every op (dsv4ops.dispatch);
  * "aiter" / "tilelang" -- an external fused backend, only where the table lists it and only when its
                   module is importable, an adapter is registered (register_backend) and the call is
                   eligible (AITER: hc_mult 4 and hidden % 256 == 0; TileLang: hc_mult 4). No adapter
                   ships with dsv4ops: their call signatures are not pinned down by the spec;
  * "reference" -- the PyTorch reference (any stream count).
The TileLang path never appears for gfx942 (spec §6: it gives wrong results there, vLLM PR #45931), nor
for other wave64 AMD parts (spec §10 U5). Every call not served by the kernel is counted
(dsv4ops.fallback_counts()) and its reason logged once. The kernels read residual, x, fn and norm_weight 16
bytes at a time: the ops copy a strided or misaligned one to aligned memory first (eagerly and under
torch.compile alike).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Callable, Dict, Optional, Sequence

import torch

from . import dispatch
from .reference import mhc as reference


HC_MULT = 4
HIDDEN_MULTIPLE = 64  # what the kernels take (256-wide chunks of the 4 * hidden row, 8 dims per vector)
AITER_HIDDEN_MULTIPLE = 256

# Preference per architecture family; the rule of spec §6 as data.
BACKEND_ORDER: Dict[str, Sequence[str]] = {
    "gfx942": ("dsv4ops", "aiter", "reference"),
    "gfx950": ("dsv4ops", "aiter", "tilelang", "reference"),
    "amd-other": ("dsv4ops", "aiter", "reference"),
    "nvidia": ("dsv4ops", "tilelang", "reference"),
    "cpu": ("dsv4ops", "reference"),
}
EXTERNAL_MODULES = {"aiter": "aiter", "tilelang": "tilelang"}
OPS = ("mhc_pre", "mhc_post", "mhc_fused_post_pre", "hc_head")

_adapters: Dict[str, object] = {}


def arch_family(arch: str) -> str:
    if arch in ("gfx942", "gfx950", "cpu"):
        return arch
    if arch.startswith("gfx"):
        return "amd-other"
    return "nvidia" if arch.startswith("sm_") else "cpu"


def register_backend(name: str, adapter: Optional[object]) -> None:
    """Registers (or with None removes) an external backend: an object with methods named like OPS taking
    the wrappers' arguments. It is used only where BACKEND_ORDER lists `name`. torch.compile traces its methods
    as Python: for compiled models they should reach their kernels through torch custom ops."""
    if name not in EXTERNAL_MODULES:
        raise ValueError(f"unknown external mHC backend {name!r}; known: {sorted(EXTERNAL_MODULES)}")
    if adapter is None:
        _adapters.pop(name, None)
    else:
        _adapters[name] = adapter


def external_available(name: str, op: Optional[str] = None) -> bool:
    """An external backend serves `op` when its module is importable and its registered adapter has the op
    (AITER has no hc_head, for one)."""
    adapter = _adapters.get(name)
    if adapter is None or importlib.util.find_spec(EXTERNAL_MODULES[name]) is None:
        return False
    return op is None or callable(getattr(adapter, op, None))


@dataclasses.dataclass(frozen=True)
class Choice:
    backend: str
    reasons: tuple  # why each earlier backend was passed over


def select_backend(arch: str, hc_mult: int, hidden: int, kernel_reason: Optional[str],
                   available: Callable[[str], bool]) -> Choice:
    """The backend for a call, from the table alone (no device needed: tests simulate every arch).
    kernel_reason: None when the dsv4ops kernel can serve the call, else why not."""
    reasons = []
    for backend in BACKEND_ORDER[arch_family(arch)]:
        if backend == "reference":
            return Choice(backend, tuple(reasons))
        if backend == "dsv4ops":
            why = kernel_reason
        elif not available(backend):
            why = f"{backend}: not installed or no adapter registered"
        elif hc_mult != HC_MULT:
            why = f"{backend}: needs hc_mult {HC_MULT}, got {hc_mult}"
        elif backend == "aiter" and hidden % AITER_HIDDEN_MULTIPLE != 0:
            why = f"aiter: needs hidden % {AITER_HIDDEN_MULTIPLE} == 0, got {hidden}"
        else:
            why = None
        if why is None:
            return Choice(backend, tuple(reasons))
        reasons.append(why)
    raise AssertionError("every BACKEND_ORDER entry ends with the reference")


def _kernel_fit(residual: torch.Tensor, tensors: Sequence[Optional[torch.Tensor]],
                x: Optional[torch.Tensor] = None) -> Optional[str]:
    """None when the kernel can serve the call, else why not. The reasons name no token count: each is logged
    and counted once, and a model calls with many."""
    if residual.dim() != 3:
        return f"the kernel needs a residual [T, {HC_MULT}, hidden], got {residual.dim()} dims"
    if residual.shape[1] != HC_MULT:
        return f"the kernel needs hc_mult {HC_MULT} (residual [T, 4, hidden]), got {residual.shape[1]} streams"
    if residual.shape[2] % HIDDEN_MULTIPLE != 0 or residual.shape[2] == 0:
        return f"the kernel needs hidden a positive multiple of {HIDDEN_MULTIPLE}, got {residual.shape[2]}"
    if residual.dtype != torch.bfloat16:
        return f"the kernel needs a bf16 residual, got {residual.dtype}"
    if x is not None and x.dtype != torch.bfloat16:
        return f"the kernel needs a bf16 x, got {x.dtype}"
    for t in tensors:
        if t is not None and t.device != residual.device:
            return "the kernel needs every tensor on the residual's device"
    return None  # layout and alignment: the ops copy what the kernels cannot read in place


def _choose(op: str, residual: torch.Tensor, tensors: Sequence[Optional[torch.Tensor]],
            norm_weight: Optional[torch.Tensor] = None, x: Optional[torch.Tensor] = None) -> str:
    fit = _kernel_fit(residual, tensors, x)
    if fit is None and norm_weight is not None and norm_weight.dtype != torch.bfloat16:
        fit = f"the kernel takes a bf16 norm_weight, got {norm_weight.dtype}"
    decision = dispatch.decide(op, residual.device, lambda: fit)
    arch = decision.arch
    if not decision.uses_kernel and dispatch.disabled(op):  # DSV4OPS_DISABLE means the reference, as for every op
        choice = Choice("reference", (decision.reason,))
    else:
        hidden = residual.shape[2] if residual.dim() == 3 else 0
        choice = select_backend(arch, residual.shape[1] if residual.dim() == 3 else 0, hidden,
                                None if decision.uses_kernel else decision.reason,
                                lambda name: external_available(name, op))
    if choice.backend != "dsv4ops":  # counted, and logged once: why the kernel, then each earlier backend, passed
        served_by = dispatch.REFERENCE if choice.backend == "reference" else f"{choice.backend} backend"
        dispatch.record_fallback(op, arch, decision.reason, served_by, passed_over="; ".join(choice.reasons[1:]))
    return choice.backend


def _float32(t: torch.Tensor) -> torch.Tensor:
    """The op takes fp32 parameters; their layout is its own concern (it copies after its checks)."""
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            rms_eps: float = 1e-6, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
            sinkhorn_iters: int = 20, norm_weight: Optional[torch.Tensor] = None, norm_eps: float = 1e-6):
    """spec §2: residual bf16 [T, 4, hidden], fn fp32 [24, 4*hidden], scale [3], base [24] ->
    (post_mix [T, 4, 1] fp32, comb_mix [T, 4, 4] fp32, layer_input [T, hidden] bf16). With norm_weight
    (bf16 [hidden]) layer_input is also RMS-normalized with that weight (fp32, one bf16 rounding)."""
    backend = _choose("mhc_pre", residual, (fn, scale, base, norm_weight), norm_weight)
    if backend == "dsv4ops":
        return torch.ops.dsv4.mhc_pre(residual, _float32(fn), _float32(scale), _float32(base), float(rms_eps),
                                      float(pre_eps), float(sinkhorn_eps), float(post_mult), int(sinkhorn_iters),
                                      norm_weight, float(norm_eps))
    if backend != "reference":
        return _adapters[backend].mhc_pre(residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                                          sinkhorn_iters, norm_weight, norm_eps)
    return reference.mhc_pre(residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters,
                             norm_weight, norm_eps)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor):
    """spec §3: new_residual[:, j] = post_j * x + sum_i comb[i, j] * residual_i; post_mix [T, 4, 1] or
    [T, 4]. Returns bf16 [T, 4, hidden]."""
    backend = _choose("mhc_post", residual, (x, post_mix, comb_mix), x=x)
    if backend == "dsv4ops":
        return torch.ops.dsv4.mhc_post(x, residual, _float32(post_mix), _float32(comb_mix))
    if backend != "reference":
        return _adapters[backend].mhc_post(x, residual, post_mix, comb_mix)
    return reference.mhc_post(x, residual, post_mix, comb_mix)


def mhc_fused_post_pre(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor,
                       fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, rms_eps: float = 1e-6,
                       pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
                       sinkhorn_iters: int = 20, norm_weight: Optional[torch.Tensor] = None,
                       norm_eps: float = 1e-6):
    """spec §4: mhc_post, then the next sub-layer's mhc_pre on the bf16 new residual. Returns
    (residual_cur, post_mix_cur, comb_mix_cur, layer_input_cur)."""
    backend = _choose("mhc_fused_post_pre", residual, (x, post_mix, comb_mix, fn, scale, base, norm_weight),
                      norm_weight, x)
    if backend == "dsv4ops":
        return torch.ops.dsv4.mhc_fused_post_pre(
            x, residual, _float32(post_mix), _float32(comb_mix), _float32(fn), _float32(scale), _float32(base),
            float(rms_eps), float(pre_eps), float(sinkhorn_eps), float(post_mult), int(sinkhorn_iters), norm_weight,
            float(norm_eps))
    if backend != "reference":
        return _adapters[backend].mhc_fused_post_pre(x, residual, post_mix, comb_mix, fn, scale, base, rms_eps,
                                                     pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters, norm_weight,
                                                     norm_eps)
    return reference.mhc_fused_post_pre(x, residual, post_mix, comb_mix, fn, scale, base, rms_eps, pre_eps,
                                        sinkhorn_eps, post_mult, sinkhorn_iters, norm_weight, norm_eps)


def hc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            rms_eps: float = 1e-6, eps: float = 1e-6):
    """spec §4: the streams collapsed with pre = sigmoid((rmsnorm(x) . fn^T) * scale + base) + eps; fn fp32
    [4, 4*hidden], scale [1], base [4] (vLLM's HCHeadOp order, as mhc_pre's scale before base). Returns bf16
    [T, hidden]."""
    backend = _choose("hc_head", residual, (fn, scale, base))
    if backend == "dsv4ops":
        return torch.ops.dsv4.hc_head(residual, _float32(fn), _float32(scale), _float32(base), float(rms_eps),
                                      float(eps))
    if backend != "reference":
        return _adapters[backend].hc_head(residual, fn, scale, base, rms_eps, eps)
    return reference.hc_head(residual, fn, scale, base, rms_eps, eps)
