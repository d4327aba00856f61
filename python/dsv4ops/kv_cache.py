"""fp8_ds_mla KV-cache utilities (spec/kv_cache.md §4.1, §9): public wrappers over torch.ops.dsv4.* with
reference fallback.

The encoding is explicit because caches differ: the SWA cache uses the platform's (the default here:
FNUZ + 224 on gfx942, OCP + 448 elsewhere, from the cache's device), the compressed caches are OCP on
every platform. A reader must use its writer's encoding.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from .platform import Fp8Format, format_and_quant_max, fp8_format as device_fp8_format
from .reference import kv_cache as reference


# The index helpers of spec §9.3-§9.4 are tensor code with no host sync: they serve as they are on every
# device and under graph capture, so there is no kernel for them.
compute_global_topk_indices_and_lens = reference.compute_global_topk_indices_and_lens
combine_topk_swa_indices = reference.combine_topk_swa_indices


def _int64_positions(position_ids: torch.Tensor) -> torch.Tensor:
    return position_ids.long() if position_ids.dtype == torch.int32 else position_ids


def qnorm_rope_kv_insert(q_in: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         position_ids: torch.Tensor, cos_sin_cache: torch.Tensor,
                         q_head_padded: Optional[int] = None, eps: float = 1e-6, cache_block_size: int = 64,
                         apply_q_norm: bool = True, fp8_format=None, quant_max: Optional[float] = None,
                         q_out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fused Q weightless RMSNorm + GPT-J RoPE and KV RoPE + UE8M0 FP8 insert (spec/kv_cache.md §3).

    q_in bf16 [N, H, 512], kv bf16 [N, 512], position_ids [N] (int32 is widened), cos_sin_cache fp32
    [P, 64], slot_mapping int64 [N_ins <= N] (KV is written for the first N_ins tokens; negative or
    out-of-cache slots skipped). Returns q_out [N, q_head_padded (default H), 512] with heads >= H zero;
    pass q_out to write into a caller-owned buffer (it may be q_in itself when q_head_padded == H).
    Tokens whose position lies outside the cos/sin table get zero Q rows and no KV write."""
    fmt, qmax = format_and_quant_max(k_cache.device, fp8_format, quant_max)
    hp = int(q_head_padded) if q_head_padded is not None else q_in.shape[1]
    positions = _int64_positions(position_ids)
    if dispatch.choose("qnorm_rope_kv_insert", q_in.device).uses_kernel:
        args = (q_in, kv, k_cache, slot_mapping, positions, cos_sin_cache, hp, float(eps), int(cache_block_size),
                bool(apply_q_norm), int(fmt), qmax)
        if q_out is None:
            return torch.ops.dsv4.qnorm_rope_kv_insert(*args)
        torch.ops.dsv4.qnorm_rope_kv_insert.out(*args, q_out=q_out)
        return q_out
    result = reference.qnorm_rope_kv_insert(q_in, kv, k_cache, slot_mapping, positions, cos_sin_cache, hp, eps,
                                            int(cache_block_size), apply_q_norm, fmt, qmax)
    if q_out is None:
        return result
    q_out.copy_(result)
    return q_out


def kv_rope_quant_insert(kv: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         position_ids: torch.Tensor, cos_sin_cache: torch.Tensor, cache_block_size: int = 64,
                         fp8_format=None, quant_max: Optional[float] = None):
    """The KV branch of qnorm_rope_kv_insert alone (spec/kv_cache.md §6): GPT-J RoPE on kv [N, 512], bf16
    round, UE8M0 FP8 record at slot_mapping[t] (one slot per token). Returns k_cache."""
    fmt, qmax = format_and_quant_max(k_cache.device, fp8_format, quant_max)
    positions = _int64_positions(position_ids)
    if dispatch.choose("kv_rope_quant_insert", kv.device).uses_kernel:
        torch.ops.dsv4.kv_rope_quant_insert(kv, k_cache, slot_mapping, positions, cos_sin_cache,
                                            int(cache_block_size), int(fmt), qmax)
    else:
        reference.kv_rope_quant_insert(kv, k_cache, slot_mapping, positions, cos_sin_cache, int(cache_block_size),
                                       fmt, qmax)
    return k_cache


def kv_norm_rope_quant_insert(kv: torch.Tensor, norm_weight: torch.Tensor, k_cache: torch.Tensor,
                              slot_mapping: torch.Tensor, position_ids: torch.Tensor, cos_sin_cache: torch.Tensor,
                              eps: float = 1e-6, cache_block_size: int = 64, fp8_format=None,
                              quant_max: Optional[float] = None):
    """kv_rope_quant_insert with a weighted RMSNorm first (spec/kv_cache.md §6): y = x * rsqrt(mean(x^2) +
    eps) * norm_weight in fp32, rounded to bf16, then RoPE, bf16 round and the UE8M0 FP8 record.
    kv [N, 512] bf16 (rows may be strided, 16-byte aligned), norm_weight bf16 [512]. Returns k_cache."""
    fmt, qmax = format_and_quant_max(k_cache.device, fp8_format, quant_max)
    positions = _int64_positions(position_ids)
    if dispatch.choose("kv_norm_rope_quant_insert", kv.device).uses_kernel:
        torch.ops.dsv4.kv_norm_rope_quant_insert(kv, norm_weight, k_cache, slot_mapping, positions, cos_sin_cache,
                                                 float(eps), int(cache_block_size), int(fmt), qmax)
    else:
        reference.kv_norm_rope_quant_insert(kv, norm_weight, k_cache, slot_mapping, positions, cos_sin_cache, eps,
                                            int(cache_block_size), fmt, qmax)
    return k_cache


def qnorm_rope_kv_insert_full_cache_bf16(q: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor,
                                         slot_mapping: torch.Tensor, position_ids: torch.Tensor,
                                         cos_sin_cache: torch.Tensor, eps: float = 1e-6,
                                         cache_block_size: int = 64, apply_q_norm: bool = True):
    """spec/kv_cache.md §5, bf16 variant: q bf16 [N, H, 512] is normalized and rotated **in place**; the
    rotated kv rows go to the plain bf16 cache k_cache [blocks, cache_block_size, 512] at slot_mapping
    (negative or out-of-cache slots skipped). Returns (q, k_cache)."""
    positions = _int64_positions(position_ids)
    if dispatch.choose("qnorm_rope_kv_insert_full_cache_bf16", q.device).uses_kernel:
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q, kv, k_cache, slot_mapping, positions, cos_sin_cache,
                                                            float(eps), int(cache_block_size), bool(apply_q_norm))
        return q, k_cache
    return reference.qnorm_rope_kv_insert_full_cache_bf16(q, kv, k_cache, slot_mapping, positions, cos_sin_cache,
                                                          eps, int(cache_block_size), apply_q_norm)


def qnorm_rope_kv_insert_full_cache_fp8(q: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor,
                                        slot_mapping: torch.Tensor, position_ids: torch.Tensor,
                                        cos_sin_cache: torch.Tensor, fp8_scale: torch.Tensor,
                                        q_fp8_scale_inv: torch.Tensor, eps: float = 1e-6,
                                        cache_block_size: int = 64, apply_q_norm: bool = True, fp8_format=None,
                                        quant_max: Optional[float] = None, q_fp8: Optional[torch.Tensor] = None):
    """spec/kv_cache.md §5, FP8 variant: q (read only) -> q_fp8 = fp8(clamp(q' * q_fp8_scale_inv)) and kv ->
    k_cache rows fp8(clamp(kv' * (1 / fp8_scale))), both from fp32 (no bf16 round); the scales are
    1-element fp32 tensors (positive and finite: they are read on the device, not checked). The bytes
    follow fp8_format (default: the platform's) whatever the tensors' float8 dtype. q_fp8 is allocated in
    the format's dtype when not given. Returns (q_fp8, k_cache)."""
    fmt, qmax = format_and_quant_max(k_cache.device, fp8_format, quant_max)
    positions = _int64_positions(position_ids)
    if q_fp8 is None:
        q_fp8 = torch.empty(q.shape, dtype=fmt.torch_dtype, device=q.device)
    if dispatch.choose("qnorm_rope_kv_insert_full_cache_fp8", q.device).uses_kernel:
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, k_cache, slot_mapping, positions,
                                                           cos_sin_cache, fp8_scale, q_fp8_scale_inv, float(eps),
                                                           int(cache_block_size), bool(apply_q_norm), int(fmt), qmax)
        return q_fp8, k_cache
    return reference.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, k_cache, slot_mapping, positions,
                                                         cos_sin_cache, fp8_scale, q_fp8_scale_inv, eps,
                                                         int(cache_block_size), apply_q_norm, fmt, qmax)


def quantize_and_insert_k_cache(k: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                block_size: int = 64, fp8_format=None, quant_max: Optional[float] = None):
    """Quantizes bf16 K rows [tokens, 512] (already rotated) into fp8_ds_mla records at slot_mapping
    (int64; one entry per token written, at most k.size(0)). Negative slots and slots past the cache's
    capacity (size(0) * block_size) are skipped; when two tokens name the same slot, which one the record
    holds is unspecified. k_cache is uint8 with one block per index of dim 0; only its stride(0) locates
    blocks."""
    fmt, qmax = format_and_quant_max(k_cache.device, fp8_format, quant_max)
    if dispatch.choose("quantize_and_insert_k_cache", k.device).uses_kernel:
        torch.ops.dsv4.quantize_and_insert_k_cache(k, k_cache, slot_mapping, int(block_size), int(fmt), qmax)
    else:
        reference.quantize_and_insert_k_cache(k, k_cache, slot_mapping, int(block_size), fmt, qmax)
    return k_cache


def dequantize_and_gather_k_cache(out: torch.Tensor, k_cache: torch.Tensor, seq_lens: torch.Tensor,
                                  gather_lens: Optional[torch.Tensor], block_table: torch.Tensor,
                                  block_size: int = 64, offset: int = 0, fp8_format=None):
    """Decodes request r's last gather_lens[r] (default seq_lens[r]) tokens into bf16
    out[r, offset : offset + g]; positions whose block-table entry is missing or outside the cache give
    zero rows. seq_lens, gather_lens, block_table are int32."""
    fmt = Fp8Format.parse(fp8_format) if fp8_format is not None else device_fp8_format(k_cache.device)
    if dispatch.choose("dequantize_and_gather_k_cache", out.device).uses_kernel:
        torch.ops.dsv4.dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table,
                                                     int(block_size), int(offset), int(fmt))
    else:
        reference.dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, int(block_size),
                                                int(offset), fmt)
    return out
