"""Benchmark of the fp8_ds_mla cache utilities at DSv4 sizes (SWA cache, block size 64).

    python bench/bench_kv_cache.py [--device cuda] [--out bench/results] [--no-compile]

Bytes counted: for the fused family, Q read and written (bf16 or FP8 out), the KV row, positions, slots,
the stored KV (record 584 B, bf16 row 1024 B or FP8 row 512 B), the cos/sin row, and kv_norm_rope_quant_insert's bf16
norm weight (1024 B once a call); for the plain insert, K rows read (1024
B/token) + slots, records written (584 B/token); for the gather, records read (584 B/token) + bf16
rows written (1024 B/token). Peers in the same run: a device copy of the same number of bytes (the
ceiling at that size, timed like our kernels), the PyTorch reference eager and under torch.compile
(prefill sizes only: compiling it is slow).
"""

from __future__ import annotations

import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as reference

from harness import bench_main, input_sets, make_rows, time_matched_copy, time_ours, time_peer, time_per_call

BLOCK_SIZE = 64
INSERT_TOKENS = [("decode N=1", 1), ("decode N=8", 8), ("decode N=64", 64), ("prefill N=2048", 2048),
                 ("prefill N=8192", 8192)]
GATHER_CASES = [("1 request x 8192 tokens", 1, 8192), ("32 requests x 256 tokens", 32, 256),
                ("16 requests x 8192 tokens", 16, 8192)]


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
        times = time_ours(ours, sets, device)
        times.update(time_matched_copy(nbytes, device))
        times["reference eager"] = time_per_call(
            lambda k, c, s: reference.quantize_and_insert_k_cache(k, c, s, BLOCK_SIZE, fmt, qmax), sets, device)
        if ref_compiled is not None and n >= 2048:
            time_peer(times, "reference compiled", lambda k, c, s: ref_compiled(k, c, s, BLOCK_SIZE, fmt, qmax), sets,
                      device, case)
        rows += make_rows("quantize_and_insert_k_cache", f"{case} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


FUSED_CASES = [("Flash decode N=1 H=64", 1, 64), ("Flash decode N=8 H=64", 8, 64), ("Flash decode N=64 H=64", 64, 64),
               ("Flash prefill N=2048 H=64", 2048, 64), ("Flash prefill N=8192 H=64", 8192, 64),
               ("Pro decode N=8 H=128", 8, 128), ("Pro prefill N=8192 H=128", 8192, 128)]
EPS = 1e-6


def _cos_sin(device, positions=16384):
    inv_freq = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=1).to(device)


PER_CALL_BYTES = {"kv_norm_rope_quant_insert": 1024}  # its bf16 norm weight, read once a call


def _fused_variants(device, fmt, qmax, cos_sin):
    """Per op of the fused family: (bytes per token given H, make(n, h), ours(*set), reference(*set),
    check(*set)). Bytes: Q read (+ written: bf16 2 B or FP8 1 B per dim), the KV row read, positions +
    slots, the stored KV (record 584 B, bf16 row 1024 B, FP8 row 512 B), the cos/sin row."""
    one = torch.ones(1, device=device)

    def common(n, h, blocks_rows):
        q = torch.randn(n, h, 512, device=device).to(torch.bfloat16)
        kv = torch.randn(n, 512, device=device).to(torch.bfloat16)
        slots = torch.randperm(blocks_rows, device=device)[:n]
        positions = torch.randint(0, cos_sin.shape[0], (n,), device=device)
        return q, kv, slots, positions

    def ds_mla_make(n, h):
        blocks = max(2, 2 * n // BLOCK_SIZE)
        q, kv, slots, positions = common(n, h, blocks * BLOCK_SIZE)
        cache = torch.zeros(blocks, BLOCK_SIZE * 584, dtype=torch.uint8, device=device)
        return q, kv, cache, slots, positions, torch.empty_like(q)

    def plain_make(dtype):
        def make(n, h):
            blocks = max(2, 2 * n // BLOCK_SIZE)
            q, kv, slots, positions = common(n, h, blocks * BLOCK_SIZE)
            cache = torch.zeros(blocks, BLOCK_SIZE, 512, dtype=dtype, device=device)
            return q, kv, cache, slots, positions, torch.empty(q.shape, dtype=fmt.torch_dtype, device=device)

        return make

    def kv_norm_make(n, h):
        blocks = max(2, 2 * n // BLOCK_SIZE)
        _, kv, slots, positions = common(n, 0, blocks * BLOCK_SIZE)
        cache = torch.zeros(blocks, BLOCK_SIZE * 584, dtype=torch.uint8, device=device)
        return kv, torch.rand(512, device=device).to(torch.bfloat16), cache, slots, positions

    return {
        "qnorm_rope_kv_insert": (
            lambda h: 2 * h * 1024 + 1024 + 16 + 584 + 256, ds_mla_make,
            lambda q, kv, c, s, p, o: torch.ops.dsv4.qnorm_rope_kv_insert.out(
                q, kv, c, s, p, cos_sin, q.shape[1], EPS, BLOCK_SIZE, True, int(fmt), qmax, q_out=o),
            lambda q, kv, c, s, p, o: reference.qnorm_rope_kv_insert(q, kv, c, s, p, cos_sin, q.shape[1], EPS,
                                                                     BLOCK_SIZE, True, fmt, qmax)),
        "qnorm_rope_kv_insert_full_cache_bf16": (
            lambda h: 2 * h * 1024 + 1024 + 16 + 1024 + 256, plain_make(torch.bfloat16),
            lambda q, kv, c, s, p, o: torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(
                q, kv, c, s, p, cos_sin, EPS, BLOCK_SIZE, True),
            lambda q, kv, c, s, p, o: reference.qnorm_rope_kv_insert_full_cache_bf16(
                q, kv, c, s, p, cos_sin, EPS, BLOCK_SIZE, True)),
        "qnorm_rope_kv_insert_full_cache_fp8": (
            lambda h: h * (1024 + 512) + 1024 + 16 + 512 + 256, plain_make(fmt.torch_dtype),
            lambda q, kv, c, s, p, o: torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(
                q, kv, o, c, s, p, cos_sin, one, one, EPS, BLOCK_SIZE, True, int(fmt), qmax),
            lambda q, kv, c, s, p, o: reference.qnorm_rope_kv_insert_full_cache_fp8(
                q, kv, o, c, s, p, cos_sin, one, one, EPS, BLOCK_SIZE, True, fmt, qmax)),
        "kv_norm_rope_quant_insert": (
            lambda h: 1024 + 16 + 584 + 256, kv_norm_make,
            lambda kv, w, c, s, p: torch.ops.dsv4.kv_norm_rope_quant_insert(kv, w, c, s, p, cos_sin, EPS, BLOCK_SIZE,
                                                                           int(fmt), qmax),
            lambda kv, w, c, s, p: reference.kv_norm_rope_quant_insert(kv, w, c, s, p, cos_sin, EPS, BLOCK_SIZE, fmt,
                                                                       qmax)),
    }


# Which cases each op runs (the full-cache variants and the KV-only op at one decode and one prefill size).
FUSED_OPS = {"qnorm_rope_kv_insert": None,
             "qnorm_rope_kv_insert_full_cache_bf16": ("Flash decode N=1 H=64", "Flash prefill N=8192 H=64"),
             "qnorm_rope_kv_insert_full_cache_fp8": ("Flash decode N=1 H=64", "Flash prefill N=8192 H=64"),
             "kv_norm_rope_quant_insert": ("Flash decode N=1 H=64", "Flash prefill N=8192 H=64")}


def bench_fused_insert(device, ceiling, compile_peers):
    """The fused Q/KV family with no Q padding (as ROCm passes it); the bf16 variant rewrites its Q in place,
    so repeated calls keep rotating it (the time does not depend on the values)."""
    rows = []
    fmt = dsv4ops.fp8_format(device)
    qmax = fmt.default_quant_max
    cos_sin = _cos_sin(device)
    for op, (bytes_per_token, make_set, ours, ref) in _fused_variants(device, fmt, qmax, cos_sin).items():
        ref_compiled = torch.compile(ref, dynamic=False) if compile_peers else None
        for case, n, h in FUSED_CASES:
            if FUSED_OPS[op] is not None and case not in FUSED_OPS[op]:
                continue
            label = case.replace(" H=64", "") if op == "kv_norm_rope_quant_insert" else case
            nbytes = n * bytes_per_token(h) + PER_CALL_BYTES.get(op, 0)
            sets = input_sets(lambda: make_set(n, h), nbytes, device)
            times = time_ours(ours, sets, device)
            times.update(time_matched_copy(nbytes, device))
            times["reference eager"] = time_per_call(ref, sets, device)
            if ref_compiled is not None and n >= 2048:
                time_peer(times, "reference compiled", ref_compiled, sets, device, f"{op} {case}")
            rows += make_rows(op, f"{label} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
            del sets
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
        times = time_ours(ours, sets, device)
        times.update(time_matched_copy(nbytes, device))
        times["reference eager"] = time_per_call(
            lambda o, c, l, t: reference.dequantize_and_gather_k_cache(o, c, l, None, t, BLOCK_SIZE, 0, fmt),  # noqa: E741
            sets, device)
        if ref_compiled is not None:
            time_peer(times, "reference compiled",
                      lambda o, c, l, t: ref_compiled(o, c, l, None, t, BLOCK_SIZE, 0, fmt), sets, device, case)  # noqa: E741
        rows += make_rows("dequantize_and_gather_k_cache", f"{case} {fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


def shrink():
    INSERT_TOKENS[:] = INSERT_TOKENS[:2]
    FUSED_CASES[:] = [("Flash decode N=1 H=64", 1, 64)]
    GATHER_CASES[:] = [("smoke 2 x 128", 2, 128)]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "kv_cache", [bench_fused_insert, bench_insert, bench_gather], shrink,
               ["encoding: the device's own (OCP 448 on NVIDIA); cache block size 64"])
