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
torch.cuda.synchronize()
print("sanitize smoke: all ops ran")
