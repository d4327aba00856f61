// Raw-pointer launchers of the mHC ops (GPU builds). Torch-free, free of GPU runtime headers; `stream` is
// the hipStream_t / cudaStream_t. The bindings validate every argument first.
#pragma once

#include "dsv4/mhc.h"
#include "dsv4/platform.h"

namespace dsv4 {

// mhc_pre (mixes = 24) and hc_head (mixes = 4): per token, the dot products of the flattened bf16 streams
// with fn, the epilogue of dsv4/mhc.h, and layer_input = sum_i pre_i * residual_i (then, with
// norm_weight, a weighted RMSNorm) rounded once to bf16.
struct MhcPreArgs {
  const uint16_t* residual;     // bf16 [tokens, 4, hidden], contiguous
  const float* fn;              // fp32 [mixes, 4 * hidden], contiguous
  const float* scale;           // fp32 [3] (pre) or [1] (head)
  const float* base;            // fp32 [mixes]
  const uint16_t* norm_weight;  // bf16 [hidden] or null
  float norm_eps;
  float* post_mix;    // fp32 [tokens, 4] (pre only)
  float* comb_mix;    // fp32 [tokens, 4, 4] (pre only)
  uint16_t* out;      // bf16 [tokens, hidden]
  float* partials;    // GPU only: workspace of mhc_pre_workspace_floats() floats, 16-byte aligned: the
                      // partial sums, the pre weights and (for many tokens) fn split into bf16 planes
  int k_splits;       // GPU only: how many slices of 4 * hidden the dot products are split into
  int64_t tokens;
  int64_t hidden;
  int mixes;
  mhc::PreConfig config;
};

// mhc_post: new[t, j] = post[t, j] * x[t] + sum_i comb[t, i, j] * residual[t, i] in fp32, rounded to bf16.
struct MhcPostArgs {
  const uint16_t* x;         // bf16 [tokens, hidden], contiguous
  const uint16_t* residual;  // bf16 [tokens, 4, hidden], contiguous
  const float* post_mix;     // fp32 [tokens, 4]
  const float* comb_mix;     // fp32 [tokens, 4, 4]
  uint16_t* out;             // bf16 [tokens, 4, hidden]
  int64_t tokens;
  int64_t hidden;
};

namespace gpu {
// The k split the pre kernels use for `tokens` and `mixes`, and the workspace they need (the bindings size
// it).
int mhc_pre_k_splits(int64_t tokens, int64_t hidden, int mixes);
int64_t mhc_pre_workspace_floats(int64_t tokens, int64_t hidden, int mixes);
LaunchStatus launch_mhc_pre(const MhcPreArgs& args, void* stream);
LaunchStatus launch_mhc_post(const MhcPostArgs& args, void* stream);
// post, then pre on its output (pre.residual must be post.out, pre.mixes 24). AMD: post made inside pre's
// dot-product kernel (post.out bit for bit as launch_mhc_post writes it; pre's fp32 sums in another order).
// NVIDIA: the two, the kernels chained so that each may start while the one before finishes.
LaunchStatus launch_mhc_fused_post_pre(const MhcPostArgs& post, const MhcPreArgs& pre, void* stream);

}  // namespace gpu

}  // namespace dsv4
