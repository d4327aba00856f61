"""Benchmark of wo_a's grouped FP8 GEMM (bmm_a8w8_mxscale) at DSv4 shapes: G groups, N = 1024, K = 4096.

    python bench/bench_wo_a.py [--device cuda] [--out bench/results] [--no-compile]

Rows per case: dsv4ops (only where this build registers a kernel for the device; otherwise the header
says so and the peers are still timed), cuBLAS block-scaled FP8 (torch._scaled_mm with 1x128 / 128x128
scales, one call per group; CUDA only, and cuBLAS refuses M = 1), cuBLAS BF16 bmm on the dequantized
weight, and the PyTorch reference (small M only: it dequantizes in fp64). Bytes counted: the FP8
activation and weight with their scales read once, the bf16 output written once; FLOPs 2*M*G*N*K.
"""

from __future__ import annotations

import torch

from dsv4ops import dispatch
from dsv4ops.reference import wo_a as reference

from harness import HEADER_NOTES, bench_main, input_sets, make_rows, time_ours, time_peer

N, K = 1024, 4096
GROUPS = [1, 2, 8, 16]
TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
REFERENCE_MAX_M = 64


def _operands(device, m, g):
    x = (torch.randn(m, g, K, device=device) * 4).to(torch.float8_e4m3fn)
    x_scale = torch.randint(118, 122, (m, g, K // 128), dtype=torch.uint8, device=device)
    return x, x_scale


def _weight(device, g):
    w = (torch.randn(g, N, K, device=device) * 4).to(torch.float8_e4m3fn)
    w_scale = torch.randint(118, 122, (g, N // 128, K // 128), dtype=torch.uint8, device=device)
    return w, w_scale


def _scale_float(scale_bytes):
    return torch.pow(2.0, scale_bytes.float() - 127)


def bench_bmm(device, ceiling, compile_peers):
    rows = []
    has_kernel = not dispatch.decide("bmm_a8w8_mxscale", device).reason
    if not has_kernel:
        HEADER_NOTES.append(f"no bmm_a8w8_mxscale kernel for {device} in this build: only the peers are timed")
    for g in GROUPS:
        w, w_scale = _weight(device, g)
        w_bf16 = (w.float() * _scale_float(w_scale).repeat_interleave(128, 1).repeat_interleave(128, 2)).to(
            torch.bfloat16)
        w_scale_float = _scale_float(w_scale)
        for m in TOKENS:
            nbytes = m * g * K + g * N * K + m * g * (K // 128) + g * (N // 128) * (K // 128) + m * g * N * 2
            sets = input_sets(lambda: _operands(device, m, g), nbytes, device)
            times = {}
            if has_kernel:
                times.update(time_ours(lambda x, s: torch.ops.dsv4.bmm_a8w8_mxscale(x, w, s, w_scale, torch.bfloat16),
                                       sets, device))
            if device.type == "cuda":
                def cublas_fp8(x, s):
                    sx = _scale_float(s)
                    return [torch._scaled_mm(x[:, i], w[i].t(), scale_a=sx[:, i].t().contiguous().t(),
                                             scale_b=w_scale_float[i].t(), out_dtype=torch.bfloat16)
                            for i in range(g)]

                time_peer(times, "cuBLAS block-scaled FP8 (per group)", cublas_fp8, sets, device, f"G={g} M={m}")
                time_peer(times, "cuBLAS BF16 bmm",
                          lambda x, s: torch.bmm(x.to(torch.bfloat16).transpose(0, 1), w_bf16.transpose(1, 2)), sets,
                          device, f"G={g} M={m}")
            if m <= REFERENCE_MAX_M:
                time_peer(times, "reference eager",
                          lambda x, s: reference.bmm_a8w8_mxscale(x, w, s, w_scale, torch.bfloat16), sets, device)
            case = f"G={g} M={m} N={N} K={K} ({2 * m * g * N * K / 1e9:.2f} GFLOP)"
            rows += make_rows("bmm_a8w8_mxscale", case, nbytes, times, "dsv4ops", ceiling)
            del sets
    return rows


def shrink():
    GROUPS[:] = [2]
    TOKENS[:] = [1, 3]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "wo_a", [bench_bmm], shrink,
               ["operands OCP e4m3fn with UE8M0 scales; bf16 output"])
