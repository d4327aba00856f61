// The NVIDIA PTX instructions of wave_sim.h, lane by lane, on the 32-lane model's wave exchange.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// The m16n8 mma.sync forms, `kPerWord` k values a register (2 bf16 or 4 e4m3 codes; K = 8 kPerWord),
// value(word, k) the one of k in a word. Each lane computes its four D values from every lane's fragments:
// products exact in double, summed there and added to the accumulator once (the tensor core's own order and
// internal precision are not modelled; tests compare with the tolerance of an fp32 sum).
template <int kPerWord, typename Value>
void mma_m16n8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site, Value value) {
  constexpr int kK = 8 * kPerWord, kHalfK = kK / 2;
  MmaFragments mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  wave_exchange(&mine, sizeof mine, kWaveSize, site);
  // A[row][k] sits in lane 4 (row % 8) + (k % kHalfK) / kPerWord, register (row / 8) + 2 (k / kHalfK); B[k][col]
  // in lane 4 col + (k % kHalfK) / kPerWord, register k / kHalfK.
  const auto fragments_of = [](int lane) {
    MmaFragments f;
    std::memcpy(&f, deposit_of(lane), sizeof f);
    return f;
  };
  const int lane = lane_id(), group = lane / 4, thread_in_group = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = group + 8 * (e / 2), col = 2 * thread_in_group + e % 2;
    double sum = 0.0;
    for (int k = 0; k < kK; ++k) {
      const MmaFragments a_lane = fragments_of(4 * (row % 8) + (k % kHalfK) / kPerWord);
      const MmaFragments b_lane = fragments_of(4 * col + (k % kHalfK) / kPerWord);
      sum += static_cast<double>(value(a_lane.a[row / 8 + 2 * (k / kHalfK)], k)) * value(b_lane.b[k / kHalfK], k);
    }
    d[e] = static_cast<float>(static_cast<double>(d[e]) + sum);
  }
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site) {
  mma_m16n8<2>(d, a, b, site, [](uint32_t word, int k) { return bf16_half(word, k % 2); });
}

void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site) {
  mma_m16n8<4>(d, a, b, site, [](uint32_t word, int k) {
    return dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(static_cast<uint8_t>(word >> (8 * (k % 4))));
  });
}

uint16_t cvt_rn_satfinite_e4m3x2_f32(float high, float low) {
  // fp8_encode_software saturates finite overflow and infinities to the largest finite code and keeps a
  // zero's sign, as .satfinite does; NaN becomes the canonical 0x7F.
  const auto convert = [](float x) -> uint32_t {
    return std::isnan(x) ? 0x7Fu : dsv4::fp8_encode_software<dsv4::Fp8Format::kOCP>(x);
  };
  return static_cast<uint16_t>(convert(low) | (convert(high) << 8));
}

namespace {

// f16 bits to their value, and a value to f16 bits.
float f16_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  float magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return (bits & 0x8000u) ? -magnitude : magnitude;
}

// Rounded to nearest even, NaN to 0x7FFF (the product of two f16 is exact in double, so rounding
// it once from there is the instruction's rounding).
uint16_t f16_bits(double value) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  const double magnitude = std::fabs(value);
  if (std::isnan(value)) return 0x7FFFu;
  if (magnitude >= 65520.0) return sign | 0x7C00u;  // past the largest finite value by half its step: Inf
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent - 1), 2^exponent)
  const int step_exponent = std::max(exponent - 11, -24);  // 11 significant bits; subnormals step 2^-24
  const double steps = std::nearbyint(std::ldexp(magnitude, -step_exponent));  // ties to even (default mode)
  const double rounded = std::ldexp(steps, step_exponent);
  if (rounded == 0.0) return sign;
  int rounded_exponent;
  std::frexp(rounded, &rounded_exponent);
  if (rounded_exponent <= -14) return sign | static_cast<uint16_t>(std::ldexp(rounded, 24));  // subnormal
  const uint16_t biased = static_cast<uint16_t>(rounded_exponent - 1 + 15);
  const uint16_t mantissa = static_cast<uint16_t>(std::ldexp(rounded, 11 - rounded_exponent)) & 0x3FFu;
  return sign | static_cast<uint16_t>(biased << 10) | mantissa;
}

}  // namespace

void cvt_rn_f16x2_e4m3x2_halves(uint32_t four_codes, uint32_t& first, uint32_t& second) {
  // Every e4m3 value is an f16 (or zero): the rounding is exact.
  const auto pair = [](uint32_t two_codes) {
    const auto to_f16 = [](uint8_t code) -> uint32_t {
      return f16_bits(dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(code));
    };
    return to_f16(static_cast<uint8_t>(two_codes)) | (to_f16(static_cast<uint8_t>(two_codes >> 8)) << 16);
  };
  first = pair(four_codes & 0xFFFFu);
  second = pair(four_codes >> 16);
}

uint32_t cvt_rn_bf16x2_f32(float high, float low) {
  const auto convert = [](float x) -> uint32_t { return std::isnan(x) ? 0x7FFFu : dsv4::float_to_bf16_bits(x); };
  return convert(low) | (convert(high) << 16);
}

void cvt_f32_f16_halves(uint32_t halves, float& low, float& high) {
  low = f16_value(static_cast<uint16_t>(halves));
  high = f16_value(static_cast<uint16_t>(halves >> 16));
}

uint32_t mul_rn_f16x2(uint32_t a, uint32_t b) {
  const auto product = [](uint32_t x, uint32_t y) {
    return f16_bits(static_cast<double>(f16_value(static_cast<uint16_t>(x))) * f16_value(static_cast<uint16_t>(y)));
  };
  return product(a, b) | (static_cast<uint32_t>(product(a >> 16, b >> 16)) << 16);
}

uint32_t prmt_b32(uint32_t x, uint32_t y, uint32_t selector) {
  const uint64_t bytes = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t result = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (selector >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;  // sign replication
    result |= byte << (8 * i);
  }
  return result;
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t window_address, bool transpose, const void* site) {
  wave_exchange(&window_address, sizeof window_address, kWaveSize, site);
  const auto row = [](int matrix, int row_index) {
    uint32_t address;
    std::memcpy(&address, deposit_of(8 * matrix + row_index), sizeof address);
    return shared_pointer(address);
  };
  const int lane = lane_id();
  for (int i = 0; i < 4; ++i) {
    if (!transpose) {
      std::memcpy(&r[i], row(i, lane / 4) + 4 * (lane % 4), 4);  // row lane / 4, elements 2 (lane % 4), + 1
    } else {
      uint16_t low, high;  // column lane / 4, rows 2 (lane % 4) and + 1
      std::memcpy(&low, row(i, 2 * (lane % 4)) + 2 * (lane / 4), 2);
      std::memcpy(&high, row(i, 2 * (lane % 4) + 1) + 2 * (lane / 4), 2);
      r[i] = low | (static_cast<uint32_t>(high) << 16);
    }
  }
}

// ---- wgmma ---------------------------------------------------------------------------------------------
namespace {

struct Descriptor {
  uint32_t start, leading, stride;
  int swizzle_bits;  // log2 of the 16-byte chunks a swizzle row spans: 128B 3, 64B 2, 32B 1
};

Descriptor decode_descriptor(uint64_t bits) {
  const int mode = static_cast<int>(bits >> 62);
  if (mode == 0) model_error("wgmma descriptors without swizzling are not modelled");
  return {static_cast<uint32_t>(bits & 0x3FFFu) << 4, static_cast<uint32_t>((bits >> 16) & 0x3FFFu) << 4,
          static_cast<uint32_t>((bits >> 32) & 0x3FFFu) << 4, 4 - mode};
}

// The swizzle: the 16-byte chunk index (address bits 4..) XOR the row within the pattern (bits 7..).
uint32_t swizzled(uint32_t address, int swizzle_bits) {
  return address ^ (((address >> 7) & ((1u << swizzle_bits) - 1u)) << 4);
}

// Element (row, byte `k_byte` along K) of a K-major operand: rows of 16 << swizzle_bits bytes, 8-row groups
// `stride` bytes apart.
const unsigned char* k_major_element(const Descriptor& d, int row, int k_byte) {
  const uint32_t row_bytes = 16u << d.swizzle_bits;
  return shared_pointer(swizzled(d.start + (row / 8) * d.stride + (row % 8) * row_bytes + k_byte, d.swizzle_bits));
}

// Element (k, n) of an MN-major operand of 16-bit elements in the 128-byte swizzle: 64 of n along each
// 128-byte row, 8-row groups along k `stride` bytes apart, 64-wide blocks of n `leading` bytes apart.
const unsigned char* mn_major_element(const Descriptor& d, int k, int n) {
  if (d.swizzle_bits != 3) model_error("MN-major wgmma operands other than 128-byte swizzled are not modelled");
  return shared_pointer(swizzled(d.start + (n / 64) * d.leading + (k / 8) * d.stride + (k % 8) * 128 + (n % 64) * 2,
                                 3));
}

double element_value(const unsigned char* p, MatrixElement element) {
  if (element == MatrixElement::kE4m3) return dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(*p);
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return element == MatrixElement::kBf16 ? dsv4::bf16_bits_to_float(bits) : f16_value(bits);
}

// D's rows and columns for this thread's accumulator i: warp w of the warpgroup holds rows 16 w .. + 15.
struct Place {
  int row, col;
};
Place accumulator_place(int thread_in_group, int i) {
  const int warp = thread_in_group / 32, lane = thread_in_group % 32, r = i % 4;
  return {16 * warp + lane / 4 + 8 * (r / 2), 8 * (i / 4) + 2 * (lane % 4) + r % 2};
}

int warpgroup_thread() {
  const Index3& t = thread_index();
  const Index3& block = block_dim();
  return static_cast<int>((t.x + block.x * (t.y + block.y * t.z)) % 128);
}

}  // namespace

void wgmma(float* d, int n, uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate, MatrixElement element,
           bool b_mn_major) {
  const int thread = warpgroup_thread();
  defer(AsyncUnit::kMatrix, [=] {
    const Descriptor a = decode_descriptor(a_descriptor), b = decode_descriptor(b_descriptor);
    const int element_bytes = element == MatrixElement::kE4m3 ? 1 : 2;
    const int k_count = 32 / element_bytes;
    for (int i = 0; i < n / 2; ++i) {
      const Place place = accumulator_place(thread, i);
      double sum = 0.0;
      for (int k = 0; k < k_count; ++k) {
        const double a_value = element_value(k_major_element(a, place.row, k * element_bytes), element);
        const unsigned char* b_element =
            b_mn_major ? mn_major_element(b, k, place.col) : k_major_element(b, place.col, k * element_bytes);
        sum += a_value * element_value(b_element, element);
      }
      d[i] = static_cast<float>((accumulate ? static_cast<double>(d[i]) : 0.0) + sum);
    }
  });
}

void wgmma_a_registers_f16(float* d, int n, const uint32_t (&a)[4], uint64_t b_descriptor, bool accumulate,
                           const void* site) {
  uint32_t mine[4];
  std::memcpy(mine, a, sizeof mine);
  wave_exchange(mine, sizeof mine, kWaveSize, site);
  // The warp's 16 x 16 A: A[row][k] in lane 4 (row % 8) + (k % 8) / 2, word row / 8 + 2 (k / 8), half k % 2.
  std::vector<float> a_rows(16 * 16);
  for (int row = 0; row < 16; ++row) {
    for (int k = 0; k < 16; ++k) {
      uint32_t words[4];
      std::memcpy(words, deposit_of(4 * (row % 8) + (k % 8) / 2), sizeof words);
      a_rows[row * 16 + k] = f16_value(static_cast<uint16_t>(words[row / 8 + 2 * (k / 8)] >> (16 * (k % 2))));
    }
  }
  const int thread = warpgroup_thread();
  defer(AsyncUnit::kMatrix, [=] {
    const Descriptor b = decode_descriptor(b_descriptor);
    for (int i = 0; i < n / 2; ++i) {
      const Place place = accumulator_place(thread, i);
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) {
        sum += static_cast<double>(a_rows[(place.row % 16) * 16 + k]) *
               element_value(k_major_element(b, place.col, 2 * k), MatrixElement::kF16);
      }
      d[i] = static_cast<float>((accumulate ? static_cast<double>(d[i]) : 0.0) + sum);
    }
  });
}

}  // namespace dsv4_sim
