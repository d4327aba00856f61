"""The lightning indexer (spec/indexer.md): fp8_mqa_logits, fp8_paged_mqa_logits (MTP rows, block-flat
cache) and the per-row top-k, against the fp32 reference that decodes the same FP8 bytes. CPU kernels so
far.

Criteria (spec §3.7): the -inf mask bit-equal; on the rest calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3
(the kernels and the reference differ only in fp32 summation order, so the tests also bound the largest
relative difference by 1e-4); top-k index sets equal per row, a swap allowed only where the logits are
within 1e-6 of the k-th value (relative to the row's largest)."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import indexer as reference
from dsv4ops.reference import fp8 as reference_fp8

DTYPES = [pytest.param(torch.float8_e4m3fn, id="fn"), pytest.param(torch.float8_e4m3fnuz, id="fnuz")]


def fp8_tensor(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    fmt = 0 if dtype == torch.float8_e4m3fn else 1
    values = torch.randn(*shape, generator=g) * scale
    return reference_fp8.fp8_encode(values, fmt, 448.0 if fmt == 0 else 224.0).view(dtype)


def calc_diff(x, y):
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator) if float(denominator) > 0 else 0.0


def assert_logits_match(got, want, window=None):
    if window is None:
        assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0)), "-inf masks differ"
        finite = torch.isfinite(want)
    else:
        finite = window & torch.isfinite(want)
    assert not bool(torch.isnan(got[finite]).any())
    x, y = got[finite], want[finite]
    assert calc_diff(x, y) < 1e-3
    if x.numel():
        assert float(((x - y).abs() / y.abs().max().clamp(min=1e-30)).max()) <= 1e-4


def windows(m, n, seed):
    """Ragged [ks, ke): causal-like growth, an empty row (ke <= ks), ke past N, negative ks."""
    g = torch.Generator().manual_seed(seed)
    ks = torch.randint(-3, max(1, n // 2), (m,), generator=g)
    ke = ks + torch.randint(0, n + 8, (m,), generator=g)
    if m > 1:
        ks[1], ke[1] = 5, 5
    return ks.to(torch.int32), ke.to(torch.int32)


@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("k_dtype", DTYPES)
@pytest.mark.parametrize("m,n,heads,dim", [(7, 50, 8, 32), (33, 300, 64, 128), (1, 1, 4, 64)])
@pytest.mark.parametrize("clean", [True, False])
def test_mqa_logits_match_reference(q_dtype, k_dtype, m, n, heads, dim, clean):
    q = fp8_tensor((m, heads, dim), q_dtype, seed=m)
    k = fp8_tensor((n, dim), k_dtype, seed=n)
    k_scale = torch.pow(2.0, torch.randint(-3, 3, (n,), generator=torch.Generator().manual_seed(1)).float())
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(2))
    ks, ke = windows(m, n, seed=3)
    got = dsv4ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean)
    want = reference.fp8_mqa_logits(q, k, k_scale, weights, ks, ke)
    assert got.shape == (m, n) and got.dtype == torch.float32
    if clean:
        assert_logits_match(got, want)
    else:
        columns = torch.arange(n)[None, :]
        window = (columns >= ks.long().clamp(0, n)[:, None]) & (columns < ke.long().clamp(0, n)[:, None])
        assert_logits_match(got, want, window)


def test_mqa_logits_byte_0x80_reads_as_zero_and_uint8_scales():
    m, n, heads, dim = 4, 20, 8, 64
    for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        q = fp8_tensor((m, heads, dim), dtype, seed=4)
        k = fp8_tensor((n, dim), dtype, seed=5)
        q.view(torch.uint8)[:, :, ::7] = 0x80
        k.view(torch.uint8)[:, ::5] = 0x80
        k_scale = torch.full((n,), 0.5)
        ks, ke = torch.zeros(m, dtype=torch.int32), torch.full((m,), n, dtype=torch.int32)
        got = dsv4ops.fp8_mqa_logits(q, k, k_scale.view(torch.uint8).reshape(n, 4), torch.ones(m, heads), ks, ke)
        assert not bool(torch.isnan(got).any())
        zeroed_q, zeroed_k = q.view(torch.uint8).clone(), k.view(torch.uint8).clone()
        zeroed_q[zeroed_q == 0x80] = 0
        zeroed_k[zeroed_k == 0x80] = 0
        want = reference.fp8_mqa_logits(zeroed_q.view(dtype), zeroed_k.view(dtype), k_scale, torch.ones(m, heads), ks,
                                        ke)
        assert_logits_match(got, want)


def test_mqa_logits_empty_shapes():
    q = fp8_tensor((0, 4, 32), torch.float8_e4m3fn, seed=6)
    k = fp8_tensor((9, 32), torch.float8_e4m3fn, seed=7)
    empty = torch.empty(0, dtype=torch.int32)
    assert dsv4ops.fp8_mqa_logits(q, k, torch.ones(9), torch.ones(0, 4), empty, empty).shape == (0, 9)
    q = fp8_tensor((3, 4, 32), torch.float8_e4m3fn, seed=8)
    no_keys = dsv4ops.fp8_mqa_logits(q, k[:0], torch.ones(0), torch.ones(3, 4), torch.zeros(3, dtype=torch.int32),
                                     torch.full((3,), 4, dtype=torch.int32))
    assert no_keys.shape == (3, 0)


def paged_cache(entries_per_request, block_size, dim, dtype, seed, spare_blocks=3):
    """A block-flat indexer cache holding each request's compressed entries in shuffled blocks, its block
    table (with unused trailing entries pointing anywhere), and the contiguous K/scales per request."""
    g = torch.Generator().manual_seed(seed)
    per_request_blocks = [-(-e // block_size) for e in entries_per_request]
    total_blocks = sum(per_request_blocks) + spare_blocks
    cache = torch.zeros(total_blocks, block_size * (dim + 4), dtype=torch.uint8)
    order = torch.randperm(total_blocks, generator=g).tolist()
    width = max(per_request_blocks) + 2
    table = torch.randint(0, total_blocks, (len(entries_per_request), width), generator=g).to(torch.int32)
    contiguous = []
    for b, entries in enumerate(entries_per_request):
        k = fp8_tensor((entries, dim), dtype, seed=seed + b)
        scales = torch.pow(2.0, torch.randint(-2, 3, (entries,), generator=g).float())
        for i in range(per_request_blocks[b]):
            block = order.pop()
            table[b, i] = block
            chunk = slice(i * block_size, min((i + 1) * block_size, entries))
            count = chunk.stop - chunk.start
            cache[block, : count * dim] = k[chunk].view(torch.uint8).reshape(-1)
            start = block_size * dim
            cache[block, start : start + count * 4] = scales[chunk].view(torch.uint8)
        contiguous.append((k, scales))
    return cache, table, contiguous


LENGTH_FORMS = [(1, "B"), (1, "B1"), (2, "B"), (2, "B1"), (2, "Bn"), (4, "B"), (4, "B1"), (4, "Bn")]


@pytest.mark.parametrize("next_n,lens_shape", LENGTH_FORMS, ids=[f"n{n}-{shape}" for n, shape in LENGTH_FORMS])
@pytest.mark.parametrize("block_size", [32, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_logits_match_reference_and_the_contiguous_op(next_n, lens_shape, block_size, dtype):
    """The paged reference is checked against an independent construction: each row's visible entries
    gathered into a contiguous K and scored by fp8_mqa_logits with the window [0, len_r). A per-row length
    tensor [B, next_n] exists only with next_n > 1."""
    batch, heads, dim, max_len = 3, 8, 64, 200
    entries = [150, 70, 199]
    cache, table, contiguous = paged_cache(entries, block_size, dim, dtype, seed=next_n * block_size)
    base = torch.tensor([150, 40, 230], dtype=torch.int32)  # 230 > max_len: clamped
    if lens_shape == "B":
        lens = base
    elif lens_shape == "B1":
        lens = base[:, None].contiguous()
    else:
        lens = (base[:, None] - torch.arange(next_n, dtype=torch.int32)[None, :] * 3).contiguous()
    q = fp8_tensor((batch, next_n, heads, dim), dtype, seed=9)
    weights = torch.randn(batch * next_n, heads, generator=torch.Generator().manual_seed(10))
    got = dsv4ops.fp8_paged_mqa_logits(q, cache, weights, lens, table, max_len, kv_format=dtype)
    want = reference.fp8_paged_mqa_logits(q, cache, weights, lens, table, max_len)
    assert got.shape == (batch * next_n, max_len)
    assert_logits_match(got, want)
    row_lens = reference.paged_row_lengths(lens, batch, next_n, max_len)
    for r in range(batch * next_n):
        b, length = r // next_n, int(row_lens[r])
        k, scales = contiguous[b]
        visible = min(length, k.shape[0])
        expected = reference.fp8_mqa_logits(q.reshape(-1, heads, dim)[r : r + 1], k[:visible], scales[:visible],
                                            weights[r : r + 1], torch.zeros(1, dtype=torch.int32),
                                            torch.full((1,), visible, dtype=torch.int32))
        assert_logits_match(want[r : r + 1, :visible], expected)


def test_paged_logits_missing_blocks_are_never_read():
    dim, block_size = 32, 32
    cache, table, _ = paged_cache([64], block_size, dim, torch.float8_e4m3fn, seed=11, spare_blocks=0)
    q = fp8_tensor((1, 1, 4, dim), torch.float8_e4m3fn, seed=12)
    table = torch.tensor([[table[0, 0], -1, 2**30]], dtype=torch.int32)  # column 1 bad, 2 out of the cache
    got = dsv4ops.fp8_paged_mqa_logits(q, cache, torch.ones(1, 4), torch.tensor([96], dtype=torch.int32), table, 128)
    assert bool(torch.isfinite(got[0, :32]).all())
    assert bool(torch.isneginf(got[0, 32:]).all())
    assert_logits_match(got, reference.fp8_paged_mqa_logits(q, cache, torch.ones(1, 4),
                                                             torch.tensor([96], dtype=torch.int32), table, 128))


def assert_topk_sets_match(got, want, logits, starts):
    for r in range(got.shape[0]):
        a = set(int(i) for i in got[r] if i >= 0)
        b = set(int(i) for i in want[r] if i >= 0)
        assert len(a) == len(b)
        if a != b:
            row = logits[r, int(starts[r]):]
            kth = min(float(row[i]) for i in b)
            tolerance = 1e-6 * float(row[torch.isfinite(row)].abs().max())
            for i in a ^ b:
                assert abs(float(row[i]) - kth) <= tolerance


@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("k", [1, 8, 64])
def test_topk_prefill_and_decode(stable, k):
    m, n = 9, 300
    logits = torch.randn(m, n, generator=torch.Generator().manual_seed(13))
    ks, ke = windows(m, n, seed=14)
    logits[0, 10] = float("nan")
    logits[2, :] = float("-inf")
    got = dsv4ops.topk_per_row_prefill(logits, ks, ke, k, stable=stable)
    want = reference.topk_per_row_prefill(logits, ks, ke, k, stable)
    assert got.dtype == torch.int32 and got.shape == (m, k)
    assert_topk_sets_match(got, want, logits, ks.long().clamp(0, n))
    if stable:
        assert torch.equal(got, want)
    assert bool((got[1] == -1).all()) and bool((got[2] == -1).all()), "empty and all -inf rows give -1"
    lens = ke.clamp(min=0)
    got_decode = dsv4ops.topk_per_row_decode(logits, lens, k, stable=stable)
    want_decode = reference.topk_per_row_decode(logits, lens, k, stable)
    assert_topk_sets_match(got_decode, want_decode, logits, torch.zeros(m, dtype=torch.long))


def test_topk_ties_and_short_rows():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [5.0, 4.0, float("-inf"), 0.0, 0.0]])
    got = dsv4ops.topk_per_row_decode(logits, torch.tensor([5, 3], dtype=torch.int32), 2, stable=True)
    assert got.tolist() == [[1, 2], [0, 1]], "ties go to the smaller index"
    got = dsv4ops.topk_per_row_decode(logits, torch.tensor([5, 3], dtype=torch.int32), 4, stable=True)
    assert got.tolist() == [[1, 2, 3, 4], [0, 1, -1, -1]], "rows with fewer candidates return all of them"


def test_invalid_inputs_and_op_checks():
    q = fp8_tensor((3, 4, 32), torch.float8_e4m3fn, seed=15)
    k = fp8_tensor((10, 32), torch.float8_e4m3fn, seed=16)
    ks, ke = torch.zeros(3, dtype=torch.int32), torch.full((3,), 10, dtype=torch.int32)
    for args, match in [
        ((q.view(torch.uint8), k, torch.ones(10), torch.ones(3, 4), ks, ke), "q must be float8_e4m3fn"),
        ((q, k[:, :16], torch.ones(10), torch.ones(3, 4), ks, ke), r"k must have shape \[N, 32\]"),
        ((q, k, torch.ones(9), torch.ones(3, 4), ks, ke), r"k_scale must be \[N\] or \[N, 1\]"),
        ((q, k, torch.ones(10), torch.ones(3, 5), ks, ke), r"weights must be \[3, 4\]"),
        ((q, k, torch.ones(10), torch.ones(3, 4), ks.long(), ke), "cu_seqlen_ks must have dtype int32"),
    ]:
        with pytest.raises(RuntimeError, match=match):
            torch.ops.dsv4.fp8_mqa_logits(*args, True)
    with pytest.raises(RuntimeError, match="is not a whole number of 36-byte entries"):
        torch.ops.dsv4.fp8_paged_mqa_logits(q.reshape(3, 1, 4, 32), torch.zeros(2, 100, dtype=torch.uint8),
                                            torch.ones(3, 4), torch.ones(3, dtype=torch.int32),
                                            torch.zeros(3, 2, dtype=torch.int32), 8, True, 0)
    with pytest.raises(RuntimeError, match="k must be >= 1"):
        torch.ops.dsv4.topk_per_row_decode(torch.zeros(2, 5), torch.ones(2, dtype=torch.int32), 0, False,
                                           out=torch.empty(2, 0, dtype=torch.int32))
    weights = torch.randn(3, 4)
    torch.library.opcheck(torch.ops.dsv4.fp8_mqa_logits.default, (q, k, torch.ones(10), weights, ks, ke, True),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    logits = torch.randn(3, 10)
    torch.library.opcheck(torch.ops.dsv4.topk_per_row_prefill.default, (logits, ks, ke, 4, True),
                          {"out": torch.empty(3, 4, dtype=torch.int32)})

    def f(logits):
        out = torch.empty(3, 4, dtype=torch.int32)
        torch.ops.dsv4.topk_per_row_prefill(logits * 1, ks, ke, 4, True, out=out)
        return out

    assert torch.equal(torch.compile(f, fullgraph=True)(logits), f(logits))


def test_paged_default_reads_the_cache_as_ocp_with_fnuz_q():
    """gfx942's pairing: FNUZ indexer Q, OCP indexer K (the writer's encoding on every platform)."""
    dim = 64
    cache, table, contiguous = paged_cache([90], 32, dim, torch.float8_e4m3fn, seed=40)
    q = fp8_tensor((1, 1, 8, dim), torch.float8_e4m3fnuz, seed=41)
    weights = torch.randn(1, 8, generator=torch.Generator().manual_seed(42))
    lens = torch.tensor([90], dtype=torch.int32)
    got = dsv4ops.fp8_paged_mqa_logits(q, cache, weights, lens, table, 96)
    k, scales = contiguous[0]
    want = reference.fp8_mqa_logits(q.reshape(1, 8, dim), k, scales, weights, torch.zeros(1, dtype=torch.int32),
                                    torch.full((1,), 90, dtype=torch.int32))
    assert_logits_match(got[:, :90], want)
    misread = dsv4ops.fp8_paged_mqa_logits(q, cache, weights, lens, table, 96, kv_format="fnuz")
    assert float((misread[:, :90] - got[:, :90]).abs().max()) > 0.1 * float(got[:, :90].abs().max())


def test_strided_k_rows_are_refused():
    q = fp8_tensor((2, 4, 32), torch.float8_e4m3fn, seed=43)
    big = fp8_tensor((1, 64), torch.float8_e4m3fn, seed=44)
    with pytest.raises(RuntimeError, match=r"k must have shape \[N, 32\] with D contiguous"):
        torch.ops.dsv4.fp8_mqa_logits(q, big[:, ::2], torch.ones(1), torch.ones(2, 4), torch.zeros(2, dtype=torch.int32),
                                      torch.ones(2, dtype=torch.int32), True)


def test_paged_and_topk_op_checks_and_empty_inputs():
    dim, block_size = 32, 32
    cache, table, _ = paged_cache([40, 20], block_size, dim, torch.float8_e4m3fn, seed=45)
    q = fp8_tensor((2, 2, 4, dim), torch.float8_e4m3fn, seed=46)
    weights = torch.randn(4, 4, generator=torch.Generator().manual_seed(47))
    lens = torch.tensor([40, 20], dtype=torch.int32)
    args = (q, cache, weights, lens, table, 64, True, 0)
    torch.library.opcheck(torch.ops.dsv4.fp8_paged_mqa_logits.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    logits = torch.ops.dsv4.fp8_paged_mqa_logits(*args)
    row_lens = reference.paged_row_lengths(lens, 2, 2, 64).to(torch.int32)
    torch.library.opcheck(torch.ops.dsv4.topk_per_row_decode.default, (logits, row_lens, 8, True),
                          {"out": torch.empty(4, 8, dtype=torch.int32)})

    def f(q):
        logits = torch.ops.dsv4.fp8_paged_mqa_logits(q, cache, weights, lens, table, 64, True, 0)
        out = torch.empty(4, 8, dtype=torch.int32)
        torch.ops.dsv4.topk_per_row_decode(logits, row_lens, 8, True, out=out)
        return logits, out

    for got, want in zip(torch.compile(f, fullgraph=True)(q), f(q)):
        assert torch.equal(got, want)
    k = fp8_tensor((10, dim), torch.float8_e4m3fn, seed=48)
    q3 = q.reshape(4, 4, dim)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 10, dtype=torch.int32)

    def g(q3):
        return torch.ops.dsv4.fp8_mqa_logits(q3, k, torch.ones(10), weights, ks, ke, True)

    assert torch.equal(torch.compile(g, fullgraph=True)(q3), g(q3))
    # empty: no requests, no rows
    empty_q = fp8_tensor((0, 2, 4, dim), torch.float8_e4m3fn, seed=49)
    assert dsv4ops.fp8_paged_mqa_logits(empty_q, cache, torch.ones(0, 4), torch.empty(0, dtype=torch.int32),
                                        table[:0], 64).shape == (0, 64)
    assert dsv4ops.topk_per_row_decode(torch.empty(0, 5), torch.empty(0, dtype=torch.int32), 3).shape == (0, 3)
    assert dsv4ops.topk_per_row_prefill(torch.empty(0, 5), torch.empty(0, dtype=torch.int32),
                                        torch.empty(0, dtype=torch.int32), 3).shape == (0, 3)
