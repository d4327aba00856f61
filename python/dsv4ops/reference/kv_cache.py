"""Reference DSv4 KV-cache writers and readers (spec/kv_cache.md): the fp8_ds_mla record, the fused
Q-norm + RoPE + KV insert family, and the cache utilities. Pure PyTorch, written for clarity; the oracle
the kernels are tested against.

fp8_ds_mla layout (spec §4.1). A block of `bs` tokens starts at byte `block * k_cache.stride(0)`:
  [0, bs*576)            token k's 576-byte data record at k*576: 448 FP8 NoPE bytes, then 64 bf16 RoPE dims
  [bs*576, bs*576+bs*8)  token k's 8-byte scale record at bs*576 + k*8: 7 UE8M0 bytes, then a 0 pad byte
Only stride(0) is taken from the cache tensor; its shape is a container.

Contract decisions (spec README "Project decisions", §7.4, §11), shared with the kernels:
  * every negative slot is skipped; slots at or beyond the cache's capacity (size(0) * bs) are skipped;
  * a token whose position lies outside the cos/sin table [0, P) writes no KV and gets an all-zero Q row;
  * NoPE quantization: per 64-dim block, amax over the finite values (NaN ignored) floored at 1e-4, RCEIL
    UE8M0 byte for `quant_max` (fp32 division), values scaled by the exact inverse power of two (0 when
    the byte is 255, i.e. amax is Inf), then clamped with max-then-min semantics (NaN becomes -quant_max),
    then encoded round-to-nearest-even;
  * the encoding is explicit: SWA caches use the platform's (FNUZ + 224 on gfx942, OCP + 448 elsewhere),
    compressed caches OCP everywhere; readers must use the writer's encoding.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fp8 import FNUZ, OCP, _pow2, fp8_decode, fp8_encode, ue8m0_encode_rceil

HEAD_DIM = 512
ROPE_DIM = 64
NOPE_DIM = HEAD_DIM - ROPE_DIM  # 448
QUANT_BLOCK = 64
NUM_QUANT_BLOCKS = NOPE_DIM // QUANT_BLOCK  # 7
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_BYTES = 8  # 7 UE8M0 bytes + 1 pad
RECORD_BYTES = DATA_BYTES + SCALE_BYTES  # 584
KV_AMAX_FLOOR = 1e-4
DEFAULT_QUANT_MAX = {OCP: 448.0, FNUZ: 224.0}


def _quant_max(fp8_format, quant_max: Optional[float]) -> float:
    return float(quant_max) if quant_max is not None else DEFAULT_QUANT_MAX[int(fp8_format)]


def rope_gptj(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, inverse: bool = False):
    """GPT-J (interleaved pairs) rotation of the last 64 dims of x [..., T, ..., 512] in fp32.

    x has tokens on dim 0; positions [T] index the fp32 cos||sin table [P, 64]. Pair p is dims
    (448+2p, 449+2p): forward e' = e*c - o*s, o' = e*s + o*c; inverse a' = a*c + b*s, b' = b*c - a*s.
    Positions must be in range (callers mask the others).
    """
    x = x.to(torch.float32).clone()
    cs = cos_sin_cache.to(torch.float32)[positions.long()]  # [T, 64]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (ROPE_DIM // 2,)
    c, s = cs[:, : ROPE_DIM // 2].reshape(shape), cs[:, ROPE_DIM // 2 :].reshape(shape)
    even, odd = x[..., NOPE_DIM::2].clone(), x[..., NOPE_DIM + 1 :: 2].clone()
    if inverse:
        x[..., NOPE_DIM::2], x[..., NOPE_DIM + 1 :: 2] = even * c + odd * s, odd * c - even * s
    else:
        x[..., NOPE_DIM::2], x[..., NOPE_DIM + 1 :: 2] = even * c - odd * s, even * s + odd * c
    return x


def _positions_valid(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    return (positions >= 0) & (positions < cos_sin_cache.shape[0])


def _clamp_nan_to_min(y: torch.Tensor, qmax: float) -> torch.Tensor:
    """The KV writers' clamp fmin(fmax(y, -qmax), qmax) (spec §7.4): NaN becomes -qmax."""
    return torch.where(torch.isnan(y), torch.full_like(y, -qmax), y.clamp(-qmax, qmax))


def quantize_kv_record(k: torch.Tensor, fp8_format, quant_max: Optional[float] = None):
    """k [T, 512] (values already bf16-representable) -> (data [T, 576] uint8, scales [T, 8] uint8)."""
    fmt = int(fp8_format)
    qmax = _quant_max(fmt, quant_max)
    x = k.to(torch.float32)
    nope = x[:, :NOPE_DIM].reshape(-1, NUM_QUANT_BLOCKS, QUANT_BLOCK)
    amax = torch.where(torch.isnan(nope), torch.zeros_like(nope), nope.abs()).amax(dim=-1)  # NaN ignored
    scale_bytes = ue8m0_encode_rceil(amax, qmax, KV_AMAX_FLOOR)  # [T, 7]
    inverse = torch.where(scale_bytes == 255, torch.zeros(1, dtype=torch.float64, device=k.device),
                          _pow2(127 - scale_bytes.long()))
    y = nope.to(torch.float64) * inverse.unsqueeze(-1)  # exact: power-of-two scaling of fp32 values
    y = _clamp_nan_to_min(y, qmax)
    codes = fp8_encode(y.to(torch.float32).reshape(-1, NOPE_DIM), fmt, qmax).view(torch.uint8)
    rope = x[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(-1, 2 * ROPE_DIM)
    data = torch.cat([codes, rope], dim=1)
    scales = torch.cat([scale_bytes, torch.zeros_like(scale_bytes[:, :1])], dim=1)
    return data, scales


def dequantize_kv_record(data: torch.Tensor, scales: torch.Tensor, fp8_format) -> torch.Tensor:
    """(data [T, 576], scales [T, 8]) -> bf16 [T, 512]. A 0x80 NoPE byte reads as +0 in FNUZ (where it
    would be NaN: only an OCP writer makes it); UE8M0 byte 255 decodes as NaN."""
    fmt = int(fp8_format)
    codes = data[:, :NOPE_DIM]
    values = fp8_decode(codes, fmt)
    if fmt == FNUZ:
        values = torch.where(codes == 0x80, torch.zeros_like(values), values)
    byte = scales[:, :NUM_QUANT_BLOCKS].long()
    scale = torch.where(byte == 255, torch.full(byte.shape, float("nan"), dtype=torch.float64, device=data.device),
                        _pow2(byte - 127))
    nope = (values.to(torch.float64).reshape(-1, NUM_QUANT_BLOCKS, QUANT_BLOCK) * scale.unsqueeze(-1))
    nope = nope.reshape(-1, NOPE_DIM).to(torch.float32).to(torch.bfloat16)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16).reshape(-1, ROPE_DIM)
    return torch.cat([nope, rope], dim=1)


def _record_addresses(slots: torch.Tensor, block_size: int, block_stride: int):
    block, pos = slots // block_size, slots % block_size
    base = block * block_stride
    data = base + pos * DATA_BYTES
    scale = base + block_size * DATA_BYTES + pos * SCALE_BYTES
    return data, scale


def _check_cache(k_cache: torch.Tensor, block_size: int):
    if k_cache.dtype != torch.uint8 or k_cache.dim() < 1:
        raise ValueError(f"k_cache must be a uint8 tensor, got {k_cache.dtype}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if block_size * RECORD_BYTES > k_cache.stride(0):
        raise ValueError(f"k_cache.stride(0) = {k_cache.stride(0)} bytes cannot hold {block_size} records of "
                         f"{RECORD_BYTES} bytes")


def write_kv_records(k: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int,
                     fp8_format, quant_max: Optional[float] = None, valid: Optional[torch.Tensor] = None):
    """Quantizes k [T, 512] and writes token t's record at slot_mapping[t]; skips negative slots, slots
    at or beyond size(0) * block_size, and tokens where `valid` is False. Returns k_cache."""
    _check_cache(k_cache, block_size)
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < k_cache.shape[0] * block_size)
    if valid is not None:
        keep &= valid
    if not bool(keep.any()):
        return k_cache
    data, scales = quantize_kv_record(k[keep], fp8_format, quant_max)
    data_at, scale_at = _record_addresses(slots[keep], block_size, k_cache.stride(0))
    flat = k_cache.as_strided((k_cache.shape[0] * k_cache.stride(0),), (1,))
    flat[(data_at[:, None] + torch.arange(DATA_BYTES, device=k.device)).reshape(-1)] = data.reshape(-1)
    flat[(scale_at[:, None] + torch.arange(SCALE_BYTES, device=k.device)).reshape(-1)] = scales.reshape(-1)
    return k_cache


def quantize_and_insert_k_cache(k: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                block_size: int, fp8_format, quant_max: Optional[float] = None):
    """spec §9.1: k bf16 [T, 512] already rotated; the token count is slot_mapping.size(0)."""
    tokens = slot_mapping.shape[0]
    return write_kv_records(k[:tokens], k_cache, slot_mapping, block_size, fp8_format, quant_max)


def _padded_table(block_table: torch.Tensor) -> torch.Tensor:
    """The block table as int64 with one more column of -1 (no block), where columns past its width land
    (an empty table included)."""
    return torch.nn.functional.pad(block_table.long(), (0, 1), value=-1)


def dequantize_and_gather_k_cache(out: torch.Tensor, k_cache: torch.Tensor, seq_lens: torch.Tensor,
                                  gather_lens: Optional[torch.Tensor], block_table: torch.Tensor,
                                  block_size: int, offset: int, fp8_format):
    """spec §9.2: for request b, decode its last g = gather_lens[b] (default seq_lens[b]) tokens into
    out[b, offset : offset + g]. Logical positions whose block-table entry lies outside [0, size(0)) or
    past the table's width are not read; their rows are written as zeros. Returns out."""
    _check_cache(k_cache, block_size)
    flat = k_cache.as_strided((k_cache.shape[0] * k_cache.stride(0),), (1,))
    table = _padded_table(block_table)
    for b in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[b])
        g = int(gather_lens[b]) if gather_lens is not None else seq_len
        g = max(0, min(g, seq_len, out.shape[1] - offset))
        if g == 0:
            continue
        logical = torch.arange(seq_len - g, seq_len, device=out.device)
        block = table[b, (logical // block_size).clamp(max=block_table.shape[1])]  # past the width: the -1 column
        readable = (block >= 0) & (block < k_cache.shape[0])
        slots = torch.where(readable, block * block_size + logical % block_size, torch.zeros_like(block))
        data_at, scale_at = _record_addresses(slots, block_size, k_cache.stride(0))
        data = flat[data_at[:, None] + torch.arange(DATA_BYTES, device=out.device)]
        scales = flat[scale_at[:, None] + torch.arange(SCALE_BYTES, device=out.device)]
        rows = dequantize_kv_record(data, scales, fp8_format)
        rows = torch.where(readable[:, None], rows, torch.zeros_like(rows))
        out[b, offset : offset + g] = rows.to(out.dtype)
    return out


def _rms_factor(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) in fp32 with a correctly rounded sqrt and division (not rsqrt), as the
    kernels compute it: the two differ only by the order of the sum."""
    return 1.0 / torch.sqrt((x * x).sum(dim=-1, keepdim=True) / x.shape[-1] + eps)


def qnorm_rope(q: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, eps: float,
               apply_q_norm: bool = True) -> torch.Tensor:
    """Q [N, H, 512]: weightless RMSNorm over all 512 dims (fp32) then GPT-J RoPE; fp32 result, rows
    with out-of-range positions zeroed."""
    valid = _positions_valid(positions, cos_sin_cache)
    x = q.to(torch.float32)
    if apply_q_norm:
        x = x * _rms_factor(x, eps)
    x = rope_gptj(x, torch.where(valid, positions, torch.zeros_like(positions)), cos_sin_cache)
    return torch.where(valid[:, None, None], x, torch.zeros_like(x))


def kv_rope(kv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """KV [N, 512]: GPT-J RoPE in fp32 (positions clamped into the table; callers mask invalid rows)."""
    valid = _positions_valid(positions, cos_sin_cache)
    return rope_gptj(kv, torch.where(valid, positions, torch.zeros_like(positions)), cos_sin_cache)


def qnorm_rope_kv_insert(q_in: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         position_ids: torch.Tensor, cos_sin_cache: torch.Tensor, q_head_padded: int, eps: float,
                         cache_block_size: int, apply_q_norm: bool = True, fp8_format=OCP,
                         quant_max: Optional[float] = None) -> torch.Tensor:
    """spec §3.3. Returns q_out [N, q_head_padded, 512] in q_in's dtype (pad heads +0); writes the KV of
    the first slot_mapping.size(0) tokens into the fp8_ds_mla cache."""
    n, h = q_in.shape[0], q_in.shape[1]
    if q_head_padded < h:
        raise ValueError(f"q_head_padded ({q_head_padded}) must be >= the number of heads ({h})")
    q_out = torch.zeros((n, q_head_padded, HEAD_DIM), dtype=q_in.dtype, device=q_in.device)
    q_out[:, :h] = qnorm_rope(q_in, position_ids, cos_sin_cache, eps, apply_q_norm).to(q_in.dtype)
    n_ins = slot_mapping.shape[0]
    if n_ins > n:
        raise ValueError(f"slot_mapping has {n_ins} entries for {n} tokens")
    k = kv_rope(kv[:n_ins], position_ids[:n_ins], cos_sin_cache).to(torch.bfloat16)  # the bf16 round trip
    valid = _positions_valid(position_ids[:n_ins], cos_sin_cache)
    write_kv_records(k, k_cache, slot_mapping, cache_block_size, fp8_format, quant_max, valid)
    return q_out


def kv_rope_quant_insert(kv: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         position_ids: torch.Tensor, cos_sin_cache: torch.Tensor, cache_block_size: int,
                         fp8_format=OCP, quant_max: Optional[float] = None):
    """spec §6: the KV branch of qnorm_rope_kv_insert alone."""
    k = kv_rope(kv, position_ids, cos_sin_cache).to(torch.bfloat16)
    valid = _positions_valid(position_ids, cos_sin_cache)
    return write_kv_records(k, k_cache, slot_mapping, cache_block_size, fp8_format, quant_max, valid)


def kv_norm_rope_quant_insert(kv: torch.Tensor, norm_weight: torch.Tensor, k_cache: torch.Tensor,
                              slot_mapping: torch.Tensor, position_ids: torch.Tensor, cos_sin_cache: torch.Tensor,
                              eps: float, cache_block_size: int, fp8_format=OCP,
                              quant_max: Optional[float] = None):
    """spec §6: weighted RMSNorm (fp32, rounded to bf16) before the RoPE + quantize + insert."""
    x = kv.to(torch.float32)
    normed = (x * _rms_factor(x, eps) * norm_weight.to(torch.float32)).to(torch.bfloat16)
    return kv_rope_quant_insert(normed, k_cache, slot_mapping, position_ids, cos_sin_cache, cache_block_size,
                                fp8_format, quant_max)


def qnorm_rope_kv_insert_full_cache_bf16(q: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor,
                                         slot_mapping: torch.Tensor, position_ids: torch.Tensor,
                                         cos_sin_cache: torch.Tensor, eps: float, cache_block_size: int,
                                         apply_q_norm: bool = True):
    """spec §5, bf16 variant: q rewritten in place; k_cache bf16 [blocks, bs, 512] gets the rotated KV."""
    q.copy_(qnorm_rope(q, position_ids, cos_sin_cache, eps, apply_q_norm).to(q.dtype))
    n_ins = slot_mapping.shape[0]
    k = kv_rope(kv[:n_ins], position_ids[:n_ins], cos_sin_cache).to(k_cache.dtype)
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < k_cache.shape[0] * cache_block_size)
    keep &= _positions_valid(position_ids[:n_ins], cos_sin_cache)
    k_cache[slots[keep] // cache_block_size, slots[keep] % cache_block_size] = k[keep]
    return q, k_cache


def qnorm_rope_kv_insert_full_cache_fp8(q: torch.Tensor, kv: torch.Tensor, q_fp8: torch.Tensor,
                                        k_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                        position_ids: torch.Tensor, cos_sin_cache: torch.Tensor,
                                        fp8_scale: torch.Tensor, q_fp8_scale_inv: torch.Tensor, eps: float,
                                        cache_block_size: int, apply_q_norm: bool = True, fp8_format=OCP,
                                        quant_max: Optional[float] = None):
    """spec §5, fp8 variant: q_fp8 = fp8(clamp(q_fp32 * q_scale_inv)); cache = fp8(clamp(kv_fp32 / scale)),
    from fp32 with no bf16 round, the clamp taking NaN to -quant_max (§7.4); bytes in `fp8_format` whatever the
    tensors' float8 dtype."""
    fmt = int(fp8_format)
    qmax = _quant_max(fmt, quant_max)
    q32 = qnorm_rope(q, position_ids, cos_sin_cache, eps, apply_q_norm)
    q_scaled = _clamp_nan_to_min(q32 * q_fp8_scale_inv.to(torch.float32), qmax)
    q_fp8.view(torch.uint8).copy_(fp8_encode(q_scaled, fmt, qmax).view(torch.uint8))
    n_ins = slot_mapping.shape[0]
    # Multiplied by the fp32 reciprocal, as the kernels do (spec §5: it differs from a division only for
    # scales that are not powers of two).
    k32 = kv_rope(kv[:n_ins], position_ids[:n_ins], cos_sin_cache) * (1.0 / fp8_scale.to(torch.float32))
    codes = fp8_encode(_clamp_nan_to_min(k32, qmax), fmt, qmax).view(torch.uint8)
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < k_cache.shape[0] * cache_block_size)
    keep &= _positions_valid(position_ids[:n_ins], cos_sin_cache)
    k_cache.view(torch.uint8)[slots[keep] // cache_block_size, slots[keep] % cache_block_size] = codes[keep]
    return q_fp8, k_cache


def compute_global_topk_indices_and_lens(topk_indices: torch.Tensor, token_to_req_indices: torch.Tensor,
                                         block_table: torch.Tensor, block_size: int,
                                         is_valid_token: torch.Tensor):
    """spec §9.3: local top-k indices -> global cache slots (-1 where local < 0), and per-token counts.
    A local index past the block table's width also gives -1 (the spec leaves it undefined; a clamped
    column would name a slot of another block, which attention would then read)."""
    local = topk_indices.long()
    req = token_to_req_indices.long()[:, None].expand_as(local)
    col = local.clamp(min=0) // block_size
    in_table = (local >= 0) & (col < block_table.shape[1])
    block = _padded_table(block_table)[req, col.clamp(max=block_table.shape[1])]
    slots = block * block_size + local.clamp(min=0) % block_size
    global_idx = torch.where(in_table, slots, torch.full_like(slots, -1)).to(topk_indices.dtype)
    lens = torch.where(is_valid_token, (local >= 0).sum(dim=1), torch.zeros_like(local[:, 0])).to(torch.int32)
    return global_idx, lens


def combine_topk_swa_indices(topk_indices: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                             gather_lens: torch.Tensor, window_size: int, compress_ratio: int, topk: int, M: int,
                             N: int):
    """spec §9.4: per-token index lists into the gathered prefill workspace (request b's rows start at
    M*b; compressed entries in [0, N), SWA entries from N on). Token t of request b sits at absolute
    position pos = seq_len_b - query_len_b + (t - query_start_b); it takes
      topk_len = min((pos+1) // compress_ratio, topk) entries of topk_indices[t] (+ M*b), then
      swa_len = min(pos+1, window_size) entries M*b + N + (pos - swa_len + 1 - gather_start_b) + j,
    with gather_start_b = seq_len_b - gather_len_b. Rows are (topk + window) rounded up to 128 wide,
    padded with -1. Returns (indices int32 [T, width], lens int32 [T]). Tensor ops only: no host sync,
    so it runs on any device and under graph capture."""
    device = topk_indices.device
    tokens = topk_indices.shape[0]
    starts = (query_start_loc - query_start_loc[:1]).long()
    t = torch.arange(tokens, device=device)
    request = torch.searchsorted(starts[1:], t, right=True).clamp(max=seq_lens.shape[0] - 1)
    query_len = starts[request + 1] - starts[request]
    seq_len = seq_lens.long()[request]
    pos = seq_len - query_len + (t - starts[request])
    topk_len = torch.clamp((pos + 1) // max(int(compress_ratio), 1), min=0, max=int(topk)) if topk > 0 \
        else torch.zeros_like(pos)
    swa_len = torch.clamp(torch.minimum(pos + 1, torch.full_like(pos, int(window_size))), min=0)
    gather_start = seq_len - gather_lens.long()[request]
    width = -(-(int(topk) + int(window_size)) // 128) * 128
    cols = torch.arange(width, device=device)[None, :]
    base = (M * request)[:, None]
    k = topk_indices.shape[1]
    picked = topk_indices.long().gather(1, cols.clamp(max=max(k - 1, 0)).expand(tokens, -1)) if k > 0 \
        else torch.zeros(tokens, width, dtype=torch.long, device=device)
    in_topk = cols < topk_len[:, None]
    j = cols - topk_len[:, None]
    in_swa = (j >= 0) & (j < swa_len[:, None])
    swa_index = base + N + (pos - swa_len + 1 - gather_start)[:, None] + j
    out = torch.full((tokens, width), -1, dtype=torch.long, device=device)
    out = torch.where(in_topk, picked + base, out)
    out = torch.where(in_swa, swa_index, out)
    return out.to(torch.int32), (topk_len + swa_len).to(torch.int32)
