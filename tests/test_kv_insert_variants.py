"""The rest of the fused Q/KV family (spec/kv_cache.md §5, §6): the full-cache bf16 and per-tensor FP8
variants (the matrix rows of §10 for them) and kv_norm_rope_quant_insert, on every device in both
encodings, with their guards, canaries, invalid inputs, opcheck, torch.compile and graph capture.

The kernels round every product of the rotation on its own, like the reference, so the KV rows they
store are compared byte for byte; Q with the RMSNorm differs only through the order of the sum of
squares (tolerances of §10: bf16 Q within 1e-2, FP8 Q within 1 FP8 ULP)."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as reference

from conftest import DEVICES, FORMATS, assert_bits_equal, assert_bytes_equal, capture_graph
from test_qnorm_rope_kv_insert import EPS, bf16_ulp_distance, cos_sin_cache, decode_cache, inputs, run_op

CANARY = 0x5A


def fp8_code_distance(a, b):
    """|difference| of FP8 codes on a monotone integer line (sign-magnitude mirrored); NaN codes excluded
    by the callers' inputs."""

    def monotone(x):
        v = x.view(torch.uint8).to(torch.int32)
        return torch.where(v >= 128, -(v - 128), v)

    return (monotone(a) - monotone(b)).abs()


def plain_cache_in_canaries(blocks, bs, dtype, device, block_gap=0):
    """A [blocks, bs, 512] cache view (blocks `block_gap` rows apart beyond bs) inside a larger buffer filled
    with a canary byte; returns (buffer bytes, cache view)."""
    row_bytes = 512 * torch.empty(0, dtype=dtype).element_size()
    rows_per_block = bs + block_gap
    buffer = torch.full((row_bytes * (blocks * rows_per_block + 2),), CANARY, dtype=torch.uint8, device=device)
    body = buffer[row_bytes : row_bytes * (1 + blocks * rows_per_block)].view(dtype).view(blocks, rows_per_block, 512)
    return buffer, body[:, :bs]


def run_full_cache(variant, q, kv, cache, slots, positions, bs, device, fmt=Fp8Format.OCP, scale=1.0,
                   q_scale_inv=1.0, apply_q_norm=True, wrapper=False):
    """Runs the op on `device`; returns the Q result (bf16 q rewritten, or q_fp8) on the CPU."""
    q_dev, kv_dev = q.clone().to(device), kv.to(device)  # the bf16 variant rewrites q
    slots, positions, cs = slots.to(device), positions.to(device), cos_sin_cache().to(device)
    if variant == "bf16":
        if wrapper:
            dsv4ops.qnorm_rope_kv_insert_full_cache_bf16(q_dev, kv_dev, cache, slots, positions, cs, EPS, bs,
                                                         apply_q_norm)
        else:
            torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q_dev, kv_dev, cache, slots, positions.long(), cs,
                                                                EPS, bs, apply_q_norm)
        return q_dev.cpu()
    scale_t = torch.tensor([scale], device=device)
    q_scale_t = torch.tensor([q_scale_inv], device=device)
    if wrapper:
        q_fp8, _ = dsv4ops.qnorm_rope_kv_insert_full_cache_fp8(q_dev, kv_dev, cache, slots, positions, cs, scale_t,
                                                               q_scale_t, EPS, bs, apply_q_norm, fmt)
    else:
        q_fp8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=device)  # FNUZ bytes in fn tensors too
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(q_dev, kv_dev, q_fp8, cache, slots, positions.long(), cs,
                                                           scale_t, q_scale_t, EPS, bs, apply_q_norm, int(fmt),
                                                           fmt.default_quant_max)
    assert_bits_equal(q_dev.cpu(), q), "q is read only"
    return q_fp8.cpu()


def reference_full_cache(variant, q, kv, blocks, bs, slots, positions, fmt=Fp8Format.OCP, scale=1.0,
                         q_scale_inv=1.0, apply_q_norm=True):
    q = q.clone()
    if variant == "bf16":
        cache = torch.zeros(blocks, bs, 512, dtype=torch.bfloat16)
        reference.qnorm_rope_kv_insert_full_cache_bf16(q, kv, cache, slots, positions.long(), cos_sin_cache(), EPS,
                                                       bs, apply_q_norm)
        return q, cache
    cache = torch.zeros(blocks, bs, 512, dtype=torch.uint8)
    q_fp8 = torch.empty(q.shape, dtype=torch.uint8)
    reference.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, cache, slots, positions.long(), cos_sin_cache(),
                                                  torch.tensor([scale]), torch.tensor([q_scale_inv]), EPS, bs,
                                                  apply_q_norm, fmt, fmt.default_quant_max)
    return q_fp8, cache


def assert_q_result(variant, got, want):
    if variant == "bf16":
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    else:
        assert int(fp8_code_distance(got, want).max()) <= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["bf16", "fp8"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("positions_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("h", [8, 17])
@pytest.mark.parametrize("n", [4, 17])
def test_full_cache_matches_reference(device, variant, fmt, positions_dtype, h, n):
    """§10 rows test_full_cache_{bf16,per_tensor_fp8}_matches_reference (the bf16 one has no encoding; it
    runs for both values of fmt all the same). The KV cache is byte-exact, stricter than §10's 1 ULP."""
    bs = 16
    q, kv = inputs(n, h, seed=20, device="cpu")
    positions = torch.arange(n, dtype=positions_dtype)
    slots = torch.arange(n)
    blocks = -(-n // bs) + 1
    dtype = torch.bfloat16 if variant == "bf16" else fmt.torch_dtype
    cache = torch.zeros(blocks, bs, 512, dtype=dtype, device=device)
    got_q = run_full_cache(variant, q, kv, cache, slots, positions, bs, device, fmt, wrapper=True)
    want_q, want_cache = reference_full_cache(variant, q, kv, blocks, bs, slots, positions, fmt)
    assert_q_result(variant, got_q, want_q)
    assert_bytes_equal(cache.cpu().view(torch.uint8), want_cache.view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale,q_scale_inv", [(0.5, 4.0), (0.37, 3.3), (1e-3, 1e3)])
def test_full_cache_fp8_scales_and_saturation(device, fmt, scale, q_scale_inv):
    """Non-unit scales, including ones that are not powers of two (the kernel and the reference both
    multiply by the fp32 reciprocal) and ones that push most values past quant_max (saturation)."""
    n, h, bs = 9, 3, 16
    q, kv = inputs(n, h, seed=21, device="cpu")
    positions, slots = torch.arange(n) * 3, torch.arange(n)
    cache = torch.zeros(2, bs, 512, dtype=torch.float8_e4m3fn, device=device)
    got_q = run_full_cache("fp8", q, kv, cache, slots, positions, bs, device, fmt, scale, q_scale_inv)
    want_q, want_cache = reference_full_cache("fp8", q, kv, 2, bs, slots, positions, fmt, scale, q_scale_inv)
    assert int(fp8_code_distance(got_q, want_q).max()) <= 1
    assert_bytes_equal(cache.cpu().view(torch.uint8), want_cache)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_full_cache_guards_canaries_and_dp_padding(device, variant):
    """Slots -2, huge and at the capacity edge, positions outside the table, DP padding (fewer slots than
    tokens), apply_q_norm off, blocks with a gap between them: nothing outside the targeted rows changes."""
    n, h, bs, blocks, gap = 10, 4, 16, 2, 3
    q, kv = inputs(n, h, seed=22, device="cpu")
    positions = torch.tensor([0, 1, 4095, 4096, -1, 5, 6, 2**40, 8, 9])  # 4096, -1, 2^40 outside the table
    slots = torch.tensor([0, -2, 31, 3, 4, 32, 2**40, 7])  # capacity 32: slot 31 is the last, 32 past it
    dtype = torch.bfloat16 if variant == "bf16" else torch.float8_e4m3fn
    for apply_q_norm in (True, False):
        buffer, cache = plain_cache_in_canaries(blocks, bs, dtype, device, block_gap=gap)
        cache.view(torch.uint8).zero_()
        got_q = run_full_cache(variant, q, kv, cache, slots, positions, bs, device, apply_q_norm=apply_q_norm)
        want_q, want_cache = reference_full_cache(variant, q, kv, blocks, bs, slots, positions,
                                                  apply_q_norm=apply_q_norm)
        assert_q_result(variant, got_q, want_q)
        assert bool((got_q[[3, 4, 7]].view(torch.uint8) == 0).all()), "rows outside the table are +0"
        assert_bytes_equal(cache.cpu().contiguous().view(torch.uint8), want_cache.view(torch.uint8))
        outside = buffer.cpu().clone()
        row_bytes = 512 * cache.element_size()
        body = outside[row_bytes : row_bytes * (1 + blocks * (bs + gap))].view(blocks, bs + gap, row_bytes)
        body[:, :bs] = CANARY  # mask the cache rows; everything left must still be the canary
        assert bool((outside == CANARY).all()), "bytes outside the cache rows were written"


def kv_norm_inputs(n, seed, exact_sums):
    """KV rows and a norm weight. With exact_sums the values are multiples of 1/8 in [-4, 4], so every sum
    of squares is exact in any order and the kernels and the reference get the same norm factor."""
    g = torch.Generator().manual_seed(seed)
    if exact_sums:
        kv = (torch.randint(-32, 33, (n, 512), generator=g).float() / 8).to(torch.bfloat16)
    else:
        kv = (torch.randn(n, 512, generator=g) * 3).to(torch.bfloat16)
    weight = (torch.rand(512, generator=g) * 2).to(torch.bfloat16)
    return kv, weight


def run_kv_norm(kv, weight, cache, slots, positions, bs, fmt, device, wrapper=False):
    args = (kv.to(device), weight.to(device), cache, slots.to(device), positions.to(device),
            cos_sin_cache().to(device))
    if wrapper:
        dsv4ops.kv_norm_rope_quant_insert(*args, EPS, bs, fmt)
    else:
        torch.ops.dsv4.kv_norm_rope_quant_insert(*args, EPS, bs, int(fmt), fmt.default_quant_max)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("n", [1, 17, 2048])
def test_kv_norm_op_exact_on_exact_sums(device, fmt, bs, n):
    kv, weight = kv_norm_inputs(n, seed=n, exact_sums=True)
    positions = torch.arange(n) * 2
    slots = torch.randperm(n + bs, generator=torch.Generator().manual_seed(n))[:n]
    slots[0] = -3
    blocks = -(-(n + bs) // bs) + 1
    cache = torch.zeros(blocks, bs * 584, dtype=torch.uint8, device=device)
    run_kv_norm(kv, weight, cache, slots, positions, bs, fmt, device, wrapper=True)
    expected = torch.zeros(blocks, bs * 584, dtype=torch.uint8)
    reference.kv_norm_rope_quant_insert(kv, weight, expected, slots, positions, cos_sin_cache(), EPS, bs, fmt)
    assert_bytes_equal(cache.cpu(), expected)


def assert_records_close(got, expected, n, bs, fmt, max_bytes_per_row=4):
    """fp8_ds_mla records of rows 0..n-1 (slot = row) whose norm factor may differ from the reference's by the
    order of a sum, which can move a value across a rounding boundary (or a block's amax across a power of two:
    its scale byte then moves by one and its payload bytes all change). Per row: NoPE values decode within one
    FP8 step at the reference's block scale, the RoPE tail within 1 bf16 ULP, scale bytes within 1, and in the
    NoPE blocks whose scale byte agrees at most max_bytes_per_row bytes differ; over the whole cache, under 0.1%
    of the bytes differ (the check these replace)."""
    got, expected = got.cpu(), expected.cpu()
    assert float((got != expected).float().mean()) < 1e-3, "more than 0.1% of the cache's bytes differ"
    a, b = decode_cache(got, n, bs, fmt), decode_cache(expected, n, bs, fmt)
    scale_bytes = expected.view(-1, 584 * bs)[:, 576 * bs :].reshape(-1, 8)[:n, :7].float()
    step = (32.0 if fmt is Fp8Format.OCP else 16.0) * torch.pow(2.0, scale_bytes - 127)
    err = (a[:, :448].float() - b[:, :448].float()).abs().reshape(n, 7, 64).amax(dim=-1)
    assert bool((err <= step).all()), "NoPE values more than one FP8 step from the reference"
    assert int(bf16_ulp_distance(a[:, 448:], b[:, 448:]).max()) <= 1, "RoPE tail more than 1 bf16 ULP off"

    def records(cache):
        blocks = cache.view(-1, 584 * bs)
        return blocks[:, : 576 * bs].reshape(-1, 576)[:n], blocks[:, 576 * bs :].reshape(-1, 8)[:n, :7]

    (got_data, got_scales), (want_data, want_scales) = records(got), records(expected)
    assert int((got_scales.int() - want_scales.int()).abs().max()) <= 1, "a scale byte off by more than one"
    same_scale = (got_scales == want_scales).repeat_interleave(64, dim=1)  # per NoPE byte
    differing = ((got_data[:, :448] != want_data[:, :448]) & same_scale).sum(dim=1)
    assert int(differing.max()) <= max_bytes_per_row, f"a record has {int(differing.max())} differing bytes"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_kv_norm_op_random_rows(device, fmt):
    """General rows: the norm factor may differ from the reference's by the order of the sum, which can move
    a value across a rounding boundary. Bytes agree almost everywhere; decoded values within one FP8 step
    at the block scale."""
    n, bs = 512, 64
    kv, weight = kv_norm_inputs(n, seed=30, exact_sums=False)
    strided = torch.zeros(n, 1024, dtype=torch.bfloat16, device=device)  # built where the kernel runs: a copy
    strided[:, 256:768] = kv.to(device)                                   # of the view would be contiguous
    kv_view = strided[:, 256:768]  # only stride(1) == 1 and aligned rows are required
    assert kv_view.stride(0) == 1024
    positions, slots = torch.arange(n), torch.arange(n)
    cache = torch.zeros(n // bs + 1, bs * 584, dtype=torch.uint8, device=device)
    run_kv_norm(kv_view, weight, cache, slots, positions, bs, fmt, device)
    expected = torch.zeros(n // bs + 1, bs * 584, dtype=torch.uint8)
    reference.kv_norm_rope_quant_insert(kv, weight, expected, slots, positions, cos_sin_cache(), EPS, bs, fmt)
    assert_records_close(cache, expected, n, bs, fmt)


def test_kv_norm_matches_unfused_norm_then_kv_rope_insert():
    """The fused norm is the unfused weighted rms_norm rounded to bf16, then kv_rope_quant_insert."""
    n, bs = 33, 16
    kv, weight = kv_norm_inputs(n, seed=31, exact_sums=True)
    positions, slots = torch.arange(n), torch.arange(n)
    fused = torch.zeros(4, bs * 584, dtype=torch.uint8)
    run_kv_norm(kv, weight, fused, slots, positions, bs, Fp8Format.OCP, "cpu")
    x = kv.float()
    normed = (x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * weight.float()).to(torch.bfloat16)
    unfused = torch.zeros_like(fused)
    torch.ops.dsv4.kv_rope_quant_insert(normed, unfused, slots, positions, cos_sin_cache(), bs, 0, 448.0)
    assert_records_close(fused, unfused, n, bs, Fp8Format.OCP)


BF16_Q = torch.zeros(3, 2, 512, dtype=torch.bfloat16)
KV3 = torch.zeros(3, 512, dtype=torch.bfloat16)
PLAIN = torch.zeros(2, 16, 512, dtype=torch.bfloat16)
FP8_PLAIN = torch.zeros(2, 16, 512, dtype=torch.float8_e4m3fn)
Q_FP8 = torch.zeros(3, 2, 512, dtype=torch.float8_e4m3fn)
IDX = torch.arange(3)
CS = torch.zeros(16, 64)
ONE = torch.ones(1)


def _bf16_args(**over):
    base = dict(q=BF16_Q.clone(), kv=KV3, k_cache=PLAIN.clone(), slot_mapping=IDX, position_ids=IDX,
                cos_sin_cache=CS, eps=EPS, cache_block_size=16, apply_q_norm=True)
    base.update(over)
    return tuple(base.values())


def _fp8_args(**over):
    base = dict(q=BF16_Q, kv=KV3, q_fp8=Q_FP8.clone(), k_cache=FP8_PLAIN.clone(), slot_mapping=IDX, position_ids=IDX,
                cos_sin_cache=CS, fp8_scale=ONE, q_fp8_scale_inv=ONE, eps=EPS, cache_block_size=16, apply_q_norm=True,
                fp8_format=0, quant_max=448.0)
    base.update(over)
    return tuple(base.values())


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(k_cache=PLAIN.float()), "k_cache must have dtype bfloat16"),
        (dict(k_cache=PLAIN[:, :8]), r"k_cache must have shape \[num_blocks, 16, 512\]"),
        (dict(k_cache=PLAIN[..., :256]), r"k_cache must have shape"),
        (dict(k_cache=PLAIN.transpose(0, 1)), r"k_cache must have shape|rows overlap"),
        (dict(cache_block_size=0), "cache_block_size must be positive"),
        (dict(q=BF16_Q.float()), "q must have dtype bfloat16"),
        (dict(kv=KV3.float()), "kv must have dtype bfloat16"),
        (dict(q=BF16_Q[:, :0].clone()), "q must have at least one head"),
        (dict(position_ids=IDX.int()), "position_ids must have dtype int64"),
        (dict(slot_mapping=torch.arange(4)), "slot_mapping has 4 entries for 3 tokens"),
    ],
)
def test_full_cache_bf16_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(*_bf16_args(**over))


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(k_cache=PLAIN.clone()), "k_cache must have dtype float8_e4m3fn or float8_e4m3fnuz or uint8, got bfloat16"),
        (dict(q_fp8=Q_FP8[:, :1].clone()), "q_fp8 must have q's shape"),
        (dict(q_fp8=BF16_Q.clone()), "q_fp8 must have dtype"),
        (dict(fp8_scale=torch.ones(2)), "fp8_scale must have exactly one element"),
        (dict(q_fp8_scale_inv=torch.ones(1, dtype=torch.float64)), "q_fp8_scale_inv must have dtype float32"),
        (dict(fp8_format=1, quant_max=448.0), r"quant_max must be in \(0, 240\]"),
        (dict(fp8_format=2), "fp8_format"),
    ],
)
def test_full_cache_fp8_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(*_fp8_args(**over))


def test_full_cache_overlap_is_refused():
    q = torch.zeros(3, 2, 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="kv must not overlap q"):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q, q[:, 0], PLAIN.clone(), IDX, IDX, CS, EPS, 16, True)
    buffer = torch.zeros(4096 * 2, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="must not overlap"):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(BF16_Q, KV3, buffer[:3072].view(3, 2, 512),
                                                           buffer.view(1, 16, 512), IDX, IDX, CS, ONE, ONE, EPS, 16,
                                                           True, 0, 448.0)


def test_inputs_inside_the_cache_are_refused():
    """spec/kv_cache.md §3.3: k_cache must not alias the inputs (the writes would change what later tokens
    read). The extents are the tensors' real spans, strides included."""
    pool = torch.zeros(1, 16 * 584 + 4096, dtype=torch.uint8)
    cache = pool[:, :16 * 584]
    kv_in_cache = pool.view(-1)[:3 * 1024].view(torch.bfloat16).view(3, 512)
    with pytest.raises(RuntimeError, match="kv must not overlap k_cache"):
        torch.ops.dsv4.kv_rope_quant_insert(kv_in_cache, cache, IDX, IDX, CS, 16, 0, 448.0)
    with pytest.raises(RuntimeError, match="norm_weight must not overlap k_cache"):
        torch.ops.dsv4.kv_norm_rope_quant_insert(KV3, pool.view(-1)[:1024].view(torch.bfloat16), cache, IDX, IDX, CS,
                                                 EPS, 16, 0, 448.0)
    q_in_cache = pool.view(-1)[:3 * 2 * 1024].view(torch.bfloat16).view(3, 2, 512)
    with pytest.raises(RuntimeError, match="q_in must not overlap k_cache"):
        torch.ops.dsv4.qnorm_rope_kv_insert(q_in_cache, KV3, cache, IDX, IDX, CS, 2, EPS, 16, True, 0, 448.0)
    # A cache whose blocks are padded (stride(0) past its rows): q_out in block 1's rows is inside its span.
    padded = torch.zeros(2, 2 * 16 * 584, dtype=torch.uint8)
    q_out = padded[1, :3 * 2 * 1024].view(torch.bfloat16).view(3, 2, 512)
    with pytest.raises(RuntimeError, match="k_cache must not overlap q_out"):
        torch.ops.dsv4.qnorm_rope_kv_insert.out(BF16_Q, KV3, padded[:, :16 * 584], IDX, IDX, CS, 2, EPS, 16, True, 0,
                                                448.0, q_out=q_out)
    bf16_pool = torch.zeros(2 * 16 * 512 + 3 * 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="kv must not overlap k_cache"):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(BF16_Q.clone(), bf16_pool[:3 * 512].view(3, 512),
                                                            bf16_pool[:2 * 16 * 512].view(2, 16, 512), IDX, IDX, CS,
                                                            EPS, 16, True)
    fp8_cache = torch.zeros(2 * 16 * 512 + 4, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="fp8_scale must not overlap k_cache"):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(BF16_Q, KV3, Q_FP8.clone(),
                                                           fp8_cache[:2 * 16 * 512].view(2, 16, 512), IDX, IDX, CS,
                                                           fp8_cache[:4].view(torch.float32), ONE, EPS, 16, True, 0,
                                                           448.0)


def test_plain_cache_of_one_row_blocks():
    """Block size 1: the row stride of a size-1 dim is not a layout constraint, but blocks must not overlap."""
    rows = torch.zeros(1, 4, 512, dtype=torch.bfloat16).transpose(0, 1)  # strides (512, 2048, 1): valid
    q = BF16_Q.clone()
    torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q, KV3, rows, IDX, IDX, CS, EPS, 1, True)
    want = PLAIN[:1, :4].clone().view(4, 1, 512)
    torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(BF16_Q.clone(), KV3, want, IDX, IDX, CS, EPS, 1, True)
    assert torch.equal(rows, want)
    overlapping = torch.zeros(8 * 4 + 512, dtype=torch.bfloat16).as_strided((4, 1, 512), (8, 8, 1))
    with pytest.raises(RuntimeError, match="k_cache rows overlap"):
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(BF16_Q.clone(), KV3, overlapping, IDX, IDX, CS, EPS, 1,
                                                            True)


def test_kv_norm_invalid_inputs():
    cache = torch.zeros(1, 16 * 584, dtype=torch.uint8)
    w = torch.ones(512, dtype=torch.bfloat16)
    call = lambda **o: torch.ops.dsv4.kv_norm_rope_quant_insert(  # noqa: E731
        o.get("kv", KV3), o.get("w", w), cache, o.get("slots", IDX), IDX, CS, o.get("eps", EPS), 16, 0, 448.0)
    with pytest.raises(RuntimeError, match=r"norm_weight must have shape \[512\]"):
        call(w=torch.ones(256, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="norm_weight must have dtype bfloat16"):
        call(w=torch.ones(512))
    with pytest.raises(RuntimeError, match="slot_mapping must have one entry per token"):
        call(slots=torch.arange(2))
    with pytest.raises(RuntimeError, match="eps must be finite"):
        call(eps=float("inf"))
    with pytest.raises(RuntimeError, match="kv rows must be contiguous"):
        call(kv=torch.zeros(512, 3, dtype=torch.bfloat16).t())


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    e_bf16 = torch.empty(0, 2, 512, dtype=torch.bfloat16, device=device)
    e_kv = torch.empty(0, 512, dtype=torch.bfloat16, device=device)
    e_idx = torch.empty(0, dtype=torch.long, device=device)
    cs, one = cos_sin_cache(16).to(device), torch.ones(1, device=device)
    plain = torch.zeros(1, 16, 512, dtype=torch.bfloat16, device=device)
    torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(e_bf16, e_kv, plain, e_idx, e_idx, cs, EPS, 16, True)
    fp8 = torch.zeros(1, 16, 512, dtype=torch.float8_e4m3fn, device=device)
    torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(e_bf16, e_kv, torch.empty_like(e_bf16, dtype=fp8.dtype), fp8,
                                                       e_idx, e_idx, cs, one, one, EPS, 16, True, 0, 448.0)
    ds = torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device)
    torch.ops.dsv4.kv_norm_rope_quant_insert(e_kv, torch.ones(512, dtype=torch.bfloat16, device=device), ds, e_idx,
                                             e_idx, cs, EPS, 16, 0, 448.0)
    assert not plain.any() and not fp8.view(torch.uint8).any() and not ds.any()


def _small_case(device):
    q, kv = inputs(5, 2, seed=40, device="cpu")
    weight = torch.rand(512).to(torch.bfloat16)
    return (q.to(device), kv.to(device), weight.to(device), torch.arange(5, device=device),
            cos_sin_cache(64).to(device))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, kv, w, idx, cs = _small_case(device)
    one = torch.ones(1, device=device)
    torch.library.opcheck(torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16.default,
                          (q.clone(), kv, torch.zeros(1, 16, 512, dtype=torch.bfloat16, device=device), idx, idx, cs,
                           EPS, 16, True))
    # float8 outputs cannot be compared by opcheck's checks: uint8 tensors hold the same bytes
    torch.library.opcheck(torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8.default,
                          (q, kv, torch.zeros(5, 2, 512, dtype=torch.uint8, device=device),
                           torch.zeros(1, 16, 512, dtype=torch.uint8, device=device), idx, idx, cs, one, one, EPS, 16,
                           True, 1, 224.0))
    torch.library.opcheck(torch.ops.dsv4.kv_norm_rope_quant_insert.default,
                          (kv, w, torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device), idx, idx, cs, EPS, 16,
                           0, 448.0))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    q, kv, w, idx, cs = _small_case(device)
    one = torch.full((1,), 0.5, device=device)

    def f(q, kv, plain, fp8, q_fp8, ds):
        q = q * 1
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q, kv, plain, idx, idx, cs, EPS, 16, True)
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, fp8, idx, idx, cs, one, one, EPS, 16, True,
                                                           0, 448.0)
        torch.ops.dsv4.kv_norm_rope_quant_insert(kv, w, ds, idx, idx, cs, EPS, 16, 0, 448.0)
        return q, plain * 1, fp8.view(torch.uint8) * 1, q_fp8.view(torch.uint8) * 1, ds * 1

    def make():
        return (q, kv, torch.zeros(1, 16, 512, dtype=torch.bfloat16, device=device),
                torch.zeros(1, 16, 512, dtype=torch.float8_e4m3fn, device=device),
                torch.zeros(5, 2, 512, dtype=torch.float8_e4m3fn, device=device),
                torch.zeros(1, 16 * 584, dtype=torch.uint8, device=device))

    for got, want in zip(torch.compile(f, fullgraph=True)(*make()), f(*make())):
        assert_bits_equal(got.cpu(), want.cpu())


@pytest.mark.gpu
def test_graph_capture_and_replay():
    """All three ops captured on a side stream, replayed on fresh inputs and positions."""
    device, n, h, bs = "cuda", 64, 8, 64
    q, kv = (t.to(device) for t in inputs(n, h, seed=41, device="cpu"))
    weight = torch.rand(512).to(torch.bfloat16).to(device)
    slots, positions = torch.arange(n, device=device), torch.arange(n, device=device)
    cs, scale = cos_sin_cache().to(device), torch.full((1,), 0.25, device=device)
    q_work = torch.empty_like(q)
    plain = torch.zeros(2, bs, 512, dtype=torch.bfloat16, device=device)
    fp8 = torch.zeros(2, bs, 512, dtype=torch.float8_e4m3fnuz, device=device)
    q_fp8 = torch.empty(n, h, 512, dtype=torch.float8_e4m3fnuz, device=device)
    ds = torch.zeros(2, bs * 584, dtype=torch.uint8, device=device)

    def run():
        q_work.copy_(q)
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_bf16(q_work, kv, plain, slots, positions, cs, EPS, bs, True)
        torch.ops.dsv4.qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, fp8, slots, positions, cs, scale, scale,
                                                           EPS, bs, True, 1, 224.0)
        torch.ops.dsv4.kv_norm_rope_quant_insert(kv, weight, ds, slots, positions, cs, EPS, bs, 1, 224.0)

    graph, _ = capture_graph(run)
    fresh_q, fresh_kv = inputs(n, h, seed=42, device="cpu")
    q.copy_(fresh_q.to(device))
    kv.copy_(fresh_kv.to(device))
    positions.copy_(torch.arange(200, 200 + n, device=device))
    for t in (plain, fp8, ds):
        t.view(torch.uint8).zero_()
    graph.replay()
    torch.cuda.synchronize()
    cpu_pos, cpu_slots = torch.arange(200, 200 + n), torch.arange(n)
    want_q, want_plain = reference_full_cache("bf16", fresh_q, fresh_kv, 2, bs, cpu_slots, cpu_pos)
    assert_q_result("bf16", q_work.cpu(), want_q)
    assert_bytes_equal(plain.cpu().view(torch.uint8), want_plain.view(torch.uint8))
    want_q8, want_fp8 = reference_full_cache("fp8", fresh_q, fresh_kv, 2, bs, cpu_slots, cpu_pos, Fp8Format.FNUZ,
                                             0.25, 0.25)
    assert int(fp8_code_distance(q_fp8.cpu(), want_q8).max()) <= 1
    assert_bytes_equal(fp8.cpu().view(torch.uint8), want_fp8)
    want_ds = torch.zeros(2, bs * 584, dtype=torch.uint8)
    reference.kv_norm_rope_quant_insert(fresh_kv, weight.cpu(), want_ds, cpu_slots, cpu_pos, cos_sin_cache(), EPS, bs,
                                        Fp8Format.FNUZ)
    assert_records_close(ds, want_ds, n, bs, Fp8Format.FNUZ)


def nonfinite_rows(n, h, seed, rope_nan):
    """q and kv rows with NaN, +Inf and -Inf planted in NoPE dims (not rotated, so each stays where it is) of
    some rows, next to finite values of their quantization block; with rope_nan also NaN in a RoPE dim."""
    q, kv = inputs(n, h, seed=seed, device="cpu")
    kv[0, 5], kv[1, 70], kv[2, 200] = float("nan"), float("inf"), float("-inf")
    if rope_nan:
        kv[3, 450] = float("nan")
    q[0, 0, 7], q[1, h - 1, 300], q[2, 0, 9] = float("nan"), float("inf"), float("-inf")
    return q, kv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_inputs_through_the_fp8_ds_mla_writers(device, fmt):
    """spec §7.4, §11: in an fp8_ds_mla record a NaN NoPE value is stored as -M (0xFE), the block's scale from its
    finite values; an Inf makes its block's scale byte 255, its finite values 0 and itself -M; the RoPE tail
    carries NaN (as the canonical 0x7FC0, README: not byte-compared here). Byte for byte as the reference, through
    the main op and both KV-only ops."""
    n, h, bs = 4, 3, 16
    q, kv = nonfinite_rows(n, h, seed=60, rope_nan=False)
    positions, slots = torch.arange(n) + 5, torch.arange(n)
    weight = torch.ones(512, dtype=torch.bfloat16)
    for op in ("qnorm_rope_kv_insert", "kv_rope_quant_insert", "kv_norm_rope_quant_insert"):
        cache = torch.zeros(2, bs * 584, dtype=torch.uint8, device=device)
        expected = torch.zeros(2, bs * 584, dtype=torch.uint8)
        cs = cos_sin_cache()
        if op == "qnorm_rope_kv_insert":
            run_op(q, kv, cache, slots, positions, h, bs, fmt, device)
            reference.qnorm_rope_kv_insert(q, kv, expected, slots, positions, cs, h, EPS, bs, True, fmt,
                                           fmt.default_quant_max)
        elif op == "kv_rope_quant_insert":
            torch.ops.dsv4.kv_rope_quant_insert(kv.to(device), cache, slots.to(device), positions.to(device),
                                                cs.to(device), bs, int(fmt), fmt.default_quant_max)
            reference.kv_rope_quant_insert(kv, expected, slots, positions, cs, bs, fmt, fmt.default_quant_max)
        else:
            run_kv_norm(kv, weight, cache, slots, positions, bs, fmt, device)
            reference.kv_norm_rope_quant_insert(kv, weight, expected, slots, positions, cs, EPS, bs, fmt,
                                                fmt.default_quant_max)
        # the block-split layout: bs data records of 576 bytes, then bs scale records of 8 bytes
        data = cache.cpu()[0, : n * 576].view(n, 576)
        scales = cache.cpu()[0, bs * 576 : bs * 576 + n * 8].view(n, 8)
        want_data = expected[0, : n * 576].view(n, 576)
        want_scales = expected[0, bs * 576 : bs * 576 + n * 8].view(n, 8)
        if op != "kv_norm_rope_quant_insert":  # (the norm spreads a row's NaN or Inf over the whole row)
            assert int(data[0, 5]) == 0xFE and int(scales[0, 0]) != 255, op  # NaN -> -M, block scale finite
            assert int(scales[1, 1]) == 255 and int(data[1, 70]) == 0xFE, op  # +Inf: its block poisoned
            assert int(data[1, 64]) & 0x7F == 0, op  # a finite value of that block -> 0
            assert int(scales[2, 3]) == 255 and int(data[2, 200]) == 0xFE, op  # -Inf likewise
        else:
            assert bool((data[0, :448] == 0xFE).all()), "a NaN in the row makes the whole normed row NaN: -M"
        assert_bytes_equal(data[:, :448], want_data[:, :448])
        assert_bytes_equal(scales, want_scales)
        rope, want_rope = data[:, 448:].contiguous().view(torch.bfloat16), want_data[:, 448:].contiguous().view(
            torch.bfloat16)
        assert torch.equal(rope.isnan(), want_rope.isnan())
        assert_bits_equal(torch.nan_to_num(rope), torch.nan_to_num(want_rope))
        assert not bool(cache.cpu()[1].any()) and not bool(cache.cpu()[0, n * 576 : bs * 576].any()), "no other byte"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_inputs_through_the_full_cache_variants(device, fmt):
    """spec §5, §7.4: the FP8 variant clamps fmin(fmax(x, -M), M) before converting, so NaN is stored as -M (0xFE
    in both encodings) in the cache and in q_fp8, +-Inf as +-M; the bf16 variant keeps NaN and +-Inf. Without the
    q norm (which would spread them over a head) each stays in its element."""
    n, h, bs = 4, 3, 16
    q, kv = nonfinite_rows(n, h, seed=61, rope_nan=True)
    positions, slots = torch.arange(n) + 5, torch.arange(n)
    cache = torch.zeros(1, bs, 512, dtype=fmt.torch_dtype, device=device)
    got_q = run_full_cache("fp8", q, kv, cache, slots, positions, bs, device, fmt, apply_q_norm=False).view(
        torch.uint8)
    got_cache = cache.cpu().view(torch.uint8)[0]
    assert int(got_cache[0, 5]) == 0xFE and int(got_cache[1, 70]) == 0x7E and int(got_cache[2, 200]) == 0xFE
    assert int(got_q[0, 0, 7]) == 0xFE and int(got_q[1, h - 1, 300]) == 0x7E and int(got_q[2, 0, 9]) == 0xFE
    want_q, want_cache = reference_full_cache("fp8", q, kv, 1, bs, slots, positions, fmt, apply_q_norm=False)
    assert_bytes_equal(got_q, want_q)
    assert_bytes_equal(got_cache.reshape(1, bs, 512), want_cache)
    bf16_cache = torch.zeros(1, bs, 512, dtype=torch.bfloat16, device=device)
    got_q = run_full_cache("bf16", q, kv, bf16_cache, slots, positions, bs, device, apply_q_norm=False)
    got_cache = bf16_cache.cpu()[0]
    assert got_cache[0, 5].isnan() and got_cache[1, 70] == float("inf") and got_cache[2, 200] == float("-inf")
    assert got_q[0, 0, 7].isnan() and got_q[1, h - 1, 300] == float("inf") and got_q[2, 0, 9] == float("-inf")
    want_q, want_cache = reference_full_cache("bf16", q, kv, 1, bs, slots, positions, apply_q_norm=False)
    for got, want in ((got_q, want_q), (got_cache, want_cache[0])):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(got.float()), torch.nan_to_num(want.float()))
