"""dsv4.sparse_mla_decode (spec/sparse_mla_decode.md) against the PyTorch reference, on caches written by
dsv4ops' own writers in both encodings: every layer type (SWA-only, C4A, C128A), with and without a sink,
split counts 1, 2, 3, 4, 8 and automatic, MTP rows, the encoding flag proven to matter, poisoned records,
the inverse-RoPE epilogue, bad indices, and the usual op checks; on the CPU kernel and (marker `gpu`) the
GPU split-K kernel, which is also compared with the CPU kernel on the same inputs.

Tolerance: the kernels and the reference decode the same key bytes to the same values; they differ in the
order of their fp32 sums (512-term dot products, the softmax sums, the split reduce), a relative error of
a few 1e-6 before the one bf16 rounding of the output. The GPU kernel also rounds the softmax weights P
to bf16 for the P V product on the matrix units (relative 2^-9 per weight, random in sign; l sums the
rounded weights, so the output stays a convex combination of the keys). atol = rtol = 2e-2 as in spec §7
would hide a 1% error; the tests assert rtol = 1e-2 on top of one bf16 ULP of absolute slack (2^-8 of the
row's largest value), tighter than the spec asks."""

import pytest
import torch

import dsv4ops
from conftest import DEVICES, capture_graph
from dsv4ops import Fp8Format
from dsv4ops.reference import sparse_mla as reference

WINDOW = 128
SCALE = 512 ** -0.5


@pytest.fixture(autouse=True)
def _gpu_cases_run_the_kernel(request, monkeypatch, _clean_dispatch_env):
    """GPU cases demand the GPU kernel (DSV4OPS_FORCE): a silent fallback to the reference would make
    them compare the reference with itself."""
    if request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setenv("DSV4OPS_FORCE", "sparse_mla_decode")


def written_cache(tokens, block_size, fmt, seed, magnitude=1.0, device="cpu"):
    """A cache holding `tokens` random rotated K rows at slots 0..tokens-1, written by dsv4ops on `device`."""
    blocks = -(-tokens // block_size) + 1
    cache = torch.zeros(blocks, block_size * 584, dtype=torch.uint8, device=device)
    k = (torch.randn(tokens, 512, generator=torch.Generator().manual_seed(seed)) * magnitude).to(torch.bfloat16)
    dsv4ops.quantize_and_insert_k_cache(k.to(device), cache, torch.arange(tokens, device=device), block_size, fmt)
    return cache


def cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def to(device, *tensors):
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)


def ragged(lists):
    indptr = [0]
    for row in lists:
        indptr.append(indptr[-1] + len(row))
    flat = [i for row in lists for i in row]
    return torch.tensor(flat, dtype=torch.int32), torch.tensor(indptr, dtype=torch.int32)


def decode_rows(positions, ratio, topk=None, seed=0):
    """Per query row at absolute position p: the SWA window slots max(0, p-127)..p, and the compressed slots
    of its layer type (none, C4A: up to `topk` of the (p+1)//4 committed entries, C128A: all (p+1)//128)."""
    g = torch.Generator().manual_seed(seed)
    main, extra = [], []
    for p in positions:
        main.append(list(range(max(0, p - WINDOW + 1), p + 1)))
        committed = (p + 1) // ratio if ratio > 1 else 0
        if ratio == 4:
            chosen = torch.randperm(committed, generator=g)[: min(topk, committed)].tolist()
            extra.append(chosen)
        else:
            extra.append(list(range(committed)))
    return ragged(main), ragged(extra)


def assert_close_to_reference(got, want):
    got, want = got.float().cpu(), want.float().cpu()
    slack = want.abs().amax(dim=-1, keepdim=True) * 2.0**-8
    excess = (got - want).abs() - (1e-2 * want.abs() + slack)
    if float(excess.max()) > 0:
        bad = (excess > 0).nonzero()
        worst = tuple(int(i) for i in (excess == excess.max()).nonzero()[0])
        raise AssertionError(
            f"{bad.shape[0]} of {excess.numel()} values out of tolerance; worst excess {float(excess.max())} at "
            f"(row, head, dim) {worst}: got {float(got[worst])}, want {float(want[worst])}; rows "
            f"{sorted(set(bad[:, 0].tolist()))[:8]}, heads {sorted(set(bad[:, 1].tolist()))[:16]}, dims "
            f"{sorted(set(bad[:, 2].tolist()))[:16]}")


def run(q, main, extra, caches, formats, block_sizes, sink, num_splits=0, *, device, **kwargs):
    """The op on `device` (named by every caller: a test of the GPU kernel must not fall back to the CPU's
    because its q was built on the CPU) and the reference on the CPU, on the same inputs."""
    (main_idx, main_ptr), extra_pair = main, extra
    extra_cache = caches[1] if extra_pair is not None else None
    extra_idx, extra_ptr = extra_pair if extra_pair is not None else (None, None)
    inputs = (q, caches[0], main_idx, main_ptr, extra_cache, extra_idx, extra_ptr, sink)
    q_d, main_d, main_idx_d, main_ptr_d, extra_d, extra_idx_d, extra_ptr_d, sink_d = to(device, *inputs)
    extras = {k: to(device, v)[0] for k, v in kwargs.items()}
    got = dsv4ops.sparse_mla_decode(q_d, main_d, main_idx_d, main_ptr_d, block_sizes[0], extra_d, extra_idx_d,
                                    extra_ptr_d, block_sizes[1], sink_d, SCALE, formats[0], formats[1], num_splits,
                                    **extras)
    q_c, main_c, main_idx_c, main_ptr_c, extra_c, extra_idx_c, extra_ptr_c, sink_c = (cpu(x) for x in inputs)
    want = reference.sparse_mla_decode(q_c, main_c, main_idx_c, main_ptr_c, block_sizes[0], extra_c, extra_idx_c,
                                       extra_ptr_c, block_sizes[1], sink_c, SCALE, formats[0], formats[1],
                                       cpu(kwargs.get("cos_sin")), cpu(kwargs.get("positions")))
    return got, want


LAYERS = [pytest.param(1, None, id="swa"), pytest.param(4, 16, id="c4a"), pytest.param(128, None, id="c128a")]


@pytest.mark.parametrize("ratio,topk", LAYERS)
@pytest.mark.parametrize("main_fmt", [Fp8Format.OCP, Fp8Format.FNUZ])
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, 4, 8])
@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(ratio, topk, main_fmt, with_sink, num_splits, device):
    heads, positions = 5, [0, 3, 130, 700, 1023]  # H not a multiple of 16; windows shorter than 128 included
    main_cache = written_cache(1024, 64, main_fmt, seed=1, device=device)
    extra_cache = written_cache(256, 16, Fp8Format.OCP, seed=2, device=device)  # compressed: OCP everywhere
    main, extra = decode_rows(positions, ratio, topk, seed=3)
    q = torch.randn(len(positions), heads, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    sink = torch.randn(heads, generator=torch.Generator().manual_seed(5)) if with_sink else None
    got, want = run(q, main, extra if ratio > 1 else None, (main_cache, extra_cache), (main_fmt, Fp8Format.OCP),
                    (64, 16), sink, num_splits, device=device)
    assert got.device.type == torch.device(device).type  # the kernel of the device under test ran
    assert_close_to_reference(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_split_counts_agree_with_each_other(device):
    main_cache = written_cache(512, 64, Fp8Format.OCP, seed=6, device=device)
    main = to(device, *decode_rows([511, 200], 1, seed=7)[0])
    q = torch.randn(2, 8, 512, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16).to(device)
    outs = [dsv4ops.sparse_mla_decode(q, main_cache, *main, 64, main_format="ocp", num_splits=s) for s in (1, 2, 3, 8)]
    for other in outs[1:]:
        torch.testing.assert_close(other.float(), outs[0].float(), rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_mtp_rows_have_their_own_windows(device):
    """Several query rows of one request (MTP drafts at p, p+1, p+2): each attends over its own window."""
    main_cache = written_cache(400, 64, Fp8Format.FNUZ, seed=9, device=device)
    main, _ = decode_rows([300, 301, 302], 1)
    q = torch.randn(3, 4, 512, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    q[1] = q[0]
    got, want = run(q, main, None, (main_cache, None), (Fp8Format.FNUZ, Fp8Format.OCP), (64, 64), None,
                    device=device)
    assert_close_to_reference(got, want)
    assert not torch.equal(got[0], got[1]), "rows 0 and 1 share q but not their windows"


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_encoding_flag_is_measurably_wrong(device):
    """A FNUZ-written SWA cache read as OCP (or an OCP compressed cache read as FNUZ) scales every NoPE dim
    by about 2: the output moves far outside the tolerance; the right flags pass (spec §8)."""
    main_cache = written_cache(256, 64, Fp8Format.FNUZ, seed=11, device=device)
    extra_cache = written_cache(64, 16, Fp8Format.OCP, seed=12, device=device)
    main, extra = decode_rows([255], 4, topk=32)
    q = torch.randn(1, 8, 512, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    right, want = run(q, main, extra, (main_cache, extra_cache), (Fp8Format.FNUZ, Fp8Format.OCP), (64, 16), None,
                      device=device)
    assert_close_to_reference(right, want)
    for formats in ((Fp8Format.OCP, Fp8Format.OCP), (Fp8Format.FNUZ, Fp8Format.FNUZ)):
        wrong, want_wrong = run(q, main, extra, (main_cache, extra_cache), formats, (64, 16), None, device=device)
        assert_close_to_reference(wrong, want_wrong)  # the kernel reads the bytes the way the flag says
        relative = float((wrong.float() - right.float()).norm() / right.float().norm())
        assert relative > 0.1, f"{formats}: the flag made only a {relative:.3f} difference"


@pytest.mark.parametrize("device", DEVICES)
def test_poisoned_records(device):
    """A record with scale byte 255 and a NaN RoPE value: no NaN anywhere; rows that select it treat its
    NaN dims as 0 (a defined result, equal to the reference); rows that do not select it are unaffected."""
    main_cache = written_cache(128, 64, Fp8Format.OCP, seed=14)
    clean = main_cache.clone()
    record = 5
    main_cache[0, 64 * 576 + record * 8 + 2] = 255  # scale byte of NoPE block 2 of slot 5
    main_cache[0, record * 576 + 448 : record * 576 + 450] = torch.tensor([0xC0, 0x7F], dtype=torch.uint8)  # NaN
    main_cache[0, record * 576 + 452 : record * 576 + 454] = torch.tensor([0x80, 0x7F], dtype=torch.uint8)  # +Inf
    q = torch.randn(2, 4, 512, generator=torch.Generator().manual_seed(15)).to(torch.bfloat16)
    indices, indptr = ragged([[3, 4, 5, 6], [3, 4, 6]])
    want = reference.sparse_mla_decode(q, main_cache, indices, indptr, 64, None, None, None, 64, None, SCALE, 0)
    q, main_cache, clean, indices, indptr = to(device, q, main_cache, clean, indices, indptr)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp")
    assert not bool(torch.isnan(got).any())
    assert_close_to_reference(got, want)
    unpoisoned = dsv4ops.sparse_mla_decode(q, clean, indices, indptr, 64, main_format="ocp")
    assert torch.equal(got[1], unpoisoned[1])


@pytest.mark.parametrize("device", DEVICES)
def test_huge_block_scales(device):
    """Scale bytes above 240, where a key value times its block scale can overflow: values that overflow
    read as 0, the finite ones (up to ~2^127) keep their size. Slot 5's block 2 (scale 2^123) holds both
    kinds; slot 6's block 5 (scale 2^114) only finite ones. q is zero on those dims, so the scores stay
    finite and the huge values reach the output through V alone."""
    main_cache = written_cache(128, 64, Fp8Format.OCP, seed=18)
    clean = main_cache.clone()
    for record, block, scale_byte in ((5, 2, 250), (6, 5, 241)):
        main_cache[0, 64 * 576 + record * 8 + block] = scale_byte
    q = torch.randn(2, 4, 512, generator=torch.Generator().manual_seed(19))
    q[..., 128:192] = 0
    q[..., 320:384] = 0
    q = q.to(torch.bfloat16)
    indices, indptr = ragged([[3, 4, 5, 6], [3, 4, 7]])
    want = reference.sparse_mla_decode(q, main_cache, indices, indptr, 64, None, None, None, 64, None, SCALE, 0)
    assert bool(torch.isfinite(want).all()) and float(want[0, :, 128:192].float().abs().max()) > 2.0**100
    q, main_cache, clean, indices, indptr = to(device, q, main_cache, clean, indices, indptr)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp")
    assert bool(torch.isfinite(got).all())
    assert_close_to_reference(got, want)
    unpoisoned = dsv4ops.sparse_mla_decode(q, clean, indices, indptr, 64, main_format="ocp")
    assert torch.equal(got[1], unpoisoned[1])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows_bad_slots_and_sink_only(device):
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=16)
    q = torch.randn(4, 3, 512, generator=torch.Generator().manual_seed(17)).to(torch.bfloat16)
    # row 0: nothing; row 1: only bad slots (negative, past capacity, huge); row 2: one good slot among them
    indices, indptr = ragged([[], [-1, 128, 2**30], [-7, 10, 500], [11]])
    sink = torch.tensor([0.0, float("-inf"), 5.0])
    want = reference.sparse_mla_decode(q, main_cache, indices, indptr, 64, None, None, None, 64, sink, SCALE, 0)
    q, main_cache, indices, indptr, sink = to(device, q, main_cache, indices, indptr, sink)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, attn_sink=sink, main_format="ocp")
    assert bool((got[:2] == 0).all()), "rows without valid keys are zero, sink or not"
    assert_close_to_reference(got, want)
    # a sink of -inf is no sink
    no_sink = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp")
    torch.testing.assert_close(got[:, 1], no_sink[:, 1], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_indptr_outside_the_index_list_is_clamped(device):
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=18)
    q = torch.randn(2, 2, 512, generator=torch.Generator().manual_seed(19)).to(torch.bfloat16)
    indices = torch.tensor([1, 2, 3], dtype=torch.int32)
    wild = torch.tensor([-5, 2, 99], dtype=torch.int32)
    want_ref = reference.sparse_mla_decode(q, main_cache, indices, wild, 64, None, None, None, 64, None, SCALE, 0)
    tame = torch.tensor([0, 2, 3], dtype=torch.int32)
    q, main_cache, indices, wild, tame = to(device, q, main_cache, indices, wild, tame)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, wild, 64, main_format="ocp")
    want = dsv4ops.sparse_mla_decode(q, main_cache, indices, tame, 64, main_format="ocp")
    assert torch.equal(got, want)
    assert_close_to_reference(got, want_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_decreasing_indptr_gives_empty_or_overlapping_rows(device):
    """Row t reads indices [indptr[t], indptr[t + 1]) clamped to [0, nnz]: an end below its start is an empty row
    (zeros), and rows may overlap; defined, graph-safe (no host check), the same on every path."""
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=56)
    q = torch.randn(3, 2, 512, generator=torch.Generator().manual_seed(57)).to(torch.bfloat16)
    indices = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    indptr = torch.tensor([0, 5, 3, 6], dtype=torch.int32)
    want = reference.sparse_mla_decode(q, main_cache, indices, indptr, 64, None, None, None, 64, None, SCALE, 0)
    same_rows = ragged([[1, 2, 3, 4, 5], [], [4, 5, 6]])
    want_same = reference.sparse_mla_decode(q, main_cache, *same_rows, 64, None, None, None, 64, None, SCALE, 0)
    assert torch.equal(want, want_same)
    assert not bool(want[1].any()), "the row whose end lies below its start is empty"
    q, main_cache, indices, indptr = to(device, q, main_cache, indices, indptr)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp")
    assert not bool(got[1].any())
    assert_close_to_reference(got, want)


def test_reference_on_hand_worked_rows():
    """The oracle itself (ARCHITECTURE §5) against values worked by hand, so that the kernels and the reference
    cannot share a misreading: scores scale * q . k, the sink in the denominator only, V = K over all 512 dims
    (a RoPE dim included), invalid slots skipped, an empty row zero. Keys exact in FP8 (powers of two)."""
    keys = torch.zeros(3, 512)
    keys[0, 0], keys[0, 500] = 1.0, 3.0  # k0: NoPE dim 0 and RoPE dim 500
    keys[1, 1] = 1.0  # k1
    keys[2, 0] = 2.0  # k2
    cache = torch.zeros(2, 16 * 584, dtype=torch.uint8)
    dsv4ops.reference.kv_cache.quantize_and_insert_k_cache(keys.to(torch.bfloat16), cache, torch.arange(3), 16, 0)
    q = torch.zeros(3, 2, 512, dtype=torch.bfloat16)
    q[:, 0, 0] = 1.0  # head 0 scores q . k = k[0]; head 1 scores 0 everywhere
    indices, indptr = ragged([[0, 1], [-1, 2, 31, 99999], []])  # slot 31: past the written keys, still in the cache
    sink = torch.tensor([0.0, float("-inf")])
    got = reference.sparse_mla_decode(q, cache, indices, indptr, 16, None, None, None, 16, sink, 1.0, 0).double()
    e = torch.e
    want = torch.zeros(3, 2, 512, dtype=torch.float64)
    k = keys.double()
    want[0, 0] = (e * k[0] + k[1]) / (e + 1 + 1)  # scores 1 and 0, the sink's exp(0) in the denominator
    want[0, 1] = (k[0] + k[1]) / 2  # equal scores, a sink of -inf adds nothing
    # row 1: slot 31 holds a zero key (score 0): weights e^2 (k2), 1 (slot 31), 1 (sink)
    want[1, 0] = e**2 * k[2] / (e**2 + 1 + 1)
    want[1, 1] = k[2] / 2
    torch.testing.assert_close(got, want.to(torch.bfloat16).double(), rtol=2.0**-8, atol=0)
    assert float(got[0, 0, 500]) != 0, "V covers the RoPE dims too"


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_sinks(device):
    """A NaN sink counts as no sink; a +inf sink takes all the weight (zeros); the reference agrees."""
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=27)
    q = torch.randn(1, 3, 512, generator=torch.Generator().manual_seed(28)).to(torch.bfloat16)
    indices, indptr = ragged([[1, 2, 3]])
    sink = torch.tensor([float("nan"), float("inf"), 0.5])
    want = reference.sparse_mla_decode(q, main_cache, indices, indptr, 64, None, None, None, 64, sink, SCALE, 0)
    q, main_cache, indices, indptr, sink = to(device, q, main_cache, indices, indptr, sink)
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, attn_sink=sink, main_format="ocp")
    no_sink = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp")
    assert torch.equal(got[0, 0], no_sink[0, 0])
    assert bool((got[0, 1] == 0).all())
    assert not bool(torch.isnan(want).any())
    assert_close_to_reference(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_block_size_must_match_a_584_byte_record_view_and_padded_blocks_read(device):
    main_cache = written_cache(128, 64, Fp8Format.OCP, seed=29, device=device)
    view = main_cache.view(main_cache.shape[0], 64, 584)
    q = torch.randn(1, 2, 512, generator=torch.Generator().manual_seed(30)).to(torch.bfloat16).to(device)
    indices, indptr = to(device, *ragged([[0, 70]]))
    with pytest.raises(RuntimeError, match=r"is a \[num_blocks, 64, 584\] view but main_block_size is 16"):
        dsv4ops.sparse_mla_decode(q, view, indices, indptr, 16, main_format="ocp")
    # blocks 64 * 584 + 64 bytes apart, the storage ending right after the last block's records
    padded_storage = torch.zeros(main_cache.shape[0] * (64 * 584 + 64) - 64, dtype=torch.uint8, device=device)
    padded = padded_storage.as_strided((main_cache.shape[0], 64 * 584), (64 * 584 + 64, 1))
    padded.copy_(main_cache)
    got = dsv4ops.sparse_mla_decode(q, padded, indices, indptr, 64, main_format="ocp")
    assert torch.equal(got, dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp"))
    assert_close_to_reference(got, reference.sparse_mla_decode(*(cpu(x) for x in (q, padded, indices, indptr)), 64,
                                                               None, None, None, 64, None, SCALE, 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,num_splits", [(4, 0), (4, 1), (4, 3), (20, 1), (20, 2)])
def test_inverse_rope_epilogue(device, heads, num_splits):
    """The epilogue in the reduce (splits > 1) and fused into the single-split kernel (num_splits 1)."""
    main_cache = written_cache(256, 64, Fp8Format.OCP, seed=20, device=device)
    main = to(device, *decode_rows([100, 255], 1)[0])
    q = torch.randn(2, heads, 512, generator=torch.Generator().manual_seed(21)).to(torch.bfloat16).to(device)
    theta = torch.randn(512, 32, generator=torch.Generator().manual_seed(22))
    cos_sin = torch.cat([theta.cos(), theta.sin()], dim=1).to(device)
    positions = torch.tensor([100, 255], device=device)
    fused = dsv4ops.sparse_mla_decode(q, main_cache, *main, 64, main_format="ocp", num_splits=num_splits,
                                      cos_sin=cos_sin, positions=positions)
    plain = dsv4ops.sparse_mla_decode(q, main_cache, *main, 64, main_format="ocp", num_splits=num_splits)
    assert torch.equal(fused[..., :448], plain[..., :448])
    torch.testing.assert_close(fused.float(), dsv4ops.inverse_rope(plain, positions, cos_sin).float(), rtol=1e-2,
                               atol=2e-2)
    got, want = run(q, main, None, (main_cache, None), (Fp8Format.OCP, Fp8Format.OCP), (64, 64), None, num_splits,
                    device=device, cos_sin=cos_sin, positions=positions)
    assert_close_to_reference(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_tokens_and_invalid_inputs(device):
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=23, device=device)
    empty = torch.empty(0, 4, 512, dtype=torch.bfloat16, device=device)
    out = dsv4ops.sparse_mla_decode(empty, main_cache, torch.empty(0, dtype=torch.int32, device=device),
                                    torch.zeros(1, dtype=torch.int32, device=device), 64, main_format="ocp")
    assert out.shape == (0, 4, 512)
    q = torch.zeros(2, 4, 512, dtype=torch.bfloat16, device=device)
    idx, ptr = to(device, *ragged([[0], [1]]))
    shared = torch.zeros(2 * 4 * 512 + 512, dtype=torch.bfloat16, device=device)  # q and out one head apart
    call = lambda **o: torch.ops.dsv4.sparse_mla_decode(  # noqa: E731
        o.get("q", q), o.get("cache", main_cache), o.get("idx", idx), o.get("ptr", ptr), o.get("bs", 64),
        o.get("extra"), o.get("extra_idx", idx if "extra" in o else None),
        o.get("extra_ptr", ptr if "extra" in o else None), o.get("extra_bs", 64), o.get("sink"),
        o.get("scale", SCALE), 0, 0, o.get("splits", 0), o.get("cos_sin"), o.get("positions"),
        out=o.get("out", torch.empty_like(q)))
    call(extra=main_cache)  # the extra side as valid as the main one: each case below breaks one thing
    call(cos_sin=torch.zeros(8, 64, device=device), positions=torch.arange(2, device=device))
    i32 = dict(dtype=torch.int32, device=device)
    sink_and_out = torch.zeros(2 * 4 * 256 + 4, device=device)  # an fp32 sink inside out's bytes
    for kwargs, match in [
        (dict(q=q.float()), "q must have dtype bfloat16"),
        (dict(q=torch.zeros(2, 512, 4, dtype=torch.bfloat16, device=device).transpose(1, 2)),
         r"q must have shape \[tokens, heads, 512\] with the last dim contiguous"),
        (dict(ptr=ptr[:2]), "main_indptr must have 3 entries"),
        (dict(ptr=ptr.long()), "main_indptr must have dtype int32"),
        (dict(ptr=torch.zeros(6, **i32)[::2]), "main_indptr must be contiguous"),
        (dict(idx=idx.long()), "main_indices must have dtype int32"),
        (dict(idx=idx.view(2, 1)), "main_indices must be 1-D"),
        (dict(idx=torch.zeros(4, **i32)[::2]), "main_indices must be contiguous"),
        (dict(bs=0), r"main_block_size must be in \[1, 2\^31 - 1\]"),
        (dict(extra=main_cache, extra_ptr=ptr[:2]), "extra_indptr must have 3 entries"),
        (dict(extra=main_cache, extra_ptr=ptr.long()), "extra_indptr must have dtype int32"),
        (dict(extra=main_cache, extra_idx=idx.long()), "extra_indices must have dtype int32"),
        (dict(extra=main_cache, extra_idx=torch.zeros(4, **i32)[::2]), "extra_indices must be contiguous"),
        (dict(extra=main_cache, extra_bs=0), r"extra_block_size must be in \[1, 2\^31 - 1\]"),
        (dict(extra=main_cache[:, :1000]), "extra_cache blocks of 1000 bytes cannot hold extra_block_size=64"),
        (dict(sink=torch.zeros(4, dtype=torch.float64, device=device)), "attn_sink must have dtype float32"),
        (dict(sink=torch.zeros(8, device=device)[::2]), "attn_sink must be contiguous"),
        (dict(sink=sink_and_out[8:12], out=sink_and_out[4:].view(torch.bfloat16).view(2, 4, 512)),
         "attn_sink must not overlap out"),
        (dict(cos_sin=torch.zeros(8, 32, device=device), positions=torch.arange(2, device=device)),
         r"cos_sin must have shape \[positions >= 1, 64\]"),
        (dict(cos_sin=torch.zeros(8, 64, dtype=torch.float64, device=device), positions=torch.arange(2, device=device)),
         "cos_sin must have dtype"),
        (dict(cos_sin=torch.zeros(8, 64, device=device), positions=torch.zeros(2, device=device)),
         "positions must have dtype"),
        (dict(cos_sin=torch.zeros(8, 64, device=device), positions=torch.arange(1, device=device)),
         "positions must be 1-D with at least 2 entries"),
        (dict(sink=torch.zeros(2, device=device)), "attn_sink must be 1-D with at least 4 entries"),
        (dict(scale=0.0), "scale must be finite and positive"),
        (dict(splits=65), r"num_splits must be in \[0, 64\]"),
        (dict(extra=main_cache, extra_idx=None), "extra_cache, extra_indices and extra_indptr come together"),
        (dict(cos_sin=torch.zeros(8, 64, device=device)), "cos_sin and positions come together"),
        (dict(out=torch.empty(2, 3, 512, dtype=torch.bfloat16, device=device)), "out must have q's shape"),
        (dict(out=torch.empty(1, 1, 512, dtype=torch.bfloat16, device=device).expand(2, 4, 512)),
         "out must not overlap itself"),
        (dict(cache=main_cache[:, :1000]), "main_cache blocks of 1000 bytes cannot hold main_block_size=64 records"),
        (dict(out=q), "q must not overlap out"),
        (dict(q=shared[:4096].view(2, 4, 512), out=shared[512:].view(2, 4, 512)), "q must not overlap out"),
        (dict(out=main_cache.view(torch.bfloat16)[0, :4096].view(2, 4, 512)), "main_cache must not overlap out"),
    ] + ([(dict(idx=idx.cpu()), "q and main_indices must be on the same device"),
          (dict(extra=main_cache, extra_ptr=ptr.cpu()), "q and extra_indptr must be on the same device")]
         if device != "cpu" else []):
        with pytest.raises(RuntimeError, match=match):
            call(**kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    main_cache = written_cache(128, 64, Fp8Format.OCP, seed=24, device=device)
    extra_cache = written_cache(32, 16, Fp8Format.OCP, seed=25, device=device)
    main, extra = decode_rows([60, 127], 4, topk=8)
    main, extra = to(device, *main), to(device, *extra)
    q = torch.randn(2, 4, 512, generator=torch.Generator().manual_seed(26)).to(torch.bfloat16).to(device)
    sink = torch.randn(4).to(device)
    args = (q, main_cache, *main, 64, extra_cache, *extra, 16, sink, SCALE, 0, 0, 2, None, None)
    torch.library.opcheck(torch.ops.dsv4.sparse_mla_decode.default, args, {"out": torch.empty_like(q)})
    theta = torch.randn(128, 32, generator=torch.Generator().manual_seed(27))
    cos_sin = torch.cat([theta.cos(), theta.sin()], dim=1).to(device)
    positions = torch.tensor([60, 127], device=device)
    rope_args = args[:-2] + (cos_sin, positions)  # the fused inverse-RoPE epilogue
    torch.library.opcheck(torch.ops.dsv4.sparse_mla_decode.default, rope_args, {"out": torch.empty_like(q)})

    def f(q, call_args):
        out = torch.empty_like(q)
        torch.ops.dsv4.sparse_mla_decode(q * 1, *call_args[1:], out=out)
        return out

    for call_args in (args, rope_args):
        assert torch.equal(torch.compile(f, fullgraph=True)(q, call_args), f(q, call_args))


# ---- GPU kernel: heads as the MMA M dimension, splits, realistic row shapes, graph capture ----


def layer_case(ratio, topk, heads, positions, main_fmt, seed, device, main_block=64, extra_block=16):
    """Caches (written on `device`), ragged index lists, q and a sink for rows at `positions`."""
    main_cache = written_cache(max(positions) + 1, main_block, main_fmt, seed=seed, device=device)
    committed = max(1, (max(positions) + 1) // max(ratio, 1))
    extra_cache = written_cache(committed, extra_block, Fp8Format.OCP, seed=seed + 1, device=device)
    main, extra = decode_rows(positions, ratio, topk, seed=seed + 2)
    q = torch.randn(len(positions), heads, 512, generator=torch.Generator().manual_seed(seed + 3)).to(torch.bfloat16)
    sink = torch.randn(heads, generator=torch.Generator().manual_seed(seed + 4))
    return main_cache, extra_cache, main, (extra if ratio > 1 else None), q, sink


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 8, 16, 20, 64, 128])
@pytest.mark.parametrize("ratio,topk", LAYERS)
@pytest.mark.parametrize("main_fmt", [Fp8Format.OCP, Fp8Format.FNUZ])
def test_gpu_heads_against_reference_and_cpu_kernel(heads, ratio, topk, main_fmt):
    """Every head count the models use (and 1, 20: partial head groups): the GPU kernel equals the
    reference within the tolerance, and the CPU kernel on the same inputs within the same tolerance (a
    fragment layout mistake shows up as a gross mismatch in both)."""
    positions = [5, 127, 600, 1500]
    main_cache, extra_cache, main, extra, q, sink = layer_case(ratio, 64 if topk else None, heads, positions,
                                                               main_fmt, seed=40, device="cuda")
    caches, formats = (main_cache, extra_cache), (main_fmt, Fp8Format.OCP)
    got, want = run(q, main, extra, caches, formats, (64, 16), sink, 0, device="cuda")
    assert_close_to_reference(got, want)
    on_cpu, _ = run(q, main, extra, tuple(c.cpu() for c in caches), formats, (64, 16), sink, 0, device="cpu")
    assert_close_to_reference(got, on_cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,tokens", [(20, 40), (64, 20), (128, 9)])
@pytest.mark.parametrize("ratio,topk", LAYERS)
def test_gpu_two_head_groups_per_block(heads, tokens, ratio, topk):
    """Many (token, 16-head) blocks, more than 64: on NVIDIA each block serves two groups of 16 heads from
    one decoded tile (as in the 128-head case above; batches of at most 16 blocks run one group per
    block). The same checks as above."""
    positions = [5 + 37 * i for i in range(tokens)]
    main_cache, extra_cache, main, extra, q, sink = layer_case(ratio, 64 if topk else None, heads, positions,
                                                               Fp8Format.OCP, seed=44, device="cuda")
    caches, formats = (main_cache, extra_cache), (Fp8Format.OCP, Fp8Format.OCP)
    got, want = run(q, main, extra, caches, formats, (64, 16), sink, 0, device="cuda")
    assert_close_to_reference(got, want)
    on_cpu, _ = run(q, main, extra, tuple(c.cpu() for c in caches), formats, (64, 16), sink, 0, device="cpu")
    assert_close_to_reference(got, on_cpu)


# Batches of at least 32 (row, 64-head) blocks at more than 32 heads with rows of at least 192 keys on average:
# on sm_90a the warp-specialized warpgroup-MMA kernel serves them (heads padded to 64; 100 heads leave a partial
# block). C4A rows: the window and top-k 512 of the committed entries; C128A rows at 64k+: the window and 512+
# entries; at 33k: ~385 keys; at 8k: ~193 keys.
WARPGROUP_SHAPES = [(64, 32), (100, 40), (128, 20)]
WARPGROUP_LAYERS = [pytest.param(4, 512, 2100, id="c4a"), pytest.param(128, None, 65600, id="c128a"),
                    pytest.param(128, None, 33000, id="c128a-33k"), pytest.param(128, None, 8300, id="c128a-8k")]


@pytest.mark.gpu
@pytest.mark.parametrize("heads,tokens", WARPGROUP_SHAPES)
@pytest.mark.parametrize("ratio,topk,first_position", WARPGROUP_LAYERS)
@pytest.mark.parametrize("main_fmt", [Fp8Format.OCP, Fp8Format.FNUZ])
def test_gpu_warpgroup_kernel_against_reference(heads, tokens, ratio, topk, first_position, main_fmt):
    """The warpgroup kernel's sizes, both layer types (C128A at three row lengths) and both main-cache
    encodings, automatic splits: the reference's answer within the tolerance."""
    positions = [first_position + 53 * i for i in range(tokens)]
    main_cache, extra_cache, main, extra, q, sink = layer_case(ratio, topk, heads, positions, main_fmt, seed=100,
                                                               device="cuda")
    got, want = run(q, main, extra, (main_cache, extra_cache), (main_fmt, Fp8Format.OCP), (64, 16), sink, 0,
                    device="cuda")
    assert_close_to_reference(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
@pytest.mark.parametrize("with_sink", [False, True])
def test_gpu_warpgroup_kernel_split_counts(num_splits, with_sink):
    """Its fused epilogue (one split), the reduce of its partials, and more splits than tiles (empty splits),
    on rows with slots that must be skipped (-1, past the cache)."""
    positions = [2100 + 61 * i for i in range(32)]
    main_cache, extra_cache, main, extra, q, sink = layer_case(4, 512, 64, positions, Fp8Format.OCP, seed=110,
                                                               device="cuda")
    main_idx = main[0].clone()
    main_idx[::7] = -1
    main_idx[3::11] = 10**6
    got, want = run(q, (main_idx, main[1]), extra, (main_cache, extra_cache), (Fp8Format.OCP, Fp8Format.OCP),
                    (64, 16), sink if with_sink else None, num_splits, device="cuda")
    assert_close_to_reference(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3])
def test_gpu_warpgroup_kernel_inverse_rope(num_splits):
    """Its inverse-RoPE epilogue (fused at one split, in the reduce at three) equals the reference's."""
    positions = [2100 + 61 * i for i in range(32)]
    main_cache, extra_cache, main, extra, q, sink = layer_case(4, 512, 64, positions, Fp8Format.OCP, seed=120,
                                                               device="cuda")
    theta = torch.randn(4096, 32, generator=torch.Generator().manual_seed(122))
    cos_sin = torch.cat([theta.cos(), theta.sin()], dim=1)
    got, want = run(q, main, extra, (main_cache, extra_cache), (Fp8Format.OCP, Fp8Format.OCP), (64, 16), sink,
                    num_splits, device="cuda", cos_sin=cos_sin, positions=torch.tensor(positions))
    assert_close_to_reference(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 20, 64])
def test_gpu_single_key_is_copied_exactly(heads):
    """One key per row: its softmax weight is exactly 1 whatever the scores, so every head's output is the
    decoded key itself, bit for bit (the key decode, the P V fragments and the reduce, apart from S)."""
    main_cache = written_cache(64, 64, Fp8Format.OCP, seed=90, device="cuda")
    indices, indptr = to("cuda", *ragged([[7], [63], [0]]))
    q = torch.randn(3, heads, 512, generator=torch.Generator().manual_seed(91)).to(torch.bfloat16).cuda()
    got = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp", num_splits=1)
    keys = reference.read_cache_rows(main_cache.cpu(), torch.tensor([7, 63, 0]), 64, 0).to(torch.bfloat16)
    want = keys[:, None, :].expand(3, heads, 512)
    assert_close_to_reference(got, want)
    assert torch.equal(got.cpu(), want), "a single key must come back exactly"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [Fp8Format.OCP, Fp8Format.FNUZ])
def test_every_code_and_scale_byte_decodes_exactly(device, fmt):
    """Rows of one key each, with q = 0 (so every weight is exactly 1 and the output is the decoded key,
    bit for bit), over records whose NoPE bytes run through all 256 codes (the NaN codes of both encodings
    among them) under block scale bytes from 0 (2^-127) through the overflowing ones to 255 (NaN), with
    NaN and infinite RoPE values: the key decode of each path (on NVIDIA, OCP keys take the conversion
    instructions and FNUZ keys the table) against the reference's, non-finite values read as 0."""
    records = 9
    cache = torch.zeros(2, 64 * 584, dtype=torch.uint8)
    data = cache[0, : 64 * 576].view(64, 576)
    scale_bytes = cache[0, 64 * 576 :].view(64, 8)
    generator = torch.Generator().manual_seed(93)
    choices = torch.tensor([0, 1, 2, 60, 119, 127, 128, 200, 240, 241, 250, 253, 254, 255], dtype=torch.uint8)
    for r in range(records):
        data[r, :448] = ((torch.arange(448) * 7 + 37 * r) % 256).to(torch.uint8)  # 7 is odd: all 256 codes
        data[r, 448:] = torch.randn(64, generator=generator).to(torch.bfloat16).view(torch.uint8)
        scale_bytes[r, :7] = choices[(torch.arange(7) + 7 * r) % len(choices)]
    data[1, 448:450] = torch.tensor([0xC0, 0x7F], dtype=torch.uint8)  # NaN
    data[2, 452:454] = torch.tensor([0x80, 0x7F], dtype=torch.uint8)  # +Inf
    data[3, 574:576] = torch.tensor([0x80, 0xFF], dtype=torch.uint8)  # -Inf
    want = reference.read_cache_rows(cache, torch.arange(records), 64, fmt).to(torch.bfloat16)
    heads = 16
    q = torch.zeros(records, heads, 512, dtype=torch.bfloat16)
    indices, indptr = ragged([[r] for r in range(records)])
    q, cache, indices, indptr = to(device, q, cache, indices, indptr)
    got = dsv4ops.sparse_mla_decode(q, cache, indices, indptr, 64, main_format=fmt.name.lower(), num_splits=1)
    assert torch.equal(got.cpu(), want[:, None, :].expand(records, heads, 512)), "each key must come back exactly"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [Fp8Format.OCP, Fp8Format.FNUZ])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_gpu_every_code_decodes_exactly_in_warpgroup_tiles(fmt, num_splits):
    """The records of the test above at sizes the sm_90a warp-specialized kernel serves (64 heads, 32 rows
    of 512 slots): each row reads one record, at a position that moves through the first tile, among 511
    negative slots (skipped), with q = 0, so the output is the decoded key bit for bit (its producer's
    decode of every code under every kind of scale byte, integer and general paths)."""
    records = 9
    cache = torch.zeros(2, 64 * 584, dtype=torch.uint8)
    data = cache[0, : 64 * 576].view(64, 576)
    scale_bytes = cache[0, 64 * 576 :].view(64, 8)
    generator = torch.Generator().manual_seed(94)
    choices = torch.tensor([0, 1, 2, 8, 60, 119, 127, 128, 200, 240, 241, 250, 253, 254, 255], dtype=torch.uint8)
    for r in range(records):
        data[r, :448] = ((torch.arange(448) * 7 + 37 * r) % 256).to(torch.uint8)
        data[r, 448:] = torch.randn(64, generator=generator).to(torch.bfloat16).view(torch.uint8)
        scale_bytes[r, :7] = choices[(torch.arange(7) + 7 * r) % len(choices)]
    data[4, :448] = ((torch.arange(448) % 112) + 8).to(torch.uint8)  # normal codes only: the integer path
    scale_bytes[4, :7] = torch.tensor([8, 60, 119, 127, 128, 200, 240], dtype=torch.uint8)
    data[1, 448:450] = torch.tensor([0xC0, 0x7F], dtype=torch.uint8)  # NaN
    data[2, 452:454] = torch.tensor([0x80, 0x7F], dtype=torch.uint8)  # +Inf
    want = reference.read_cache_rows(cache, torch.arange(records), 64, fmt).to(torch.bfloat16)
    rows, keys, heads = 32, 512, 64
    q = torch.zeros(rows, heads, 512, dtype=torch.bfloat16)
    indices, indptr = ragged([[-1] * (t % 32) + [t % records] + [-1] * (keys - 1 - t % 32) for t in range(rows)])
    q, cache, indices, indptr = to("cuda", q, cache, indices, indptr)
    got = dsv4ops.sparse_mla_decode(q, cache, indices, indptr, 64, main_format=fmt.name.lower(),
                                    num_splits=num_splits)
    expected = want[torch.arange(rows) % records][:, None, :].expand(rows, heads, 512)
    assert torch.equal(got.cpu(), expected), "each key must come back exactly"


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 20, 64])
def test_gpu_each_head_finds_its_key(heads):
    """Head h's query is 4x key (h mod 24): its scores pick that key with weight ~1 (the S = Q K^T
    fragments: a row or column mix-up sends a head to another key)."""
    main_cache = written_cache(24, 64, Fp8Format.OCP, seed=92, device="cuda")
    keys = reference.read_cache_rows(main_cache.cpu(), torch.arange(24), 64, 0)
    q = (4 * keys[torch.arange(heads) % 24]).to(torch.bfloat16)[None]
    indices, indptr = ragged([list(range(24))])
    got = dsv4ops.sparse_mla_decode(q.cuda(), main_cache, indices.cuda(), indptr.cuda(), 64, main_format="ocp",
                                    num_splits=1)
    want = reference.sparse_mla_decode(q, main_cache.cpu(), indices, indptr, 64, None, None, None, 64, None, SCALE, 0)
    assert_close_to_reference(got, want)
    chosen = (got.float().cpu()[0] @ keys.t()).argmax(dim=1)
    assert torch.equal(chosen, torch.arange(heads) % 24)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, 4, 8, 64])
@pytest.mark.parametrize("with_sink", [False, True])
def test_gpu_split_counts(num_splits, with_sink):
    """C4A rows (window + top-k 512) at H = 16: every split count, including more splits than tiles
    (empty splits) and the automatic choice, gives the reference's answer."""
    positions = [3000, 3001, 4095]
    main_cache, extra_cache, main, extra, q, sink = layer_case(4, 512, 16, positions, Fp8Format.OCP, seed=50,
                                                               device="cuda")
    got, want = run(q, main, extra, (main_cache, extra_cache), (Fp8Format.OCP, Fp8Format.OCP), (64, 16),
                    sink if with_sink else None, num_splits, device="cuda")
    assert_close_to_reference(got, want)


@pytest.mark.gpu
def test_gpu_c128a_long_context_and_mtp_rows():
    """C128A at 32k context (window + all 256 compressed entries) for 3 MTP rows with their own windows,
    H = 64 (Flash TP1), automatic splits; then splits 1 and 8 equal it within the tolerance."""
    positions = [32765, 32766, 32767]
    main_cache, extra_cache, main, extra, q, sink = layer_case(128, None, 64, positions, Fp8Format.FNUZ, seed=60,
                                                               device="cuda", extra_block=2)
    formats = (Fp8Format.FNUZ, Fp8Format.OCP)
    got, want = run(q, main, extra, (main_cache, extra_cache), formats, (64, 2), sink, 0, device="cuda")
    assert_close_to_reference(got, want)
    for splits in (1, 8):
        other, _ = run(q, main, extra, (main_cache, extra_cache), formats, (64, 2), sink, splits, device="cuda")
        assert_close_to_reference(other, want)


@pytest.mark.gpu
def test_gpu_block_offsets_beyond_32_bits():
    """Records past byte 2^32 of the cache (int64 block offsets): the same answer as a compact cache holding
    the same records."""
    block_size, blocks = 64, (2**32 // (64 * 584)) + 4
    big = torch.zeros(blocks, block_size * 584, dtype=torch.uint8, device="cuda")
    small = written_cache(128, block_size, Fp8Format.OCP, seed=70, device="cuda")[:2].clone()
    big[blocks - 2 :] = small
    first = (blocks - 2) * block_size
    q = torch.randn(2, 8, 512, generator=torch.Generator().manual_seed(71)).to(torch.bfloat16).cuda()
    slots = torch.arange(128, dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, 64, 128], dtype=torch.int32, device="cuda")
    got = dsv4ops.sparse_mla_decode(q, big, slots + first, indptr, block_size, main_format="ocp", num_splits=2)
    want = dsv4ops.sparse_mla_decode(q, small, slots, indptr, block_size, main_format="ocp", num_splits=2)
    assert torch.equal(got, want)
    del big


@pytest.mark.gpu
def test_gpu_graph_capture_on_a_side_stream():
    """Captured once on a side stream (automatic splits, workspace allocated inside the capture), replayed
    after new q values, index lists and row lengths (indptr) are copied in, as a decode graph is replayed on
    each step's rows: the replay computes the new answer."""
    positions = [700, 701]
    main_cache, extra_cache, main, extra, q, sink = layer_case(4, 128, 16, positions, Fp8Format.OCP, seed=80,
                                                               device="cuda")
    main_d, extra_d = to("cuda", *main), to("cuda", *extra)
    q_d, sink_d = q.cuda(), sink.cuda()
    out = torch.empty_like(q_d)

    def call():
        return dsv4ops.sparse_mla_decode(q_d, main_cache, *main_d, 64, extra_cache, *extra_d, 16, sink_d, SCALE,
                                         "ocp", "ocp", 0, out=out)

    graph, _ = capture_graph(call)
    first = out.clone()
    fresh = torch.randn(q.shape, generator=torch.Generator().manual_seed(81)).to(torch.bfloat16)
    q_d.copy_(fresh.cuda())
    # Other rows (a shorter first row, other compressed picks) in the captured index tensors; entries past
    # the new indptr's end are -1 and must not be read.
    fresh_main, fresh_extra = decode_rows([90, 650], 4, 128, seed=82)
    for (indices_d, indptr_d), (indices, indptr) in ((main_d, fresh_main), (extra_d, fresh_extra)):
        assert indices.numel() < indices_d.numel()
        indices_d.fill_(-1)
        indices_d[: indices.numel()] = indices.cuda()
        indptr_d.copy_(indptr.cuda())
    graph.replay()
    torch.cuda.synchronize()
    _, want = run(fresh, fresh_main, fresh_extra, (main_cache, extra_cache), (Fp8Format.OCP, Fp8Format.OCP),
                  (64, 16), sink, 0, device="cuda")
    assert not torch.equal(out, first)
    assert_close_to_reference(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_q_and_out(device):
    """q and out as views with odd head strides (the kernel's element-wise path) give the contiguous
    call's bits."""
    main_cache = written_cache(200, 64, Fp8Format.OCP, seed=100, device=device)
    main = to(device, *decode_rows([150, 199], 1)[0])
    q = torch.randn(2, 20, 512, generator=torch.Generator().manual_seed(101)).to(torch.bfloat16).to(device)
    q_view = torch.zeros(2, 20, 513, dtype=torch.bfloat16, device=device)[..., :512]
    q_view.copy_(q)
    out_view = torch.zeros(2, 20, 515, dtype=torch.bfloat16, device=device)[..., 1:513]
    for splits in (1, 2):
        want = dsv4ops.sparse_mla_decode(q, main_cache, *main, 64, main_format="ocp", num_splits=splits)
        got = dsv4ops.sparse_mla_decode(q_view, main_cache, *main, 64, main_format="ocp", num_splits=splits,
                                        out=out_view)
        assert got.data_ptr() == out_view.data_ptr()
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_warpgroup_kernel_strided_q_and_out():
    """The same at the warpgroup kernel's sizes (64 heads, 32 rows of 400 keys): its Q load and its staged
    epilogue take their element-wise paths for these views and give the contiguous call's bits."""
    main_cache = written_cache(1024, 64, Fp8Format.OCP, seed=102, device="cuda")
    generator = torch.Generator().manual_seed(103)
    indices, indptr = ragged([torch.randint(0, 1024, (400,), generator=generator).tolist() for _ in range(32)])
    indices, indptr = indices.cuda(), indptr.cuda()
    q = torch.randn(32, 64, 512, generator=generator).to(torch.bfloat16).cuda()
    q_view = torch.zeros(32, 64, 513, dtype=torch.bfloat16, device="cuda")[..., :512]
    q_view.copy_(q)
    out_view = torch.zeros(32, 64, 515, dtype=torch.bfloat16, device="cuda")[..., 1:513]
    for splits in (1, 2):
        want = dsv4ops.sparse_mla_decode(q, main_cache, indices, indptr, 64, main_format="ocp", num_splits=splits)
        got = dsv4ops.sparse_mla_decode(q_view, main_cache, indices, indptr, 64, main_format="ocp",
                                        num_splits=splits, out=out_view)
        assert got.data_ptr() == out_view.data_ptr()
        assert torch.equal(got, want)
