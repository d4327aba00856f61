// CPU backend of the FP8/UE8M0 conversion ops: loops over [begin, end) of the flattened tensors, calling
// the per-element numerics the kernels use. The bindings split the range across threads.
#pragma once

#include <cstdint>

#include "fp8/fp8_elementwise.h"

namespace dsv4::cpu {

void ue8m0_to_float(const uint8_t* scale, float* out, int64_t begin, int64_t end);

void float_to_ue8m0_lossless(const float* scale, uint8_t* bytes, uint8_t* refusal, int64_t begin, int64_t end);

void fp8_encode(const void* x, FloatKind x_kind, uint8_t* out, Fp8Format format, float quant_max, int64_t begin,
                int64_t end);

// [begin, end) are flat rows (batch * rows + row), not elements.
void fp8_block_dequantize(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out, FloatKind out_kind,
                          const BlockScaleGeometry& geometry, Fp8Format format, int64_t begin, int64_t end);

void e4m3fn_to_fnuz_weight(const uint8_t* weight_in, uint8_t* weight_out, int64_t begin, int64_t end);

void e4m3fn_to_fnuz_scale(const void* scale_in, void* scale_out, ScaleKind scale_kind, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
