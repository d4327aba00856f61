// dsv4::fp8_encode: fp32/bf16 -> FP8 e4m3 bytes in the requested encoding, clamped to +-quant_max.
// Uses the chip's conversion instruction where it has one for the encoding (dsv4/fp8.h).
#include "dsv4/bf16.h"
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

// 8 elements per thread per step: one 16-byte (bf16) or two 16-byte (fp32) loads, one 8-byte store;
// the n % 8 tail goes element by element.
constexpr int kVector = 8;

template <Fp8Format F, FloatKind In>
__global__ void fp8_encode_vector_kernel(const void* __restrict__ x, uint8_t* __restrict__ out, int64_t n,
                                         float quant_max) {
  const int64_t groups = n / kVector;
  for (int64_t g = global_thread_index(); g < groups; g += global_thread_count()) {
    float values[kVector];
    if constexpr (In == FloatKind::kBFloat16) {
      unpack_bf16x8(reinterpret_cast<const uint4*>(x)[g], values);
    } else {
      const float4 a = reinterpret_cast<const float4*>(x)[2 * g];
      const float4 b = reinterpret_cast<const float4*>(x)[2 * g + 1];
      values[0] = a.x, values[1] = a.y, values[2] = a.z, values[3] = a.w;
      values[4] = b.x, values[5] = b.y, values[6] = b.z, values[7] = b.w;
    }
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      packed[j / 4] |= static_cast<uint32_t>(fp8_encode_clamped<F>(values[j], quant_max)) << (8 * (j % 4));
    }
    reinterpret_cast<uint2*>(out)[g] = make_uint2(packed[0], packed[1]);
  }
  for (int64_t i = groups * kVector + global_thread_index(); i < n; i += global_thread_count()) {
    out[i] = fp8_encode_clamped<F>(load_float(x, In, i), quant_max);
  }
}

template <Fp8Format F, FloatKind In>
void launch_typed(const void* x, uint8_t* out, int64_t n, float quant_max, hipStream_t stream) {
  const dim3 block(kElementwiseThreads);
  if (is_aligned(x, 16) && is_aligned(out, 8)) {
    const int64_t work = n / kVector > 0 ? n / kVector : 1;
    hipLaunchKernelGGL((fp8_encode_vector_kernel<F, In>), dim3(elementwise_blocks(work)), block, 0, stream, x, out, n,
                       quant_max);
  } else {
    hipLaunchKernelGGL((fp8_encode_kernel<F, In>), dim3(elementwise_blocks(n)), block, 0, stream, x, out, n, quant_max);
  }
}

}  // namespace

LaunchStatus launch_fp8_encode(const void* x, FloatKind x_kind, uint8_t* out, int64_t n, Fp8Format format,
                               float quant_max, void* stream) {
  if (n < 0) return LaunchStatus::kInvalidArgument;
  if (n == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    if (x_kind == FloatKind::kBFloat16) {
      launch_typed<kFormat, FloatKind::kBFloat16>(x, out, n, quant_max, hip_stream);
    } else {
      launch_typed<kFormat, FloatKind::kFloat32>(x, out, n, quant_max, hip_stream);
    }
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
