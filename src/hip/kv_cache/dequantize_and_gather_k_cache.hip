// dsv4::dequantize_and_gather_k_cache: fp8_ds_mla records back to bf16 rows (spec/kv_cache.md §9.2).
// 64 threads per gathered token, 8 dims each: threads 0..55 decode NoPE bytes with their block's scale,
// threads 56..63 copy the bf16 RoPE tail. Block ids are checked against the table and the cache.
#include "dsv4/launch.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreadsPerToken = 64;
constexpr int kDimsPerThread = 8;
constexpr int kNopeThreads = ds_mla::kNopeDim / kDimsPerThread;  // 56
constexpr int kTokensPerBlock = kElementwiseThreads / kThreadsPerToken;
constexpr int64_t kMaxGridRequests = 65535;
constexpr int64_t kMaxGridTokenBlocks = 4096;

template <Fp8Format F>
__global__ void __launch_bounds__(kElementwiseThreads) dequantize_and_gather_kernel(KvGatherArgs args) {
  const int lane = threadIdx.x % kThreadsPerToken;
  for (int64_t request = blockIdx.y; request < args.requests; request += gridDim.y) {
    const int64_t seq_len = args.seq_len(request);
    const int64_t count = args.rows_to_gather(request);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + threadIdx.x / kThreadsPerToken; i < count;
         i += static_cast<int64_t>(gridDim.x) * kTokensPerBlock) {
      const int64_t logical = seq_len - count + i;
      const int64_t block = args.block_of(request, logical);
      uint4* out = reinterpret_cast<uint4*>(args.out + request * args.out_request_stride +
                                            (args.offset + i) * args.out_row_stride + lane * kDimsPerThread);
      if (block < 0) {
        *out = make_uint4(0, 0, 0, 0);
        continue;
      }
      const ds_mla::RecordAddress address =
          ds_mla::record_address(block * args.block_size + logical % args.block_size, args.block_size,
                                 args.block_stride);
      if (lane < kNopeThreads) {
        const uint2 codes = *reinterpret_cast<const uint2*>(args.cache + address.data + lane * kDimsPerThread);
        const float block_scale = ue8m0_decode(args.cache[address.scale + lane / 8]);
        const uint32_t words[2] = {codes.x, codes.y};
        uint32_t lanes[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint8_t lo = static_cast<uint8_t>(words[j / 2] >> (16 * (j % 2)));
          const uint8_t hi = static_cast<uint8_t>(words[j / 2] >> (16 * (j % 2) + 8));
          lanes[j] = float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(lo, block_scale)) |
                     (static_cast<uint32_t>(float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(hi, block_scale))) << 16);
        }
        *out = make_uint4(lanes[0], lanes[1], lanes[2], lanes[3]);
      } else {
        *out = *reinterpret_cast<const uint4*>(args.cache + address.data + ds_mla::kNopeDim + (lane - kNopeThreads) * 16);
      }
    }
  }
}

}  // namespace

LaunchStatus launch_dequantize_and_gather_k_cache(const KvGatherArgs& args, void* stream) {
  if (args.requests < 0 || args.block_size <= 0 || args.offset < 0 || args.offset > args.out_rows) {
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t rows = args.out_rows - args.offset;
  if (args.requests == 0 || rows == 0) return LaunchStatus::kOk;
  int64_t token_blocks = (rows + kTokensPerBlock - 1) / kTokensPerBlock;
  token_blocks = token_blocks < kMaxGridTokenBlocks ? token_blocks : kMaxGridTokenBlocks;
  const int64_t request_blocks = args.requests < kMaxGridRequests ? args.requests : kMaxGridRequests;
  const dim3 grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(request_blocks));
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    hipLaunchKernelGGL((dequantize_and_gather_kernel<kFormat>), grid, dim3(kElementwiseThreads), 0, hip_stream, args);
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
