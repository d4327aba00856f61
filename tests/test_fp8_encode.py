"""dsv4.fp8_encode: byte parity with the reference and with torch's float8 casts, both encodings, on
every device; edges; quant max 224/240/448; invalid inputs; opcheck; torch.compile; empty input."""

import math

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, reference

from conftest import DEVICES, FORMATS, assert_bytes_equal, edge_values

QUANT_MAXES = {Fp8Format.OCP: [448.0, 300.0], Fp8Format.FNUZ: [224.0, 240.0, 100.0]}


def _random_inputs(n=200000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([
        torch.randn(n, generator=g) * 100,
        torch.randn(n, generator=g) * 1e-2,
        torch.randn(n // 10, generator=g) * 1e-4,
        (torch.rand(n // 10, generator=g) - 0.5) * 2000,
    ])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference(device, fmt):
    x = torch.cat([_random_inputs(), edge_values(fmt)])
    for qmax in QUANT_MAXES[fmt]:
        out = torch.ops.dsv4.fp8_encode(x.to(device), int(fmt), qmax)
        assert out.dtype == fmt.torch_dtype and out.device.type == device
        assert_bytes_equal(out, reference.fp8_encode(x, fmt, qmax))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_torch_cast_on_in_range_values(device, fmt):
    x = _random_inputs(seed=1)
    x = x[x.abs() <= fmt.max_finite]
    out = torch.ops.dsv4.fp8_encode(x.to(device), int(fmt), fmt.max_finite)
    assert_bytes_equal(out, x.to(fmt.torch_dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_edges(device, fmt):
    qmax = fmt.default_quant_max
    cases = {  # value -> decoded result
        float("nan"): float("nan"),
        float("inf"): qmax,
        float("-inf"): -qmax,
        1e30: qmax,
        qmax: qmax,
        -qmax: -qmax,
        0.0: 0.0,
    }
    x = torch.tensor(list(cases), dtype=torch.float32, device=device)
    decoded = torch.ops.dsv4.fp8_encode(x, int(fmt), qmax).float().cpu()
    torch.testing.assert_close(decoded, torch.tensor(list(cases.values())), equal_nan=True, atol=0, rtol=0)
    negative_zero = torch.ops.dsv4.fp8_encode(torch.tensor([-0.0, -1e-30], device=device), int(fmt), qmax)
    expected = 0x80 if fmt is Fp8Format.OCP else 0x00
    assert negative_zero.view(torch.uint8).tolist() == [expected, expected]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bfloat16_input(device, fmt):
    x = _random_inputs(seed=2).to(torch.bfloat16)
    out = torch.ops.dsv4.fp8_encode(x.to(device), int(fmt), fmt.default_quant_max)
    assert_bytes_equal(out, reference.fp8_encode(x.float(), fmt, fmt.default_quant_max))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_shapes(device):
    empty = torch.empty(0, 7, device=device)
    out = torch.ops.dsv4.fp8_encode(empty, 0, 448.0)
    assert out.shape == (0, 7) and out.dtype == torch.float8_e4m3fn
    x = torch.randn(3, 5, 7, device=device)
    assert torch.ops.dsv4.fp8_encode(x, 1, 224.0).shape == (3, 5, 7)


def test_wrapper_defaults_follow_device_and_format():
    x = torch.tensor([1000.0, 1.0])
    assert dsv4ops.fp8_encode(x).dtype == torch.float8_e4m3fn  # CPU defaults to OCP, 448
    assert dsv4ops.fp8_encode(x).float().tolist() == [448.0, 1.0]
    fnuz = dsv4ops.fp8_encode(x, "fnuz")
    assert fnuz.dtype == torch.float8_e4m3fnuz and fnuz.float().tolist() == [224.0, 1.0]
    assert dsv4ops.fp8_encode(x, Fp8Format.FNUZ, quant_max=240).float().tolist() == [240.0, 1.0]
    # float16 input is not a kernel dtype: served by the reference, with the reason counted
    half = dsv4ops.fp8_encode(x.half())
    assert half.float().tolist() == [448.0, 1.0]
    assert any(op == "fp8_encode" for op, _ in dsv4ops.fallback_counts())


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.zeros(4, dtype=torch.float16), 0, 448.0), "x must have dtype float32 or bfloat16, got float16"),
        ((torch.zeros(4, 4).t(), 0, 448.0), "x must be contiguous"),
        ((torch.zeros(4), 2, 448.0), "fp8_format must be 0 .OCP e4m3fn. or 1 .FNUZ e4m3fnuz., got 2"),
        ((torch.zeros(4), 1, 448.0), r"quant_max must be in \(0, 240\]"),
        ((torch.zeros(4), 0, 0.0), r"quant_max must be in \(0, 448\]"),
        ((torch.zeros(4), 0, float("nan")), "quant_max"),
        ((torch.zeros(4), 0, 1e-50), r"quant_max must be in \(0, 448\] for this encoding \(and positive in fp32\)"),
    ],
)
def test_invalid_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.fp8_encode(*args)


def test_wrapper_rejects_bad_quant_max():
    with pytest.raises(ValueError, match="quant_max must be in"):
        dsv4ops.fp8_encode(torch.zeros(2), "fnuz", quant_max=448)
    for rounds_to_fp32_zero in (1e-50, 2.0**-150):  # 2^-150: halfway to the smallest subnormal, ties to zero
        with pytest.raises(ValueError, match=r"positive in fp32"):
            dsv4ops.fp8_encode(torch.zeros(2), "ocp", quant_max=rounds_to_fp32_zero)
    smallest = math.nextafter(2.0**-150, 1.0)  # rounds up to 2^-149, the smallest fp32 subnormal
    assert torch.equal(dsv4ops.fp8_encode(torch.tensor([1.0, -1.0]), "ocp", quant_max=smallest).view(torch.uint8),
                       torch.tensor([0x00, 0x80], dtype=torch.uint8))  # clamped to +-2^-149: +-0


def test_wrapper_compiles_with_a_symbolic_quant_max():
    """With dynamic=True a float argument is symbolic: the quant_max check must be a comparison Dynamo can trace
    (a struct round trip failed there)."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, q: dsv4ops.fp8_encode(x, "ocp", quant_max=q), fullgraph=True, dynamic=True)
    x = torch.randn(64, 32) * 300
    for q in (448.0, 100.0):
        assert_bytes_equal(compiled(x, q), dsv4ops.fp8_encode(x, "ocp", quant_max=q))
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(33, 5, device=device) * 50
    torch.library.opcheck(torch.ops.dsv4.fp8_encode.default, (x, 0, 448.0))
    torch.library.opcheck(torch.ops.dsv4.fp8_encode.default, (x.bfloat16(), 1, 224.0))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def f(x):
        return torch.ops.dsv4.fp8_encode(x * 2, 1, 224.0)

    x = torch.randn(64, 32, device=device)
    assert_bytes_equal(torch.compile(f, fullgraph=True)(x), f(x))
