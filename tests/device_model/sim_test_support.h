// Shared helpers of the device-model tests: the chip being modelled, random inputs, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"
#include "wave_sim.h"

namespace dsv4_sim_test {

// The chip the test program's kernels were built for (DSV4_SIM_ARCH), set before any test runs.
inline bool is_gfx942() { return std::strcmp(DSV4_SIM_ARCH, "gfx942") == 0; }
// The encoding the chip's own conversions and matrix units use.
inline dsv4::Fp8Format chip_format() { return is_gfx942() ? dsv4::Fp8Format::kFNUZ : dsv4::Fp8Format::kOCP; }
inline float chip_quant_max() { return is_gfx942() ? 224.0f : 448.0f; }

struct Random {
  std::mt19937_64 engine;
  explicit Random(uint64_t seed) : engine(seed) {}
  float normal(float sigma = 1.0f) { return std::normal_distribution<float>(0.0f, sigma)(engine); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(engine); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine); }
  uint8_t byte() { return static_cast<uint8_t>(engine()); }
  std::vector<uint16_t> bf16(size_t n, float sigma = 1.0f) {
    std::vector<uint16_t> values(n);
    for (auto& v : values) v = dsv4::float_to_bf16_bits(normal(sigma));
    return values;
  }
  std::vector<float> floats(size_t n, float sigma = 1.0f) {
    std::vector<float> values(n);
    for (auto& v : values) v = normal(sigma);
    return values;
  }
  // FP8 codes of normal-distributed values in `format` (no NaN codes).
  std::vector<uint8_t> fp8(size_t n, dsv4::Fp8Format format, float sigma = 4.0f) {
    std::vector<uint8_t> codes(n);
    for (auto& c : codes) {
      const float x = normal(sigma);
      c = format == dsv4::Fp8Format::kOCP ? dsv4::fp8_encode_software<dsv4::Fp8Format::kOCP>(x)
                                          : dsv4::fp8_encode_software<dsv4::Fp8Format::kFNUZ>(x);
    }
    return codes;
  }
};

// Runs `body` on every thread of one block of `threads` threads, now.
inline void run_one_block(int threads, const std::function<void()>& body) {
  ASSERT_EQ(dsv4_sim::run_grid(dsv4_sim::Index3{1, 1, 1}, dsv4_sim::Index3{static_cast<uint32_t>(threads), 1, 1}, 0,
                               [](void* context) { (*static_cast<const std::function<void()>*>(context))(); },
                               const_cast<std::function<void()>*>(&body)),
            0);
}

// A cos || sin table of `rows` positions x 64 (fp32), angles as GPT-J RoPE makes them.
inline std::vector<float> rope_table(int64_t rows) {
  std::vector<float> table(rows * 64);
  for (int64_t p = 0; p < rows; ++p) {
    for (int i = 0; i < 32; ++i) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * i / 64.0);
      table[p * 64 + i] = static_cast<float>(std::cos(angle));
      table[p * 64 + 32 + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

// Byte-equal buffers, reporting the first difference.
template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << got.size() << ": got "
                                           << +got[i] << ", want " << +want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// |got - want| <= atol + rtol * |want| everywhere (NaN only where both are NaN).
inline ::testing::AssertionResult close_floats(const std::vector<float>& got, const std::vector<float>& want,
                                               double atol, double rtol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (both_nan || same_inf) continue;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << ": got " << got[i] << ", want "
                                           << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// bf16 values at most `ulps` units in the last place apart (same sign; +0 and -0 count as equal), e.g. where
// the GPU sums a row in another order than the CPU and a value near a rounding boundary may round the other
// way.
inline ::testing::AssertionResult bf16_within_ulps(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                                                   int ulps) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  const auto ordered = [](uint16_t bits) {  // monotonic in the value
    return (bits & 0x8000u) ? -static_cast<int>(bits & 0x7fffu) : static_cast<int>(bits);
  };
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(ordered(got[i]) - ordered(want[i])) > ulps) {
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << ": got "
                                           << dsv4::bf16_bits_to_float(got[i]) << ", want "
                                           << dsv4::bf16_bits_to_float(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::vector<float> bf16_to_floats(const std::vector<uint16_t>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = dsv4::bf16_bits_to_float(values[i]);
  return out;
}

}  // namespace dsv4_sim_test
