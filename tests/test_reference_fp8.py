"""The reference itself, against hand-worked byte vectors and torch's float8 casts."""

import math

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, reference

from conftest import FORMATS, assert_bytes_equal

# (value, OCP byte, FNUZ byte), worked by hand from the encodings' definitions (spec/kv_cache.md §7.1):
# OCP 1.0 = 2^(7-7) -> E=7,M=0 -> 0x38; FNUZ 1.0 = 2^(8-8) -> E=8 -> 0x40.
HAND_WORKED = [
    (0.0, 0x00, 0x00),
    (-0.0, 0x80, 0x00),
    (1.0, 0x38, 0x40),
    (-2.0, 0xC0, 0xC8),
    (3.0, 0x44, 0x4C),  # 1.5 * 2^1: M = 4
    (0.875, 0x36, 0x3E),
    (2.0**-9, 0x01, 0x02),  # OCP subnormal unit 2^-9; FNUZ unit 2^-10, so two units
    (240.0, 0x77, 0x7F),
    (448.0, 0x7E, 0x7F),  # FNUZ saturates at 240
    (float("inf"), 0x7E, 0x7F),
    (float("nan"), 0x7F, 0x80),
]


@pytest.mark.parametrize("value,ocp_byte,fnuz_byte", HAND_WORKED)
def test_reference_encode_hand_worked(value, ocp_byte, fnuz_byte):
    x = torch.tensor([value], dtype=torch.float32)
    assert reference.fp8_encode(x, Fp8Format.OCP, 448.0).view(torch.uint8).item() == ocp_byte
    assert reference.fp8_encode(x, Fp8Format.FNUZ, 240.0).view(torch.uint8).item() == fnuz_byte


def test_reference_decode_all_codes_against_torch():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for fmt, dtype in ((Fp8Format.OCP, torch.float8_e4m3fn), (Fp8Format.FNUZ, torch.float8_e4m3fnuz)):
        ours = reference.fp8_decode(codes, fmt)
        theirs = codes.view(dtype).to(torch.float32)
        torch.testing.assert_close(ours, theirs, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_encode_matches_torch_cast_in_range(fmt):
    torch.manual_seed(0)
    top = fmt.max_finite
    x = torch.cat([torch.empty(100000).uniform_(-top, top), torch.randn(100000) * 1e-2, torch.randn(1000) * 1e-4])
    ours = reference.fp8_encode(x, fmt, top)
    theirs = x.to(fmt.torch_dtype)
    assert_bytes_equal(ours, theirs)


def test_reference_ue8m0_decode_matches_torch_e8m0():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    theirs = codes.view(torch.float8_e8m0fnu).to(torch.float32)
    torch.testing.assert_close(reference.ue8m0_to_float(codes), theirs, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize(
    "amax,quant_max,floor,byte",
    [(0.0, 448.0, 1e-8, 92), (0.0, 224.0, 1e-8, 93), (1.0, 448.0, 1e-8, 119), (1.0, 240.0, 1e-8, 120),
     (448.0, 448.0, 1e-8, 127), (448.0, 224.0, 1e-8, 128), (3.3895313892515355e38, 448.0, 1e-8, 247),
     (math.inf, 448.0, 1e-8, 255), (math.nan, 224.0, 1e-8, 255), (0.0, 448.0, 1e-4, 105), (0.0, 224.0, 1e-4, 106)],
)
def test_reference_ue8m0_encode_spec_table(amax, quant_max, floor, byte):
    assert reference.ue8m0_encode_rceil(torch.tensor([amax]), quant_max, floor).item() == byte


def test_reference_lossless_scale_conversion():
    s = torch.tensor([0.5, 1.0, 2.0, 4.0, 2.0**-127, 2.0**127, 0.0, -1.0, 0.75, math.inf, 2.0**-128])
    byte, refusal = reference.float_to_ue8m0_lossless(s)
    assert byte.tolist() == [126, 127, 128, 129, 0, 254, 255, 255, 255, 255, 255]
    assert refusal.tolist() == [0, 0, 0, 0, 0, 0, 2, 2, 3, 1, 4]


def test_reference_refuses_what_the_ops_refuse(monkeypatch):
    """The reference is the fallback (DSV4OPS_DISABLE, devices without a kernel): a call the op refuses must be
    refused there too, not read some other way (an fp16 scale's bytes as UE8M0, say)."""
    x = torch.zeros(256, 256, dtype=torch.uint8)
    with pytest.raises(ValueError, match="scale must have dtype uint8 or float8_e8m0fnu or float32, got torch.float16"):
        reference.fp8_block_dequantize(x, torch.ones(2, 2, dtype=torch.float16), 128, 128, 0, torch.bfloat16)
    with pytest.raises(ValueError, match=r"scale must have shape \[2, 2\]"):
        reference.fp8_block_dequantize(x, torch.ones(3, 3), 128, 128, 0, torch.bfloat16)
    with pytest.raises(ValueError, match="ue8m0_to_float: scale must have dtype uint8"):
        reference.ue8m0_to_float(torch.ones(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="weight must have dtype float8_e4m3fn or uint8"):
        reference.e4m3fn_to_fnuz(torch.zeros(4, dtype=torch.float8_e4m3fnuz), torch.ones(1))
    monkeypatch.setenv("DSV4OPS_DISABLE", "all")  # the public wrappers on the reference path
    with pytest.raises(ValueError, match=r"scale must have shape \[2, 2\]"):
        dsv4ops.fp8_block_dequantize(x, torch.ones(3, 3), fp8_format="ocp")
    with pytest.raises(ValueError, match="weight must have dtype float8_e4m3fn or uint8"):
        dsv4ops.e4m3fn_to_fnuz(torch.zeros(4, dtype=torch.float8_e4m3fnuz), torch.ones(1))
