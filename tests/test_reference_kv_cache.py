"""The KV-cache reference (dsv4ops.reference.kv_cache) against hand-worked fp8_ds_mla records in both
encodings, the FNUZ/OCP identity of spec/kv_cache.md §7.2, round trips through the gather, and the
guards (negative/huge slots, capacity edge, positions outside the cos/sin table)."""

import math

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as kvc

CANARY = 0xAB


def cos_sin_cache(max_pos=4096, theta=10000.0):
    inv_freq = theta ** (-torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=1)


def empty_cache(num_blocks, block_size, extra=0):
    return torch.full((num_blocks, block_size * kvc.RECORD_BYTES + extra), CANARY, dtype=torch.uint8)


def hand_worked_token():
    k = torch.zeros(512, dtype=torch.float32)
    k[0:64] = 1.0
    k[64:128] = torch.tensor([0.5, -3.0] * 32)
    k[128:192] = 0.0
    k[192:256] = -0.0
    k[256:448] = 448.0
    k[448:512] = 1.5
    return k.to(torch.bfloat16)


# (block values) -> expected (scale byte, NoPE bytes of the block) per encoding, worked by hand:
#   1.0:          OCP 1/448 -> e=-8, byte 119, 1*2^8=256=2^8 -> E=15 -> 0x78; FNUZ 1/224 -> e=-7, byte 120,
#                 128=2^7 -> E=15 -> 0x78
#   0.5, -3.0:    OCP 3/448 -> e=-7, byte 120: 64 -> 0x68, -384=-1.5*2^8 -> 0xFC; FNUZ e=-6, byte 121:
#                 32 -> 0x68, -192 -> 0xFC
#   0.0:          floor 1e-4: OCP e=-22 (byte 105), FNUZ e=-21 (106); bytes 0x00
#   -0.0:         OCP keeps the sign: 0x80; FNUZ has no -0: 0x00
#   448.0:        OCP e=0 (127), 448 -> 0x7E; FNUZ e=1 (128), 224 -> 0x7E
EXPECTED = {
    Fp8Format.OCP: ([119, 120, 105, 105, 127, 127, 127], [0x78] * 64 + [0x68, 0xFC] * 32 + [0x00] * 64 + [0x80] * 64 + [0x7E] * 192),
    Fp8Format.FNUZ: ([120, 121, 106, 106, 128, 128, 128], [0x78] * 64 + [0x68, 0xFC] * 32 + [0x00] * 64 + [0x00] * 64 + [0x7E] * 192),
}


@pytest.mark.parametrize("fmt,byte", [(Fp8Format.OCP, 247), (Fp8Format.FNUZ, 248)], ids=["ocp", "fnuz"])
def test_largest_scale_byte_from_finite_input(fmt, byte):
    """The top of the scale-byte range for finite bf16 input, from the encode rule of spec/kv_cache.md §8.1:
    bf16 max / 448 = 2^119.19, so e = 120 (byte 247) in OCP and e = 121 (248) in FNUZ. (The range line under
    §8.1, "derived", says 246 / 247: it takes e = 119, one short.) The dsv4ops CPU kernel writes the same."""
    k = torch.zeros(512, dtype=torch.bfloat16)
    k[:64] = torch.finfo(torch.bfloat16).max
    block_size = 2  # a 16-byte multiple of a block stride, as the op requires
    cache = empty_cache(1, block_size)
    kvc.quantize_and_insert_k_cache(k[None], cache, torch.tensor([0]), block_size, fmt)
    scales = cache[0, block_size * kvc.DATA_BYTES : block_size * kvc.DATA_BYTES + 7].tolist()
    assert scales == [byte] + [105 if fmt == Fp8Format.OCP else 106] * 6
    ours = empty_cache(1, block_size)
    dsv4ops.quantize_and_insert_k_cache(k[None], ours, torch.tensor([0]), block_size, fmt)
    assert torch.equal(ours, cache)


@pytest.mark.parametrize("fmt", [Fp8Format.OCP, Fp8Format.FNUZ], ids=["ocp", "fnuz"])
def test_hand_worked_record_and_layout(fmt):
    block_size, slot = 4, 5  # block 1, position 1
    cache = empty_cache(3, block_size, extra=40)  # stride(0) larger than bs * 584: padding untouched
    kvc.quantize_and_insert_k_cache(hand_worked_token()[None], cache, torch.tensor([slot]), block_size, fmt)
    scale_bytes, nope_bytes = EXPECTED[fmt]
    stride = cache.stride(0)
    flat = cache.view(-1)
    data_at = 1 * stride + 1 * kvc.DATA_BYTES
    scale_at = 1 * stride + block_size * kvc.DATA_BYTES + 1 * kvc.SCALE_BYTES
    assert flat[data_at : data_at + 448].tolist() == nope_bytes
    assert flat[data_at + 448 : data_at + 576].tolist() == [0xC0, 0x3F] * 64  # bf16 1.5 = 0x3FC0, little-endian
    assert flat[scale_at : scale_at + 8].tolist() == scale_bytes + [0]
    written = torch.zeros_like(flat, dtype=torch.bool)
    written[data_at : data_at + 576] = True
    written[scale_at : scale_at + 8] = True
    assert bool((flat[~written] == CANARY).all()), "bytes outside the record changed"
    # and it decodes back exactly (every value here is representable)
    out = torch.zeros(1, 8, 512, dtype=torch.bfloat16)
    kvc.dequantize_and_gather_k_cache(out, cache, torch.tensor([6]), torch.tensor([1]), torch.tensor([[0, 1]]),
                                      block_size, 2, fmt)
    assert torch.equal(out[0, 2].float(), hand_worked_token().float())
    assert bool((out[0, [0, 1, 3, 4, 5, 6, 7]] == 0).all())


def test_fnuz_and_ocp_records_of_the_same_input():
    """spec §7.2: identical NoPE bytes except negative zero, FNUZ scale bytes one higher, equal decodes."""
    torch.manual_seed(0)
    k = torch.cat([torch.randn(64, 512) * s for s in (1e-3, 1.0, 30.0, 1e4)]).to(torch.bfloat16)
    k[5, :64] = -0.0
    ocp_data, ocp_scales = kvc.quantize_kv_record(k, Fp8Format.OCP)
    fnuz_data, fnuz_scales = kvc.quantize_kv_record(k, Fp8Format.FNUZ)
    ocp_nope, fnuz_nope = ocp_data[:, :448], fnuz_data[:, :448]
    same = ocp_nope == fnuz_nope
    assert bool(((ocp_nope == 0x80) & (fnuz_nope == 0x00) | same).all())
    assert int((~same).sum()) > 0  # the negative-zero case occurred
    assert torch.equal(fnuz_scales[:, :7].int(), ocp_scales[:, :7].int() + 1)
    assert torch.equal(ocp_data[:, 448:], fnuz_data[:, 448:])
    assert torch.equal(kvc.dequantize_kv_record(ocp_data, ocp_scales, Fp8Format.OCP),
                       kvc.dequantize_kv_record(fnuz_data, fnuz_scales, Fp8Format.FNUZ))


@pytest.mark.parametrize("fmt", [Fp8Format.OCP, Fp8Format.FNUZ], ids=["ocp", "fnuz"])
def test_round_trip_error_bound(fmt):
    torch.manual_seed(1)
    k = (torch.randn(100, 512) * torch.logspace(-3, 3, 100)[:, None]).to(torch.bfloat16)
    data, scales = kvc.quantize_kv_record(k, fmt)
    back = kvc.dequantize_kv_record(data, scales, fmt).float()
    scale = torch.pow(2.0, scales[:, :7].float() - 127)  # [T, 7]
    err = (back[:, :448] - k[:, :448].float()).abs().reshape(-1, 7, 64).amax(dim=-1)
    # half a unit in the last place at the top binade: 16 (OCP, quantum 32 near 448) or 8 (FNUZ near 224)
    half_ulp_at_max = 16.0 if fmt is Fp8Format.OCP else 8.0
    assert bool((err <= half_ulp_at_max * scale).all())
    assert torch.equal(back[:, 448:], k[:, 448:].float())


def test_wrong_encoding_reads_off_by_two():
    torch.manual_seed(2)
    k = torch.randn(8, 512).to(torch.bfloat16)
    data, scales = kvc.quantize_kv_record(k, Fp8Format.OCP)
    right = kvc.dequantize_kv_record(data, scales, Fp8Format.OCP).float()[:, :448]
    wrong = kvc.dequantize_kv_record(data, scales, Fp8Format.FNUZ).float()[:, :448]
    nonzero = right != 0
    assert torch.allclose(wrong[nonzero] * 2, right[nonzero])


def test_non_finite_inputs():
    k = torch.ones(1, 512)
    k[0, 3] = float("nan")
    k[0, 70] = float("inf")
    data, scales = kvc.quantize_kv_record(k.to(torch.bfloat16), Fp8Format.OCP)
    assert scales[0, 0] == 119  # NaN ignored by the block amax
    assert data[0, 3] == 0xFE  # NaN stored as -quant_max
    assert scales[0, 1] == 255  # Inf poisons its block: E8M0 NaN scale ...
    assert data[0, 70] == 0xFE and data[0, 64] == 0x00  # ... Inf * 0 -> NaN -> -max; finite -> 0
    back = kvc.dequantize_kv_record(data, scales, Fp8Format.OCP).float()
    assert bool(torch.isnan(back[0, 64:128]).all()) and bool(torch.isfinite(back[0, 128:448]).all())


def test_slots_outside_the_cache_are_never_written():
    block_size, blocks = 16, 3
    capacity = block_size * blocks
    cache = empty_cache(blocks, block_size)
    k = torch.randn(6, 512).to(torch.bfloat16)
    slots = torch.tensor([-1, -2, capacity, 2**40, capacity - 1, -(2**40)])
    kvc.quantize_and_insert_k_cache(k, cache, slots, block_size, Fp8Format.OCP)
    flat = cache.view(-1)
    written = torch.zeros_like(flat, dtype=torch.bool)
    data_at, scale_at = kvc._record_addresses(torch.tensor(capacity - 1), block_size, cache.stride(0))
    written[int(data_at) : int(data_at) + 576] = True
    written[int(scale_at) : int(scale_at) + 8] = True
    assert bool((flat[~written] == CANARY).all())
    assert not bool((flat[written] == CANARY).all())


def test_qnorm_rope_kv_insert_q_path_and_pad_heads():
    torch.manual_seed(3)
    n, h, hp = 5, 3, 8
    cs = cos_sin_cache(64)
    q = torch.randn(n, h, 512).to(torch.bfloat16)
    kv = torch.randn(n, 512).to(torch.bfloat16)
    positions = torch.tensor([0, 1, 63, 64, -1])  # the last two lie outside the 64-row table
    cache = empty_cache(2, 16)
    q_out = kvc.qnorm_rope_kv_insert(q, kv, cache, torch.arange(n), positions, cs, hp, 1e-6, 16)
    assert q_out.shape == (n, hp, 512) and q_out.dtype == torch.bfloat16
    assert bool((q_out[:, h:] == 0).all()) and not bool(torch.signbit(q_out[:, h:].float()).any())
    # position 0 rotates by the identity: plain weightless RMSNorm, rounded once
    x = q[0].float()
    expected = (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(q_out[0, :h], expected)
    assert bool((q_out[3:] == 0).all())  # out-of-table positions: zero Q rows ...
    flat = cache.view(-1)
    for slot in (3, 4):  # ... and no KV record
        data_at, scale_at = kvc._record_addresses(torch.tensor(slot), 16, cache.stride(0))
        assert bool((flat[int(data_at) : int(data_at) + 576] == CANARY).all())
    for slot in (0, 1, 2):
        data_at, _ = kvc._record_addresses(torch.tensor(slot), 16, cache.stride(0))
        assert not bool((flat[int(data_at) : int(data_at) + 576] == CANARY).all())


def test_kv_insert_matches_unfused_path():
    """The fused reference's KV = RoPE in fp32, bf16 round, then quantize_and_insert (spec §9.5)."""
    torch.manual_seed(4)
    n, bs = 33, 16
    cs = cos_sin_cache()
    kv = torch.randn(n, 512).to(torch.bfloat16)
    positions = torch.arange(100, 100 + n)
    fused = torch.zeros(3, bs * kvc.RECORD_BYTES, dtype=torch.uint8)
    kvc.qnorm_rope_kv_insert(torch.randn(n, 1, 512).to(torch.bfloat16), kv, fused, torch.arange(n), positions, cs,
                             8, 1e-6, bs, fp8_format=Fp8Format.FNUZ)
    unfused = torch.zeros_like(fused)
    k = kvc.rope_gptj(kv, positions, cs).to(torch.bfloat16)
    kvc.quantize_and_insert_k_cache(k, unfused, torch.arange(n), bs, Fp8Format.FNUZ)
    assert torch.equal(fused, unfused)
    # the KV-only op writes the same cache
    kv_only = torch.zeros_like(fused)
    kvc.kv_rope_quant_insert(kv, kv_only, torch.arange(n), positions, cs, bs, Fp8Format.FNUZ)
    assert torch.equal(kv_only, fused)


def test_rope_inverse_undoes_forward():
    torch.manual_seed(5)
    cs = cos_sin_cache()
    x = torch.randn(7, 4, 512)
    positions = torch.tensor([0, 5, 100, 4095, 17, 3, 999])
    back = kvc.rope_gptj(kvc.rope_gptj(x, positions, cs), positions, cs, inverse=True)
    torch.testing.assert_close(back, x, atol=1e-5, rtol=1e-5)
    assert torch.equal(kvc.rope_gptj(x, torch.zeros(7, dtype=torch.long), cs), x)  # position 0: identity


def test_gather_last_tokens_with_offset_and_bad_blocks():
    torch.manual_seed(6)
    bs = 4
    cache = torch.zeros(6, bs * kvc.RECORD_BYTES, dtype=torch.uint8)
    k = torch.randn(24, 512).to(torch.bfloat16)
    kvc.quantize_and_insert_k_cache(k, cache, torch.arange(24), bs, Fp8Format.OCP)
    decoded_all = kvc.dequantize_kv_record(*kvc.quantize_kv_record(k, Fp8Format.OCP), Fp8Format.OCP)
    block_table = torch.tensor([[2, 0, 5], [1, 99, -3]])  # request 1 has blocks outside the cache
    out = torch.full((2, 10, 512), 7.0, dtype=torch.bfloat16)
    kvc.dequantize_and_gather_k_cache(out, cache, torch.tensor([10, 12]), torch.tensor([3, 8]), block_table, bs, 1,
                                      Fp8Format.OCP)
    # request 0: logical 7, 8, 9 -> blocks table[1]=0 (pos 3), table[2]=5 (pos 0, 1) -> slots 3, 20, 21
    assert torch.equal(out[0, 1:4], decoded_all[[3, 20, 21]])
    assert bool((out[0, [0, 4, 5, 6, 7, 8, 9]] == 7.0).all())
    # request 1: logical 4..11 -> table[1]=99 (outside) and table[2]=-3: zero rows, never read
    assert bool((out[1, 1:9] == 0).all()) and bool((out[1, [0, 9]] == 7.0).all())


def test_full_cache_variants():
    torch.manual_seed(7)
    n, h, bs = 17, 8, 16
    cs = cos_sin_cache()
    q = torch.randn(n, h, 512).to(torch.bfloat16)
    kv = torch.randn(n, 512).to(torch.bfloat16)
    positions = torch.arange(n)
    q_expected = kvc.qnorm_rope(q, positions, cs, 1e-6).to(torch.bfloat16)
    k_expected = kvc.kv_rope(kv, positions, cs)
    cache = torch.zeros(2, bs, 512, dtype=torch.bfloat16)
    q_inplace = q.clone()
    kvc.qnorm_rope_kv_insert_full_cache_bf16(q_inplace, kv, cache, torch.arange(n), positions, cs, 1e-6, bs)
    assert torch.equal(q_inplace, q_expected)
    assert torch.equal(cache.view(-1, 512)[:n], k_expected.to(torch.bfloat16))
    for fmt in (Fp8Format.OCP, Fp8Format.FNUZ):
        q_fp8 = torch.empty(n, h, 512, dtype=torch.float8_e4m3fn)
        fcache = torch.zeros(2, bs, 512, dtype=torch.float8_e4m3fn)
        one = torch.ones(1)
        kvc.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, fcache, torch.arange(n), positions, cs, one, one,
                                                1e-6, bs, fp8_format=fmt)
        qmax = fmt.default_quant_max
        expected_q = kvc.qnorm_rope(q, positions, cs, 1e-6).clamp(-qmax, qmax).to(fmt.torch_dtype)
        assert torch.equal(q_fp8.view(torch.uint8), expected_q.view(torch.uint8))
        expected_k = k_expected.clamp(-qmax, qmax).to(fmt.torch_dtype)
        assert torch.equal(fcache.view(torch.uint8).view(-1, 512)[:n], expected_k.view(torch.uint8))


def test_kv_norm_variant():
    torch.manual_seed(8)
    cs = cos_sin_cache()
    kv = torch.randn(9, 512).to(torch.bfloat16)
    weight = torch.rand(512).to(torch.bfloat16)
    positions = torch.arange(9)
    a = torch.zeros(1, 16 * kvc.RECORD_BYTES, dtype=torch.uint8)
    kvc.kv_norm_rope_quant_insert(kv, weight, a, torch.arange(9), positions, cs, 1e-6, 16)
    x = kv.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(torch.bfloat16)
    b = torch.zeros_like(a)
    kvc.kv_rope_quant_insert(normed, b, torch.arange(9), positions, cs, 16)
    assert torch.equal(a, b)


def test_global_topk_indices():
    topk = torch.tensor([[0, 5, -1], [3, -1, -1]], dtype=torch.int32)
    block_table = torch.tensor([[7, 2], [4, 9]])
    idx, lens = kvc.compute_global_topk_indices_and_lens(topk, torch.tensor([0, 1]), block_table, 4,
                                                         torch.tensor([True, False]))
    assert idx.tolist() == [[28, 9, -1], [19, -1, -1]] and idx.dtype == torch.int32
    assert lens.tolist() == [2, 0]
    # Local index 9 lies in column 2 of a 2-column table: no slot (a clamped column would give 9 = 2 * 4 + 1).
    idx, lens = kvc.compute_global_topk_indices_and_lens(torch.tensor([[9, 1, -1]]), torch.tensor([0]),
                                                         torch.tensor([[7, 2]]), 4, torch.tensor([True]))
    assert idx.tolist() == [[-1, 29, -1]] and lens.tolist() == [2]
    # A table of no columns: no slot at all (lens still counts the valid local indices, as the spec defines it).
    idx, lens = kvc.compute_global_topk_indices_and_lens(torch.tensor([[9, 1, -1]]), torch.tensor([0]),
                                                         torch.zeros(1, 0, dtype=torch.int32), 4, torch.tensor([True]))
    assert idx.tolist() == [[-1, -1, -1]] and lens.tolist() == [2]


def test_cache_geometry_checks():
    with pytest.raises(ValueError, match="cannot hold 16 records"):
        kvc.quantize_and_insert_k_cache(torch.zeros(1, 512, dtype=torch.bfloat16),
                                        torch.zeros(2, 16 * 584 - 1, dtype=torch.uint8), torch.tensor([0]), 16, 0)
    with pytest.raises(ValueError, match="block_size must be positive"):
        kvc.quantize_and_insert_k_cache(torch.zeros(1, 512, dtype=torch.bfloat16),
                                        torch.zeros(2, 584, dtype=torch.uint8), torch.tensor([0]), 0, 0)
    assert math.isclose(kvc.KV_AMAX_FLOOR, 1e-4)


def test_rope_is_a_complex_rotation():
    """Independent statement of GPT-J RoPE: pair (e, o) as e + i*o times cos + i*sin."""
    torch.manual_seed(9)
    cs = cos_sin_cache()
    x = torch.randn(6, 512, dtype=torch.float32)
    positions = torch.tensor([1, 2, 3, 500, 4000, 77])
    pairs = torch.view_as_complex(x[:, 448:].reshape(6, 32, 2).contiguous())
    rotation = torch.polar(torch.ones(6, 32), torch.atan2(cs[positions, 32:], cs[positions, :32]))
    expected = torch.view_as_real(pairs * rotation).reshape(6, 64)
    torch.testing.assert_close(kvc.rope_gptj(x, positions, cs)[:, 448:], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(kvc.rope_gptj(x, positions, cs)[:, :448], x[:, :448])


def test_combine_topk_swa_indices_hand_worked():
    # request 0: seq_len 10, 2 query tokens (positions 8, 9), gathered 5 SWA tokens (gather_start 5);
    # request 1: seq_len 3, 1 query token (position 2), gathered 3 (gather_start 0). Window 4, ratio 4,
    # topk 2, M = 100 rows per request, N = 10 compressed rows first.
    topk = torch.tensor([[7, 3, 9], [1, 0, 2], [5, 6, 8]], dtype=torch.int32)
    idx, lens = kvc.combine_topk_swa_indices(topk, torch.tensor([4, 6, 7]), torch.tensor([10, 3]),
                                             torch.tensor([5, 3]), window_size=4, compress_ratio=4, topk=2, M=100,
                                             N=10)
    assert idx.shape == (3, 128) and idx.dtype == torch.int32
    # token 0: pos 8 -> topk_len min(9 // 4, 2) = 2, swa_len 4: SWA positions 5..8 -> rows 0..3 after N
    assert idx[0, :6].tolist() == [7, 3, 10, 11, 12, 13] and bool((idx[0, 6:] == -1).all())
    # token 1: pos 9 -> topk 2, SWA positions 6..9 -> rows 1..4
    assert idx[1, :6].tolist() == [1, 0, 11, 12, 13, 14]
    # token 2 (request 1): pos 2 -> topk_len 3 // 4 = 0, swa_len 3: positions 0..2 -> 100 + 10 + 0..2
    assert idx[2, :3].tolist() == [110, 111, 112] and bool((idx[2, 3:] == -1).all())
    assert lens.tolist() == [6, 6, 3]
    # SWA-only layer: no top-k part
    idx, lens = kvc.combine_topk_swa_indices(topk, torch.tensor([0, 2, 3]), torch.tensor([10, 3]),
                                             torch.tensor([5, 3]), 4, 1, 0, 100, 0)
    assert idx[0, :4].tolist() == [0, 1, 2, 3] and lens.tolist() == [4, 4, 3]
