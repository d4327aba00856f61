// Numerics the newer ops share between the CPU path and their GPU kernels: the mHC Sinkhorn epilogue
// (dsv4/mhc.h), the clamped rotary table (dsv4/rope.h), the indexer's FP8 read rule and the sparse-MLA
// ragged row ranges, and when the cache readers may skip the bf16 rounding (dsv4/ds_mla.h).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "dsv4/ds_mla.h"
#include "dsv4/mhc.h"
#include "dsv4/rope.h"
#include "indexer/indexer_args.h"
#include "sparse_mla/sparse_mla_args.h"

namespace {

// spec/mhc.md §2.5 in double precision with true divisions.
void sinkhorn_double(const float* logits, double eps, int iters, double* c) {
  for (int j = 0; j < 4; ++j) {
    double row_max = logits[4 * j];
    for (int k = 1; k < 4; ++k) row_max = std::fmax(row_max, logits[4 * j + k]);
    double sum = 0;
    for (int k = 0; k < 4; ++k) sum += std::exp(logits[4 * j + k] - row_max);
    for (int k = 0; k < 4; ++k) c[4 * j + k] = std::exp(logits[4 * j + k] - row_max) / sum + eps;
  }
  auto normalize = [&](bool columns) {
    for (int a = 0; a < 4; ++a) {
      double sum = 0;
      for (int b = 0; b < 4; ++b) sum += columns ? c[4 * b + a] : c[4 * a + b];
      for (int b = 0; b < 4; ++b) (columns ? c[4 * b + a] : c[4 * a + b]) /= sum + eps;
    }
  };
  normalize(true);
  for (int i = 1; i < iters; ++i) {
    normalize(false);
    normalize(true);
  }
}

TEST(MhcSinkhorn, MatchesDoublePrecisionAndIsDoublyStochastic) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    float logits[16];
    for (float& l : logits) l = normal(rng);
    float c[16];
    double want[16];
    dsv4::mhc::sinkhorn(logits, 1e-6f, 20, c);
    sinkhorn_double(logits, 1e-6, 20, want);
    for (int e = 0; e < 16; ++e) EXPECT_NEAR(c[e], want[e], 2e-6) << "trial " << trial << " entry " << e;
    for (int k = 0; k < 4; ++k) {
      const double column = c[k] + c[4 + k] + c[8 + k] + c[12 + k];
      EXPECT_NEAR(column, 1.0, 1e-5);
    }
  }
}

TEST(MhcSinkhorn, OneIterationIsSoftmaxThenColumns) {
  const float logits[16] = {0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 0, 0, -1, 5, 2, 0};
  float c[16];
  double want[16];
  dsv4::mhc::sinkhorn(logits, 0.0f, 1, c);
  sinkhorn_double(logits, 0.0, 1, want);
  for (int e = 0; e < 16; ++e) EXPECT_NEAR(c[e], want[e], 1e-6);
}

TEST(RopeTable, PositionsAreClampedAndBothDtypesRead) {
  float table[3 * 64];
  for (int i = 0; i < 3 * 64; ++i) table[i] = static_cast<float>(i);
  const int64_t positions[4] = {-5, 0, 2, 99};
  const dsv4::RopeTable rope{table, false, 3, positions, true};
  EXPECT_EQ(rope.row_of(0), 0);
  EXPECT_EQ(rope.row_of(1), 0);
  EXPECT_EQ(rope.row_of(2), 2);
  EXPECT_EQ(rope.row_of(3), 2);
  EXPECT_EQ(rope.value(2, 33), 2 * 64 + 33);
  const uint16_t bf16_table[64] = {0x3F80, 0x4000};  // 1.0, 2.0
  const int32_t positions32[1] = {7};
  const dsv4::RopeTable bf16_rope{bf16_table, true, 1, positions32, false};
  EXPECT_EQ(bf16_rope.row_of(0), 0);
  EXPECT_EQ(bf16_rope.value(0, 1), 2.0f);
}

TEST(IndexerFp8, Byte0x80ReadsAsZeroInBothEncodings) {
  EXPECT_EQ(dsv4::indexer_fp8_value<dsv4::Fp8Format::kOCP>(0x80), 0.0f);
  EXPECT_EQ(dsv4::indexer_fp8_value<dsv4::Fp8Format::kFNUZ>(0x80), 0.0f);
  EXPECT_EQ(dsv4::indexer_fp8_value<dsv4::Fp8Format::kOCP>(0x38), 1.0f);
  EXPECT_EQ(dsv4::indexer_fp8_value<dsv4::Fp8Format::kFNUZ>(0x38), 0.5f);
}

TEST(SparseKeySource, RowRangesAreClampedToTheIndexList) {
  const int32_t indptr[4] = {-3, 2, 9, 1};
  dsv4::SparseKeySource source{};
  source.indptr = indptr;
  source.index_count = 5;
  EXPECT_EQ(source.row_begin(0), 0);
  EXPECT_EQ(source.row_end(0), 2);
  EXPECT_EQ(source.row_begin(1), 2);
  EXPECT_EQ(source.row_end(1), 5);
  EXPECT_EQ(source.row_begin(2), 5);
  EXPECT_EQ(source.row_end(2), 5);  // an end before its begin is an empty row
}

// The sparse-MLA sink rule every reduce shares: NaN sinks and heads past the op's read as no sink; a row is
// zeros without weight or under a +inf sink; otherwise out = weight * acc / denominator with the sink in the
// denominator only.
TEST(SparseMlaSink, RuleOfTheReduce) {
  const float sinks[3] = {0.5f, NAN, INFINITY};
  dsv4::SparseMlaDecodeArgs args{};
  args.heads = 3;
  EXPECT_EQ(dsv4::head_sink(args, 0), -INFINITY);  // no sink tensor
  args.sink = sinks;
  EXPECT_EQ(dsv4::head_sink(args, 0), 0.5f);
  EXPECT_EQ(dsv4::head_sink(args, 1), -INFINITY);
  EXPECT_EQ(dsv4::head_sink(args, 2), INFINITY);
  EXPECT_EQ(dsv4::head_sink(args, 3), -INFINITY);  // a padding row of a GPU block
  const dsv4::SinkFold plain = dsv4::fold_sink(-INFINITY, 2.0f, 3.0f);
  EXPECT_FALSE(plain.empty);
  EXPECT_EQ(plain.weight, 1.0f);
  EXPECT_EQ(plain.denominator, 3.0f);
  const dsv4::SinkFold with_sink = dsv4::fold_sink(2.0f, 1.0f, 4.0f);
  EXPECT_FLOAT_EQ(with_sink.weight, std::exp(-1.0f));
  EXPECT_FLOAT_EQ(with_sink.denominator, 1.0f + 4.0f * std::exp(-1.0f));
  EXPECT_FALSE(with_sink.empty);
  EXPECT_TRUE(dsv4::fold_sink(-INFINITY, -FLT_MAX, 0.0f).empty);  // no keys
  EXPECT_TRUE(dsv4::fold_sink(INFINITY, 1.0f, 1.0f).empty);       // +inf sink takes all the weight
  EXPECT_FALSE(dsv4::fold_sink(3.0f, -FLT_MAX, 0.0f).empty);      // only the sink: zeros through acc = 0
}

// From kTruncationExactScaleByte up, every decoded NoPE value's bf16 is the top half of its fp32 bits,
// in both encodings and for every code (NaN and Inf included); the bound is needed (below it, some
// products round).
template <dsv4::Fp8Format F>
void expect_truncation_exact_from_bound() {
  for (int scale = 0; scale < 256; ++scale) {
    int rounded = 0;
    for (int code = 0; code < 256; ++code) {
      const float value = dsv4::ds_mla::dequantize_nope_value<F>(static_cast<uint8_t>(code),
                                                                 dsv4::ue8m0_decode(static_cast<uint8_t>(scale)));
      rounded += dsv4::float_to_bf16_bits(value) != static_cast<uint16_t>(dsv4::float_bits(value) >> 16);
    }
    if (scale >= dsv4::ds_mla::kTruncationExactScaleByte) EXPECT_EQ(rounded, 0) << "scale byte " << scale;
    if (scale == 0) EXPECT_GT(rounded, 0);
  }
}

TEST(DsMlaNopeDecode, Bf16IsTruncationFromTheBoundOcp) {
  expect_truncation_exact_from_bound<dsv4::Fp8Format::kOCP>();
}
TEST(DsMlaNopeDecode, Bf16IsTruncationFromTheBoundFnuz) {
  expect_truncation_exact_from_bound<dsv4::Fp8Format::kFNUZ>();
}

// The integer NoPE decode gives dequantize_nope_value's bf16 bit for bit, for every code it accepts, in
// both halves of a pair and at every scale byte of its range; it accepts every code with a nonzero exponent
// field but the 0x7f magnitude, and nothing else.
template <dsv4::Fp8Format F>
void expect_integer_decode_exact() {
  namespace ds_mla = dsv4::ds_mla;
  const uint32_t bias = dsv4::Fp8Traits<F>::kExponentBias;
  for (int code = 0; code < 256; ++code) {
    const uint32_t word = 0x08080800u | static_cast<uint32_t>(code);  // the other three codes decodable
    const bool accepted = ds_mla::integer_decodable_fp8x4(word) == 0x80808080u;
    const bool expected = (code & 0x78) != 0 && (code & 0x7f) != 0x7f;
    EXPECT_EQ(accepted, expected) << "code " << code;
    EXPECT_EQ(ds_mla::integer_decodable_fp8x4(word) & 0x80808000u, 0x80808000u);
  }
  for (uint32_t scale = ds_mla::kIntegerDecodeMinScale; scale <= ds_mla::kIntegerDecodeMaxScale; ++scale) {
    const uint32_t offset = ds_mla::integer_decode_offset(scale, bias);
    const float block_scale = dsv4::ue8m0_decode(static_cast<uint8_t>(scale));
    int mismatches = 0;
    for (int low = 0; low < 256; ++low) {
      if ((low & 0x78) == 0 || (low & 0x7f) == 0x7f) continue;
      for (int high = 0; high < 256; ++high) {
        if ((high & 0x78) == 0 || (high & 0x7f) == 0x7f) continue;
        const uint32_t four = static_cast<uint32_t>(low | (high << 8) | (high << 16) | (low << 24));
        const uint32_t want = dsv4::float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(low, block_scale)) |
                              (dsv4::float_to_bf16_bits(ds_mla::dequantize_nope_value<F>(high, block_scale)) << 16);
        const uint32_t want_swapped = (want >> 16) | (want << 16);
        mismatches += ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<0>(four), offset) != want;
        mismatches += ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<1>(four), offset) != want_swapped;
      }
    }
    EXPECT_EQ(mismatches, 0) << "scale byte " << scale;
  }
}

TEST(DsMlaNopeDecode, IntegerDecodeIsExactOcp) { expect_integer_decode_exact<dsv4::Fp8Format::kOCP>(); }
TEST(DsMlaNopeDecode, IntegerDecodeIsExactFnuz) { expect_integer_decode_exact<dsv4::Fp8Format::kFNUZ>(); }

}  // namespace
