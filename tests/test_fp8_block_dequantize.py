"""dsv4.fp8_block_dequantize: bit-exact parity with the reference (both encodings, UE8M0 and fp32 scales,
bf16 and fp32 outputs, batched and ragged shapes, aligned and misaligned buffers) on every device."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, reference

from conftest import DEVICES, FORMATS, assert_bits_equal

# (x shape, (block_rows, block_cols)): DSv4 weight blocks, ragged edges, batches, odd sizes that take
# the per-element path.
SHAPES = [
    pytest.param((256, 512), (128, 128), id="256x512-b128"),
    pytest.param((300, 260), (128, 128), id="ragged-300x260-b128"),
    pytest.param((4, 128, 384), (128, 128), id="batched-4x128x384"),
    pytest.param((17, 1024), (1, 128), id="per-token-group-1x128"),
    pytest.param((64, 33), (128, 1), id="odd-cols-128x1"),
    pytest.param((5, 7), (2, 3), id="tiny-5x7-b2x3"),
    # 16-byte rows (the GPU's vector kernel) with several scales a vector, and with a ragged last column block
    pytest.param((64, 48), (16, 8), id="vector-several-scales-64x48-b16x8"),
    pytest.param((128, 384), (128, 256), id="vector-ragged-cols-128x384-b128x256"),
]


def _inputs(shape, block, scale_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
    scale_shape = shape[:-2] + (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    if scale_kind == "ue8m0":
        scale = torch.randint(100, 150, scale_shape, generator=g, dtype=torch.int32).to(torch.uint8)
    else:
        scale = torch.rand(scale_shape, generator=g) * 1e-2
    return x, scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_kind", ["ue8m0", "fp32"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape,block", SHAPES)
def test_matches_reference(device, fmt, scale_kind, out_dtype, shape, block):
    x, scale = _inputs(shape, block, scale_kind)
    out = torch.ops.dsv4.fp8_block_dequantize(x.to(device), scale.to(device), block[0], block[1], int(fmt), out_dtype)
    assert out.dtype == out_dtype and out.shape == x.shape
    assert_bits_equal(out, reference.fp8_block_dequantize(x, scale, block[0], block[1], fmt, out_dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_typed_inputs_and_wrapper_defaults(device, fmt):
    x, scale = _inputs((256, 256), (128, 128), "ue8m0", seed=1)
    expected = reference.fp8_block_dequantize(x, scale, 128, 128, fmt, torch.bfloat16)
    typed = x.view(fmt.torch_dtype).to(device)
    out = dsv4ops.fp8_block_dequantize(typed, scale.view(torch.float8_e8m0fnu).to(device))  # format from dtype
    assert_bits_equal(out, expected)
    # uint8 bytes need the format; the explicit format wins over the dtype
    with pytest.raises(ValueError, match="fp8_format is required"):
        dsv4ops.fp8_block_dequantize(x.to(device), scale.to(device))
    other = Fp8Format.OCP if fmt is Fp8Format.FNUZ else Fp8Format.FNUZ
    out_other = dsv4ops.fp8_block_dequantize(typed, scale.to(device), fp8_format=other)
    assert_bits_equal(out_other, reference.fp8_block_dequantize(x, scale, 128, 128, other, torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_buffers(device):
    base = torch.randint(0, 256, (1 + 64 * 128,), dtype=torch.int32).to(torch.uint8)
    x = base[1:].view(64, 128)  # contiguous, storage offset 1: not 8-byte aligned
    scale = torch.randint(110, 140, (1, 1), dtype=torch.int32).to(torch.uint8)
    out = torch.ops.dsv4.fp8_block_dequantize(x.to(device) if device == "cpu" else base.to(device)[1:].view(64, 128),
                                              scale.to(device), 128, 128, 0, torch.bfloat16)
    assert_bits_equal(out, reference.fp8_block_dequantize(x, scale, 128, 128, 0, torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_special_bytes_and_scales(device, fmt):
    # every FP8 code against scale bytes 0 (2^-127), 1, 127, 200, 254 and 255 (NaN)
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(6, 1)
    scale = torch.tensor([[0], [1], [127], [200], [254], [255]], dtype=torch.uint8)
    for out_dtype in (torch.float32, torch.bfloat16):
        out = torch.ops.dsv4.fp8_block_dequantize(x.to(device), scale.to(device), 1, 256, int(fmt), out_dtype)
        assert_bits_equal(out, reference.fp8_block_dequantize(x, scale, 1, 256, fmt, out_dtype))
    assert torch.isnan(out[5]).all()  # the NaN scale poisons its block


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 256, dtype=torch.uint8, device=device)
    scale = torch.empty(0, 2, dtype=torch.uint8, device=device)
    out = torch.ops.dsv4.fp8_block_dequantize(x, scale, 128, 128, 0, torch.bfloat16)
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16


X = torch.zeros(256, 256, dtype=torch.uint8)
S = torch.zeros(2, 2, dtype=torch.uint8)


@pytest.mark.parametrize(
    "args,match",
    [
        ((X.float(), S, 128, 128, 0, torch.bfloat16), "x must have dtype uint8 or float8_e4m3fn or float8_e4m3fnuz, got float32"),
        ((X, S.int(), 128, 128, 0, torch.bfloat16), "scale must have dtype uint8 or float8_e8m0fnu or float32, got int32"),
        ((X.t(), S, 128, 128, 0, torch.bfloat16), "x must be contiguous"),
        ((X, S.t(), 128, 128, 0, torch.bfloat16), "scale must be contiguous"),
        ((X, S, 128, 128, 5, torch.bfloat16), "fp8_format must be 0"),
        ((X, S, 128, 128, 0, torch.float16), "out_dtype must be bfloat16 or float32, got float16"),
        ((X, S, 0, 128, 0, torch.bfloat16), "block sizes must be positive, got block_rows=0"),
        ((X[0], S[0], 128, 128, 0, torch.bfloat16), r"x must have at least 2 dims \[..., rows, cols\], got shape \[256\]"),
        ((X, S[None], 128, 128, 0, torch.bfloat16), "scale must have as many dims as x"),
        ((X, torch.zeros(2, 3, dtype=torch.uint8), 128, 128, 0, torch.bfloat16),
         r"scale must have shape \[..., ceil\(rows/block_rows\), ceil\(cols/block_cols\)\] = \[..., 2, 2\].*got \[2, 3\]"),
        ((X.view(2, 128, 256), torch.zeros(3, 1, 2, dtype=torch.uint8), 128, 128, 0, torch.bfloat16),
         r"scale dim 0 must equal x dim 0 \(2\)"),
        # a block near 2^63 rows: one scale row (ceil without overflow), not zero (which read past the scale)
        ((X, torch.zeros(0, 2, dtype=torch.uint8), 2**63 - 1, 128, 0, torch.bfloat16),
         r"= \[..., 1, 2\] .*got \[0, 2\]"),
    ],
)
def test_invalid_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.fp8_block_dequantize(*args)


@pytest.mark.gpu
def test_device_mismatch():
    with pytest.raises(RuntimeError, match="x and scale must be on the same device, got cuda:0 and cpu"):
        torch.ops.dsv4.fp8_block_dequantize(X.cuda(), S, 128, 128, 0, torch.bfloat16)


def _without_nan_codes(x):
    # opcheck compares outputs with ==, so keep NaN out of them
    return torch.where(((x & 0x7F) == 0x7F) | (x == 0x80), torch.zeros_like(x), x)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, scale = _inputs((3, 40, 24), (16, 8), "ue8m0")
    x = _without_nan_codes(x)
    torch.library.opcheck(torch.ops.dsv4.fp8_block_dequantize.default,
                          (x.to(device), scale.to(device), 16, 8, 1, torch.bfloat16))
    x, scale = _inputs((40, 24), (16, 8), "fp32")
    x = _without_nan_codes(x)
    torch.library.opcheck(torch.ops.dsv4.fp8_block_dequantize.default,
                          (x.to(device), scale.to(device), 16, 8, 0, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def f(x, scale):
        return torch.ops.dsv4.fp8_block_dequantize(x, scale, 128, 128, 0, torch.float32) * 2  # exact

    x, scale = _inputs((256, 128), (128, 128), "ue8m0")
    x, scale = x.to(device), scale.to(device)
    assert_bits_equal(torch.compile(f, fullgraph=True)(x, scale), f(x, scale))
