// UE8M0 (E8M0) block scales: an unsigned biased exponent, byte u means 2^(u-127). Torch-free, host and
// device. Conventions: spec/kv_cache.md §8, spec/wo_a.md §3.3 and §5.3.
#pragma once

#include "dsv4/platform.h"

namespace dsv4 {

inline constexpr uint8_t kUe8m0NaN = 0xff;

// Decode by placing the byte in the fp32 exponent field (no FP8 arithmetic). Byte 0 is 2^-127, an fp32
// subnormal; byte 255 is the E8M0 NaN. These match torch.float8_e8m0fnu's conversion to float32.
DSV4_HD float ue8m0_decode(uint8_t u) {
  if (u == 0) return bits_float(0x00400000u);
  if (u == kUe8m0NaN) return bits_float(0x7fc00000u);
  return bits_float(static_cast<uint32_t>(u) << 23);
}

// RCEIL encode: the smallest power of two 2^e with amax / 2^e <= quant_max, stored as e + 127.
// The quotient amax / quant_max is an fp32 division (the project's one rule, spec README "Project
// decisions"); its exponent is then rounded up when any mantissa bit is set, which equals
// ceil(log2(quotient)) for normal quotients and gives byte 1 for subnormal ones.
// amax is an absolute maximum (its sign is ignored); it is floored at amax_floor, the value each op's
// spec gives (1e-4 for the KV cache writers, 1e-8 for the wo_a quantizer). NaN or Inf give 255.
DSV4_HD uint8_t ue8m0_encode_rceil(float amax, float quant_max, float amax_floor) {
  float magnitude = bits_float(float_bits(amax) & 0x7fffffffu);
  if (float_bits(magnitude) >= 0x7f800000u) return kUe8m0NaN;
  if (magnitude < amax_floor) magnitude = amax_floor;
  const uint32_t quotient = float_bits(magnitude / quant_max) & 0x7fffffffu;
  uint32_t biased = quotient >> 23;
  if (quotient & 0x7fffffu) ++biased;
  return static_cast<uint8_t>(biased > 255u ? 255u : biased);
}

// Why a float scale has no lossless UE8M0 byte. Stored per element by the conversion op; 0 is success.
enum class Ue8m0Refusal : uint8_t {
  kNone = 0,
  kNotFinite = 1,      // NaN or +-Inf
  kNotPositive = 2,    // zero or negative
  kNotPowerOfTwo = 3,  // rounding it would change the weights
  kOutOfRange = 4,     // a power of two below 2^-127 (byte 255 is reserved for NaN, so 2^128 cannot occur)
};

// Lossless fp32 -> UE8M0: accepts exactly the powers of two 2^-127 .. 2^127 (bytes 0 .. 254).
// On refusal *byte is set to 0xFF.
DSV4_HD Ue8m0Refusal ue8m0_from_float_exact(float scale, uint8_t* byte) {
  const uint32_t bits = float_bits(scale);
  const uint32_t exponent = (bits >> 23) & 0xffu;
  const uint32_t mantissa = bits & 0x7fffffu;
  *byte = kUe8m0NaN;
  if (exponent == 0xffu) return Ue8m0Refusal::kNotFinite;
  if ((bits >> 31) || (bits & 0x7fffffffu) == 0) return Ue8m0Refusal::kNotPositive;
  if (exponent == 0) {  // subnormal: only 2^-127 is in range; smaller powers of two are not
    if (mantissa == 0x400000u) {
      *byte = 0;
      return Ue8m0Refusal::kNone;
    }
    return (mantissa & (mantissa - 1u)) == 0 ? Ue8m0Refusal::kOutOfRange : Ue8m0Refusal::kNotPowerOfTwo;
  }
  if (mantissa != 0) return Ue8m0Refusal::kNotPowerOfTwo;
  *byte = static_cast<uint8_t>(exponent);  // 1 .. 254
  return Ue8m0Refusal::kNone;
}

}  // namespace dsv4
