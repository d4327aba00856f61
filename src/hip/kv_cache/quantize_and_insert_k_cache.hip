// dsv4::quantize_and_insert_k_cache: bf16 K rows into fp8_ds_mla records (spec/kv_cache.md §9.1, §8).
// 64 threads per token, 8 dims each: threads 0..55 hold the NoPE dims (8 per 64-dim quant block, whose
// amax is a butterfly over those 8 lanes), threads 56..63 copy the bf16 RoPE tail. 16-byte loads and
// 8/16-byte stores; the bindings require 16-byte aligned rows and blocks.
#include "dsv4/bf16.h"
#include "dsv4/launch.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreadsPerToken = 64;
constexpr int kDimsPerThread = 8;
constexpr int kNopeThreads = ds_mla::kNopeDim / kDimsPerThread;  // 56
constexpr int kTokensPerBlock = kElementwiseThreads / kThreadsPerToken;
constexpr int kLanesPerQuantBlock = ds_mla::kQuantBlock / kDimsPerThread;  // 8

template <Fp8Format F>
__global__ void __launch_bounds__(kElementwiseThreads) quantize_and_insert_kernel(KvInsertArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int lane = threadIdx.x % kThreadsPerToken;
  // All 64 threads of a token take the same path, so the 8-lane butterflies below stay complete.
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + threadIdx.x / kThreadsPerToken;
       token < args.tokens; token += static_cast<int64_t>(gridDim.x) * kTokensPerBlock) {
    const int64_t slot = args.slot_mapping[token];
    if (slot < 0 || slot >= args.cache.capacity()) continue;
    const uint4 raw = *reinterpret_cast<const uint4*>(args.k + token * args.k_row_stride + lane * kDimsPerThread);
    float values[kDimsPerThread];
    unpack_bf16x8(raw, values);
    float amax = 0.0f;  // fmaxf ignores NaN lanes
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) amax = fmaxf(amax, fabsf(values[j]));
#pragma unroll
    for (int mask = 1; mask < kLanesPerQuantBlock; mask <<= 1) {
      amax = fmaxf(amax, shuffle_xor(amax, mask, kLanesPerQuantBlock));
    }
    const ds_mla::RecordAddress address =
        ds_mla::record_address(slot, args.cache.block_size, args.cache.block_stride);
    uint8_t* data = args.cache.bytes + address.data;
    if (lane < kNopeThreads) {
      const uint8_t scale_byte = ue8m0_encode_rceil(amax, args.quant_max, ds_mla::kAmaxFloor);
      const float inverse_scale = ds_mla::ue8m0_inverse_scale(scale_byte);
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) {
        packed[j / 4] |= static_cast<uint32_t>(ds_mla::quantize_nope_value<F>(values[j], inverse_scale, args.quant_max))
                         << (8 * (j % 4));
      }
      *reinterpret_cast<uint2*>(data + lane * kDimsPerThread) = make_uint2(packed[0], packed[1]);
      if (lane % kLanesPerQuantBlock == 0) args.cache.bytes[address.scale + lane / kLanesPerQuantBlock] = scale_byte;
    } else {
      *reinterpret_cast<uint4*>(data + ds_mla::kNopeDim + (lane - kNopeThreads) * 16) = raw;
      if (lane == kNopeThreads) args.cache.bytes[address.scale + ds_mla::kNumQuantBlocks] = 0;  // pad byte
    }
  }
}

}  // namespace

LaunchStatus launch_quantize_and_insert_k_cache(const KvInsertArgs& args, void* stream) {
  if (args.tokens < 0 || args.cache.block_size <= 0) return LaunchStatus::kInvalidArgument;
  if (args.tokens == 0) return LaunchStatus::kOk;
  const int64_t blocks = (args.tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxElementwiseBlocks ? blocks : kMaxElementwiseBlocks));
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    launch_overlapping(quantize_and_insert_kernel<kFormat>, grid, dim3(kElementwiseThreads), 0, hip_stream, args);
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
