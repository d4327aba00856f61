"""Runs every dsv4 op once on the GPU with awkward shapes (odd sizes, misaligned views, ragged blocks,
empty tensors), for a memory checker: compute-sanitizer --tool memcheck python tools/sanitize_smoke.py"""

import torch

import dsv4ops  # noqa: F401  (registers the ops)

ops = torch.ops.dsv4
dev = "cuda"
for n in (0, 1, 7, 8, 9, 1000, 4099):
    base = torch.randn(n + 1, device=dev) * 300
    for x in (base[:n], base[1:]):  # aligned and misaligned
        ops.fp8_encode(x, 0, 448.0)
        ops.fp8_encode(x.bfloat16(), 1, 224.0)
    ops.ue8m0_to_float(torch.randint(0, 256, (n,), dtype=torch.int32, device=dev).to(torch.uint8))
    ops.float_to_ue8m0_lossless(base[1:])
    raw = torch.randint(0, 256, (n + 1,), dtype=torch.int32, device=dev).to(torch.uint8)
    ops.e4m3fn_to_fnuz(raw[1:], torch.rand(3, device=dev))
    ops.e4m3fn_to_fnuz_(raw[:n].clone(), torch.randint(0, 250, (2,), dtype=torch.int32, device=dev).to(torch.uint8))
for rows, cols, br, bc in ((5, 7, 2, 3), (300, 260, 128, 128), (64, 48, 128, 16), (1, 4096, 1, 128), (0, 16, 128, 128)):
    x = torch.randint(0, 256, (rows * cols + 1,), dtype=torch.int32, device=dev).to(torch.uint8)
    scale = torch.randint(100, 150, (-(-rows // br), -(-cols // bc)), dtype=torch.int32, device=dev).to(torch.uint8)
    for view in (x[: rows * cols], x[1:]):
        for out_dtype in (torch.bfloat16, torch.float32):
            ops.fp8_block_dequantize(view.view(rows, cols), scale, br, bc, 0, out_dtype)
            ops.fp8_block_dequantize(view.view(rows, cols), scale.float(), br, bc, 1, out_dtype)
for block_size, extra in ((16, 0), (64, 48)):
    cache = torch.randint(0, 256, (3, block_size * 584 + extra), dtype=torch.int32, device=dev).to(torch.uint8)
    k = (torch.randn(70, 512, device=dev) * 100).to(torch.bfloat16)
    capacity = 3 * block_size
    slots = torch.tensor([-1, -5, capacity, capacity - 1, 2**40] + list(range(65)), device=dev)
    for fmt, qmax in ((0, 448.0), (1, 224.0)):
        ops.quantize_and_insert_k_cache(k, cache, slots, block_size, fmt, qmax)
        out = torch.empty(3, 40, 512, dtype=torch.bfloat16, device=dev)
        lens = torch.tensor([40, 0, 100], dtype=torch.int32, device=dev)
        table = torch.tensor([[0, 2, 1, 7], [1, 1, 1, 1], [-3, 2**30, 1, 0]], dtype=torch.int32, device=dev)
        for gather_lens in (None, torch.tensor([3, 5, 1000], dtype=torch.int32, device=dev)):
            ops.dequantize_and_gather_k_cache(out, cache, lens, gather_lens, table, block_size, 2, fmt)
cos_sin = torch.randn(64, 64, device=dev)
for n, h, hp in ((1, 1, 8), (7, 3, 3), (33, 8, 16)):
    q = torch.randn(n, h, 512, device=dev).to(torch.bfloat16)
    kv = torch.randn(n, 512, device=dev).to(torch.bfloat16)
    cache = torch.zeros(2, 16 * 584, dtype=torch.uint8, device=dev)
    positions = torch.arange(n, device=dev) * 3 - 1  # -1 and positions past the 64-row table included
    slots = torch.arange(n, device=dev) * 5 - 2  # negative and past-capacity slots included
    for fmt, qmax in ((0, 448.0), (1, 224.0)):
        ops.qnorm_rope_kv_insert(q, kv, cache, slots, positions, cos_sin, hp, 1e-6, 16, True, fmt, qmax)
        ops.qnorm_rope_kv_insert(q, kv, cache, slots[: n // 2], positions, cos_sin, hp, 1e-6, 16, False, fmt, qmax)
        ops.kv_rope_quant_insert(kv, cache, slots, positions, cos_sin, 16, fmt, qmax)
        strided_kv = torch.randn(n, 1024, device=dev).to(torch.bfloat16)[:, 512:]
        weight = torch.rand(512, device=dev).to(torch.bfloat16)
        ops.kv_norm_rope_quant_insert(strided_kv, weight, cache, slots, positions, cos_sin, 1e-6, 16, fmt, qmax)
        plain = torch.zeros(2, 16, 512, dtype=torch.bfloat16, device=dev)
        ops.qnorm_rope_kv_insert_full_cache_bf16(q.clone(), kv, plain, slots, positions, cos_sin, 1e-6, 16, True)
        gapped = torch.zeros(2, 20, 512, dtype=torch.float8_e4m3fn, device=dev)[:, :16]  # blocks 20 rows apart
        scale = torch.full((1,), 0.5, device=dev)
        ops.qnorm_rope_kv_insert_full_cache_fp8(q, kv, torch.empty(n, h, 512, dtype=torch.float8_e4m3fn, device=dev),
                                                gapped, slots, positions, cos_sin, scale, scale, 1e-6, 16, True, fmt,
                                                qmax)
for t, hidden in ((1, 64), (5, 4096), (70, 192)):
    residual = torch.randn(t, 4, hidden, device=dev).to(torch.bfloat16)
    fn, scale, base = torch.randn(24, 4 * hidden, device=dev) * 1e-3, torch.randn(3, device=dev), torch.randn(24, device=dev)
    weight = torch.rand(hidden, device=dev).to(torch.bfloat16)
    post, comb, layer_input = ops.mhc_pre(residual, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 20, weight, 1e-6)
    ops.mhc_fused_post_pre(layer_input, residual, post, comb, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 20, None, 1e-6)
    ops.hc_head(residual, fn[:4].contiguous(), scale[:1].contiguous(), base[:4].contiguous(), 1e-6, 1e-6)
def shifted(t, offset):  # a contiguous copy of t starting `offset` bytes past an aligned address
    nbytes = t.numel() * t.element_size()
    raw = torch.empty(nbytes + 16, dtype=torch.uint8, device=dev)
    return raw[offset:offset + nbytes].view(t.dtype).view(t.shape).copy_(t)


def fp8(*shape, fnuz=False):
    x = (torch.randn(*shape, device=dev) * 4).to(torch.float8_e4m3fn)
    return x.view(torch.float8_e4m3fnuz) if fnuz else x


def ragged(rows):  # flat int32 indices and indptr of a list of index lists
    flat = torch.tensor([i for row in rows for i in row], dtype=torch.int32, device=dev)
    return flat, torch.tensor([0] + [len(row) for row in rows], device=dev).cumsum(0).int()


# wo_a: inverse RoPE (+ UE8M0 group quant), positions clamped to the 64-row table; the grouped FP8 GEMM
for t, h, groups, gs in ((0, 8, 1, 128), (1, 8, 1, 32), (7, 16, 2, 64), (33, 24, 3, 128), (5, 128, 16, 128)):
    o = torch.randn(t, h, 512, device=dev).to(torch.bfloat16)
    positions = torch.arange(t, device=dev) * 13 - 3
    d = h * 512 // groups
    for view in (o, shifted(o, 2)):  # aligned and element-wise paths
        ops.inverse_rope(view, positions.int(), cos_sin.bfloat16())
        for fmt, qmax in ((0, 448.0), (1, 224.0)):
            for table in (cos_sin, cos_sin.bfloat16()):
                ops.inverse_rope_group_quant(view, positions, table, groups, gs, fmt, qmax, fmt == 0)
        wide = torch.zeros(t, groups, d // gs + 3, dtype=torch.uint8, device=dev)[:, :, 1:d // gs + 1]
        ops.inverse_rope_group_quant.out(view, positions, cos_sin, groups, gs, 0, 448.0, True,
                                         x_fp8=shifted(torch.zeros(t, groups, d, dtype=torch.uint8, device=dev), 1),
                                         x_scale=wide)
for m, groups, n, k in ((0, 2, 128, 256), (1, 1, 256, 512), (20, 3, 128, 384), (40, 2, 384, 256), (130, 3, 384, 256)):
    x, w = fp8(m, groups, k), fp8(groups, n, k)
    xs = torch.randint(118, 136, (m, groups, k // 128), dtype=torch.int32, device=dev).to(torch.uint8)
    ws = torch.randint(118, 136, (groups, n // 128, k // 128), dtype=torch.int32, device=dev).to(torch.uint8)
    for xv, wv in ((x, w), (shifted(x, 1), shifted(w, 3))):  # 16-byte rows, and element-wise loads
        ops.bmm_a8w8_mxscale(xv, wv, xs, ws, torch.bfloat16)
        ops.bmm_a8w8_mxscale(xv.view(torch.float8_e4m3fnuz), wv, xs, ws.view(torch.float8_e8m0fnu), torch.float32)
    # batch-major x, x_scale and (padded) out seen through transposed views
    x_bm = x.view(torch.uint8).transpose(0, 1).contiguous().view(torch.float8_e4m3fn).transpose(0, 1)
    xs_bm = xs.transpose(0, 1).contiguous().transpose(0, 1)
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.empty(groups, m, n + 8, dtype=out_dtype, device=dev)[:, :, 8:].transpose(0, 1)
        ops.bmm_a8w8_mxscale.out(x_bm, w, xs_bm, ws, out=out)

# indexer: MMA head/dim shapes and scalar ones, ragged/empty/negative windows, uint8 scales, strided q
for heads, dim in ((64, 128), (32, 64), (16, 128), (16, 64), (8, 32), (20, 64), (3, 7)):
    for m, n in ((0, 9), (4, 0), (9, 333)):
        q, k = fp8(m, heads, dim), fp8(n, dim, fnuz=heads == 32)
        k_scale, weights = torch.rand(n, device=dev) + 0.5, torch.randn(m, heads, device=dev)
        ks = torch.randint(-3, max(1, n // 2), (m,), dtype=torch.int32, device=dev)
        ke = ks + torch.randint(-2, n + 8, (m,), dtype=torch.int32, device=dev)  # empty rows, ke past N
        for clean in (True, False):
            ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean)
        ops.fp8_mqa_logits(shifted(q, 1), shifted(k, 3), k_scale.view(torch.uint8).view(n, 4), weights, ks, ke, True)
        padded_q = fp8(m, heads + 1, dim, fnuz=True)[:, :heads]
        ops.fp8_mqa_logits(padded_q, k, k_scale[:, None], weights, ks, ke, False)
for heads, dim, block_size, next_n in ((64, 128, 64, 1), (32, 64, 32, 2), (16, 128, 16, 4), (8, 32, 32, 3),
                                       (5, 12, 3, 1)):
    batch, blocks, bb = 4, 9, block_size * (dim + 4)
    q = fp8(batch, next_n, heads, dim, fnuz=next_n == 2)
    weights = torch.randn(batch * next_n, heads, device=dev)
    table = torch.randint(-2, blocks + 3, (batch, 6), dtype=torch.int32, device=dev)  # negative, past the cache
    lens = torch.tensor([0, 7, 1000, 40], dtype=torch.int32, device=dev)  # empty, ragged, past max_model_len
    for pad in (16, 4):  # block stride a multiple of 16 (matrix path) or not (scalar path)
        cache = fp8(blocks, bb + pad).view(torch.uint8)[:, :bb]
        cache[:, block_size * dim:] = torch.rand(block_size, device=dev).add(0.5).view(torch.uint8)
        for max_len in (0, 1, 300):
            for kv_format in (0, 1):
                ops.fp8_paged_mqa_logits(q, cache, weights, lens, table, max_len, True, kv_format)
        per_row = (lens[:, None] - torch.arange(next_n, dtype=torch.int32, device=dev) * 3).contiguous()
        ops.fp8_paged_mqa_logits(q, cache.view(blocks, block_size, 1, dim + 4), weights, per_row, table[:, 1:4], 300,
                                 False, 0)  # a table narrower than the lengths
        ops.fp8_paged_mqa_logits(q[:0], cache, weights[:0], lens[:0], table[:0], 300, True, 0)
for rows, cols, k in ((0, 5, 3), (3, 0, 4), (6, 3000, 7), (4, 33000, 1024), (2, 700, 4096), (5, 300, 64)):
    logits = torch.randn(rows, cols + 3, device=dev)[:, 3:]  # a strided row view
    logits[:, 1::17] = float("-inf")
    logits[:1, ::13] = float("nan")
    ties = torch.randint(-6, 6, (rows, cols), device=dev).float() / 4
    ties[:, 5:6] = float("inf")
    ks = torch.randint(-3, max(1, cols // 2), (rows,), dtype=torch.int32, device=dev)
    ke = ks + torch.randint(-2, cols + 50, (rows,), dtype=torch.int32, device=dev)  # empty rows, ke past the row
    for values in (logits, ties):
        for stable in (False, True):
            out = torch.empty(rows, k, dtype=torch.int32, device=dev)
            ops.topk_per_row_prefill(values, ks, ke, k, stable, out=out)
            ops.topk_per_row_decode(values, ke.clamp(min=0), k, stable, out=out)

# sparse MLA decode: caches with padded blocks, ragged/empty rows, bad slots, wild indptr, splits, sink,
# inverse-RoPE epilogue (clamped positions), partial head groups, strided q and out, T = 0
k_rows = torch.randn(300, 512, device=dev).to(torch.bfloat16)
caches = []
for block_size, fmt, qmax in ((64, 0, 448.0), (16, 1, 224.0), (2, 0, 448.0)):
    caches.append(torch.zeros(-(-300 // block_size) + 1, block_size * 584 + 16, dtype=torch.uint8, device=dev))
    ops.quantize_and_insert_k_cache(k_rows, caches[-1], torch.arange(300, device=dev), block_size, fmt, qmax)
main_idx, main_ptr = ragged([[], [-1, 400, 2**30], [-7, 10, 500, 299], list(range(172, 300)), list(range(0, 300, 3))])
extra_idx, extra_ptr = ragged([[5], [], [-2, 74, 300, 2**31 - 1], list(range(0, 75, 2)), list(range(150))])
positions = torch.tensor([-1, 0, 63, 64, 5000], device=dev)
for heads in (1, 5, 16, 20, 64, 128):
    q = torch.randn(5, heads, 512, device=dev).to(torch.bfloat16)
    sink = torch.randn(heads + 2, device=dev)
    sink[:1] = float("inf") if heads > 16 else float("nan")
    out = torch.empty_like(q)
    for splits in (0, 1, 3, 64):
        for (main_cache, main_bs, main_fmt) in ((caches[0], 64, 0), (caches[1], 16, 1)):
            ops.sparse_mla_decode(q, main_cache, main_idx, main_ptr, main_bs, None, None, None, 16, None, 0.04,
                                  main_fmt, 0, splits, None, None, out=out)
            ops.sparse_mla_decode(q, main_cache, main_idx, main_ptr, main_bs, caches[2], extra_idx, extra_ptr, 2, sink,
                                  0.04, main_fmt, 0, splits, cos_sin, positions, out=out)
q_view = torch.randn(5, 20, 513, device=dev).to(torch.bfloat16)[..., :512]
out_view = torch.zeros(5, 20, 515, dtype=torch.bfloat16, device=dev)[..., 1:513]
for splits in (1, 2):
    ops.sparse_mla_decode(q_view, caches[0], main_idx, main_ptr, 64, caches[1], extra_idx, extra_ptr, 16, None, 0.04,
                          0, 1, splits, cos_sin.bfloat16(), positions.int(), out=out_view)
wild_ptr = torch.tensor([-5, 2, 99], dtype=torch.int32, device=dev)  # indptr outside the index list: clamped
ops.sparse_mla_decode(q_view[:2], caches[0], main_idx[:6].contiguous(), wild_ptr, 64, None, None, None, 16, None, 0.04,
                      0, 0, 2, None, None, out=out_view[:2])
q0 = torch.empty(0, 4, 512, dtype=torch.bfloat16, device=dev)
ops.sparse_mla_decode(q0, caches[0], main_idx[:0], torch.zeros(1, dtype=torch.int32, device=dev), 64, None, None, None,
                      16, None, 0.04, 0, 0, 0, None, None, out=torch.empty_like(q0))
if dev == "cuda":
    torch.cuda.synchronize()
print("sanitize smoke: all ops ran")
