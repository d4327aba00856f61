// Arguments of the wo_a ops (spec/wo_a.md): inverse RoPE, inverse RoPE + UE8M0 group quantization, and
// the grouped FP8 GEMM with 1x128 / 128x128 UE8M0 block scales. Torch-free; the bindings validate every
// field first. CPU kernels: src/cpu/wo_a; GPU kernels: wo_a_quant.hip, bmm_a8w8_mxscale.hip (wo_a_launchers.h).
#pragma once

#include "dsv4/fp8.h"
#include "dsv4/platform.h"
#include "dsv4/rope.h"

namespace dsv4 {

// o bf16 [tokens, heads, 512] contiguous -> x_fp8 [tokens, groups, D] (D = heads * 512 / groups,
// contiguous) and x_scale bytes [tokens, groups, D / group_size] at the given strides (spec §3.6: the "row"
// layout honours any strides).
struct InverseRopeGroupQuantArgs {
  const uint16_t* o;
  RopeTable rope;
  bool apply_inverse_rope;  // o still carries the rotation: undo it on lanes 448..511 of every head
  uint8_t* x_fp8;
  uint8_t* x_scale;
  int64_t scale_token_stride;
  int64_t scale_group_stride;
  int64_t scale_block_stride;  // between the scale bytes of one (token, group)
  int64_t tokens;
  int64_t heads;
  int64_t groups;
  int64_t group_size;
  Fp8Format format;
  float quant_max;
};

// o bf16 [tokens, heads, 512] contiguous -> out bf16, the rope lanes rotated back (fp32, one rounding).
struct InverseRopeArgs {
  const uint16_t* o;
  RopeTable rope;
  uint16_t* out;
  int64_t tokens;
  int64_t heads;
};

// Y[m, g, n] = sum_kb 2^(x_scale[m, g, kb] - 127) * 2^(w_scale[g, n / 128, kb] - 127) * sum_{k in kb} x * w
// with fp32 accumulation. K is contiguous in every operand; the other dims take the given strides
// (elements for x, w and out; bytes for the scales).
struct BmmA8W8MxScaleArgs {
  const uint8_t* x;  // [m, groups, k]
  int64_t x_stride_m;
  int64_t x_stride_g;
  Fp8Format x_format;
  const uint8_t* w;  // [groups, n, k]
  int64_t w_stride_g;
  int64_t w_stride_n;
  Fp8Format w_format;
  const uint8_t* x_scale;  // [m, groups, k / 128]
  int64_t x_scale_stride_m;
  int64_t x_scale_stride_g;
  const uint8_t* w_scale;  // [groups, n / 128, k / 128]
  int64_t w_scale_stride_g;
  int64_t w_scale_stride_nb;
  void* out;  // [m, groups, n], bf16 or fp32
  bool out_fp32;
  int64_t out_stride_m;
  int64_t out_stride_g;
  int64_t m;
  int64_t groups;
  int64_t n;
  int64_t k;
  // The caller accepts 128-deep block sums in the matrix unit's own precision where that is below fp32
  // (sm_90's FP8 wgmma: about 14 significant bits, aligned to the block's largest product), for its
  // speed. Every block is still folded into an fp32 sum. Devices without such a mode ignore it.
  bool reduced_precision_block_sums;
};

}  // namespace dsv4
