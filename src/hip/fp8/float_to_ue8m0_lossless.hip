// dsv4::float_to_ue8m0_lossless: fp32 scales -> UE8M0 bytes plus a per-element refusal code
// (dsv4::Ue8m0Refusal). Only exact powers of two 2^-127 .. 2^127 convert; nothing is rounded.
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

__global__ void float_to_ue8m0_lossless_kernel(const float* __restrict__ scale, uint8_t* __restrict__ bytes,
                                               uint8_t* __restrict__ refusal, int64_t n) {
  for (int64_t i = global_thread_index(); i < n; i += global_thread_count()) {
    uint8_t byte;
    refusal[i] = static_cast<uint8_t>(ue8m0_from_float_exact(scale[i], &byte));
    bytes[i] = byte;
  }
}

}  // namespace

LaunchStatus launch_float_to_ue8m0_lossless(const float* scale, uint8_t* bytes, uint8_t* refusal, int64_t n,
                                            void* stream) {
  if (n < 0) return LaunchStatus::kInvalidArgument;
  if (n == 0) return LaunchStatus::kOk;
  hipLaunchKernelGGL(float_to_ue8m0_lossless_kernel, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0,
                     static_cast<hipStream_t>(stream), scale, bytes, refusal, n);
  return last_launch_status();
}

}  // namespace dsv4::gpu
