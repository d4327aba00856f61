"""FP8 / UE8M0 conversions: public wrappers over torch.ops.dsv4.* with reference fallback.

Encodings are explicit wherever a tensor's dtype does not name them; where it does (float8_e4m3fn is
OCP, float8_e4m3fnuz is FNUZ) the dtype is the default. Platform defaults (FNUZ + 224 on gfx942, OCP +
448 elsewhere) come from the tensor's device at call time.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import dispatch, reference
from .platform import Fp8Format, format_and_quant_max

_REFUSAL_REASONS = {
    1: "is not finite",
    2: "is not positive",
    3: "is not a power of two (rounding it would change the weights)",
    4: "is below 2^-127, the smallest UE8M0 scale",
}


def _ops():
    return torch.ops.dsv4


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8 or float8_e8m0fnu) -> float32 2^(u-127); byte 0 is 2^-127, 255 is NaN."""
    if dispatch.choose("ue8m0_to_float", scale.device).uses_kernel:
        return _ops().ue8m0_to_float(scale.contiguous())
    return reference.ue8m0_to_float(scale)


def float_to_ue8m0_lossless(scale: torch.Tensor) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """Checkpoint block scales -> UE8M0 bytes, only if that loses nothing.

    Returns (uint8 tensor of the same shape, None), or (None, reason) when any scale has no exact UE8M0
    byte: not a floating or UE8M0 dtype, not finite, not positive, not a power of two, below 2^-127, or
    an E8M0 byte 255 (NaN). Nothing is ever rounded. Reads the result on the host (a load-time call).
    """
    if scale.dtype in reference.UE8M0_DTYPES:
        raw = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
        nan_bytes = raw == 255
        if bool(nan_bytes.any()):
            index = tuple(int(i) for i in nan_bytes.nonzero()[0].tolist())
            return None, f"scale{list(index)} is the E8M0 NaN byte 255"
        return raw.contiguous(), None
    if not scale.dtype.is_floating_point:
        return None, f"scale dtype {scale.dtype} is neither floating point nor UE8M0"
    as_float32 = scale.to(torch.float32)
    if scale.dtype == torch.float64:
        inexact = as_float32.to(torch.float64) != scale
        inexact &= ~torch.isnan(scale)
        if bool(inexact.any()):
            index = tuple(int(i) for i in inexact.nonzero()[0].tolist())
            return None, f"scale{list(index)} = {scale[index].item()!r} is not exactly representable in float32"
    decision = dispatch.choose("float_to_ue8m0_lossless", scale.device)
    if decision.uses_kernel:
        byte, refusal = _ops().float_to_ue8m0_lossless(as_float32.contiguous())
    else:
        byte, refusal = reference.float_to_ue8m0_lossless(as_float32)
    refused = refusal != 0
    if bool(refused.any()):
        index = tuple(int(i) for i in refused.nonzero()[0].tolist())
        code = int(refusal[index].item())
        return None, f"scale{list(index)} = {scale[index].item()!r} {_REFUSAL_REASONS[code]}"
    return byte, None


def fp8_encode(x: torch.Tensor, fp8_format=None, quant_max: Optional[float] = None) -> torch.Tensor:
    """fp32/bf16 -> FP8 e4m3: clamp to +-quant_max, round to nearest even; NaN -> the NaN code.

    fp8_format defaults to the device's encoding; quant_max to that encoding's default (448 OCP, 224
    FNUZ). The result has the format's dtype (float8_e4m3fn or float8_e4m3fnuz).
    """
    fmt, qmax = format_and_quant_max(x.device, fp8_format, quant_max, "fp8_encode")

    def supported():
        if x.dtype not in (torch.float32, torch.bfloat16):
            return f"input dtype {x.dtype} (kernel takes float32 or bfloat16)"
        return None

    if dispatch.choose("fp8_encode", x.device, supported).uses_kernel:
        return _ops().fp8_encode(x.contiguous(), int(fmt), qmax)
    return reference.fp8_encode(x, fmt, qmax)


def _format_from_dtype(x: torch.Tensor, fp8_format, op: str) -> Fp8Format:
    if fp8_format is not None:
        return Fp8Format.parse(fp8_format)
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return Fp8Format.parse(x.dtype)
    raise ValueError(f"{op}: fp8_format is required for {x.dtype} bytes (pass Fp8Format.OCP or Fp8Format.FNUZ)")


def fp8_block_dequantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    block_size=(128, 128),
    fp8_format=None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """FP8 x [..., R, C] times per-block scales [..., ceil(R/br), ceil(C/bc)] -> out_dtype.

    Scales are UE8M0 bytes (uint8 / float8_e8m0fnu) or float32. fp8_format defaults to x's dtype
    (required for uint8 x). With UE8M0 scales every product is exact before the final rounding.
    """
    fmt = _format_from_dtype(x, fp8_format, "fp8_block_dequantize")
    block_rows, block_cols = (block_size, block_size) if isinstance(block_size, int) else block_size
    if dispatch.choose("fp8_block_dequantize", x.device).uses_kernel:
        return _ops().fp8_block_dequantize(x.contiguous(), scale.contiguous(), int(block_rows), int(block_cols), int(fmt),
                                           out_dtype)
    return reference.fp8_block_dequantize(x, scale, int(block_rows), int(block_cols), fmt, out_dtype)


def e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor, inplace: bool = False):
    """Normalize an OCP (e4m3fn) checkpoint weight for gfx942: the same bytes read as FNUZ are worth
    half, so the block scale doubles (UE8M0 byte + 1, or fp32 x 2); 0x80 (-0) becomes 0x00.

    Returns (weight, scale). Out of place, an e4m3fn weight comes back as float8_e4m3fnuz. In place,
    the tensors keep their dtypes and hold FNUZ bytes and the doubled scales. Raises ValueError (before
    changing anything) if a scale cannot double exactly: UE8M0 byte >= 254, or an fp32 scale that is
    not finite or >= 2^127. Reads the scales on the host (a load-time call).
    """
    if scale.dtype in reference.UE8M0_DTYPES:
        raw = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
        overflow = raw >= 254
    elif scale.dtype == torch.float32:
        overflow = ~torch.isfinite(scale) | (scale.abs() >= 2.0**127)
    else:
        raise ValueError(f"e4m3fn_to_fnuz: scale dtype must be uint8, float8_e8m0fnu or float32, got {scale.dtype}")
    if bool(overflow.any()):
        index = tuple(int(i) for i in overflow.nonzero()[0].tolist())
        value = scale[index].item() if scale.dtype == torch.float32 else int(scale[index].view(torch.uint8).item())
        raise ValueError(f"e4m3fn_to_fnuz: scale{list(index)} = {value!r} cannot be doubled exactly")
    decision = dispatch.choose("e4m3fn_to_fnuz", weight.device)
    if inplace:
        if decision.uses_kernel:
            _ops().e4m3fn_to_fnuz_(weight, scale)
        else:
            new_weight, new_scale = reference.e4m3fn_to_fnuz(weight, scale)
            weight.view(torch.uint8).copy_(new_weight.view(torch.uint8))
            scale.copy_(new_scale)
        return weight, scale
    if decision.uses_kernel:
        return _ops().e4m3fn_to_fnuz(weight.contiguous(), scale.contiguous())
    return reference.e4m3fn_to_fnuz(weight, scale)
