"""Reference DSv4 lightning indexer (spec/indexer.md): FP8 MQA logits for prefill (contiguous K) and decode
(paged, block-flat indexer cache, MTP rows), and the per-row top-k. Pure PyTorch, the test oracle and
the fallback.

Contract decisions shared with the kernels:
  * FP8 operands are decoded per their dtype (float8_e4m3fn: OCP, float8_e4m3fnuz: FNUZ); byte 0x80 reads
    as +0 whatever the dtype (an FNUZ writer never emits it; an OCP writer's -0 may sit in an FNUZ-typed
    buffer, spec §3.5 rule 4);
  * logit[i, j] = sum_h weights[i, h] * ReLU(k_scale[j] * (q[i, h] . k[j])), in fp32;
  * prefill windows [ks, ke) are clamped to [0, N); columns outside are -inf when clean_logits, otherwise
    not written by the kernels (their value is unspecified; this reference writes -inf there too);
  * paged decode: row r = b * next_n + n sees compressed positions [0, len_r) with len_r = L_b - next_n +
    n + 1 for one length per request ([B] or [B, 1]) or context_lens[b, n] for [B, next_n], clamped to
    [0, max_model_len]; a position whose block-table column lies past the table or names a block outside
    the cache is -inf (never read). Cache blocks are block-flat: block_size x D FP8 bytes, then block_size
    fp32 scales;
  * top-k: indices local to the row start, -1 padded; -inf (and NaN, read as -inf) candidates are not
    selected; with `stable`, ties go to the smaller index and the indices come sorted ascending.
"""

from __future__ import annotations

import torch

from .fp8 import fp8_decode


def _fp8_values(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float8_e4m3fn:
        fmt = 0
    elif x.dtype == torch.float8_e4m3fnuz:
        fmt = 1
    else:
        raise ValueError(f"expected float8_e4m3fn or float8_e4m3fnuz, got {x.dtype}")
    codes = x.contiguous().view(torch.uint8)
    values = fp8_decode(codes, fmt)
    return torch.where(codes == 0x80, torch.zeros_like(values), values)


def uint8_scales_as_fp32(k_scale: torch.Tensor) -> torch.Tensor:
    """[N, 4] uint8 bytes of one fp32 each -> fp32 [N]. The bytes are copied first (N * 4 of them): a view that
    does not start on a 4-byte boundary (a slice of a byte buffer) cannot be reinterpreted in place."""
    return k_scale.clone(memory_format=torch.contiguous_format).view(torch.float32).reshape(-1)


def _k_scale(k_scale: torch.Tensor) -> torch.Tensor:
    if k_scale.dtype == torch.uint8:  # [N, 4] bytes of one fp32 each
        return uint8_scales_as_fp32(k_scale)
    return k_scale.reshape(-1).to(torch.float32)


def fp8_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool = True) -> torch.Tensor:
    """spec §3.3: q [M, H, D], k [N, D] FP8, k_scale [N] fp32, weights [M, H] fp32 -> logits [M, N] fp32."""
    m, n = q.shape[0], k.shape[0]
    if _k_scale(k_scale).numel() != n or weights.shape != (m, q.shape[1]) or k.shape[1] != q.shape[2]:
        raise ValueError(f"fp8_mqa_logits: inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, k_scale "
                         f"{tuple(k_scale.shape)}, weights {tuple(weights.shape)}")
    scores = torch.einsum("mhd,nd->mhn", _fp8_values(q), _fp8_values(k)) * _k_scale(k_scale)[None, None, :]
    logits = (torch.relu(scores) * weights.to(torch.float32)[:, :, None]).sum(dim=1)
    columns = torch.arange(n, device=q.device)[None, :]
    start = ks.long().clamp(0, n)[:, None]
    end = ke.long().clamp(0, n)[:, None]
    inside = (columns >= start) & (columns < end)
    return torch.where(inside, logits, torch.full((m, n), float("-inf"), device=q.device))


def paged_row_lengths(context_lens: torch.Tensor, batch: int, next_n: int, max_model_len: int) -> torch.Tensor:
    """Visible compressed length of every row r = b * next_n + n, clamped to [0, max_model_len]."""
    lens = context_lens.long()
    if lens.dim() == 2 and lens.shape[1] == next_n and next_n > 1:
        per_row = lens.reshape(-1)
    else:
        base = lens.reshape(batch)
        per_row = (base[:, None] - next_n + torch.arange(next_n, device=lens.device)[None, :] + 1).reshape(-1)
    return per_row.clamp(0, max_model_len)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_tables: torch.Tensor, max_model_len: int, clean_logits: bool = True,
                         kv_dtype: torch.dtype = None) -> torch.Tensor:
    """spec §4: q [B, next_n, H, D] FP8; kv_cache uint8 [num_blocks, block_size * (D + 4)] block-flat (any
    view whose dims after the first hold one block's bytes), its FP8 bytes read as kv_dtype (default: q's)
    -> logits [B * next_n, max_model_len]."""
    batch, next_n, heads, dim = q.shape
    num_blocks = kv_cache.shape[0]
    block_bytes = kv_cache[0].numel() if num_blocks else 0
    if num_blocks and block_bytes % (dim + 4):
        raise ValueError(f"fp8_paged_mqa_logits: a block of {block_bytes} bytes is not a whole number of {dim + 4}-byte "
                         f"entries")
    block_size = block_bytes // (dim + 4) if num_blocks else 1
    flat = kv_cache.reshape(num_blocks, block_bytes)  # (-1 is ambiguous for an empty cache)
    rows = batch * next_n
    out = torch.full((rows, max_model_len), float("-inf"), device=q.device)
    lens = paged_row_lengths(context_lens, batch, next_n, max_model_len)
    q_values = _fp8_values(q).reshape(rows, heads, dim)
    for r in range(rows):
        length = int(lens[r])
        if length == 0 or num_blocks == 0:
            continue
        b = r // next_n
        positions = torch.arange(length, device=q.device)
        column = positions // block_size
        in_table = column < block_tables.shape[1]
        if block_tables.shape[1] == 0:
            block = torch.full_like(column, -1)
        else:
            block = torch.where(in_table, block_tables[b, column.clamp(max=block_tables.shape[1] - 1)].long(),
                                torch.full_like(column, -1))
        readable = (block >= 0) & (block < num_blocks)
        safe_block = torch.where(readable, block, torch.zeros_like(block))
        entry = positions % block_size
        byte_cols = entry[:, None] * dim + torch.arange(dim, device=q.device)[None, :]
        codes = flat[safe_block[:, None], byte_cols]
        k_values = _fp8_values(codes.view(kv_dtype if kv_dtype is not None else q.dtype))
        scale_cols = block_size * dim + entry[:, None] * 4 + torch.arange(4, device=q.device)[None, :]
        scales = flat[safe_block[:, None], scale_cols].contiguous().view(torch.float32).reshape(-1)
        scores = torch.relu((q_values[r] @ k_values.t()) * scales[None, :])
        logits = (scores * weights[r].to(torch.float32)[:, None]).sum(dim=0)
        out[r, :length] = torch.where(readable, logits, torch.full_like(logits, float("-inf")))
    return out


def _topk_rows(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int, stable: bool) -> torch.Tensor:
    rows = logits.shape[0]
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    for r in range(rows):
        start, end = int(starts[r]), int(ends[r])
        if end <= start:
            continue
        values = logits[r, start:end].to(torch.float64)
        values = torch.where(torch.isnan(values), torch.full_like(values, float("-inf")), values)
        candidates = torch.nonzero(values > float("-inf")).reshape(-1)
        if candidates.numel() == 0:
            continue
        # Descending value, then ascending index: the smaller index wins ties.
        order = sorted(candidates.tolist(), key=lambda i: (-float(values[i]), i))[:k]
        chosen = sorted(order) if stable else order
        out[r, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


def topk_per_row_prefill(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, k: int,
                         stable: bool = False) -> torch.Tensor:
    """spec §5: per row, the k best columns of [ks, ke) (clamped to the row), local to ks; int32 [M, k]."""
    n = logits.shape[1]
    return _topk_rows(logits, ks.long().clamp(0, n), ke.long().clamp(0, n), k, stable)


def topk_per_row_decode(logits: torch.Tensor, lens: torch.Tensor, k: int, stable: bool = False) -> torch.Tensor:
    """spec §5: per row r, the k best columns of [0, lens[r]) (clamped to the row); int32 [R, k]."""
    n = logits.shape[1]
    ends = lens.long().reshape(-1).clamp(0, n)
    return _topk_rows(logits, torch.zeros_like(ends), ends, k, stable)
