"""Reference DSv4 attention output projection wo_a (spec/wo_a.md): inverse GPT-J RoPE, per-(token, group)
FP8 quantization with UE8M0 group scales, and the grouped FP8 GEMM with 1x128 / 128x128 UE8M0 block
scales. Pure PyTorch, the test oracle and the fallback.

Contract decisions shared with the kernels:
  * cos_sin is one [P, 64] table (cos || sin), fp32 or bf16; the rotation runs in fp32 after widening it;
  * positions (int32 or int64) are clamped to [0, P - 1], never faulted (spec §3.3);
  * `apply_inverse_rope` says whether o's rope lanes are still in the rotated frame: True rotates them
    back, False leaves them as they are (the attention already did it). It is never inferred (spec §2);
  * group scale: amax over the group's lanes (NaN ignored) floored at 1e-8, RCEIL byte from an fp32
    division amax / quant_max (dsv4ops rule), values multiplied by the exact inverse power of two, clamped
    to +-quant_max, rounded to nearest even (NaN stays NaN; an Inf amax gives byte 255 and NaN codes for
    the Inf lanes, 0 for the finite ones);
  * the rotated values are not rounded to bf16 before quantization (spec §3.3, the fused reference).
"""

from __future__ import annotations

import torch

from .fp8 import _pow2, fp8_decode, fp8_encode, ue8m0_encode_rceil

HEAD_DIM = 512
ROPE_DIM = 64
NOPE_DIM = HEAD_DIM - ROPE_DIM
SCALE_BLOCK = 128  # the GEMM's K block and N block
GROUP_AMAX_FLOOR = 1e-8


def clamp_positions(positions: torch.Tensor, table_rows: int) -> torch.Tensor:
    return positions.long().clamp(0, table_rows - 1)


def rotate_back(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """o [S, H, 512] -> fp32 with the inverse GPT-J rotation on lanes 448..511 of every head:
    a' = a*c + b*s, b' = b*c - a*s for the pair (448 + 2i, 449 + 2i)."""
    x = o.to(torch.float32).clone()
    cs = cos_sin.to(torch.float32)[clamp_positions(positions[: o.shape[0]], cos_sin.shape[0])]
    c, s = cs[:, None, : ROPE_DIM // 2], cs[:, None, ROPE_DIM // 2 :]
    a, b = x[..., NOPE_DIM::2].clone(), x[..., NOPE_DIM + 1 :: 2].clone()
    x[..., NOPE_DIM::2] = a * c + b * s
    x[..., NOPE_DIM + 1 :: 2] = b * c - a * s
    return x


def inverse_rope(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """The BF16 path's first step: the inverse rotation in fp32, rounded once to o's dtype."""
    return rotate_back(o, positions, cos_sin).to(o.dtype)


def inverse_rope_group_quant(o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, num_groups: int,
                             group_size: int, fp8_format, quant_max: float, apply_inverse_rope: bool):
    """spec §3: o [S, H, 512] -> (x_fp8 [S, G, D] in fp8_format's dtype, x_scale [S, G, D / group_size] uint8),
    D = H * 512 / G, token-major ("row" scale layout)."""
    s_count, heads, head_dim = o.shape
    if head_dim != HEAD_DIM or group_size not in (32, 64, 128) or num_groups <= 0 or (heads * HEAD_DIM) % num_groups:
        raise ValueError(f"inverse_rope_group_quant: needs o [S, H, 512], group_size 32/64/128 and num_groups "
                         f"dividing H * 512; got {tuple(o.shape)}, {group_size}, {num_groups}")
    if positions.dim() != 1 or positions.shape[0] < s_count or cos_sin.dim() != 2 or cos_sin.shape[1] != 2 * 32:
        raise ValueError("inverse_rope_group_quant: positions must be 1-D with >= S entries and cos_sin [P, 64]")
    d = heads * HEAD_DIM // num_groups
    if d % group_size:
        raise ValueError(f"inverse_rope_group_quant: the group width {d} is not a multiple of {group_size}")
    x = rotate_back(o, positions, cos_sin) if apply_inverse_rope else o.to(torch.float32)
    groups = x.reshape(s_count, num_groups, d // group_size, group_size)
    magnitude = torch.where(torch.isnan(groups), torch.zeros_like(groups), groups.abs())  # NaN ignored, Inf kept
    amax = magnitude.amax(dim=-1) if groups.numel() else magnitude.sum(dim=-1)
    scale = ue8m0_encode_rceil(amax, quant_max, GROUP_AMAX_FLOOR)
    inverse = torch.where(scale == 255, torch.zeros((), dtype=torch.float64), _pow2(127 - scale.to(torch.int64)))
    scaled = (groups.to(torch.float64) * inverse[..., None]).to(torch.float32)  # exact: a power of two
    codes = fp8_encode(scaled, fp8_format, quant_max)
    return codes.reshape(s_count, num_groups, d), scale


def dequantize_activation(x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
    """x [M, G, K] FP8 (decoded per its dtype), x_scale [M, G, K/128] bytes -> fp64."""
    values = fp8_decode(x.contiguous().view(torch.uint8), _format_of(x.dtype))
    factors = _scale_factors(x_scale).repeat_interleave(SCALE_BLOCK, dim=-1)
    return values.to(torch.float64) * factors


def dequantize_weight(w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """w [G, N, K] FP8, w_scale [G, N/128, K/128] bytes -> fp64."""
    values = fp8_decode(w.contiguous().view(torch.uint8), _format_of(w.dtype))
    factors = _scale_factors(w_scale)
    factors = factors.repeat_interleave(SCALE_BLOCK, dim=-2).repeat_interleave(SCALE_BLOCK, dim=-1)
    return values.to(torch.float64) * factors


def bmm_a8w8_mxscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """spec §4.3: Y[m, g, n] = sum_kb 2^(a-127) 2^(w-127) sum_{k in kb} x w, from the dequantized operands
    (fp64 here: the oracle), rounded once to out_dtype. Returns [M, G, N]."""
    m, g, k = x.shape
    if (w.dim() != 3 or w.shape[0] != g or w.shape[2] != k or k % SCALE_BLOCK or w.shape[1] % SCALE_BLOCK
            or tuple(x_scale.shape) != (m, g, k // SCALE_BLOCK)
            or tuple(w_scale.shape) != (g, w.shape[1] // SCALE_BLOCK, k // SCALE_BLOCK)
            or out_dtype not in (torch.bfloat16, torch.float32, torch.float64)):
        raise ValueError(f"bmm_a8w8_mxscale: inconsistent shapes or dtype: x {tuple(x.shape)}, w {tuple(w.shape)}, "
                         f"x_scale {tuple(x_scale.shape)}, w_scale {tuple(w_scale.shape)}, out {out_dtype}")
    a = dequantize_activation(x, x_scale)
    b = dequantize_weight(w, w_scale)
    return torch.einsum("mgk,gnk->mgn", a, b).to(out_dtype)


def _scale_factors(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp64 powers of two; byte 255 is NaN."""
    byte = scale.contiguous().view(torch.uint8).to(torch.int64)
    return torch.where(byte == 255, torch.full(byte.shape, float("nan"), dtype=torch.float64, device=byte.device), _pow2(byte - 127))


def _format_of(dtype: torch.dtype) -> int:
    if dtype == torch.float8_e4m3fn:
        return 0
    if dtype == torch.float8_e4m3fnuz:
        return 1
    raise ValueError(f"expected float8_e4m3fn or float8_e4m3fnuz operands, got {dtype}")
