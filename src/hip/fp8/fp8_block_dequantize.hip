// dsv4::fp8_block_dequantize: FP8 bytes (either encoding) times per-block UE8M0 or fp32 scales -> bf16/fp32.
// Rows whose length is a multiple of 8 take a vector path (8 bytes in, one 16- or 32-byte store out);
// anything else takes the per-element path. Both call the shared per-element numerics.
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kVector = 8;

template <Fp8Format F, ScaleKind S, FloatKind O>
__global__ void fp8_block_dequantize_elementwise(const uint8_t* __restrict__ x, const void* __restrict__ scale,
                                                 void* __restrict__ out, BlockScaleGeometry geometry) {
  const int64_t n = geometry.numel();
  for (int64_t i = global_thread_index(); i < n; i += global_thread_count()) {
    dequantize_element<F>(x, scale, S, out, O, geometry, i);
  }
}

template <Fp8Format F, ScaleKind S, FloatKind O>
__global__ void fp8_block_dequantize_vector(const uint8_t* __restrict__ x, const void* __restrict__ scale,
                                            void* __restrict__ out, BlockScaleGeometry geometry) {
  const int64_t groups = geometry.numel() / kVector;
  for (int64_t group = global_thread_index(); group < groups; group += global_thread_count()) {
    const int64_t first = group * kVector;
    const uint2 packed = reinterpret_cast<const uint2*>(x)[group];
    const uint32_t words[2] = {packed.x, packed.y};
    // cols % 8 == 0, so the 8 elements share a row.
    const int64_t col = first % geometry.cols;
    const int64_t batch_row = first / geometry.cols;
    const int64_t row = batch_row % geometry.rows;
    const int64_t batch = batch_row / geometry.rows;
    const int64_t scale_row = (batch * geometry.scale_rows + row / geometry.block_rows) * geometry.scale_cols;
    float values[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      const uint8_t code = static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
      values[j] = fp8_decode<F>(code) * load_block_scale(scale, S, scale_row + (col + j) / geometry.block_cols);
    }
    if constexpr (O == FloatKind::kBFloat16) {
      uint4 packed_out;
      uint32_t* lanes = reinterpret_cast<uint32_t*>(&packed_out);
#pragma unroll
      for (int j = 0; j < kVector / 2; ++j) {
        lanes[j] = static_cast<uint32_t>(float_to_bf16_bits(values[2 * j])) |
                   (static_cast<uint32_t>(float_to_bf16_bits(values[2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(out)[group] = packed_out;
    } else {
      float4* out4 = reinterpret_cast<float4*>(out) + 2 * group;
      out4[0] = make_float4(values[0], values[1], values[2], values[3]);
      out4[1] = make_float4(values[4], values[5], values[6], values[7]);
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <Fp8Format F, ScaleKind S, FloatKind O>
void launch_typed(const uint8_t* x, const void* scale, void* out, const BlockScaleGeometry& geometry,
                  hipStream_t stream) {
  const int64_t n = geometry.numel();
  if (geometry.cols % kVector == 0 && aligned(x, 8) && aligned(out, 16)) {
    hipLaunchKernelGGL((fp8_block_dequantize_vector<F, S, O>), dim3(elementwise_blocks(n / kVector)),
                       dim3(kElementwiseThreads), 0, stream, x, scale, out, geometry);
  } else {
    hipLaunchKernelGGL((fp8_block_dequantize_elementwise<F, S, O>), dim3(elementwise_blocks(n)),
                       dim3(kElementwiseThreads), 0, stream, x, scale, out, geometry);
  }
}

}  // namespace

LaunchStatus launch_fp8_block_dequantize(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out,
                                         FloatKind out_kind, const BlockScaleGeometry& geometry, Fp8Format format,
                                         void* stream) {
  if (geometry.batches < 0 || geometry.rows < 0 || geometry.cols < 0 || geometry.block_rows <= 0 ||
      geometry.block_cols <= 0) {
    return LaunchStatus::kInvalidArgument;
  }
  if (geometry.numel() == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    if (scale_kind == ScaleKind::kUe8m0) {
      if (out_kind == FloatKind::kBFloat16) {
        launch_typed<kFormat, ScaleKind::kUe8m0, FloatKind::kBFloat16>(x, scale, out, geometry, hip_stream);
      } else {
        launch_typed<kFormat, ScaleKind::kUe8m0, FloatKind::kFloat32>(x, scale, out, geometry, hip_stream);
      }
    } else {
      if (out_kind == FloatKind::kBFloat16) {
        launch_typed<kFormat, ScaleKind::kFloat32, FloatKind::kBFloat16>(x, scale, out, geometry, hip_stream);
      } else {
        launch_typed<kFormat, ScaleKind::kFloat32, FloatKind::kFloat32>(x, scale, out, geometry, hip_stream);
      }
    }
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
