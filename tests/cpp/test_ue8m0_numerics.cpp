// UE8M0 scale numerics (dsv4/ue8m0.h): decode table, RCEIL encode (spec tables + a double-precision
// reference), lossless float -> byte conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "dsv4/ue8m0.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Ue8m0Decode, EveryByte) {
  for (int u = 0; u < 256; ++u) {
    const float value = dsv4::ue8m0_decode(static_cast<uint8_t>(u));
    if (u == 255) {
      EXPECT_TRUE(std::isnan(value));
    } else {
      EXPECT_EQ(static_cast<double>(value), std::ldexp(1.0, u - 127)) << u;
    }
  }
  EXPECT_EQ(dsv4::ue8m0_decode(0), from_bits(0x00400000u));
  EXPECT_EQ(dsv4::ue8m0_decode(127), 1.0f);
}

struct EncodeCase {
  float amax;
  float quant_max;
  float floor;
  int byte;
};

TEST(Ue8m0Encode, SpecTables) {
  const float inf = std::numeric_limits<float>::infinity();
  const float bf16_max = from_bits(0x7f7f0000u);
  const EncodeCase cases[] = {
      // spec/wo_a.md §3.4 (amax floor 1e-8)
      {0.0f, 448.0f, 1e-8f, 92}, {0.0f, 240.0f, 1e-8f, 93}, {0.0f, 224.0f, 1e-8f, 93},
      {1.0f, 448.0f, 1e-8f, 119}, {1.0f, 240.0f, 1e-8f, 120}, {1.0f, 224.0f, 1e-8f, 120},
      {448.0f, 448.0f, 1e-8f, 127}, {240.0f, 240.0f, 1e-8f, 127}, {224.0f, 224.0f, 1e-8f, 127},
      {448.0f, 240.0f, 1e-8f, 128}, {448.0f, 224.0f, 1e-8f, 128},
      {bf16_max, 448.0f, 1e-8f, 247}, {bf16_max, 240.0f, 1e-8f, 248}, {bf16_max, 224.0f, 1e-8f, 248},
      {inf, 448.0f, 1e-8f, 255}, {-inf, 224.0f, 1e-8f, 255}, {std::nanf(""), 448.0f, 1e-8f, 255},
      // spec/kv_cache.md §8.1 (amax floor 1e-4): e = -22 for OCP, one more for FNUZ 224
      {0.0f, 448.0f, 1e-4f, 105}, {0.0f, 224.0f, 1e-4f, 106}, {1e-5f, 448.0f, 1e-4f, 105},
      // a quotient just above a power of two rounds up; exactly a power of two does not
      {std::nextafter(448.0f, 1e9f), 448.0f, 1e-8f, 128}, {896.0f, 448.0f, 1e-8f, 128},
      {std::nextafter(896.0f, 1e9f), 448.0f, 1e-8f, 129},
      // sign of amax is ignored; a subnormal quotient gives byte 1, a zero quotient byte 0
      {-1.0f, 448.0f, 1e-8f, 119}, {from_bits(0x00000100u), 448.0f, 0.0f, 1}, {0.0f, 448.0f, 0.0f, 0},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(dsv4::ue8m0_encode_rceil(c.amax, c.quant_max, c.floor), c.byte)
        << "amax " << c.amax << " quant_max " << c.quant_max << " floor " << c.floor;
  }
}

TEST(Ue8m0Encode, MatchesCeilLog2OfTheFp32Quotient) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits(0x00800000u, 0x7f7fffffu);  // positive normal floats
  const float quant_maxes[] = {448.0f, 240.0f, 224.0f};
  for (int i = 0; i < 2000000; ++i) {
    const float amax = i % 4 == 0 ? std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100) : from_bits(bits(rng));
    for (float qmax : quant_maxes) {
      const float quotient = amax / qmax;  // the rule: fp32 division
      if (quotient < std::numeric_limits<float>::min()) continue;  // subnormal quotients: SpecTables
      const double expected = std::ceil(std::log2(static_cast<double>(quotient))) + 127.0;
      const int byte = dsv4::ue8m0_encode_rceil(amax, qmax, 0.0f);
      ASSERT_EQ(byte, static_cast<int>(std::min(expected, 255.0))) << amax << " / " << qmax;
      // RCEIL guarantee: nothing clips.
      ASSERT_LE(static_cast<double>(amax) / std::ldexp(1.0, byte - 127), static_cast<double>(qmax) * (1 + 1e-7));
    }
  }
}

TEST(Ue8m0Lossless, AcceptsExactlyThePowersOfTwoInRange) {
  uint8_t byte = 0;
  for (int e = -127; e <= 127; ++e) {
    ASSERT_EQ(dsv4::ue8m0_from_float_exact(std::ldexp(1.0f, e), &byte), dsv4::Ue8m0Refusal::kNone) << e;
    ASSERT_EQ(byte, e + 127);
  }
  const struct {
    float value;
    dsv4::Ue8m0Refusal refusal;
  } refused[] = {
      {0.0f, dsv4::Ue8m0Refusal::kNotPositive},
      {-0.0f, dsv4::Ue8m0Refusal::kNotPositive},
      {-1.0f, dsv4::Ue8m0Refusal::kNotPositive},
      {0.75f, dsv4::Ue8m0Refusal::kNotPowerOfTwo},
      {3.0f, dsv4::Ue8m0Refusal::kNotPowerOfTwo},
      {std::nextafter(1.0f, 2.0f), dsv4::Ue8m0Refusal::kNotPowerOfTwo},
      {std::numeric_limits<float>::infinity(), dsv4::Ue8m0Refusal::kNotFinite},
      {-std::numeric_limits<float>::infinity(), dsv4::Ue8m0Refusal::kNotFinite},
      {std::nanf(""), dsv4::Ue8m0Refusal::kNotFinite},
      {std::ldexp(1.0f, -128), dsv4::Ue8m0Refusal::kOutOfRange},
      {std::ldexp(1.0f, -149), dsv4::Ue8m0Refusal::kOutOfRange},
      {from_bits(0x00300000u), dsv4::Ue8m0Refusal::kNotPowerOfTwo},  // subnormal, two bits set
  };
  for (const auto& c : refused) {
    EXPECT_EQ(dsv4::ue8m0_from_float_exact(c.value, &byte), c.refusal) << c.value;
    EXPECT_EQ(byte, 0xff) << c.value;
  }
}

TEST(Ue8m0Lossless, EveryExponentAndMantissaSample) {
  // Accepted iff the bit pattern is a power of two in range; decode(byte) gives the value back.
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t mantissa : {0u, 1u, 0x400000u, 0x200000u, 0x7fffffu, 0x123456u}) {
        const uint32_t bits = (sign << 31) | (exponent << 23) | mantissa;
        const float value = from_bits(bits);
        uint8_t byte = 0;
        const bool accepted = dsv4::ue8m0_from_float_exact(value, &byte) == dsv4::Ue8m0Refusal::kNone;
        const bool power_of_two_in_range =
            sign == 0 && ((exponent >= 1 && exponent <= 254 && mantissa == 0) || (exponent == 0 && mantissa == 0x400000u));
        ASSERT_EQ(accepted, power_of_two_in_range) << std::hex << bits;
        if (accepted) ASSERT_EQ(dsv4::ue8m0_decode(byte), value);
      }
    }
  }
}

}  // namespace
