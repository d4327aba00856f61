"""The lightning indexer (spec/indexer.md): fp8_mqa_logits, fp8_paged_mqa_logits (MTP rows, block-flat
cache) and the per-row top-k, against the fp32 reference that decodes the same FP8 bytes. The shared cases
run on DEVICES (CPU, and the GPU kernels under the `gpu` marker); the GPU-only cases at the end cover the
matrix-unit shapes (H = 64 / D = 128 and smaller), both encodings, the paged MTP rows, top-k equal to the
CPU kernel index for index, graph capture on a side stream and empty shapes.

Criteria (spec §3.7): the -inf mask bit-equal; on the rest calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3
(kernels that sum in fp32 differ from the reference only in summation order, so the tests also bound the
largest relative difference by 1e-4; the sm_90a prefill kernel sums on Hopper's FP8 tensor cores, whose
fixed-point step sums are bounded elementwise instead, by fp8_tensor_core_error_bound); top-k index sets equal
per row, a swap allowed only where the logits are within 1e-6 of the k-th value (relative to the row's
largest)."""

import pytest
import torch

import dsv4ops
from conftest import DEVICES, capture_graph
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


def assert_logits_match(got, want, window=None, max_relative=1e-4, bound=None):
    """The spec §3.7 criteria (-inf mask bit-equal, no NaN, calc_diff < 1e-3) and either |got - want| <= bound
    elementwise (a [M, N] tensor) or, unless max_relative is None, the largest difference relative to the
    row's largest |value| at most max_relative."""
    if window is None:
        assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0)), "-inf masks differ"
        finite = torch.isfinite(want)
    else:
        finite = window & torch.isfinite(want)
    assert not bool(torch.isnan(got[finite]).any())
    x, y = got[finite], want[finite]
    assert calc_diff(x, y) < 1e-3
    if bound is not None:
        if x.numel():
            excess = float(((x - y).abs() - bound[finite]).max())
            assert excess <= 0, f"a logit differs by {excess} more than its bound"
    elif max_relative is not None and x.numel():
        assert float(((x - y).abs() / y.abs().max().clamp(min=1e-30)).max()) <= max_relative


def assert_topk_overlap(got, want, k, bound=None, minimum=0.99):
    """spec §3.7: top-k is what the model consumes, so per row the k best columns of the kernel's logits and of the
    reference's overlap by at least `minimum`, ties excluded: columns whose reference logit lies within twice the
    comparison's error (`bound`'s row maximum, else 1e-4 of the row's largest) of the k-th value may swap.
    Returns the number of rows compared."""
    checked = 0
    for r in range(want.shape[0]):
        finite = torch.isfinite(want[r])
        count = min(k, int(finite.sum()))
        if count == 0:
            continue
        low = torch.tensor(float("-inf"))
        top_want = torch.topk(torch.where(finite, want[r], low), count).indices
        top_got = torch.topk(torch.where(torch.isfinite(got[r]), got[r], low), count).indices
        kth = want[r, top_want].min()
        error = float(bound[r].max()) if bound is not None else 1e-4 * float(want[r, finite].abs().max())
        ambiguous = set(((want[r] - kth).abs() <= 2 * error).nonzero().flatten().tolist())
        sure_want, sure_got = set(top_want.tolist()) - ambiguous, set(top_got.tolist()) - ambiguous
        if sure_want or sure_got:
            overlap = len(sure_want & sure_got) / max(len(sure_want), len(sure_got))
            assert overlap >= minimum, f"row {r}: top-{k} overlap {overlap:.4f} < {minimum}"
            checked += 1
    return checked


def runs_on_fp8_tensor_cores(device, q, k):
    """Whether fp8_mqa_logits takes the sm_90a warpgroup-MMA kernel here (64 heads, dim 128, OCP q and k on a
    compute capability 9.0 GPU), whose dot products carry Hopper's FP8 summation."""
    return (torch.device(device).type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
            and tuple(q.shape[1:]) == (64, 128) and q.dtype == k.dtype == torch.float8_e4m3fn)


def fp8_tensor_core_error_bound(q, k, k_scale, weights, step=32):
    """Elementwise bound [M, N] on |logit - exact| when each head's dot product runs on Hopper's FP8 tensor
    cores. Their accumulator keeps about 13 mantissa bits: each 32-deep step (one MMA's k) adds its products
    to the running sum and truncates the result to that width (SageAttention 2 and the DeepSeek-V3 report
    §3.5.2 measured this), an error under 2^-12 of the largest magnitude in the step (the running sum
    before or after it, or its largest product). ReLU does not enlarge an error, so the head sum's bound is
    sum_h |w_h| |k_scale| (bound of head h), plus fp32 rounding of the sums. On the H200 the errors of
    random inputs reach about a sixth of this bound."""
    qv = reference._fp8_values(q).double()
    kv = reference._fp8_values(k).double()
    running = torch.zeros(q.shape[0], q.shape[1], k.shape[0], dtype=torch.float64)
    head_bound = torch.zeros_like(running)
    for s in range(0, q.shape[2], step):
        qs, ks_ = qv[..., s : s + step], kv[:, s : s + step]
        largest_product = qs.abs().amax(-1)[:, :, None] * ks_.abs().amax(-1)[None, None, :]
        before = running.abs()
        running += torch.einsum("mhd,nd->mhn", qs, ks_)
        head_bound += 2.0**-12 * torch.maximum(torch.maximum(before, running.abs()), largest_product)
    w = weights.double().abs()[:, :, None]
    scale = reference._k_scale(k_scale).double().abs()[None, :]
    fp32_sums = 1e-6 * (running.abs() * w).sum(1) * scale
    return ((head_bound * w).sum(1) * scale + fp32_sums).float()


def tensor_core_bound(device, q, k, k_scale, weights):
    """The elementwise bound where the FP8 tensor-core kernel runs, else None (the 1e-4 relative check)."""
    return fp8_tensor_core_error_bound(q, k, k_scale, weights) if runs_on_fp8_tensor_cores(device, q, k) else None


def use_kernel(device, monkeypatch):
    """On a GPU, demand the kernel (a silent fallback to the reference would make the GPU cases vacuous)."""
    if device != "cpu":
        monkeypatch.setenv("DSV4OPS_FORCE", "all")


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
@pytest.mark.parametrize("device", DEVICES)
def test_mqa_logits_match_reference(q_dtype, k_dtype, m, n, heads, dim, clean, device, monkeypatch):
    use_kernel(device, monkeypatch)
    q = fp8_tensor((m, heads, dim), q_dtype, seed=m)
    k = fp8_tensor((n, dim), k_dtype, seed=n)
    k_scale = torch.pow(2.0, torch.randint(-3, 3, (n,), generator=torch.Generator().manual_seed(1)).float())
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(2))
    ks, ke = windows(m, n, seed=3)
    got = dsv4ops.fp8_mqa_logits(*(t.to(device) for t in (q, k, k_scale, weights, ks, ke)), clean).cpu()
    want = reference.fp8_mqa_logits(q, k, k_scale, weights, ks, ke)
    assert got.shape == (m, n) and got.dtype == torch.float32
    bound = tensor_core_bound(device, q, k, k_scale, weights)
    if clean:
        assert_logits_match(got, want, bound=bound)
        assert_topk_overlap(got, want, k=max(1, n // 4), bound=bound)
    else:
        columns = torch.arange(n)[None, :]
        window = (columns >= ks.long().clamp(0, n)[:, None]) & (columns < ke.long().clamp(0, n)[:, None])
        assert_logits_match(got, want, window, bound=bound)


@pytest.mark.parametrize("device", DEVICES)
def test_mqa_logits_byte_0x80_reads_as_zero_and_uint8_scales(device, monkeypatch):
    use_kernel(device, monkeypatch)
    m, n, heads, dim = 4, 20, 8, 64
    for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        q = fp8_tensor((m, heads, dim), dtype, seed=4)
        k = fp8_tensor((n, dim), dtype, seed=5)
        q.view(torch.uint8)[:, :, ::7] = 0x80
        k.view(torch.uint8)[:, ::5] = 0x80
        k_scale = torch.full((n,), 0.5)
        ks, ke = torch.zeros(m, dtype=torch.int32), torch.full((m,), n, dtype=torch.int32)
        got = dsv4ops.fp8_mqa_logits(q.to(device), k.to(device), k_scale.view(torch.uint8).reshape(n, 4).to(device),
                                     torch.ones(m, heads, device=device), ks.to(device), ke.to(device)).cpu()
        assert not bool(torch.isnan(got).any())
        zeroed_q, zeroed_k = q.view(torch.uint8).clone(), k.view(torch.uint8).clone()
        zeroed_q[zeroed_q == 0x80] = 0
        zeroed_k[zeroed_k == 0x80] = 0
        want = reference.fp8_mqa_logits(zeroed_q.view(dtype), zeroed_k.view(dtype), k_scale, torch.ones(m, heads), ks,
                                        ke)
        assert_logits_match(got, want)


@pytest.mark.parametrize("heads,dim", [(4, 32), (64, 128)])
@pytest.mark.parametrize("device", DEVICES)
def test_mqa_logits_empty_shapes(heads, dim, device, monkeypatch):
    use_kernel(device, monkeypatch)
    q = fp8_tensor((0, heads, dim), torch.float8_e4m3fn, seed=6).to(device)
    k = fp8_tensor((9, dim), torch.float8_e4m3fn, seed=7).to(device)
    empty = torch.empty(0, dtype=torch.int32, device=device)
    assert dsv4ops.fp8_mqa_logits(q, k, torch.ones(9, device=device), torch.ones(0, heads, device=device), empty,
                                  empty).shape == (0, 9)
    q = fp8_tensor((3, heads, dim), torch.float8_e4m3fn, seed=8).to(device)
    no_keys = dsv4ops.fp8_mqa_logits(q, k[:0], torch.ones(0, device=device), torch.ones(3, heads, device=device),
                                     torch.zeros(3, dtype=torch.int32, device=device),
                                     torch.full((3,), 4, dtype=torch.int32, device=device))
    assert no_keys.shape == (3, 0)


def paged_lens(next_n, lens_shape):
    """context_lens for 3 requests (150, 40, 230 tokens; 230 > the tests' max_len 200 is clamped) as [B],
    [B, 1] or per MTP row [B, next_n] (each row 3 tokens shorter than the one before)."""
    base = torch.tensor([150, 40, 230], dtype=torch.int32)
    if lens_shape == "B":
        return base
    if lens_shape == "B1":
        return base[:, None].contiguous()
    return (base[:, None] - torch.arange(next_n, dtype=torch.int32)[None, :] * 3).contiguous()


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
@pytest.mark.parametrize("device", DEVICES)
def test_paged_logits_match_reference_and_the_contiguous_op(next_n, lens_shape, block_size, dtype, device,
                                                            monkeypatch):
    """The paged reference is checked against an independent construction: each row's visible entries
    gathered into a contiguous K and scored by fp8_mqa_logits with the window [0, len_r). A per-row length
    tensor [B, next_n] exists only with next_n > 1."""
    use_kernel(device, monkeypatch)
    batch, heads, dim, max_len = 3, 8, 64, 200
    entries = [150, 70, 199]
    cache, table, contiguous = paged_cache(entries, block_size, dim, dtype, seed=next_n * block_size)
    lens = paged_lens(next_n, lens_shape)
    q = fp8_tensor((batch, next_n, heads, dim), dtype, seed=9)
    weights = torch.randn(batch * next_n, heads, generator=torch.Generator().manual_seed(10))
    got = dsv4ops.fp8_paged_mqa_logits(*(t.to(device) for t in (q, cache, weights, lens, table)), max_len,
                                       kv_format=dtype).cpu()
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


@pytest.mark.parametrize("heads,dim", [(4, 32), (16, 64), (64, 128)])
@pytest.mark.parametrize("device", DEVICES)
def test_paged_logits_missing_blocks_are_never_read(heads, dim, device, monkeypatch):
    use_kernel(device, monkeypatch)
    block_size = 32
    cache, table, _ = paged_cache([64], block_size, dim, torch.float8_e4m3fn, seed=11, spare_blocks=0)
    q = fp8_tensor((1, 1, heads, dim), torch.float8_e4m3fn, seed=12)
    table = torch.tensor([[table[0, 0], -1, 2**30]], dtype=torch.int32)  # column 1 bad, 2 out of the cache
    got = dsv4ops.fp8_paged_mqa_logits(q.to(device), cache.to(device), torch.ones(1, heads, device=device),
                                       torch.tensor([96], dtype=torch.int32, device=device), table.to(device),
                                       128).cpu()
    assert bool(torch.isfinite(got[0, :32]).all())
    assert bool(torch.isneginf(got[0, 32:]).all())
    lens = torch.tensor([96], dtype=torch.int32)
    bound = paged_tensor_core_bound(device, q, cache, torch.ones(1, heads), lens, table, 128, block_size,
                                    torch.float8_e4m3fn)
    assert_logits_match(got, reference.fp8_paged_mqa_logits(q, cache, torch.ones(1, heads), lens, table, 128),
                        bound=bound)


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
@pytest.mark.parametrize("device", DEVICES)
def test_topk_prefill_and_decode(stable, k, device, monkeypatch):
    use_kernel(device, monkeypatch)
    m, n = 9, 300
    logits = torch.randn(m, n, generator=torch.Generator().manual_seed(13))
    ks, ke = windows(m, n, seed=14)
    logits[0, 10] = float("nan")
    logits[2, :] = float("-inf")
    got = dsv4ops.topk_per_row_prefill(logits.to(device), ks.to(device), ke.to(device), k, stable=stable).cpu()
    want = reference.topk_per_row_prefill(logits, ks, ke, k, stable)
    assert got.dtype == torch.int32 and got.shape == (m, k)
    assert_topk_sets_match(got, want, logits, ks.long().clamp(0, n))
    if stable:
        assert torch.equal(got, want)
    assert bool((got[1] == -1).all()) and bool((got[2] == -1).all()), "empty and all -inf rows give -1"
    lens = ke.clamp(min=0)
    got_decode = dsv4ops.topk_per_row_decode(logits.to(device), lens.to(device), k, stable=stable).cpu()
    want_decode = reference.topk_per_row_decode(logits, lens, k, stable)
    assert_topk_sets_match(got_decode, want_decode, logits, torch.zeros(m, dtype=torch.long))


@pytest.mark.parametrize("device", DEVICES)
def test_topk_ties_and_short_rows(device, monkeypatch):
    use_kernel(device, monkeypatch)
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [5.0, 4.0, float("-inf"), 0.0, 0.0]], device=device)
    lens = torch.tensor([5, 3], dtype=torch.int32, device=device)
    got = dsv4ops.topk_per_row_decode(logits, lens, 2, stable=True)
    assert got.tolist() == [[1, 2], [0, 1]], "ties go to the smaller index"
    got = dsv4ops.topk_per_row_decode(logits, lens, 2, stable=False)
    assert got.tolist() == [[1, 2], [0, 1]], "value order, ties to the smaller index"
    got = dsv4ops.topk_per_row_decode(logits, lens, 4, stable=False)
    assert got.tolist() == [[1, 2, 4, 3], [0, 1, -1, -1]]
    got = dsv4ops.topk_per_row_decode(logits, lens, 4, stable=True)
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
        ((q[:, :0], k, torch.ones(10), torch.ones(3, 0), ks, ke), "q must have at least one head"),
    ]:
        with pytest.raises(RuntimeError, match=match):
            torch.ops.dsv4.fp8_mqa_logits(*args, True)
    with pytest.raises(RuntimeError, match="q must have at least one head"):
        torch.ops.dsv4.fp8_paged_mqa_logits(q.reshape(3, 1, 4, 32)[:, :, :0], torch.zeros(2, 100, dtype=torch.uint8),
                                            torch.ones(3, 0), torch.ones(3, dtype=torch.int32),
                                            torch.zeros(3, 2, dtype=torch.int32), 8, True, 0)
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


@pytest.mark.parametrize("device", DEVICES)
def test_paged_logits_of_an_empty_cache_on_every_path(device, monkeypatch):
    """A cache of no blocks: every position is -inf, through the kernel and the reference alike (the reference
    raised on it)."""
    dim = 32
    q = fp8_tensor((2, 1, 4, dim), torch.float8_e4m3fn, seed=70)
    cache = torch.zeros(0, 16 * (dim + 4), dtype=torch.uint8)
    weights, lens = torch.ones(2, 4), torch.tensor([5, 9], dtype=torch.int32)
    table = torch.zeros(2, 1, dtype=torch.int32)
    want = torch.full((2, 32), float("-inf"))
    args = (q, cache, weights, lens, table)
    assert torch.equal(reference.fp8_paged_mqa_logits(*args, 32), want)
    got = dsv4ops.fp8_paged_mqa_logits(*(t.to(device) for t in args), 32)
    assert torch.equal(got.cpu(), want)
    monkeypatch.setenv("DSV4OPS_DISABLE", "fp8_paged_mqa_logits")
    assert torch.equal(dsv4ops.fp8_paged_mqa_logits(*(t.to(device) for t in args), 32).cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_uint8_scales_at_any_byte_offset(device, monkeypatch):
    """spec §3.2, §3.8: a [N, 4] uint8 view of fp32 scales; one that starts off a 4-byte boundary (a slice of a
    byte buffer) reads the same through the kernel and the reference."""
    m, n, heads, dim = 3, 20, 4, 32
    q = fp8_tensor((m, heads, dim), torch.float8_e4m3fn, seed=71)
    k = fp8_tensor((n, dim), torch.float8_e4m3fn, seed=72)
    scales = torch.pow(2.0, torch.randint(-3, 3, (n,), generator=torch.Generator().manual_seed(73)).float())
    buffer = torch.zeros(n * 4 + 1, dtype=torch.uint8)
    buffer[1:] = scales.view(torch.uint8)
    odd = buffer[1:].view(n, 4)
    assert odd.storage_offset() % 4 == 1
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(74))
    ks, ke = torch.zeros(m, dtype=torch.int32), torch.full((m,), n, dtype=torch.int32)
    want = reference.fp8_mqa_logits(q, k, scales, weights, ks, ke)
    assert torch.equal(reference.fp8_mqa_logits(q, k, odd, weights, ks, ke), want)
    odd_on_device = buffer.to(device)[1:].view(n, 4)  # .to() of the view itself would copy it aligned
    args = [t.to(device) for t in (q, k)] + [odd_on_device] + [t.to(device) for t in (weights, ks, ke)]
    assert args[2].storage_offset() % 4 == 1
    assert_logits_match(dsv4ops.fp8_mqa_logits(*args).cpu(), want, bound=tensor_core_bound(device, q, k, scales,
                                                                                            weights))
    aligned = scales.view(torch.uint8).view(n, 4).to(device)
    compiled = torch.compile(lambda q_: dsv4ops.fp8_mqa_logits(q_, args[1], aligned, *args[3:]), fullgraph=True)
    assert torch.equal(compiled(args[0]), dsv4ops.fp8_mqa_logits(args[0], args[1], aligned, *args[3:]))
    monkeypatch.setenv("DSV4OPS_DISABLE", "fp8_mqa_logits")
    assert torch.equal(dsv4ops.fp8_mqa_logits(*args).cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_of_column_strided_logits(device, monkeypatch):
    """spec §5: logits [M, N] at any strides, a column-strided view (a transpose) included."""
    use_kernel(device, monkeypatch)
    logits = torch.randn(300, 6, generator=torch.Generator().manual_seed(75)).t()  # [6, 300], column stride 6
    assert logits.stride(1) != 1
    ks, ke = torch.tensor([0, 5, 10, 0, 299, 3], dtype=torch.int32), torch.tensor([300] * 6, dtype=torch.int32)
    for stable in (False, True):
        got = dsv4ops.topk_per_row_prefill(logits.to(device), ks.to(device), ke.to(device), 16, stable=stable).cpu()
        if stable:
            assert torch.equal(got, reference.topk_per_row_prefill(logits, ks, ke, 16, True))
        assert_topk_sets_match(got, reference.topk_per_row_prefill(logits, ks, ke, 16, stable), logits, ks.long())
        got = dsv4ops.topk_per_row_decode(logits.to(device), ke.to(device), 16, stable=stable).cpu()
        assert_topk_sets_match(got, reference.topk_per_row_decode(logits, ke, 16, stable), logits,
                               torch.zeros(6, dtype=torch.long))


def test_triton_paged_fallback_refuses_unaligned_block_scales(monkeypatch):
    """The Triton kernel reads a block's fp32 scales 4-byte aligned: a block of block_size x D FP8 bytes that is
    not a multiple of 4 is not its to serve (the wrapper sends such a call to the reference, with the reason)."""
    from dsv4ops import indexer_triton

    q = fp8_tensor((1, 1, 4, 6), torch.float8_e4m3fn, seed=76)  # D = 6
    odd = torch.zeros(2, 3 * (6 + 4), dtype=torch.uint8)  # block_size 3: 18 FP8 bytes before the scales
    even = torch.zeros(2, 4 * (6 + 4), dtype=torch.uint8)  # block_size 4: 24
    assert "not a multiple of 4" in indexer_triton.paged_cache_unsupported(q, odd)
    assert indexer_triton.paged_cache_unsupported(q, even) is None
    args = (q, odd, torch.ones(1, 4), torch.tensor([3], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), 8)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        indexer_triton.fp8_paged_mqa_logits(*args)
    # where the wrapper would take Triton (a GPU without a kernel), this cache goes to the reference, reason logged
    monkeypatch.setattr(dsv4ops.indexer, "logits_path", lambda op, device: (dsv4ops.indexer.TRITON, "no kernel"))
    assert torch.equal(dsv4ops.fp8_paged_mqa_logits(*args), reference.fp8_paged_mqa_logits(*args))
    (reason,) = [why for (op, why) in dsv4ops.fallback_counts() if op == "fp8_paged_mqa_logits"]
    assert reason.startswith("no kernel; the Triton kernel reads a block's fp32 scales 4-byte aligned")


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


# ---- GPU-only cases: the matrix-unit kernels against the CPU kernel and the reference on the same bytes ----

GPU_SHAPES = [(64, 128), (32, 128), (16, 128), (64, 64), (16, 64), (8, 32)]  # (8, 32): the scalar kernel


def plant_0x80(t, every):
    t.view(torch.uint8).view(-1)[::every] = 0x80
    return t


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("k_dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", GPU_SHAPES, ids=[f"h{h}d{d}" for h, d in GPU_SHAPES])
def test_gpu_mqa_logits_match_cpu_and_reference(q_dtype, k_dtype, heads, dim):
    m, n = 67, 1100
    q = plant_0x80(fp8_tensor((m, heads, dim), q_dtype, seed=60), 97)
    k = plant_0x80(fp8_tensor((n, dim), k_dtype, seed=61), 89)
    k_scale = torch.pow(2.0, torch.randint(-4, 4, (n,), generator=torch.Generator().manual_seed(62)).float())
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(63))
    ks, ke = windows(m, n, seed=64)  # ragged, an empty row, ke > N, negative ks
    ks[2], ke[2] = 0, n + 100
    ks[3], ke[3] = n - 3, n
    args = (q, k, k_scale, weights, ks, ke)
    got = torch.ops.dsv4.fp8_mqa_logits(*(t.cuda() for t in args), True).cpu()
    cpu = torch.ops.dsv4.fp8_mqa_logits(*args, True)
    want = reference.fp8_mqa_logits(*args)
    bound = tensor_core_bound("cuda", q, k, k_scale, weights)
    assert_logits_match(got, want, bound=bound)
    assert_logits_match(got, cpu, bound=None if bound is None else 2 * bound)  # both differ from the exact sums
    assert assert_topk_overlap(got, want, k=256, bound=bound) > m // 2
    # clean_logits=False leaves the columns outside the window untouched
    out = torch.ops.dsv4.fp8_mqa_logits(*(t.cuda() for t in args), False).cpu()
    columns = torch.arange(n)[None, :]
    window = (columns >= ks.long().clamp(0, n)[:, None]) & (columns < ke.long().clamp(0, n)[:, None])
    assert torch.equal(out[window], got[window])


@pytest.mark.gpu
def test_gpu_mqa_logits_strided_q_and_dsv4_fold():
    """q as a view with a padded row stride (the matrix path) and one at an odd byte offset (the scalar path),
    with the DSv4 weight fold and causal compressed windows."""
    m, n, heads, dim = 40, 700, 64, 128
    base = fp8_tensor((m, heads + 1, dim), torch.float8_e4m3fn, seed=65)
    k = fp8_tensor((n, dim), torch.float8_e4m3fn, seed=66)
    k_scale = torch.pow(2.0, torch.randint(-2, 2, (n,), generator=torch.Generator().manual_seed(67)).float())
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(68)) * (128**-0.5 * 64**-0.5)
    p = torch.arange(m, dtype=torch.int32) * 16 + 40
    ks, ke = torch.zeros(m, dtype=torch.int32), ((p + 1) // 4).to(torch.int32)

    def padded(t):
        return t[:, :heads]

    def misaligned(t):
        return t.view(torch.uint8).reshape(-1)[1 : 1 + m * heads * dim].view(t.dtype).reshape(m, heads, dim)

    for view in (padded, misaligned):
        q, q_gpu = view(base), view(base.cuda())
        assert q_gpu.data_ptr() % 16 == (0 if view is padded else 1)
        got = torch.ops.dsv4.fp8_mqa_logits(q_gpu, *(t.cuda() for t in (k, k_scale, weights, ks, ke)), True).cpu()
        bound = tensor_core_bound("cuda", q, k, k_scale, weights) if view is padded else None  # else the scalar path
        assert_logits_match(got, reference.fp8_mqa_logits(q, k, k_scale, weights, ks, ke), bound=bound)


def paged_inputs(batch, next_n, heads, dim, block_size, dtype, q_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    entries = torch.randint(1, 700, (batch,), generator=g).tolist()
    cache, table, _ = paged_cache(entries, block_size, dim, dtype, seed=seed)
    cache[:, : block_size * dim : 61] = 0x80  # FP8 bytes only (a planted scale byte could flip a scale's sign)
    lens = torch.tensor(entries, dtype=torch.int32)
    lens[0] = 0  # a request with nothing visible
    if batch > 2:
        lens[2] = 5000  # past max_model_len: clamped (its table entries past the request are "valid but irrelevant")
    q = plant_0x80(fp8_tensor((batch, next_n, heads, dim), q_dtype, seed=seed + 1), 101)
    weights = torch.randn(batch * next_n, heads, generator=g)
    return q, cache, weights, lens, table


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("block_size", [32, 64])
@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.float8_e4m3fn, torch.float8_e4m3fn),
                                              (torch.float8_e4m3fnuz, torch.float8_e4m3fn),
                                              (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz)], ids=["fn-fn", "fnuz-fn", "fnuz-fnuz"])
@pytest.mark.parametrize("heads,dim", [(64, 128), (32, 64)])
def test_gpu_paged_logits_match_cpu_and_reference(next_n, block_size, q_dtype, kv_dtype, heads, dim):
    batch, max_len = 5, 640
    q, cache, weights, lens, table = paged_inputs(batch, next_n, heads, dim, block_size, kv_dtype, q_dtype,
                                                  seed=70 + next_n + block_size)
    fmt = 0 if kv_dtype == torch.float8_e4m3fn else 1
    args = (q, cache, weights, lens, table)
    got = torch.ops.dsv4.fp8_paged_mqa_logits(*(t.cuda() for t in args), max_len, True, fmt).cpu()
    cpu = torch.ops.dsv4.fp8_paged_mqa_logits(*args, max_len, True, fmt)
    want = reference.fp8_paged_mqa_logits(*args, max_len, True, kv_dtype)
    bound = paged_tensor_core_bound("cuda", q, cache, weights, lens, table, max_len, block_size, kv_dtype)
    assert_logits_match(got, want, bound=bound)
    assert_logits_match(got, cpu, bound=None if bound is None else 2 * bound)
    assert assert_topk_overlap(got, want, k=128, bound=bound) > 0
    if next_n > 1:  # per-row lengths [B, next_n]
        per_row = (lens[:, None] - torch.arange(next_n, dtype=torch.int32)[None, :] * 7).contiguous()
        args = (q, cache, weights, per_row, table)
        got = torch.ops.dsv4.fp8_paged_mqa_logits(*(t.cuda() for t in args), max_len, True, fmt).cpu()
        bound = paged_tensor_core_bound("cuda", q, cache, weights, per_row, table, max_len, block_size, kv_dtype)
        assert_logits_match(got, torch.ops.dsv4.fp8_paged_mqa_logits(*args, max_len, True, fmt),
                            bound=None if bound is None else 2 * bound)


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("block_size", [8, 16, 128, 256])
def test_gpu_paged_logits_tma_block_sizes(next_n, block_size):
    """The sm_90a TMA decode kernel (64 heads x 128 dims, OCP, next_n <= 2) takes one tensor-map box per cache
    block of a 256-key tile, so block sizes 8 to 256 change its copies: each against the reference (32 and 64
    run in the test above)."""
    heads, dim, max_len = 64, 128, 640
    q, cache, weights, lens, table = paged_inputs(6, next_n, heads, dim, block_size, torch.float8_e4m3fn,
                                                  torch.float8_e4m3fn, seed=170 + next_n + block_size)
    args = (q, cache, weights, lens, table)
    got = torch.ops.dsv4.fp8_paged_mqa_logits(*(t.cuda() for t in args), max_len, True, 0).cpu()
    want = reference.fp8_paged_mqa_logits(*args, max_len, True, torch.float8_e4m3fn)
    bound = paged_tensor_core_bound("cuda", q, cache, weights, lens, table, max_len, block_size, torch.float8_e4m3fn)
    assert_logits_match(got, want, bound=bound)


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2])
def test_gpu_paged_logits_long_contexts(next_n):
    """Long ragged contexts (40 requests of up to 4000 entries, up to 16 key tiles of the tensor-core kernel
    each), an empty request and one whose length passes max_model_len."""
    batch, heads, dim, block_size, max_len = 40, 64, 128, 64, 4096
    g = torch.Generator().manual_seed(90 + next_n)
    entries = torch.randint(1, 4000, (batch,), generator=g).tolist()
    cache, table, _ = paged_cache(entries, block_size, dim, torch.float8_e4m3fn, seed=91)
    lens = torch.tensor(entries, dtype=torch.int32)
    lens[0], lens[1] = 0, 9000
    q = fp8_tensor((batch, next_n, heads, dim), torch.float8_e4m3fn, seed=92)
    weights = torch.randn(batch * next_n, heads, generator=g)
    args = (q, cache, weights, lens, table)
    got = torch.ops.dsv4.fp8_paged_mqa_logits(*(t.cuda() for t in args), max_len, True, 0).cpu()
    want = reference.fp8_paged_mqa_logits(*args, max_len, True, torch.float8_e4m3fn)
    bound = paged_tensor_core_bound("cuda", q, cache, weights, lens, table, max_len, block_size, torch.float8_e4m3fn)
    assert_logits_match(got, want, bound=bound)


def paged_tensor_core_bound(device, q, cache, weights, lens, table, max_len, block_size, kv_dtype):
    """fp8_tensor_core_error_bound for each row of the paged op, over the keys its block-table row reaches
    (unreadable entries are -inf on both sides; their bound is unused), or None off the tensor-core kernel."""
    batch, next_n, heads, dim = q.shape
    k_probe = torch.empty(0, dim, dtype=kv_dtype)
    if not runs_on_fp8_tensor_cores(device, q.reshape(-1, heads, dim), k_probe):
        return None
    row_lens = reference.paged_row_lengths(lens, batch, next_n, max_len)
    bound = torch.zeros(batch * next_n, max_len)
    for r in range(batch * next_n):
        length = int(row_lens[r])
        j = torch.arange(length)
        column = j // block_size
        blocks = table[r // next_n, column.clamp(max=table.shape[1] - 1)].long()
        readable = (column < table.shape[1]) & (blocks >= 0) & (blocks < cache.shape[0])
        blocks = torch.where(readable, blocks, torch.zeros_like(blocks))
        entry = (j % block_size)[:, None]
        keys = cache[blocks[:, None], entry * dim + torch.arange(dim)[None, :]].contiguous().view(kv_dtype)
        scales = cache[blocks[:, None], block_size * dim + entry * 4 + torch.arange(4)[None, :]].contiguous()
        bound[r, :length] = fp8_tensor_core_error_bound(q.reshape(-1, heads, dim)[r : r + 1], keys,
                                                        scales.view(torch.float32).reshape(-1), weights[r : r + 1])[0]
    return bound


TOPK_CASES = [(4, 5000, 512), (3, 33000, 1024), (5, 700, 1024), (2, 9000, 4096), (6, 3000, 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,k", TOPK_CASES, ids=[f"r{r}c{c}k{k}" for r, c, k in TOPK_CASES])
@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("values", ["randn", "ties"])
def test_gpu_topk_equals_cpu_index_for_index(rows, cols, k, stable, values):
    g = torch.Generator().manual_seed(rows * cols + k)
    logits = torch.randn(rows, cols, generator=g)
    if values == "ties":  # few distinct values, +-0, +inf: the order among equal values decides
        logits = torch.randint(-6, 6, (rows, cols), generator=g).float() / 4
        logits[logits == 0] = torch.where(torch.rand(int((logits == 0).sum()), generator=g) < 0.5, -0.0, 0.0)
        logits[:, 5] = float("inf")
    logits[0, ::13] = float("nan")
    logits[:, 1::17] = float("-inf")
    ks, ke = windows(rows, cols, seed=cols)
    if rows > 3:
        ks[3], ke[3] = 0, cols + 50
    for fn, extra in ((torch.ops.dsv4.topk_per_row_prefill, (ks, ke)),
                      (torch.ops.dsv4.topk_per_row_decode, (ke.clamp(min=0),))):
        want = torch.empty(rows, k, dtype=torch.int32)
        fn(logits, *extra, k, stable, out=want)
        got = torch.full((rows, k), 12345, dtype=torch.int32, device="cuda")
        fn(logits.cuda(), *(t.cuda() for t in extra), k, stable, out=got)
        assert torch.equal(got.cpu(), want)


@pytest.mark.gpu
def test_gpu_topk_on_a_strided_logits_view_and_wide_k():
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(80))
    view = logits[:, 100:2100]
    lens = torch.tensor([2000, 1500, 0, 7], dtype=torch.int32)
    want = torch.empty(4, 600, dtype=torch.int32)
    torch.ops.dsv4.topk_per_row_decode(view, lens, 600, False, out=want)
    view_gpu = logits.cuda()[:, 100:2100]  # the same row stride on the GPU
    assert view_gpu.stride(0) == 3000
    got = torch.empty(4, 600, dtype=torch.int32, device="cuda")
    torch.ops.dsv4.topk_per_row_decode(view_gpu, lens.cuda(), 600, False, out=got)
    assert torch.equal(got.cpu(), want)
    with pytest.raises(RuntimeError, match="k <= 4096"):
        torch.ops.dsv4.topk_per_row_decode(view_gpu, lens.cuda(), 5000, False,
                                           out=torch.empty(4, 5000, dtype=torch.int32, device="cuda"))
    # the wrapper serves such a k with the reference
    out = dsv4ops.topk_per_row_decode(view_gpu, lens.cuda(), 5000)
    assert out.shape == (4, 5000)


@pytest.mark.gpu
def test_gpu_graph_capture_on_a_side_stream():
    m, n, heads, dim = 48, 2000, 64, 128
    q = fp8_tensor((m, heads, dim), torch.float8_e4m3fn, seed=90).cuda()
    k = fp8_tensor((n, dim), torch.float8_e4m3fn, seed=91).cuda()
    k_scale = torch.ones(n, device="cuda")
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(92)).cuda()
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = (torch.arange(m, dtype=torch.int32, device="cuda") + 1) * 40
    paged_q, cache, paged_w, lens, table = (t.cuda() for t in paged_inputs(4, 2, heads, dim, 64, torch.float8_e4m3fn,
                                                                          torch.float8_e4m3fn, seed=93))

    def step():
        logits = torch.ops.dsv4.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, True)
        top = torch.empty(m, 512, dtype=torch.int32, device="cuda")
        torch.ops.dsv4.topk_per_row_prefill(logits, ks, ke, 512, False, out=top)
        paged = torch.ops.dsv4.fp8_paged_mqa_logits(paged_q, cache, paged_w, lens, table, 800, True, 0)
        return logits, top, paged

    graph, captured = capture_graph(step)
    first = [out.clone() for out in captured]
    # Fresh values in every input before the replay, the windows, context lengths and block table included
    # (a decode graph is replayed on each step's lengths and tables).
    g = torch.Generator().manual_seed(96)
    q.copy_(fp8_tensor(tuple(q.shape), torch.float8_e4m3fn, seed=97).cuda())
    k.copy_(fp8_tensor(tuple(k.shape), torch.float8_e4m3fn, seed=98).cuda())
    k_scale.copy_(torch.pow(2.0, torch.randint(-2, 3, (n,), generator=g).float()).cuda())
    weights.copy_(torch.randn(m, heads, generator=g).cuda())
    ks.copy_(torch.randint(0, 300, (m,), generator=g, dtype=torch.int32).cuda())
    ke.copy_(ks + torch.randint(0, 1800, (m,), generator=g, dtype=torch.int32).cuda())
    paged_q.copy_(fp8_tensor(tuple(paged_q.shape), torch.float8_e4m3fn, seed=99).cuda())
    cache.copy_(torch.roll(cache, 1, 0))
    paged_w.copy_(torch.randn(tuple(paged_w.shape), generator=g).cuda())
    lens.copy_(torch.randint(0, table.shape[1] * 64 + 1, tuple(lens.shape), generator=g, dtype=torch.int32).cuda())
    table.copy_(torch.randint(0, cache.shape[0], tuple(table.shape), generator=g, dtype=torch.int32).cuda())
    for out in captured:
        out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for a, b, old in zip(captured, eager, first):
        assert not torch.equal(b, old), "the fresh inputs must change every output"
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_empty_shapes():
    dev = "cuda"
    k = fp8_tensor((0, 128), torch.float8_e4m3fn, seed=94).to(dev)
    q = fp8_tensor((5, 64, 128), torch.float8_e4m3fn, seed=95).to(dev)
    z = torch.zeros(5, dtype=torch.int32, device=dev)
    assert torch.ops.dsv4.fp8_mqa_logits(q, k, torch.ones(0, device=dev), torch.ones(5, 64, device=dev), z, z,
                                         True).shape == (5, 0)
    q0 = fp8_tensor((0, 64, 128), torch.float8_e4m3fn, seed=96).to(dev)
    e = torch.empty(0, dtype=torch.int32, device=dev)
    assert torch.ops.dsv4.fp8_mqa_logits(q0, fp8_tensor((7, 128), torch.float8_e4m3fn, seed=97).to(dev),
                                         torch.ones(7, device=dev), torch.ones(0, 64, device=dev), e, e,
                                         True).shape == (0, 7)
    q, cache, weights, lens, table = (t.to(dev) for t in paged_inputs(2, 1, 64, 128, 64, torch.float8_e4m3fn,
                                                                      torch.float8_e4m3fn, seed=98))
    assert torch.ops.dsv4.fp8_paged_mqa_logits(q, cache, weights, lens, table, 0, True, 0).shape == (2, 0)
    top = torch.empty(3, 4, dtype=torch.int32, device=dev)
    torch.ops.dsv4.topk_per_row_decode(torch.empty(3, 0, device=dev), torch.zeros(3, dtype=torch.int32, device=dev),
                                       4, False, out=top)
    assert bool((top == -1).all())
