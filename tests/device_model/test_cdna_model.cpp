// The wave64 (CDNA) model itself: its matrix instructions against plain matrix products with the operand
// layouts of AMD's matrix instruction tables, its conversion, barriers and wave exchanges. Also sets the chip the
// program models (gfx942 or gfx950, from the build) before any test runs.
#include <functional>

#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;
using dsv4_sim::Index3;

// 32 compute units: grids sized to one wave of blocks stay small, and the mHC dot products still split K
// into the 33 or more slices that select their 32-lane epilogue.
const bool chip_is_set = [] {
  dsv4_sim::set_chip(is_gfx942() ? dsv4_sim::ChipModel{"gfx942:sramecc+:xnack-", 64 * 1024, 32}
                                 : dsv4_sim::ChipModel{"gfx950", 160 * 1024, 32});
  return true;
}();

// D (16 x 16) = A (16 x K) B (K x 16) + C, each lane's operands filled from the matrices by the table's
// layout: lane l holds row (A) / column (B) l % 16 and k values [kPerLane (l / 16), + kPerLane), and D
// rows 4 (l / 16) .. + 3 of column l % 16.
template <int kK, typename Element, typename Run>
void check_matrix_instruction(const std::vector<Element>& a, const std::vector<Element>& b,
                              const std::function<double(Element)>& value, double scale, Run run) {
  constexpr int kPerLane = kK / 4;
  std::vector<float> c(256), d(256, 0.0f);
  Random random(7);
  for (auto& x : c) x = random.normal();
  run_one_block(64, [&] {
    const int lane = dsv4_sim::lane_id();
    std::vector<Element> a_lane(kPerLane), b_lane(kPerLane);
    for (int j = 0; j < kPerLane; ++j) {
      a_lane[j] = a[(lane % 16) * kK + kPerLane * (lane / 16) + j];
      b_lane[j] = b[(kPerLane * (lane / 16) + j) * 16 + lane % 16];
    }
    float acc[4];
    for (int r = 0; r < 4; ++r) acc[r] = c[(4 * (lane / 16) + r) * 16 + lane % 16];
    run(acc, a_lane, b_lane);
    for (int r = 0; r < 4; ++r) d[(4 * (lane / 16) + r) * 16 + lane % 16] = acc[r];
  });
  std::vector<float> want(256);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double sum = 0.0;
      for (int k = 0; k < kK; ++k) sum += value(a[i * kK + k]) * value(b[k * 16 + j]);
      want[i * 16 + j] = static_cast<float>(c[i * 16 + j] + scale * sum);
    }
  }
  EXPECT_TRUE(close_floats(d, want, 1e-5, 1e-6));
}

template <int kWords, typename Element>
void pack(uint32_t (&words)[kWords], const std::vector<Element>& values) {
  static_assert(sizeof(Element) * 4 * kWords >= 4, "words");
  std::memset(words, 0, sizeof words);
  std::memcpy(words, values.data(), values.size() * sizeof(Element));
}

// A bf16 instruction of depth kK: a lane holds kK / 4 values, kK / 8 words, of A and of B.
template <int kK, typename Instruction>
void check_bf16_instruction(uint64_t seed, Instruction instruction) {
  Random random(seed);
  const std::vector<uint16_t> a = random.bf16(16 * kK), b = random.bf16(kK * 16);
  check_matrix_instruction<kK, uint16_t>(a, b, [](uint16_t x) { return dsv4::bf16_bits_to_float(x); }, 1.0,
                                         [&](float (&acc)[4], const auto& a_lane, const auto& b_lane) {
                                           uint32_t aw[kK / 8], bw[kK / 8];
                                           pack(aw, a_lane);
                                           pack(bw, b_lane);
                                           instruction(acc, aw, bw, nullptr);
                                         });
}

TEST(WaveModel, Mfma16x16x16Bf16FollowsTheTableLayout) { check_bf16_instruction<16>(1, dsv4_sim::mfma_16x16x16_bf16); }

TEST(WaveModel, Mfma16x16x32Bf16FollowsTheTableLayout) { check_bf16_instruction<32>(2, dsv4_sim::mfma_16x16x32_bf16); }

TEST(WaveModel, Mfma16x16x32Fp8DecodesTheChipsEncoding) {
  Random random(3);
  const dsv4::Fp8Format format = chip_format();
  const std::vector<uint8_t> a = random.fp8(16 * 32, format), b = random.fp8(32 * 16, format);
  const auto kind = is_gfx942() ? dsv4_sim::Fp8Kind::kFnuz : dsv4_sim::Fp8Kind::kOcp;
  const auto decode = [format](uint8_t x) -> double {
    return format == dsv4::Fp8Format::kOCP ? dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(x)
                                           : dsv4::fp8_decode<dsv4::Fp8Format::kFNUZ>(x);
  };
  check_matrix_instruction<32, uint8_t>(a, b, decode, 1.0,
                                        [kind](float (&acc)[4], const auto& a_lane, const auto& b_lane) {
                                          uint32_t aw[2], bw[2];
                                          pack(aw, a_lane);
                                          pack(bw, b_lane);
                                          dsv4_sim::mfma_16x16x32_fp8(acc, aw, bw, kind, nullptr);
                                        });
}

TEST(WaveModel, ScaledMfma16x16x128AppliesBothScaleBytes) {
  Random random(4);
  const std::vector<uint8_t> a = random.fp8(16 * 128, dsv4::Fp8Format::kOCP);
  const std::vector<uint8_t> b = random.fp8(128 * 16, dsv4::Fp8Format::kOCP);
  // One byte for every lane: the same for each row's / column's four k groups, as 2^(130 - 127) * 2^(120 - 127).
  check_matrix_instruction<128, uint8_t>(
      a, b, [](uint8_t x) -> double { return dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(x); }, std::ldexp(1.0, 3 - 7),
      [](float (&acc)[4], const auto& a_lane, const auto& b_lane) {
        uint32_t aw[8], bw[8];
        pack(aw, a_lane);
        pack(bw, b_lane);
        dsv4_sim::mfma_scale_16x16x128_fp8(acc, aw, bw, 130u << 8, 1, 120u, 0, nullptr);
      });
}

TEST(WaveModel, ConversionRoundsToNearestEvenKeepsZeroSignAndDoesNotSaturate) {
  using dsv4_sim::Fp8Kind;
  // FNUZ (bias 8): 1.0 = 0x40; 240 = 0x7F; 248 (halfway past 240, odd code) overflows to NaN 0x80; -0 keeps
  // its sign as 0x80 (which callers must rewrite).
  EXPECT_EQ(dsv4_sim::cvt_pk_fp8_f32(1.0f, 240.0f, 0, false, Fp8Kind::kFnuz), 0x7F40);
  EXPECT_EQ(dsv4_sim::cvt_pk_fp8_f32(244.0f, 248.0f, 0, false, Fp8Kind::kFnuz), 0x807F);
  EXPECT_EQ(dsv4_sim::cvt_pk_fp8_f32(-0.0f, 0.0f, 0, false, Fp8Kind::kFnuz), 0x0080);
  // OCP (bias 7): 1.0 = 0x38; 464 (halfway past 448, even code) rounds to 0x7E, beyond it is NaN; the pair
  // goes to the high word when asked, the low word kept.
  EXPECT_EQ(dsv4_sim::cvt_pk_fp8_f32(1.0f, 464.0f, 0, false, Fp8Kind::kOcp), 0x7E38);
  EXPECT_EQ(dsv4_sim::cvt_pk_fp8_f32(-465.0f, 1.0f, 0x1234, true, Fp8Kind::kOcp), static_cast<int>(0x38FF1234u));
}

TEST(WaveModel, BarriersOrderBlockThreadsAndWaveExchangesSeeEveryLane) {
  std::vector<int> written(128, 0), seen(128, -1), sums(128, 0);
  run_one_block(128, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    written[t] = t + 1;
    dsv4_sim::sync_block();
    seen[t] = written[127 - t];
    int mine = t;
    dsv4_sim::wave_exchange(&mine, sizeof mine, 64, dsv4_sim::call_site());
    int sum = 0;
    for (int lane = 0; lane < 64; ++lane) {
      int value;
      std::memcpy(&value, dsv4_sim::deposit_of(lane), sizeof value);
      sum += value;
    }
    sums[t] = sum;
  });
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(seen[t], 128 - t);
    EXPECT_EQ(sums[t], t < 64 ? 63 * 64 / 2 : 63 * 64 / 2 + 64 * 64);
  }
}

TEST(WaveModel, ThreadsThatEndReleaseTheBarrier) {
  int passed = 0;
  run_one_block(256, [&] {
    if (dsv4_sim::thread_index().x % 3 == 0) return;
    dsv4_sim::sync_block();
    ++passed;
  });
  EXPECT_EQ(passed, 256 - 86);
}

// A branch that leaves half of a wave at the barrier: the other half runs its wave operation alone, as the
// hardware does with those lanes masked off.
TEST(WaveModel, PartOfAWaveRunsAWaveOperationAlone) {
  std::vector<int> sums(64, -1);
  run_one_block(64, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    if (t < 32) {
      dsv4_sim::wave_exchange(&t, sizeof t, 64, dsv4_sim::call_site());
      int sum = 0;
      for (int lane = 0; lane < 32; ++lane) {
        EXPECT_TRUE(dsv4_sim::taken_part(lane));
        int value;
        std::memcpy(&value, dsv4_sim::deposit_of(lane), sizeof value);
        sum += value;
      }
      EXPECT_FALSE(dsv4_sim::taken_part(40));
      sums[t] = sum;
    }
    dsv4_sim::sync_block();
  });
  for (int t = 0; t < 32; ++t) EXPECT_EQ(sums[t], 31 * 32 / 2);
}

TEST(WaveModelDeathTest, ReadingALaneThatSkippedTheOperationAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_one_block(64,
                         [] {
                           const int t = static_cast<int>(dsv4_sim::thread_index().x);
                           if (t >= 32) return;
                           dsv4_sim::wave_exchange(&t, sizeof t, 64, dsv4_sim::call_site());
                           dsv4_sim::deposit_of(40);
                         }),
               "did not take part");
}

// Lanes of one lane group at two different wave operations at once (both sides of a branch): the hardware
// runs them one after the other; the model does not, and says so rather than mixing them.
TEST(WaveModelDeathTest, LanesAtTwoWaveOperationsAtOnceAreReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_one_block(64,
                         [] {
                           const int x = 1;
                           if (dsv4_sim::thread_index().x < 32) {
                             dsv4_sim::wave_exchange(&x, sizeof x, 64, &x);
                           } else {
                             dsv4_sim::wave_exchange(&x, sizeof x, 64, nullptr);
                           }
                           dsv4_sim::sync_block();
                         }),
               "different wave operations");
}

// Within a pass, waves run in slot order, or with DSV4_MODEL_REVERSE=1 the last first; the lanes of a wave
// always in order (a wave's lanes run in lockstep on the hardware).
TEST(WaveModel, PassOrderFollowsTheEnvironment) {
  const char* reverse = std::getenv("DSV4_MODEL_REVERSE");
  const bool reversed = reverse != nullptr && reverse[0] == '1';
  int across = 0, within = 0, seen_across = -1, seen_within = -1;
  run_one_block(128, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    if (t == 127) across = 1;  // wave 1
    if (t == 63) within = 1;   // wave 0, after lane 1
    if (t == 0) seen_across = across;
    if (t == 1) seen_within = within;
  });
  EXPECT_EQ(seen_across, reversed ? 1 : 0);
  EXPECT_EQ(seen_within, 0);
}

TEST(WaveModel, LaunchOverTheChipsSharedMemoryFails) {
  const size_t lds = dsv4_sim::chip().lds_bytes;
  EXPECT_NE(dsv4_sim::run_grid(Index3{1, 1, 1}, Index3{64, 1, 1}, lds + 1, [](void*) {}, nullptr), 0);
  EXPECT_NE(dsv4_sim::take_last_error(), 0);
  EXPECT_NE(dsv4_sim::run_grid(Index3{1, 1, 1}, Index3{1025, 1, 1}, 0, [](void*) {}, nullptr), 0);
  EXPECT_NE(dsv4_sim::take_last_error(), 0);
}

}  // namespace
