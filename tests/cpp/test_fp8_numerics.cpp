// FP8 e4m3 codec (dsv4/fp8.h) against independent references written with double arithmetic.
// Set DSV4OPS_EXHAUSTIVE=1 to check the encoder on all 2^32 fp32 bit patterns (slow); the default run
// checks a dense sample that covers every fp32 exponent, both signs, every rounding tie of the FP8
// grid and the saturation edges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dsv4/fp8.h"

namespace {

using dsv4::Fp8Format;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Value of a code straight from the format definition (spec/kv_cache.md §7.1).
double definition_value(uint8_t code, Fp8Format format) {
  const int bias = format == Fp8Format::kOCP ? 7 : 8;
  if (format == Fp8Format::kOCP && (code & 0x7f) == 0x7f) return std::nan("");
  if (format == Fp8Format::kFNUZ && code == 0x80) return std::nan("");
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, 1 - bias);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - bias);
}

// Independent encoder: nearest representable magnitude among all codes, ties to the even code,
// saturation above the largest finite value, NaN to the format's NaN code, sign per format.
struct ReferenceEncoder {
  Fp8Format format;
  std::vector<std::pair<double, uint8_t>> magnitudes;  // ascending, positive codes 0x00..max

  explicit ReferenceEncoder(Fp8Format f) : format(f) {
    for (int code = 0; code < 0x80; ++code) {
      const double v = definition_value(static_cast<uint8_t>(code), f);
      if (!std::isnan(v)) magnitudes.emplace_back(v, static_cast<uint8_t>(code));
    }
    std::sort(magnitudes.begin(), magnitudes.end());
  }

  uint8_t encode(float x) const {
    if (std::isnan(x)) return format == Fp8Format::kOCP ? 0x7f : 0x80;
    const double a = std::fabs(static_cast<double>(x));
    const bool negative = std::signbit(x);
    uint8_t code;
    if (a >= magnitudes.back().first) {
      code = magnitudes.back().second;
    } else {
      auto upper = std::lower_bound(magnitudes.begin(), magnitudes.end(), std::make_pair(a, uint8_t{0}));
      if (upper->first == a) {
        code = upper->second;
      } else {
        auto lower = upper - 1;
        const double down = a - lower->first;
        const double up = upper->first - a;
        if (down < up) code = lower->second;
        else if (up < down) code = upper->second;
        else code = (lower->second & 1) == 0 ? lower->second : upper->second;
      }
    }
    if (format == Fp8Format::kFNUZ && code == 0) return 0;
    return static_cast<uint8_t>(code | (negative ? 0x80 : 0));
  }
};

uint8_t encode(float x, Fp8Format format) {
  return format == Fp8Format::kOCP ? dsv4::fp8_encode<Fp8Format::kOCP>(x) : dsv4::fp8_encode<Fp8Format::kFNUZ>(x);
}

float decode(uint8_t code, Fp8Format format) {
  return format == Fp8Format::kOCP ? dsv4::fp8_decode<Fp8Format::kOCP>(code)
                                   : dsv4::fp8_decode<Fp8Format::kFNUZ>(code);
}

class Fp8Codec : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Codec, DecodesEveryCodeAsDefined) {
  const Fp8Format format = GetParam();
  for (int code = 0; code < 256; ++code) {
    const double expected = definition_value(static_cast<uint8_t>(code), format);
    const float actual = decode(static_cast<uint8_t>(code), format);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << "code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(actual), expected) << "code " << code;
      EXPECT_EQ(std::signbit(actual), std::signbit(expected)) << "code " << code;
    }
  }
}

TEST_P(Fp8Codec, EveryFiniteCodeRoundTrips) {
  const Fp8Format format = GetParam();
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    const float value = decode(static_cast<uint8_t>(code), format);
    if (std::isnan(value)) continue;
    EXPECT_EQ(encode(value, format), code) << "value " << value;
    ++checked;
  }
  EXPECT_EQ(checked, format == Fp8Format::kOCP ? 254 : 255);
}

TEST_P(Fp8Codec, EncodeMatchesReferenceOnDenseSample) {
  const Fp8Format format = GetParam();
  const ReferenceEncoder reference(format);
  std::mt19937 rng(1234);
  // Low mantissa bits per (sign, exponent, high bits): 0 (the exact rounding ties and exact values), 1,
  // 0x100, 0x1ff, and random bits in the last slot.
  constexpr uint32_t kLowPatterns[] = {0u, 1u, 0x100u, 0x1ffu};
  constexpr int kSlots = 5;
  uint64_t checked = 0;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t high = 0; high < (1u << 14); ++high) {
        for (int slot = 0; slot < kSlots; ++slot) {
          const uint32_t low = slot < kSlots - 1 ? kLowPatterns[slot] : static_cast<uint32_t>(rng() & 0x1ffu);
          const uint32_t bits = (sign << 31) | (exponent << 23) | (high << 9) | low;
          const float x = from_bits(bits);
          ASSERT_EQ(encode(x, format), reference.encode(x)) << std::hex << "bits 0x" << bits;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2ull * 256 * (1u << 14) * 5);
}

TEST_P(Fp8Codec, EncodeMatchesReferenceExhaustively) {
  const char* flag = std::getenv("DSV4OPS_EXHAUSTIVE");
  if (!flag || std::string(flag) != "1") GTEST_SKIP() << "set DSV4OPS_EXHAUSTIVE=1 for all 2^32 fp32 patterns";
  const Fp8Format format = GetParam();
  const ReferenceEncoder reference(format);
  uint64_t mismatches = 0;
  for (uint64_t bits = 0; bits < (1ull << 32); ++bits) {
    const float x = from_bits(static_cast<uint32_t>(bits));
    mismatches += encode(x, format) != reference.encode(x);
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_P(Fp8Codec, SpecialsAndSaturation) {
  const Fp8Format format = GetParam();
  const bool ocp = format == Fp8Format::kOCP;
  const uint8_t max_code = ocp ? 0x7e : 0x7f;
  const float max_finite = ocp ? 448.0f : 240.0f;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(encode(max_finite, format), max_code);
  EXPECT_EQ(encode(-max_finite, format), max_code | 0x80);
  EXPECT_EQ(encode(inf, format), max_code);
  EXPECT_EQ(encode(-inf, format), max_code | 0x80);
  EXPECT_EQ(encode(std::numeric_limits<float>::max(), format), max_code);
  // Halfway to the next binade step above the max (464 OCP, 248 FNUZ) and beyond still saturate.
  EXPECT_EQ(encode(ocp ? 464.0f : 248.0f, format), max_code);
  EXPECT_EQ(encode(ocp ? 480.0f : 256.0f, format), max_code);
  const uint8_t nan_code = ocp ? 0x7f : 0x80;
  EXPECT_EQ(encode(std::nanf(""), format), nan_code);
  EXPECT_EQ(encode(-std::nanf(""), format), nan_code);
  EXPECT_EQ(encode(from_bits(0x7f800001u), format), nan_code);  // signalling NaN payload
  EXPECT_EQ(encode(from_bits(0xffc12345u), format), nan_code);
  EXPECT_EQ(encode(0.0f, format), 0x00);
  EXPECT_EQ(encode(-0.0f, format), ocp ? 0x80 : 0x00);
  EXPECT_EQ(encode(-1e-30f, format), ocp ? 0x80 : 0x00);  // rounds to a (signed) zero
  EXPECT_EQ(encode(from_bits(0x80000001u), format), ocp ? 0x80 : 0x00);  // -smallest fp32 subnormal
  // Smallest subnormal (2^-9 OCP, 2^-10 FNUZ) and the ties around it.
  const float unit = ocp ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -10);
  EXPECT_EQ(encode(unit, format), 0x01);
  EXPECT_EQ(encode(unit / 2, format), 0x00);             // tie between 0 and 1 -> even (0)
  EXPECT_EQ(encode(unit * 1.5f, format), 0x02);          // tie between 1 and 2 -> even (2)
  EXPECT_EQ(encode(unit * 2.5f, format), 0x02);          // tie between 2 and 3 -> even (2)
  EXPECT_EQ(encode(unit * 7.5f, format), 0x08);          // tie between 7 and the smallest normal -> 8
  EXPECT_EQ(encode(std::nextafter(unit / 2, 1.0f), format), 0x01);
  // Normal ties: 1 + 1/16 lies between 1 (even mantissa) and 1.125.
  const uint8_t one = ocp ? 0x38 : 0x40;
  EXPECT_EQ(encode(1.0625f, format), one);
  EXPECT_EQ(encode(1.1875f, format), one + 2);  // between 1.125 (odd) and 1.25 (even)
}

TEST_P(Fp8Codec, ClampedEncodeUsesQuantMax) {
  const Fp8Format format = GetParam();
  const bool ocp = format == Fp8Format::kOCP;
  auto clamped = [&](float x, float qmax) {
    return ocp ? dsv4::fp8_encode_clamped<Fp8Format::kOCP>(x, qmax) : dsv4::fp8_encode_clamped<Fp8Format::kFNUZ>(x, qmax);
  };
  const float qmax = ocp ? 448.0f : 224.0f;
  EXPECT_EQ(decode(clamped(1000.0f, qmax), format), qmax);
  EXPECT_EQ(decode(clamped(-1000.0f, qmax), format), -qmax);
  EXPECT_EQ(decode(clamped(230.0f, 224.0f), format), 224.0f);
  EXPECT_EQ(clamped(std::nanf(""), qmax), ocp ? 0x7f : 0x80);
  if (!ocp) EXPECT_EQ(decode(clamped(239.0f, 240.0f), format), 240.0f);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Codec, ::testing::Values(Fp8Format::kOCP, Fp8Format::kFNUZ),
                         [](const auto& info) { return info.param == Fp8Format::kOCP ? "OCP" : "FNUZ"; });

TEST(Fp8Formats, FnuzIsHalfOfOcpExceptSpecials) {
  for (int code = 0; code < 256; ++code) {
    if (code == 0x7f || code == 0xff || code == 0x80) continue;
    EXPECT_EQ(dsv4::fp8_decode<Fp8Format::kFNUZ>(code) * 2.0f, dsv4::fp8_decode<Fp8Format::kOCP>(code)) << code;
  }
}

TEST(Fp8Formats, OcpToFnuzByteKeepsValueWithDoubledScale) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t mapped = dsv4::ocp_byte_to_fnuz_byte(static_cast<uint8_t>(code));
    const float ocp = dsv4::fp8_decode<Fp8Format::kOCP>(code);
    const float fnuz_times_two = dsv4::fp8_decode<Fp8Format::kFNUZ>(mapped) * 2.0f;
    if (std::isnan(ocp)) {
      EXPECT_EQ(mapped, 0x80) << code;
    } else {
      EXPECT_EQ(fnuz_times_two, ocp) << code;  // -0 == +0 compares equal
    }
  }
  EXPECT_EQ(dsv4::ocp_byte_to_fnuz_byte(0x80), 0x00);
}

TEST(Fp8Formats, SameBytesForOcp448AndFnuz224) {
  // spec/kv_cache.md §7.2: values quantized to +-448 (OCP) and the same values halved, quantized to
  // +-224 (FNUZ), give identical bytes except negative zero.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-448.0f, 448.0f);
  for (int i = 0; i < 200000; ++i) {
    const float y = dist(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
    const uint8_t ocp = dsv4::fp8_encode_clamped<Fp8Format::kOCP>(y, 448.0f);
    const uint8_t fnuz = dsv4::fp8_encode_clamped<Fp8Format::kFNUZ>(y / 2, 224.0f);
    if (ocp == 0x80) EXPECT_EQ(fnuz, 0x00);
    else EXPECT_EQ(ocp, fnuz) << y;
  }
}

}  // namespace
