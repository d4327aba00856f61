"""Benchmark of the fp8_ds_mla cache utilities at DSv4 sizes (SWA cache, block size 64).

    python bench/bench_kv_cache.py [--device cuda] [--out bench/results] [--no-compile]

Bytes counted: K rows read (1024 B/token) + slots, records written (584 B/token) for the insert;
records read (584 B/token) + bf16 rows written (1024 B/token) for the gather. Peers in the same run:
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
    GATHER_CASES[:] = [("smoke 2 x 128", 2, 128)]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "kv_cache", [bench_insert, bench_gather], shrink,
               ["encoding: the device's own (OCP 448 on NVIDIA); cache block size 64"])
