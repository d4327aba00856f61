"""dsv4.e4m3fn_to_fnuz / e4m3fn_to_fnuz_: checkpoint normalization for gfx942 keeps every value."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, reference

from conftest import DEVICES, assert_bits_equal, assert_bytes_equal


def _weight_and_scales(seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 2).view(torch.float8_e4m3fn)
    weight = weight.view(torch.uint8)[torch.randperm(256, generator=g)].view(torch.float8_e4m3fn)  # [256, 512]
    ue8m0 = torch.randint(0, 254, (2, 4), generator=g, dtype=torch.int32).to(torch.uint8)
    fp32 = torch.pow(2.0, torch.randint(-30, 30, (2, 4), generator=g).float()) * 1.5
    return weight, ue8m0, fp32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_kind", ["ue8m0", "e8m0fnu", "fp32"])
def test_matches_reference_and_keeps_values(device, scale_kind):
    weight, ue8m0, fp32 = _weight_and_scales()
    scale = {"ue8m0": ue8m0, "e8m0fnu": ue8m0.view(torch.float8_e8m0fnu), "fp32": fp32}[scale_kind]
    new_weight, new_scale = torch.ops.dsv4.e4m3fn_to_fnuz(weight.to(device), scale.to(device))
    ref_weight, ref_scale = reference.e4m3fn_to_fnuz(weight, scale)
    assert new_weight.dtype == torch.float8_e4m3fnuz and new_scale.dtype == scale.dtype
    assert_bytes_equal(new_weight, ref_weight)
    if scale_kind == "fp32":
        assert_bits_equal(new_scale, ref_scale)
    else:
        assert_bytes_equal(new_scale, ref_scale)
    # The dequantized weight is unchanged (NaN bytes stay NaN, -0 becomes +0).
    before = dsv4ops.fp8_block_dequantize(weight, scale, 128, out_dtype=torch.float32)
    after = dsv4ops.fp8_block_dequantize(new_weight.cpu(), new_scale.cpu(), 128, out_dtype=torch.float32)
    torch.testing.assert_close(after, before, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_byte_map(device):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    mapped, _ = torch.ops.dsv4.e4m3fn_to_fnuz(codes.to(device), torch.ones(1, dtype=torch.uint8, device=device))
    mapped = mapped.cpu()
    assert mapped.dtype == torch.uint8  # uint8 in, uint8 out
    assert mapped[0x80] == 0 and mapped[0x7F] == 0x80 and mapped[0xFF] == 0x80
    others = [c for c in range(256) if c not in (0x7F, 0x80, 0xFF)]
    assert mapped[others].tolist() == others


@pytest.mark.parametrize("device", DEVICES)
def test_in_place(device):
    weight, ue8m0, _ = _weight_and_scales(seed=1)
    expected_weight, expected_scale = reference.e4m3fn_to_fnuz(weight, ue8m0)
    w, s = weight.clone().to(device), ue8m0.clone().to(device)
    torch.ops.dsv4.e4m3fn_to_fnuz_(w, s)
    assert w.dtype == torch.float8_e4m3fn  # bytes changed, dtype kept
    assert_bytes_equal(w, expected_weight)
    assert_bytes_equal(s, expected_scale)
    w2, s2 = weight.clone().to(device), ue8m0.clone().to(device)
    out_w, out_s = dsv4ops.e4m3fn_to_fnuz(w2, s2, inplace=True)
    assert out_w is w2 and out_s is s2
    assert_bytes_equal(w2, expected_weight)
    assert_bytes_equal(s2, expected_scale)


def test_wrapper_refuses_scales_that_cannot_double():
    weight = torch.zeros(4, 4, dtype=torch.uint8).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale\[0, 1\] = 254 cannot be doubled exactly"):
        dsv4ops.e4m3fn_to_fnuz(weight, torch.tensor([[3, 254]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="cannot be doubled exactly"):
        dsv4ops.e4m3fn_to_fnuz(weight, torch.tensor([[2.0**127]]))
    with pytest.raises(ValueError, match="cannot be doubled exactly"):
        dsv4ops.e4m3fn_to_fnuz(weight, torch.tensor([[float("nan")]]))
    untouched = torch.tensor([[3, 255]], dtype=torch.uint8)
    with pytest.raises(ValueError):
        dsv4ops.e4m3fn_to_fnuz(weight, untouched, inplace=True)
    assert untouched.tolist() == [[3, 255]]


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.zeros(4, dtype=torch.float8_e4m3fnuz), torch.ones(1, dtype=torch.uint8)),
         "weight must have dtype uint8 or float8_e4m3fn, got float8_e4m3fnuz"),
        ((torch.zeros(4, dtype=torch.uint8), torch.ones(1, dtype=torch.float16)),
         "scale must have dtype uint8 or float8_e8m0fnu or float32, got float16"),
        ((torch.zeros(4, 4, dtype=torch.uint8).t(), torch.ones(1, dtype=torch.uint8)), "weight must be contiguous"),
    ],
)
def test_invalid_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.e4m3fn_to_fnuz(*args)
    with pytest.raises(RuntimeError, match=match.replace("e4m3fn_to_fnuz", "e4m3fn_to_fnuz_")):
        torch.ops.dsv4.e4m3fn_to_fnuz_(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    w, s = torch.ops.dsv4.e4m3fn_to_fnuz(torch.empty(0, 128, dtype=torch.float8_e4m3fn, device=device),
                                         torch.empty(0, 1, dtype=torch.uint8, device=device))
    assert w.shape == (0, 128) and s.shape == (0, 1)
    # empty weight, non-empty scale: the scale still doubles
    _, s = torch.ops.dsv4.e4m3fn_to_fnuz(torch.empty(0, dtype=torch.uint8, device=device),
                                         torch.tensor([1.5], device=device))
    assert s.item() == 3.0


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    weight, ue8m0, fp32 = _weight_and_scales(seed=2)
    weight = weight.view(torch.uint8)  # opcheck's schema check cannot compare float8 tensors
    torch.library.opcheck(torch.ops.dsv4.e4m3fn_to_fnuz.default, (weight.to(device), fp32.to(device)))
    torch.library.opcheck(torch.ops.dsv4.e4m3fn_to_fnuz_.default, (weight.clone().to(device), ue8m0.clone().to(device)))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    # Only the op in the graph: Triton on NVIDIA cannot load float8_e4m3fnuz tensors, so any fused
    # follow-up op on the FNUZ weight would fail to compile there for reasons outside dsv4ops.
    def f(weight, scale):
        return torch.ops.dsv4.e4m3fn_to_fnuz(weight, scale * 1)

    weight, _, fp32 = _weight_and_scales(seed=3)
    weight, fp32 = weight.to(device), fp32.to(device)
    (w_compiled, s_compiled), (w_eager, s_eager) = torch.compile(f, fullgraph=True)(weight, fp32), f(weight, fp32)
    assert_bytes_equal(w_compiled, w_eager)
    assert_bits_equal(s_compiled, s_eager)
    assert Fp8Format.FNUZ.torch_dtype == torch.float8_e4m3fnuz
