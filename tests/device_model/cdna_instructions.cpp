// The CDNA (gfx942 / gfx950) matrix and conversion instructions of wave_sim.h, lane by lane, on the wave64
// model's wave exchange.
#include <cmath>
#include <cstring>

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"
#include "wave_sim.h"

static_assert(dsv4_sim::kWaveSize == 64, "the CDNA instructions run on 64-lane waves");

namespace dsv4_sim {

// ---- matrix instructions ---------------------------------------------------------------------------
// Every lane deposits its operands; each lane then computes its own four accumulator values from all of
// them. Products are exact in double and summed there, then added to the accumulator once: the unit's
// own order and internal precision are not modelled (tests compare with the tolerance of an fp32 sum).
namespace {

// 16 x 16 output tiles: lane l holds D[4 (l / 16) + r][l % 16] in accumulator r.
int acc_row(int lane, int r) { return 4 * (lane / 16) + r; }
int acc_col(int lane) { return lane % 16; }

struct MatrixOperands {
  uint32_t a[8];
  uint32_t b[8];
  uint32_t scale_a;
  uint32_t scale_b;
};
static_assert(sizeof(MatrixOperands) <= kSlotBytes, "deposit size");

float bf16_value(const uint32_t* words, int index) {
  const uint32_t word = words[index / 2];
  return dsv4::bf16_bits_to_float(static_cast<uint16_t>(index % 2 ? word >> 16 : word & 0xffffu));
}

uint8_t byte_of(const uint32_t* words, int index) {
  return static_cast<uint8_t>(words[index / 4] >> (8 * (index % 4)));
}

float fp8_value(uint8_t code, Fp8Kind kind) {
  return kind == Fp8Kind::kFnuz ? dsv4::fp8_decode<dsv4::Fp8Format::kFNUZ>(code)
                                : dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(code);
}

// For each of the lane's accumulators: c[r] += sum over the k groups g (lanes 16 g + row of A, 16 g + col
// of B) of group_product(lane of A, lane of B).
template <typename GroupProduct>
void accumulate(float (&c)[4], const MatrixOperands& mine, const void* site, GroupProduct group_product) {
  wave_exchange(&mine, sizeof mine, kWaveSize, site);
  const int lane = lane_id();
  for (int r = 0; r < 4; ++r) {
    const int row = acc_row(lane, r), col = acc_col(lane);
    double sum = 0.0;
    for (int g = 0; g < 4; ++g) {
      MatrixOperands a_lane, b_lane;
      std::memcpy(&a_lane, deposit_of(16 * g + row), sizeof a_lane);
      std::memcpy(&b_lane, deposit_of(16 * g + col), sizeof b_lane);
      sum += group_product(a_lane, b_lane);
    }
    c[r] = static_cast<float>(static_cast<double>(c[r]) + sum);
  }
}

// The lane's operand words.
template <int kWords>
MatrixOperands operands_of(const uint32_t (&a)[kWords], const uint32_t (&b)[kWords]) {
  static_assert(kWords <= 8, "operand words");
  MatrixOperands mine{};
  std::memcpy(mine.a, a, sizeof a);
  std::memcpy(mine.b, b, sizeof b);
  return mine;
}

// Products of bf16 operands: a lane holds 2 values per word, k group g's values in the lanes of group g.
template <int kWords>
void mfma_bf16(float (&c)[4], const uint32_t (&a)[kWords], const uint32_t (&b)[kWords], const void* site) {
  accumulate(c, operands_of(a, b), site, [](const MatrixOperands& x, const MatrixOperands& y) {
    double sum = 0.0;
    for (int j = 0; j < 2 * kWords; ++j) sum += static_cast<double>(bf16_value(x.a, j)) * bf16_value(y.b, j);
    return sum;
  });
}

}  // namespace

void mfma_16x16x16_bf16(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], const void* site) {
  mfma_bf16(c, a, b, site);
}

void mfma_16x16x32_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], const void* site) {
  mfma_bf16(c, a, b, site);
}

void mfma_16x16x32_fp8(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], Fp8Kind kind,
                       const void* site) {
  accumulate(c, operands_of(a, b), site, [kind](const MatrixOperands& x, const MatrixOperands& y) {
    double sum = 0.0;
    for (int j = 0; j < 8; ++j) {
      sum += static_cast<double>(fp8_value(byte_of(x.a, j), kind)) * fp8_value(byte_of(y.b, j), kind);
    }
    return sum;
  });
}

void mfma_scale_16x16x128_fp8(float (&c)[4], const uint32_t (&a)[8], const uint32_t (&b)[8], uint32_t scale_a,
                              int opsel_a, uint32_t scale_b, int opsel_b, const void* site) {
  MatrixOperands mine = operands_of(a, b);
  mine.scale_a = (scale_a >> (8 * opsel_a)) & 0xffu;
  mine.scale_b = (scale_b >> (8 * opsel_b)) & 0xffu;
  // Lane 16 g + i holds 32 codes of k group g (k in [32 g, 32 g + 32)) for row / column i and that group's
  // E8M0 byte: 2^(byte - 127), NaN for 255.
  accumulate(c, mine, site, [](const MatrixOperands& x, const MatrixOperands& y) {
    if (x.scale_a == 255 || y.scale_b == 255) return std::nan("");
    double sum = 0.0;
    for (int j = 0; j < 32; ++j) {
      sum += static_cast<double>(fp8_value(byte_of(x.a, j), Fp8Kind::kOcp)) * fp8_value(byte_of(y.b, j), Fp8Kind::kOcp);
    }
    return std::ldexp(sum, static_cast<int>(x.scale_a) - 127 + static_cast<int>(y.scale_b) - 127);
  });
}

// ---- conversion ----------------------------------------------------------------------------------
namespace {
template <dsv4::Fp8Format F>
uint32_t convert_no_saturation(float x) {
  using T = dsv4::Fp8Traits<F>;
  // Past the largest finite value by half its step or more (ties away from the odd FNUZ 0x7F, towards
  // the even OCP 0x7E), and Inf / NaN: the NaN code.
  const float magnitude = std::fabs(x);
  const bool overflow = F == dsv4::Fp8Format::kFNUZ ? !(magnitude < 248.0f) : !(magnitude <= 464.0f);
  if (overflow) return F == dsv4::Fp8Format::kFNUZ ? 0x80u : (std::signbit(x) ? 0xFFu : 0x7Fu);
  uint32_t code = dsv4::fp8_encode_software<F>(x);
  if ((code & 0x7Fu) == 0 && std::signbit(x)) code = 0x80u;  // the unit keeps a zero's sign
  return code;
}
}  // namespace

int cvt_pk_fp8_f32(float lo, float hi, int old, bool high_word, Fp8Kind kind) {
  const auto convert = [kind](float x) {
    return kind == Fp8Kind::kFnuz ? convert_no_saturation<dsv4::Fp8Format::kFNUZ>(x)
                                  : convert_no_saturation<dsv4::Fp8Format::kOCP>(x);
  };
  const uint32_t pair = convert(lo) | (convert(hi) << 8);
  const uint32_t word = static_cast<uint32_t>(old);
  return static_cast<int>(high_word ? (word & 0xffffu) | (pair << 16) : (word & 0xffff0000u) | pair);
}

}  // namespace dsv4_sim
