// Raw-pointer launchers of the fp8_ds_mla cache utilities (GPU builds). Torch-free, free of GPU runtime
// headers; `stream` is the hipStream_t / cudaStream_t. The bindings validate every argument first.
#pragma once

#include "dsv4/ds_mla.h"
#include "dsv4/platform.h"

namespace dsv4 {

// The cache: `num_blocks` blocks of `block_size` records, `block_stride` bytes apart (>= block_size*584).
struct DsMlaCache {
  uint8_t* bytes;
  int64_t num_blocks;
  int64_t block_stride;
  int64_t block_size;

  DSV4_HD int64_t capacity() const { return num_blocks * block_size; }
};

// quantize_and_insert_k_cache: k bf16 [tokens, 512] (rows `k_row_stride` elements apart) into the
// records at slot_mapping[t]; negative slots and slots >= capacity are skipped.
struct KvInsertArgs {
  const uint16_t* k;
  int64_t k_row_stride;
  const int64_t* slot_mapping;
  int64_t tokens;
  DsMlaCache cache;
  Fp8Format format;
  float quant_max;
};

// dequantize_and_gather_k_cache: request r's last g tokens (g = gather_lens[r], or seq_lens[r] without
// gather_lens, clamped to [0, seq_len] and to the rows left after `offset`) into out[r, offset + i].
// Logical blocks past the table or with ids outside [0, num_blocks) give zero rows.
struct KvGatherArgs {
  uint16_t* out;  // bf16 [requests, out_rows, 512], last dim contiguous
  int64_t out_request_stride;
  int64_t out_row_stride;
  int64_t out_rows;
  const uint8_t* cache;
  int64_t num_blocks;
  int64_t block_stride;
  int64_t block_size;
  const int32_t* seq_lens;
  const int32_t* gather_lens;  // may be null
  const int32_t* block_table;
  int64_t table_row_stride;
  int64_t table_cols;
  int64_t requests;
  int64_t offset;
  Fp8Format format;

  DSV4_HD int64_t seq_len(int64_t request) const { return seq_lens[request] > 0 ? seq_lens[request] : 0; }

  // How many rows request r gathers: its gather length clamped to [0, seq_len] and to the rows left.
  DSV4_HD int64_t rows_to_gather(int64_t request) const {
    const int64_t length = seq_len(request);
    int64_t count = gather_lens != nullptr ? gather_lens[request] : length;
    count = count < 0 ? 0 : (count > length ? length : count);
    return count < out_rows - offset ? count : out_rows - offset;
  }

  // Where logical position `logical` of request r lives: its physical block (-1 when the table has no
  // such column or names a block outside the cache) and its position within that block.
  struct Location {
    int64_t block;
    int64_t position;
  };
  DSV4_HD Location locate(int64_t request, int64_t logical) const {
    const IndexSplit split = divide_index(logical, block_size);
    const int64_t column = split.quotient;
    const int64_t block = column < table_cols ? block_table[request * table_row_stride + column] : int64_t{-1};
    return {block >= 0 && block < num_blocks ? block : -1, split.remainder};
  }
};

// Where the fused ops store the rotated KV row.
enum class KvRowStore : int32_t {
  kDsMlaRecord = 0,  // rounded to bf16, then a UE8M0 FP8 record in `cache` (spec/kv_cache.md §3.3)
  kBf16Row = 1,      // rounded to bf16 into `rows` (§4.2)
  kFp8Row = 2,       // fp8(clamp(v * (1 / *kv_scale))) from fp32 into `rows` (§4.3)
};

// A plain cache of 512-wide rows, [num_blocks, block_size, 512] of bf16 or FP8 (strides in bytes).
struct PlainKvCache {
  uint8_t* bytes;
  int64_t num_blocks;
  int64_t block_size;
  int64_t block_stride;
  int64_t row_stride;

  DSV4_HD int64_t capacity() const { return num_blocks * block_size; }
  DSV4_HD uint8_t* row(int64_t slot) const {
    const IndexSplit split = divide_index(slot, block_size);
    return bytes + split.quotient * block_stride + split.remainder * row_stride;
  }
};

// The fused Q/KV op family (spec/kv_cache.md §3, §5, §6). For every token, each of the `heads` Q heads
// gets the weightless RMSNorm (if apply_q_norm) and GPT-J RoPE in fp32, then is rounded once: to bf16
// into q_out (heads up to padded_heads written as +0), or, when q_fp8 is set, to
// fp8(clamp(q * *q_scale_inverse)) there. The first insert_tokens tokens also get their KV row
// (optionally RMS-normalized with kv_norm_weight and rounded to bf16 first) rotated and stored as
// kv_store says, at slot_mapping[t]; negative or out-of-cache slots are skipped. A token whose position
// lies outside [0, positions) gets an all-zero Q row and no KV write. heads = padded_heads = 0 is the
// KV-only form.
struct QnormRopeKvInsertArgs {
  const uint16_t* q_in;  // bf16 [tokens, heads, 512], contiguous
  uint16_t* q_out;       // bf16 [tokens, padded_heads, 512], contiguous (may be q_in when padded_heads == heads)
  uint8_t* q_fp8;        // FP8 [tokens, heads, 512], contiguous, or null (then q_out is used)
  const float* q_scale_inverse;  // 1 element, read on the device; with q_fp8 only
  const uint16_t* kv;            // bf16 [tokens, 512], rows kv_row_stride elements apart, 16-byte aligned
  int64_t kv_row_stride;
  const uint16_t* kv_norm_weight;  // bf16 [512] or null: no KV norm (GPU: with kDsMlaRecord only)
  const int64_t* slot_mapping;
  int64_t insert_tokens;
  const int64_t* position_ids;
  const float* cos_sin;  // fp32 [positions, 64]: cos || sin
  int64_t positions;
  int64_t tokens;
  int64_t heads;
  int64_t padded_heads;
  float eps;  // of the Q norm, and of the KV norm in the KV-only form
  bool apply_q_norm;
  KvRowStore kv_store;
  DsMlaCache cache;   // kDsMlaRecord
  PlainKvCache rows;  // kBf16Row, kFp8Row
  const float* kv_scale;  // 1 element, read on the device; kFp8Row only
  Fp8Format format;
  float quant_max;

  DSV4_HD int64_t kv_capacity() const {
    return kv_store == KvRowStore::kDsMlaRecord ? cache.capacity() : rows.capacity();
  }
};

namespace gpu {
LaunchStatus launch_qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, void* stream);
LaunchStatus launch_quantize_and_insert_k_cache(const KvInsertArgs& args, void* stream);
LaunchStatus launch_dequantize_and_gather_k_cache(const KvGatherArgs& args, void* stream);
}  // namespace gpu

}  // namespace dsv4
