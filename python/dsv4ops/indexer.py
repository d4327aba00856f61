"""The DSv4 lightning indexer (spec/indexer.md): FP8 MQA logits for prefill and for paged decode (MTP rows
included), and the per-row top-k that turns logits into the compressed entries each query attends to.
Public wrappers over torch.ops.dsv4.* with reference fallback.

FP8 operands are decoded per their dtype; byte 0x80 reads as +0 whatever the dtype (an OCP writer's -0
may sit in an FNUZ-typed buffer). The indexer cache of the paged op is block-flat uint8 (block_size x D
FP8 bytes, then block_size fp32 scales); its encoding defaults to OCP (the indexer-K writer's on every
platform), whatever q's.

The two logits ops take, in order: the dsv4ops kernel where dispatch finds one for the device; else, for a
tensor on a GPU with triton importable, the Triton fallback (indexer_triton.py; how the upstream stack
serves gfx942 today); else the PyTorch reference. A fallback is logged once per (op, reason) and counted
like dispatch's own (fallback_counts()).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch, indexer_triton, platform
from .platform import Fp8Format
from .reference import indexer as reference


KERNEL, TRITON, REFERENCE = dispatch.KERNEL, "triton", dispatch.REFERENCE
LOGITS_OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")  # the ops with a Triton fallback


def logits_path(op: str, device) -> tuple:
    """(path, reason) for a logits op on `device`: KERNEL (reason None), TRITON or REFERENCE with the reason
    the kernel cannot serve (and, for the reference, why Triton cannot either). DSV4OPS_DISABLE sends the op
    to the reference; DSV4OPS_FORCE demands the kernel (dispatch raises when it cannot run)."""
    decision = dispatch.decide(op, device)
    if decision.uses_kernel:
        return KERNEL, None
    device = torch.device(device)
    if dispatch.disabled(op):
        return REFERENCE, decision.reason
    if device.type == "cpu":
        return REFERENCE, decision.reason
    if not indexer_triton.available():
        return REFERENCE, f"{decision.reason}; triton is not installed"
    return TRITON, decision.reason


def _choose_logits_path(op: str, device, triton_unsupported: Optional[str] = None) -> str:
    """The path, counted and logged where it is a fallback; triton_unsupported: why the Triton kernel cannot
    serve this call (None: it can), which sends a Triton call to the reference."""
    path, reason = logits_path(op, device)
    if path == TRITON and triton_unsupported is not None:
        path, reason = REFERENCE, f"{reason}; {triton_unsupported}"
    if path != KERNEL:
        served_by = "Triton fallback" if path == TRITON else dispatch.REFERENCE
        dispatch.record_fallback(op, platform.device_arch(device), reason, served_by)
    return path


def fp8_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, clean_logits: bool = True) -> torch.Tensor:
    """logits[i, j] = sum_h weights[i, h] * ReLU(k_scale[j] * q[i, h] . k[j]) for ks[i] <= j < ke[i] (clamped
    to [0, N)); -inf elsewhere when clean_logits, else those columns are left unwritten. q [M, H, D] and
    k [N, D] FP8, k_scale [N] fp32 (or [N, 4] uint8), weights [M, H] fp32, ks/ke int32 [M]."""
    path = _choose_logits_path("fp8_mqa_logits", q.device)
    if path == KERNEL:
        return torch.ops.dsv4.fp8_mqa_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, bool(clean_logits))
    if path == TRITON:
        return indexer_triton.fp8_mqa_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
    return reference.fp8_mqa_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_tables: torch.Tensor, max_model_len: int, clean_logits: bool = True,
                         kv_format=None) -> torch.Tensor:
    """Decode: q [B, next_n, H, D] FP8 against the paged indexer cache; row r = b * next_n + n sees the
    compressed positions [0, len_r) with len_r = L_b - next_n + n + 1 (context_lens [B] or [B, 1]) or
    context_lens[b, n] ([B, next_n]), clamped to [0, max_model_len]. Returns fp32 [B * next_n,
    max_model_len]; positions past len_r (or whose block-table entry is missing) are -inf when clean.
    kv_format is the cache's encoding: OCP by default, as the indexer-K writer emits on every platform (on
    gfx942 Q is FNUZ and K OCP, spec §2)."""
    fmt = Fp8Format.parse(kv_format if kv_format is not None else "ocp")
    path = _choose_logits_path("fp8_paged_mqa_logits", q.device, indexer_triton.paged_cache_unsupported(q, kv_cache))
    if path == KERNEL:
        return torch.ops.dsv4.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, int(max_model_len),
                                                   bool(clean_logits), int(fmt))
    if path == TRITON:
        return indexer_triton.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, int(max_model_len),
                                                   clean_logits, fmt.torch_dtype)
    return reference.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, int(max_model_len),
                                          clean_logits, fmt.torch_dtype)


# Largest k the GPU top-k kernel serves (its sort buffer is in shared memory); larger k use the reference.
GPU_TOPK_MAX_K = 4096


def _topk_supported(logits: torch.Tensor, k: int):
    def check():
        if logits.device.type != "cpu" and int(k) > GPU_TOPK_MAX_K:
            return f"k = {int(k)} > {GPU_TOPK_MAX_K}, the largest the GPU top-k serves"
        return None
    return check


def topk_per_row_prefill(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, k: int,
                         out: Optional[torch.Tensor] = None, stable: bool = False) -> torch.Tensor:
    """Per row, the k best columns of [ks, ke) as indices local to ks (int32 [M, k], -1 padded; ks and ke are
    clamped to the row first, so a negative ks counts from column 0; -inf and
    NaN logits are never chosen). stable: ties go to the smaller index and indices come sorted ascending,
    so that ranks computing the same logits agree."""
    if out is None:
        out = torch.empty(logits.shape[0], int(k), dtype=torch.int32, device=logits.device)
    if dispatch.choose("topk_per_row_prefill", logits.device, _topk_supported(logits, k)).uses_kernel:
        torch.ops.dsv4.topk_per_row_prefill(logits, ks, ke, int(k), bool(stable), out=out)
    else:
        out.copy_(reference.topk_per_row_prefill(logits, ks, ke, int(k), stable))
    return out


def topk_per_row_decode(logits: torch.Tensor, lens: torch.Tensor, k: int, out: Optional[torch.Tensor] = None,
                        stable: bool = False) -> torch.Tensor:
    """Per row r, the k best columns of [0, lens[r]) (int32 [R, k], -1 padded); lens int32 [R] (per row, MTP
    rows included)."""
    if out is None:
        out = torch.empty(logits.shape[0], int(k), dtype=torch.int32, device=logits.device)
    if dispatch.choose("topk_per_row_decode", logits.device, _topk_supported(logits, k)).uses_kernel:
        torch.ops.dsv4.topk_per_row_decode(logits, lens, int(k), bool(stable), out=out)
    else:
        out.copy_(reference.topk_per_row_decode(logits, lens, int(k), stable))
    return out
