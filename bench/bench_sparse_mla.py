"""Benchmark of sparse MLA decode at DSv4 shapes (spec/sparse_mla_decode.md §5; the targets below).

    python bench/bench_sparse_mla.py [--device cuda] [--out bench/results] [--no-compile]

Cases: Flash (H = 64, and 16 / 8 per rank at TP4 / TP8) and Pro (H = 128, and 16 per rank at TP8), batch T in
{1, 8, 32, 128}; C4A rows
(window 128 + top-k 512 Flash / 1024 Pro compressed entries) and C128A rows (window 128 + all entries at
8k / 32k / 128k context). Per call, from the work itself: n = keys per row, bytes = 584 per key + q and
out (bf16), FLOPs = 4 * H * 512 * n per row (QK and PV). The roofline time max(bytes / copy bandwidth,
FLOPs / BF16 matrix rate) uses both ceilings measured in this run (device copy; a BF16 GEMM). Our row
appears where the build registers a kernel for the device (graph replay and back-to-back calls, automatic
split count); the PyTorch reference, eager and under torch.compile, is timed at T <= 8. The "roofline
bound" row is that time itself, so our rows' speedup column over it reads as the fraction of the roofline
reached (issue targets: >= 0.5 for T >= 32; T = 1 under 20 us). Each row is its own request, with its own
window and compressed entries (distinct slots), and the input sets rotate over 4x the L2, so that keys come
from memory as in a model.
"""

from __future__ import annotations

import torch

import dsv4ops
from dsv4ops import dispatch
from dsv4ops.reference import sparse_mla as reference

from harness import HEADER_NOTES, bench_main, input_sets, make_rows, time_ours, time_peer, time_per_call

WINDOW = 128
SCALE = 512 ** -0.5
HEADS = [("Flash TP1", 64), ("Flash TP4", 16), ("Flash TP8", 8), ("Pro TP8", 16), ("Pro TP1", 128)]
TOKENS = [1, 8, 32, 128]
LAYERS = [("C4A", 4, {"Flash": 512, "Pro": 1024}), ("C128A 8k", 128, 8192), ("C128A 32k", 128, 32768),
          ("C128A 128k", 128, 131072)]
REFERENCE_MAX_T = 8
BLOCK = 64


def bf16_matrix_rate(device) -> float:
    """FLOP/s of a large BF16 GEMM, the matrix-unit ceiling of this run."""
    size = 8192 if device.type == "cuda" else 512
    a = torch.randn(size, size, device=device).to(torch.bfloat16)
    b = torch.randn(size, size, device=device).to(torch.bfloat16)
    seconds = time_per_call(lambda: a @ b, [()], device, repeats=5, min_calls=3)
    return 2 * size**3 / seconds


def _cache(device, entries):
    blocks = -(-entries // BLOCK) + 1
    cache = torch.zeros(blocks, BLOCK * 584, dtype=torch.uint8, device=device)
    k = torch.randn(entries, 512, device=device).to(torch.bfloat16)
    dsv4ops.quantize_and_insert_k_cache(k, cache, torch.arange(entries, device=device), BLOCK, "ocp")
    return cache


def _decode_inputs(device, t, heads, compressed, topk):
    """One call's inputs: T rows, one request each, each with its own SWA window (WINDOW entries of the main
    cache) and its own compressed entries (`compressed` of the extra cache), of which it reads `topk`
    distinct ones (C4A) or all (C128A)."""
    main_cache = _cache(device, t * WINDOW)
    extra_cache = _cache(device, t * compressed)
    main_idx = torch.arange(t * WINDOW, dtype=torch.int32, device=device)
    main_ptr = torch.arange(t + 1, dtype=torch.int32, device=device) * WINDOW
    per_row = topk if topk else compressed
    if topk:
        picks = torch.rand(t, compressed, device=device).argsort(dim=1)[:, :per_row]
        extra_idx = (picks + torch.arange(t, device=device)[:, None] * compressed).to(torch.int32).reshape(-1)
    else:
        extra_idx = torch.arange(t * compressed, dtype=torch.int32, device=device)
    extra_ptr = torch.arange(t + 1, dtype=torch.int32, device=device) * per_row
    q = torch.randn(t, heads, 512, device=device).to(torch.bfloat16)
    sink = torch.randn(heads, device=device)
    return (q, main_cache, main_idx, main_ptr, BLOCK, extra_cache, extra_idx, extra_ptr, BLOCK, sink, SCALE, 0, 0,
            0, None, None, torch.empty_like(q))


def bench_decode(device, ceiling_gbps, compile_peers):
    rows = []
    matrix_rate = bf16_matrix_rate(device)
    HEADER_NOTES.append(f"matrix ceiling: BF16 GEMM {matrix_rate / 1e12:.1f} TFLOP/s (measured in this run); "
                        f"roofline = max(bytes / copy bandwidth, FLOPs / matrix ceiling)")
    has_kernel = not dispatch.decide("sparse_mla_decode", device).reason
    if not has_kernel:
        HEADER_NOTES.append(f"no sparse_mla_decode kernel for {device} in this build: reference rows only")
    reference_compiled = torch.compile(reference.sparse_mla_decode, dynamic=False) if compile_peers else None
    for layer, ratio, extent in LAYERS:
        for model, heads in HEADS:
            family = model.split()[0]
            topk = extent[family] if isinstance(extent, dict) else None
            compressed = topk * 4 if topk else extent // ratio
            for t in TOKENS:
                keys = WINDOW + (topk if topk else compressed)
                nbytes = t * ((584 + 4) * keys + 2 * 2 * heads * 512)  # records and int32 indices; q and out
                flops = t * 4 * heads * 512 * keys
                roofline = max(nbytes / (ceiling_gbps * 1e9), flops / matrix_rate)
                sets = input_sets(lambda: _decode_inputs(device, t, heads, compressed, topk), nbytes, device)
                times = {"roofline bound": roofline}
                if has_kernel:
                    times.update(time_ours(lambda *a: torch.ops.dsv4.sparse_mla_decode(*a[:16], out=a[16]), sets,
                                           device))
                if t <= REFERENCE_MAX_T:
                    time_peer(times, "reference eager",
                              lambda *a: reference.sparse_mla_decode(*a[:12], a[12], None, None), sets, device)
                    if reference_compiled is not None:
                        time_peer(times, "reference compiled",
                                  lambda *a: reference_compiled(*a[:12], a[12], None, None), sets, device,
                                  f"{layer} {model} T={t}")
                case = (f"{layer} {model} H={heads} T={t} keys/row={keys} roofline {roofline * 1e6:.1f} us "
                        f"({flops / 1e9:.2f} GFLOP)")
                rows += make_rows("sparse_mla_decode", case, nbytes, times, "dsv4ops", ceiling_gbps)
                del sets
    return rows


def shrink():
    HEADS[:] = [("Flash TP8", 8)]
    TOKENS[:] = [1, 2]
    LAYERS[:] = [("C4A", 4, {"Flash": 32, "Pro": 64})]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "sparse_mla", [bench_decode], shrink,
               ["caches OCP, block size 64; window 128; sink on"])
