"""dsv4.quantize_and_insert_k_cache and dsv4.dequantize_and_gather_k_cache against the reference: the
whole cache byte-identical (canaries included) in both encodings on every device, adversarial slots and
block ids, invalid inputs, opcheck, torch.compile, empty inputs."""

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format
from dsv4ops.reference import kv_cache as reference

from conftest import DEVICES, FORMATS, assert_bits_equal, assert_bytes_equal, capture_graph

CANARY = 0xAB


def make_cache(num_blocks, block_size, extra=0, device="cpu"):
    return torch.full((num_blocks, block_size * 584 + extra), CANARY, dtype=torch.uint8, device=device)


def make_k(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-4, 4, tokens) if tokens > 1 else torch.ones(1)
    return (torch.randn(tokens, 512, generator=g) * spread[:, None]).to(torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size,extra", [(16, 0), (64, 0), (64, 48)], ids=["bs16", "bs64", "bs64-padded"])
def test_insert_matches_reference(device, fmt, block_size, extra):
    blocks = 4
    capacity = blocks * block_size
    # Distinct slots (two tokens on one slot leave an unspecified winner), six adversarial ones first.
    g = torch.Generator().manual_seed(1)
    adversarial = torch.tensor([-1, -2, capacity, 2**40, capacity - 1, -(2**40)])
    slots = torch.cat([adversarial, torch.randperm(capacity - 1, generator=g)[:144]])
    tokens = slots.shape[0]
    k = make_k(tokens)
    k[6, :64] = -0.0
    k[7, 10] = float("nan")
    k[8, 100] = float("inf")
    for qmax in {fmt.default_quant_max, fmt.max_finite}:
        expected = make_cache(blocks, block_size, extra)
        reference.quantize_and_insert_k_cache(k, expected, slots, block_size, fmt, qmax)
        cache = make_cache(blocks, block_size, extra, device)
        torch.ops.dsv4.quantize_and_insert_k_cache(k.to(device), cache, slots.to(device), block_size, int(fmt), qmax)
        assert_bytes_equal(cache, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_matches_reference(device, fmt):
    block_size, blocks = 16, 8
    cache = make_cache(blocks, block_size)
    k = make_k(blocks * block_size, seed=2)
    reference.quantize_and_insert_k_cache(k, cache, torch.arange(blocks * block_size), block_size, fmt)
    cache[2, 5] = 0x80  # an OCP -0 byte (FNUZ NaN) in a record
    cache[3, block_size * 576 + 3] = 255  # an E8M0 NaN scale
    # The last request is longer than the rows left at offset 3: its gather starts past its first row.
    seq_lens = torch.tensor([40, 16, 0, 33, 7, 44], dtype=torch.int32)
    gather_lens = torch.tensor([40, 5, 3, 100, -2, 10], dtype=torch.int32)
    block_table = torch.tensor([[3, 1, 2, 0], [5, 6, 7, 4], [0, 0, 0, 0], [7, 99, -1, 2], [6, 1, 1, 1],
                                [2, 3, 0, 1]], dtype=torch.int32)
    for lens in (gather_lens, None):
        for offset in (0, 3):
            expected = torch.full((6, 45, 512), 7.0, dtype=torch.bfloat16)
            reference.dequantize_and_gather_k_cache(expected, cache, seq_lens, lens, block_table, block_size, offset,
                                                    fmt)
            out = torch.full((6, 45, 512), 7.0, dtype=torch.bfloat16, device=device)
            torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache.to(device), seq_lens.to(device),
                                                         None if lens is None else lens.to(device),
                                                         block_table.to(device), block_size, offset, int(fmt))
            assert_bits_equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_reads_a_sliced_block_table_and_an_empty_one(device):
    """vLLM passes block_table[:, :n], whose row stride is wider than its rows: rows are read at stride(0) (spec
    §9.2 assumes the width). A table of no columns leaves every gathered row zero, on every path."""
    block_size, blocks, fmt = 16, 8, Fp8Format.OCP
    cache = make_cache(blocks, block_size)
    reference.quantize_and_insert_k_cache(make_k(blocks * block_size, seed=58), cache,
                                          torch.arange(blocks * block_size), block_size, fmt)
    seq_lens = torch.tensor([40, 33], dtype=torch.int32)
    wide = torch.tensor([[3, 1, 2, 7, 7, 7], [5, 6, 0, 7, 7, 7]], dtype=torch.int32)
    sliced = wide[:, :3]
    assert sliced.stride(0) == 6 and not sliced.is_contiguous()
    expected = torch.full((2, 40, 512), 7.0, dtype=torch.bfloat16)
    reference.dequantize_and_gather_k_cache(expected, cache, seq_lens, None, sliced.contiguous(), block_size, 0, fmt)
    for table in (sliced, torch.zeros(2, 0, dtype=torch.int32)):
        out = torch.full((2, 40, 512), 7.0, dtype=torch.bfloat16, device=device)
        torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache.to(device), seq_lens.to(device), None,
                                                     table.to(device), block_size, 0, int(fmt))
        want = torch.full((2, 40, 512), 7.0, dtype=torch.bfloat16)
        reference.dequantize_and_gather_k_cache(want, cache, seq_lens, None, table, block_size, 0, fmt)
        if table.shape[1]:
            assert_bits_equal(want, expected)
        else:
            assert not bool(want[0].any()) and not bool(want[1, :33].any()), "no table: zero rows"
        assert_bits_equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_of_arbitrary_bytes_matches_reference(device, fmt):
    # Records no writer would produce: every code and every scale byte, including those below 11 where
    # the GPU reader rounds each value in full rather than truncating (dsv4/ds_mla.h).
    block_size, blocks = 16, 16
    g = torch.Generator().manual_seed(11)
    cache = torch.randint(0, 256, (blocks, block_size * 584), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = cache[:, block_size * 576:].view(blocks, block_size, 8)
    every_byte = torch.arange(blocks * block_size * 7, dtype=torch.int32).remainder(256)
    scales[..., :7] = every_byte.view(blocks, block_size, 7)
    seq_lens = torch.tensor([blocks * block_size // 2] * 2, dtype=torch.int32)
    block_table = torch.randperm(blocks, generator=g).to(torch.int32).view(2, blocks // 2)
    expected = torch.zeros(2, blocks * block_size // 2, 512, dtype=torch.bfloat16)
    reference.dequantize_and_gather_k_cache(expected, cache, seq_lens, None, block_table, block_size, 0, fmt)
    out = torch.zeros_like(expected, device=device)
    torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache.to(device), seq_lens.to(device), None,
                                                 block_table.to(device), block_size, 0, int(fmt))
    assert_bits_equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_and_wrappers(device, fmt):
    block_size = 64
    k = make_k(200, seed=3)
    cache = torch.zeros(4, block_size * 584, dtype=torch.uint8, device=device)
    dsv4ops.quantize_and_insert_k_cache(k.to(device), cache, torch.arange(200, device=device), block_size, fmt)
    out = torch.zeros(1, 200, 512, dtype=torch.bfloat16, device=device)
    table = torch.arange(4, dtype=torch.int32, device=device)[None]
    dsv4ops.dequantize_and_gather_k_cache(out, cache, torch.tensor([200], dtype=torch.int32, device=device), None,
                                          table, block_size, 0, fmt)
    expected = reference.dequantize_kv_record(*reference.quantize_kv_record(k, fmt), fmt)
    assert_bits_equal(out[0].cpu(), expected)
    assert torch.equal(out[0, :, 448:].cpu(), k[:, 448:])  # the RoPE tail is copied verbatim


def test_strided_and_typed_views():
    """A [blocks, bs, 584] cache (vLLM's container shape) and k as a row-strided view."""
    block_size = 16
    big = make_k(40, seed=4).repeat(1, 2)  # [40, 1024]: k rows 2048 bytes apart
    k = big[:, :512]
    cache3d = make_cache(3, block_size).view(3, block_size, 584)
    expected = make_cache(3, block_size)
    reference.quantize_and_insert_k_cache(k, expected, torch.arange(40), block_size, 0)
    torch.ops.dsv4.quantize_and_insert_k_cache(k, cache3d, torch.arange(40), block_size, 0, 448.0)
    assert_bytes_equal(cache3d.view(3, -1), expected)


K = torch.zeros(4, 512, dtype=torch.bfloat16)
C = torch.zeros(2, 16 * 584, dtype=torch.uint8)
S = torch.arange(4)


@pytest.mark.parametrize(
    "args,match",
    [
        ((K.float(), C, S, 16, 0, 448.0), "k must have dtype bfloat16, got float32"),
        ((K[:, :256], C, S, 16, 0, 448.0), r"k must have shape \[tokens, 512\]"),
        ((K, C.int(), S, 16, 0, 448.0), "k_cache must have dtype uint8, got int32"),
        ((K, C, S.int(), 16, 0, 448.0), "slot_mapping must have dtype int64, got int32"),
        ((K, C, torch.arange(5), 16, 0, 448.0), "slot_mapping has 5 entries for 4 rows of k"),
        ((K, C, S, 0, 0, 448.0), r"block_size must be in \[1, 2\^31 - 1\], got 0"),
        ((K, C, S, 2**31, 0, 448.0), r"block_size must be in \[1, 2\^31 - 1\], got 2147483648"),
        ((K, C, S, 17, 0, 448.0), "cannot hold block_size=17 records of 584 bytes"),
        ((K, torch.zeros(2 * 9344 + 1, dtype=torch.uint8)[1:].view(2, 9344), S, 16, 0, 448.0), "16-byte aligned"),
        ((torch.zeros(4 * 512 + 1, dtype=torch.bfloat16)[1:].view(4, 512), C, S, 16, 0, 448.0), "16-byte aligned"),
        ((K, C[:, :16 * 584 - 8].contiguous()[:, :-8], S, 16, 0, 448.0), "cannot hold"),
        ((K, C, S, 16, 3, 448.0), "fp8_format must be 0"),
        ((K, C, S, 16, 1, 448.0), r"quant_max must be in \(0, 240\]"),
        ((K, C.t(), S, 16, 0, 448.0), "contiguous after dim 0"),
    ],
)
def test_insert_invalid_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.quantize_and_insert_k_cache(*args)


O = torch.zeros(2, 8, 512, dtype=torch.bfloat16)
L = torch.tensor([4, 4], dtype=torch.int32)
T = torch.zeros(2, 1, dtype=torch.int32)


@pytest.mark.parametrize(
    "args,match",
    [
        ((O.float(), C, L, None, T, 16, 0, 0), "out must have dtype bfloat16"),
        ((O[:, :, :500], C, L, None, T, 16, 0, 0), r"out must have shape \[requests, rows, 512\]"),
        ((O, C, L.long(), None, T, 16, 0, 0), "seq_lens must have dtype int32, got int64"),
        ((O, C, L[:1], None, T, 16, 0, 0), "seq_lens must have 2 entries, got 1"),
        ((O, C, L, L[:1], T, 16, 0, 0), "gather_lens must have 2 entries, got 1"),
        ((O, C, L, None, T.long(), 16, 0, 0), "block_table must have dtype int32"),
        ((O, C, L, None, T[:1], 16, 0, 0), r"block_table must have shape \[2, max_blocks\]"),
        ((O, C, L, None, T, 16, 9, 0), r"offset must be in \[0, 8\], got 9"),
        ((O, C, L, None, T, 16, -1, 0), "offset must be in"),
        ((O, C, L, None, T, 16, 0, 2), "fp8_format must be 0"),
        ((torch.zeros(2 * 8 * 512 + 1, dtype=torch.bfloat16)[1:].view(2, 8, 512), C, L, None, T, 16, 0, 0),
         "16-byte aligned"),
        ((O[:1].expand(2, 8, 512), C, L, None, T, 16, 0, 0), "out must not overlap itself"),
    ],
)
def test_gather_invalid_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.dequantize_and_gather_k_cache(*args)


def test_inputs_and_outputs_inside_the_cache_are_refused():
    pool = torch.zeros(2, 16 * 584 + 8192, dtype=torch.uint8)
    cache = pool[:, :16 * 584]
    with pytest.raises(RuntimeError, match="k must not overlap k_cache"):
        torch.ops.dsv4.quantize_and_insert_k_cache(pool[0, :2 * 1024].view(torch.bfloat16).view(2, 512), cache,
                                                   torch.arange(2), 16, 0, 448.0)
    out = pool[1, :2 * 1024].view(torch.bfloat16).view(1, 2, 512)
    with pytest.raises(RuntimeError, match="k_cache must not overlap out"):
        torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache, torch.ones(1, dtype=torch.int32), None,
                                                     torch.zeros(1, 1, dtype=torch.int32), 16, 0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    cache = make_cache(2, 16, device=device)
    torch.ops.dsv4.quantize_and_insert_k_cache(torch.empty(0, 512, dtype=torch.bfloat16, device=device), cache,
                                               torch.empty(0, dtype=torch.long, device=device), 16, 0, 448.0)
    assert bool((cache == CANARY).all())
    out = torch.empty(0, 4, 512, dtype=torch.bfloat16, device=device)
    torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache, torch.empty(0, dtype=torch.int32, device=device), None,
                                                 torch.empty(0, 1, dtype=torch.int32, device=device), 16, 0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    k = make_k(20, seed=5).to(device)
    cache = torch.zeros(2, 16 * 584, dtype=torch.uint8, device=device)
    torch.library.opcheck(torch.ops.dsv4.quantize_and_insert_k_cache.default,
                          (k, cache, torch.arange(20, device=device), 16, 1, 224.0))
    out = torch.zeros(1, 20, 512, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(torch.ops.dsv4.dequantize_and_gather_k_cache.default,
                          (out, cache, torch.tensor([20], dtype=torch.int32, device=device), None,
                           torch.tensor([[0, 1]], dtype=torch.int32, device=device), 16, 0, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def write_then_read(k, cache, slots, lens, table, out):
        torch.ops.dsv4.quantize_and_insert_k_cache(k * 2, cache, slots, 16, 0, 448.0)
        torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache, lens, None, table, 16, 0, 0)
        return out * 1

    k = make_k(30, seed=6).to(device)
    args = lambda: (k, torch.zeros(2, 16 * 584, dtype=torch.uint8, device=device),  # noqa: E731
                    torch.arange(30, device=device), torch.tensor([30], dtype=torch.int32, device=device),
                    torch.tensor([[0, 1]], dtype=torch.int32, device=device),
                    torch.zeros(1, 30, 512, dtype=torch.bfloat16, device=device))
    assert_bits_equal(torch.compile(write_then_read, fullgraph=True)(*args()), write_then_read(*args()))


@pytest.mark.gpu
def test_graph_capture_and_replay():
    device = "cuda"
    k = make_k(64, seed=7).to(device)
    cache = torch.zeros(2, 64 * 584, dtype=torch.uint8, device=device)
    slots = torch.arange(64, device=device)
    out = torch.zeros(1, 64, 512, dtype=torch.bfloat16, device=device)
    lens = torch.tensor([64], dtype=torch.int32, device=device)
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=device)

    def run():
        torch.ops.dsv4.quantize_and_insert_k_cache(k, cache, slots, 64, 1, 224.0)
        torch.ops.dsv4.dequantize_and_gather_k_cache(out, cache, lens, None, table, 64, 0, 1)

    graph, _ = capture_graph(run)
    fresh = make_k(64, seed=8)
    k.copy_(fresh.to(device))
    slots.copy_(torch.arange(64, 128, device=device))
    graph.replay()
    torch.cuda.synchronize()
    expected = reference.dequantize_kv_record(*reference.quantize_kv_record(fresh, Fp8Format.FNUZ), Fp8Format.FNUZ)
    assert_bits_equal(out[0].cpu(), expected)
