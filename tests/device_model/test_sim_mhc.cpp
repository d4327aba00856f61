// The mHC kernels on the modelled chip against the CPU implementations: mhc_pre and hc_head through each of
// their launch forms (one block per token's epilogue and collapse for a few tokens, separate kernels for
// more, fn split once by its own kernel for many; the 32-lane epilogue for many k slices), mhc_post and the
// fused post + pre. Tolerances as tests/test_mhc.py derives them: the two sides differ only in the order of
// their fp32 sums, so post_mix and comb_mix agree within 1e-5 and a bf16 output within one bf16 step plus
// 1e-5 of the magnitude of its terms.
#include "cpu/mhc/mhc_cpu.h"
#include "mhc/mhc_launchers.h"
#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;

constexpr int kStreams = dsv4::mhc::kHcMult;

struct PreInputs {
  int64_t tokens, hidden;
  int mixes;
  std::vector<uint16_t> residual, norm_weight;
  std::vector<float> fn, scale, base;

  PreInputs(Random& random, int64_t tokens_, int64_t hidden_, int mixes_)
      : tokens(tokens_), hidden(hidden_), mixes(mixes_) {
    residual = random.bf16(tokens * kStreams * hidden);
    norm_weight = random.bf16(hidden, 1.0f);
    fn = random.floats(mixes * kStreams * hidden, 0.02f);
    scale = {0.7f, 1.3f, 0.9f};
    base = random.floats(mixes, 0.5f);
  }
};

struct PreOutputs {
  std::vector<float> post, comb;
  std::vector<uint16_t> out;
};

PreOutputs run_pre(const PreInputs& in, bool with_norm, bool on_model) {
  PreOutputs result{std::vector<float>(in.tokens * kStreams, -9.0f), std::vector<float>(in.tokens * 16, -9.0f),
                    std::vector<uint16_t>(in.tokens * in.hidden, 0x7777)};
  dsv4::MhcPreArgs args{};
  args.residual = in.residual.data();
  args.fn = in.fn.data();
  args.scale = in.scale.data();
  args.base = in.base.data();
  args.norm_weight = with_norm ? in.norm_weight.data() : nullptr;
  args.norm_eps = 1e-6f;
  args.post_mix = in.mixes == dsv4::mhc::kPreMixes ? result.post.data() : nullptr;
  args.comb_mix = in.mixes == dsv4::mhc::kPreMixes ? result.comb.data() : nullptr;
  args.out = result.out.data();
  args.tokens = in.tokens;
  args.hidden = in.hidden;
  args.mixes = in.mixes;
  args.config = dsv4::mhc::PreConfig{1e-6f, 1e-6f, 1e-6f, 2.0f, 20};
  if (!on_model) {
    dsv4::cpu::mhc_pre(args, 0, in.tokens);
    return result;
  }
  std::vector<float> workspace(dsv4::gpu::mhc_pre_workspace_floats(in.tokens, in.hidden, in.mixes));
  args.partials = workspace.data();  // 16-byte aligned, as the launcher requires (operator new's alignment)
  args.k_splits = dsv4::gpu::mhc_pre_k_splits(in.tokens, in.hidden, in.mixes);
  EXPECT_EQ(dsv4::gpu::launch_mhc_pre(args, nullptr), dsv4::LaunchStatus::kOk);
  return result;
}

// layer_input (bf16 [tokens, hidden]) against the CPU's: one bf16 step plus 1e-5 of its terms' magnitude
// (the pre weights are below 1 + eps, so sum_i |residual_i| bounds it), or with the RMSNorm, whose output is
// of the weight's size, 1e-4 of the weight.
void expect_layer_input_close(const PreInputs& in, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                              bool with_norm, const std::string& what) {
  for (int64_t t = 0; t < in.tokens; ++t) {
    for (int64_t j = 0; j < in.hidden; ++j) {
      const size_t i = t * in.hidden + j;
      const float g = dsv4::bf16_bits_to_float(got[i]), w = dsv4::bf16_bits_to_float(want[i]);
      int exponent;
      std::frexp(w, &exponent);
      double magnitude = 0.0;
      for (int s = 0; s < kStreams; ++s) {
        magnitude += std::fabs(dsv4::bf16_bits_to_float(in.residual[(t * kStreams + s) * in.hidden + j]));
      }
      const double weight = std::fabs(dsv4::bf16_bits_to_float(in.norm_weight[j]));
      const double bound = std::ldexp(1.0, exponent - 8) + (with_norm ? 1e-4 * weight : 1e-5 * magnitude);
      ASSERT_LE(std::fabs(static_cast<double>(g) - w), bound) << what << ": token " << t << " dim " << j;
    }
  }
}

void check_pre(Random& random, int64_t tokens, int64_t hidden, int mixes, bool with_norm) {
  const PreInputs in(random, tokens, hidden, mixes);
  const PreOutputs got = run_pre(in, with_norm, true);
  const PreOutputs want = run_pre(in, with_norm, false);
  const std::string what = "tokens " + std::to_string(tokens) + " hidden " + std::to_string(hidden) + " mixes " +
                           std::to_string(mixes) + (with_norm ? " norm" : "") + " k splits " +
                           std::to_string(dsv4::gpu::mhc_pre_k_splits(tokens, hidden, mixes));
  EXPECT_TRUE(close_floats(got.post, want.post, 1e-5, 1e-5)) << what;
  EXPECT_TRUE(close_floats(got.comb, want.comb, 1e-5, 0.0)) << what;
  expect_layer_input_close(in, got.out, want.out, with_norm, what);
}

TEST(ModelMhc, PreFewTokensOneBlockPerToken) {
  Random random(51);
  for (int64_t tokens : {1, 7, 70}) check_pre(random, tokens, 256, dsv4::mhc::kPreMixes, false);
  check_pre(random, 3, 2048, dsv4::mhc::kPreMixes, false);  // many k slices: the 32-lane epilogue
}

TEST(ModelMhc, PreSeparateKernelsAndSplitFn) {
  Random random(52);
  check_pre(random, 130, 128, dsv4::mhc::kPreMixes, false);  // separate epilogue and collapse
  check_pre(random, 300, 128, dsv4::mhc::kPreMixes, false);  // fn split by its own kernel
}

TEST(ModelMhc, HeadWithAndWithoutNorm) {
  Random random(53);
  for (int64_t tokens : {5, 300}) {
    for (bool norm : {false, true}) check_pre(random, tokens, 256, dsv4::mhc::kHeadMixes, norm);
  }
}

TEST(ModelMhc, Post) {
  Random random(54);
  constexpr int64_t kTokens = 9, kHidden = 256;
  const std::vector<uint16_t> x = random.bf16(kTokens * kHidden);
  const std::vector<uint16_t> residual = random.bf16(kTokens * kStreams * kHidden);
  const std::vector<float> post_mix = random.floats(kTokens * kStreams);
  std::vector<float> comb_mix(kTokens * 16);
  for (auto& c : comb_mix) c = random.uniform(0.0f, 0.5f);
  std::vector<uint16_t> got(kTokens * kStreams * kHidden), want(got.size());
  dsv4::MhcPostArgs post{x.data(), residual.data(), post_mix.data(), comb_mix.data(), got.data(), kTokens, kHidden};
  ASSERT_EQ(dsv4::gpu::launch_mhc_post(post, nullptr), dsv4::LaunchStatus::kOk);
  post.out = want.data();
  dsv4::cpu::mhc_post(post, 0, kTokens);
  EXPECT_TRUE(same_bytes(got, want));  // the same fp32 expression per value (mhc::post_value), one rounding
}

// mhc_fused_post_pre against the CPU's post, then pre on post's output: post's output byte for byte, pre's
// outputs as in check_pre (with_norm: layer_input also RMS-normalized with the norm weight). Through each launch
// form of the pre kernels.
void check_fused(Random& random, int64_t tokens, int64_t hidden, bool with_norm = false) {
  const PreInputs pre_in(random, tokens, hidden, dsv4::mhc::kPreMixes);
  const std::vector<uint16_t> x = random.bf16(tokens * hidden);
  const std::vector<uint16_t> residual = random.bf16(tokens * kStreams * hidden);
  const std::vector<float> post_mix = random.floats(tokens * kStreams);
  std::vector<float> comb_mix(tokens * 16);
  for (auto& c : comb_mix) c = random.uniform(0.0f, 0.5f);
  std::vector<uint16_t> new_residual(tokens * kStreams * hidden, 0x7777), want_residual(new_residual.size());
  dsv4::MhcPostArgs post{x.data(), residual.data(), post_mix.data(), comb_mix.data(), new_residual.data(), tokens,
                         hidden};
  PreOutputs fused{std::vector<float>(tokens * kStreams), std::vector<float>(tokens * 16),
                   std::vector<uint16_t>(tokens * hidden)};
  dsv4::MhcPreArgs pre{};
  pre.residual = new_residual.data();
  pre.fn = pre_in.fn.data();
  pre.scale = pre_in.scale.data();
  pre.base = pre_in.base.data();
  pre.post_mix = fused.post.data();
  pre.comb_mix = fused.comb.data();
  pre.out = fused.out.data();
  pre.norm_weight = with_norm ? pre_in.norm_weight.data() : nullptr;
  pre.norm_eps = 1e-6f;
  pre.tokens = tokens;
  pre.hidden = hidden;
  pre.mixes = dsv4::mhc::kPreMixes;
  pre.config = dsv4::mhc::PreConfig{1e-6f, 1e-6f, 1e-6f, 2.0f, 20};
  std::vector<float> workspace(dsv4::gpu::mhc_pre_workspace_floats(tokens, hidden, pre.mixes));
  pre.partials = workspace.data();
  pre.k_splits = dsv4::gpu::mhc_pre_k_splits(tokens, hidden, pre.mixes);
  ASSERT_EQ(dsv4::gpu::launch_mhc_fused_post_pre(post, pre, nullptr), dsv4::LaunchStatus::kOk);

  post.out = want_residual.data();
  dsv4::cpu::mhc_post(post, 0, tokens);
  const std::string what = "tokens " + std::to_string(tokens) + " hidden " + std::to_string(hidden) + " k splits " +
                           std::to_string(pre.k_splits) + (with_norm ? " norm" : "");
  EXPECT_TRUE(same_bytes(new_residual, want_residual)) << what;
  PreInputs cpu_in = pre_in;
  cpu_in.residual = want_residual;
  const PreOutputs cpu = run_pre(cpu_in, with_norm, false);
  EXPECT_TRUE(close_floats(fused.post, cpu.post, 1e-5, 1e-5)) << what;
  EXPECT_TRUE(close_floats(fused.comb, cpu.comb, 1e-5, 0.0)) << what;
  expect_layer_input_close(cpu_in, fused.out, cpu.out, with_norm, "fused " + what);
}

TEST(ModelMhc, FusedPostPre) {
  Random random(56);
  check_fused(random, 9, 256);    // one block per token's epilogue and collapse, fn split by the dots blocks
  check_fused(random, 3, 2048);   // many k slices: the 32-lane epilogue
  check_fused(random, 130, 128);  // separate epilogue and collapse
  check_fused(random, 300, 128);  // fn split once, by its own kernel
  check_fused(random, 2050, 64);  // two tiles a warp
  check_fused(random, 9, 256, true);    // the norm weight after the collapse: one kernel a token
  check_fused(random, 130, 128, true);  // and in the separate collapse kernel
}

// The DSv4 sizes at decode: Flash (hidden 4096) and Pro (hidden 7168).
TEST(ModelMhc, PreAtModelSizes) {
  Random random(55);
  for (int64_t hidden : {4096, 7168}) check_pre(random, 2, hidden, dsv4::mhc::kPreMixes, false);
}

}  // namespace
