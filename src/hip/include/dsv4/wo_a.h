// Per-element numerics of the wo_a ops that the CPU path (src/cpu/wo_a) and the GPU kernels
// (src/hip/wo_a) share beyond rope.h / fp8.h / ue8m0.h. Torch-free, host and device.
#pragma once

#include "dsv4/bf16.h"
#include "dsv4/platform.h"

namespace dsv4::wo_a {

inline constexpr uint16_t kCanonicalBf16NaN = 0x7fc0;

// An inverse_rope output lane: round to nearest even, and every NaN as the one quiet NaN 0x7FC0. NaN
// payloads and signs follow each processor's propagation rules (x86 keeps the operand's payload, NVIDIA
// returns its canonical NaN), so the op defines its NaN bits instead of inheriting them.
DSV4_HD uint16_t rope_output_bits(float x) { return x != x ? kCanonicalBf16NaN : float_to_bf16_bits(x); }

}  // namespace dsv4::wo_a
