"""mHC (spec/mhc.md): dsv4.mhc_pre / mhc_post / mhc_fused_post_pre / hc_head against the fp32 reference at
DSv4-Flash (hidden 4096) and DSv4-Pro (7168) sizes, the arch-keyed backend table, and the usual op checks.

Tolerances, derived: the kernels and the reference differ only in the order of their fp32 sums (dot
products over 4 * hidden values, the sums of squares, the 4-term mixes). The dot products of random rows
carry a relative error of about sqrt(4 * hidden) fp32 epsilons (< 1e-5), which reaches the sigmoid weights
as an absolute difference far below 1e-5. A bf16 output is one rounding of a sum whose fp32 value differs
by at most 1e-5 times the sum of its terms' magnitudes, so it lies within one bf16 ULP of the reference
plus 1e-5 x sum |terms| (the second part only matters where the terms cancel). post_mix and comb_mix are
fp32: within 1e-5 of the reference. Sinkhorn: with 20 iterations the last
step normalizes columns, so column sums are 1 within 1e-5; row sums converge more slowly (1e-3 here)."""

import logging

import pytest
import torch

import dsv4ops
from dsv4ops import mhc as mhc_module
from dsv4ops.reference import mhc as reference

from conftest import DEVICES, assert_bits_equal, capture_graph

EPS = 1e-6


def bf16_ulp_distance(a, b):
    def monotone(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (monotone(a) - monotone(b)).abs()


def assert_bf16_close(got, want, magnitude, relative=1e-5):
    """|got - want| <= one bf16 ULP of want + relative * magnitude (the sum of the |terms| of each value)."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    got, want = got.cpu().float(), want.cpu().float()
    _, exponent = torch.frexp(want)
    ulp = torch.ldexp(torch.ones_like(want), exponent - 8)  # bf16 has 8 significant bits
    bound = ulp + relative * magnitude.cpu().float()
    excess = (got - want).abs() - bound
    assert float(excess.max()) <= 0, f"{int((excess > 0).sum())} values outside the bound; worst by {float(excess.max())}"


def post_magnitude(x, residual, post_mix, comb_mix):
    """|post_j * x| + sum_i |comb[i, j] * residual_i| for each output stream j."""
    t = residual.shape[0]
    post = post_mix.reshape(t, 4).abs().float()
    mixed = torch.einsum("tij,tih->tjh", comb_mix.abs().float(), residual.float().abs())
    return post[:, :, None] * x.float().abs()[:, None, :] + mixed


def collapse_magnitude(residual):
    """sum_i |residual_i| (the pre weights are below 1 + eps)."""
    return residual.float().abs().sum(dim=1) * (1 + EPS)


def params(hidden, mixes=24, seed=0, scales=3, strength=1.0):
    """The upstream test's distribution (fn ~ N(0,1)*1e-4, scale and base ~ N(0,1)*0.1), `strength`
    times stronger mixing."""
    g = torch.Generator().manual_seed(seed)
    fn = torch.randn(mixes, 4 * hidden, generator=g) * 1e-4 * strength
    scale = torch.randn(scales, generator=g) * 0.1 * strength
    base = torch.randn(mixes, generator=g) * 0.1
    return fn, scale, base


def streams(t, hidden, seed=1, identical=False):
    g = torch.Generator().manual_seed(seed)
    if identical:  # layer 0: the embedding repeated over the 4 streams
        return torch.randn(t, 1, hidden, generator=g).to(torch.bfloat16).repeat(1, 4, 1)
    return torch.randn(t, 4, hidden, generator=g).to(torch.bfloat16)


def to(device, *tensors):
    return tuple(None if t is None else t.to(device) for t in tensors)


SIZES = [pytest.param(t, h, id=f"T{t}-H{h}") for h in (4096, 7168) for t in (1, 7, 100, 128, 4096)]
# Token counts at the GPU kernels' switches (src/hip/mhc/mhc.hip): the dots kernel chained to the kernel
# before it up to 64 tokens, the epilogue and collapse in one kernel up to 128 tokens (with 16 epilogue lanes
# per token below 33 k slices: hidden 256), fn split once by its own kernel from 193 tokens, 32 epilogue
# lanes per token from 33 k slices (1000 tokens), two tiles per warp from 2048 tokens.
KERNEL_SWITCH_SIZES = [pytest.param(t, h, id=f"T{t}-H{h}") for t, h in (
    (5, 256), (64, 4096), (65, 7168), (129, 7168), (193, 4096), (1000, 7168), (2048, 4096))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,hidden", SIZES + KERNEL_SWITCH_SIZES)
@pytest.mark.parametrize("post_mult", [1.0, 2.0])
@pytest.mark.parametrize("strength", [1.0, 10.0])
def test_pre_matches_reference(device, t, hidden, post_mult, strength):
    """strength 1 is the upstream distribution; at 10 the mixes leave the sigmoid's flat middle, so an error
    in the dot products or the sum of squares shows in post_mix and comb_mix."""
    residual = streams(t, hidden)
    fn, scale, base = params(hidden, strength=strength)
    post, comb, layer_input = torch.ops.dsv4.mhc_pre(*to(device, residual, fn, scale, base), EPS, EPS, EPS, post_mult,
                                                    20, None, EPS)
    want_post, want_comb, want_input = reference.mhc_pre(residual, fn, scale, base, post_mult=post_mult)
    torch.testing.assert_close(post.cpu(), want_post, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comb.cpu(), want_comb, rtol=0, atol=1e-5)
    assert_bf16_close(layer_input, want_input, collapse_magnitude(residual))
    comb = comb.cpu().double()
    assert float((comb.sum(dim=-2) - 1).abs().max()) <= 1e-5
    assert float((comb.sum(dim=-1) - 1).abs().max()) <= 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,hidden", [(7, 4096), (300, 7168), (1100, 4096)])
def test_pre_follows_the_sinkhorn_iteration_count(device, t, hidden):
    """Comb logits of several units (base ~ N(0, 2)) leave Sinkhorn far from converged after a few steps, so
    the result depends on sinkhorn_iters (with the other tests' logits, two steps already converge): the op
    equals the reference run with the same count, at each count."""
    residual = streams(t, hidden, seed=5)
    fn, scale, base = params(hidden, seed=6, strength=10.0)
    base[8:] = torch.randn(16, generator=torch.Generator().manual_seed(7)) * 2.0
    combs = {}
    for iters in (1, 3, 7):
        post, comb, layer_input = torch.ops.dsv4.mhc_pre(*to(device, residual, fn, scale, base), EPS, EPS, EPS, 2.0,
                                                         iters, None, EPS)
        want_post, want_comb, want_input = reference.mhc_pre(residual, fn, scale, base, post_mult=2.0,
                                                             sinkhorn_iters=iters)
        torch.testing.assert_close(post.cpu(), want_post, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(comb.cpu(), want_comb, rtol=0, atol=1e-5)
        assert_bf16_close(layer_input, want_input, collapse_magnitude(residual))
        combs[iters] = comb.cpu()
    assert float((combs[1] - combs[7]).abs().max()) > 1e-2, "these inputs must make the count matter"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hidden", [4096, 7168])
@pytest.mark.parametrize("t", [7, 128])
def test_pre_with_fused_norm(device, hidden, t):
    residual = streams(t, hidden, seed=2)
    fn, scale, base = params(hidden, seed=3, strength=10.0)
    weight = (torch.rand(hidden, generator=torch.Generator().manual_seed(4)) * 2).to(torch.bfloat16)
    got = torch.ops.dsv4.mhc_pre(*to(device, residual, fn, scale, base), EPS, EPS, EPS, 2.0, 20,
                                 weight.to(device), 1e-5)
    want = reference.mhc_pre(residual, fn, scale, base, norm_weight=weight, norm_eps=1e-5)
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=1e-5)
    unnormed = reference.mhc_pre(residual, fn, scale, base)[2].float()
    factor = torch.rsqrt((unnormed * unnormed).mean(-1, keepdim=True) + 1e-5)
    assert_bf16_close(got[2], want[2], collapse_magnitude(residual) * factor * weight.float())


@pytest.mark.parametrize("device", DEVICES)
def test_layer_zero_identical_streams(device):
    """All 4 streams equal (layer 0): layer_input is (sum of the pre weights) times the stream."""
    t, hidden = 9, 4096
    residual = streams(t, hidden, seed=5, identical=True)
    fn, scale, base = params(hidden, seed=6)
    _, comb, layer_input = torch.ops.dsv4.mhc_pre(*to(device, residual, fn, scale, base), EPS, EPS, EPS, 2.0, 20,
                                                  None, EPS)
    want_post, want_comb, want_input = reference.mhc_pre(residual, fn, scale, base)
    assert_bf16_close(layer_input, want_input, collapse_magnitude(residual))
    x = residual.float()
    mixes = (x.reshape(t, -1) @ fn.t()) * torch.rsqrt((x.reshape(t, -1) ** 2).mean(-1, keepdim=True) + EPS)
    pre_sum = (torch.sigmoid(mixes[:, :4] * scale[0] + base[:4]) + EPS).sum(-1, keepdim=True)
    assert_bf16_close(layer_input, (pre_sum * x[:, 0]).to(torch.bfloat16), collapse_magnitude(residual))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,hidden", [(1, 4096), (7, 7168), (128, 4096), (4096, 7168)])
@pytest.mark.parametrize("post_shape", ["T41", "T4"])
def test_post_matches_reference(device, t, hidden, post_shape):
    residual = streams(t, hidden, seed=7)
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    post, comb, _ = reference.mhc_pre(residual, *params(hidden, seed=9, strength=30.0))
    post_mix = post if post_shape == "T41" else post[:, :, 0].contiguous()
    got = torch.ops.dsv4.mhc_post(*to(device, x, residual, post_mix, comb))
    assert got.shape == (t, 4, hidden) and got.dtype == torch.bfloat16
    assert_bf16_close(got, reference.mhc_post(x, residual, post_mix, comb), post_magnitude(x, residual, post_mix, comb))


@pytest.mark.parametrize("device", DEVICES)
def test_post_and_fused_accept_strided_mixes(device):
    """spec §8: a strided post_mix ([T, 4, 1] or [T, 4]) is accepted, and a strided comb_mix too: the same bits as
    their contiguous copies."""
    t, hidden = 5, 256
    residual = streams(t, hidden, seed=40).to(device)
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(41)).to(torch.bfloat16).to(device)
    post, comb, _ = reference.mhc_pre(residual.cpu(), *params(hidden, seed=42, strength=30.0))
    fn, scale, base = to(device, *params(hidden, seed=43))
    post, comb = post.to(device), comb.to(device)
    strided_posts = (torch.zeros(t, 4, 2, device=device)[..., :1].copy_(post),  # [T, 4, 1], stride (8, 2, 1)
                     torch.zeros(t, 8, device=device)[:, ::2].copy_(post[:, :, 0]))  # [T, 4], stride (8, 2)
    strided_comb = comb.transpose(1, 2).contiguous().transpose(1, 2)
    want_post = torch.ops.dsv4.mhc_post(x, residual, post, comb)
    want_fused = torch.ops.dsv4.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base, EPS, EPS, EPS, 2.0, 20,
                                                   None, EPS)
    for post_mix in strided_posts:
        for comb_mix in (comb, strided_comb):
            assert not post_mix.is_contiguous()
            assert_bits_equal(torch.ops.dsv4.mhc_post(x, residual, post_mix, comb_mix).cpu(), want_post.cpu())
            got = torch.ops.dsv4.mhc_fused_post_pre(x, residual, post_mix, comb_mix, fn, scale, base, EPS, EPS, EPS,
                                                    2.0, 20, None, EPS)
            for g, w in zip(got, want_fused):
                assert_bits_equal(g.cpu(), w.cpu())


@pytest.mark.parametrize("device", DEVICES)
# 64 and 65: the GPU's switch from the chained small-token kernels (each starting while the one before
# finishes) to plain launches; 128 and 129: from one epilogue + collapse kernel to two; 17 with hidden 256: a
# partial token tile over few chunks.
@pytest.mark.parametrize("t,hidden", [(1, 4096), (17, 256), (33, 7168), (64, 4096), (65, 7168), (128, 4096),
                                      (129, 7168), (2100, 4096)])
def test_fused_post_pre_is_post_then_pre(device, t, hidden):
    check_fused_post_pre(device, t, hidden, post_mult=2.0, seed=10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,hidden", [(1, 4096), (17, 256), (65, 7168), (129, 7168)])
def test_fused_post_pre_with_post_mult_one(device, t, hidden):
    """post_mult 1.0 (the model's is 2.0): the post weights are the bare sigmoids; stronger mixing."""
    check_fused_post_pre(device, t, hidden, post_mult=1.0, seed=36, strength=10.0)


@pytest.mark.parametrize("device", DEVICES)
# 1 and 65: the GPU's chained small-token kernels and plain launches; 129: two epilogue + collapse kernels.
@pytest.mark.parametrize("t,hidden", [(1, 4096), (65, 7168), (129, 4096)])
def test_fused_post_pre_with_norm_weight(device, t, hidden):
    """The optional weighted RMSNorm of layer_input (spec §2) in the fused op: post, then pre with the norm."""
    weight = (torch.rand(hidden, generator=torch.Generator().manual_seed(44)) + 0.5).to(torch.bfloat16)
    check_fused_post_pre(device, t, hidden, post_mult=2.0, seed=45, norm_weight=weight, norm_eps=1e-5)


def check_fused_post_pre(device, t, hidden, post_mult, seed, strength=1.0, norm_weight=None, norm_eps=EPS):
    """The fused op against the reference, and bit for bit against our post followed by our pre."""
    residual = streams(t, hidden, seed=seed)
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16)
    post, comb, _ = reference.mhc_pre(residual, *params(hidden, seed=seed + 2))
    fn, scale, base = params(hidden, seed=seed + 3, strength=strength)
    args = to(device, x, residual, post, comb, fn, scale, base)
    (device_weight,) = to(device, norm_weight)
    fused = torch.ops.dsv4.mhc_fused_post_pre(*args, EPS, EPS, EPS, post_mult, 20, device_weight, norm_eps)
    want = reference.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base, post_mult=post_mult,
                                        norm_weight=norm_weight, norm_eps=norm_eps)
    assert_bf16_close(fused[0], want[0], post_magnitude(x, residual, post, comb))
    torch.testing.assert_close(fused[1].cpu(), want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[2].cpu(), want[2], rtol=0, atol=1e-5)
    # The pre half reads the bf16 new residual, which may differ from the reference's by a rounding in a
    # few values (checked just above): its collapse is compared with the reference pre of that same input.
    new_residual = fused[0].cpu()
    want_post, want_comb, want_input = reference.mhc_pre(new_residual, fn, scale, base, post_mult=post_mult,
                                                         norm_weight=norm_weight, norm_eps=norm_eps)
    torch.testing.assert_close(fused[1].cpu(), want_post, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[2].cpu(), want_comb, rtol=0, atol=1e-5)
    input_magnitude = collapse_magnitude(new_residual)
    if norm_weight is not None:  # as test_pre_with_fused_norm: the terms' magnitudes times the norm's factor
        unnormed = reference.mhc_pre(new_residual, fn, scale, base, post_mult=post_mult)[2].float()
        factor = torch.rsqrt((unnormed * unnormed).mean(-1, keepdim=True) + norm_eps)
        input_magnitude = input_magnitude * factor * norm_weight.float()
    assert_bf16_close(fused[3], want_input, input_magnitude)
    # The documented contract: the new residual bit for bit as our post makes it, and the mixes and layer_input
    # as our pre makes them from it -- bit for bit on the CPU and on NVIDIA, which run the two; on AMD the dot
    # products run inside one kernel with post, in another order of their fp32 sums, so within the tolerances of
    # an fp32 sum.
    ours = torch.ops.dsv4.mhc_post(*args[:4])
    unfused = (ours,) + tuple(torch.ops.dsv4.mhc_pre(ours, *args[4:], EPS, EPS, EPS, post_mult, 20, device_weight,
                                                     norm_eps))
    assert_bits_equal(fused[0].cpu(), unfused[0].cpu())
    if device == "cpu" or torch.version.hip is None:
        for got, want_bits in zip(fused[1:], unfused[1:]):
            assert_bits_equal(got.cpu(), want_bits.cpu())
    else:
        torch.testing.assert_close(fused[1].cpu(), unfused[1].cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused[2].cpu(), unfused[2].cpu(), rtol=0, atol=1e-5)
        assert_bf16_close(fused[3], unfused[3].cpu(), input_magnitude)


@pytest.mark.parametrize("device", DEVICES)
# 768 and 769: the head's switch from one epilogue + collapse kernel to two (src/hip/mhc/mhc.hip).
@pytest.mark.parametrize("t,hidden", [(1, 4096), (7, 7168), (100, 4096), (128, 4096), (193, 7168), (768, 4096),
                                      (769, 7168), (2100, 4096)])
def test_hc_head_matches_reference(device, t, hidden):
    residual = streams(t, hidden, seed=14)
    fn, scale, base = params(hidden, mixes=4, scales=1, seed=15, strength=10.0)
    got = torch.ops.dsv4.hc_head(*to(device, residual, fn, scale, base), EPS, EPS)
    assert_bf16_close(got, reference.hc_head(residual, fn, scale, base), collapse_magnitude(residual))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_tokens(device):
    residual = torch.empty(0, 4, 4096, dtype=torch.bfloat16, device=device)
    fn, scale, base = to(device, *params(4096))
    post, comb, layer_input = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    assert post.shape == (0, 4, 1) and comb.shape == (0, 4, 4) and layer_input.shape == (0, 4096)
    x = torch.empty(0, 4096, dtype=torch.bfloat16, device=device)
    assert torch.ops.dsv4.mhc_post(x, residual, post, comb).shape == (0, 4, 4096)
    head = torch.ops.dsv4.hc_head(residual, fn[:4].contiguous(), scale[:1].contiguous(), base[:4].contiguous(), EPS,
                                  EPS)
    assert head.shape == (0, 4096)
    fused = torch.ops.dsv4.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None,
                                              EPS)
    assert [tuple(f.shape) for f in fused] == [(0, 4, 4096), (0, 4, 1), (0, 4, 4), (0, 4096)]


R = torch.zeros(2, 4, 128, dtype=torch.bfloat16)
FN, SCALE, BASE = params(128)


def _pre_args(**over):
    base = dict(residual=R, fn=FN, scale=SCALE, base=BASE, rms_eps=EPS, pre_eps=EPS, sinkhorn_eps=EPS, post_mult=2.0,
                sinkhorn_iters=20, norm_weight=None, norm_eps=EPS)
    base.update(over)
    return tuple(base.values())


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(residual=R.float()), "residual must have dtype bfloat16"),
        (dict(residual=torch.zeros(2, 3, 128, dtype=torch.bfloat16)), r"residual must have shape \[tokens, 4, hidden\]"),
        (dict(residual=torch.zeros(2, 4, 96, dtype=torch.bfloat16)), "hidden must be a positive multiple of 64"),
        (dict(residual=R.transpose(0, 1)), r"residual must have shape \[tokens, 4, hidden\]"),
        (dict(fn=FN[:, :256]), r"fn must have shape \[24, 512\]"),
        (dict(fn=FN.double()), "fn must have dtype float32"),
        (dict(scale=SCALE[:2]), r"scale must have shape \[3\]"),
        (dict(base=BASE[:4]), r"base must have shape \[24\]"),
        (dict(sinkhorn_iters=0), r"sinkhorn_iters must be in \[1, 1000\]"),
        (dict(rms_eps=float("nan")), "rms_eps must be finite"),
        (dict(norm_weight=torch.ones(64, dtype=torch.bfloat16)), r"norm_weight must have shape \[128\]"),
        (dict(norm_weight=torch.ones(128)), "norm_weight must have dtype bfloat16"),
    ],
)
def test_pre_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.mhc_pre(*_pre_args(**over))


def test_post_invalid_inputs():
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    post, comb = torch.zeros(2, 4, 1), torch.zeros(2, 4, 4)
    with pytest.raises(RuntimeError, match=r"x must have shape \[2, 128\]"):
        torch.ops.dsv4.mhc_post(x[:1], R, post, comb)
    with pytest.raises(RuntimeError, match=r"post_mix must have shape \[2, 4, 1\] or \[2, 4\]"):
        torch.ops.dsv4.mhc_post(x, R, torch.zeros(2, 3), comb)
    with pytest.raises(RuntimeError, match=r"comb_mix must have shape \[2, 4, 4\]"):
        torch.ops.dsv4.mhc_post(x, R, post, torch.zeros(2, 16))
    with pytest.raises(RuntimeError, match="post_mix must have dtype float32"):
        torch.ops.dsv4.mhc_post(x, R, post.double(), comb)


def _misaligned(t):
    """A contiguous copy of t whose data starts one element (2 or 4 bytes) past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
    out = storage[1 : 1 + t.numel()].view(t.shape).copy_(t)
    assert out.is_contiguous() and out.data_ptr() % 16
    return out


def _strided(t):
    """A copy of t whose last dim of more than one element has stride 2 (a view into a buffer twice its size),
    so that it is not contiguous; a one-element tensor is contiguous at any strides, and is copied as it is."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    if not dims:
        return t.clone()
    d = dims[-1]
    shape, every_other = list(t.shape), [slice(None)] * t.dim()
    shape[d], every_other[d] = 2 * shape[d], slice(None, None, 2)
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)[tuple(every_other)].copy_(t)
    assert not out.is_contiguous()
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [_misaligned, _strided])
def test_ops_accept_misaligned_and_strided_inputs(device, layout):
    """Every tensor argument of the four ops in another layout than the kernels read (a strided view, or a
    contiguous one off 16-byte alignment): the op copies it, and gives the same bits as for dense inputs."""
    t, hidden = 5, 256
    residual = streams(t, hidden, seed=44).to(device)
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(45)).to(torch.bfloat16).to(device)
    fn, scale, base = to(device, *params(hidden, seed=46))
    weight = (torch.rand(hidden, generator=torch.Generator().manual_seed(47)) + 0.5).to(torch.bfloat16).to(device)
    post, comb, _ = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    head = (fn[:4].contiguous(), scale[:1].contiguous(), base[:4].contiguous())
    calls = {
        "mhc_pre": lambda r, x, f, s, b, w, p, c, hf, hs, hb: torch.ops.dsv4.mhc_pre(r, f, s, b, EPS, EPS, EPS, 2.0,
                                                                                      20, w, EPS),
        "mhc_post": lambda r, x, f, s, b, w, p, c, hf, hs, hb: (torch.ops.dsv4.mhc_post(x, r, p, c),),
        "mhc_fused_post_pre": lambda r, x, f, s, b, w, p, c, hf, hs, hb: torch.ops.dsv4.mhc_fused_post_pre(
            x, r, p, c, f, s, b, EPS, EPS, EPS, 2.0, 20, w, EPS),
        "hc_head": lambda r, x, f, s, b, w, p, c, hf, hs, hb: (torch.ops.dsv4.hc_head(r, hf, hs, hb, EPS, EPS),),
    }
    dense = (residual, x, fn, scale, base, weight, post, comb, *head)
    for name, call in calls.items():
        want = call(*dense)
        for i in range(len(dense)):  # one argument at a time in the other layout
            args = list(dense)
            args[i] = layout(args[i])
            for g, w in zip(call(*args), want):
                assert_bits_equal(g.cpu(), w.cpu())
        for g, w in zip(call(*(layout(a) for a in dense)), want):  # and all of them at once
            assert_bits_equal(g.cpu(), w.cpu())


def _too_many_tokens(*row):
    """2^31 tokens of a stride-0 row: the token limit is checked before contiguity, so nothing is allocated."""
    return torch.zeros(1, *row, dtype=torch.bfloat16).expand(2**31, *row)


HEAD_FN, HEAD_SCALE, HEAD_BASE = params(128, mixes=4, scales=1)


def _head_args(**over):
    base = dict(residual=R, fn=HEAD_FN, scale=HEAD_SCALE, base=HEAD_BASE, rms_eps=EPS, eps=EPS)
    base.update(over)
    return tuple(base.values())


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(residual=R.float()), "residual must have dtype bfloat16, got float32"),
        (dict(residual=torch.zeros(2, 3, 128, dtype=torch.bfloat16)),
         r"residual must have shape \[tokens, 4, hidden\] \(hc_mult 4\), got \[2, 3, 128\]"),
        (dict(residual=torch.zeros(2, 4, 96, dtype=torch.bfloat16)), "hidden must be a positive multiple of 64, got 96"),
        (dict(residual=torch.zeros(2, 4, 0, dtype=torch.bfloat16)), "hidden must be a positive multiple of 64, got 0"),
        (dict(residual=_too_many_tokens(4, 64), fn=torch.zeros(4, 256)), r"at most 2\^31 - 1 tokens, got 2147483648"),
        (dict(fn=FN), r"fn must have shape \[4, 512\], got \[24, 512\]"),  # the sub-layer's fn: 24 mixes
        (dict(fn=HEAD_FN[:, :256]), r"fn must have shape \[4, 512\], got \[4, 256\]"),
        (dict(fn=HEAD_FN.double()), "fn must have dtype float32, got float64"),
        (dict(scale=SCALE), r"scale must have shape \[1\], got \[3\]"),
        (dict(scale=HEAD_SCALE.double()), "scale must have dtype float32, got float64"),
        (dict(base=BASE), r"base must have shape \[4\], got \[24\]"),
        (dict(base=HEAD_BASE.half()), "base must have dtype float32, got float16"),
        (dict(rms_eps=float("nan")), "rms_eps must be finite and >= 0, got nan"),
        (dict(eps=-1.0), "dsv4.hc_head: pre_eps must be finite and >= 0, got -1"),  # eps is reported as pre_eps
        (dict(eps=float("inf")), "pre_eps must be finite and >= 0, got inf"),
    ],
)
def test_hc_head_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dsv4.hc_head(*_head_args(**over))


X = torch.zeros(2, 128, dtype=torch.bfloat16)
POST, COMB = torch.zeros(2, 4, 1), torch.zeros(2, 4, 4)


def _fused_args(**over):
    base = dict(x=X, residual=R, post_mix=POST, comb_mix=COMB, fn=FN, scale=SCALE, base=BASE, rms_eps=EPS,
                pre_eps=EPS, sinkhorn_eps=EPS, post_mult=2.0, sinkhorn_iters=20, norm_weight=None, norm_eps=EPS)
    base.update(over)
    return tuple(base.values())


@pytest.mark.parametrize(
    "over,match",
    [
        # the post half
        (dict(x=X.float()), "x must have dtype bfloat16, got float32"),
        (dict(x=X[:1]), r"x must have shape \[2, 128\], got \[1, 128\]"),
        (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16)), r"x must have shape \[2, 128\], got \[2, 64\]"),
        # checked before the op copies a view it cannot read in place: nothing is allocated for these
        (dict(x=torch.zeros(1, 128, dtype=torch.bfloat16).expand(2**31, 128)),
         r"x must have shape \[2, 128\], got \[2147483648, 128\]"),
        (dict(fn=torch.zeros(1, 512).expand(2**31, 512)), r"fn must have shape \[24, 512\], got \[2147483648, 512\]"),
        # post's inputs valid (2^31 - 1 tokens of expanded rows: over 1 TiB, which no allocator grants, if copied),
        # pre's fn not: refused with fn's message, nothing copied
        (dict(x=torch.zeros(1, 64, dtype=torch.bfloat16).expand(2**31 - 1, 64),
              residual=torch.zeros(1, 4, 64, dtype=torch.bfloat16).expand(2**31 - 1, 4, 64),
              post_mix=torch.zeros(1, 4, 1).expand(2**31 - 1, 4, 1),
              comb_mix=torch.zeros(1, 4, 4).expand(2**31 - 1, 4, 4)),
         r"fn must have shape \[24, 256\], got \[24, 512\]"),
        (dict(residual=R.float()), "residual must have dtype bfloat16, got float32"),
        (dict(residual=torch.zeros(2, 3, 128, dtype=torch.bfloat16)),
         r"residual must have shape \[tokens, 4, hidden\] \(hc_mult 4\), got \[2, 3, 128\]"),
        (dict(residual=torch.zeros(2, 4, 96, dtype=torch.bfloat16)), "hidden must be a positive multiple of 64, got 96"),
        (dict(residual=torch.zeros(3, 4, 128, dtype=torch.bfloat16)), r"x must have shape \[3, 128\], got \[2, 128\]"),
        (dict(residual=_too_many_tokens(4, 64)), r"at most 2\^31 - 1 tokens, got 2147483648"),
        (dict(post_mix=POST.double()), "post_mix must have dtype float32, got float64"),
        (dict(post_mix=torch.zeros(2, 3)), r"post_mix must have shape \[2, 4, 1\] or \[2, 4\], got \[2, 3\]"),
        (dict(post_mix=torch.zeros(3, 4, 1)), r"post_mix must have shape \[2, 4, 1\] or \[2, 4\], got \[3, 4, 1\]"),
        (dict(post_mix=torch.zeros(2, 4, 2)), r"post_mix must have shape \[2, 4, 1\] or \[2, 4\], got \[2, 4, 2\]"),
        (dict(comb_mix=COMB.double()), "comb_mix must have dtype float32, got float64"),
        (dict(comb_mix=torch.zeros(2, 16)), r"comb_mix must have shape \[2, 4, 4\], got \[2, 16\]"),
        (dict(comb_mix=torch.zeros(3, 4, 4)), r"comb_mix must have shape \[2, 4, 4\], got \[3, 4, 4\]"),
        # the pre half
        (dict(fn=FN[:, :256]), r"fn must have shape \[24, 512\], got \[24, 256\]"),
        (dict(fn=HEAD_FN), r"fn must have shape \[24, 512\], got \[4, 512\]"),  # the head's fn: 4 mixes
        (dict(fn=FN.double()), "fn must have dtype float32, got float64"),
        (dict(scale=SCALE[:2]), r"scale must have shape \[3\], got \[2\]"),
        (dict(scale=SCALE.double()), "scale must have dtype float32, got float64"),
        (dict(base=BASE[:4]), r"base must have shape \[24\], got \[4\]"),
        (dict(base=BASE.half()), "base must have dtype float32, got float16"),
        (dict(rms_eps=float("nan")), "rms_eps must be finite and >= 0, got nan"),
        (dict(pre_eps=-1e-6), "pre_eps must be finite and >= 0, got -1e-06"),
        (dict(sinkhorn_eps=float("inf")), "sinkhorn_eps must be finite and >= 0, got inf"),
        (dict(post_mult=float("nan")), "post_mult must be finite, got nan"),
        (dict(post_mult=float("inf")), "post_mult must be finite, got inf"),
        (dict(sinkhorn_iters=0), r"sinkhorn_iters must be in \[1, 1000\], got 0"),
        (dict(sinkhorn_iters=1001), r"sinkhorn_iters must be in \[1, 1000\], got 1001"),
        (dict(norm_weight=torch.ones(64, dtype=torch.bfloat16)), r"norm_weight must have shape \[128\], got \[64\]"),
        (dict(norm_weight=torch.ones(128)), "norm_weight must have dtype bfloat16, got float32"),
        (dict(norm_weight=torch.ones(128, dtype=torch.bfloat16), norm_eps=float("nan")),
         "norm_eps must be finite and >= 0, got nan"),
    ],
)
def test_fused_post_pre_invalid_inputs(over, match):
    with pytest.raises(RuntimeError, match="dsv4.mhc_fused_post_pre: " + match):
        torch.ops.dsv4.mhc_fused_post_pre(*_fused_args(**over))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    residual = streams(3, 128, seed=16).to(device)
    fn, scale, base = to(device, *params(128, seed=17))
    weight = torch.rand(128).to(torch.bfloat16).to(device)
    x = torch.randn(3, 128).to(torch.bfloat16).to(device)
    post, comb, _ = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    torch.library.opcheck(torch.ops.dsv4.mhc_pre.default, (residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, weight,
                                                          EPS))
    torch.library.opcheck(torch.ops.dsv4.mhc_post.default, (x, residual, post, comb))
    torch.library.opcheck(torch.ops.dsv4.mhc_fused_post_pre.default,
                          (x, residual, post, comb, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS))
    head_fn, head_scale, head_base = to(device, *params(128, mixes=4, scales=1, seed=18))
    torch.library.opcheck(torch.ops.dsv4.hc_head.default, (residual, head_fn, head_scale, head_base, EPS, EPS))
    # a strided residual (the ops copy it; their outputs are contiguous all the same) and a misaligned x
    strided = residual.transpose(0, 1).contiguous().transpose(0, 1)
    torch.library.opcheck(torch.ops.dsv4.mhc_pre.default, (strided, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS))
    torch.library.opcheck(torch.ops.dsv4.mhc_post.default, (_misaligned(x), strided, post, comb))
    torch.library.opcheck(torch.ops.dsv4.mhc_fused_post_pre.default,
                          (x, strided, post, comb, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS))
    torch.library.opcheck(torch.ops.dsv4.hc_head.default, (strided, head_fn, head_scale, head_base, EPS, EPS))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    residual = streams(5, 256, seed=19).to(device)
    fn, scale, base = to(device, *params(256, seed=20))
    x = torch.randn(5, 256).to(torch.bfloat16).to(device)

    def layer(x, residual):
        post, comb, layer_input = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
        new_residual = torch.ops.dsv4.mhc_post(x + layer_input, residual, post, comb)
        return torch.ops.dsv4.mhc_fused_post_pre(x, new_residual, post, comb, fn, scale, base, EPS, EPS, EPS, 2.0, 20,
                                                 None, EPS)

    for got, want in zip(torch.compile(layer, fullgraph=True)(x, residual), layer(x, residual)):
        assert_bits_equal(got.cpu(), want.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("t,hidden", [(1, 4096), (5, 7168), (64, 4096)])
def test_chained_launches_see_inputs_written_just_before(t, hidden):
    """At decode sizes the CUDA kernels start while the kernel before them finishes (programmatic dependent
    launch), and the one-kernel epilogue reads the residual before it waits for the dots kernel (after it, where
    the fused op's dots kernel writes that residual). Each call here gets a residual written by the kernel
    launched just before it; the results must equal, bit for bit, those of the same ops on the same values with
    the device synchronized around every call."""
    device = "cuda"
    fn, scale, base = to(device, *params(hidden, seed=31))
    head_fn, head_base, head_scale = fn[:4].contiguous(), base[:4].contiguous(), scale[:1].contiguous()
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(32)).to(torch.bfloat16).to(device)
    post, comb, _ = to(device, *reference.mhc_pre(streams(t, hidden, seed=33), *params(hidden, seed=34)))
    pre_args = (fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    generator = torch.Generator(device=device).manual_seed(35)
    for _ in range(20):
        residual = torch.randn(t, 4, hidden, device=device, generator=generator).to(torch.bfloat16)
        fused = torch.ops.dsv4.mhc_fused_post_pre(x, residual, post, comb, *pre_args)
        pre = torch.ops.dsv4.mhc_pre(residual.clone(), *pre_args)
        head = torch.ops.dsv4.hc_head(residual.clone(), head_fn, head_scale, head_base, EPS, EPS)
        torch.cuda.synchronize()
        want_fused = torch.ops.dsv4.mhc_fused_post_pre(x, residual, post, comb, *pre_args)
        torch.cuda.synchronize()
        want_pre = torch.ops.dsv4.mhc_pre(residual, *pre_args)
        torch.cuda.synchronize()
        want_head = torch.ops.dsv4.hc_head(residual, head_fn, head_scale, head_base, EPS, EPS)
        torch.cuda.synchronize()
        for got, want in zip(fused + pre + (head,), want_fused + want_pre + (want_head,)):
            assert_bits_equal(got.cpu(), want.cpu())


@pytest.mark.gpu
def test_graph_capture_and_replay():
    device, t, hidden = "cuda", 16, 4096
    residual = streams(t, hidden, seed=21).to(device)
    x = torch.randn(t, hidden).to(torch.bfloat16).to(device)
    fn, scale, base = to(device, *params(hidden, seed=22))
    post = torch.empty(t, 4, 1, device=device)
    comb = torch.empty(t, 4, 4, device=device)
    outputs = {}

    def run():
        p, c, layer_input = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
        outputs["pre"] = (p, c, layer_input)
        outputs["fused"] = torch.ops.dsv4.mhc_fused_post_pre(x, residual, p, c, fn, scale, base, EPS, EPS, EPS, 2.0,
                                                             20, None, EPS)

    graph, _ = capture_graph(run)
    fresh = streams(t, hidden, seed=23)
    residual.copy_(fresh.to(device))
    graph.replay()
    torch.cuda.synchronize()
    want = reference.mhc_pre(fresh, *(v.cpu() for v in (fn, scale, base)))
    torch.testing.assert_close(outputs["pre"][1].cpu(), want[1], rtol=0, atol=1e-5)
    assert_bf16_close(outputs["pre"][2], want[2], collapse_magnitude(fresh))
    want_fused = reference.mhc_fused_post_pre(x.cpu(), fresh, want[0], want[1], fn.cpu(), scale.cpu(), base.cpu())
    assert_bf16_close(outputs["fused"][0], want_fused[0], post_magnitude(x.cpu(), fresh, want[0], want[1]))
    del post, comb


# ---- the backend table (spec §6), simulated per arch on the CPU ----

ALWAYS = lambda name: True  # noqa: E731
NEVER = lambda name: False  # noqa: E731
ONLY = lambda *names: (lambda name: name in names)  # noqa: E731


@pytest.mark.parametrize(
    "arch,kernel_reason,available,hidden,hc,expected",
    [
        ("gfx942", None, ALWAYS, 4096, 4, "dsv4ops"),
        ("gfx942", "no kernel built", ALWAYS, 4096, 4, "aiter"),
        ("gfx942", "no kernel built", ONLY("tilelang"), 4096, 4, "reference"),  # never TileLang on gfx942
        ("gfx942", "no kernel built", ALWAYS, 4160, 4, "reference"),  # AITER needs hidden % 256 == 0
        ("gfx950", "no kernel built", ALWAYS, 7168, 4, "aiter"),
        ("gfx950", "no kernel built", ONLY("tilelang"), 4096, 4, "tilelang"),
        ("gfx950", "no kernel built", ALWAYS, 4160, 4, "tilelang"),
        ("gfx950", "hc_mult 2", ALWAYS, 4096, 2, "reference"),
        ("gfx90a", "no kernel built", ONLY("tilelang"), 4096, 4, "reference"),  # wave64 TileLang is suspect
        ("sm_90", None, ALWAYS, 4096, 4, "dsv4ops"),
        ("sm_90", "no kernel built", ALWAYS, 4096, 4, "tilelang"),
        ("sm_90", "no kernel built", ONLY("aiter"), 4096, 4, "reference"),
        ("cpu", None, ALWAYS, 4096, 4, "dsv4ops"),
        ("cpu", "disabled", ALWAYS, 4096, 4, "reference"),
    ],
)
def test_backend_table(arch, kernel_reason, available, hidden, hc, expected):
    choice = mhc_module.select_backend(arch, hc, hidden, kernel_reason, available)
    assert choice.backend == expected
    if expected != "dsv4ops":
        assert choice.reasons[0] == kernel_reason


def test_gfx942_never_lists_tilelang():
    assert "tilelang" not in mhc_module.BACKEND_ORDER["gfx942"]
    assert "tilelang" not in mhc_module.BACKEND_ORDER["amd-other"]


class _RecordingAdapter:
    def __init__(self):
        self.calls = []

    def mhc_pre(self, residual, *args):
        self.calls.append("mhc_pre")
        return reference.mhc_pre(residual, *args)


def test_simulated_gfx942_picks_aiter_then_reference_and_logs(monkeypatch, caplog):
    """On a (simulated) gfx942 without a gfx942 kernel: AITER when its module and adapter exist, else the
    reference, each with its reason logged once."""
    monkeypatch.setattr(mhc_module.dispatch.platform, "device_arch", lambda device: "gfx942")
    monkeypatch.setattr(mhc_module.importlib.util, "find_spec", lambda name: object())
    mhc_module.dispatch.reset_fallbacks()  # the backends' messages are logged once per reason
    adapter = _RecordingAdapter()
    residual = streams(2, 256, seed=24)
    fn, scale, base = params(256, seed=25)
    caplog.set_level(logging.INFO, logger="dsv4ops")
    try:
        mhc_module.register_backend("aiter", adapter)
        mhc_module.register_backend("tilelang", adapter)
        got = dsv4ops.mhc_pre(residual, fn, scale, base)
        assert adapter.calls == ["mhc_pre"]
        assert_bits_equal(got[2], reference.mhc_pre(residual, fn, scale, base)[2])
        assert "mhc_pre on gfx942 uses the aiter backend: no kernel built for gfx942" in caplog.text
        counts = dsv4ops.fallback_counts()  # a call served by AITER is a fallback too, counted under its name
        assert [n for (op, why), n in counts.items() if op == "mhc_pre" and why.startswith("aiter backend: ")] == [1]
        mhc_module.register_backend("aiter", None)
        caplog.clear()
        dsv4ops.mhc_pre(residual, fn, scale, base)
        assert adapter.calls == ["mhc_pre"], "TileLang must never serve gfx942"
        # one line (a warning) says why the kernel and then AITER passed
        assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING, caplog.text
        assert "mhc_pre on gfx942 uses the PyTorch reference: no kernel built for gfx942" in caplog.text
        assert "; aiter: not installed or no adapter registered" in caplog.text
    finally:
        mhc_module.register_backend("aiter", None)
        mhc_module.register_backend("tilelang", None)


def test_disable_sends_mhc_to_the_reference_not_an_external_backend(monkeypatch):
    """DSV4OPS_DISABLE means the reference for mHC as for every op, even where an external backend would serve."""
    monkeypatch.setattr(mhc_module.dispatch.platform, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(mhc_module.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setenv("DSV4OPS_DISABLE", "mhc_pre")
    mhc_module.dispatch.reset_fallbacks()
    adapter = _RecordingAdapter()
    residual = streams(2, 256, seed=46)
    fn, scale, base = params(256, seed=47)
    try:
        mhc_module.register_backend("aiter", adapter)
        got = dsv4ops.mhc_pre(residual, fn, scale, base)
        assert adapter.calls == []
        assert_bits_equal(got[2], reference.mhc_pre(residual, fn, scale, base)[2])
        assert dsv4ops.fallback_counts() == {("mhc_pre", "disabled by DSV4OPS_DISABLE"): 1}
    finally:
        mhc_module.register_backend("aiter", None)


def test_wrappers_serve_other_stream_counts_with_the_reference(caplog):
    caplog.set_level(logging.INFO, logger="dsv4ops")
    mhc_module.dispatch.reset_fallbacks()
    hidden = 64
    fn, scale, base = torch.randn(8, 2 * hidden) * 1e-3, torch.randn(3) * 0.1, torch.randn(8) * 0.1
    head_fn, head_scale, head_base = torch.randn(2, 2 * hidden) * 1e-3, torch.randn(1) * 0.1, torch.randn(2) * 0.1
    for t in (3, 5):  # hc_mult 2: (2 + 2) * 2 = 8 mixes; every op, at two token counts
        residual = torch.randn(t, 2, hidden).to(torch.bfloat16)
        x = torch.randn(t, hidden).to(torch.bfloat16)
        post, comb, layer_input = dsv4ops.mhc_pre(residual, fn, scale, base)
        assert post.shape == (t, 2, 1) and comb.shape == (t, 2, 2) and layer_input.shape == (t, hidden)
        assert_bits_equal(dsv4ops.mhc_post(x, residual, post, comb), reference.mhc_post(x, residual, post, comb))
        fused = dsv4ops.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base)
        for got, want in zip(fused, reference.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base)):
            assert_bits_equal(got, want)
        assert_bits_equal(dsv4ops.hc_head(residual, head_fn, head_scale, head_base),
                          reference.hc_head(residual, head_fn, head_scale, head_base))
    # one reason per op, whatever the token count: logged once and counted per call
    reason = "the kernel needs hc_mult 4 (residual [T, 4, hidden]), got 2 streams"
    assert dsv4ops.fallback_counts() == {(op, reason): 2 for op in mhc_module.OPS}
    assert caplog.text.count(reason) == len(mhc_module.OPS)
    with pytest.raises(ValueError, match="unknown external mHC backend"):
        mhc_module.register_backend("triton", object())


def test_hc_head_takes_scale_before_base_as_vllm():
    """spec §9: vLLM's argument order (HCHeadOp: hidden_states, hc_fn, hc_scale, hc_base, rms_norm_eps, hc_eps)."""
    names = [a.name for a in torch.ops.dsv4.hc_head.default._schema.arguments]
    assert names == ["residual", "fn", "scale", "base", "rms_eps", "eps"]
    pre_names = [a.name for a in torch.ops.dsv4.mhc_pre.default._schema.arguments]
    assert pre_names[:4] == ["residual", "fn", "scale", "base"]


@pytest.mark.parametrize("device", DEVICES)
def test_wrappers_use_the_kernel(device):
    residual = streams(4, 4096, seed=26).to(device)
    fn, scale, base = to(device, *params(4096, seed=27))
    x = torch.randn(4, 4096).to(torch.bfloat16).to(device)
    direct = torch.ops.dsv4.mhc_pre(residual, fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    for got, want in zip(dsv4ops.mhc_pre(residual, fn, scale, base), direct):
        assert_bits_equal(got.cpu(), want.cpu())
    assert_bits_equal(dsv4ops.mhc_post(x, residual, direct[0], direct[1]).cpu(),
                      torch.ops.dsv4.mhc_post(x, residual, direct[0], direct[1]).cpu())
    fused = dsv4ops.mhc_fused_post_pre(x, residual, direct[0], direct[1], fn, scale, base)
    want_fused = torch.ops.dsv4.mhc_fused_post_pre(x, residual, direct[0], direct[1], fn, scale, base, EPS, EPS, EPS,
                                                   2.0, 20, None, EPS)
    for got, want in zip(fused, want_fused):
        assert_bits_equal(got.cpu(), want.cpu())
    head_args = (residual, fn[:4].contiguous(), scale[:1].contiguous(), base[:4].contiguous())
    assert_bits_equal(dsv4ops.hc_head(*head_args).cpu(), torch.ops.dsv4.hc_head(*head_args, EPS, EPS).cpu())
    assert dsv4ops.fallback_counts() == {}, "every call above is the kernel's"


def test_wrappers_serve_misaligned_rows_and_fall_back_for_an_fp32_norm_weight(caplog):
    caplog.set_level(logging.INFO, logger="dsv4ops")
    residual = _misaligned(streams(2, 256, seed=27))  # contiguous but 2 bytes off 16-byte alignment
    fn, scale, base = params(256, seed=28)
    got = dsv4ops.mhc_pre(residual, fn, scale, base)
    assert dsv4ops.fallback_counts() == {}, "the op copies a misaligned residual: the kernel serves it"
    want = torch.ops.dsv4.mhc_pre(residual.clone(), fn, scale, base, EPS, EPS, EPS, 2.0, 20, None, EPS)
    assert_bits_equal(got[2], want[2])
    weight = torch.rand(256)
    got = dsv4ops.mhc_pre(residual, fn, scale, base, norm_weight=weight)
    assert "the kernel takes a bf16 norm_weight" in caplog.text
    assert_bits_equal(got[2], reference.mhc_pre(residual, fn, scale, base, norm_weight=weight, norm_eps=1e-6)[2])


def test_wrappers_reference_fallback_at_zero_tokens_and_for_an_fp32_x(caplog):
    """The reference serves what the kernel refuses, T = 0 included; an fp32 x falls back (not an error)."""
    caplog.set_level(logging.INFO, logger="dsv4ops")
    hidden = 100  # not a multiple of 64: the kernel refuses it
    residual, x = torch.empty(0, 4, hidden, dtype=torch.bfloat16), torch.empty(0, hidden, dtype=torch.bfloat16)
    fn, scale, base = torch.randn(24, 4 * hidden) * 1e-4, torch.randn(3) * 0.1, torch.randn(24) * 0.1
    post, comb, layer_input = dsv4ops.mhc_pre(residual, fn, scale, base)
    assert post.shape == (0, 4, 1) and comb.shape == (0, 4, 4) and layer_input.shape == (0, hidden)
    assert dsv4ops.mhc_post(x, residual, post, comb).shape == (0, 4, hidden)
    assert len(dsv4ops.mhc_fused_post_pre(x, residual, post, comb, fn, scale, base)) == 4
    assert dsv4ops.hc_head(residual, fn[:4], scale[:1], base[:4]).shape == (0, hidden)
    residual = streams(2, 256, seed=29)
    x = torch.randn(2, 256)
    post, comb = torch.rand(2, 4, 1), torch.rand(2, 4, 4)
    got = dsv4ops.mhc_post(x, residual, post, comb)
    assert "the kernel needs a bf16 x" in caplog.text
    assert_bits_equal(got, reference.mhc_post(x, residual, post, comb))


def test_wrappers_compile_fullgraph():
    residual = streams(3, 256, seed=30)
    fn, scale, base = params(256, seed=31)
    x = torch.randn(3, 256).to(torch.bfloat16)

    def layer(x, residual):
        post, comb, layer_input = dsv4ops.mhc_pre(residual, fn, scale, base)
        return dsv4ops.mhc_fused_post_pre(x + layer_input, residual, post, comb, fn, scale, base)

    for got, want in zip(torch.compile(layer, fullgraph=True)(x, residual), layer(x, residual)):
        assert_bits_equal(got, want)


def test_adapter_without_the_op_is_passed_over(monkeypatch):
    """An AITER adapter has no hc_head: on a simulated gfx942 the head then goes to the reference."""
    monkeypatch.setattr(mhc_module.dispatch.platform, "device_arch", lambda device: "gfx942")
    monkeypatch.setattr(mhc_module.importlib.util, "find_spec", lambda name: object())
    adapter = _RecordingAdapter()  # has mhc_pre only
    residual = streams(2, 256, seed=29)
    fn, scale, base = params(256, mixes=4, scales=1, seed=30)
    try:
        mhc_module.register_backend("aiter", adapter)
        got = dsv4ops.hc_head(residual, fn, scale, base)
        assert adapter.calls == []
        assert_bits_equal(got, reference.hc_head(residual, fn, scale, base))
    finally:
        mhc_module.register_backend("aiter", None)
