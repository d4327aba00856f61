"""DSv4 attention output projection wo_a (spec/wo_a.md): the FP8 path (inverse RoPE + UE8M0 group-128
quantization, then a grouped FP8 GEMM on the checkpoint's own FP8 weight with its 128x128 UE8M0 block
scales) or the BF16 path (inverse RoPE, then a BF16 grouped einsum on the dequantized weight).

    plan = prepare_wo_a(weight, weight_scale, n_groups, o_lora_rank, cos_sin, device)   # once, at load
    z = wo_a_forward(o, positions, plan, apply_inverse_rope=True)                                   # [T, G * 1024]

prepare_wo_a applies the acceptance gates in order and logs the reason of a refusal once.
`apply_inverse_rope` says whether o's rope lanes are still in the rotated frame (True: rotate them back
here) or the attention has already rotated them back (False); it is never inferred (spec §2).
The ops themselves (inverse_rope_group_quant, bmm_a8w8_mxscale, inverse_rope) are in this module too,
with the reference serving devices that have no kernel yet.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Optional, Tuple

import torch

from . import dispatch
from .fp8 import e4m3fn_to_fnuz, float_to_ue8m0_lossless, fp8_block_dequantize, ue8m0_to_float
from .platform import Fp8Format, format_and_quant_max
from .reference import fp8 as reference_fp8
from .reference import wo_a as reference


HEAD_DIM = 512
ROPE_DIM = 64
SCALE_BLOCK = 128
GROUP_SIZE = 128

# Which implementation serves an FP8 plan's projection for T tokens and G groups, per platform, as data:
# {platform: {G: rows}}, rows (largest T served, path) in increasing T, the last one unbounded (None). Platforms
# (path_table_key): "cuda" (NVIDIA), "rocm" (AMD GPUs, which torch also calls device type "cuda"), "cpu".
# A plan takes the rows of the largest listed G <= its G (the smallest listed G below that). Paths:
#   "fp8_kernel"  quantize (inverse_rope_group_quant) + dsv4ops' grouped FP8 GEMM (bmm_a8w8_mxscale);
#   "vendor_fp8"  the same quantization + the vendor block-scaled FP8 GEMM (torch._scaled_mm with 1x128 /
#                 128x128 scales, one call per group, T padded to VENDOR_ROW_MULTIPLE rows; our kernel for a
#                 shape it refuses; CUDA with OCP operands and T >= 1 only; outside CUDA-graph capture only
#                 from VENDOR_EAGER_FROM_ROWS and for the first call (_vendor_gemm_serves); else "fp8_kernel");
#   "bf16"        the BF16 path (inverse RoPE, BF16 einsum on the dequantized weight, built on first use: it
#                 doubles this layer's weight memory once chosen).
# Platforms not listed (ROCm: not measured yet) take "fp8_kernel". Tune the rows from bench/bench_wo_a.py on the
# target GPU.
# cuda: H200 (2026-12-01; N = 1024, K = 4096), end-to-end wo_a_forward times in graph replay, quantization included,
# one weight per input set (us; our kernel with reduced-precision block sums as the forward runs it / the BF16 path /
# cuBLAS block-scaled FP8): G=8 ours to T = 1024 (19.9 / 29.3 / 155 at 64; 40.7 / 49.2 / 168 at 256; 74.5 / 80.0 /
# 182 at 512; 144.5 / 157.5 / 206 at 1024, since the wgmma kernel's one-factor fold), cuBLAS from 4096 (440 vs 538
# ours, 606 BF16 path);
# G=16 ours to T = 1024 (81.2 / 88.9 at 256; 301 / 314 / 388 at 1024), cuBLAS from 4096 (852 vs 1185);
# G=2 ours at 1024 (40.9 / 42.9 / 68.3), cuBLAS from 4096 (131 vs 150 ours, 158); G=1: ours to T = 16, the BF16
# path from 64 to 4097 (2026-12-05, forward vs BF16 path: 7.2 / 9.4 at 1, 7.7 / 9.8 at 16, but 12.6 / 10.2 at 64,
# 16.3 / 13.3 at 256, 24.7 / 23.1 at 1024; cuBLAS 74.7 / 69.3 at 4097; earlier at 4096: 78.6 ours, 75.9 cuBLAS,
# 68.4 BF16), cuBLAS at 16384 (211 vs 269 BF16).
# Crossovers between the measured T are unmeasured; each row ends at the last T measured on its side.
WO_A_GEMM_PATHS = {
    "cuda": {
        1: ((16, "fp8_kernel"), (4097, "bf16"), (None, "vendor_fp8")),
        2: ((1024, "fp8_kernel"), (None, "vendor_fp8")),
        8: ((1024, "fp8_kernel"), (None, "vendor_fp8")),
        16: ((1024, "fp8_kernel"), (None, "vendor_fp8")),
    },
    "cpu": {1: ((None, "fp8_kernel"),)},
}
GEMM_PATH_NAMES = ("fp8_kernel", "vendor_fp8", "bf16")


def path_table_key(device: torch.device) -> str:
    """WO_A_GEMM_PATHS's key for a device: its type, with AMD GPUs (device type "cuda" in torch) as "rocm"."""
    return "rocm" if device.type == "cuda" and torch.version.hip else device.type


def _row_for_groups(by_groups: dict, groups: int):
    """The entry of the largest listed G <= groups (of the smallest listed G when there is none)."""
    listed = sorted(by_groups)
    return by_groups[max([g for g in listed if g <= groups], default=listed[0])]


def gemm_path(tokens: int, groups: int, platform_key: str, table: Optional[dict] = None) -> str:
    """The path WO_A_GEMM_PATHS (or `table`) gives `tokens` tokens of a `groups`-group plan on `platform_key`
    (path_table_key)."""
    by_groups = (table if table is not None else WO_A_GEMM_PATHS).get(platform_key)
    if not by_groups:
        return "fp8_kernel"
    for bound, path in _row_for_groups(by_groups, groups):
        if bound is None or tokens <= bound:
            return path
    return "fp8_kernel"


# (M, G) the vendor GEMM refused: served by our kernel from then on (per process; N, K, dtypes and the GPU are not in
# the key: one model's layers share them).
_vendor_refused: set = set()
# Errors that say nothing about the shape (memory, a failed device): raised, never taken for a refusal.
_NOT_REFUSALS = (torch.OutOfMemoryError,) + ((torch.AcceleratorError,) if hasattr(torch, "AcceleratorError") else ())
# cuBLAS's block-scaled FP8 GEMM refuses a row count M that is not a multiple of 4 (H200, CUDA 13: M = 1, 2, 3, 7,
# 9, ..., 129, 255, 4095 refused; 4, 8, ..., 128, 1000 served): the vendor path quantizes into buffers padded to a
# multiple of this many rows (pad rows zero) and drops the pad rows of the product.
VENDOR_ROW_MULTIPLE = 4


def _vendor_block_scaled_bmm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale_factors: torch.Tensor,
                             out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm per group with fp32 power-of-two block scales: A [M, K] with its (M, K/128) scale in
    column-major layout, B = w[g].t() with the (K/128, N/128) scale (w_scale_factors [G, N/128, K/128]: the plan's
    2^(w_scale - 127), converted once), each group's product written straight into its columns of the [M, G, N] result
    (H200, N = 1024, K = 4096, M = 16384: 7-9% faster than stacking them at G = 2, 8 and 16; the same bits). M a
    multiple of VENDOR_ROW_MULTIPLE."""
    rows, groups = x_scale.shape[:2]
    # The row scales in two kernels, whatever G: the bytes copied group-major, then converted; group g's (M, K/128)
    # scale is then the column-major view cuBLAS reads (a copy per group cost a kernel per group, replayed too).
    sx = ue8m0_to_float(x_scale.permute(1, 2, 0))
    result = torch.empty(rows, groups, w.shape[1], device=x.device, dtype=out_dtype)
    for g in range(groups):
        torch._scaled_mm(x[:, g], w[g].t(), scale_a=sx[g].t(), scale_b=w_scale_factors[g].t(), out_dtype=out_dtype,
                         out=result[:, g])
    return result


# From how many (padded) rows the vendor GEMM also serves calls outside CUDA-graph capture, per platform and G (the
# entry of the largest listed G <= a plan's G); None: never. Outside capture its host cost is paid call by call (a
# profile on the H200 machine, torch 2.11: ~60 us a per-group cuBLAS call, ~90 us for the scale conversions, which
# have since become two kernels a call), which only a long GEMM hides. The first measured T where it wins, forward
# issued back to back (H100 80GB HBM3, 2026-12-05, us, vendor / our kernel's path / BF16 path): G=1 T=8192 187 / 143
# / 143, T=16384 211 / 277 / 286; G=2 T=4096 450 / 149 / 164, T=8192 231 / 278 / 324; G=8 T=4096 585 / 550 / 641,
# T=8192 789 / 1097 / 1341; G=16 T=2048 690 / 556 / 636 (our kernel's table row), T=4096 833 / 1110 / 1246. Not
# re-measured on the H200, whose earlier estimates agreed at 16384 (G=8 1605 vs ~2190, G=16 3111 vs ~4300).
VENDOR_EAGER_FROM_ROWS = {"cuda": {1: 16384, 2: 8192, 8: 8192, 16: 4096}}

_vendor_ready: set = set()  # (device, thread) pairs whose vendor GEMM has run: cuBLAS's handles are per thread


def _vendor_gemm_serves(device: torch.device, rows: int, groups: int) -> bool:
    """Whether a vendor_fp8 call of `rows` (padded) rows takes the vendor GEMM: while a CUDA graph is being captured
    (replays do not pay its host cost); for the first call of a device and thread outside capture, which sets cuBLAS
    up (it cannot create its handle inside a capture: CUBLAS_STATUS_NOT_INITIALIZED, the capture lost); and from
    VENDOR_EAGER_FROM_ROWS on. Our kernel serves the other calls (H100, G = 8, T = 4096, forward issued back to back:
    546 us against 625 us for the BF16 path, where the cuBLAS path took 880 us on the H200; 419 us replayed)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    if (device, threading.get_ident()) not in _vendor_ready:
        return True
    by_groups = VENDOR_EAGER_FROM_ROWS.get(path_table_key(device))
    eager_from = _row_for_groups(by_groups, groups) if by_groups else None
    return eager_from is not None and rows >= eager_from


def _vendor_bmm_or_kernel(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                          w_scale_factors: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The vendor GEMM where it serves (_vendor_gemm_serves, asked when the call runs, so also inside a compiled
    graph), else, or where it refuses the shape, our kernel with the vendor's block-sum numerics (a refusal is logged
    once per G; the shape is not offered to the vendor again)."""
    shape = (x.shape[0], x.shape[1])
    if shape not in _vendor_refused and _vendor_gemm_serves(x.device, shape[0], shape[1]):
        try:
            result = _vendor_block_scaled_bmm(x, w, x_scale, w_scale_factors, out_dtype)
            _vendor_ready.add((x.device, threading.get_ident()))
            return result
        except _NOT_REFUSALS:
            raise
        except (RuntimeError, ValueError) as error:  # cuBLAS: RuntimeError; torch's own scaling checks: ValueError
            _vendor_refused.add(shape)
            first_line = (str(error).splitlines() or [repr(error)])[0][:160]
            dispatch.log_once(("wo_a", "vendor", shape[1]), logging.WARNING,
                              "dsv4ops: wo_a falls back to the dsv4ops FP8 GEMM: the vendor block-scaled GEMM refused "
                              "G=%d M=%d (logged once per G): %s", shape[1], shape[0], first_line)
    return _kernel_bmm(x, w, x_scale, w_scale, out_dtype)


def _kernel_bmm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
    """The forward's own FP8 GEMM: block sums in the matrix unit's precision, like the vendor GEMM's (see
    bmm_a8w8_mxscale)."""
    return bmm_a8w8_mxscale(x, w, x_scale, w_scale, out_dtype, reduced_precision_block_sums=True)


# Under torch.compile the vendor GEMM is this opaque op, run eagerly: Inductor's lowering of the block-scaled
# torch._scaled_mm fails on symbolic shapes (torch 2.11: "Inductor Triton does not support scale_a.shape"), a
# refusal could not be caught inside a graph, and Dynamo refuses the strided out= the groups are written with.
@torch.library.custom_op("dsv4_vendor::block_scaled_bmm", mutates_args=())
def _vendor_bmm_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                   w_scale_factors: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return _vendor_bmm_or_kernel(x, w, x_scale, w_scale, w_scale_factors, out_dtype)


@_vendor_bmm_op.register_fake
def _(x, w, x_scale, w_scale, w_scale_factors, out_dtype):
    return x.new_empty((x.shape[0], x.shape[1], w.shape[1]), dtype=out_dtype)


def _bf16_fit(o: torch.Tensor) -> Optional[str]:
    return None if o.dtype == torch.bfloat16 else f"the kernel takes bf16 o, got {o.dtype}"


def inverse_rope_group_quant(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, num_groups: int,
                             group_size: int = GROUP_SIZE, fp8_format=None, quant_max: Optional[float] = None, *,
                             apply_inverse_rope: bool, out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """o bf16 [S, H, 512] -> (x_fp8 [S, G, D], x_scale uint8 [S, G, D / group_size]), D = H * 512 / G: the
    inverse rotation of lanes 448..511 of every head when `apply_inverse_rope`, then per (token, group of group_size
    lanes) an RCEIL UE8M0 scale and FP8 values (spec §3). cos_sin [P, 64] (cos || sin), fp32 or bf16;
    positions int32/int64 clamped to [0, P - 1]. Encoding and quant max default to the device's.
    apply_inverse_rope has no default: whether o's rope lanes are still rotated is never inferred (spec §2).
    out: caller-owned (x_fp8, x_scale) of those shapes on o's device (x_fp8 contiguous, in the encoding's dtype or
    uint8; x_scale uint8 or float8_e8m0fnu, at any non-overlapping strides), filled and returned."""
    fmt, qmax = format_and_quant_max(o.device, fp8_format, quant_max)
    if dispatch.choose("inverse_rope_group_quant", o.device, lambda: _bf16_fit(o)).uses_kernel:
        args = (o.contiguous(), positions.contiguous(), cos_sin.contiguous(), int(num_groups), int(group_size),
                int(fmt), qmax, bool(apply_inverse_rope))
        if out is None:
            return torch.ops.dsv4.inverse_rope_group_quant(*args)
        torch.ops.dsv4.inverse_rope_group_quant.out(*args, x_fp8=out[0], x_scale=out[1])
        return out
    if out is not None:
        _check_group_quant_out(o, out, int(num_groups), int(group_size), fmt)
    result = reference.inverse_rope_group_quant(o, positions, cos_sin, int(num_groups), int(group_size), fmt, qmax,
                                                bool(apply_inverse_rope))
    if out is None:
        return result
    for given, made in zip(out, result):
        given.view(torch.uint8).copy_(made.view(torch.uint8))  # the bytes, as the kernel writes them
    return out


def _check_group_quant_out(o: torch.Tensor, out, num_groups: int, group_size: int, fmt: Fp8Format) -> None:
    """The .out op's checks on caller-owned outputs, for the reference path (before it computes)."""
    if o.dim() != 3 or num_groups <= 0 or group_size <= 0 or (o.shape[1] * o.shape[2]) % (num_groups * group_size):
        return  # the reference refuses these inputs with its own message
    depth = o.shape[1] * o.shape[2] // num_groups
    payload_dtypes = (fmt.torch_dtype, torch.uint8)
    for name, given, shape, dtypes in (("x_fp8", out[0], (o.shape[0], num_groups, depth), payload_dtypes),
                                       ("x_scale", out[1], (o.shape[0], num_groups, depth // group_size),
                                        reference_fp8.UE8M0_DTYPES)):
        if tuple(given.shape) != shape or given.dtype not in dtypes or given.device != o.device:
            raise ValueError(f"inverse_rope_group_quant: {name} must be {shape} in one of {dtypes} on {o.device}, "
                             f"got {given.dtype} {tuple(given.shape)} on {given.device}")
    if not out[0].is_contiguous():
        raise ValueError("inverse_rope_group_quant: x_fp8 must be contiguous (x_scale may be strided)")


def inverse_rope(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """The BF16 path's inverse rotation: lanes 448..511 of every head in fp32, rounded once to bf16."""
    if dispatch.choose("inverse_rope", o.device, lambda: _bf16_fit(o)).uses_kernel:
        return torch.ops.dsv4.inverse_rope(o.contiguous(), positions.contiguous(), cos_sin.contiguous())
    return reference.inverse_rope(o, positions, cos_sin)


def bmm_a8w8_mxscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16, out: Optional[torch.Tensor] = None,
                     reduced_precision_block_sums: bool = False) -> torch.Tensor:
    """Y [M, G, N] = the grouped FP8 product with 1x128 (x) and 128x128 (w) UE8M0 block scales, fp32
    accumulation (spec §4.3). x [M, G, K] and w [G, N, K] are float8 e4m3 (fn or fnuz, decoded per dtype)
    with K contiguous; out may be any [M, G, N] view with N contiguous (e.g. a batch-major buffer's
    transpose).

    reduced_precision_block_sums=True lets the kernel sum each 128-deep block in the matrix unit's own
    precision where that is below fp32, for its speed: on sm_90 (H100/H200) the FP8 tensor cores (wgmma)
    keep about 14 significant bits aligned to the block's largest product, so an entry whose products
    cancel heavily can be off by ~2^-13 of that product (the blocks are still summed in fp32; cuBLAS's
    block-scaled FP8 GEMM has the same numerics there). Devices without such a mode, the CPU and the
    reference ignore it."""
    if dispatch.choose("bmm_a8w8_mxscale", x.device).uses_kernel:
        if out is None:
            return torch.ops.dsv4.bmm_a8w8_mxscale(x, w, x_scale, w_scale, out_dtype,
                                                   reduced_precision_block_sums=reduced_precision_block_sums)
        torch.ops.dsv4.bmm_a8w8_mxscale.out(x, w, x_scale, w_scale, out=out,
                                            reduced_precision_block_sums=reduced_precision_block_sums)
        return out
    result = reference.bmm_a8w8_mxscale(x, w, x_scale, w_scale, out.dtype if out is not None else out_dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


@dataclasses.dataclass
class WoAPlan:
    """What prepare_wo_a decided for one layer."""

    path: str  # "fp8" or "bf16"
    reason: Optional[str]  # why the FP8 path was refused (None on the FP8 path)
    n_groups: int
    o_lora_rank: int
    cos_sin: torch.Tensor
    weight: torch.Tensor  # the checkpoint FP8 weight [G * R, K] (FNUZ-normalized copy on FNUZ devices)
    weight_scale: Optional[torch.Tensor]  # UE8M0 bytes [G, R / 128, K / 128] (FP8 path)
    weight_scale_factors: Optional[torch.Tensor] = None  # fp32 2^(weight_scale - 127) (OCP FP8 plans: the vendor GEMM)
    fp8_format: Optional[Fp8Format] = None
    quant_max: Optional[float] = None
    original_scale: Optional[torch.Tensor] = None  # the checkpoint scale, for the BF16 dequantization
    _dense_weight: Optional[torch.Tensor] = None

    def dense_weight(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The dequantized [G, R, K] weight in `dtype` (the activations'), built on first use only (BF16 path) and
        kept; a call in another dtype rebuilds it in that one (one copy at a time)."""
        if self._dense_weight is None or self._dense_weight.dtype != dtype:
            scale = self.original_scale
            if self.weight_scale is not None:  # FP8 plan: the bytes that go with the (maybe FNUZ-normalized) weight
                scale = self.weight_scale.reshape(-1, self.weight_scale.shape[-1])
            self._dense_weight = _dequantize_weight(self.weight, scale, self.fp8_format, dtype).reshape(
                self.n_groups, self.o_lora_rank, -1)
        return self._dense_weight


def _scale_block_shape(weight_shape, scale_shape) -> tuple:
    """The (rows, columns) of weight each scale entry covers: 128 x 128 where the scale's shape is that tiling's
    (ragged last blocks included), else the exact ratio (an MXFP8 checkpoint's 1 x 32, say)."""
    (rows, cols), (scale_rows, scale_cols) = weight_shape, scale_shape
    if (-(-rows // SCALE_BLOCK), -(-cols // SCALE_BLOCK)) == (scale_rows, scale_cols):
        return SCALE_BLOCK, SCALE_BLOCK
    if scale_rows > 0 and scale_cols > 0 and rows % scale_rows == 0 and cols % scale_cols == 0:
        return rows // scale_rows, cols // scale_cols
    raise ValueError(f"wo_a: a weight scale of shape {tuple(scale_shape)} tiles no block shape of the weight "
                     f"{tuple(weight_shape)}: it cannot be dequantized")


def _dequantize_weight(weight: torch.Tensor, scale: Optional[torch.Tensor], fmt: Optional[Fp8Format],
                       dtype: torch.dtype = torch.bfloat16):
    """spec §5.1 step 3: values times their block's factor in fp32, rounded once to `dtype`."""
    if weight.element_size() != 1:  # already dequantized: take it as it is
        return weight.to(dtype)
    if scale is None:
        raise ValueError("wo_a: an FP8 weight without its block scale cannot be dequantized")
    if weight.dim() != 2 or scale.dim() != 2:
        raise ValueError(f"wo_a: dequantizes a 2-D weight with a 2-D scale, got {tuple(weight.shape)} and "
                         f"{tuple(scale.shape)}")
    block_shape = _scale_block_shape(weight.shape, scale.shape)
    if scale.dtype not in reference_fp8.UE8M0_DTYPES + (torch.float32,):
        scale = scale.to(torch.float32)  # fp16 / bf16 / fp64 powers of two: exact in fp32
    fmt = fmt if fmt is not None else Fp8Format.parse(weight.dtype)
    return fp8_block_dequantize(weight, scale, block_shape, fmt, torch.float32).to(dtype)


def _refuse(plan_args: dict, reason: str) -> WoAPlan:
    # Logged once per gate (the reason's text before its first colon): the layers of a model refused by
    # one gate would otherwise log once each, their reasons differing only in the values they quote.
    dispatch.log_once(("wo_a", "prepare", reason.split(":", 1)[0]), logging.WARNING,
                      "dsv4ops: wo_a uses the BF16 path: %s", reason)
    return WoAPlan(path="bf16", reason=reason, weight_scale=None, **plan_args)


def prepare_wo_a(weight: torch.Tensor, weight_scale: Optional[torch.Tensor], n_groups: int, o_lora_rank: int,
                 cos_sin: torch.Tensor, device=None, activation_dtype: torch.dtype = torch.bfloat16,
                 fp8_format=None, quant_max: Optional[float] = None) -> WoAPlan:
    """The acceptance gates of spec §5.2 (then head_dim, rope and dtype checks, spec §8.3), in order; the first that
    fails selects the BF16 path, with its reason logged once. weight [G * R, K] FP8 (the checkpoint's
    wo_a, rows group-major), weight_scale [G * R / 128, K / 128] (fp32 powers of two, UE8M0 or uint8
    bytes), cos_sin the layer's rotary table [P, 64]."""
    device = torch.device(device) if device is not None else weight.device
    cos_sin = cos_sin.contiguous()  # once: the forward passes it to every call
    plan_args = dict(n_groups=int(n_groups), o_lora_rank=int(o_lora_rank), cos_sin=cos_sin, weight=weight,
                     original_scale=weight_scale)
    if n_groups <= 0:
        raise ValueError(f"wo_a: n_groups must be positive (tensor parallelism wider than o_groups?), got {n_groups}")
    for op in ("inverse_rope_group_quant", "bmm_a8w8_mxscale"):
        decision = dispatch.decide(op, device)
        if not decision.uses_kernel:
            return _refuse(plan_args, f"kernel: {op}: {decision.reason}")
    if weight is None or weight_scale is None:
        return _refuse(plan_args, "weights: the layer exposes no FP8 weight or no weight scale")
    if weight.dim() != 2 or weight_scale.dim() != 2 or weight.dtype not in (torch.float8_e4m3fn,
                                                                             torch.float8_e4m3fnuz):
        return _refuse(plan_args, f"weights: needs a 2-D float8 e4m3 weight and a 2-D scale, got {weight.dtype} "
                                  f"{tuple(weight.shape)} and {tuple(weight_scale.shape)}")
    out_features, in_features = weight.shape
    if (out_features != n_groups * o_lora_rank or o_lora_rank % SCALE_BLOCK or in_features % SCALE_BLOCK
            or tuple(weight_scale.shape) != (out_features // SCALE_BLOCK, in_features // SCALE_BLOCK)):
        return _refuse(plan_args, f"shapes: needs group-128 blocks: G={n_groups}, o_lora_rank={o_lora_rank}, weight "
                                  f"{tuple(weight.shape)}, scale {tuple(weight_scale.shape)}")
    scale_bytes, why = float_to_ue8m0_lossless(weight_scale)
    if scale_bytes is None:
        return _refuse(plan_args, f"scale: could not losslessly encode the {weight_scale.dtype} wo_a block scale "
                                  f"as UE8M0 ({why})")
    if in_features % HEAD_DIM:
        return _refuse(plan_args, f"head_dim: in_features {in_features} is not a whole number of 512-wide heads")
    if cos_sin.dim() != 2 or cos_sin.shape[-1] != ROPE_DIM or cos_sin.dtype not in (torch.float32, torch.bfloat16):
        return _refuse(plan_args, f"rope: needs a [P, 64] cos || sin table in fp32 or bf16, got "
                                  f"{cos_sin.dtype} {tuple(cos_sin.shape)}")
    if activation_dtype != torch.bfloat16:
        return _refuse(plan_args, f"dtype: the FP8 path serves bf16 activations, got {activation_dtype}")
    fmt, qmax = format_and_quant_max(device, fp8_format, quant_max)
    # The GEMM reads K-contiguous weight rows: a strided view (a transpose's transpose, say) is copied once.
    weight = weight.contiguous()
    if fmt is Fp8Format.FNUZ and weight.dtype == torch.float8_e4m3fn:
        # The checkpoint's OCP bytes read as FNUZ are worth half: the scale byte gains one (lossless).
        try:
            weight, scale_bytes = e4m3fn_to_fnuz(weight, scale_bytes)
        except ValueError as error:
            return _refuse(plan_args, f"scale: the FNUZ normalization needs doubled scales: {error}")
    elif fmt is Fp8Format.OCP and weight.dtype != torch.float8_e4m3fn:
        return _refuse(plan_args, f"weights: an OCP device needs a float8_e4m3fn weight, got {weight.dtype}")
    plan_args["weight"] = weight
    grouped_scale = scale_bytes.view(torch.uint8).reshape(n_groups, o_lora_rank // SCALE_BLOCK, -1)
    # The vendor GEMM's weight scales (OCP plans: the only ones it serves), converted here, once: a conversion per
    # forward would cost its kernels in every call, and one made lazily inside a CUDA-graph capture would hold no
    # values until the graph is replayed.
    factors = ue8m0_to_float(grouped_scale) if fmt is Fp8Format.OCP else None
    return WoAPlan(path="fp8", reason=None, weight_scale=grouped_scale, weight_scale_factors=factors, fp8_format=fmt,
                   quant_max=qmax, **plan_args)


def wo_a_forward(o: torch.Tensor, positions: torch.Tensor, plan: WoAPlan, apply_inverse_rope: bool) -> torch.Tensor:
    """o [T, H, 512] -> [T, G * o_lora_rank] in o's dtype, for wo_b. apply_inverse_rope: o's rope lanes are
    still in the rotated frame and are rotated back here (True), or the attention already did it (False)."""
    t, heads, _ = o.shape
    g = plan.n_groups
    platform_key = path_table_key(o.device)
    path = gemm_path(t, g, platform_key) if plan.path == "fp8" else "bf16"
    if path != "bf16" and o.dtype != torch.bfloat16:  # the plan's FP8 path serves bf16 activations only
        dispatch.log_once(("wo_a", "forward", o.dtype), logging.WARNING,
                          "dsv4ops: wo_a uses the BF16 path for this call: o has dtype %s; the FP8 path takes bf16",
                          o.dtype)
        path = "bf16"
    if path == "vendor_fp8" and (platform_key != "cuda" or t == 0 or plan.fp8_format is not Fp8Format.OCP):
        path = "fp8_kernel"
    if path == "vendor_fp8":
        rows = -(-t // VENDOR_ROW_MULTIPLE) * VENDOR_ROW_MULTIPLE  # the vendor GEMM's padded rows
        if not torch.compiler.is_compiling() and not _vendor_gemm_serves(o.device, rows, g):
            path = "fp8_kernel"  # eager and not served (a compiled graph's vendor op decides as it runs)
    if path in ("fp8_kernel", "vendor_fp8"):
        w = plan.weight.view(g, plan.o_lora_rank, -1)
        if path == "vendor_fp8":
            depth = heads * HEAD_DIM // g
            # Bytes, viewed as e4m3fn after: Inductor cannot zero an FP8 tensor's rows. The last VENDOR_ROW_MULTIPLE
            # rows are zeroed before the quantization writes the first t, so that the pad rows stay zero and the
            # slices keep sizes the compiler need not specialize (the pad rows alone number 0 to 3; 0 and 1 would
            # each be a graph of their own). Under torch.compile with a symbolic T two graphs remain: T a multiple
            # of VENDOR_ROW_MULTIPLE or not. Eagerly (and under capture) a T without pad rows skips the two kernels.
            x_bytes = o.new_empty((rows, g, depth), dtype=torch.uint8)
            x_scale = o.new_empty((rows, g, depth // GROUP_SIZE), dtype=torch.uint8)
            if torch.compiler.is_compiling() or rows != t:
                x_bytes[rows - VENDOR_ROW_MULTIPLE:].zero_()
                x_scale[rows - VENDOR_ROW_MULTIPLE:].zero_()
            inverse_rope_group_quant(o, positions, plan.cos_sin, g, GROUP_SIZE, plan.fp8_format, plan.quant_max,
                                     apply_inverse_rope=apply_inverse_rope, out=(x_bytes[:t], x_scale[:t]))
            x_fp8 = x_bytes.view(Fp8Format.OCP.torch_dtype)
            vendor = torch.ops.dsv4_vendor.block_scaled_bmm if torch.compiler.is_compiling() else _vendor_bmm_or_kernel
            z = vendor(x_fp8, w, x_scale, plan.weight_scale, plan.weight_scale_factors, o.dtype)[:t]
        else:
            x_fp8, x_scale = inverse_rope_group_quant(o, positions, plan.cos_sin, g, GROUP_SIZE, plan.fp8_format,
                                                      plan.quant_max, apply_inverse_rope=apply_inverse_rope)
            z = _kernel_bmm(x_fp8, w, x_scale, plan.weight_scale, o.dtype)
    else:
        x = inverse_rope(o, positions, plan.cos_sin) if apply_inverse_rope else o
        z = torch.einsum("tgd,grd->tgr", x.reshape(t, g, heads * HEAD_DIM // g), plan.dense_weight(o.dtype))
    return z.reshape(t, g * plan.o_lora_rank)
