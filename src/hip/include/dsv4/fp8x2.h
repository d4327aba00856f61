// Two FP8 encodes per conversion instruction (and the paired OCP decode of NVIDIA), byte-identical to
// value (a new header rather than an edit of fp8.h, which other areas share): the paired conversions
// NVIDIA (cvt.rn.satfinite.e4m3x2.f32) and AMD (v_cvt_pk_fp8_f32) have convert each element exactly as
// the single-value paths of fp8.h use them, so only the instruction count changes. The quantizers that
// write long runs of values (wo_a's group quantizer, the full-cache FP8 Q and KV rows) use it; everything
// else keeps fp8.h.
#pragma once

#include "dsv4/fp8.h"
#include "dsv4/platform.h"
#include "dsv4/ptx.h"

namespace dsv4 {

#if !defined(DSV4_FP8_SOFTWARE_ONLY) && DSV4_DEVICE_PASS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DSV4_FP8X2_NVIDIA 1
#elif !defined(DSV4_FP8_SOFTWARE_ONLY) && DSV4_DEVICE_PASS && defined(__HIP_DEVICE_COMPILE__) && \
    (defined(__gfx942__) || defined(__gfx950__))
#define DSV4_FP8X2_AMDGCN 1
#endif

// Whether this compilation pass has a paired conversion instruction for F.
template <Fp8Format F>
DSV4_HD constexpr bool fp8x2_uses_hardware() {
#if defined(DSV4_FP8X2_NVIDIA)
  return F == Fp8Format::kOCP;
#elif defined(DSV4_FP8X2_AMDGCN)
  return fp8_encode_uses_hardware<F>();
#else
  return false;
#endif
}

#if defined(__CUDACC__) && !defined(__HIPCC__)
// The paired decode (NVIDIA sm_89+): the four OCP codes of a word (low byte first) as two f16 pairs, codes 0, 1
// in `first` and 2, 3 in `second`, each pair's lower code in the low half. Exact (every e4m3 value is an f16);
// the word's halves go to the conversion as they are (no shifts or masks). Only sm_89+ code may call it (the
// instruction); it is declared in every NVIDIA pass, host included, because callers in sm_90a-only kernels
// are parsed there too.
DSV4_DEVICE void ocp_fp8x4_to_f16x4(uint32_t four_codes, uint32_t& first, uint32_t& second) {
  ptx::cvt_rn_f16x2_e4m3x2_halves(four_codes, first, second);
}
#endif

// The paired conversion (lo -> bits 0..7, hi -> bits 8..15) of values within the format's finite range,
// rounding to nearest even, with the FNUZ signed zero made +0. (AMD's instruction does not saturate, so
// callers bound the values first.) NaN inputs give unspecified codes: callers that can see NaN select the
// NaN code themselves. Only called where fp8x2_uses_hardware<F>().
template <Fp8Format F>
DSV4_HD uint32_t fp8x2_convert(float lo, float hi) {
#if defined(DSV4_FP8X2_NVIDIA)
  return ptx::cvt_rn_satfinite_e4m3x2_f32(hi, lo);
#elif defined(DSV4_FP8X2_AMDGCN)
  using T = Fp8Traits<F>;
  const uint32_t packed = static_cast<uint32_t>(__builtin_amdgcn_cvt_pk_fp8_f32(lo, hi, 0, false));
  uint32_t code_lo = packed & 0xffu;
  uint32_t code_hi = (packed >> 8) & 0xffu;
  if constexpr (!T::kHasNegativeZero) {
    code_lo = code_lo == 0x80u ? 0u : code_lo;
    code_hi = code_hi == 0x80u ? 0u : code_hi;
  }
  return code_lo | (code_hi << 8);
#else
  (void)lo, (void)hi;
  return 0;
#endif
}

// fp8_encode_clamped_nan_to_min<F>(lo) in bits 0..7 and (hi) in bits 8..15: the KV writers' clamp, NaN to
// -quant_max.
template <Fp8Format F>
DSV4_HD uint32_t fp8x2_encode_clamped_nan_to_min(float lo, float hi, float quant_max) {
  if constexpr (fp8x2_uses_hardware<F>()) {
    using T = Fp8Traits<F>;
    // The clamp and the format's saturation as one max and one min per value, to the smaller bound (a clamp
    // that kept NaN took three times the instructions, which full-cache Q quantization at prefill sizes is
    // bound by). fmaxf first: it takes NaN to its other operand (IEEE maxNum), so NaN leaves as -bound.
    const float bound = fminf(quant_max, T::kMaxFinite);
    return fp8x2_convert<F>(fminf(fmaxf(lo, -bound), bound), fminf(fmaxf(hi, -bound), bound));
  }
  return static_cast<uint32_t>(fp8_encode_clamped_nan_to_min<F>(lo, quant_max)) |
         (static_cast<uint32_t>(fp8_encode_clamped_nan_to_min<F>(hi, quant_max)) << 8);
}

// fp8x2_encode_clamped<F>(lo, hi, quant_max) for two values known not to be NaN (infinities are fine): the
// clamps and the conversion without the NaN selects, for callers that test a run of values for NaN once
// (where the device pairs conversions, the form above: the same bytes for every value but NaN).
template <Fp8Format F>
DSV4_HD uint32_t fp8x2_encode_clamped_not_nan(float lo, float hi, float quant_max) {
  if constexpr (fp8x2_uses_hardware<F>()) return fp8x2_encode_clamped_nan_to_min<F>(lo, hi, quant_max);
  return static_cast<uint32_t>(fp8_encode_clamped<F>(lo, quant_max)) |
         (static_cast<uint32_t>(fp8_encode_clamped<F>(hi, quant_max)) << 8);
}

// fp8_encode_clamped<F>(lo) in bits 0..7 and fp8_encode_clamped<F>(hi) in bits 8..15.
template <Fp8Format F>
DSV4_HD uint32_t fp8x2_encode_clamped(float lo, float hi, float quant_max) {
  if constexpr (fp8x2_uses_hardware<F>()) {
    using T = Fp8Traits<F>;
    uint32_t packed = fp8x2_encode_clamped_not_nan<F>(lo, hi, quant_max);
    if (lo != lo || hi != hi) {
      packed = (lo != lo ? T::kNaNCode : (packed & 0xffu)) | ((hi != hi ? T::kNaNCode : (packed >> 8)) << 8);
    }
    return packed;
  }
  return static_cast<uint32_t>(fp8_encode_clamped<F>(lo, quant_max)) |
         (static_cast<uint32_t>(fp8_encode_clamped<F>(hi, quant_max)) << 8);
}

// fp8x2_encode_clamped<F>(lo, hi, quant_max) for two finite values inside [-r, r], r = min(quant_max, the
// format's largest finite): there the clamps, saturation and NaN selects of the general form are no-ops, so
// only the conversion runs. A caller that knows a whole group is in range (wo_a's quantizer, from the
// group's amax) saves most of the per-value instructions.
template <Fp8Format F>
DSV4_HD uint32_t fp8x2_encode_in_range(float lo, float hi, float quant_max) {
  if constexpr (fp8x2_uses_hardware<F>()) return fp8x2_convert<F>(lo, hi);
  return fp8x2_encode_clamped<F>(lo, hi, quant_max);
}

}  // namespace dsv4
