#include "sparse_mla_cpu.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "dsv4/bf16.h"
#include "dsv4/ds_mla.h"
#include "dsv4/ue8m0.h"

namespace dsv4::cpu {
namespace {

constexpr int kHeadDim = ds_mla::kHeadDim;

// Record `slot` of `source` -> 512 fp32 values, every non-finite value (scale byte 255, a NaN or Inf RoPE
// value, an overflowing scale) replaced by 0.
template <Fp8Format F>
void decode_key(const SparseKeySource& source, int64_t slot, float* key) {
  const ds_mla::RecordAddress address = ds_mla::record_address(slot, source.block_size, source.block_stride);
  uint16_t bits[kHeadDim];
  ds_mla::decode_record<F>(source.bytes + address.data, source.bytes + address.scale, bits);
  for (int i = 0; i < kHeadDim; ++i) {
    const float value = bf16_bits_to_float(bits[i]);
    key[i] = std::isfinite(value) ? value : 0.0f;
  }
}

void append_keys(const SparseKeySource& source, int64_t token, std::vector<float>& keys, int64_t& count) {
  if (source.bytes == nullptr) return;
  with_fp8_format(source.format, [&](auto tag) {
    constexpr Fp8Format kFormat = decltype(tag)::value;
    for (int64_t i = source.row_begin(token); i < source.row_end(token); ++i) {
      const int64_t slot = source.indices[i];
      if (slot < 0 || slot >= source.capacity()) continue;  // skipped, never read
      keys.resize(static_cast<size_t>((count + 1) * kHeadDim));
      decode_key<kFormat>(source, slot, keys.data() + count * kHeadDim);
      ++count;
    }
  });
}

}  // namespace

void sparse_mla_decode(const SparseMlaDecodeArgs& args, int64_t begin, int64_t end) {
  std::vector<float> keys;
  std::vector<float> scores;
  std::vector<float> acc(static_cast<size_t>(args.num_splits) * kHeadDim);
  std::vector<float> split_max(static_cast<size_t>(args.num_splits));
  std::vector<float> split_sum(static_cast<size_t>(args.num_splits));
  float q[kHeadDim];
  float out[kHeadDim];
  for (int64_t t = begin; t < end; ++t) {
    int64_t count = 0;
    append_keys(args.main, t, keys, count);
    append_keys(args.extra, t, keys, count);
    scores.resize(static_cast<size_t>(count));
    for (int64_t h = 0; h < args.heads; ++h) {
      const uint16_t* q_row = args.q + t * args.q_token_stride + h * args.q_head_stride;
      for (int i = 0; i < kHeadDim; ++i) q[i] = bf16_bits_to_float(q_row[i]);
      for (int64_t n = 0; n < count; ++n) {
        float dot = 0.0f;
        for (int i = 0; i < kHeadDim; ++i) dot += q[i] * keys[n * kHeadDim + i];
        scores[n] = args.scale * dot;
      }
      // Partials per slice: (m, l, acc). An empty slice keeps m = -FLT_MAX, l = 0.
      for (int s = 0; s < args.num_splits; ++s) {
        const int64_t first = count * s / args.num_splits;
        const int64_t last = count * (s + 1) / args.num_splits;
        float m = -FLT_MAX;
        for (int64_t n = first; n < last; ++n) m = std::fmax(m, scores[n]);
        float l = 0.0f;
        float* a = acc.data() + s * kHeadDim;
        std::fill(a, a + kHeadDim, 0.0f);
        for (int64_t n = first; n < last; ++n) {
          const float p = std::exp(scores[n] - m);
          l += p;
          for (int i = 0; i < kHeadDim; ++i) a[i] += p * keys[n * kHeadDim + i];
        }
        split_max[s] = m;
        split_sum[s] = l;
      }
      // Reduce with the sink: it enlarges the denominator only. A NaN sink counts as no sink; a +inf sink
      // takes all the weight (zeros, through the denominator check below).
      const float sink = head_sink(args, h);
      float m_all = sink;
      for (int s = 0; s < args.num_splits; ++s) m_all = std::fmax(m_all, split_max[s]);
      float denominator = std::exp(sink - m_all);
      std::fill(out, out + kHeadDim, 0.0f);
      for (int s = 0; s < args.num_splits; ++s) {
        const float weight = std::exp(split_max[s] - m_all);
        denominator += weight * split_sum[s];
        for (int i = 0; i < kHeadDim; ++i) out[i] += weight * acc[s * kHeadDim + i];
      }
      const bool empty = count == 0 || reduced_row_is_empty(denominator, sink);
      for (int i = 0; i < kHeadDim; ++i) out[i] = empty ? 0.0f : out[i] / denominator;
      if (args.inverse_rope) {
        const int64_t row = args.rope.row_of(t);
        for (int pair = 0; pair < ds_mla::kRopeDim / 2; ++pair) {
          rope_unrotate_pair(out[ds_mla::kNopeDim + 2 * pair], out[ds_mla::kNopeDim + 2 * pair + 1],
                             args.rope.value(row, pair), args.rope.value(row, ds_mla::kRopeDim / 2 + pair));
        }
      }
      uint16_t* out_row = args.out + t * args.out_token_stride + h * args.out_head_stride;
      for (int i = 0; i < kHeadDim; ++i) out_row[i] = float_to_bf16_bits(out[i]);
    }
  }
}

}  // namespace dsv4::cpu
