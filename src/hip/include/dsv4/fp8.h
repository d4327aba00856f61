// FP8 e4m3 in the two encodings dsv4ops stores: OCP "fn" (gfx950, NVIDIA) and FNUZ (gfx942).
// Torch-free; every function compiles for the host and for device passes, so the CPU backend and the
// kernels produce identical bytes.
//
// Encoding rules (spec/kv_cache.md §7):
//   * round to nearest, ties to even; values beyond the format's largest finite value (Inf included)
//     saturate to it with their sign;
//   * NaN encodes as the format's NaN code (OCP 0x7F, FNUZ 0x80), whatever its sign or payload;
//   * OCP keeps the sign of zero (-0 and negatives that round to zero give 0x80); FNUZ has no -0 and
//     writes 0x00.
// Decoding: OCP 0x7F/0xFF and FNUZ 0x80 decode to a quiet NaN; for every other byte the FNUZ value is
// exactly half the OCP value.
//
// fp8_encode() takes the chip's conversion instruction where it has one for the format (gfx942 FNUZ,
// gfx950 OCP, NVIDIA sm_89+ OCP) and the software path otherwise. The fast paths clamp and handle NaN
// explicitly so that they give exactly fp8_encode_software()'s bytes. Define DSV4_FP8_SOFTWARE_ONLY
// to compile the software path everywhere.
#pragma once

#include "dsv4/platform.h"
#include "dsv4/ptx.h"

namespace dsv4 {

enum class Fp8Format : int { kOCP = 0, kFNUZ = 1 };

template <Fp8Format F>
struct Fp8Traits;

template <>
struct Fp8Traits<Fp8Format::kOCP> {
  static constexpr int kExponentBias = 7;
  static constexpr float kMaxFinite = 448.0f;
  static constexpr uint8_t kMaxFiniteCode = 0x7e;
  static constexpr uint8_t kNaNCode = 0x7f;  // written by encoders; 0xFF decodes as NaN too
  static constexpr float kDefaultQuantMax = 448.0f;
  static constexpr bool kHasNegativeZero = true;
};

template <>
struct Fp8Traits<Fp8Format::kFNUZ> {
  static constexpr int kExponentBias = 8;
  static constexpr float kMaxFinite = 240.0f;
  static constexpr uint8_t kMaxFiniteCode = 0x7f;
  static constexpr uint8_t kNaNCode = 0x80;  // the only NaN; there is no Inf and no -0
  // Project policy on gfx942 (= 448 / 2, vLLM's convention): FNUZ bytes then equal OCP bytes with the
  // scale exponent one higher. A parameter wherever an op quantizes; 240 is reachable.
  static constexpr float kDefaultQuantMax = 224.0f;
  static constexpr bool kHasNegativeZero = false;
};

template <Fp8Format F>
DSV4_HD bool fp8_is_nan_code(uint8_t code) {
  if constexpr (F == Fp8Format::kOCP) {
    return (code & 0x7fu) == 0x7fu;
  } else {
    return code == 0x80u;
  }
}

// Exact decode by fields (no FP8 arithmetic): E == 0 is M * 2^(1-bias-3), else (8+M) * 2^(E-bias-3).
template <Fp8Format F>
DSV4_HD float fp8_decode(uint8_t code) {
  constexpr int kBias = Fp8Traits<F>::kExponentBias;
  if (fp8_is_nan_code<F>(code)) return bits_float(0x7fc00000u);
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  float magnitude;
  if (exponent == 0) {
    constexpr uint32_t kSubnormalUnitBits = static_cast<uint32_t>(127 - 2 - kBias) << 23;  // 2^(-2-bias)
    magnitude = static_cast<float>(mantissa) * bits_float(kSubnormalUnitBits);
  } else {
    magnitude = bits_float(((exponent - kBias + 127) << 23) | (mantissa << 20));
  }
  return (code & 0x80u) ? -magnitude : magnitude;
}

// Round-to-nearest-even, saturate-to-finite encode in integer arithmetic. The reference for the fast
// paths below. Written with selects rather than branches: lanes of a warp take different paths, and on
// AMDGPU nested branches cost scalar registers.
template <Fp8Format F>
DSV4_HD uint8_t fp8_encode_software(float x) {
  using T = Fp8Traits<F>;
  constexpr int kBias = T::kExponentBias;
  const uint32_t bits = float_bits(x);
  const uint32_t sign = bits >> 31;
  const uint32_t magnitude = bits & 0x7fffffffu;
  const int exponent = static_cast<int>(magnitude >> 23) - 127;

  // FP8 normal: keep 3 of 23 mantissa bits; a carry out of the mantissa bumps the exponent.
  const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  const uint32_t normal_code = (rounded >> 20) - static_cast<uint32_t>((127 - kBias) << 3);

  // FP8 subnormal or zero: count units of 2^(-2-bias), round half to even. Rounding up to 8 yields the
  // smallest normal. Shifts past 25 leave less than half a unit (the significand is below 2^24).
  const bool fp32_normal = (magnitude >> 23) != 0;
  const uint32_t significand = (magnitude & 0x7fffffu) | (fp32_normal ? 0x800000u : 0u);
  int shift = 21 - kBias - (fp32_normal ? exponent : -126);
  shift = shift < 1 ? 1 : (shift > 25 ? 25 : shift);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t remainder = significand & ((half << 1) - 1u);
  uint32_t subnormal_code = significand >> shift;
  subnormal_code += (remainder > half || (remainder == half && (subnormal_code & 1u))) ? 1u : 0u;

  uint32_t code = exponent >= 1 - kBias ? normal_code : subnormal_code;
  code = magnitude >= float_bits(T::kMaxFinite) ? T::kMaxFiniteCode : code;  // saturate (Inf included)
  const uint32_t signed_code = (!T::kHasNegativeZero && code == 0) ? 0u : (code | (sign << 7));
  return static_cast<uint8_t>(magnitude > 0x7f800000u ? T::kNaNCode : signed_code);
}

#if DSV4_DEVICE_PASS && defined(__HIP_DEVICE_COMPILE__) && (defined(__gfx942__) || defined(__gfx950__))
// v_cvt_pk_fp8_f32 converts to the chip's native encoding (FNUZ on gfx942, OCP on gfx950) with RNE.
// Saturation and NaN are made explicit so the bytes match the software path.
template <Fp8Format F>
DSV4_DEVICE uint8_t fp8_encode_amdgcn(float x) {
  using T = Fp8Traits<F>;
  if (x != x) return T::kNaNCode;
  const float clamped = __builtin_fminf(__builtin_fmaxf(x, -T::kMaxFinite), T::kMaxFinite);
  const uint8_t code = static_cast<uint8_t>(__builtin_amdgcn_cvt_pk_fp8_f32(clamped, clamped, 0, false) & 0xff);
  if constexpr (!T::kHasNegativeZero) {
    if (code == 0x80u) return 0;  // a zero that kept its sign
  }
  return code;
}
#endif

#if DSV4_DEVICE_PASS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
DSV4_DEVICE uint8_t fp8_encode_ocp_ptx(float x) {
  if (x != x) return Fp8Traits<Fp8Format::kOCP>::kNaNCode;
  return static_cast<uint8_t>(ptx::cvt_rn_satfinite_e4m3x2_f32(0.0f, x) & 0xffu);
}
#endif

// Whether fp8_encode<F> uses a conversion instruction in the pass being compiled.
template <Fp8Format F>
DSV4_HD constexpr bool fp8_encode_uses_hardware() {
#if defined(DSV4_FP8_SOFTWARE_ONLY) || !DSV4_DEVICE_PASS
  return false;
#elif defined(__gfx942__)
  return F == Fp8Format::kFNUZ;
#elif defined(__gfx950__)
  return F == Fp8Format::kOCP;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return F == Fp8Format::kOCP;
#else
  return false;
#endif
}

template <Fp8Format F>
DSV4_HD uint8_t fp8_encode(float x) {
#if !defined(DSV4_FP8_SOFTWARE_ONLY) && DSV4_DEVICE_PASS
#if defined(__HIP_DEVICE_COMPILE__) && (defined(__gfx942__) || defined(__gfx950__))
  if constexpr (fp8_encode_uses_hardware<F>()) return fp8_encode_amdgcn<F>(x);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (fp8_encode_uses_hardware<F>()) return fp8_encode_ocp_ptx(x);
#endif
#endif
  return fp8_encode_software<F>(x);
}

// Quantizer step shared by the ops: clamp to +-quant_max (quant_max <= the format's max finite), then
// encode. NaN stays NaN (it does not clamp to -quant_max).
template <Fp8Format F>
DSV4_HD uint8_t fp8_encode_clamped(float x, float quant_max) {
  if (x != x) return Fp8Traits<F>::kNaNCode;
  const float clamped = x < -quant_max ? -quant_max : (x > quant_max ? quant_max : x);
  return fp8_encode<F>(clamped);
}

// The KV-cache writers' step (spec kv_cache §7.4): clamp max-then-min, fmin(fmax(x, -quant_max), quant_max),
// then encode, so that NaN becomes -quant_max as in the upstream writers (unlike fp8_encode_clamped).
template <Fp8Format F>
DSV4_HD uint8_t fp8_encode_clamped_nan_to_min(float x, float quant_max) {
  x = x > -quant_max ? x : -quant_max;  // also NaN -> -quant_max
  x = x < quant_max ? x : quant_max;
  return fp8_encode<F>(x);
}

// An OCP byte re-read as FNUZ is worth half; checkpoint normalization for gfx942 keeps the value by
// doubling the scale. 0x80 (OCP -0) would be FNUZ NaN and becomes 0x00; OCP NaN becomes FNUZ NaN.
DSV4_HD uint8_t ocp_byte_to_fnuz_byte(uint8_t code) {
  if (code == 0x80u) return 0x00u;
  if ((code & 0x7fu) == 0x7fu) return 0x80u;
  return code;
}

}  // namespace dsv4

#include <type_traits>

namespace dsv4 {

// Calls fn with the format as a compile-time constant: fn(std::integral_constant<Fp8Format, F>{}).
template <typename Fn>
inline decltype(auto) with_fp8_format(Fp8Format format, Fn&& fn) {
  if (format == Fp8Format::kFNUZ) return fn(std::integral_constant<Fp8Format, Fp8Format::kFNUZ>{});
  return fn(std::integral_constant<Fp8Format, Fp8Format::kOCP>{});
}

}  // namespace dsv4
