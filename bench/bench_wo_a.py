"""Benchmark of the wo_a ops at DSv4 shapes: the grouped FP8 GEMM (bmm_a8w8_mxscale; G groups, N = 1024,
K = 4096), the inverse RoPE + group quantizer (inverse_rope_group_quant) and the BF16 path's inverse_rope.

    python bench/bench_wo_a.py [--device cuda] [--out bench/results] [--no-compile] [--smoke]

GEMM rows per case: dsv4ops (only where this build registers a kernel for the device; otherwise the
header says so and the peers are still timed) with fp32 block sums (the op's default) and with
reduced-precision block sums (reduced_precision_block_sums=True, what the wo_a forward uses; on sm_90 the
FP8 wgmma kernel, on devices without such a mode the same kernel as the default), cuBLAS block-scaled FP8
(torch._scaled_mm with 1x128 / 128x128 scales, one call per group; CUDA only; cuBLAS refuses M = 1: it takes
multiples of 4),
cuBLAS BF16 bmm on the dequantized weight, and at small M (<= 64) a device copy of the same bytes (the
ceiling at that size) and the PyTorch reference (it dequantizes in fp64). Each input set has its own weight,
so that no weight stays in the L2 between calls, as in a model. Bytes counted: the FP8 activation and weight with their scales read once, the bf16 output written
once; FLOPs 2*M*G*N*K (the case label gives each implementation's TFLOP/s).
Forward rows: dsv4ops.wo_a_forward on an FP8 plan (the path its table picks for T, named in the case) against
the same plan forced onto the BF16 path, both replayed from CUDA graphs, with one plan (its own weight) per
input set so that no weight stays in the L2 between calls, as in a model; bytes: o, the FP8 weight, the output.
On a vendor_fp8 row the back-to-back calls may run our kernel's path (wo_a.VENDOR_EAGER_FROM_ROWS).
Quantizer rows: dsv4ops, a device copy of the same bytes (the ceiling at that size), the PyTorch
reference eager and (unless --no-compile) torch.compile'd. Bytes: o read (bf16), positions read, the
FP8 payload and the scale bytes written (the rope table's rows are not counted).
"""

from __future__ import annotations

import torch

import dsv4ops
from dsv4ops import dispatch, wo_a
from dsv4ops.reference import wo_a as reference

from harness import (HEADER_NOTES, OURS, bench_main, input_set_count, input_sets, make_rows, time_graph_replay,
                     time_matched_copy, time_ours, time_peer, time_per_call)

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


REDUCED = f"{OURS} reduced-precision block sums"


def bench_bmm(device, ceiling, compile_peers):
    rows = []
    has_kernel = not dispatch.decide("bmm_a8w8_mxscale", device).reason
    if not has_kernel:
        HEADER_NOTES.append(f"no bmm_a8w8_mxscale kernel for {device} in this build: only the peers are timed")
    for g in GROUPS:
        # A pool of weights covering 4x the L2, one per input set in turn: in a model, the other layers'
        # weights pass through the L2 between two calls of a layer, so no weight may stay there between calls.
        weights = []
        for _ in range(input_set_count(g * N * K, device)):
            w, w_scale = _weight(device, g)
            w_bf16 = (w.float() * _scale_float(w_scale).repeat_interleave(128, 1).repeat_interleave(128, 2)).to(
                torch.bfloat16)
            weights.append((w, w_scale, w_bf16, _scale_float(w_scale)))
        for m in TOKENS:
            nbytes = m * g * K + g * N * K + m * g * (K // 128) + g * (N // 128) * (K // 128) + m * g * N * 2
            sets = [operands + weights[i % len(weights)]
                    for i, operands in enumerate(input_sets(lambda: _operands(device, m, g), nbytes, device))]
            times = {}
            if has_kernel:
                times.update(time_ours(lambda x, s, w, w_scale, *_: torch.ops.dsv4.bmm_a8w8_mxscale(
                    x, w, s, w_scale, torch.bfloat16), sets, device))
                # The block sums in the matrix unit's own precision (the wo_a forward's setting; on sm_90 the
                # FP8 wgmma kernel, with cuBLAS's block-scaled numerics): graph replay.
                times[REDUCED] = time_ours(
                    lambda x, s, w, w_scale, *_: torch.ops.dsv4.bmm_a8w8_mxscale(
                        x, w, s, w_scale, torch.bfloat16, reduced_precision_block_sums=True), sets, device)[OURS]
            if device.type == "cuda":
                def cublas_fp8(x, s, w, w_scale, w_bf16, w_scale_float):
                    sx = _scale_float(s)
                    return [torch._scaled_mm(x[:, i], w[i].t(), scale_a=sx[:, i].t().contiguous().t(),
                                             scale_b=w_scale_float[i].t(), out_dtype=torch.bfloat16)
                            for i in range(g)]

                time_peer(times, "cuBLAS block-scaled FP8 (per group)", cublas_fp8, sets, device, f"G={g} M={m}")
                time_peer(times, "cuBLAS BF16 bmm",
                          lambda x, s, w, w_scale, w_bf16, _: torch.bmm(x.to(torch.bfloat16).transpose(0, 1),
                                                                        w_bf16.transpose(1, 2)),
                          sets, device, f"G={g} M={m}")
            if m <= REFERENCE_MAX_M:
                # Small M reads little more than the weight: a copy of as many bytes is the ceiling at this size.
                times.update(time_matched_copy(nbytes, device))
                time_peer(times, "reference eager",
                          lambda x, s, w, w_scale, *_: reference.bmm_a8w8_mxscale(x, w, s, w_scale, torch.bfloat16),
                          sets, device)
            flops = 2 * m * g * N * K
            rates = ", ".join(f"{name}: {flops / t / 1e12:.1f} TFLOP/s" for name, t in times.items()
                              if name in (OURS, REDUCED, "cuBLAS block-scaled FP8 (per group)", "cuBLAS BF16 bmm"))
            case = f"G={g} M={m} N={N} K={K} ({flops / 1e9:.2f} GFLOP; {rates})"
            rows += make_rows("bmm_a8w8_mxscale", case, nbytes, times, "dsv4ops", ceiling)
            del sets
        del weights
    return rows


QUANT_SHAPES = [(64, 8), (128, 16)]  # (local heads, local groups): Flash and Pro at TP1
QUANT_TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
QUANT_REFERENCE_MAX_S = 4096
ROPE_ROWS = 65536


def _rope_table(device):
    theta = torch.randn(ROPE_ROWS, 32, device=device)
    return torch.cat([theta.cos(), theta.sin()], dim=1)


def _attention_output_sets(tokens, heads, nbytes, device):
    """Input sets (o [tokens, heads, 512] bf16, positions) for the quantizer and inverse_rope rows."""
    def make():
        o = (torch.randn(tokens, heads, 512, device=device) / 10).to(torch.bfloat16)
        return o, torch.randint(0, ROPE_ROWS, (tokens,), device=device)

    return input_sets(make, nbytes, device)


def bench_quant(device, ceiling, compile_peers):
    rows = []
    has_kernel = not dispatch.decide("inverse_rope_group_quant", device).reason
    if not has_kernel:
        HEADER_NOTES.append(f"no inverse_rope_group_quant kernel for {device} in this build: only the peers are timed")
    cos_sin = _rope_table(device)
    ref_compiled = torch.compile(reference.inverse_rope_group_quant, dynamic=False) if compile_peers else None
    for heads, g in QUANT_SHAPES:
        for s in QUANT_TOKENS:
            elements = s * heads * 512
            nbytes = 2 * elements + 8 * s + elements + elements // 128

            sets = _attention_output_sets(s, heads, nbytes, device)
            times = {}
            if has_kernel:
                times.update(time_ours(lambda o, p: torch.ops.dsv4.inverse_rope_group_quant(
                    o, p, cos_sin, g, 128, 0, 448.0, True), sets, device))
            times.update(time_matched_copy(nbytes, device))
            if s <= QUANT_REFERENCE_MAX_S:
                time_peer(times, "reference eager",
                          lambda o, p: reference.inverse_rope_group_quant(o, p, cos_sin, g, 128, 0, 448.0, True), sets,
                          device)
                if ref_compiled is not None:
                    time_peer(times, "reference torch.compile",
                              lambda o, p: ref_compiled(o, p, cos_sin, g, 128, 0, 448.0, True), sets, device,
                              f"H={heads} G={g} S={s}")
            rows += make_rows("inverse_rope_group_quant", f"H={heads} G={g} S={s} (OCP, group 128)", nbytes, times,
                              OURS, ceiling)
            del sets
    return rows


def bench_inverse_rope(device, ceiling, compile_peers):
    rows = []
    has_kernel = not dispatch.decide("inverse_rope", device).reason
    cos_sin = _rope_table(device)
    heads = 64
    for s in QUANT_TOKENS:
        elements = s * heads * 512
        nbytes = 4 * elements + 8 * s

        sets = _attention_output_sets(s, heads, nbytes, device)
        times = {}
        if has_kernel:
            times.update(time_ours(lambda o, p: torch.ops.dsv4.inverse_rope(o, p, cos_sin), sets, device))
        times.update(time_matched_copy(nbytes, device))
        if s <= QUANT_REFERENCE_MAX_S:
            time_peer(times, "reference eager", lambda o, p: reference.inverse_rope(o, p, cos_sin), sets, device)
        rows += make_rows("inverse_rope", f"H={heads} S={s}", nbytes, times, OURS, ceiling)
        del sets
    return rows


# (local heads, local groups): Flash at TP8 and Pro at TP8 (or Flash at TP4), Flash and Pro at TP1
FORWARD_SHAPES = [(8, 1), (16, 2), (64, 8), (128, 16)]
FORWARD_TOKENS = [1, 16, 64, 256, 1024, 4096, 4097, 16384]  # 4097: the vendor GEMM's rows padded to 4100
BF16_PATH = "BF16 path (inverse_rope + BF16 einsum)"


def bench_forward(device, ceiling, compile_peers):
    """wo_a_forward as a model calls it (the path its table picks for T tokens) against the BF16 path on the
    same plan, both replayed from CUDA graphs on the GPU (back-to-back on the CPU): the issue's end-to-end
    comparison."""
    rows = []
    if dispatch.decide("bmm_a8w8_mxscale", device).reason:
        HEADER_NOTES.append(f"no wo_a kernels for {device} in this build: no forward rows")
        return rows
    cos_sin = _rope_table(device)
    for heads, g in FORWARD_SHAPES:
        # One plan (one layer's weight) per input set: in a model, the other layers' weights pass through
        # the L2 between two calls of a layer, so a weight that fits the L2 must not stay there between calls.
        plans = []
        for _ in range(input_set_count(g * N * K, device)):
            weight, weight_scale = _weight(device, g)
            checkpoint_weight = weight.reshape(g * N, K)
            checkpoint_scale = _scale_float(weight_scale).reshape(g * N // 128, K // 128)
            plans.append(dsv4ops.prepare_wo_a(checkpoint_weight, checkpoint_scale, g, N, cos_sin, device))
        if plans[0].path != "fp8":
            HEADER_NOTES.append(f"wo_a plan for H={heads} G={g} refused FP8: {plans[0].reason}")
            continue
        for t in FORWARD_TOKENS:
            nbytes = t * heads * 512 * 2 + g * N * K + t * g * N * 2
            sets = [(o, p, plans[i % len(plans)])
                    for i, (o, p) in enumerate(_attention_output_sets(t, heads, nbytes, device))]
            forward = lambda o, p, plan: dsv4ops.wo_a_forward(o, p, plan, apply_inverse_rope=True)  # noqa: E731
            table_key = wo_a.path_table_key(device)  # "rocm" on an AMD GPU, whose torch device type is "cuda" too
            chosen = wo_a.gemm_path(t, g, table_key)
            times = time_ours(forward, sets, device)
            saved = wo_a.WO_A_GEMM_PATHS.get(table_key)
            wo_a.WO_A_GEMM_PATHS[table_key] = {1: ((None, "bf16"),)}
            try:
                if device.type == "cuda":
                    times[BF16_PATH] = time_graph_replay(forward, sets, device, time_per_call(forward, sets, device))
                else:
                    times[BF16_PATH] = time_per_call(forward, sets, device)
            finally:
                if saved is None:
                    del wo_a.WO_A_GEMM_PATHS[table_key]
                else:
                    wo_a.WO_A_GEMM_PATHS[table_key] = saved
            rows += make_rows("wo_a_forward", f"H={heads} G={g} T={t} (table path: {chosen})", nbytes, times, OURS,
                              ceiling)
            del sets
        for plan in plans:
            plan._dense_weight = None  # the BF16 path's dequantized weight, built by the peer
    return rows


def shrink():
    GROUPS[:] = [2]
    TOKENS[:] = [1, 3]
    QUANT_SHAPES[:] = [(16, 2)]
    FORWARD_SHAPES[:] = [(16, 2)]
    QUANT_TOKENS[:] = [1, 5]
    FORWARD_TOKENS[:] = [1, 3]


if __name__ == "__main__":
    bench_main(__doc__.splitlines()[0], "wo_a", [bench_quant, bench_inverse_rope, bench_bmm, bench_forward], shrink,
               ["operands OCP e4m3fn with UE8M0 scales; bf16 output"])
