#include "ds_mla_cache.h"

#include <limits>

namespace dsv4::bindings {

DsMlaCache checked_cache(const Tensor& cache, int64_t block_size, const char* op, const char* arg,
                         const char* block_size_arg) {
  check_dtype(cache, op, arg, {ScalarType::Byte});
  STD_TORCH_CHECK(cache.dim() >= 2, op, ": ", arg, " must have at least 2 dims [num_blocks, ...], got shape ",
                  shape_string(cache));
  STD_TORCH_CHECK(block_size > 0 && block_size <= std::numeric_limits<int32_t>::max(), op, ": ", block_size_arg,
                  " must be in [1, 2^31 - 1], got ", block_size);
  STD_TORCH_CHECK(!(cache.dim() == 3 && cache.size(2) == ds_mla::kRecordBytes) || cache.size(1) == block_size, op,
                  ": ", arg, " is a [num_blocks, ", cache.size(1), ", 584] view but ", block_size_arg, " is ",
                  block_size);
  int64_t block_bytes = 1;
  for (int64_t d = cache.dim() - 1; d >= 1; --d) {
    STD_TORCH_CHECK(cache.size(d) == 1 || cache.stride(d) == block_bytes, op, ": ", arg,
                    " must be contiguous after dim 0 (one block's bytes in a row), got shape ", shape_string(cache));
    block_bytes *= cache.size(d);
  }
  STD_TORCH_CHECK(block_bytes >= block_size * ds_mla::kRecordBytes, op, ": ", arg, " blocks of ", block_bytes,
                  " bytes cannot hold ", block_size_arg, "=", block_size, " records of ", ds_mla::kRecordBytes,
                  " bytes");
  STD_TORCH_CHECK(cache.size(0) <= 1 || cache.stride(0) >= block_bytes, op, ": ", arg, " blocks overlap (stride(0)=",
                  cache.stride(0), " < ", block_bytes, " bytes per block)");
  constexpr int64_t kVectorBytes = 16;
  STD_TORCH_CHECK(is_aligned(cache.data_ptr(), kVectorBytes) && cache.stride(0) % kVectorBytes == 0, op, ": ", arg,
                  " must start 16-byte aligned with a block stride that is a multiple of 16 bytes (stride(0)=",
                  cache.stride(0), ")");
  return DsMlaCache{static_cast<uint8_t*>(cache.data_ptr()), cache.size(0), cache.stride(0), block_size};
}

}  // namespace dsv4::bindings
