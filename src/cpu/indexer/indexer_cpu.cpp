#include "indexer_cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/fp8/fp8_decode_table.h"

namespace dsv4::cpu {
namespace {

// The indexer's read rule (indexer_fp8_value: 0x80 reads as +0) as a table.
std::array<float, 256> indexer_table(Fp8Format format) {
  return decode_table(format, [](auto tag, uint8_t code) { return indexer_fp8_value<decltype(tag)::value>(code); });
}

int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// sum_h weights[h] * ReLU(scale * (q_h . k)), q decoded [heads, dim], k decoded [dim].
float weighted_relu_sum(const float* q, const float* k, const float* weights, float scale, int64_t heads,
                        int64_t dim) {
  float logit = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    float dot = 0.0f;
    for (int64_t d = 0; d < dim; ++d) dot += q[h * dim + d] * k[d];
    const float s = dot * scale;
    logit += weights[h] * (s > 0.0f ? s : 0.0f);
  }
  return logit;
}

}  // namespace

void fp8_mqa_logits(const MqaLogitsArgs& args, int64_t begin, int64_t end) {
  const std::array<float, 256> q_table = indexer_table(args.q_format);
  const std::array<float, 256> k_table = indexer_table(args.k_format);
  std::vector<float> q(static_cast<size_t>(args.heads * args.dim));
  std::vector<float> k(static_cast<size_t>(args.dim));
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = begin; i < end; ++i) {
    const int64_t start = clamp(args.ks[i], 0, args.n);
    const int64_t stop = clamp(args.ke[i], start, args.n);
    float* row = args.logits + i * args.logits_row_stride;
    if (args.clean) {
      for (int64_t j = 0; j < start; ++j) row[j] = kMinusInf;
      for (int64_t j = stop; j < args.n; ++j) row[j] = kMinusInf;
    }
    if (stop == start) continue;
    for (int64_t h = 0; h < args.heads; ++h) {
      const uint8_t* codes = args.q + i * args.q_row_stride + h * args.q_head_stride;
      for (int64_t d = 0; d < args.dim; ++d) q[h * args.dim + d] = q_table[codes[d]];
    }
    for (int64_t j = start; j < stop; ++j) {
      const uint8_t* codes = args.k + j * args.k_row_stride;
      for (int64_t d = 0; d < args.dim; ++d) k[d] = k_table[codes[d]];
      row[j] = weighted_relu_sum(q.data(), k.data(), args.weights + i * args.heads, args.k_scale[j], args.heads,
                                 args.dim);
    }
  }
}

void fp8_paged_mqa_logits(const PagedMqaLogitsArgs& args, int64_t begin, int64_t end) {
  const std::array<float, 256> q_table = indexer_table(args.q_format);
  const std::array<float, 256> kv_table = indexer_table(args.kv_format);
  std::vector<float> q(static_cast<size_t>(args.heads * args.dim));
  std::vector<float> k(static_cast<size_t>(args.dim));
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = begin; r < end; ++r) {
    const int64_t length = args.row_length(r);
    const int64_t b = r / args.next_n;
    float* row = args.logits + r * args.logits_row_stride;
    if (args.clean) {
      for (int64_t t = length; t < args.max_model_len; ++t) row[t] = kMinusInf;
    }
    const uint8_t* q_codes = args.q + r * args.heads * args.dim;
    for (int64_t i = 0; i < args.heads * args.dim; ++i) q[i] = q_table[q_codes[i]];
    for (int64_t t = 0; t < length; ++t) {
      const int64_t column = t / args.block_size;
      const int64_t block = column < args.table_cols ? args.block_tables[b * args.table_row_stride + column] : -1;
      if (block < 0 || block >= args.num_blocks) {  // never read
        row[t] = kMinusInf;
        continue;
      }
      const int64_t entry = t - column * args.block_size;
      const uint8_t* base = args.cache + block * args.block_stride;
      const uint8_t* codes = base + entry * args.dim;
      for (int64_t d = 0; d < args.dim; ++d) k[d] = kv_table[codes[d]];
      float scale;
      std::memcpy(&scale, base + args.block_size * args.dim + entry * 4, sizeof(scale));
      row[t] = weighted_relu_sum(q.data(), k.data(), args.weights + r * args.heads, scale, args.heads, args.dim);
    }
  }
}

void topk_per_row(const TopkPerRowArgs& args, int64_t begin, int64_t end) {
  std::vector<std::pair<float, int64_t>> candidates;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t start = clamp(args.starts != nullptr ? args.starts[r] : 0, 0, args.cols);
    const int64_t stop = clamp(args.ends[r], start, args.cols);
    const float* row = args.logits + r * args.row_stride;
    candidates.clear();
    for (int64_t j = start; j < stop; ++j) {
      const float v = row[j];
      if (v == v && v > -std::numeric_limits<float>::infinity()) candidates.emplace_back(v, j - start);
    }
    // Descending value, then ascending index: the smaller index wins ties.
    const auto better = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    const int64_t chosen = std::min<int64_t>(args.k, static_cast<int64_t>(candidates.size()));
    std::partial_sort(candidates.begin(), candidates.begin() + chosen, candidates.end(), better);
    if (args.stable) {
      std::sort(candidates.begin(), candidates.begin() + chosen,
                [](const auto& a, const auto& b) { return a.second < b.second; });
    }
    int32_t* out = args.out + r * args.k;
    for (int64_t i = 0; i < args.k; ++i) out[i] = i < chosen ? static_cast<int32_t>(candidates[i].second) : -1;
  }
}

}  // namespace dsv4::cpu
