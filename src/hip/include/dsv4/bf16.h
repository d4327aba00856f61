// bfloat16 <-> fp32 bit conversions shared by the CPU and GPU paths (round-to-nearest-even, quiet NaN),
// so both produce the bytes torch's `.to(torch.bfloat16)` produces.
#pragma once

#include "dsv4/platform.h"

namespace dsv4 {

DSV4_HD uint16_t float_to_bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}

DSV4_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

#if DSV4_GPU_COMPILER
// 8 bf16 values in one 16-byte vector (value 2j in the low half of word j) to fp32, and back.
DSV4_DEVICE void unpack_bf16x8(const uint4& raw, float* values) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    values[2 * j] = bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
    values[2 * j + 1] = bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
  }
}

DSV4_DEVICE uint4 pack_bf16x8(const float* values) {
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    words[j] = float_to_bf16_bits(values[2 * j]) | (static_cast<uint32_t>(float_to_bf16_bits(values[2 * j + 1])) << 16);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}
#endif

}  // namespace dsv4
