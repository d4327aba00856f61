"""Benchmark of the lightning-indexer ops at DSv4 sizes (64 heads x 128 dims, C4A compressed keys).

    python bench/bench_indexer.py [--device cuda] [--out bench/results] [--no-compile] [--smoke]

fp8_mqa_logits (prefill): M query rows against N compressed keys with causal-like windows (row i sees
[0, (i + 1) * N / M)); the header notes give TFLOP/s on the visible area (2 * H * D flops per visible
logit). Bytes counted: q, k, k_scale, weights and ks/ke read once, the [M, N] fp32 logits written once.
fp8_paged_mqa_logits (decode): B requests x next_n rows over contexts of 8k-128k tokens (compressed /4,
block size 64, shuffled blocks); bytes: the visible cache entries (128 FP8 bytes + a 4-byte scale each)
read once per request, q and weights, the [B * next_n, max_model_len] logits written.
top-k: 128 rows of 32k candidates, k = 512 / 1024; bytes: the logits read once, the indices written.
Peers: a device copy of the same bytes, the PyTorch reference eager (where its [M, H, N] fp32 scores fit:
skipped above 8 GiB; the paged reference loops over rows in Python and is timed at the smaller cases
only) and under torch.compile (prefill at the smallest case only: each shape compiles anew), and the Triton
fallback of the logits (dsv4ops.indexer_triton, what serves a GPU without a dsv4ops kernel; timed on a GPU
where triton is installed, its compilation done in the warm-up). The top-k
reference sorts each row in Python; its peer here is torch.topk over the masked logits instead.
"""

from __future__ import annotations

import torch

from dsv4ops import indexer_triton
from dsv4ops.reference import indexer as reference

from harness import (HEADER_NOTES, OURS, bench_main, input_sets, make_rows, time_matched_copy, time_ours, time_peer,
                     time_per_call)

HEADS, DIM = 64, 128
PREFILL = [(2048, 8192), (2048, 32768), (8192, 8192), (8192, 32768)]
DECODE_BATCH = [1, 32, 128]
DECODE_NEXT_N = [1, 2]
DECODE_CONTEXT = [8192, 32768, 131072]  # tokens; compressed / 4
BLOCK = 64
TOPK = [(128, 32768, 512), (128, 32768, 1024)]
REFERENCE_SCORE_BYTES = 8 << 30


def _fp8(shape, device, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def _triton_peer(device):
    """Whether the Triton fallback is timed here (a note says why not, once)."""
    if device.type == "cuda" and indexer_triton.available():
        return True
    note = "Triton fallback: not timed (" + ("triton is not installed" if device.type == "cuda" else "CPU run") + ")"
    if note not in HEADER_NOTES:
        HEADER_NOTES.append(note)
    return False


def _tflops(flops, seconds):
    return flops / seconds / 1e12


def bench_prefill(device, ceiling, compile_peers):
    rows = []
    ref_compiled = torch.compile(reference.fp8_mqa_logits, dynamic=False) if compile_peers else None
    for m, n in PREFILL:
        i = torch.arange(m, device=device)
        ks = torch.zeros(m, dtype=torch.int32, device=device)
        ke = ((i + 1) * n // m).to(torch.int32)
        visible = int((ke - ks).sum())
        flops = 2 * HEADS * DIM * visible
        nbytes = m * HEADS * DIM + n * DIM + n * 4 + m * HEADS * 4 + 2 * m * 4 + m * n * 4

        def make():
            return (_fp8((m, HEADS, DIM), device), _fp8((n, DIM), device), torch.rand(n, device=device) + 0.5,
                    torch.randn(m, HEADS, device=device) * 0.01)

        sets = input_sets(make, nbytes, device)
        ours = lambda q, k, s, w: torch.ops.dsv4.fp8_mqa_logits(q, k, s, w, ks, ke, True)  # noqa: E731
        ref = lambda q, k, s, w: reference.fp8_mqa_logits(q, k, s, w, ks, ke)  # noqa: E731
        times = time_ours(ours, sets, device)
        times.update(time_matched_copy(nbytes, device))
        case = f"M={m} N={n} causal"
        if _triton_peer(device):
            triton_fallback = lambda q, k, s, w: indexer_triton.fp8_mqa_logits(q, k, s, w, ks, ke, True)  # noqa: E731
            time_peer(times, "Triton fallback", triton_fallback, sets, device, case)
        if HEADS * m * n * 4 <= REFERENCE_SCORE_BYTES:
            time_peer(times, "reference eager", ref, sets[:2], device, case)
            if ref_compiled is not None and (m, n) == PREFILL[0]:
                compiled = lambda q, k, s, w: ref_compiled(q, k, s, w, ks, ke)  # noqa: E731
                time_peer(times, "reference compiled", compiled, sets[:2], device, case)
        note = ", ".join(f"{impl} {_tflops(flops, t):.1f}" for impl, t in times.items() if not impl.startswith("device"))
        HEADER_NOTES.append(f"fp8_mqa_logits {case}: TFLOP/s on the visible area ({visible} logits): {note}")
        rows += make_rows("fp8_mqa_logits", case, nbytes, times, OURS, ceiling)
        del sets
    return rows


def _paged_inputs(device, batch, next_n, context_c):
    blocks_per_request = -(-context_c // BLOCK)
    num_blocks = batch * blocks_per_request
    cache = torch.randint(0, 256, (num_blocks, BLOCK * (DIM + 4)), dtype=torch.uint8, device=device)
    cache[:, BLOCK * DIM:] = torch.full((num_blocks, BLOCK), 0.5, device=device).view(torch.uint8)
    fp8 = cache[:, : BLOCK * DIM]
    fp8[(fp8 & 0x7F) == 0x7F] = 0  # no NaN codes
    table = torch.randperm(num_blocks, device=device).to(torch.int32).reshape(batch, blocks_per_request)
    q = _fp8((batch, next_n, HEADS, DIM), device)
    weights = torch.randn(batch * next_n, HEADS, device=device) * 0.01
    lens = torch.full((batch,), context_c, dtype=torch.int32, device=device)
    return q, cache, weights, lens, table


def bench_decode(device, ceiling, compile_peers):
    rows = []
    for batch in DECODE_BATCH:
        for next_n in DECODE_NEXT_N:
            for context in DECODE_CONTEXT:
                context_c = context // 4
                nbytes = (batch * context_c * (DIM + 4) + batch * next_n * HEADS * (DIM + 4)
                          + batch * next_n * context_c * 4)
                sets = input_sets(lambda: _paged_inputs(device, batch, next_n, context_c), nbytes, device)
                ours = lambda q, c, w, l, t: torch.ops.dsv4.fp8_paged_mqa_logits(q, c, w, l, t, context_c, True, 0)  # noqa: E731
                times = time_ours(ours, sets, device)
                times.update(time_matched_copy(nbytes, device))
                case = f"B={batch} next_n={next_n} ctx={context // 1024}k"
                if _triton_peer(device):
                    triton_fallback = lambda q, c, w, l, t: indexer_triton.fp8_paged_mqa_logits(  # noqa: E731
                        q, c, w, l, t, context_c, True, torch.float8_e4m3fn)
                    time_peer(times, "Triton fallback", triton_fallback, sets, device, case)
                if batch * next_n * context_c <= 64 * 8192:
                    ref = lambda q, c, w, l, t: reference.fp8_paged_mqa_logits(q, c, w, l, t, context_c, True)  # noqa: E731
                    try:
                        times["reference eager"] = time_per_call(ref, sets[:2], device, repeats=3, min_calls=1)
                    except Exception as error:  # noqa: BLE001
                        HEADER_NOTES.append(f"reference eager failed on {case}: {type(error).__name__}")
                rows += make_rows("fp8_paged_mqa_logits", case, nbytes, times, OURS, ceiling)
                del sets
    HEADER_NOTES.append("fp8_paged_mqa_logits: the reference (a Python loop over rows) is timed only where "
                        "B * next_n * compressed context <= 512k; no torch.compile peer (the loop is data-dependent)")
    return rows


def _torch_topk_prefill(logits, ks, ke, k):
    n = logits.shape[1]
    columns = torch.arange(n, device=logits.device)[None, :]
    inside = (columns >= ks[:, None].long()) & (columns < ke[:, None].long())
    masked = torch.where(inside & ~torch.isnan(logits), logits, torch.full_like(logits, float("-inf")))
    values, index = torch.topk(masked, min(k, n), dim=1)
    return torch.where(values > float("-inf"), index - ks[:, None], torch.full_like(index, -1)).to(torch.int32)


def bench_topk(device, ceiling, compile_peers):
    rows = []
    for r, n, k in TOPK:
        nbytes = r * n * 4 + r * k * 4 + 2 * r * 4
        ks = torch.zeros(r, dtype=torch.int32, device=device)
        ke = torch.full((r,), n, dtype=torch.int32, device=device)
        sets = input_sets(lambda: (torch.randn(r, n, device=device),), nbytes, device)
        out = torch.empty(r, k, dtype=torch.int32, device=device)
        for stable in (False, True):
            ours = lambda x: torch.ops.dsv4.topk_per_row_prefill(x, ks, ke, k, stable, out=out)  # noqa: E731
            times = time_ours(ours, sets, device)
            times.update(time_matched_copy(nbytes, device))
            times["torch.topk on masked logits"] = time_per_call(lambda x: _torch_topk_prefill(x, ks, ke, k), sets,
                                                                 device)
            if compile_peers and not stable:
                compiled = torch.compile(_torch_topk_prefill, dynamic=False)
                time_peer(times, "torch.topk compiled", lambda x: compiled(x, ks, ke, k), sets, device, f"k={k}")
            rows += make_rows("topk_per_row_prefill", f"{r} rows x {n // 1024}k, k={k}{' stable' if stable else ''}",
                              nbytes, times, OURS, ceiling)
        decode = lambda x: torch.ops.dsv4.topk_per_row_decode(x, ke, k, False, out=out)  # noqa: E731
        times = time_ours(decode, sets, device)
        rows += make_rows("topk_per_row_decode", f"{r} rows x {n // 1024}k, k={k}", nbytes, times, OURS, ceiling)
        del sets
    return rows


def shrink():
    PREFILL[:] = [(256, 1024)]
    DECODE_BATCH[:] = [2]
    DECODE_NEXT_N[:] = [2]
    DECODE_CONTEXT[:] = [4096]
    TOPK[:] = [(8, 4096, 512)]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "indexer", [bench_prefill, bench_decode, bench_topk], shrink,
               [f"H={HEADS}, D={DIM}, OCP e4m3 q and k; paged block size {BLOCK}"])
