// GPT-J (interleaved pairs) rotary embedding on the last 64 of 512 dims, in fp32 (spec/kv_cache.md
// Conventions). Pair p is dims (448+2p, 449+2p); c = cos_sin[pos][p], s = cos_sin[pos][32+p].
// Torch-free, host and device.
#pragma once

#include <cmath>

#include "dsv4/bf16.h"
#include "dsv4/platform.h"

namespace dsv4 {

// a*b + c*d with each product and the sum rounded on their own, never fused into an FMA: every target
// then rounds exactly like the reference's separate tensor ops, so rotated values are bit-identical.
DSV4_HD float sum_of_products(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), __fmul_rn(c, d));
#else
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const float ab = a * b;
  const float cd = c * d;
  return ab + cd;
#endif
}

// Forward rotation: e' = e*c - o*s, o' = e*s + o*c.
DSV4_HD void rope_rotate_pair(float& even, float& odd, float c, float s) {
  const float e = even;
  const float o = odd;
  even = sum_of_products(e, c, -o, s);
  odd = sum_of_products(e, s, o, c);
}

// Inverse rotation: a' = a*c + b*s, b' = b*c - a*s.
DSV4_HD void rope_unrotate_pair(float& even, float& odd, float c, float s) {
  const float a = even;
  const float b = odd;
  even = sum_of_products(a, c, b, s);
  odd = sum_of_products(b, c, -a, s);
}

// 1 / sqrt(mean of squares + eps) for an RMSNorm over n values, from their fp32 sum of squares. Correctly
// rounded sqrt and division on every target (no rsqrt approximation), so CPU and GPU differ only by
// the order of the sum.
DSV4_HD float rms_inverse(float sum_of_squares, int n, float eps) {
  return 1.0f / sqrtf(sum_of_squares / static_cast<float>(n) + eps);
}

// A rotary table [rows, 64] (cos || sin, fp32 or bf16) and the positions that index it, clamped to
// [0, rows - 1] (never faulted).
struct RopeTable {
  const void* cos_sin;
  bool bf16;
  int64_t rows;
  const void* positions;  // int32 or int64
  bool positions_int64;

  DSV4_HD int64_t row_of(int64_t token) const {
    const int64_t p = positions_int64 ? static_cast<const int64_t*>(positions)[token]
                                      : static_cast<const int32_t*>(positions)[token];
    return p < 0 ? 0 : (p >= rows ? rows - 1 : p);
  }
  // Column c of row r, widened to fp32 (c < 32: cos, else sin).
  DSV4_HD float value(int64_t row, int column) const {
    const int64_t index = row * 64 + column;
    return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(cos_sin)[index])
                : static_cast<const float*>(cos_sin)[index];
  }
};

}  // namespace dsv4
