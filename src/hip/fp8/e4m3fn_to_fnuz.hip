// dsv4::e4m3fn_to_fnuz: checkpoint normalization for gfx942. Weight bytes keep their bits (re-read as
// FNUZ they are worth half) except 0x80 -> 0x00 and OCP NaN -> FNUZ NaN; the block scale doubles.
#include "dsv4/launch.h"
#include "fp8_launchers.h"

namespace dsv4::gpu {
namespace {

__global__ void e4m3fn_to_fnuz_kernel(const uint8_t* weight_in, uint8_t* weight_out, int64_t weight_numel,
                                      const void* scale_in, void* scale_out, ScaleKind scale_kind,
                                      int64_t scale_numel) {
  for (int64_t i = global_thread_index(); i < weight_numel; i += global_thread_count()) {
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
  const int64_t work = weight_numel > scale_numel ? weight_numel : scale_numel;
  if (work == 0) return LaunchStatus::kOk;
  hipLaunchKernelGGL(e4m3fn_to_fnuz_kernel, dim3(elementwise_blocks(work)), dim3(kElementwiseThreads), 0,
                     static_cast<hipStream_t>(stream), weight_in, weight_out, weight_numel, scale_in, scale_out,
                     scale_kind, scale_numel);
  return last_launch_status();
}

}  // namespace dsv4::gpu
