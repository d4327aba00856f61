// Arguments of the lightning-indexer ops (spec/indexer.md): FP8 MQA logits (prefill, contiguous K), paged
// FP8 MQA logits (decode, block-flat cache, MTP rows) and per-row top-k. Torch-free; the bindings validate
// every field first. CPU kernels: src/cpu/indexer; GPU kernels: indexer_logits.hip, indexer_topk.hip.
#pragma once

#include "dsv4/fp8.h"
#include "dsv4/platform.h"

namespace dsv4 {

// An indexer operand byte: decoded in its encoding, except that 0x80 reads as +0 in both (spec §3.5).
template <Fp8Format F>
DSV4_HD float indexer_fp8_value(uint8_t code) {
  return code == 0x80u ? 0.0f : fp8_decode<F>(code);
}

struct MqaLogitsArgs {
  const uint8_t* q;  // [m, heads, dim], dim contiguous
  int64_t q_row_stride;
  int64_t q_head_stride;
  Fp8Format q_format;
  const uint8_t* k;  // [n, dim], dim contiguous
  int64_t k_row_stride;
  Fp8Format k_format;
  const float* k_scale;  // [n]
  const float* weights;  // [m, heads], contiguous
  const int32_t* ks;     // [m] inclusive window start, clamped to [0, n]
  const int32_t* ke;     // [m] exclusive window end, clamped to [0, n]
  float* logits;         // [m, n] at logits_row_stride
  int64_t logits_row_stride;
  int64_t m;
  int64_t n;
  int64_t heads;
  int64_t dim;
  bool clean;  // write -inf outside the window (else leave those columns untouched)
};

struct PagedMqaLogitsArgs {
  const uint8_t* q;  // [batch, next_n, heads, dim], contiguous
  Fp8Format q_format;
  const uint8_t* cache;  // block-flat: block_size * dim FP8 bytes, then block_size fp32 scales
  int64_t num_blocks;
  int64_t block_size;
  int64_t block_stride;  // bytes
  Fp8Format kv_format;
  const float* weights;        // [batch * next_n, heads], contiguous
  const int32_t* context_lens;  // [batch] (one length per request) or [batch, next_n] (per row)
  bool lens_per_row;
  const int32_t* block_tables;  // [batch, table_cols]
  int64_t table_row_stride;
  int64_t table_cols;
  float* logits;  // [batch * next_n, max_model_len]
  int64_t logits_row_stride;
  int64_t max_model_len;
  int64_t batch;
  int64_t next_n;
  int64_t heads;
  int64_t dim;
  bool clean;

  // Visible compressed length of row r = b * next_n + n, clamped to [0, max_model_len].
  DSV4_HD int64_t row_length(int64_t row) const {
    const int64_t b = row / next_n;
    const int64_t n = row - b * next_n;
    const int64_t length = lens_per_row ? context_lens[row] : context_lens[b] - next_n + n + 1;
    return length < 0 ? 0 : (length > max_model_len ? max_model_len : length);
  }
};

struct TopkPerRowArgs {
  const float* logits;  // [rows, cols] at row_stride
  int64_t row_stride;
  int64_t cols;
  const int32_t* starts;  // [rows] or null (0): the window [start, end) is clamped to [0, cols]
  const int32_t* ends;    // [rows]
  int32_t* out;           // [rows, k], contiguous: indices local to the start, -1 padded
  int64_t rows;
  int64_t k;
  bool stable;  // ties to the smaller index, indices sorted ascending
};

}  // namespace dsv4
