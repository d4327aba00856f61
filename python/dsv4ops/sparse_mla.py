"""Sparse MLA decode over the fp8_ds_mla caches (spec/sparse_mla_decode.md): the public wrapper over
torch.ops.dsv4.sparse_mla_decode (CPU kernel; GPU split-K kernel on the matrix units) with reference
fallback.

The SWA ("main") cache is in the platform's encoding by default (FNUZ on gfx942, OCP elsewhere); the
compressed ("extra") cache is OCP on every platform. Each cache must be read with its writer's encoding:
the wrong flag scales every key by about 2 without any error.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from .platform import Fp8Format, fp8_format as device_fp8_format
from .reference import sparse_mla as reference

DEFAULT_SCALE = 512 ** -0.5


def sparse_mla_decode(q: torch.Tensor, main_cache: torch.Tensor, main_indices: torch.Tensor,
                      main_indptr: torch.Tensor, main_block_size: int = 64, extra_cache: Optional[torch.Tensor] = None,
                      extra_indices: Optional[torch.Tensor] = None, extra_indptr: Optional[torch.Tensor] = None,
                      extra_block_size: int = 64, attn_sink: Optional[torch.Tensor] = None,
                      scale: float = DEFAULT_SCALE, main_format=None, extra_format="ocp", num_splits: int = 0,
                      cos_sin: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q bf16 [T, H, 512] attends, per row and head, over the valid global slots main_indices[main_indptr[t]:
    main_indptr[t+1]] of main_cache and those of extra_cache (int32 ragged lists, both ends of a row clamped to
    [0, nnz] and an end below its start an empty row; negative or out-of-cache slots skipped), V = K, with the
    per-head sink logit attn_sink [>= H] enlarging the softmax denominator only (a NaN sink counts as none, a
    +inf sink gives zeros); rows without keys give zeros; non-finite key values read as 0. With cos_sin [P, 64]
    and positions, dims 448..511 of the output are rotated back (the fused inverse-RoPE epilogue). num_splits
    (0: automatic) cuts each row's keys into slices reduced at the end. Writes and returns out (bf16 [T, H, 512])."""
    main_fmt = Fp8Format.parse(main_format) if main_format is not None else device_fp8_format(main_cache.device)
    extra_fmt = Fp8Format.parse(extra_format)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 with q's shape {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
    if dispatch.choose("sparse_mla_decode", q.device).uses_kernel:
        torch.ops.dsv4.sparse_mla_decode(q, main_cache, main_indices, main_indptr, int(main_block_size), extra_cache,
                                         extra_indices, extra_indptr, int(extra_block_size), attn_sink, float(scale),
                                         int(main_fmt), int(extra_fmt), int(num_splits), cos_sin, positions, out=out)
        return out
    out.copy_(reference.sparse_mla_decode(q, main_cache, main_indices, main_indptr, int(main_block_size), extra_cache,
                                          extra_indices, extra_indptr, int(extra_block_size), attn_sink, float(scale),
                                          main_fmt, extra_fmt, cos_sin, positions))
    return out
