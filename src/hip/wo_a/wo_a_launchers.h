// Raw-pointer launchers of the wo_a ops (GPU builds; spec/wo_a.md). Torch-free, free of GPU runtime
// headers; `stream` is the hipStream_t / cudaStream_t. The bindings validate every argument first; a
// launcher still refuses (kInvalidArgument) anything its kernels cannot serve without reading or writing
// out of bounds.
#pragma once

#include "dsv4/platform.h"
#include "wo_a/wo_a_args.h"

namespace dsv4::gpu {

// inverse_rope_group_quant: one thread per 32 consecutive lanes of a token's heads (4 x 16-byte loads,
// 2 x 16-byte stores), the group amax by a butterfly over the group_size / 32 threads of a quant group.
LaunchStatus launch_inverse_rope_group_quant(const InverseRopeGroupQuantArgs& args, void* stream);

// inverse_rope: one thread per 8 consecutive lanes (16-byte load and store).
LaunchStatus launch_inverse_rope(const InverseRopeArgs& args, void* stream);

// bmm_a8w8_mxscale on the matrix units (NVIDIA mma.sync m16n8k32 e4m3; AMD v_mfma_f32_16x16x32_fp8_fp8),
// one fresh fp32 fragment per 128-deep K block folded into the running sum with the block's scales.
LaunchStatus launch_bmm_a8w8_mxscale(const BmmA8W8MxScaleArgs& args, void* stream);

}  // namespace dsv4::gpu
