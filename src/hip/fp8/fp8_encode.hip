// dsv4::fp8_encode: fp32/bf16 -> FP8 e4m3 bytes in the requested encoding, clamped to +-quant_max.
// Uses the chip's conversion instruction where it has one for the encoding (dsv4/fp8.h).
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

template <Fp8Format F, FloatKind In>
__global__ void fp8_encode_kernel(const void* __restrict__ x, uint8_t* __restrict__ out, int64_t n, float quant_max) {
  for (int64_t i = global_thread_index(); i < n; i += global_thread_count()) {
    out[i] = fp8_encode_clamped<F>(load_float(x, In, i), quant_max);
  }
}

}  // namespace

LaunchStatus launch_fp8_encode(const void* x, FloatKind x_kind, uint8_t* out, int64_t n, Fp8Format format,
                               float quant_max, void* stream) {
  if (n < 0) return LaunchStatus::kInvalidArgument;
  if (n == 0) return LaunchStatus::kOk;
  const dim3 grid(elementwise_blocks(n));
  const dim3 block(kElementwiseThreads);
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    if (x_kind == FloatKind::kBFloat16) {
      hipLaunchKernelGGL((fp8_encode_kernel<kFormat, FloatKind::kBFloat16>), grid, block, 0, hip_stream, x, out, n,
                         quant_max);
    } else {
      hipLaunchKernelGGL((fp8_encode_kernel<kFormat, FloatKind::kFloat32>), grid, block, 0, hip_stream, x, out, n,
                         quant_max);
    }
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
