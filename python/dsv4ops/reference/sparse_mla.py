"""Reference DSv4 sparse MLA decode (spec/sparse_mla_decode.md) over the fp8_ds_mla caches. Pure PyTorch
in fp32, the test oracle and the fallback.

For query row t and head h, the keys are the valid slots main_indices[main_indptr[t]:main_indptr[t+1]] of
the SWA ("main") cache and the valid slots of the compressed ("extra") cache, each cache decoded with its
own block size and FP8 encoding (kv_cache.md §4.1); row t's index range [indptr[t], indptr[t+1]) is
clamped to the index list. A key decodes to 512 values (448 FP8 NoPE dims times their UE8M0 block
scale, then the 64 bf16 RoPE dims), with every non-finite value replaced by 0 (a poisoned record: scale
byte 255, a NaN or Inf RoPE value, an overflowing scale). V = K. With s_n = scale * q . k_n:
    m = max(max_n s_n, sink_h),  L = sum_n exp(s_n - m) + exp(sink_h - m),  out = sum_n exp(s_n - m) k_n / L;
the sink only enlarges the denominator (a NaN sink counts as no sink, -inf; a +inf sink takes all the
weight and gives zeros); a row without keys gives zeros. Slots that are negative or at or
beyond the cache's capacity are skipped. With cos_sin and positions given, the inverse GPT-J rotation is
applied to dims 448..511 of the output (the wo_a path's first step, fused).
"""

from __future__ import annotations

from typing import Optional

import torch

from .kv_cache import _check_cache, _record_addresses, dequantize_kv_record
from .kv_cache import DATA_BYTES, SCALE_BYTES
from .wo_a import rotate_back

HEAD_DIM = 512


def read_cache_rows(cache: torch.Tensor, slots: torch.Tensor, block_size: int, fp8_format) -> torch.Tensor:
    """The fp8_ds_mla records at `slots` (all valid) -> fp32 [n, 512], NaN scrubbed to 0."""
    # Up to the last block's records: a padded block stride need not be backed after the last block.
    storage = (cache.shape[0] - 1) * cache.stride(0) + cache[0].numel() if cache.shape[0] else 0
    flat = cache.as_strided((storage,), (1,))
    data_at, scale_at = _record_addresses(slots.long(), block_size, cache.stride(0))
    data = flat[data_at[:, None] + torch.arange(DATA_BYTES, device=cache.device)]
    scales = flat[scale_at[:, None] + torch.arange(SCALE_BYTES, device=cache.device)]
    keys = dequantize_kv_record(data, scales, fp8_format).to(torch.float32)
    return torch.where(torch.isfinite(keys), keys, torch.zeros_like(keys))


def _valid(slots: torch.Tensor, cache: torch.Tensor, block_size: int) -> torch.Tensor:
    return slots[(slots >= 0) & (slots < cache.shape[0] * block_size)]


def _row_slots(indices: torch.Tensor, indptr: torch.Tensor, t: int) -> torch.Tensor:
    count = indices.shape[0]
    begin = min(max(int(indptr[t]), 0), count)
    end = min(max(int(indptr[t + 1]), begin), count)
    return indices[begin:end]


def sparse_mla_decode(q: torch.Tensor, main_cache: torch.Tensor, main_indices: torch.Tensor,
                      main_indptr: torch.Tensor, main_block_size: int, extra_cache: Optional[torch.Tensor],
                      extra_indices: Optional[torch.Tensor], extra_indptr: Optional[torch.Tensor],
                      extra_block_size: int, attn_sink: Optional[torch.Tensor], scale: float, main_format,
                      extra_format=0, cos_sin: Optional[torch.Tensor] = None,
                      positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """spec §3-§4. q bf16 [T, H, 512] -> bf16 [T, H, 512]."""
    _check_cache(main_cache, main_block_size)
    t_count, heads, _ = q.shape
    out = torch.zeros(t_count, heads, HEAD_DIM, dtype=torch.float32, device=q.device)
    if attn_sink is not None and (attn_sink.dim() != 1 or attn_sink.shape[0] < heads):
        raise ValueError(f"attn_sink must be 1-D with at least {heads} entries, got {tuple(attn_sink.shape)}")
    sink = (attn_sink[:heads].to(torch.float32) if attn_sink is not None
            else torch.full((heads,), float("-inf"), device=q.device))
    sink = torch.where(torch.isnan(sink), torch.full_like(sink, float("-inf")), sink)
    saturated = torch.isposinf(sink)  # the sink takes all the weight: zeros
    for t in range(t_count):
        keys = [read_cache_rows(main_cache, _valid(_row_slots(main_indices, main_indptr, t), main_cache,
                                                   main_block_size), main_block_size, main_format)]
        if extra_cache is not None:
            _check_cache(extra_cache, extra_block_size)
            extra = _row_slots(extra_indices, extra_indptr, t)
            keys.append(read_cache_rows(extra_cache, _valid(extra, extra_cache, extra_block_size), extra_block_size,
                                        extra_format))
        k = torch.cat(keys)  # [n, 512]
        if k.shape[0] == 0:
            continue
        scores = (q[t].to(torch.float32) @ k.t()) * scale  # [H, n]
        m = torch.maximum(scores.amax(dim=1), sink)
        weights = torch.exp(scores - m[:, None])
        denominator = weights.sum(dim=1) + torch.exp(sink - m)
        out[t] = torch.where(saturated[:, None], torch.zeros_like(out[t]), (weights @ k) / denominator[:, None])
    if cos_sin is not None:
        out = rotate_back(out, positions, cos_sin)
    return out.to(torch.bfloat16)
