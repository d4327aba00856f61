"""dsv4.qnorm_rope_kv_insert (+ .out): the upstream test matrix of spec/kv_cache.md §10 (Q path, KV path,
DP padding, combined; the full-cache rows are in test_kv_insert_variants.py), in both encodings on every
device, plus the guards, the caller-owned output, invalid inputs, opcheck, torch.compile and graph capture.

Q: within rtol = atol = 1e-2 of the reference, pad heads exactly +0. KV: stricter than §10 (which allows
1 bf16 ULP on the RoPE tail): the kernels round each product of the rotation on its own like the
reference, so the whole cache is byte-identical; §10's decoded parity rule and the bound of the NoPE
error (half an FP8 ULP at the block maximum) are checked as well."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as reference

from conftest import DEVICES, FORMATS, assert_bits_equal, assert_bytes_equal, capture_graph

HEAD_PAIRS = [(1, 8), (8, 8), (8, 16), (16, 16), (16, 32), (32, 32), (8, 64), (64, 64), (64, 128)]
PAIR_IDS = [f"H{h}-Hp{hp}" for h, hp in HEAD_PAIRS]
EPS = 1e-6
_COS_SIN = {}


def cos_sin_cache(max_pos=4096):
    if max_pos not in _COS_SIN:
        inv_freq = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float32) / 64)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        _COS_SIN[max_pos] = torch.cat([freqs.cos(), freqs.sin()], dim=1)
    return _COS_SIN[max_pos]


def inputs(n, h, seed, device):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, 512, generator=g).to(torch.bfloat16)
    kv = torch.randn(n, 512, generator=g).to(torch.bfloat16)
    return q, kv


def run_op(q, kv, cache, slots, positions, hp, bs, fmt, device, apply_q_norm=True):
    return torch.ops.dsv4.qnorm_rope_kv_insert(
        q.to(device), kv.to(device), cache, slots.to(device), positions.to(device), cos_sin_cache().to(device), hp,
        EPS, bs, apply_q_norm, int(fmt), fmt.default_quant_max)


def bf16_ulp_distance(a, b):
    def monotone(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (monotone(a) - monotone(b)).abs()


def assert_q_close(q_out, q_ref, h):
    q_out = q_out.cpu()
    torch.testing.assert_close(q_out[:, :h].float(), q_ref[:, :h].float(), rtol=1e-2, atol=1e-2)
    pad = q_out[:, h:]
    assert bool((pad.view(torch.int16) == 0).all()), "pad heads must be +0"


def decode_cache(cache, n, bs, fmt):
    blocks = cache.shape[0]
    out = torch.zeros(1, n, 512, dtype=torch.bfloat16)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    reference.dequantize_and_gather_k_cache(out, cache.cpu(), torch.tensor([n], dtype=torch.int32), None, table, bs,
                                            0, fmt)
    return out[0]


def assert_kv_parity(cache, expected_cache, n, bs, fmt):
    got, want = decode_cache(cache, n, bs, fmt), decode_cache(expected_cache, n, bs, fmt)
    assert_bits_equal(got[:, :448], want[:, :448])
    assert int(bf16_ulp_distance(got[:, 448:], want[:, 448:]).max()) <= 1
    assert_bytes_equal(cache.cpu(), expected_cache.cpu())


def reference_run(q, kv, slots, positions, hp, bs, fmt, blocks, apply_q_norm=True):
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8)
    q_out = reference.qnorm_rope_kv_insert(q, kv, cache, slots, positions, cos_sin_cache(), hp, EPS, bs, apply_q_norm,
                                           fmt, fmt.default_quant_max)
    return q_out, cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h,hp", HEAD_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("n", [1, 4, 17, 64, 2048])
def test_q_path_matches_reference(device, h, hp, n):
    q, kv = inputs(n, h, seed=0, device=device)
    positions = torch.arange(n)
    slots = torch.full((n,), -1, dtype=torch.long)
    cache = torch.zeros(2, 16 * 584, dtype=torch.uint8, device=device)
    q_out = run_op(q, kv, cache, slots, positions, hp, 16, Fp8Format.OCP, device)
    assert q_out.shape == (n, hp, 512) and q_out.dtype == torch.bfloat16
    q_ref, _ = reference_run(q, kv, slots, positions, hp, 16, Fp8Format.OCP, 2)
    assert_q_close(q_out, q_ref, h)
    assert bool((cache == 0).all()), "no slot was valid: the cache must be untouched"


@pytest.mark.parametrize("device", DEVICES)
def test_row_strided_kv_is_read_at_its_stride(device):
    """kv rows at a 16-byte aligned stride wider than 512 (a slice of a fused projection's output) are read as
    they lie, by the main op and by the full-cache bf16 variant: the same bytes as a contiguous copy."""
    n, h, bs = 9, 2, 16
    q, kv = inputs(n, h, seed=59, device="cpu")
    wide = torch.randn(n, 576).to(torch.bfloat16)
    wide[:, :512] = kv
    strided = wide.to(device)[:, :512]  # .to() of the view itself would copy it contiguous
    assert not strided.is_contiguous() and strided.stride(0) == 576
    positions, slots = torch.arange(n), torch.arange(n)
    caches = [torch.zeros(2, bs * 584, dtype=torch.uint8, device=device) for _ in range(2)]
    q_out = [run_op(q, rows, cache, slots, positions, h, bs, Fp8Format.OCP, device)
             for rows, cache in ((strided, caches[0]), (kv, caches[1]))]
    assert_bits_equal(q_out[0].cpu(), q_out[1].cpu())
    assert_bytes_equal(caches[0].cpu(), caches[1].cpu())
    plain = [torch.zeros(1, bs, 512, dtype=torch.bfloat16, device=device) for _ in range(2)]
    for rows, cache in ((strided, plain[0]), (kv.to(device), plain[1])):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q.clone().to(device), rows, cache, slots.to(device),
                                                            positions.to(device), cos_sin_cache().to(device), EPS,
                                                            bs, True)
    assert_bits_equal(plain[0].cpu(), plain[1].cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("n", [1, 4, 17, 64, 2048])
def test_kv_path_matches_reference(device, fmt, bs, n):
    q, kv = inputs(n, 1, seed=1, device=device)
    positions = torch.arange(n)
    slots = torch.arange(n)
    blocks = -(-n // bs) + 1
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8, device=device)
    run_op(q, kv, cache, slots, positions, 64, bs, fmt, device)
    _, expected = reference_run(q, kv, slots, positions, 64, bs, fmt, blocks)
    assert_kv_parity(cache, expected, n, bs, fmt)
    # half an FP8 ULP at the block maximum: 16 (OCP, quantum 32 near 448) or 8 (FNUZ near 224) times the scale
    exact = reference.rope_gptj(kv, positions, cos_sin_cache()).to(torch.bfloat16).float()
    decoded = decode_cache(cache, n, bs, fmt).float()
    scale_bytes = cache.cpu().view(blocks, -1)[:, bs * 576 :].reshape(-1, 8)[:n, :7].float()
    bound = (16.0 if fmt is Fp8Format.OCP else 8.0) * torch.pow(2.0, scale_bytes - 127)
    err = (decoded[:, :448] - exact[:, :448]).abs().reshape(n, 7, 64).amax(dim=-1)
    assert bool((err <= bound).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("pad", [1, 5])
@pytest.mark.parametrize("n", [4, 17, 2048])
def test_kv_path_with_dp_padding(device, fmt, bs, pad, n):
    q, kv = inputs(n + pad, 1, seed=2, device=device)
    positions = torch.arange(n + pad)
    slots = torch.arange(n)
    blocks = -(-n // bs) + 1
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8, device=device)
    q_out = run_op(q, kv, cache, slots, positions, 8, bs, fmt, device)
    assert q_out.shape == (n + pad, 8, 512)
    _, expected = reference_run(q[:n], kv[:n], slots, positions[:n], 8, bs, fmt, blocks)
    assert_kv_parity(cache, expected, n, bs, fmt)
    q_ref, _ = reference_run(q, kv, slots, positions, 8, bs, fmt, blocks)
    assert_q_close(q_out, q_ref, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("h,hp", HEAD_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("n", [1, 4, 17, 2048])
def test_combined_q_and_kv(device, fmt, bs, h, hp, n):
    q, kv = inputs(n, h, seed=3, device=device)
    positions = torch.arange(n)
    slots = torch.arange(n)
    blocks = -(-n // bs) + 1
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8, device=device)
    q_out = run_op(q, kv, cache, slots, positions, hp, bs, fmt, device)
    q_ref, expected = reference_run(q, kv, slots, positions, hp, bs, fmt, blocks)
    assert_q_close(q_out, q_ref, h)
    assert_kv_parity(cache, expected, n, bs, fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_cos_sin_table_off_16_byte_boundary(device, fmt):
    """A contiguous table starting 4 bytes past an aligned address (the kernels then read it with 4-byte
    loads) gives the same bytes as the aligned table."""
    n, h, hp, bs = 37, 8, 16, 16
    q, kv = inputs(n, h, seed=11, device=device)
    positions = torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(12))
    slots = torch.randperm(2 * 3 * bs, generator=torch.Generator().manual_seed(13))[:n]
    table = cos_sin_cache().to(device)
    storage = torch.empty(table.numel() + 1, dtype=torch.float32, device=device)
    shifted = storage[1:].view(table.shape)
    shifted.copy_(table)
    assert shifted.data_ptr() % 16 != 0 and shifted.is_contiguous()
    outputs = []
    for cos_sin in (table, shifted):
        cache = torch.zeros(6, bs * 584, dtype=torch.uint8, device=device)
        q_out = torch.ops.dsv4.qnorm_rope_kv_insert(q.to(device), kv.to(device), cache, slots.to(device),
                                                    positions.to(device), cos_sin, hp, EPS, bs, True, int(fmt),
                                                    fmt.default_quant_max)
        outputs.append((q_out.cpu(), cache.cpu()))
    assert_bits_equal(outputs[1][0], outputs[0][0])
    assert_bytes_equal(outputs[1][1], outputs[0][1])
    q_ref, expected = reference_run(q, kv, slots, positions, hp, bs, fmt, 6)
    assert_q_close(outputs[0][0], q_ref, h)
    assert_bytes_equal(outputs[0][1], expected)


@pytest.mark.parametrize("device", DEVICES)
def test_q_norm_eps_is_applied(device):
    """Rows whose mean square is near eps (x 1e-3: about 1e-6 against eps = 1e-6, where dropping eps changes a
    value by about sqrt(2)) and an all-zero row (0 with eps, NaN without): eps is the argument's, not a
    constant of the kernel, and the zero row stays finite."""
    n, h, hp, bs = 6, 4, 4, 16
    q, kv = inputs(n, h, seed=12, device=device)
    q = (q.float() * 1e-3).to(torch.bfloat16)
    q[2] = 0
    positions, slots = torch.arange(n), torch.arange(n)
    for eps in (1e-6, 1e-5):
        cache = torch.zeros(1, bs * 584, dtype=torch.uint8, device=device)
        q_out = torch.ops.dsv4.qnorm_rope_kv_insert(
            q.to(device), kv.to(device), cache, slots.to(device), positions.to(device), cos_sin_cache().to(device), hp,
            eps, bs, True, 0, 448.0)
        expected_cache = torch.zeros(1, bs * 584, dtype=torch.uint8)
        q_ref = reference.qnorm_rope_kv_insert(q, kv, expected_cache, slots, positions, cos_sin_cache(), hp, eps, bs,
                                               True, Fp8Format.OCP)
        assert_q_close(q_out, q_ref, h)
        assert bool(torch.isfinite(q_out.cpu().float()).all())
        assert bool((q_out[2].cpu().float() == 0).all()), "an all-zero row normalizes to zero"
    no_eps = (q.float() / torch.sqrt((q.float() ** 2).mean(-1, keepdim=True))).to(torch.bfloat16)
    assert not torch.allclose(q_ref[[0, 1, 3, 4, 5], :h, :448].float(), no_eps[[0, 1, 3, 4, 5], :, :448].float(),
                              rtol=1e-2, atol=1e-2), "these rows must make eps matter"


@pytest.mark.parametrize("device", DEVICES)
def test_guards_no_norm_and_out_of_table_positions(device):
    n, h, hp, bs = 9, 4, 8, 16
    q, kv = inputs(n, h, seed=4, device=device)
    positions = torch.tensor([0, 1, 2, 4095, 4096, -1, 7, 8, 2**40])  # 4096, -1 and 2^40 are outside the table
    slots = torch.tensor([0, -2, 40, 3, 4, 5, 2**40, 7])  # N_ins = 8; slot 40 is past 2 blocks of 16
    for apply_q_norm in (True, False):
        cache = torch.full((2, bs * 584), 0xAB, dtype=torch.uint8, device=device)  # fresh: the KV write is checked
        q_out = run_op(q, kv, cache, slots, positions, hp, bs, Fp8Format.OCP, device, apply_q_norm)
        expected_cache = torch.full((2, bs * 584), 0xAB, dtype=torch.uint8)
        q_ref = reference.qnorm_rope_kv_insert(q, kv, expected_cache, slots, positions, cos_sin_cache(), hp, EPS, bs,
                                               apply_q_norm, Fp8Format.OCP)
        assert_q_close(q_out, q_ref, h)
        assert bool((q_out[[4, 5, 8]].cpu().view(torch.int16) == 0).all())
        assert_bytes_equal(cache.cpu(), expected_cache)  # records, and the 0xAB canaries everywhere else


OUTSIDE = 0xA5  # canary byte of the memory around the cache and around q_out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("op", ["qnorm_rope_kv_insert_out", "kv_rope_quant_insert", "kv_norm_rope_quant_insert"])
def test_capacity_edge_slots_and_canaries_around_cache(device, fmt, op):
    """spec §11 and the reference's contract: negative slots, slots at or beyond the capacity
    (size(0) * bs) and positions outside [0, P) of the cos/sin table are skipped, and nothing outside
    k_cache (or q_out) is written. The cache is a [3, bs*584] view, block stride padded by 64 bytes, in
    the middle of a buffer with a whole block of 0xA5 canary before and after it (and 0xA5 in the
    padding between blocks); its own bytes start random, so an untouched record is checked to be
    unchanged. Slot 48 (= capacity) and 53 name records inside the trailing canary block."""
    bs, blocks, pad = 16, 3, 64
    block_bytes = bs * 584
    stride = block_bytes + pad
    capacity = blocks * bs  # 48
    slots = torch.tensor([0, -1, 5, -2, capacity - 1, capacity, 17, capacity + 5, 2**40, 30, 31, 9, 20, 33, 40, 2])
    positions = torch.tensor([3, 7, 4095, 11, 100, 12, 4096, 13, 14, -1, 2000, -7, 0, 4096, 1, 63])
    n, h, hp = slots.shape[0], 4, 8
    written = (slots >= 0) & (slots < capacity) & (positions >= 0) & (positions < 4096)
    skipped_in_cache = (slots >= 0) & (slots < capacity) & ~written  # valid slots with out-of-table positions
    assert int(written.sum()) == 7 and int(skipped_in_cache.sum()) == 4
    assert len(set(slots[(slots >= 0) & (slots < capacity)].tolist())) == int(((slots >= 0) & (slots < capacity)).sum())

    q, kv = inputs(n, h, seed=14, device=device)
    g = torch.Generator().manual_seed(15)
    weight = (torch.rand(512, generator=g) * 2).to(torch.bfloat16)
    if op == "kv_norm_rope_quant_insert":  # exact sums of squares: the norm factor does not depend on the order
        kv = (torch.randint(-32, 33, (n, 512), generator=g).float() / 8).to(torch.bfloat16)

    def prepare():
        buffer = torch.full((blocks + 2, stride), OUTSIDE, dtype=torch.uint8)
        buffer[1 : blocks + 1, :block_bytes] = torch.randint(0, 256, (blocks, block_bytes), dtype=torch.uint8,
                                                             generator=torch.Generator().manual_seed(16))
        return buffer

    def cache_of(buffer):
        return buffer[1 : blocks + 1, :block_bytes]  # stride (stride, 1): a view into the middle of the buffer

    inside = torch.zeros(blocks + 2, stride, dtype=torch.bool)
    cache_of(inside).fill_(True)
    initial = prepare()

    buffer = prepare().to(device)
    cache = cache_of(buffer)
    assert cache.stride() == (stride, 1) and cache.storage_offset() == stride and cache.data_ptr() % 16 == 0
    expected_buffer = prepare()
    expected_cache = cache_of(expected_buffer)
    cs = cos_sin_cache().to(device)
    d = lambda t: t.to(device)  # noqa: E731
    if op == "qnorm_rope_kv_insert_out":
        q_buffer = torch.full(((n + 2) * hp * 512,), OUTSIDE * 0x0101 - 0x10000, dtype=torch.int16)
        q_buffer = q_buffer.view(torch.bfloat16).to(device)
        q_out = q_buffer[hp * 512 : (n + 1) * hp * 512].view(n, hp, 512)
        torch.ops.dsv4.qnorm_rope_kv_insert.out(d(q), d(kv), cache, d(slots), d(positions), cs, hp, EPS, bs, True,
                                                int(fmt), fmt.default_quant_max, q_out=q_out)
        q_ref = reference.qnorm_rope_kv_insert(q, kv, expected_cache, slots, positions, cos_sin_cache(), hp, EPS, bs,
                                               True, fmt, fmt.default_quant_max)
        assert_q_close(q_out, q_ref, h)
        outside_rows = (positions < 0) | (positions >= 4096)
        assert bool((q_out[outside_rows].cpu().view(torch.int16) == 0).all()), "out-of-table positions: Q row +0"
        q_all = q_buffer.cpu().view(torch.uint8)
        row_bytes = hp * 512 * 2
        assert bool((q_all[:row_bytes] == OUTSIDE).all()) and bool((q_all[(n + 1) * row_bytes :] == OUTSIDE).all()), \
            "a byte outside q_out changed"
    elif op == "kv_rope_quant_insert":
        torch.ops.dsv4.kv_rope_quant_insert(d(kv), cache, d(slots), d(positions), cs, bs, int(fmt),
                                            fmt.default_quant_max)
        reference.kv_rope_quant_insert(kv, expected_cache, slots, positions, cos_sin_cache(), bs, fmt,
                                       fmt.default_quant_max)
    else:
        torch.ops.dsv4.kv_norm_rope_quant_insert(d(kv), d(weight), cache, d(slots), d(positions), cs, EPS, bs, int(fmt),
                                                 fmt.default_quant_max)
        reference.kv_norm_rope_quant_insert(kv, weight, expected_cache, slots, positions, cos_sin_cache(), EPS, bs,
                                            fmt, fmt.default_quant_max)

    got = buffer.cpu()
    assert bool((got[~inside] == OUTSIDE).all()), \
        f"{int((got[~inside] != OUTSIDE).sum())} canary bytes outside k_cache changed"
    assert bool((expected_buffer[~inside] == OUTSIDE).all())
    assert_kv_parity(cache_of(got), expected_cache, capacity, bs, fmt)
    assert_bytes_equal(got, expected_buffer)  # the records, the untouched random bytes and the canaries

    def record(buf, slot):
        block, pos = slot // bs, slot % bs
        row = cache_of(buf)[block]
        return torch.cat([row[pos * 576 : (pos + 1) * 576], row[bs * 576 + pos * 8 : bs * 576 + (pos + 1) * 8]])

    for slot in slots[skipped_in_cache].tolist():
        assert torch.equal(record(got, slot), record(initial, slot)), f"skipped slot {slot}'s record changed"
    for slot in slots[written].tolist():
        assert not torch.equal(record(got, slot), record(initial, slot)), f"slot {slot} was not written"
    # the records that slots capacity and capacity + 5 would name lie in the trailing canary block
    tail = got[blocks + 1, :block_bytes]
    for slot in (capacity, capacity + 5):
        pos = slot % bs
        assert bool((tail[pos * 576 : (pos + 1) * 576] == OUTSIDE).all())
        assert bool((tail[bs * 576 + pos * 8 : bs * 576 + (pos + 1) * 8] == OUTSIDE).all())


@pytest.mark.parametrize("device", DEVICES)
def test_out_form_and_in_place(device):
    n, h, bs = 6, 8, 16
    q, kv = inputs(n, h, seed=5, device=device)
    positions, slots = torch.arange(n), torch.arange(n)
    args = lambda cache: (q.to(device), kv.to(device), cache, slots.to(device), positions.to(device),  # noqa: E731
                          cos_sin_cache().to(device))
    cache_a = torch.zeros(2, bs * 584, dtype=torch.uint8, device=device)
    allocated = torch.ops.dsv4.qnorm_rope_kv_insert(*args(cache_a), 16, EPS, bs, True, 0, 448.0)
    cache_b = torch.zeros_like(cache_a)
    q_out = torch.full((n, 16, 512), 3.0, dtype=torch.bfloat16, device=device)
    torch.ops.dsv4.qnorm_rope_kv_insert.out(*args(cache_b), 16, EPS, bs, True, 0, 448.0, q_out=q_out)
    assert_bits_equal(q_out.cpu(), allocated.cpu())
    assert torch.equal(cache_a.cpu(), cache_b.cpu())
    in_place = q.clone().to(device)
    cache_c = torch.zeros_like(cache_a)
    torch.ops.dsv4.qnorm_rope_kv_insert.out(in_place, kv.to(device), cache_c, slots.to(device), positions.to(device),
                                            cos_sin_cache().to(device), h, EPS, bs, True, 0, 448.0, q_out=in_place)
    assert_bits_equal(in_place.cpu(), allocated[:, :h].cpu())
    with pytest.raises(RuntimeError, match="may alias q_in only exactly and only when q_head_padded equals"):
        padded_alias = torch.zeros(n, 16, 512, dtype=torch.bfloat16, device=device)
        overlapping_q = padded_alias.view(-1)[: n * h * 512].view(n, h, 512)  # contiguous, shares q_out's memory
        torch.ops.dsv4.qnorm_rope_kv_insert.out(overlapping_q, kv.to(device), cache_c, slots.to(device),
                                                positions.to(device), cos_sin_cache().to(device), 16, EPS, bs, True,
                                                0, 448.0, q_out=padded_alias)
    wrapped = dsv4ops.qnorm_rope_kv_insert(q.to(device), kv.to(device), torch.zeros_like(cache_a), slots.to(device),
                                           positions.to(device).int(), cos_sin_cache().to(device), 16,
                                           cache_block_size=bs, fp8_format="ocp")
    assert_bits_equal(wrapped.cpu(), allocated.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    out = torch.ops.dsv4.qnorm_rope_kv_insert(
        torch.empty(0, 4, 512, dtype=torch.bfloat16, device=device), torch.empty(0, 512, dtype=torch.bfloat16, device=device),
        torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device), torch.empty(0, dtype=torch.long, device=device),
        torch.empty(0, dtype=torch.long, device=device), cos_sin_cache(16).to(device), 8, EPS, 16, True, 1, 224.0)
    assert out.shape == (0, 8, 512)


Q = torch.zeros(3, 2, 512, dtype=torch.bfloat16)
KV = torch.zeros(3, 512, dtype=torch.bfloat16)
C = torch.zeros(2, 16 * 584, dtype=torch.uint8)
S = torch.arange(3)
P = torch.arange(3)
CS = torch.zeros(16, 64)


def _args(**over):
    base = dict(q_in=Q, kv=KV, k_cache=C, slot_mapping=S, position_ids=P, cos_sin_cache=CS, q_head_padded=8,
                eps=EPS, cache_block_size=16, apply_q_norm=True, fp8_format=0, quant_max=448.0)
    base.update(over)
    return tuple(base.values())


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(q_in=Q.float()), "q_in must have dtype bfloat16, got float32"),
        (dict(q_in=Q[:, :, :256]), r"q_in must have shape \[tokens, heads, 512\]"),
        (dict(kv=KV[:2]), "kv must have 3 rows"),
        (dict(q_head_padded=1), "q_head_padded must be >= the 2 heads"),
        (dict(position_ids=P.int()), "position_ids must have dtype int64, got int32"),
        (dict(position_ids=P[:2]), "position_ids must have 3 entries, got 2"),
        (dict(slot_mapping=torch.arange(4)), "slot_mapping has 4 entries for 3 tokens"),
        (dict(cos_sin_cache=CS[:, :32]), r"cos_sin_cache must have shape \[positions, 64\]"),
        (dict(cos_sin_cache=CS.double()), "cos_sin_cache must have dtype float32"),
        (dict(cache_block_size=0), r"cache_block_size must be in \[1, 2\^31 - 1\]"),
        (dict(eps=float("nan")), "eps must be finite"),
        (dict(fp8_format=1, quant_max=300.0), r"quant_max must be in \(0, 240\]"),
        (dict(q_in=Q.transpose(0, 1)), "must have shape|must be contiguous"),
        (dict(slot_mapping=C.view(-1)[:24].view(torch.int64)), "slot_mapping must not overlap k_cache"),
        (dict(cos_sin_cache=C.view(-1)[: 16 * 64 * 4].view(torch.float32).view(16, 64)),
         "cos_sin_cache must not overlap k_cache"),
    ],
)
def test_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.qnorm_rope_kv_insert(*_args(**over))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, kv = inputs(5, 2, seed=6, device=device)
    cs = cos_sin_cache(64).to(device)
    cache = torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device)
    args = (q.to(device), kv.to(device), cache, torch.arange(5, device=device), torch.arange(5, device=device), cs, 8,
            EPS, 16, True, 1, 224.0)
    torch.library.opcheck(torch.ops.dsv4.qnorm_rope_kv_insert.default, args)
    torch.library.opcheck(torch.ops.dsv4.qnorm_rope_kv_insert.out, args,
                          {"q_out": torch.empty(5, 8, 512, dtype=torch.bfloat16, device=device)})


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    q, kv = inputs(7, 4, seed=7, device=device)
    cs = cos_sin_cache(64).to(device)

    def f(q, kv, cache, slots, positions):
        return torch.ops.dsv4.qnorm_rope_kv_insert(q * 1, kv, cache, slots, positions, cs, 8, EPS, 16, True, 0, 448.0)

    make = lambda: (q.to(device), kv.to(device), torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device),  # noqa: E731
                    torch.arange(7, device=device), torch.arange(7, device=device))
    a, b = make(), make()
    assert_bits_equal(torch.compile(f, fullgraph=True)(*a).cpu(), f(*b).cpu())
    assert torch.equal(a[2].cpu(), b[2].cpu())


@pytest.mark.gpu
def test_graph_capture_and_replay():
    device = "cuda"
    n, h, bs = 64, 8, 64
    q, kv = (t.to(device) for t in inputs(n, h, seed=8, device=device))
    cache = torch.zeros(2, bs * 584, dtype=torch.uint8, device=device)
    slots, positions = torch.arange(n, device=device), torch.arange(n, device=device)
    cs = cos_sin_cache().to(device)
    q_out = torch.empty(n, 16, 512, dtype=torch.bfloat16, device=device)

    def run():
        torch.ops.dsv4.qnorm_rope_kv_insert.out(q, kv, cache, slots, positions, cs, 16, EPS, bs, True, 1, 224.0,
                                                q_out=q_out)

    graph, _ = capture_graph(run)
    fresh_q, fresh_kv = inputs(n, h, seed=9, device="cpu")
    q.copy_(fresh_q.to(device))
    kv.copy_(fresh_kv.to(device))
    positions.copy_(torch.arange(100, 100 + n, device=device))
    cache.zero_()
    graph.replay()
    torch.cuda.synchronize()
    q_ref, expected = reference_run(fresh_q, fresh_kv, torch.arange(n), torch.arange(100, 100 + n), 16, bs,
                                    Fp8Format.FNUZ, 2)
    assert_q_close(q_out, q_ref, h)
    assert_kv_parity(cache, expected, n, bs, Fp8Format.FNUZ)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("n", [1, 17, 2048])
def test_kv_only_op_matches_reference_and_fused_op(device, fmt, bs, n):
    _, kv = inputs(n, 1, seed=10, device=device)
    positions = torch.arange(n) * 2
    slots = torch.randperm(n + bs, generator=torch.Generator().manual_seed(n))[:n]
    slots[0] = -3
    blocks = -(-(n + bs) // bs) + 1
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8, device=device)
    torch.ops.dsv4.kv_rope_quant_insert(kv.to(device), cache, slots.to(device), positions.to(device),
                                        cos_sin_cache().to(device), bs, int(fmt), fmt.default_quant_max)
    expected = torch.zeros(blocks, bs * 584, dtype=torch.uint8)
    reference.kv_rope_quant_insert(kv, expected, slots, positions, cos_sin_cache(), bs, fmt)
    assert_kv_parity(cache, expected, n + bs, bs, fmt)
    fused = torch.zeros_like(cache)
    q = torch.zeros(n, 1, 512, dtype=torch.bfloat16, device=device)
    torch.ops.dsv4.qnorm_rope_kv_insert(q, kv.to(device), fused, slots.to(device), positions.to(device),
                                        cos_sin_cache().to(device), 1, EPS, bs, True, int(fmt), fmt.default_quant_max)
    assert torch.equal(fused.cpu(), cache.cpu())


def test_kv_only_op_checks_and_wrapper():
    kv = torch.zeros(3, 512, dtype=torch.bfloat16)
    cache = torch.zeros(1, 16 * 584, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="slot_mapping must have one entry per token"):
        torch.ops.dsv4.kv_rope_quant_insert(kv, cache, torch.arange(2), torch.arange(3), CS, 16, 0, 448.0)
    with pytest.raises(RuntimeError, match="position_ids must have 3 entries"):
        torch.ops.dsv4.kv_rope_quant_insert(kv, cache, torch.arange(3), torch.arange(2), CS, 16, 0, 448.0)
    with pytest.raises(RuntimeError, match="kv must have dtype bfloat16"):
        torch.ops.dsv4.kv_rope_quant_insert(kv.float(), cache, torch.arange(3), torch.arange(3), CS, 16, 0, 448.0)
    torch.ops.dsv4.kv_rope_quant_insert(torch.empty(0, 512, dtype=torch.bfloat16), cache,
                                        torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), CS, 16, 0,
                                        448.0)
    assert bool((cache == 0).all())
    dsv4ops.kv_rope_quant_insert(kv, cache, torch.arange(3), torch.arange(3).int(), CS, 16, "fnuz")
    torch.library.opcheck(torch.ops.dsv4.kv_rope_quant_insert.default,
                          (kv, cache, torch.arange(3), torch.arange(3), CS, 16, 1, 224.0))

    def f(kv, cache):
        torch.ops.dsv4.kv_rope_quant_insert(kv * 1, cache, torch.arange(3), torch.arange(3), CS, 16, 0, 448.0)
        return cache * 1

    a, b = torch.zeros_like(cache), torch.zeros_like(cache)
    assert torch.equal(torch.compile(f, fullgraph=True)(kv + 1, a), f(kv + 1, b))
