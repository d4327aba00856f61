// The 32-lane (NVIDIA sm_90a) model itself: mma.sync against a plain matrix product with the PTX ISA's
// fragment layout, the conversions, ldmatrix, asynchronous copies, named barriers, mbarriers, the *_sync mask
// rule, and launches held back for programmatic dependent launch. (The layouts of wgmma and of TMA copies are
// checked by the kernels that use them, known good on the H200: sparse MLA decode's warpgroup kernel and the
// indexer's paged TMA kernel.) Also sets the chip the program models before any test runs.
#include <functional>

#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;
using dsv4_sim::Index3;

// 227 KB of shared memory a block may opt in to, as on the H100 / H200; 32 multiprocessors, so that grids
// sized to one wave of blocks stay small (and the mHC dot products still split K into 33 or more slices).
const bool chip_is_set = [] {
  dsv4_sim::set_chip(dsv4_sim::ChipModel{"sm_90a", 227 * 1024, 32});
  return true;
}();

uint32_t pack_bf16(float lo, float hi) {
  return dsv4::float_to_bf16_bits(lo) | (static_cast<uint32_t>(dsv4::float_to_bf16_bits(hi)) << 16);
}

TEST(WarpModel, MmaM16n8k16Bf16FollowsThePtxFragments) {
  Random random(1);
  std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8), d(16 * 8, 0.0f);
  for (auto& x : a) x = dsv4::bf16_bits_to_float(dsv4::float_to_bf16_bits(random.normal()));
  for (auto& x : b) x = dsv4::bf16_bits_to_float(dsv4::float_to_bf16_bits(random.normal()));
  for (auto& x : c) x = random.normal();
  run_one_block(32, [&] {
    const int lane = dsv4_sim::lane_id(), g = lane / 4, t = lane % 4;
    const auto A = [&](int row, int k) { return a[row * 16 + k]; };
    const auto B = [&](int k, int col) { return b[k * 8 + col]; };
    const uint32_t a_regs[4] = {
        pack_bf16(A(g, 2 * t), A(g, 2 * t + 1)), pack_bf16(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
        pack_bf16(A(g, 2 * t + 8), A(g, 2 * t + 9)), pack_bf16(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
    const uint32_t b_regs[2] = {pack_bf16(B(2 * t, g), B(2 * t + 1, g)), pack_bf16(B(2 * t + 8, g), B(2 * t + 9, g))};
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    dsv4_sim::mma_m16n8k16_bf16(acc, a_regs, b_regs, nullptr);
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
  });
  for (int row = 0; row < 16; ++row) {
    for (int col = 0; col < 8; ++col) {
      double want = c[row * 8 + col];
      for (int k = 0; k < 16; ++k) want += static_cast<double>(a[row * 16 + k]) * b[k * 8 + col];
      EXPECT_NEAR(d[row * 8 + col], want, 1e-5 * (1.0 + std::fabs(want))) << row << ", " << col;
    }
  }
}

TEST(WarpModel, ConversionsSaturateAndDecodeExactly) {
  // OCP e4m3: 1.0 = 0x38, 448 = 0x7E; past it (and infinity) saturates; NaN is 0x7F; -0 keeps its sign; the
  // low source lands in bits 0..7.
  EXPECT_EQ(dsv4_sim::cvt_rn_satfinite_e4m3x2_f32(448.0f, 1.0f), 0x7E38);
  EXPECT_EQ(dsv4_sim::cvt_rn_satfinite_e4m3x2_f32(-INFINITY, 1000.0f), 0xFE7E);
  EXPECT_EQ(dsv4_sim::cvt_rn_satfinite_e4m3x2_f32(NAN, -0.0f), 0x7F80);
  // f16: 1.0 = 0x3C00, -448 = 0xDF00, 2^-9 (the smallest e4m3 subnormal) = 0x1800.
  uint32_t first = 0, second = 0;
  dsv4_sim::cvt_rn_f16x2_e4m3x2_halves(0x0180FE38u, first, second);
  EXPECT_EQ(first, 0xDF003C00u);
  EXPECT_EQ(second, 0x18008000u);
}

TEST(WarpModelDeathTest, ASyncShuffleNeedsEveryLaneOfItsMask) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_one_block(32,
                         [] {
                           const int t = static_cast<int>(dsv4_sim::thread_index().x);
                           if (t >= 16) return;  // exited lanes of a full mask
                           dsv4_sim::wave_exchange(&t, sizeof t, 32, dsv4_sim::call_site());
                           dsv4_sim::require_exactly_lanes(0xffffffffu);
                         }),
               "exactly the lanes of its mask");
}

TEST(WarpModel, ConversionsAndBytePermutes) {
  EXPECT_EQ(dsv4_sim::cvt_rn_bf16x2_f32(-2.0f, 1.0f + 0x1p-8f), 0xC0003F80u);  // the tie to even: 1.0
  EXPECT_EQ(dsv4_sim::cvt_rn_bf16x2_f32(NAN, 1.0f + 0x1.8p-8f), 0x7FFF3F81u);
  float low = 0.0f, high = 0.0f;
  dsv4_sim::cvt_f32_f16_halves(0x80013C00u, low, high);  // 1.0 and -2^-24 (the smallest subnormal)
  EXPECT_EQ(low, 1.0f);
  EXPECT_EQ(high, -0x1p-24f);
  // Sign replication (nibble bit 3): bytes 0-1 after byte 1's top bit, 2-3 after byte 3's.
  EXPECT_EQ(dsv4_sim::prmt_b32(0x7F00800Fu, 0, 0xBB99u), 0x0000FFFFu);
  EXPECT_EQ(dsv4_sim::prmt_b32(0x11223344u, 0x55667788u, 0x7410u), 0x55883344u);
}

// ldmatrix: lane l names row l % 8 of matrix l / 8; a lane gets row l / 4, elements 2 (l % 4) and + 1 of
// each matrix, or with .trans column l / 4, rows 2 (l % 4) and + 1.
TEST(WarpModel, LdmatrixDealsRowsAndColumns) {
  static uint16_t tile[4][8][8];  // `static`: the model's shared memory
  for (int m = 0; m < 4; ++m) {
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 8; ++c) tile[m][r][c] = static_cast<uint16_t>(m * 100 + r * 10 + c);
    }
  }
  run_one_block(32, [&] {
    const int lane = dsv4_sim::lane_id();
    const uint32_t address = dsv4_sim::shared_window_address(&tile[lane / 8][lane % 8][0]);
    uint32_t plain[4], transposed[4];
    dsv4_sim::ldmatrix_x4(plain, address, false, nullptr);
    dsv4_sim::ldmatrix_x4(transposed, address, true, &tile);  // another call site
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(plain[m], tile[m][lane / 4][2 * (lane % 4)] | (uint32_t{tile[m][lane / 4][2 * (lane % 4) + 1]} << 16));
      EXPECT_EQ(transposed[m],
                tile[m][2 * (lane % 4)][lane / 4] | (uint32_t{tile[m][2 * (lane % 4) + 1][lane / 4]} << 16));
    }
  });
}

// cp.async: the copy lands when its thread waits for its group, not before; a later group may stay pending.
TEST(WarpModel, AsynchronousCopiesLandAtTheWait) {
  static unsigned char shared[64];
  const std::vector<unsigned char> global(64, 7);
  run_one_block(1, [&] {
    std::memset(shared, 0, sizeof shared);
    dsv4_sim::defer(dsv4_sim::AsyncUnit::kCopy, [&] { std::memcpy(shared, global.data(), 16); });
    dsv4_sim::commit_deferred(dsv4_sim::AsyncUnit::kCopy);
    dsv4_sim::defer(dsv4_sim::AsyncUnit::kCopy, [&] { std::memcpy(shared + 16, global.data(), 16); });
    dsv4_sim::commit_deferred(dsv4_sim::AsyncUnit::kCopy);
    EXPECT_EQ(shared[0], 0);
    dsv4_sim::complete_deferred(dsv4_sim::AsyncUnit::kCopy, 1);
    EXPECT_EQ(shared[0], 7);
    EXPECT_EQ(shared[16], 0);
    dsv4_sim::complete_deferred(dsv4_sim::AsyncUnit::kCopy, 0);
    EXPECT_EQ(shared[16], 7);
  });
}

// bar.sync on a named barrier waits for its thread count (bar.arrive counts without waiting): a producer
// warp's writes are seen by the consumer warps after it.
TEST(WarpModel, NamedBarriersCountTheirThreads) {
  std::vector<int> seen(96, -1);
  int produced = 0;
  run_one_block(96, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    if (t < 32) {
      if (t == 0) produced = 42;
      dsv4_sim::named_barrier(3, 96, false);
    } else {
      dsv4_sim::named_barrier(3, 96, true);
      seen[t] = produced;
    }
  });
  for (int t = 32; t < 96; ++t) EXPECT_EQ(seen[t], 42);
}

// An mbarrier phase completes when its arrivals and its transaction bytes are in: a bulk copy lands when a
// thread waits for the phase, and the next phase waits again.
TEST(WarpModel, MbarrierPhasesWaitForArrivalsAndBytes) {
  static unsigned char shared[32];
  static uint64_t barrier_word;
  const std::vector<unsigned char> global(32, 9);
  std::vector<int> seen(64, -1);
  run_one_block(64, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    const uint32_t barrier = dsv4_sim::shared_window_address(&barrier_word);
    if (t == 0) {
      std::memset(shared, 0, sizeof shared);
      dsv4_sim::mbarrier_init(barrier, 1);
    }
    dsv4_sim::sync_block();
    for (uint32_t phase = 0; phase < 2; ++phase) {
      if (t == 0) {
        dsv4_sim::mbarrier_arrive_expect_tx(barrier, 16);
        dsv4_sim::mbarrier_bulk_copy(barrier, 16, [&, phase] { std::memcpy(shared + 16 * phase, global.data(), 16); });
      }
      dsv4_sim::mbarrier_wait_parity(barrier, phase % 2);
      if (t == 63) seen[phase] = shared[16 * phase];
      dsv4_sim::sync_block();
    }
  });
  EXPECT_EQ(seen[0], 9);
  EXPECT_EQ(seen[1], 9);
}

// Within a pass, threads run in slot order, or with DSV4_MODEL_REVERSE=1 the last first: a read that no barrier
// orders after a write sees the write in one of the two orders only.
TEST(WarpModel, PassOrderFollowsTheEnvironment) {
  const char* reverse = std::getenv("DSV4_MODEL_REVERSE");
  const bool reversed = reverse != nullptr && reverse[0] == '1';
  int written = 0, seen = -1;
  run_one_block(64, [&] {
    const int t = static_cast<int>(dsv4_sim::thread_index().x);
    if (t == 63) written = 1;
    if (t == 0) seen = written;
  });
  EXPECT_EQ(seen, reversed ? 1 : 0);
}

// Stream order with programmatic dependent launch: the first launch is held back; the second, launched to
// overlap it, runs first, and the held one runs when the second first waits -- so a read before the wait
// sees the old contents, one after it the new.
TEST(WarpModel, AnOverlappingLaunchRunsItsEarlyPartBeforeTheKernelBeforeIt) {
  if (std::getenv("DSV4_MODEL_PDL_PHASE") != nullptr && std::getenv("DSV4_MODEL_PDL_PHASE")[0] == '1') {
    GTEST_SKIP() << "phase 1 holds back the second launch; this test is about the first";
  }
  int value = 1, before_wait = 0, after_wait = 0;
  static int order = 0;
  const auto writer = [&] { value = 2; };
  const auto reader = [&] {
    if (dsv4_sim::thread_index().x != 0) return;
    before_wait = value;
    dsv4_sim::wait_for_previous_grid();
    after_wait = value;
  };
  const Index3 one{1, 1, 1};
  ASSERT_EQ(dsv4_sim::launch({one, one, 0, writer, &order, false}), 0);
  EXPECT_EQ(value, 1);  // held back
  ASSERT_EQ(dsv4_sim::launch({one, Index3{32, 1, 1}, 0, reader, &value, true}), 0);
  dsv4_sim::finish_launches();
  EXPECT_EQ(before_wait, 1);
  EXPECT_EQ(after_wait, 2);
  EXPECT_EQ(value, 2);
  // A plain launch after a held one: the held one runs first.
  value = 1;
  ASSERT_EQ(dsv4_sim::launch({one, one, 0, writer, &order, false}), 0);
  ASSERT_EQ(dsv4_sim::launch({one, Index3{32, 1, 1}, 0, reader, &value, false}), 0);
  dsv4_sim::finish_launches();
  EXPECT_EQ(before_wait, 2);
}

}  // namespace
