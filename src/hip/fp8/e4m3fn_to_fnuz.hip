// dsv4::e4m3fn_to_fnuz: checkpoint normalization for gfx942. Weight bytes keep their bits (re-read as
// FNUZ they are worth half) except 0x80 -> 0x00 and OCP NaN -> FNUZ NaN; the block scale doubles.
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

// 16 weight bytes per thread per step where the buffers are 16-byte aligned; the rest byte by byte.
__global__ void e4m3fn_to_fnuz_kernel(const uint8_t* weight_in, uint8_t* weight_out, int64_t weight_numel,
                                      const void* scale_in, void* scale_out, ScaleKind scale_kind,
                                      int64_t scale_numel, bool vectorized) {
  int64_t done = 0;
  if (vectorized) {
    const int64_t vectors = weight_numel / 16;
    for (int64_t v = global_thread_index(); v < vectors; v += global_thread_count()) {
      uint4 packed = reinterpret_cast<const uint4*>(weight_in)[v];
      uint8_t* bytes = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int j = 0; j < 16; ++j) bytes[j] = ocp_byte_to_fnuz_byte(bytes[j]);
      reinterpret_cast<uint4*>(weight_out)[v] = packed;
    }
    done = vectors * 16;
  }
  for (int64_t i = done + global_thread_index(); i < weight_numel; i += global_thread_count()) {
    weight_out[i] = ocp_byte_to_fnuz_byte(weight_in[i]);
  }
  for (int64_t i = global_thread_index(); i < scale_numel; i += global_thread_count()) {
    double_block_scale(scale_in, scale_out, scale_kind, i);
  }
}

}  // namespace

LaunchStatus launch_e4m3fn_to_fnuz(const uint8_t* weight_in, uint8_t* weight_out, int64_t weight_numel,
                                   const void* scale_in, void* scale_out, ScaleKind scale_kind, int64_t scale_numel,
                                   void* stream) {
  if (weight_numel < 0 || scale_numel < 0) return LaunchStatus::kInvalidArgument;
  if (weight_numel == 0 && scale_numel == 0) return LaunchStatus::kOk;
  const bool vectorized = is_aligned(weight_in, 16) && is_aligned(weight_out, 16);
  const int64_t weight_work = vectorized ? (weight_numel + 15) / 16 : weight_numel;
  const int64_t work = weight_work > scale_numel ? weight_work : scale_numel;
  hipLaunchKernelGGL(e4m3fn_to_fnuz_kernel, dim3(elementwise_blocks(work)), dim3(kElementwiseThreads), 0,
                     static_cast<hipStream_t>(stream), weight_in, weight_out, weight_numel, scale_in, scale_out,
                     scale_kind, scale_numel, vectorized);
  return last_launch_status();
}

}  // namespace dsv4::gpu
