// The lightning-indexer kernels on the modelled chip against the CPU implementations: the logits (the FP8
// MFMA kernels for 16/32/64 heads of 64/128 dims, the scalar kernel otherwise; prefill and paged decode)
// with the -inf mask bit-equal and the values within the error of an fp32 sum taken in another order (the
// top-k: test_sim_indexer_topk.cpp).
#include <algorithm>
#include <limits>

#include "cpu/indexer/indexer_cpu.h"
#include "indexer/indexer_launchers.h"
#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;
using dsv4::Fp8Format;

float indexer_value(uint8_t code, Fp8Format format) {
  return format == Fp8Format::kOCP ? dsv4::indexer_fp8_value<Fp8Format::kOCP>(code)
                                   : dsv4::indexer_fp8_value<Fp8Format::kFNUZ>(code);
}

// got against want: -inf exactly where want has it, elsewhere |got - want| <= 1e-5 * magnitude(i) (the sum
// of the absolute terms of that logit) + 1e-30; untouched entries (want's fill) equal.
::testing::AssertionResult logits_close(const std::vector<float>& got, const std::vector<float>& want,
                                        const std::vector<double>& magnitude) {
  for (size_t i = 0; i < got.size(); ++i) {
    const bool want_inf = std::isinf(want[i]) && want[i] < 0;
    if (want_inf != (std::isinf(got[i]) && got[i] < 0)) {
      return ::testing::AssertionFailure() << "mask differs at " << i << ": got " << got[i] << ", want " << want[i];
    }
    if (want_inf) continue;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= 1e-5 * magnitude[i] + 1e-30)) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ModelIndexer, MqaLogitsMatchCpu) {
  Random random(41);
  constexpr int64_t kM = 23, kN = 150;
  struct Shape {
    int64_t heads, dim;
  };
  for (Shape shape : {Shape{64, 128}, Shape{16, 64}, Shape{32, 128}, Shape{8, 32}}) {
    for (Fp8Format qf : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
      for (Fp8Format kf : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
        const int64_t h = shape.heads, d = shape.dim;
        std::vector<uint8_t> q = random.fp8(kM * h * d, qf, 2.0f), k = random.fp8(kN * d, kf, 2.0f);
        q[5] = 0x80;  // +0 whatever the encoding (never NaN)
        k[d * 7 + 3] = 0x80;
        std::vector<float> k_scale = random.floats(kN, 0.1f), weights = random.floats(kM * h);
        for (auto& s : k_scale) s = std::fabs(s) + 0.01f;
        std::vector<int32_t> ks(kM), ke(kM);
        for (int64_t i = 0; i < kM; ++i) {
          ks[i] = static_cast<int32_t>(random.integer(-3, kN / 2));
          ke[i] = static_cast<int32_t>(ks[i] + random.integer(-2, kN));  // empty rows, ke > n
        }
        for (bool clean : {true, false}) {
          std::vector<float> got(kM * kN, 7.0f), want = got;
          dsv4::MqaLogitsArgs args{q.data(), h * d, d, qf, k.data(), d, kf, k_scale.data(), weights.data(),
                                   ks.data(), ke.data(), got.data(), kN, kM, kN, h, d, clean};
          ASSERT_EQ(dsv4::gpu::launch_fp8_mqa_logits(args, nullptr), dsv4::LaunchStatus::kOk);
          args.logits = want.data();
          dsv4::cpu::fp8_mqa_logits(args, 0, kM);
          std::vector<double> magnitude(kM * kN, 0.0);
          for (int64_t i = 0; i < kM; ++i) {
            for (int64_t j = 0; j < kN; ++j) {
              double sum = 0.0;
              for (int64_t hh = 0; hh < h; ++hh) {
                double dot = 0.0;
                for (int64_t dd = 0; dd < d; ++dd) {
                  dot += std::fabs(static_cast<double>(indexer_value(q[(i * h + hh) * d + dd], qf)) *
                                   indexer_value(k[j * d + dd], kf));
                }
                sum += std::fabs(weights[i * h + hh]) * dot * k_scale[j];
              }
              magnitude[i * kN + j] = sum;
            }
          }
          EXPECT_TRUE(logits_close(got, want, magnitude))
              << "heads " << h << " dim " << d << " q " << static_cast<int>(qf) << " k " << static_cast<int>(kf)
              << (clean ? " clean" : "");
        }
      }
    }
  }
}

TEST(ModelIndexer, PagedMqaLogitsMatchCpu) {
  Random random(42);
  constexpr int64_t kHeads = 64, kDim = 128, kBatch = 3, kBlocks = 9, kMaxLen = 200;
  for (int64_t block_size : {32, 64}) {
    for (int64_t next_n : {1, 2}) {
      for (Fp8Format format : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
        const int64_t stride = block_size * (kDim + 4);
        std::vector<uint8_t> cache(kBlocks * stride);
        for (int64_t b = 0; b < kBlocks; ++b) {
          const std::vector<uint8_t> codes = random.fp8(block_size * kDim, format, 2.0f);
          std::memcpy(&cache[b * stride], codes.data(), codes.size());
          for (int64_t e = 0; e < block_size; ++e) {
            const float scale = 0.01f + std::fabs(random.normal(0.1f));
            std::memcpy(&cache[b * stride + block_size * kDim + 4 * e], &scale, 4);
          }
        }
        const int64_t rows = kBatch * next_n;
        const std::vector<uint8_t> q = random.fp8(rows * kHeads * kDim, format, 2.0f);
        const std::vector<float> weights = random.floats(rows * kHeads);
        const std::vector<int32_t> lens = {static_cast<int32_t>(kMaxLen), 1, 77};
        // 5 columns: request 1 uses one, unused entries hold garbage or ids past the cache.
        const std::vector<int32_t> table = {3, 1, 4, 0, 2, 8, -7, 99, 5, 6, 7, 2, 5, 1000, -1};
        std::vector<float> got(rows * kMaxLen, 7.0f), want = got;
        dsv4::PagedMqaLogitsArgs args{q.data(), format, cache.data(), kBlocks, block_size, stride, format,
                                      weights.data(), lens.data(), false, table.data(), 5, 5, got.data(), kMaxLen,
                                      kMaxLen, kBatch, next_n, kHeads, kDim, true};
        ASSERT_EQ(dsv4::gpu::launch_fp8_paged_mqa_logits(args, nullptr), dsv4::LaunchStatus::kOk);
        args.logits = want.data();
        dsv4::cpu::fp8_paged_mqa_logits(args, 0, rows);
        std::vector<double> magnitude(got.size(), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t t = 0; t < args.row_length(r); ++t) {
            const int64_t block = table[(r / next_n) * 5 + t / block_size];
            if (block < 0 || block >= kBlocks) continue;
            const uint8_t* key = &cache[block * stride + (t % block_size) * kDim];
            float scale;
            std::memcpy(&scale, &cache[block * stride + block_size * kDim + 4 * (t % block_size)], 4);
            double sum = 0.0;
            for (int64_t h = 0; h < kHeads; ++h) {
              double dot = 0.0;
              for (int64_t d = 0; d < kDim; ++d) {
                dot += std::fabs(static_cast<double>(indexer_value(q[(r * kHeads + h) * kDim + d], format)) *
                                 indexer_value(key[d], format));
              }
              sum += std::fabs(weights[r * kHeads + h]) * dot * scale;
            }
            magnitude[r * kMaxLen + t] = sum;
          }
        }
        EXPECT_TRUE(logits_close(got, want, magnitude))
            << "block size " << block_size << " next_n " << next_n << " format " << static_cast<int>(format);
      }
    }
  }
}

// -inf and the untouched fill (3.0) exactly where want has them, the other values within 1e-3.
void expect_placed(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || want[i] == 3.0f) {
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], 1e-3 * std::fabs(want[i]) + 1e-3) << what << " element " << i;
    }
  }
}

// Padded q and logits rows, the paged form with per-row lengths and without the mask.
// What these check is where values go: a misplaced row, column or scale changes a value wholesale, far past
// the 1e-3 allowed here (itself far past the sums' rounding differences, which the tests above bound).
TEST(ModelIndexer, OtherLayouts) {
  Random random(44);
  const Fp8Format f = chip_format();
  {
    constexpr int64_t kM = 5, kN = 70, kH = 32, kD = 64, kQRow = kH * kD + 64, kLogitsRow = kN + 9;
    const std::vector<uint8_t> q = random.fp8(kM * kQRow, f, 2.0f), k = random.fp8(kN * kD, f, 2.0f);
    std::vector<float> k_scale(kN, 0.5f), weights = random.floats(kM * kH);
    const std::vector<int32_t> ks = {0, 3, 10, 0, 69}, ke = {70, 50, 11, 0, 70};
    std::vector<float> got(kM * kLogitsRow, 3.0f), want = got;
    dsv4::MqaLogitsArgs args{q.data(), kQRow, kD, f, k.data(), kD, f, k_scale.data(), weights.data(),
                             ks.data(), ke.data(), got.data(), kLogitsRow, kM, kN, kH, kD, true};
    ASSERT_EQ(dsv4::gpu::launch_fp8_mqa_logits(args, nullptr), dsv4::LaunchStatus::kOk);
    args.logits = want.data();
    dsv4::cpu::fp8_mqa_logits(args, 0, kM);
    expect_placed(got, want, "prefill");
  }
  {
    constexpr int64_t kHeads = 16, kDim = 64, kBlock = 32, kMaxLen = 100;
    const int64_t stride = kBlock * (kDim + 4);
    std::vector<uint8_t> cache(4 * stride);
    for (int64_t b = 0; b < 4; ++b) {
      const std::vector<uint8_t> codes = random.fp8(kBlock * kDim, f, 2.0f);
      std::memcpy(&cache[b * stride], codes.data(), codes.size());
      for (int64_t e = 0; e < kBlock; ++e) {
        const float scale = 0.25f;
        std::memcpy(&cache[b * stride + kBlock * kDim + 4 * e], &scale, 4);
      }
    }
    const std::vector<uint8_t> q = random.fp8(2 * 2 * kHeads * kDim, f, 2.0f);
    const std::vector<float> weights = random.floats(4 * kHeads);
    const std::vector<int32_t> lens = {40, 0, 100, 77};  // per row: [batch, next_n]
    const std::vector<int32_t> table = {2, 1, 0, 3, 3, 2, 1, 0};
    std::vector<float> got(4 * kMaxLen, 3.0f), want = got;
    dsv4::PagedMqaLogitsArgs args{q.data(), f, cache.data(), 4, kBlock, stride, f, weights.data(), lens.data(), true,
                                  table.data(), 4, 4, got.data(), kMaxLen, kMaxLen, 2, 2, kHeads, kDim, false};
    ASSERT_EQ(dsv4::gpu::launch_fp8_paged_mqa_logits(args, nullptr), dsv4::LaunchStatus::kOk);
    args.logits = want.data();
    dsv4::cpu::fp8_paged_mqa_logits(args, 0, 4);
    expect_placed(got, want, "paged");
  }
}

}  // namespace
