"""dsv4.ue8m0_to_float and the lossless float -> UE8M0 conversion (spec/wo_a.md §5.3, §6.1)."""

import math

import pytest
import torch

import dsv4ops
from dsv4ops import reference

from conftest import DEVICES, assert_bits_equal, assert_bytes_equal


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e8m0fnu], ids=["uint8", "e8m0fnu"])
def test_ue8m0_to_float_every_byte(device, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.ops.dsv4.ue8m0_to_float(codes.view(dtype).to(device))
    assert out.dtype == torch.float32
    assert_bits_equal(out, reference.ue8m0_to_float(codes))
    assert_bits_equal(out, codes.view(torch.float8_e8m0fnu).float())  # torch's own E8M0 semantics
    assert out[127].item() == 1.0 and out[0].item() == 2.0**-127 and math.isnan(out[255].item())


@pytest.mark.parametrize("device", DEVICES)
def test_lossless_op_bytes_and_refusals(device):
    values = [2.0**e for e in range(-127, 128)] + [0.0, -0.0, -1.0, 0.75, 3.0, math.inf, -math.inf, math.nan,
                                                   2.0**-128, 2.0**-149, 1.0000001]
    s = torch.tensor(values, dtype=torch.float32)
    byte, refusal = torch.ops.dsv4.float_to_ue8m0_lossless(s.to(device))
    ref_byte, ref_refusal = reference.float_to_ue8m0_lossless(s)
    assert_bytes_equal(byte, ref_byte)
    assert_bytes_equal(refusal, ref_refusal)
    assert byte[:255].cpu().tolist() == list(range(255))
    assert refusal[255:].cpu().tolist() == [2, 2, 2, 3, 3, 1, 1, 1, 4, 4, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_lossless_random_patterns_match_reference(device):
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-(2**31), 2**31 - 1, (100000,), generator=g, dtype=torch.int64).to(torch.int32)
    s = bits.view(torch.float32)
    byte, refusal = torch.ops.dsv4.float_to_ue8m0_lossless(s.to(device))
    ref_byte, ref_refusal = reference.float_to_ue8m0_lossless(s)
    assert_bytes_equal(byte, ref_byte)
    assert_bytes_equal(refusal, ref_refusal)


# The seven upstream cases (spec/wo_a.md §6.1) and the added ones.
def test_upstream_cases():
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([[0.5, 1.0, 2.0, 4.0]]))
    assert reason is None and byte.dtype == torch.uint8 and byte.is_contiguous()
    assert byte.tolist() == [[126, 127, 128, 129]]
    encoded = torch.tensor([[125, 127, 131]], dtype=torch.uint8)
    byte, reason = dsv4ops.float_to_ue8m0_lossless(encoded.view(torch.float8_e8m0fnu))
    assert reason is None and byte.dtype == torch.uint8 and byte.tolist() == [[125, 127, 131]]
    for bad, why in [(0.0, "is not positive"), (-1.0, "is not positive"), (0.75, "is not a power of two"),
                     (math.inf, "is not finite")]:
        byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([[bad, 1.0]]))
        assert byte is None and why in reason and "scale[0, 0]" in reason
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.ones(1, dtype=torch.int32))
    assert byte is None and "int32" in reason


def test_added_cases():
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([125, 255], dtype=torch.uint8))
    assert byte is None and "255" in reason and "scale[1]" in reason
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([2.0**-127, 2.0**127]))
    assert reason is None and byte.tolist() == [0, 254]
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([2.0**-128]))
    assert byte is None and "below 2^-127" in reason
    for dtype in (torch.bfloat16, torch.float16):
        byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([0.25, 8.0], dtype=dtype))
        assert reason is None and byte.tolist() == [125, 130]
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([1.0 + 2.0**-40], dtype=torch.float64))
    assert byte is None and "not exactly representable in float32" in reason
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.tensor([0.5, 1024.0], dtype=torch.float64))
    assert reason is None and byte.tolist() == [126, 137]
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.ones(2, dtype=torch.bool))
    assert byte is None
    byte, reason = dsv4ops.float_to_ue8m0_lossless(torch.empty(0, 3))
    assert reason is None and byte.shape == (0, 3)


@pytest.mark.parametrize(
    "op,args,match",
    [
        ("ue8m0_to_float", (torch.zeros(3, dtype=torch.int32),), "scale must have dtype uint8 or float8_e8m0fnu, got int32"),
        ("ue8m0_to_float", (torch.zeros(4, 4, dtype=torch.uint8).t(),), "scale must be contiguous"),
        ("float_to_ue8m0_lossless", (torch.zeros(3, dtype=torch.float64),), "scale must have dtype float32, got float64"),
        ("float_to_ue8m0_lossless", (torch.zeros(4, 4).t(),), "scale must be contiguous"),
    ],
)
def test_invalid_inputs(op, args, match):
    with pytest.raises(RuntimeError, match=match):
        getattr(torch.ops.dsv4, op)(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    assert torch.ops.dsv4.ue8m0_to_float(torch.empty(0, 2, dtype=torch.uint8, device=device)).shape == (0, 2)
    byte, refusal = torch.ops.dsv4.float_to_ue8m0_lossless(torch.empty(0, device=device))
    assert byte.shape == refusal.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    # Codes 0..254 only: opcheck compares eager and traced outputs without equal_nan, and code 255 decodes
    # to NaN (test_ue8m0_to_float_every_byte covers it), so a random 255 would fail the comparison by chance.
    codes = torch.randint(0, 255, (7, 9), dtype=torch.int32).to(torch.uint8).to(device)
    torch.library.opcheck(torch.ops.dsv4.ue8m0_to_float.default, (codes,))
    scales = torch.tensor([[0.5, 3.0, 1.0], [0.0, 8.0, -2.0]], device=device)
    torch.library.opcheck(torch.ops.dsv4.float_to_ue8m0_lossless.default, (scales,))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def f(codes, scales):
        byte, refusal = torch.ops.dsv4.float_to_ue8m0_lossless(scales)
        return torch.ops.dsv4.ue8m0_to_float(codes) * 2, byte, refusal

    codes = torch.randint(0, 255, (64,), dtype=torch.int32).to(torch.uint8).to(device)
    scales = torch.tensor([0.5, 3.0, 1.0, 2.0**-127], device=device)
    compiled = torch.compile(f, fullgraph=True)(codes, scales)
    for a, b in zip(compiled, f(codes, scales)):
        assert torch.equal(a, b)
