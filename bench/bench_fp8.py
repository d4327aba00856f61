"""Benchmark of the FP8/UE8M0 conversion ops at DSv4 sizes.

    python bench/bench_fp8.py [--device cuda] [--out bench/results]

Peers measured in the same run: the PyTorch reference (eager), the reference under torch.compile, and
for fp8_encode torch's own clamp + float8 cast. Bytes counted: every input read once, every output
written once.
"""

from __future__ import annotations

import torch

import dsv4ops
from dsv4ops import Fp8Format, reference

from harness import bench_main, input_sets, make_rows, time_ours, time_peer, time_per_call

# DSv4 weights stored as 128x128-block FP8: wo_a (Flash: 8 groups x 1024 rows, K = 4096; Pro: 16 groups),
# and square hidden-size projections (Flash hidden 4096, Pro 7168).
DEQUANT_CASES = [
    ("wo_a Flash [8192,4096]", (8192, 4096)),
    ("wo_a Pro [16384,4096]", (16384, 4096)),
    ("hidden Pro [7168,7168]", (7168, 7168)),
]
# Activations [tokens, hidden] quantized per element: decode (16 tokens) and prefill (8192 tokens).
ENCODE_CASES = [
    ("decode T=16 x 7168", (16, 7168)),
    ("prefill T=8192 x 4096", (8192, 4096)),
    ("prefill T=8192 x 7168", (8192, 7168)),
]
E4M3FN_TO_FNUZ_SHAPE = (16384, 4096)  # wo_a Pro


def bench_dequantize(device, ceiling, compile_peers):
    rows = []
    ref_compiled = torch.compile(reference.fp8_block_dequantize, dynamic=False) if compile_peers else None
    for case, (r, c) in DEQUANT_CASES:
        nbytes = r * c + (r // 128) * (c // 128) + 2 * r * c

        def make():
            x = torch.randint(0, 256, (r, c), dtype=torch.uint8, device=device)
            x = torch.where((x & 0x7F) == 0x7F, torch.zeros_like(x), x)
            s = torch.randint(110, 140, (r // 128, c // 128), dtype=torch.uint8, device=device)
            return x, s

        sets = input_sets(make, nbytes, device)
        ours = lambda x, s: torch.ops.dsv4.fp8_block_dequantize(x, s, 128, 128, 0, torch.bfloat16)  # noqa: E731
        expected = reference.fp8_block_dequantize(*sets[0], 128, 128, Fp8Format.OCP, torch.bfloat16)
        assert torch.equal(ours(*sets[0]), expected), "dsv4ops disagrees with the reference"
        times = time_ours(ours, sets, device)
        times["reference eager"] = time_per_call(
            lambda x, s: reference.fp8_block_dequantize(x, s, 128, 128, Fp8Format.OCP, torch.bfloat16), sets, device)
        if ref_compiled is not None:
            time_peer(times, "reference compiled",
                      lambda x, s: ref_compiled(x, s, 128, 128, Fp8Format.OCP, torch.bfloat16), sets, device, case)
        rows += make_rows("fp8_block_dequantize", case + " ue8m0->bf16", nbytes, times, "dsv4ops", ceiling)
    return rows


def bench_encode(device, ceiling, compile_peers):
    rows = []
    ref_compiled = torch.compile(reference.fp8_encode, dynamic=False) if compile_peers else None
    for fmt in (Fp8Format.OCP, Fp8Format.FNUZ):
        qmax = fmt.default_quant_max
        for case, (t, h) in ENCODE_CASES:
            nbytes = 2 * t * h + t * h
            sets = input_sets(lambda: (torch.randn(t, h, device=device, dtype=torch.bfloat16) * 100,), nbytes, device)
            ours = lambda x: torch.ops.dsv4.fp8_encode(x, int(fmt), qmax)  # noqa: E731
            got = ours(*sets[0]).view(torch.uint8)
            want = reference.fp8_encode(sets[0][0].float(), fmt, qmax).view(torch.uint8)
            differ = (got != want).nonzero()
            assert differ.numel() == 0, (
                f"dsv4ops disagrees with the reference at {differ.shape[0]} places, e.g. input "
                f"{sets[0][0][tuple(differ[0])].item()!r}: {int(got[tuple(differ[0])])} vs {int(want[tuple(differ[0])])}")
            times = time_ours(ours, sets, device)
            times["torch clamp+cast"] = time_per_call(lambda x: x.clamp(-qmax, qmax).to(fmt.torch_dtype), sets, device)
            times["reference eager"] = time_per_call(lambda x: reference.fp8_encode(x, fmt, qmax), sets, device)
            if ref_compiled is not None:
                time_peer(times, "reference compiled", lambda x: ref_compiled(x, fmt, qmax), sets, device,
                          f"{case} {fmt.name}")
            rows += make_rows("fp8_encode", f"{case} bf16->{fmt.name}", nbytes, times, "dsv4ops", ceiling)
    return rows


def bench_e4m3fn_to_fnuz(device, ceiling, compile_peers):
    rows = []
    ref_compiled = torch.compile(reference.e4m3fn_to_fnuz, dynamic=False) if compile_peers else None
    r, c = E4M3FN_TO_FNUZ_SHAPE
    nbytes = 2 * r * c + 2 * (r // 128) * (c // 128)
    sets = input_sets(lambda: (torch.randint(0, 256, (r, c), dtype=torch.uint8, device=device),
                               torch.randint(0, 250, (r // 128, c // 128), dtype=torch.uint8, device=device)),
                      nbytes, device)
    times = time_ours(lambda w, s: torch.ops.dsv4.e4m3fn_to_fnuz(w, s), sets, device)
    times["reference eager"] = time_per_call(reference.e4m3fn_to_fnuz, sets, device)
    if ref_compiled is not None:
        time_peer(times, "reference compiled", ref_compiled, sets, device, "e4m3fn_to_fnuz")
    return make_rows("e4m3fn_to_fnuz", f"[{r},{c}] + ue8m0", nbytes, times, "dsv4ops", ceiling)


def shrink():
    small = lambda cases: [(f"smoke {r}x{c}", (r // 32 or 1, c // 32)) for _, (r, c) in cases[:1]]  # noqa: E731
    DEQUANT_CASES[:] = [(n, (r * 2, c)) for n, (r, c) in small(DEQUANT_CASES)]
    ENCODE_CASES[:] = small(ENCODE_CASES)
    global E4M3FN_TO_FNUZ_SHAPE
    E4M3FN_TO_FNUZ_SHAPE = (256, 256)


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "fp8", [bench_dequantize, bench_encode, bench_e4m3fn_to_fnuz], shrink)
