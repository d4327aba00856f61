// dsv4::ue8m0_to_float: UE8M0 bytes -> fp32 (2^(u-127); byte 0 is 2^-127, byte 255 NaN).
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

__global__ void ue8m0_to_float_kernel(const uint8_t* __restrict__ scale, float* __restrict__ out, int64_t n) {
  for (int64_t i = global_thread_index(); i < n; i += global_thread_count()) out[i] = ue8m0_decode(scale[i]);
}

}  // namespace

LaunchStatus launch_ue8m0_to_float(const uint8_t* scale, float* out, int64_t n, void* stream) {
  if (n < 0) return LaunchStatus::kInvalidArgument;
  if (n == 0) return LaunchStatus::kOk;
  hipLaunchKernelGGL(ue8m0_to_float_kernel, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0,
                     static_cast<hipStream_t>(stream), scale, out, n);
  return last_launch_status();
}

}  // namespace dsv4::gpu
