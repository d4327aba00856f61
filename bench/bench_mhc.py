"""Benchmark of the mHC ops at DSv4 sizes (hc_mult 4; Flash hidden 4096, Pro hidden 7168).

    python bench/bench_mhc.py [--device cuda] [--out bench/results] [--no-compile]

Bytes counted: every input read once and every output written once (residual [T, 4, hidden] bf16, x and
layer_input [T, hidden] bf16, fn fp32, the mixes). Peers in the same run: a device copy of the same bytes
(the ceiling at that size), the PyTorch reference eager and under torch.compile (at the largest T only:
each shape compiles anew), and for the fused op, our own post followed by our own pre (timed like ours).
"""

from __future__ import annotations

import torch

from dsv4ops.reference import mhc as reference

from harness import OURS, bench_main, input_sets, make_rows, time_matched_copy, time_ours, time_peer, time_per_call

TOKENS = [1, 64, 1024, 8192]
MODELS = [("Flash", 4096), ("Pro", 7168)]
EPS = 1e-6


def _inputs(device, t, hidden):
    residual = torch.randn(t, 4, hidden, device=device).to(torch.bfloat16)
    x = torch.randn(t, hidden, device=device).to(torch.bfloat16)
    post = torch.rand(t, 4, 1, device=device) * 2
    comb = torch.softmax(torch.randn(t, 4, 4, device=device), dim=-1)
    return residual, x, post, comb


def _params(device, hidden, mixes, scales):
    return (torch.randn(mixes, 4 * hidden, device=device) * 1e-4, torch.randn(scales, device=device) * 0.1,
            torch.randn(mixes, device=device) * 0.1)


def bench_mhc(device, ceiling, compile_peers):
    rows = []
    for model, hidden in MODELS:
        fn, scale, base = _params(device, hidden, 24, 3)
        head_fn, head_scale, head_base = _params(device, hidden, 4, 1)
        ops = {
            "mhc_pre": (
                lambda r, x, p, c: torch.ops.dsv4.mhc_pre(r, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS),
                lambda r, x, p, c: reference.mhc_pre(r, fn, scale, base),
                lambda t: t * 4 * hidden * 2 + fn.numel() * 4 + t * hidden * 2 + t * 20 * 4),
            "mhc_post": (
                lambda r, x, p, c: torch.ops.dsv4.mhc_post(x, r, p, c),
                lambda r, x, p, c: reference.mhc_post(x, r, p, c),
                lambda t: t * hidden * 2 + 2 * t * 4 * hidden * 2 + t * 20 * 4),
            "mhc_fused_post_pre": (
                lambda r, x, p, c: torch.ops.dsv4.mhc_fused_post_pre(x, r, p, c, fn, scale, base, EPS, EPS, EPS, 2.0,
                                                                     20, None, EPS),
                lambda r, x, p, c: reference.mhc_fused_post_pre(x, r, p, c, fn, scale, base),
                lambda t: t * hidden * 2 + 2 * t * 4 * hidden * 2 + fn.numel() * 4 + t * hidden * 2 + 2 * t * 20 * 4),
            "hc_head": (
                lambda r, x, p, c: torch.ops.dsv4.hc_head(r, head_fn, head_scale, head_base, EPS, EPS),
                lambda r, x, p, c: reference.hc_head(r, head_fn, head_scale, head_base),
                lambda t: t * 4 * hidden * 2 + head_fn.numel() * 4 + t * hidden * 2),
        }

        def post_then_pre(r, x, p, c):
            new_residual = torch.ops.dsv4.mhc_post(x, r, p, c)
            return torch.ops.dsv4.mhc_pre(new_residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)

        for op, (ours, ref, bytes_of) in ops.items():
            ref_compiled = torch.compile(ref, dynamic=False) if compile_peers else None
            for t in TOKENS:
                nbytes = bytes_of(t)
                sets = input_sets(lambda: _inputs(device, t, hidden), nbytes, device)
                times = time_ours(ours, sets, device)
                times.update(time_matched_copy(nbytes, device))
                if op == "mhc_fused_post_pre":
                    # timed like ours (graph replay beside back-to-back), so the comparison is like for like
                    unfused = time_ours(post_then_pre, sets, device)
                    times["unfused post + pre (ours)"] = unfused[OURS]
                    if f"{OURS} back-to-back" in unfused:
                        times["unfused post + pre (ours) back-to-back"] = unfused[f"{OURS} back-to-back"]
                times["reference eager"] = time_per_call(ref, sets, device)
                if ref_compiled is not None and t == TOKENS[-1]:  # one compile per op and model
                    time_peer(times, "reference compiled", ref_compiled, sets, device, f"{op} {model} T={t}")
                rows += make_rows(op, f"{model} T={t}", nbytes, times, "dsv4ops", ceiling)
                del sets
    return rows


def shrink():
    TOKENS[:] = [1, 64]
    MODELS[:] = [("Flash", 4096)]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "mhc", [bench_mhc], shrink, ["hc_mult 4, sinkhorn_iters 20, post_mult 2.0"])
