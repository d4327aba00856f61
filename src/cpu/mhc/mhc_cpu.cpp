#include "mhc_cpu.h"

#include <vector>

#include "dsv4/bf16.h"

namespace dsv4::cpu {
namespace {

constexpr int kLanes = 8;  // independent partial sums: accuracy and vectorization

float lane_sum(const float* lanes) {
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

}  // namespace

void mhc_pre(const MhcPreArgs& args, int64_t begin, int64_t end) {
  const int64_t count = mhc::kHcMult * args.hidden;
  std::vector<float> row(static_cast<size_t>(count));
  std::vector<float> collapsed(static_cast<size_t>(args.hidden));
  for (int64_t t = begin; t < end; ++t) {
    const uint16_t* residual = args.residual + t * count;
    for (int64_t k = 0; k < count; ++k) row[k] = bf16_bits_to_float(residual[k]);
    float dots[mhc::kPreMixes];
    // count is a multiple of kLanes (the bindings require hidden % 64 == 0): blocked loops vectorize.
    float squares[kLanes] = {};
    for (int64_t k = 0; k < count; k += kLanes) {
      for (int l = 0; l < kLanes; ++l) squares[l] += row[k + l] * row[k + l];
    }
    for (int m = 0; m < args.mixes; ++m) {
      const float* fn = args.fn + m * count;
      float lanes[kLanes] = {};
      for (int64_t k = 0; k < count; k += kLanes) {
        for (int l = 0; l < kLanes; ++l) lanes[l] += row[k + l] * fn[k + l];
      }
      dots[m] = lane_sum(lanes);
    }
    float pre[mhc::kHcMult];
    if (args.mixes == mhc::kPreMixes) {
      float post[mhc::kHcMult];
      mhc::pre_epilogue(dots, lane_sum(squares), count, args.scale, args.base, args.config, pre, post,
                        args.comb_mix + t * mhc::kHcMult * mhc::kHcMult);
      for (int i = 0; i < mhc::kHcMult; ++i) args.post_mix[t * mhc::kHcMult + i] = post[i];
    } else {
      mhc::head_epilogue(dots, lane_sum(squares), count, args.scale, args.base, args.config, pre);
    }
    float out_squares = 0.0f;
    for (int64_t h = 0; h < args.hidden; ++h) {
      float v = 0.0f;
      for (int i = 0; i < mhc::kHcMult; ++i) v += pre[i] * row[i * args.hidden + h];
      collapsed[h] = v;
      out_squares += v * v;
    }
    const float norm = args.norm_weight != nullptr ? mhc::rms_factor(out_squares, args.hidden, args.norm_eps) : 1.0f;
    uint16_t* out = args.out + t * args.hidden;
    for (int64_t h = 0; h < args.hidden; ++h) {
      const float v = args.norm_weight != nullptr ? collapsed[h] * norm * bf16_bits_to_float(args.norm_weight[h])
                                                  : collapsed[h];
      out[h] = float_to_bf16_bits(v);
    }
  }
}

void mhc_post(const MhcPostArgs& args, int64_t begin, int64_t end) {
  constexpr int kStreams = mhc::kHcMult;
  for (int64_t t = begin; t < end; ++t) {
    const float* post = args.post_mix + t * kStreams;
    const float* comb = args.comb_mix + t * kStreams * kStreams;
    float comb_columns[kStreams][kStreams];
    for (int i = 0; i < kStreams; ++i) {
      for (int j = 0; j < kStreams; ++j) comb_columns[j][i] = comb[i * kStreams + j];
    }
    const uint16_t* x = args.x + t * args.hidden;
    const uint16_t* residual = args.residual + t * kStreams * args.hidden;
    uint16_t* out = args.out + t * kStreams * args.hidden;
    for (int64_t h = 0; h < args.hidden; ++h) {
      float streams[kStreams];
      for (int i = 0; i < kStreams; ++i) streams[i] = bf16_bits_to_float(residual[i * args.hidden + h]);
      const float xv = bf16_bits_to_float(x[h]);
      for (int j = 0; j < kStreams; ++j) {
        out[j * args.hidden + h] = float_to_bf16_bits(mhc::post_value(post[j], xv, comb_columns[j], streams));
      }
    }
  }
}

}  // namespace dsv4::cpu
