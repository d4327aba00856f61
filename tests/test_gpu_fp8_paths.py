"""GPU-only checks: the hardware FP8 conversion gives the software path's bytes on every fp32 input, and
every op works under CUDA-graph capture on a side stream with replay on fresh data."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format

from conftest import FORMATS, assert_bits_equal, assert_bytes_equal, capture_graph

pytestmark = pytest.mark.gpu

CHUNK = 1 << 28


@pytest.mark.parametrize("fmt", FORMATS)
def test_hardware_encode_equals_software_on_all_fp32_patterns(fmt):
    """GPU kernel (conversion instruction where the chip has one: OCP on sm_89+) against the CPU kernel
    (always the software encoder), on all 2^32 fp32 bit patterns."""
    hardware = dsv4ops.build_info()["fp8_encodings"]
    print(f"hardware encodings per arch: {hardware}")
    mismatches, examples = 0, []
    for start in range(0, 1 << 32, CHUNK):
        bits = torch.arange(start, start + CHUNK, dtype=torch.int64, device="cuda").to(torch.int32)
        x = bits.view(torch.float32)
        gpu = torch.ops.dsv4.fp8_encode(x, int(fmt), fmt.max_finite).view(torch.uint8).cpu()
        cpu = torch.ops.dsv4.fp8_encode(x.cpu(), int(fmt), fmt.max_finite).view(torch.uint8)
        differ = (gpu != cpu).nonzero().flatten()
        mismatches += differ.numel()
        for i in differ[: max(0, 8 - len(examples))].tolist():
            examples.append(f"bits 0x{(start + i) & 0xFFFFFFFF:08x} ({x[i].item()!r}): gpu 0x{int(gpu[i]):02x}, "
                            f"software 0x{int(cpu[i]):02x}")
    assert mismatches == 0, f"{mismatches} mismatches; first: " + "; ".join(examples)


def test_hardware_encode_equals_torch_cast_in_range():
    x = torch.randn(1 << 24, device="cuda") * 100
    x = x[x.abs() <= 448]
    assert_bytes_equal(torch.ops.dsv4.fp8_encode(x, 0, 448.0), x.to(torch.float8_e4m3fn))
    y = x[x.abs() <= 240]
    assert_bytes_equal(torch.ops.dsv4.fp8_encode(y, 1, 240.0), y.to(torch.float8_e4m3fnuz))


def test_graph_capture_and_replay_all_ops():
    torch.manual_seed(0)
    x = torch.randn(4096, 512, device="cuda")
    codes = torch.randint(0, 256, (256, 512), dtype=torch.int32, device="cuda").to(torch.uint8)
    scale = torch.randint(100, 150, (2, 4), dtype=torch.int32, device="cuda").to(torch.uint8)
    scale_f = torch.pow(2.0, torch.randint(-20, 20, (2, 4), device="cuda").float())
    weight = codes.clone()
    weight_scale = scale.clone()

    def run():
        return (
            torch.ops.dsv4.fp8_encode(x, 0, 448.0),
            torch.ops.dsv4.fp8_encode(x, 1, 224.0),
            torch.ops.dsv4.ue8m0_to_float(scale),
            torch.ops.dsv4.float_to_ue8m0_lossless(scale_f),
            torch.ops.dsv4.fp8_block_dequantize(codes, scale, 128, 128, 0, torch.bfloat16),
            torch.ops.dsv4.e4m3fn_to_fnuz(codes, scale_f),
            torch.ops.dsv4.e4m3fn_to_fnuz_(weight, weight_scale),
        )

    graph, outputs = capture_graph(run)
    for trial in range(2):  # fresh data into the captured buffers, replay, compare with eager
        x.copy_(torch.randn_like(x) * (trial + 1))
        codes.copy_(torch.randint(0, 256, codes.shape, dtype=torch.int32, device="cuda").to(torch.uint8))
        scale.copy_(torch.randint(100, 150, scale.shape, dtype=torch.int32, device="cuda").to(torch.uint8))
        scale_f.copy_(torch.pow(2.0, torch.randint(-20, 20, scale_f.shape, device="cuda").float()))
        weight.copy_(codes)
        weight_scale.copy_(scale)
        graph.replay()
        torch.cuda.synchronize()
        captured_weight, captured_scale = weight.clone(), weight_scale.clone()
        weight.copy_(codes)
        weight_scale.copy_(scale)
        expected = run()
        for got, want in zip(outputs[:6], expected[:6]):
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            for g, w in zip(got, want):
                if g.element_size() == 1:
                    assert_bytes_equal(g, w)
                else:
                    assert_bits_equal(g, w)
        assert_bytes_equal(captured_weight, weight)
        assert_bytes_equal(captured_scale, weight_scale)


def test_current_stream():
    """Ops launch on the current stream: with the default stream held up by a long kernel, an op called on
    a side stream finishes and its output reads back on that stream (a launch on the default stream would
    still be queued behind the sleep, and the read-back would see unwritten memory)."""
    stream = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    stream.wait_stream(torch.cuda.current_stream())  # x is ready for the side stream
    torch.cuda._sleep(int(2e9))  # about a second of the default stream
    with torch.cuda.stream(stream):
        out = torch.ops.dsv4.fp8_encode(x, 0, 448.0)
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
    stream.synchronize()
    got = host.clone()
    torch.cuda.synchronize()
    assert_bytes_equal(got, x.cpu().clamp(-448, 448).to(torch.float8_e4m3fn))


def test_second_device():
    """Ops launch on the tensor's device, not device 0."""
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the second-device launch needs two")
    y = torch.randn(1000, device="cuda:1")
    assert_bytes_equal(torch.ops.dsv4.fp8_encode(y, 0, 448.0), y.to(torch.float8_e4m3fn))


def test_wrappers_pick_kernel_on_gpu():
    decision = dsv4ops.explain("fp8_block_dequantize", "cuda")
    assert decision.uses_kernel, decision.trail
    assert dsv4ops.fp8_format("cuda") is Fp8Format.OCP  # NVIDIA


@pytest.mark.gpu
def test_calls_past_one_gpu_grid_are_refused_with_a_message():
    """Row counts whose grid would exceed 2^32 - 1 threads along x (ROCm's limit), from stride-0 views that take no
    memory: each op refuses them before launching (the CPU kernels have no such bound)."""
    dev = "cuda"
    tokens = 2**24  # one past the mHC / sparse MLA bound
    residual = torch.zeros(1, 4, 64, dtype=torch.bfloat16, device=dev).expand(tokens, 4, 64)
    fn, scale, base = torch.zeros(24, 256, device=dev), torch.zeros(3, device=dev), torch.zeros(24, device=dev)
    with pytest.raises(RuntimeError, match="at most 16777215 tokens on a GPU"):
        torch.ops.dsv4.mhc_pre(residual, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 20, None, 1e-6)
    rows = 2**23  # one past the top-k bound (512 threads a row)
    logits = torch.zeros(1, 8, device=dev).expand(rows, 8)
    lens = torch.zeros(rows, dtype=torch.int32, device=dev)  # (must be contiguous: 32 MB)
    out = torch.empty(rows, 1, dtype=torch.int32, device=dev)
    with pytest.raises(RuntimeError, match="at most 8388607 rows on a GPU"):
        torch.ops.dsv4.topk_per_row_decode(logits, lens, 1, False, out=out)
    w = torch.zeros(65536, 128, 128, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)  # 1 GiB: G past grid z
    x = torch.zeros(1, 1, 128, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn).expand(1, 65536, 128)
    xs = torch.zeros(1, 1, 1, dtype=torch.uint8, device=dev).expand(1, 65536, 1)
    ws = torch.zeros(65536, 1, 1, dtype=torch.uint8, device=dev)
    with pytest.raises(RuntimeError, match="at most 65535 groups"):
        torch.ops.dsv4.bmm_a8w8_mxscale(x, w, xs, ws, torch.bfloat16)
