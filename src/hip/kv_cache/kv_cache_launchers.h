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
};

namespace gpu {
LaunchStatus launch_quantize_and_insert_k_cache(const KvInsertArgs& args, void* stream);
LaunchStatus launch_dequantize_and_gather_k_cache(const KvGatherArgs& args, void* stream);
}  // namespace gpu

}  // namespace dsv4
