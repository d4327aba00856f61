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
    ops.hc_head(residual, fn[:4].contiguous(), base[:4].contiguous(), scale[:1].contiguous(), 1e-6, 1e-6)
torch.cuda.synchronize()
print("sanitize smoke: all ops ran")
