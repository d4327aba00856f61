// dsv4::fp8_block_dequantize: FP8 bytes (either encoding) times per-block UE8M0 or fp32 scales -> bf16/fp32.
// One thread block per flat row (grid-stride over rows); threads stride over the row's columns. Rows
// whose length is a multiple of 16 on 16-byte aligned buffers take the vector path; anything else goes
// element by element. Both use the shared numerics.
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kVector = 16;

template <Fp8Format F, ScaleKind S, FloatKind O>
__global__ void fp8_block_dequantize_rows(const uint8_t* __restrict__ x, const void* __restrict__ scale,
                                          void* __restrict__ out, BlockScaleGeometry geometry) {
  const int32_t cols = static_cast<int32_t>(geometry.cols);
  const int32_t block_cols = static_cast<int32_t>(geometry.block_cols);
  for (int64_t row = blockIdx.x; row < geometry.flat_rows(); row += gridDim.x) {
    const int64_t scale_offset = geometry.scale_row_offset(row);
    for (int32_t col = threadIdx.x; col < cols; col += blockDim.x) {
      const int64_t index = row * geometry.cols + col;
      const float block_scale = load_block_scale(scale, S, scale_offset + col / block_cols);
      store_float(out, O, index, dequantize_value<F>(x[index], block_scale));
    }
  }
}

// 16 FP8 bytes per thread per step (one 16-byte load; 32 or 64 bytes stored). The 256 decoded values
// of the format sit in shared memory, filled from the same fp8_decode the CPU path uses.
template <Fp8Format F, ScaleKind S, FloatKind O>
__global__ void __launch_bounds__(kElementwiseThreads)
    fp8_block_dequantize_rows_vector(const uint8_t* __restrict__ x, const void* __restrict__ scale,
                                     void* __restrict__ out, BlockScaleGeometry geometry) {
  __shared__ float decoded[256];
  for (int code = threadIdx.x; code < 256; code += blockDim.x) decoded[code] = fp8_decode<F>(static_cast<uint8_t>(code));
  __syncthreads();
  const int32_t vectors_per_row = static_cast<int32_t>(geometry.cols / kVector);
  const int32_t block_cols = static_cast<int32_t>(geometry.block_cols);
  const bool one_scale_per_vector = block_cols % kVector == 0;
  for (int64_t row = blockIdx.x; row < geometry.flat_rows(); row += gridDim.x) {
    const int64_t scale_offset = geometry.scale_row_offset(row);
    const int64_t first_vector = row * vectors_per_row;
    for (int32_t v = threadIdx.x; v < vectors_per_row; v += blockDim.x) {
      const int32_t col = v * kVector;
      const uint4 packed = reinterpret_cast<const uint4*>(x)[first_vector + v];
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float values[kVector];
      if (one_scale_per_vector) {
        const float block_scale = load_block_scale(scale, S, scale_offset + col / block_cols);
#pragma unroll
        for (int j = 0; j < kVector; ++j) values[j] = decoded[(words[j / 4] >> (8 * (j % 4))) & 0xffu] * block_scale;
      } else {
#pragma unroll
        for (int j = 0; j < kVector; ++j) {
          const float block_scale = load_block_scale(scale, S, scale_offset + (col + j) / block_cols);
          values[j] = decoded[(words[j / 4] >> (8 * (j % 4))) & 0xffu] * block_scale;
        }
      }
      if constexpr (O == FloatKind::kBFloat16) {
        uint4* out4 = reinterpret_cast<uint4*>(out) + 2 * (first_vector + v);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t lanes[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            lanes[j] = float_to_bf16_bits(values[8 * half + 2 * j]) |
                       (static_cast<uint32_t>(float_to_bf16_bits(values[8 * half + 2 * j + 1])) << 16);
          }
          out4[half] = make_uint4(lanes[0], lanes[1], lanes[2], lanes[3]);
        }
      } else {
        float4* out4 = reinterpret_cast<float4*>(out) + 4 * (first_vector + v);
#pragma unroll
        for (int q = 0; q < 4; ++q) out4[q] = make_float4(values[4 * q], values[4 * q + 1], values[4 * q + 2], values[4 * q + 3]);
      }
    }
  }
}

template <Fp8Format F, ScaleKind S, FloatKind O>
void launch_typed(const uint8_t* x, const void* scale, void* out, const BlockScaleGeometry& geometry,
                  hipStream_t stream) {
  int64_t blocks = geometry.flat_rows();
  if (blocks > kMaxElementwiseBlocks) blocks = kMaxElementwiseBlocks;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(kElementwiseThreads);
  if (geometry.cols % kVector == 0 && is_aligned(x, 16) && is_aligned(out, 16)) {
    hipLaunchKernelGGL((fp8_block_dequantize_rows_vector<F, S, O>), grid, block, 0, stream, x, scale, out, geometry);
  } else {
    hipLaunchKernelGGL((fp8_block_dequantize_rows<F, S, O>), grid, block, 0, stream, x, scale, out, geometry);
  }
}

}  // namespace

LaunchStatus launch_fp8_block_dequantize(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out,
                                         FloatKind out_kind, const BlockScaleGeometry& geometry, Fp8Format format,
                                         void* stream) {
  if (geometry.batches < 0 || geometry.rows < 0 || geometry.cols < 0 || geometry.cols > INT32_MAX ||
      geometry.block_rows <= 0 || geometry.block_cols <= 0 || geometry.block_cols > INT32_MAX) {
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
