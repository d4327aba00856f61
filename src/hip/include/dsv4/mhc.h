// mHC numerics shared by the CPU and GPU paths (spec/mhc.md §2-§4): the per-token epilogue that turns the
// raw dot products of the flattened streams with fn into pre/post weights and the Sinkhorn-normalized
// comb matrix. Torch-free, host and device.
#pragma once

#include <cmath>

#include "dsv4/platform.h"

namespace dsv4::mhc {

inline constexpr int kHcMult = 4;
inline constexpr int kPreMixes = (2 + kHcMult) * kHcMult;  // 24: 4 pre, 4 post, 16 comb
inline constexpr int kHeadMixes = kHcMult;                  // 4

// The hyper-parameters of one pre (or head) call.
struct PreConfig {
  float rms_eps;
  float pre_eps;  // added to each pre weight (the head's eps)
  float sinkhorn_eps;
  float post_mult;
  int sinkhorn_iters;
};

DSV4_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// 1 / RMS of the flattened row from its sum of squares over `count` values.
DSV4_HD float rms_factor(float sum_of_squares, int64_t count, float eps) {
  return 1.0f / sqrtf(sum_of_squares / static_cast<float>(count) + eps);
}

// 1 / x rounded to nearest: the value of the division, through the cheaper reciprocal instruction on
// CUDA devices (the Sinkhorn steps are a serial chain of them).
DSV4_HD float reciprocal(float x) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(x);
#else
  return 1.0f / x;
#endif
}

// The sum of a row or column of 4: pairwise, so that 4 GPU lanes holding one value each reach the same
// rounding with two butterfly steps (xor 1 then xor 2 of the lane index) as one thread does here.
DSV4_HD float sum4(float a, float b, float c, float d) { return (a + b) + (c + d); }

// Per-value formulas of spec §2 steps 2-4 (x = dot * r).
DSV4_HD float pre_weight(float dot, float r, const float* scale, float base, const PreConfig& config) {
  return sigmoid(dot * r * scale[0] + base) + config.pre_eps;
}
DSV4_HD float post_weight(float dot, float r, const float* scale, float base, const PreConfig& config) {
  return sigmoid(dot * r * scale[1] + base) * config.post_mult;
}
DSV4_HD float comb_logit(float dot, float r, const float* scale, float base) { return dot * r * scale[2] + base; }

// One Sinkhorn normalization: every column (kColumns) or every row of the row-major 4x4 c divided by its
// sum + eps, as a product with the reciprocal (within an fp32 rounding of the reference's division). The
// indices are compile-time constants once unrolled, so a GPU thread keeps c in registers.
template <bool kColumns>
DSV4_HD void sinkhorn_normalize(float* c, float eps) {
DSV4_UNROLL
  for (int a = 0; a < kHcMult; ++a) {
    const float sum = kColumns ? sum4(c[a], c[kHcMult + a], c[2 * kHcMult + a], c[3 * kHcMult + a])
                               : sum4(c[a * kHcMult], c[a * kHcMult + 1], c[a * kHcMult + 2], c[a * kHcMult + 3]);
    const float inverse = reciprocal(sum + eps);
DSV4_UNROLL
    for (int b = 0; b < kHcMult; ++b) {
      float& v = kColumns ? c[b * kHcMult + a] : c[a * kHcMult + b];
      v = v * inverse;
    }
  }
}

// Row-major 4x4 logits (row j, column k) -> comb: softmax over k plus eps, a column normalization, then
// (iters - 1) pairs of row and column normalizations. (The GPU kernels run the same steps on 16 lanes,
// one value each.)
DSV4_HD void sinkhorn(const float* logits, float eps, int iters, float* c) {
DSV4_UNROLL
  for (int j = 0; j < kHcMult; ++j) {
    const float* row = logits + j * kHcMult;
    const float row_max = fmaxf(fmaxf(row[0], row[1]), fmaxf(row[2], row[3]));
    float e[kHcMult];
DSV4_UNROLL
    for (int k = 0; k < kHcMult; ++k) e[k] = expf(row[k] - row_max);
    const float inverse = reciprocal(sum4(e[0], e[1], e[2], e[3]));
DSV4_UNROLL
    for (int k = 0; k < kHcMult; ++k) c[j * kHcMult + k] = e[k] * inverse + eps;
  }
  sinkhorn_normalize<true>(c, eps);
  for (int pair = 1; pair < iters; ++pair) {
    sinkhorn_normalize<false>(c, eps);
    sinkhorn_normalize<true>(c, eps);
  }
}

// spec §3 for one value of a destination stream j: post_j * x + sum_i comb[i][j] * stream_i in fp32, in this
// order; comb_column[i] = comb[i][j] (the source stream indexes comb's rows).
DSV4_HD float post_value(float post_j, float x, const float* comb_column, const float* streams) {
  float value = post_j * x;
DSV4_UNROLL
  for (int i = 0; i < kHcMult; ++i) value += comb_column[i] * streams[i];
  return value;
}

// spec §2 steps 1-5 from dots[24] = x . fn^T and the sum of squares of x (count = 4 * hidden values):
// pre[4], post[4] and comb[16].
DSV4_HD void pre_epilogue(const float* dots, float sum_of_squares, int64_t count, const float* scale,
                          const float* base, const PreConfig& config, float* pre, float* post, float* comb) {
  const float r = rms_factor(sum_of_squares, count, config.rms_eps);
DSV4_UNROLL
  for (int i = 0; i < kHcMult; ++i) {
    pre[i] = pre_weight(dots[i], r, scale, base[i], config);
    post[i] = post_weight(dots[kHcMult + i], r, scale, base[kHcMult + i], config);
  }
  float logits[kHcMult * kHcMult];
DSV4_UNROLL
  for (int e = 0; e < kHcMult * kHcMult; ++e) logits[e] = comb_logit(dots[2 * kHcMult + e], r, scale, base[2 * kHcMult + e]);
  sinkhorn(logits, config.sinkhorn_eps, config.sinkhorn_iters, comb);
}

// spec §4 hc_head: pre[4] from dots[4] = x . hc_head_fn^T.
DSV4_HD void head_epilogue(const float* dots, float sum_of_squares, int64_t count, const float* scale,
                           const float* base, const PreConfig& config, float* pre) {
  const float r = rms_factor(sum_of_squares, count, config.rms_eps);
  for (int i = 0; i < kHcMult; ++i) pre[i] = pre_weight(dots[i], r, scale, base[i], config);
}

}  // namespace dsv4::mhc
