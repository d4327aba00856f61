// The fp8_ds_mla cache check shared by the ops that write and read it (spec/kv_cache.md §4.1).
#pragma once

#include "common.h"
#include "kv_cache/kv_cache_launchers.h"

namespace dsv4::bindings {

// A uint8 fp8_ds_mla cache: dims after the first are contiguous (one block's bytes), each block holds
// block_size records, blocks are 16-byte aligned. Only size(0) and stride(0) are used afterwards.
// block_size_arg: the op's name for the block size (block_size, cache_block_size, main_block_size, ...).
DsMlaCache checked_cache(const Tensor& cache, int64_t block_size, const char* op, const char* arg,
                         const char* block_size_arg);

}  // namespace dsv4::bindings
