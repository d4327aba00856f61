// The NVIDIA PTX instructions of wave_sim.h, lane by lane, on the 32-lane model's wave exchange.
#include <cmath>
#include <cstring>

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"
#include "wave_sim.h"

static_assert(dsv4_sim::kWaveSize == 32, "the NVIDIA instructions run on 32-lane warps");

namespace dsv4_sim {

namespace {

struct MmaFragments {
  uint32_t a[4];
  uint32_t b[2];
};

float bf16_half(uint32_t word, int half) {
  return dsv4::bf16_bits_to_float(static_cast<uint16_t>(half ? word >> 16 : word & 0xffffu));
}

}  // namespace

// Each lane computes its four D values from every lane's fragments: products exact in double, summed there and
// added to the accumulator once (the tensor core's own order and internal precision are not modelled; tests
// compare with the tolerance of an fp32 sum).
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site) {
  MmaFragments mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  wave_exchange(&mine, sizeof mine, kWaveSize, site);
  // A[row][k] sits in lane 4 (row % 8) + (k % 8) / 2, register (row / 8) + 2 (k / 8), half k % 2; B[k][col]
  // in lane 4 col + (k % 8) / 2, register k / 8, half k % 2.
  const auto fragments_of = [](int lane) {
    MmaFragments f;
    std::memcpy(&f, deposit_of(lane), sizeof f);
    return f;
  };
  const int lane = lane_id(), group = lane / 4, thread_in_group = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = group + 8 * (e / 2), col = 2 * thread_in_group + e % 2;
    double sum = 0.0;
    for (int k = 0; k < 16; ++k) {
      const MmaFragments a_lane = fragments_of(4 * (row % 8) + (k % 8) / 2);
      const MmaFragments b_lane = fragments_of(4 * col + (k % 8) / 2);
      sum += static_cast<double>(bf16_half(a_lane.a[row / 8 + 2 * (k / 8)], k % 2)) *
             bf16_half(b_lane.b[k / 8], k % 2);
    }
    d[e] = static_cast<float>(static_cast<double>(d[e]) + sum);
  }
}

uint16_t cvt_rn_satfinite_e4m3x2_f32(float high, float low) {
  // fp8_encode_software saturates finite overflow and infinities to the largest finite code and keeps a
  // zero's sign, as .satfinite does; NaN becomes the canonical 0x7F.
  const auto convert = [](float x) -> uint32_t {
    return std::isnan(x) ? 0x7Fu : dsv4::fp8_encode_software<dsv4::Fp8Format::kOCP>(x);
  };
  return static_cast<uint16_t>(convert(low) | (convert(high) << 8));
}

void cvt_rn_f16x2_e4m3x2_halves(uint32_t four_codes, uint32_t& first, uint32_t& second) {
  // Every e4m3 value is a normal f16 (or zero): the exponent rebiased, the 3 mantissa bits at the top of 10.
  const auto to_f16 = [](uint8_t code) -> uint32_t {
    const uint32_t sign = (code & 0x80u) << 8;
    if ((code & 0x7Fu) == 0x7Fu) return sign | 0x7FFFu;  // NaN
    const float value = std::fabs(dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(code));
    if (value == 0.0f) return sign;
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    const uint32_t exponent = ((bits >> 23) & 0xFFu) - 127u + 15u;
    return sign | (exponent << 10) | ((bits >> 13) & 0x3FFu);
  };
  const auto pair = [&to_f16](uint32_t two_codes) {
    return to_f16(static_cast<uint8_t>(two_codes)) | (to_f16(static_cast<uint8_t>(two_codes >> 8)) << 16);
  };
  first = pair(four_codes & 0xFFFFu);
  second = pair(four_codes >> 16);
}

}  // namespace dsv4_sim
