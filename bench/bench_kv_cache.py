"""Benchmark of the fp8_ds_mla cache utilities at DSv4 sizes (SWA cache, block size 64).

    python bench/bench_kv_cache.py [--device cuda] [--out bench/results] [--no-compile]

Bytes counted: for the fused insert, Q read and written (2 x 1024 B per head and token), the KV row,
positions, slots, the record (584 B) and the cos/sin row; for the plain insert, K rows read (1024
B/token) + slots, records written (584 B/token); for the gather, records read (584 B/token) + bf16
rows written (1024 B/token). Peers in the same run:
the PyTorch reference eager and under torch.compile (prefill sizes only: compiling it is slow).
"""

from __future__ import annotations

import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as reference

from harness import bench_main, input_sets, make_rows, time_peer, time_per_call

BLOCK_SIZE = 64
INSERT_TOKENS = [("decode N=1", 1), ("decode N=8", 8), ("decode N=64", 64), ("prefill N=2048", 2048),
                 ("prefill N=8192", 8192)]
GATHER_CASES = [("1 request x 8192 tokens", 1, 8192), ("32 requests x 256 tokens", 32, 256)]


def bench_insert(device, ceiling, compile_peers):
    rows = []
    fmt = dsv4ops.fp8_format(device)
    qmax = fmt.default_quant_max
    ref_compiled = torch.compile(reference.quantize_and_insert_k_cache, dynamic=False) if compile_peers else None
    for case, n in INSERT_TOKENS:
        blocks = max(2, 2 * n // BLOCK_SIZE)
        nbytes = n * (1024 + 8 + 584)

        def make():
            k = torch.randn(n, 512, device=device).to(torch.bfloat16)
            slots = torch.randperm(blocks * BLOCK_SIZE, device=device)[:n]
            cache = torch.zeros(blocks, BLOCK_SIZE * 584, dtype=torch.uint8, device=device)
            return k, cache, slots

        sets = input_sets(make, nbytes, device)
        ours = lambda k, c, s: torch.ops.dsv4.quantize_and_insert_k_cache(k, c, s, BLOCK_SIZE, int(fmt), qmax)  # noqa: E731
        k, cache, slots = sets[0]
        expected = cache.clone()
        reference.quantize_and_insert_k_cache(k, expected, slots, BLOCK_SIZE, fmt, qmax)
        ours(k, cache, slots)
        assert torch.equal(cache, expected), "dsv4ops disagrees with the reference"
        times = {"dsv4ops": time_per_call(ours, sets, device)}
        times["reference eager"] = time_per_call(
            lambda k, c, s: reference.quantize_and_insert_k_cache(k, c, s, BLOCK_SIZE, fmt, qmax), sets, device)
        if ref_compiled is not None and n >= 2048:
            time_peer(times, "reference compiled", lambda k, c, s: ref_compiled(k, c, s, BLOCK_SIZE, fmt, qmax), sets,
                      device, case)
        rows += make_rows("quantize_and_insert_k_cache", f"{case} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


FUSED_CASES = [("Flash decode N=1 H=64", 1, 64), ("Flash decode N=8 H=64", 8, 64), ("Flash decode N=64 H=64", 64, 64),
               ("Flash prefill N=2048 H=64", 2048, 64), ("Flash prefill N=8192 H=64", 8192, 64),
               ("Pro prefill N=8192 H=128", 8192, 128)]


def bench_fused_insert(device, ceiling, compile_peers):
    """qnorm_rope_kv_insert with q_head_padded = H (ROCm passes no padding)."""
    rows = []
    fmt = dsv4ops.fp8_format(device)
    qmax = fmt.default_quant_max
    inv_freq = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    freqs = torch.outer(torch.arange(16384, dtype=torch.float32), inv_freq)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=1).to(device)
    ref_compiled = torch.compile(reference.qnorm_rope_kv_insert, dynamic=False) if compile_peers else None
    for case, n, h in FUSED_CASES:
        blocks = max(2, 2 * n // BLOCK_SIZE)
        # Q read + Q written (bf16), KV read (bf16), positions + slots, records written; cos/sin rows read.
        nbytes = n * (2 * h * 1024 + 1024 + 16 + 584 + 256)

        def make():
            q = torch.randn(n, h, 512, device=device).to(torch.bfloat16)
            kv = torch.randn(n, 512, device=device).to(torch.bfloat16)
            cache = torch.zeros(blocks, BLOCK_SIZE * 584, dtype=torch.uint8, device=device)
            slots = torch.randperm(blocks * BLOCK_SIZE, device=device)[:n]
            positions = torch.randint(0, 16384, (n,), device=device)
            return q, kv, cache, slots, positions

        sets = input_sets(make, nbytes, device)
        ours = lambda q, kv, c, s, p: torch.ops.dsv4.qnorm_rope_kv_insert(  # noqa: E731
            q, kv, c, s, p, cos_sin, h, 1e-6, BLOCK_SIZE, True, int(fmt), qmax)
        times = {"dsv4ops": time_per_call(ours, sets, device)}
        times["reference eager"] = time_per_call(
            lambda q, kv, c, s, p: reference.qnorm_rope_kv_insert(q, kv, c, s, p, cos_sin, h, 1e-6, BLOCK_SIZE, True,
                                                                  fmt, qmax), sets, device)
        if ref_compiled is not None and n >= 2048:
            time_peer(times, "reference compiled",
                      lambda q, kv, c, s, p: ref_compiled(q, kv, c, s, p, cos_sin, h, 1e-6, BLOCK_SIZE, True, fmt, qmax),
                      sets, device, case)
        rows += make_rows("qnorm_rope_kv_insert", f"{case} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


def bench_gather(device, ceiling, compile_peers):
    rows = []
    fmt = dsv4ops.fp8_format(device)
    ref_compiled = torch.compile(reference.dequantize_and_gather_k_cache, dynamic=False) if compile_peers else None
    for case, requests, tokens in GATHER_CASES:
        per_request_blocks = tokens // BLOCK_SIZE
        blocks = requests * per_request_blocks
        nbytes = requests * tokens * (584 + 1024)

        def make():
            cache = torch.randint(0, 256, (blocks, BLOCK_SIZE * 584), dtype=torch.uint8, device=device)
            table = torch.randperm(blocks, device=device).to(torch.int32).view(requests, per_request_blocks)
            lens = torch.full((requests,), tokens, dtype=torch.int32, device=device)
            out = torch.empty(requests, tokens, 512, dtype=torch.bfloat16, device=device)
            return out, cache, lens, table

        sets = input_sets(make, nbytes, device)
        ours = lambda o, c, l, t: torch.ops.dsv4.dequantize_and_gather_k_cache(o, c, l, None, t, BLOCK_SIZE, 0, int(fmt))  # noqa: E731,E741
        out, cache, lens, table = sets[0]
        expected = out.clone()
        reference.dequantize_and_gather_k_cache(expected, cache, lens, None, table, BLOCK_SIZE, 0, fmt)
        ours(out, cache, lens, table)
        torch.testing.assert_close(out, expected, atol=0, rtol=0, equal_nan=True)  # NaN payloads may differ
        times = {"dsv4ops": time_per_call(ours, sets, device)}
        times["reference eager"] = time_per_call(
            lambda o, c, l, t: reference.dequantize_and_gather_k_cache(o, c, l, None, t, BLOCK_SIZE, 0, fmt),  # noqa: E741
            sets, device)
        if ref_compiled is not None and requests == 1:
            time_peer(times, "reference compiled",
                      lambda o, c, l, t: ref_compiled(o, c, l, None, t, BLOCK_SIZE, 0, fmt), sets, device, case)  # noqa: E741
        rows += make_rows("dequantize_and_gather_k_cache", f"{case} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


def shrink():
    INSERT_TOKENS[:] = INSERT_TOKENS[:2]
    FUSED_CASES[:] = [("smoke N=4 H=8", 4, 8)]
    GATHER_CASES[:] = [("smoke 2 x 128", 2, 128)]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "kv_cache", [bench_fused_insert, bench_insert, bench_gather], shrink,
               ["encoding: the device's own (OCP 448 on NVIDIA); cache block size 64"])
