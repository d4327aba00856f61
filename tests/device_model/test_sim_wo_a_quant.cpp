// The wo_a quantizer and inverse RoPE kernels on the modelled chip against the CPU implementations, byte for
// byte.
#include <initializer_list>
#include <string>

#include "cpu/wo_a/wo_a_cpu.h"
#include "sim_test_support.h"
#include "wo_a/wo_a_launchers.h"

namespace {

using namespace dsv4_sim_test;
using dsv4::Fp8Format;

TEST(ModelWoA, InverseRopeGroupQuantMatchesCpuBytes) {
  Random random(31);
  constexpr int64_t kTokens = 17, kHeads = 4, kPositions = 32;
  std::vector<uint16_t> o = random.bf16(kTokens * kHeads * 512, 2.0f);
  o[3 * 2048 + 17] = 0x7FC0;  // NaN
  o[4 * 2048 + 600] = 0xFF80;  // -Inf
  for (int i = 0; i < 128; ++i) o[5 * 2048 + 256 + i] = 0;  // a zero group
  const std::vector<float> cos_sin = rope_table(kPositions);
  std::vector<int32_t> positions(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) positions[t] = static_cast<int32_t>((t * 3) % kPositions);
  positions[1] = -5;  // clamped
  positions[2] = 1000;
  for (Fp8Format format : {Fp8Format::kOCP, Fp8Format::kFNUZ}) {
    for (float quant_max : {224.0f, 240.0f, 448.0f}) {
      if (format == Fp8Format::kFNUZ && quant_max > 240.0f) continue;
      for (bool rotated : {true, false}) {
        for (int64_t groups : {int64_t{1}, int64_t{4}}) {
          const int64_t d = kHeads * 512 / groups;
          std::vector<uint8_t> x_got(kTokens * kHeads * 512, 0xAA), x_want = x_got;
          std::vector<uint8_t> s_got(kTokens * kHeads * 4 + 3, 0xAA), s_want = s_got;
          dsv4::InverseRopeGroupQuantArgs args{o.data(), {cos_sin.data(), false, kPositions, positions.data(), false},
                                               rotated, x_got.data(), s_got.data(), groups * d / 128, d / 128, 1,
                                               kTokens, kHeads, groups, 128, format, quant_max};
          ASSERT_EQ(dsv4::gpu::launch_inverse_rope_group_quant(args, nullptr), dsv4::LaunchStatus::kOk);
          args.x_fp8 = x_want.data();
          args.x_scale = s_want.data();
          dsv4::cpu::inverse_rope_group_quant(args, 0, kTokens);
          const std::string what = "format " + std::to_string(static_cast<int>(format)) + " quant max " +
                                   std::to_string(quant_max) + (rotated ? " rotated" : "") + " groups " +
                                   std::to_string(groups);
          EXPECT_TRUE(same_bytes(x_got, x_want)) << what;
          EXPECT_TRUE(same_bytes(s_got, s_want)) << what;
        }
      }
    }
  }
  std::vector<uint16_t> got(o.size()), want(o.size());
  dsv4::InverseRopeArgs args{o.data(), {cos_sin.data(), false, kPositions, positions.data(), false}, got.data(),
                             kTokens, kHeads};
  ASSERT_EQ(dsv4::gpu::launch_inverse_rope(args, nullptr), dsv4::LaunchStatus::kOk);
  args.out = want.data();
  dsv4::cpu::inverse_rope(args, 0, kTokens);
  EXPECT_TRUE(same_bytes(got, want));
}

// The quantizer's other forms: group sizes 32 and 64, scale rows with padding and scale bytes 1 or 2 apart (the
// non-flat scale store), a bf16 cos / sin table with int64 positions, inputs that are not 16-byte aligned (the
// element-wise path).
TEST(ModelWoA, InverseRopeGroupQuantOtherForms) {
  Random random(36);
  constexpr int64_t kTokens = 5, kHeads = 2, kPositions = 16;
  const std::vector<uint16_t> o = random.bf16(kTokens * kHeads * 512 + 8, 2.0f);
  std::vector<uint16_t> cos_sin_bf16(kPositions * 64);
  const std::vector<float> cos_sin = rope_table(kPositions);
  for (size_t i = 0; i < cos_sin.size(); ++i) cos_sin_bf16[i] = dsv4::float_to_bf16_bits(cos_sin[i]);
  const std::vector<int64_t> positions = {3, 0, 15, 99, -1};
  for (int64_t group_size : {32, 64}) {
    for (int64_t shift : {0, 1}) {  // elements of o (and bytes of x) off the allocation's 16-byte alignment
      for (int64_t block_stride : {1, 2}) {
        const int64_t groups = 2, d = kHeads * 512 / groups, blocks = d / group_size, pad = 3;
        const int64_t group_stride = blocks * block_stride + pad;
        std::vector<uint8_t> x_got(kTokens * kHeads * 512 + 16, 0xAA), x_want = x_got;
        std::vector<uint8_t> s_got(kTokens * groups * group_stride, 0xAA), s_want = s_got;
        dsv4::InverseRopeGroupQuantArgs args{o.data() + shift,
                                             {cos_sin_bf16.data(), true, kPositions, positions.data(), true},
                                             true, x_got.data() + shift, s_got.data(), groups * group_stride,
                                             group_stride, block_stride, kTokens, kHeads, groups, group_size,
                                             chip_format(), chip_quant_max()};
        ASSERT_EQ(dsv4::gpu::launch_inverse_rope_group_quant(args, nullptr), dsv4::LaunchStatus::kOk);
        args.x_fp8 = x_want.data() + shift;
        args.x_scale = s_want.data();
        dsv4::cpu::inverse_rope_group_quant(args, 0, kTokens);
        const std::string what = "group size " + std::to_string(group_size) + " shift " + std::to_string(shift) +
                                 " block stride " + std::to_string(block_stride);
        EXPECT_TRUE(same_bytes(x_got, x_want)) << what;
        EXPECT_TRUE(same_bytes(s_got, s_want)) << what;
      }
    }
  }
}

// The token and group strides of a dense [1, 1, 4] with the scale bytes 2 apart (one token, one group): only the
// block stride keeps the kernel off its dense scale store.
TEST(ModelWoA, InverseRopeGroupQuantScaleBytesApartInOneGroup) {
  Random random(37);
  constexpr int64_t kPositions = 4, kBlocks = 4, kBlockStride = 2;
  const std::vector<uint16_t> o = random.bf16(512, 2.0f);
  const std::vector<float> cos_sin = rope_table(kPositions);
  const std::vector<int64_t> positions = {1};
  std::vector<uint8_t> x_got(512, 0xAA), x_want = x_got;
  std::vector<uint8_t> s_got(kBlocks * kBlockStride, 0xAA), s_want = s_got;
  dsv4::InverseRopeGroupQuantArgs args{o.data(), {cos_sin.data(), false, kPositions, positions.data(), true},
                                       true, x_got.data(), s_got.data(), kBlocks, kBlocks, kBlockStride, 1, 1, 1, 128,
                                       chip_format(), chip_quant_max()};
  ASSERT_EQ(dsv4::gpu::launch_inverse_rope_group_quant(args, nullptr), dsv4::LaunchStatus::kOk);
  args.x_fp8 = x_want.data();
  args.x_scale = s_want.data();
  dsv4::cpu::inverse_rope_group_quant(args, 0, 1);
  EXPECT_TRUE(same_bytes(x_got, x_want));
  EXPECT_TRUE(same_bytes(s_got, s_want));
  for (int64_t i = 1; i < kBlocks * kBlockStride; i += kBlockStride) EXPECT_EQ(s_got[i], 0xAA) << "byte " << i;
}

}  // namespace
