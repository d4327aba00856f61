// The lightning indexer's per-row top-k kernel on the modelled chip against the CPU implementation, index
// for index (any order where not stable, and any of the tied indices at the k-th value).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/indexer/indexer_cpu.h"
#include "indexer/indexer_launchers.h"
#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;

TEST(ModelIndexer, TopkPerRowMatchesCpu) {
  Random random(43);
  constexpr int64_t kRows = 7, kCols = 3000;
  std::vector<float> logits = random.floats(kRows * kCols);
  for (int64_t j = 0; j < kCols; j += 3) logits[1 * kCols + j] = 0.5f;  // row 1: many ties
  for (int64_t j = 0; j < kCols; j += 7) logits[2 * kCols + j] = -std::numeric_limits<float>::infinity();
  logits[2 * kCols + 11] = std::nanf("");
  const std::vector<int32_t> starts = {0, 10, 100, 2990, 5, -4, 1500};
  const std::vector<int32_t> ends = {3000, 2000, 2500, 3000, 5, 4000, 1530};  // an empty row; windows past cols
  for (int64_t k : {1, 64, 512, 2048}) {
    for (bool stable : {true, false}) {
      std::vector<int32_t> got(kRows * k, 12345), want = got;
      dsv4::TopkPerRowArgs args{logits.data(), kCols, kCols, starts.data(), ends.data(), got.data(), kRows, k, stable};
      ASSERT_EQ(dsv4::gpu::launch_topk_per_row(args, nullptr), dsv4::LaunchStatus::kOk);
      args.out = want.data();
      dsv4::cpu::topk_per_row(args, 0, kRows);
      for (int64_t r = 0; r < kRows; ++r) {
        std::vector<int32_t> g(got.begin() + r * k, got.begin() + (r + 1) * k);
        std::vector<int32_t> w(want.begin() + r * k, want.begin() + (r + 1) * k);
        if (!stable) {  // any order; with ties at the k-th value, any of the tied indices
          std::sort(g.begin(), g.end());
          std::sort(w.begin(), w.end());
          if (r == 1) {
            // Row 1's k-th value is the tie 0.5 (or above): compare the values, not the indices.
            std::vector<float> gv, wv;
            for (int32_t i : g) gv.push_back(i < 0 ? -1.0f : logits[r * kCols + starts[r] + i]);
            for (int32_t i : w) wv.push_back(i < 0 ? -1.0f : logits[r * kCols + starts[r] + i]);
            std::sort(gv.begin(), gv.end());
            std::sort(wv.begin(), wv.end());
            EXPECT_EQ(gv, wv) << "row " << r << " k " << k;
            continue;
          }
        }
        EXPECT_EQ(g, w) << "row " << r << " k " << k << (stable ? " stable" : "");
      }
    }
  }
}

// Logits rows at a padded stride, and no row starts.
TEST(ModelIndexer, TopkPerRowPaddedRowsWithoutStarts) {
  Random random(45);
  constexpr int64_t kRows = 3, kCols = 500, kRowStride = 530, kK = 40;
  const std::vector<float> logits = random.floats(kRows * kRowStride);
  const std::vector<int32_t> ends = {500, 20, 0};
  std::vector<int32_t> got(kRows * kK), want(kRows * kK);
  dsv4::TopkPerRowArgs args{logits.data(), kRowStride, kCols, nullptr, ends.data(), got.data(), kRows, kK, true};
  ASSERT_EQ(dsv4::gpu::launch_topk_per_row(args, nullptr), dsv4::LaunchStatus::kOk);
  args.out = want.data();
  dsv4::cpu::topk_per_row(args, 0, kRows);
  EXPECT_EQ(got, want);
}

}  // namespace
