// The fp8_ds_mla cache record (spec/kv_cache.md §4.1, §8) shared by every writer and reader of the SWA
// and compressed caches, on the CPU and the GPU. Torch-free, host and device.
//
// A block of `bs` tokens starts at byte block * block_stride (the cache tensor's stride(0)):
//   [0, bs*576)            token k's data record at k*576: 448 FP8 NoPE bytes (dim i at byte i), then the
//                          64 RoPE dims as little-endian bf16
//   [bs*576, bs*576+bs*8)  token k's scale record at bs*576 + k*8: UE8M0 bytes of the 7 NoPE blocks of 64
//                          dims, then a 0 pad byte
#pragma once

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"
#include "dsv4/platform.h"
#include "dsv4/ue8m0.h"

namespace dsv4::ds_mla {

inline constexpr int kHeadDim = 512;
inline constexpr int kRopeDim = 64;
inline constexpr int kNopeDim = 448;
inline constexpr int kQuantBlock = 64;
inline constexpr int kNumQuantBlocks = 7;
inline constexpr int kDataBytes = 576;
inline constexpr int kScaleBytes = 8;
inline constexpr int kRecordBytes = 584;
// The amax floor of the KV writers: an all-zero block still gets a finite scale (byte 105 OCP, 106 FNUZ).
inline constexpr float kAmaxFloor = 1e-4f;

struct RecordAddress {
  int64_t data;   // byte offset of the 576-byte data record
  int64_t scale;  // byte offset of the 8-byte scale record
};

// The record of the token at `position` within cache block `block`.
DSV4_HD RecordAddress record_address_in_block(int64_t block, int64_t position, int64_t block_size,
                                              int64_t block_stride) {
  const int64_t base = block * block_stride;
  return {base + position * kDataBytes, base + block_size * kDataBytes + position * kScaleBytes};
}

// The record of global slot `slot` (>= 0).
DSV4_HD RecordAddress record_address(int64_t slot, int64_t block_size, int64_t block_stride) {
  const IndexSplit split = divide_index(slot, block_size);
  return record_address_in_block(split.quotient, split.remainder, block_size, block_stride);
}

// The exact inverse of a block scale, 2^(127-u); 0 for the NaN byte 255 (an Inf amax), so that finite
// values quantize to 0 and the Inf itself to NaN, which the clamp below turns into -quant_max.
DSV4_HD float ue8m0_inverse_scale(uint8_t u) {
  if (u == kUe8m0NaN) return 0.0f;
  if (u == 254) return bits_float(0x00400000u);  // 2^-127, an fp32 subnormal
  return bits_float(static_cast<uint32_t>(254 - u) << 23);
}

// One NoPE value into its block: scale by the exact inverse power of two, clamp max-then-min (NaN
// becomes -quant_max, as the upstream writers do), encode round-to-nearest-even.
template <Fp8Format F>
DSV4_HD uint8_t quantize_nope_value(float x, float inverse_scale, float quant_max) {
  return fp8_encode_clamped_nan_to_min<F>(x * inverse_scale, quant_max);
}

// One NoPE value back: FP8 value times the block scale (exact in fp32). In FNUZ a 0x80 byte (NaN there)
// can only come from an OCP writer's -0 and reads as +0, which the scale then multiplies like any other
// zero (a NaN scale makes it NaN, as in the reference).
template <Fp8Format F>
DSV4_HD float dequantize_nope_value(uint8_t code, float block_scale) {
  if constexpr (F == Fp8Format::kFNUZ) {
    if (code == 0x80u) return 0.0f * block_scale;
  }
  return fp8_decode<F>(code) * block_scale;
}

// Scale bytes from which the bf16 of every dequantize_nope_value product is the top half of its fp32 bits:
// the smallest FP8 magnitude is 2^-9 (OCP) or 2^-10 (FNUZ), and 2^-10 * 2^(11-127) = 2^-126, so every
// product is then 0, an fp32 normal with at most 4 significant bits, Inf or a quiet NaN. Readers that
// convert many values skip the rounding work for such blocks.
inline constexpr uint8_t kTruncationExactScaleByte = 11;

// Integer decode of NoPE codes, for the GPU readers' hot loops. For a code whose exponent field is 1..15
// and whose low 7 bits are not 0x7f (NaN in OCP; +-240 in FNUZ, left to the general path as well), and a
// scale byte s in [kIntegerDecodeMinScale, kIntegerDecodeMaxScale], dequantize_nope_value's product is a
// normal fp32 with at most 4 significant bits, so its bf16 is exact: sign at bit 15, exponent field
// E - bias + s (1..248), the code's 3 mantissa bits at bits 4..6. That is the code's sign moved to bit 15,
// its low 7 bits moved up by 4, plus (s - bias) << 7: integer work only, no conversion instruction.
inline constexpr uint32_t kIntegerDecodeMinScale = 8;    // E = 1, bias 8: exponent field >= 1
inline constexpr uint32_t kIntegerDecodeMaxScale = 240;  // E = 15, bias 7: exponent field <= 248

// Bit 7 of byte i is set iff code i of the word decodes by the integer path.
DSV4_HD uint32_t integer_decodable_fp8x4(uint32_t four_codes) {
  const uint32_t magnitudes = four_codes & 0x7f7f7f7fu;
  const uint32_t has_exponent = magnitudes + 0x78787878u;  // bit 7: magnitude >= 8 (no carry leaves a byte)
  const uint32_t is_top = magnitudes + 0x01010101u;        // bit 7: magnitude == 0x7f
  return has_exponent & ~is_top & 0x80808080u;
}

// The per-half term (s - bias) << 7 of integer_decode_bf16x2 for a scale byte in the range above.
DSV4_HD uint32_t integer_decode_offset(uint32_t scale_byte, uint32_t exponent_bias) {
  return (scale_byte - exponent_bias) * 0x00800080u;
}

// Codes i, i + 1 of a word as bits 0..7 and 16..23 (pair 0: codes 0, 1; pair 1: codes 2, 3).
template <int kPair>
DSV4_HD uint32_t spread_fp8_pair(uint32_t four_codes) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(four_codes, 0u, kPair == 0 ? 0x4140u : 0x4342u);
#else
  const uint32_t pair = four_codes >> (16 * kPair);
  return (pair & 0xffu) | ((pair & 0xff00u) << 8);
#endif
}

// The bf16 pair (low half first) of two integer-decodable codes in bits 0..7 and 16..23 (the other bits
// zero). code * 16 puts the low 7 bits in place and the sign at bit 11; adding sign * 240 carries it to bit
// 15. No carry crosses into the high half: the low half stays below 0x8000 + 0x7f0 + 232 * 128.
DSV4_HD uint32_t integer_decode_bf16x2(uint32_t two_codes, uint32_t offset) {
  return two_codes * 16u + (two_codes & 0x00800080u) * 240u + offset;
}

// One whole record back to its 512 bf16 values: the NoPE dims through dequantize_nope_value and a bf16
// rounding (exact but for under- or overflow), then the stored bf16 RoPE dims (little-endian).
template <Fp8Format F>
DSV4_HD void decode_record(const uint8_t* data, const uint8_t* scales, uint16_t* out) {
  for (int i = 0; i < kNopeDim; ++i) {
    out[i] = float_to_bf16_bits(dequantize_nope_value<F>(data[i], ue8m0_decode(scales[i / kQuantBlock])));
  }
  for (int i = 0; i < kRopeDim; ++i) {
    out[kNopeDim + i] = static_cast<uint16_t>(data[kNopeDim + 2 * i] | (data[kNopeDim + 2 * i + 1] << 8));
  }
}

}  // namespace dsv4::ds_mla

