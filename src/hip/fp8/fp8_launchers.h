// Raw-pointer launchers of the FP8/UE8M0 conversion kernels (GPU builds). Torch-free and free of GPU
// runtime headers: `stream` is the hipStream_t / cudaStream_t to launch on. Pointers are device pointers
// to contiguous buffers; callers have validated sizes. n == 0 launches nothing.
#pragma once

#include "dsv4/fp8.h"
#include "dsv4/platform.h"
#include "fp8_elementwise.h"

namespace dsv4::gpu {

LaunchStatus launch_ue8m0_to_float(const uint8_t* scale, float* out, int64_t n, void* stream);

LaunchStatus launch_float_to_ue8m0_lossless(const float* scale, uint8_t* bytes, uint8_t* refusal, int64_t n,
                                            void* stream);

LaunchStatus launch_fp8_encode(const void* x, FloatKind x_kind, uint8_t* out, int64_t n, Fp8Format format,
                               float quant_max, void* stream);

LaunchStatus launch_fp8_block_dequantize(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out,
                                         FloatKind out_kind, const BlockScaleGeometry& geometry, Fp8Format format,
                                         void* stream);

// weight_in may equal weight_out and scale_in may equal scale_out (in place).
LaunchStatus launch_e4m3fn_to_fnuz(const uint8_t* weight_in, uint8_t* weight_out, int64_t weight_numel,
                                   const void* scale_in, void* scale_out, ScaleKind scale_kind, int64_t scale_numel,
                                   void* stream);

}  // namespace dsv4::gpu
