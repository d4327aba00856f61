// The wo_a block-scaled FP8 GEMM on the modelled chip against the CPU implementation, within the error of an
// fp32 sum taken in another order, through each of its AMD kernels (split-K for few rows, the tiled kernel, the
// element-wise one for unaligned rows, the foreign-encoding forms) and, on gfx950, the block-scaled MFMA.
#include <cmath>
#include <initializer_list>
#include <string>

#include "cpu/wo_a/wo_a_cpu.h"
#include "sim_test_support.h"
#include "wo_a/wo_a_launchers.h"

namespace {

using namespace dsv4_sim_test;
using dsv4::Fp8Format;

float decode(uint8_t code, Fp8Format format) {
  return format == Fp8Format::kOCP ? dsv4::fp8_decode<Fp8Format::kOCP>(code) : dsv4::fp8_decode<Fp8Format::kFNUZ>(code);
}

// One GEMM problem: x [m, groups, k] at (stride_m, stride_g), w [groups, n, k], the UE8M0 scales, out.
struct Problem {
  int64_t m, groups, n, k;
  Fp8Format x_format, w_format;
  int64_t x_stride_m, x_stride_g;  // elements; 0: token-major contiguous
  bool out_fp32;
  bool reduced_precision = false;  // the op's reduced_precision_block_sums
  std::vector<uint8_t> x, w, x_scale, w_scale;

  Problem(Random& random, int64_t m_, int64_t groups_, int64_t n_, int64_t k_, Fp8Format xf, Fp8Format wf,
          bool batch_major, int64_t row_pad, bool fp32)
      : m(m_), groups(groups_), n(n_), k(k_), x_format(xf), w_format(wf), out_fp32(fp32) {
    x_stride_m = batch_major ? k + row_pad : groups * (k + row_pad);
    x_stride_g = batch_major ? m * (k + row_pad) : k + row_pad;
    x.assign(m * groups * (k + row_pad) + 16, 0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        const std::vector<uint8_t> row = random.fp8(k, xf, 3.0f);
        std::memcpy(&x[i * x_stride_m + g * x_stride_g], row.data(), k);
      }
    }
    w = random.fp8(groups * n * k, wf, 3.0f);
    x_scale.resize(m * groups * (k / 128));
    for (auto& s : x_scale) s = static_cast<uint8_t>(random.integer(117, 137));
    w_scale.resize(groups * (n / 128) * (k / 128));
    for (auto& s : w_scale) s = static_cast<uint8_t>(random.integer(117, 137));
  }

  dsv4::BmmA8W8MxScaleArgs args(void* out) const {
    return {x.data(), x_stride_m, x_stride_g, x_format, w.data(), n * k, k, w_format, x_scale.data(),
            groups * (k / 128), k / 128, w_scale.data(), (n / 128) * (k / 128), k / 128, out, out_fp32,
            groups * n, n, m, groups, n, k, reduced_precision};
  }

  // Per output, sum over k of |x w| times the block scales (in double): the scale of the fp32 sums' error.
  std::vector<double> magnitudes() const {
    std::vector<double> result(m * groups * n, 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0.0;
          for (int64_t kk = 0; kk < k; ++kk) {
            const int a = x_scale[(i * groups + g) * (k / 128) + kk / 128];
            const int b = w_scale[(g * (n / 128) + j / 128) * (k / 128) + kk / 128];
            sum += std::fabs(static_cast<double>(decode(x[i * x_stride_m + g * x_stride_g + kk], x_format)) *
                             decode(w[(g * n + j) * k + kk], w_format)) *
                   std::ldexp(1.0, a + b - 254);
          }
          result[(i * groups + g) * n + j] = sum;
        }
      }
    }
    return result;
  }
};

// Runs the problem on the modelled chip and on the CPU; every output within 1e-5 of its magnitude (an fp32
// sum of <= 4096 terms in any order stays far inside), plus half a bf16 step of the value for bf16 output.
void check_gemm(const Problem& p, const std::string& what) {
  std::vector<float> got(p.m * p.groups * p.n), want(got.size());
  std::vector<uint16_t> got16(got.size()), want16(got.size());
  void* got_out = p.out_fp32 ? static_cast<void*>(got.data()) : got16.data();
  void* want_out = p.out_fp32 ? static_cast<void*>(want.data()) : want16.data();
  ASSERT_EQ(dsv4::gpu::launch_bmm_a8w8_mxscale(p.args(got_out), nullptr), dsv4::LaunchStatus::kOk) << what;
  dsv4::cpu::bmm_a8w8_mxscale(p.args(want_out), 0, p.m);
  if (!p.out_fp32) {
    got = bf16_to_floats(got16);
    want = bf16_to_floats(want16);
  }
  const std::vector<double> magnitude = p.magnitudes();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << ": element " << i;
      continue;
    }
    const double bound = 1e-5 * magnitude[i] + (p.out_fp32 ? 0.0 : std::ldexp(std::fabs(want[i]), -8)) + 1e-30;
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), bound)
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
}

std::string name(const Problem& p) {
  return "m " + std::to_string(p.m) + " x " + std::to_string(static_cast<int>(p.x_format)) + " w " +
         std::to_string(static_cast<int>(p.w_format)) + " stride_m " + std::to_string(p.x_stride_m) +
         (p.out_fp32 ? " fp32" : " bf16");
}

TEST(ModelWoA, BmmInTheChipsEncodingMatchesCpu) {
  Random random(32);
  const Fp8Format f = chip_format();
  // Split-K (m <= 64), few tiles (m <= 256), the tiled kernel (m > 256), bf16 and fp32 out.
  for (int64_t m : {1, 16, 17, 64, 130, 300}) {
    for (bool fp32 : {true, false}) {
      Problem p(random, m, 2, 256, 384, f, f, false, 0, fp32);
      check_gemm(p, name(p));
    }
  }
}

// On sm_90a the warpgroup-MMA kernels (OCP operands; N = 1024): fp32 sums through f16 products, 128 x 128
// tiles (M = 65, 16 groups), the weight as the MMA's M for 33-64 tokens with K split over a cluster of two
// blocks (8 groups), 64 x 64 tiles split over a cluster of two (4 groups); the FP8 products with the
// reduced-precision block sums (the model sums them exactly, as the CPU does). Elsewhere the same problems
// through the chip's own kernels.
TEST(ModelWoA, WarpgroupKernelShapes) {
  Random random(38);
  struct Shape {
    int64_t m, groups, k;
    bool reduced_precision;
  };
  for (Shape shape : {Shape{65, 16, 128, false}, Shape{40, 8, 256, false}, Shape{40, 4, 256, false},
                      Shape{32, 4, 128, true}}) {
    Problem p(random, shape.m, shape.groups, 1024, shape.k, Fp8Format::kOCP, Fp8Format::kOCP, false, 0, true);
    p.reduced_precision = shape.reduced_precision;
    check_gemm(p, name(p) + " groups " + std::to_string(shape.groups) +
                      (shape.reduced_precision ? " reduced-precision sums" : ""));
  }
}

TEST(ModelWoA, BmmBatchMajorAndUnalignedRows) {
  Random random(33);
  const Fp8Format f = chip_format();
  for (int64_t m : {9, 70, 300}) {
    Problem batch_major(random, m, 2, 256, 256, f, f, true, 0, false);
    check_gemm(batch_major, "batch-major " + name(batch_major));
    Problem unaligned(random, m, 2, 256, 256, f, f, false, 3, false);  // rows 3 bytes longer: no 16-byte loads
    check_gemm(unaligned, "unaligned " + name(unaligned));
  }
}

// visit(x format, w format, m) for each pair of encodings and each of the `ms` (a few rows: the split-K
// kernel; 300: the tiled one).
template <typename Visit>
void for_each_encoding_pair(std::initializer_list<int64_t> ms, Visit visit) {
  for (Fp8Format xf : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
    for (Fp8Format wf : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
      for (int64_t m : ms) visit(xf, wf, m);
    }
  }
}

TEST(ModelWoA, BmmInEveryEncodingPair) {
  Random random(34);
  for_each_encoding_pair({5, 300}, [&](Fp8Format xf, Fp8Format wf, int64_t m) {
    Problem p(random, m, 2, 256, 256, xf, wf, false, 0, true);
    check_gemm(p, name(p));
  });
}

// Codes that do not carry over between the encodings (FNUZ +-240 and NaN, OCP -0 and NaN), the largest
// values, and a NaN scale byte: the same NaN rows, the same finite values.
TEST(ModelWoA, BmmEdgeCodesAndNanScales) {
  Random random(35);
  for_each_encoding_pair({3, 300}, [&](Fp8Format xf, Fp8Format wf, int64_t m) {
    Problem p(random, m, 1, 128, 256, xf, wf, false, 0, true);
    const uint8_t x_max = xf == Fp8Format::kOCP ? 0x7E : 0x7F, w_max = wf == Fp8Format::kOCP ? 0x7E : 0x7F;
    for (int64_t kk = 0; kk < 256; kk += 5) {
      p.x[kk] = static_cast<uint8_t>(x_max | (kk % 2 ? 0x80 : 0));            // row 0: +-largest
      p.w[2 * 256 + kk] = static_cast<uint8_t>(w_max | (kk % 3 ? 0x80 : 0));  // column 2 likewise
    }
    if (xf == Fp8Format::kOCP) p.x[1 * p.x_stride_m + 7] = 0x80;  // row 1: OCP -0
    if (wf == Fp8Format::kOCP) p.w[3 * 256 + 9] = 0x80;           // column 3: OCP -0
    p.w[4 * 256 + 100] = wf == Fp8Format::kOCP ? 0x7F : 0x80;     // column 4: NaN
    p.x_scale[2 * 2 + 1] = 255;                                  // row 2, second K block: NaN scale
    check_gemm(p, "edge codes " + name(p));
  });
}

// Output rows and groups at padded strides (the op writes only [m, groups, n] inside them).
TEST(ModelWoA, BmmStridedOutput) {
  Random random(37);
  const Fp8Format f = chip_format();
  for (int64_t m : {7, 300}) {
    Problem p(random, m, 2, 256, 256, f, f, false, 0, true);
    const int64_t stride_g = 256 + 8, stride_m = 2 * stride_g + 16;
    std::vector<float> got(m * stride_m, -5.0f), want = got;
    dsv4::BmmA8W8MxScaleArgs args = p.args(got.data());
    args.out_stride_m = stride_m;
    args.out_stride_g = stride_g;
    ASSERT_EQ(dsv4::gpu::launch_bmm_a8w8_mxscale(args, nullptr), dsv4::LaunchStatus::kOk);
    args.out = want.data();
    dsv4::cpu::bmm_a8w8_mxscale(args, 0, m);
    const std::vector<double> magnitude = p.magnitudes();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < 2; ++g) {
        for (int64_t j = 0; j < stride_g; ++j) {
          const int64_t at = i * stride_m + g * stride_g + j;
          if (j >= 256) {
            ASSERT_EQ(got[at], -5.0f) << "m " << m << ": wrote outside the output rows at " << at;
            continue;
          }
          ASSERT_LE(std::fabs(got[at] - want[at]), 1e-5 * magnitude[(i * 2 + g) * 256 + j] + 1e-30)
              << "m " << m << " element " << at << " got " << got[at] << " want " << want[at];
        }
      }
      for (int64_t at = i * stride_m + 2 * stride_g; at < (i + 1) * stride_m; ++at) ASSERT_EQ(got[at], -5.0f);
    }
  }
}

}  // namespace
