// dsv4::dequantize_and_gather_k_cache: fp8_ds_mla records back to bf16 rows (spec/kv_cache.md §9.2).
// 32 threads per gathered token, 16 dims each (8 in each half of the row): NoPE bytes decoded with their
// block's scale, the bf16 RoPE tail copied. Block ids are checked against the table and the cache.
#include "dsv4/launch.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreadsPerToken = 32;
constexpr int kPieceDims = 8;
constexpr int kHalfDims = ds_mla::kHeadDim / 2;                               // 256
constexpr int kFirstRopeLane = (ds_mla::kNopeDim - kHalfDims) / kPieceDims;  // 24
constexpr int kTokensPerBlock = kElementwiseThreads / kThreadsPerToken;
constexpr int64_t kMaxGridRequests = 65535;
constexpr int64_t kMaxGridTokenBlocks = 8192;

template <Fp8Format F>
DSV4_DEVICE uint4 decode_fp8x8(uint2 codes, float block_scale) {
  const uint32_t words[2] = {codes.x, codes.y};
  uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint8_t lo = static_cast<uint8_t>(words[j / 2] >> (16 * (j % 2)));
    const uint8_t hi = static_cast<uint8_t>(words[j / 2] >> (16 * (j % 2) + 8));
    pairs[j] = float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(lo, block_scale)) |
               (static_cast<uint32_t>(float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(hi, block_scale))) << 16);
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

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
      uint16_t* out = args.out + request * args.out_request_stride + (args.offset + i) * args.out_row_stride;
      if (block < 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<uint4*>(out + h * kHalfDims + lane * kPieceDims) = make_uint4(0, 0, 0, 0);
        }
        continue;
      }
      const ds_mla::RecordAddress address =
          ds_mla::record_address(block * args.block_size + logical % args.block_size, args.block_size,
                                 args.block_stride);
      const uint8_t* data = args.cache + address.data;
      const uint8_t* scales = args.cache + address.scale;
      // Lane l: dims [8l, 8l+8) and [256+8l, 256+8l+8); lanes 24..31 of the second piece copy the bf16
      // RoPE tail. Every load and store of the group covers one contiguous span.
      const uint2 low_codes = *reinterpret_cast<const uint2*>(data + lane * kPieceDims);
      const uint8_t low_scale = scales[lane * kPieceDims / ds_mla::kQuantBlock];
      uint4 high;
      if (lane < kFirstRopeLane) {
        const uint2 high_codes = *reinterpret_cast<const uint2*>(data + kHalfDims + lane * kPieceDims);
        const uint8_t high_scale = scales[(kHalfDims + lane * kPieceDims) / ds_mla::kQuantBlock];
        high = decode_fp8x8<F>(high_codes, ue8m0_decode(high_scale));
      } else {
        high = *reinterpret_cast<const uint4*>(data + ds_mla::kNopeDim + (lane - kFirstRopeLane) * 2 * kPieceDims);
      }
      *reinterpret_cast<uint4*>(out + lane * kPieceDims) = decode_fp8x8<F>(low_codes, ue8m0_decode(low_scale));
      *reinterpret_cast<uint4*>(out + kHalfDims + lane * kPieceDims) = high;
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
