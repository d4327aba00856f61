"""Reference FP8 e4m3 (OCP and FNUZ) and UE8M0 numerics (spec/kv_cache.md §7-§8, spec/wo_a.md §5.3).

Refusal codes of float_to_ue8m0_lossless: 0 exact, 1 not finite, 2 not positive, 3 not a power of
two, 4 a power of two below 2^-127.
"""

from __future__ import annotations

import torch

OCP, FNUZ = 0, 1
_BIAS = {OCP: 7, FNUZ: 8}
_MAX_FINITE = {OCP: 448.0, FNUZ: 240.0}
_NAN_CODE = {OCP: 0x7F, FNUZ: 0x80}


def _format(fp8_format) -> int:
    value = int(fp8_format)
    if value not in (OCP, FNUZ):
        raise ValueError(f"fp8_format must be 0 (OCP) or 1 (FNUZ), got {fp8_format!r}")
    return value


def _decode_table(fmt: int) -> torch.Tensor:
    """float64 value of each of the 256 codes, from the definition of the encoding."""
    bias = _BIAS[fmt]
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if (fmt == OCP and code & 0x7F == 0x7F) or (fmt == FNUZ and code == 0x80):
            values.append(float("nan"))
        elif exponent == 0:
            values.append(sign * mantissa / 8.0 * 2.0 ** (1 - bias))
        else:
            values.append(sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - bias))
    return torch.tensor(values, dtype=torch.float64)


_TABLES = {fmt: _decode_table(fmt) for fmt in (OCP, FNUZ)}


# Exact powers of two 2^-200 .. 2^200 (torch.pow on a GPU need not be exact for them).
_POW2_MIN_EXPONENT = -200
_POW2 = torch.tensor([2.0**k for k in range(_POW2_MIN_EXPONENT, 201)], dtype=torch.float64)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent in float64, exactly, for integer exponents in [-200, 200]."""
    return _POW2.to(exponent.device)[exponent.long() - _POW2_MIN_EXPONENT]


UE8M0_DTYPES = (torch.uint8, torch.float8_e8m0fnu)  # the dtypes UE8M0 scale bytes come in


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype != torch.uint8 else x


def fp8_decode(codes: torch.Tensor, fp8_format) -> torch.Tensor:
    """FP8 bytes (uint8 or a float8 e4m3 tensor, read as `fp8_format`) -> float32 values."""
    table = _TABLES[_format(fp8_format)].to(codes.device)
    return table[_bytes(codes).long()].to(torch.float32)


def fp8_encode(x: torch.Tensor, fp8_format, quant_max: float) -> torch.Tensor:
    """Clamp to +-quant_max, then round to nearest even into `fp8_format`; NaN -> the NaN code.

    Returns a float8 tensor of the format's dtype (OCP: float8_e4m3fn, FNUZ: float8_e4m3fnuz).
    """
    fmt = _format(fp8_format)
    bias = _BIAS[fmt]
    v = x.to(torch.float64)
    nan = torch.isnan(v)
    negative = torch.signbit(v)
    a = v.abs().clamp(max=float(quant_max)).nan_to_num(0.0)
    # Quantum at a's binade; below the smallest normal 2^(1-bias) the quantum is fixed (subnormals).
    _, exp = torch.frexp(a)  # a = m * 2^exp, m in [0.5, 1)
    binade = torch.clamp(exp - 1, min=1 - bias)
    quantum = _pow2(binade - 3)
    units = torch.round(a / quantum)  # torch.round: half to even
    q = units * quantum
    q = q.clamp(max=_MAX_FINITE[fmt])
    # Code from the rounded magnitude (exact in float64).
    _, qexp = torch.frexp(q)
    qbinade = torch.clamp(qexp - 1, min=1 - bias)
    is_normal = q >= 2.0 ** (1 - bias)
    biased = torch.where(is_normal, qbinade + bias, torch.zeros_like(qbinade))
    step = _pow2(qbinade - 3)
    mantissa = torch.where(is_normal, q / step - 8.0, q / step).round().to(torch.int64)
    code = (biased.to(torch.int64) << 3) | mantissa
    if fmt == OCP:
        code = code | (negative.to(torch.int64) << 7)
    else:
        code = torch.where(code == 0, code, code | (negative.to(torch.int64) << 7))
    code = torch.where(nan, torch.full_like(code, _NAN_CODE[fmt]), code)
    out = code.to(torch.uint8)
    return out.view(torch.float8_e4m3fnuz if fmt == FNUZ else torch.float8_e4m3fn)


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Byte u -> 2^(u-127) as float32; byte 0 is 2^-127 (subnormal), byte 255 is NaN."""
    if scale.dtype not in UE8M0_DTYPES:
        raise ValueError(f"ue8m0_to_float: scale must have dtype uint8 or float8_e8m0fnu, got {scale.dtype}")
    u = _bytes(scale).long()
    value = _pow2(u - 127)
    value = torch.where(u == 255, torch.full_like(value, float("nan")), value)
    return value.to(torch.float32)


def ue8m0_encode_rceil(amax: torch.Tensor, quant_max: float, amax_floor: float) -> torch.Tensor:
    """Smallest 2^e with amax / 2^e <= quant_max (fp32 division), as the byte e + 127 (uint8).

    NaN or Inf amax gives 255; a subnormal quotient gives 1 (the bit-level rule of the kernels).
    """
    a = amax.to(torch.float32).abs()
    bad = ~torch.isfinite(a)
    a = torch.clamp(a, min=amax_floor)
    r = (a / torch.tensor(quant_max, dtype=torch.float32)).to(torch.float64)  # fp32 division, then exact
    bad |= ~torch.isfinite(r)
    mantissa, exp = torch.frexp(r)  # r = m * 2^exp, m in [0.5, 1): ceil(log2 r) = exp - (m == 0.5)
    ceil_log2 = exp - (mantissa == 0.5).to(exp.dtype)
    byte = torch.clamp(ceil_log2 + 127, 1, 255)
    byte = torch.where(r == 0, torch.zeros_like(byte), byte)
    byte = torch.where(bad, torch.full_like(byte, 255), byte)
    return byte.to(torch.uint8)


def float_to_ue8m0_lossless(scale: torch.Tensor):
    """float32 scales -> (uint8 bytes, uint8 refusal codes); refused entries get byte 255."""
    s = scale.to(torch.float64)
    refusal = torch.zeros(s.shape, dtype=torch.uint8, device=s.device)
    mantissa, exp = torch.frexp(s)
    power_of_two = mantissa == 0.5
    exponent = exp - 1  # s == 2^exponent when power_of_two
    refusal = torch.where(power_of_two & (exponent < -127), torch.full_like(refusal, 4), refusal)
    refusal = torch.where(~power_of_two, torch.full_like(refusal, 3), refusal)
    refusal = torch.where(s <= 0, torch.full_like(refusal, 2), refusal)
    refusal = torch.where(~torch.isfinite(s), torch.full_like(refusal, 1), refusal)
    byte = torch.where(refusal == 0, (exponent + 127).clamp(0, 254), torch.full_like(exponent, 255))
    return byte.to(torch.uint8), refusal


def _check_block_dequantize(x, scale, block_rows: int, block_cols: int, out_dtype):
    """The op's checks, so that a call the kernel refuses is refused here too, not read some other way."""
    if x.dtype not in (torch.uint8, torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"fp8_block_dequantize: x must have dtype uint8 or float8_e4m3fn or float8_e4m3fnuz, got "
                         f"{x.dtype}")
    if scale.dtype not in UE8M0_DTYPES + (torch.float32,):
        raise ValueError(f"fp8_block_dequantize: scale must have dtype uint8 or float8_e8m0fnu or float32, got "
                         f"{scale.dtype}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"fp8_block_dequantize: out_dtype must be bfloat16 or float32, got {out_dtype}")
    if block_rows <= 0 or block_cols <= 0 or x.dim() < 2 or scale.dim() != x.dim():
        raise ValueError(f"fp8_block_dequantize: needs positive blocks, x [..., rows, cols] and a scale of as many "
                         f"dims; got blocks {block_rows}x{block_cols}, x {tuple(x.shape)}, scale {tuple(scale.shape)}")
    want = tuple(x.shape[:-2]) + (-(-x.shape[-2] // block_rows), -(-x.shape[-1] // block_cols))
    if tuple(scale.shape) != want:
        raise ValueError(f"fp8_block_dequantize: scale must have shape {list(want)} for x {tuple(x.shape)} and blocks "
                         f"{block_rows}x{block_cols}, got {tuple(scale.shape)}")


def fp8_block_dequantize(x, scale, block_rows: int, block_cols: int, fp8_format, out_dtype):
    """x [..., R, C] FP8 bytes times scale [..., ceil(R/br), ceil(C/bc)] (UE8M0 bytes or fp32)."""
    _check_block_dequantize(x, scale, block_rows, block_cols, out_dtype)
    values = fp8_decode(x, fp8_format)
    if scale.dtype == torch.float32:
        s = scale
    else:
        s = ue8m0_to_float(scale)
    rows, cols = x.shape[-2], x.shape[-1]
    s = s.repeat_interleave(block_rows, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(block_cols, dim=-1)[..., :cols]
    return (values * s).to(out_dtype)


def e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor):
    """OCP weight bytes re-read as FNUZ (worth half; 0x80 -> 0x00, NaN -> 0x80) and the doubled scale."""
    if weight.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"e4m3fn_to_fnuz: weight must have dtype float8_e4m3fn or uint8 (OCP bytes), got "
                         f"{weight.dtype}")
    if scale.dtype not in UE8M0_DTYPES + (torch.float32,):
        raise ValueError(f"e4m3fn_to_fnuz: scale dtype must be uint8, float8_e8m0fnu or float32, got {scale.dtype}")
    w = _bytes(weight)
    w = torch.where(w == 0x80, torch.zeros_like(w), w)
    w = torch.where((_bytes(weight) & 0x7F) == 0x7F, torch.full_like(w, 0x80), w)
    if weight.dtype == torch.float8_e4m3fn:
        w = w.view(torch.float8_e4m3fnuz)
    if scale.dtype == torch.float32:
        new_scale = scale * 2
    else:
        u = _bytes(scale).to(torch.int16)
        new_scale = torch.where(u >= 254, torch.full_like(u, 255), u + 1).to(torch.uint8)
        if scale.dtype != torch.uint8:
            new_scale = new_scale.view(scale.dtype)
    return w, new_scale
