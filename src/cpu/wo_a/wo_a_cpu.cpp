#include "wo_a_cpu.h"

#include <array>
#include <cmath>
#include <vector>

#include "dsv4/bf16.h"
#include "dsv4/ds_mla.h"
#include "dsv4/rope.h"
#include "dsv4/ue8m0.h"
#include "dsv4/wo_a.h"
#include "cpu/fp8/fp8_decode_table.h"

namespace dsv4::cpu {
namespace {

constexpr int kHeadDim = 512;
constexpr int kRopeDim = 64;
constexpr int kNopeDim = kHeadDim - kRopeDim;
constexpr int kScaleBlock = 128;
constexpr float kGroupAmaxFloor = 1e-8f;

// One token's heads into fp32, the rope lanes of every head rotated back when `rotate`.
void token_values(const uint16_t* o, int64_t heads, const RopeTable& rope, int64_t token, bool rotate,
                  float* values) {
  const int64_t count = heads * kHeadDim;
  for (int64_t i = 0; i < count; ++i) values[i] = bf16_bits_to_float(o[token * count + i]);
  if (!rotate) return;
  const int64_t row = rope.row_of(token);
  for (int64_t h = 0; h < heads; ++h) {
    float* head = values + h * kHeadDim + kNopeDim;
    for (int pair = 0; pair < kRopeDim / 2; ++pair) {
      rope_unrotate_pair(head[2 * pair], head[2 * pair + 1], rope.value(row, pair), rope.value(row, kRopeDim / 2 + pair));
    }
  }
}

template <Fp8Format F>
void quantize_token(const InverseRopeGroupQuantArgs& args, int64_t token, const float* values) {
  const int64_t d = args.heads * kHeadDim / args.groups;
  for (int64_t g = 0; g < args.groups; ++g) {
    for (int64_t k = 0; k < d / args.group_size; ++k) {
      const float* x = values + g * d + k * args.group_size;
      float amax = 0.0f;  // std::fmax ignores NaN
      for (int64_t i = 0; i < args.group_size; ++i) amax = std::fmax(amax, std::fabs(x[i]));
      const uint8_t byte = ue8m0_encode_rceil(amax, args.quant_max, kGroupAmaxFloor);
      const float inverse = ds_mla::ue8m0_inverse_scale(byte);
      uint8_t* out = args.x_fp8 + (token * args.groups + g) * d + k * args.group_size;
      for (int64_t i = 0; i < args.group_size; ++i) out[i] = fp8_encode_clamped<F>(x[i] * inverse, args.quant_max);
      args.x_scale[token * args.scale_token_stride + g * args.scale_group_stride + k * args.scale_block_stride] = byte;
    }
  }
}

}  // namespace

void inverse_rope_group_quant(const InverseRopeGroupQuantArgs& args, int64_t begin, int64_t end) {
  std::vector<float> values(static_cast<size_t>(args.heads * kHeadDim));
  with_fp8_format(args.format, [&](auto tag) {
    constexpr Fp8Format kFormat = decltype(tag)::value;
    for (int64_t token = begin; token < end; ++token) {
      token_values(args.o, args.heads, args.rope, token, args.apply_inverse_rope, values.data());
      quantize_token<kFormat>(args, token, values.data());
    }
  });
}

void inverse_rope(const InverseRopeArgs& args, int64_t begin, int64_t end) {
  const int64_t count = args.heads * kHeadDim;
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t token = begin; token < end; ++token) {
    token_values(args.o, args.heads, args.rope, token, true, values.data());
    for (int64_t i = 0; i < count; ++i) args.out[token * count + i] = wo_a::rope_output_bits(values[i]);
  }
}

void bmm_a8w8_mxscale(const BmmA8W8MxScaleArgs& args, int64_t begin, int64_t end) {
  const std::array<float, 256> x_table = fp8_decode_table(args.x_format);
  const std::array<float, 256> w_table = fp8_decode_table(args.w_format);
  const int64_t k_blocks = args.k / kScaleBlock;
  std::vector<float> x_row(static_cast<size_t>(args.k));
  for (int64_t m = begin; m < end; ++m) {
    for (int64_t g = 0; g < args.groups; ++g) {
      const uint8_t* x = args.x + m * args.x_stride_m + g * args.x_stride_g;
      for (int64_t k = 0; k < args.k; ++k) x_row[k] = x_table[x[k]];
      const uint8_t* x_scale = args.x_scale + m * args.x_scale_stride_m + g * args.x_scale_stride_g;
      for (int64_t n = 0; n < args.n; ++n) {
        const uint8_t* w = args.w + g * args.w_stride_g + n * args.w_stride_n;
        const uint8_t* w_scale = args.w_scale + g * args.w_scale_stride_g + (n / kScaleBlock) * args.w_scale_stride_nb;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          float partial = 0.0f;
          for (int64_t k = kb * kScaleBlock; k < (kb + 1) * kScaleBlock; ++k) partial += x_row[k] * w_table[w[k]];
          // One power of two 2^(a + b - 254) (spec §4.5): exact unless the product itself leaves fp32; a
          // 255 (NaN) scale byte makes the block NaN.
          const int a = x_scale[kb];
          const int b = w_scale[kb];
          acc += (a == 255 || b == 255) ? NAN : std::ldexp(partial, a + b - 254);
        }
        if (args.out_fp32) {
          static_cast<float*>(args.out)[m * args.out_stride_m + g * args.out_stride_g + n] = acc;
        } else {
          static_cast<uint16_t*>(args.out)[m * args.out_stride_m + g * args.out_stride_g + n] = float_to_bf16_bits(acc);
        }
      }
    }
  }
}

}  // namespace dsv4::cpu
