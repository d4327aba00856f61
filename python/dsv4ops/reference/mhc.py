"""Reference DSv4 manifold-constrained hyper-connections (spec/mhc.md): pre, post, fused post+pre and the
head. Pure PyTorch in fp32, the test oracle the kernels are compared with and the fallback. Its x . fn^T is a
torch matmul and so follows torch's fp32 matmul precision (spec §8: on a GPU whose caller allowed TF32, a
TF32 product; the tests run the oracle on the CPU, and the kernels never use TF32).

The residual is kept as HC_MULT = 4 streams [T, 4, hidden] bf16. Each sub-layer has fn [24, 4*hidden],
base [24] and scale [3] (fp32); the head has fn [4, 4*hidden], base [4], scale [1]. The reference also
serves other stream counts n (fn [(2 + n) * n, n * hidden]), which the kernels refuse.

Contract decisions shared with the kernels:
  * mixes = (x . fn^T) * rsqrt(mean(x^2) + rms_eps) over the flattened 4*hidden fp32 row (spec §2.1);
  * Sinkhorn as spec §2.5: softmax over k plus eps, a column normalization, then (iters - 1) pairs of
    row and column normalizations, each dividing by (sum + eps);
  * layer_input = sum_i pre_i * residual_i in fp32, then (with norm_weight) a weighted RMSNorm in fp32,
    rounded to bf16 once;
  * mhc_post: new[:, j] = post_j * x + sum_i comb[i, j] * residual_i in fp32, rounded to bf16 once;
  * mhc_fused_post_pre is exactly mhc_post followed by mhc_pre on the bf16 new residual.
"""

from __future__ import annotations

from typing import Optional

import torch

HC_MULT = 4
MIX_HC = (2 + HC_MULT) * HC_MULT  # 24: 4 pre, 4 post, 16 comb


def _check_residual(residual: torch.Tensor) -> int:
    """Returns the stream count."""
    if residual.dim() != 3 or residual.shape[1] < 1:
        raise ValueError(f"residual must have shape [T, streams, hidden], got {tuple(residual.shape)}")
    return residual.shape[1]


def sinkhorn(logits: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
    """[..., n, n] logits (row j, column k) -> the doubly stochastic comb matrix of spec §2.5."""
    if iters < 1:
        raise ValueError(f"sinkhorn_iters must be >= 1, got {iters}")
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def _normalized_mixes(residual: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    t = residual.shape[0]
    x = residual.reshape(t, residual.shape[1] * residual.shape[2]).to(torch.float32)  # (-1 fails at T = 0)
    r = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + rms_eps)
    return (x @ fn.to(torch.float32).t()) * r


def _collapse(residual: torch.Tensor, weights: torch.Tensor, norm_weight: Optional[torch.Tensor],
              norm_eps: Optional[float]) -> torch.Tensor:
    out = (weights[:, :, None] * residual.to(torch.float32)).sum(dim=1)
    if norm_weight is not None:
        eps = 1e-6 if norm_eps is None else norm_eps
        out = out * torch.rsqrt((out * out).mean(dim=-1, keepdim=True) + eps) * norm_weight.to(torch.float32)
    return out.to(torch.bfloat16)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            rms_eps: float = 1e-6, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
            sinkhorn_iters: int = 20, norm_weight: Optional[torch.Tensor] = None,
            norm_eps: Optional[float] = None):
    """spec §2. Returns (post_mix [T, n, 1] fp32, comb_mix [T, n, n] fp32, layer_input [T, hidden] bf16)."""
    n = _check_residual(residual)
    t = residual.shape[0]
    mixes = _normalized_mixes(residual, fn, rms_eps)
    scale, base = scale.to(torch.float32), base.to(torch.float32)
    pre = torch.sigmoid(mixes[:, 0:n] * scale[0] + base[0:n]) + pre_eps
    post = torch.sigmoid(mixes[:, n : 2 * n] * scale[1] + base[n : 2 * n]) * post_mult
    logits = (mixes[:, 2 * n :] * scale[2] + base[2 * n :]).reshape(t, n, n)
    comb = sinkhorn(logits, sinkhorn_eps, sinkhorn_iters)
    return post[:, :, None].contiguous(), comb, _collapse(residual, pre, norm_weight, norm_eps)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor):
    """spec §3: new_residual[:, j] = post_j * x + sum_i comb[i, j] * residual_i (fp32, one bf16 rounding)."""
    n = _check_residual(residual)
    t = residual.shape[0]
    post = post_mix.reshape(t, n).to(torch.float32)
    comb = comb_mix.to(torch.float32)
    mixed = torch.einsum("tij,tih->tjh", comb, residual.to(torch.float32))
    return (post[:, :, None] * x.to(torch.float32)[:, None, :] + mixed).to(torch.bfloat16)


def mhc_fused_post_pre(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor,
                       fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, rms_eps: float = 1e-6,
                       pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
                       sinkhorn_iters: int = 20, norm_weight: Optional[torch.Tensor] = None,
                       norm_eps: Optional[float] = None):
    """spec §4: post, then the next sub-layer's pre on the bf16 new residual. Returns (residual_cur,
    post_mix_cur, comb_mix_cur, layer_input_cur)."""
    new_residual = mhc_post(x, residual, post_mix, comb_mix)
    post, comb, layer_input = mhc_pre(new_residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                                      sinkhorn_iters, norm_weight, norm_eps)
    return new_residual, post, comb, layer_input


def hc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            rms_eps: float = 1e-6, eps: float = 1e-6):
    """spec §4: pre = sigmoid((rmsnorm(x) . fn^T) * scale + base) + eps over the flattened streams; returns
    sum_i pre_i * residual_i as bf16 [T, hidden]."""
    _check_residual(residual)
    mixes = _normalized_mixes(residual, fn, rms_eps)
    pre = torch.sigmoid(mixes * scale.to(torch.float32)[0] + base.to(torch.float32)) + eps
    return _collapse(residual, pre, None, None)
