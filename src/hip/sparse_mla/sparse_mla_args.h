// Arguments of dsv4.sparse_mla_decode (spec/sparse_mla_decode.md). Torch-free; the bindings validate every
// field first. Shared by the CPU kernel and the GPU launchers (sparse_mla_launchers.h).
#pragma once

#include "dsv4/fp8.h"
#include "dsv4/platform.h"
#include "dsv4/rope.h"

namespace dsv4 {

// One fp8_ds_mla cache and the ragged global slot lists of every query row into it.
struct SparseKeySource {
  const uint8_t* bytes;  // null: no such cache
  int64_t num_blocks;
  int64_t block_size;
  int64_t block_stride;  // bytes
  const int32_t* indices;  // [index_count]
  int64_t index_count;
  const int32_t* indptr;  // [tokens + 1]; row t reads indices [indptr[t], indptr[t+1]) clamped to [0, index_count]
  Fp8Format format;

  DSV4_HD int64_t capacity() const { return num_blocks * block_size; }
  DSV4_HD int64_t row_begin(int64_t token) const { return clamp_index(indptr[token]); }
  DSV4_HD int64_t row_end(int64_t token) const {
    const int64_t end = clamp_index(indptr[token + 1]);
    return end < row_begin(token) ? row_begin(token) : end;
  }
  DSV4_HD int64_t clamp_index(int64_t i) const { return i < 0 ? 0 : (i > index_count ? index_count : i); }
};

struct SparseMlaDecodeArgs {
  const uint16_t* q;  // bf16 [tokens, heads, 512], last dim contiguous
  int64_t q_token_stride;
  int64_t q_head_stride;
  SparseKeySource main;
  SparseKeySource extra;
  const float* sink;  // [>= heads] or null (no sink)
  float scale;
  int num_splits;   // >= 1: the key list of each row is cut into this many contiguous slices
  bool inverse_rope;  // rotate dims 448..511 of the output back with `rope`
  RopeTable rope;
  uint16_t* out;  // bf16 [tokens, heads, 512], last dim contiguous
  int64_t out_token_stride;
  int64_t out_head_stride;
  int64_t tokens;
  int64_t heads;
  // GPU only: fp32 split partials, [tokens, num_splits, heads, 512] accumulators followed by
  // [tokens, num_splits, heads, 2] (m, l) pairs (the launcher's workspace; null on the CPU).
  float* partials;
};

// The sink rule of the op's reduce (spec §3), shared by the CPU kernel and every GPU epilogue.
// Head `head`'s sink logit: a NaN sink counts as no sink (-inf), and so do heads past the op's (the padding
// rows of a GPU block).
DSV4_HD float head_sink(const SparseMlaDecodeArgs& args, int64_t head) {
  const float sink = args.sink != nullptr && head < args.heads ? args.sink[head] : -INFINITY;
  return sink != sink ? -INFINITY : sink;
}

// Whether a reduced row is zeros: no weight at all (no keys, or none with a finite score), or a +inf sink
// taking all of it.
DSV4_HD bool reduced_row_is_empty(float denominator, float sink) {
  return !(denominator > 0.0f) || sink == INFINITY;
}

// One split's (m, l) folded with the sink: the row's output is weight * acc / denominator, zeros if empty.
struct SinkFold {
  float weight;
  float denominator;
  bool empty;
};
DSV4_HD SinkFold fold_sink(float sink, float m, float l) {
  const float row_max = fmaxf(sink, m);
  const float weight = expf(m - row_max);
  const float denominator = expf(sink - row_max) + weight * l;
  return {weight, denominator, reduced_row_is_empty(denominator, sink)};
}

}  // namespace dsv4
