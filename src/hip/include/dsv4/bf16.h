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

}  // namespace dsv4
