// Bindings of the mHC ops (schemas in schemas.cpp; spec/mhc.md).
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "common.h"
#include "cpu/mhc/mhc_cpu.h"

namespace dsv4::bindings {
namespace {

constexpr int64_t kVectorBytes = 16;
// The kernels take the flattened row in 256-wide chunks and hidden dims 8 at a time.
constexpr int64_t kHiddenMultiple = 64;

// How the kernels read a tensor argument: densely, and residual, x, fn and norm_weight 16 bytes at a time.
enum class Reads { kScalars, kVectors };

// The data of `t` as the kernels read it (contiguous_aligned), the tensor kept in `copies` for the call (spec §8
// accepts a strided post_mix). Called once every argument of the call is checked, so that a call refused for any
// reason copies nothing.
template <class T>
const T* readable(const Tensor& t, Reads reads, std::vector<Tensor>& copies) {
  copies.push_back(contiguous_aligned(t, reads == Reads::kVectors ? kVectorBytes : 1));
  return static_cast<const T*>(copies.back().data_ptr());
}

void check_same_device_all(const Tensor& on, std::initializer_list<const Tensor*> others, const char* op) {
  for (const Tensor* t : others) check_same_device(on, "residual", *t, "every other tensor argument", op);
}

// residual bf16 [T, 4, hidden]; returns hidden. collapses: the call runs pre's collapse kernel, a 256-thread
// block a token (its token count is bound by one GPU grid; post's grid is capped and loops).
int64_t checked_residual(const Tensor& residual, const char* op, bool collapses) {
  check_dtype(residual, op, "residual", {ScalarType::BFloat16});
  STD_TORCH_CHECK(residual.dim() == 3 && residual.size(1) == mhc::kHcMult, op,
                  ": residual must have shape [tokens, 4, hidden] (hc_mult 4), got ", shape_string(residual));
  const int64_t hidden = residual.size(2);
  STD_TORCH_CHECK(hidden > 0 && hidden % kHiddenMultiple == 0, op, ": hidden must be a positive multiple of ",
                  kHiddenMultiple, ", got ", hidden);
  STD_TORCH_CHECK(residual.size(0) <= std::numeric_limits<int32_t>::max(), op, ": at most 2^31 - 1 tokens, got ",
                  residual.size(0));
  if (collapses) check_gpu_grid_rows(residual, residual.size(0), 1, 256, op, "tokens");
  return hidden;
}

void check_vector(const Tensor& t, int64_t length, const char* op, const char* arg) {
  check_dtype(t, op, arg, {ScalarType::Float});
  STD_TORCH_CHECK(t.dim() == 1 && t.size(0) == length, op, ": ", arg, " must have shape [", length, "], got ",
                  shape_string(t));
}

void check_eps(double value, const char* op, const char* arg) {
  STD_TORCH_CHECK(std::isfinite(value) && value >= 0, op, ": ", arg, " must be finite and >= 0, got ", value);
}

// Checks the pre/head parameters and fills the sizes and the configuration (the data: read_pre_inputs).
MhcPreArgs checked_pre(const Tensor& residual, const Tensor& fn, const Tensor& scale, const Tensor& base, int mixes,
                       int scales, double rms_eps, double pre_eps, double sinkhorn_eps, double post_mult,
                       int64_t sinkhorn_iters, const std::optional<Tensor>& norm_weight, double norm_eps,
                       const char* op) {
  const int64_t hidden = checked_residual(residual, op, /*collapses=*/true);
  check_dtype(fn, op, "fn", {ScalarType::Float});
  STD_TORCH_CHECK(fn.dim() == 2 && fn.size(0) == mixes && fn.size(1) == mhc::kHcMult * hidden, op,
                  ": fn must have shape [", mixes, ", ", mhc::kHcMult * hidden, "], got ", shape_string(fn));
  check_vector(scale, scales, op, "scale");
  check_vector(base, mixes, op, "base");
  check_eps(rms_eps, op, "rms_eps");
  check_eps(pre_eps, op, "pre_eps");
  check_eps(sinkhorn_eps, op, "sinkhorn_eps");
  STD_TORCH_CHECK(std::isfinite(post_mult), op, ": post_mult must be finite, got ", post_mult);
  STD_TORCH_CHECK(sinkhorn_iters >= 1 && sinkhorn_iters <= 1000, op, ": sinkhorn_iters must be in [1, 1000], got ",
                  sinkhorn_iters);
  check_same_device_all(residual, {&fn, &scale, &base}, op);
  MhcPreArgs args{};
  if (norm_weight.has_value()) {
    check_dtype(*norm_weight, op, "norm_weight", {ScalarType::BFloat16});
    STD_TORCH_CHECK(norm_weight->dim() == 1 && norm_weight->size(0) == hidden, op, ": norm_weight must have shape [",
                    hidden, "], got ", shape_string(*norm_weight));
    check_eps(norm_eps, op, "norm_eps");
    check_same_device_all(residual, {&*norm_weight}, op);
  }
  args.norm_eps = static_cast<float>(norm_eps);
  args.tokens = residual.size(0);
  args.hidden = hidden;
  args.mixes = mixes;
  args.config = mhc::PreConfig{static_cast<float>(rms_eps), static_cast<float>(pre_eps),
                               static_cast<float>(sinkhorn_eps), static_cast<float>(post_mult),
                               static_cast<int>(sinkhorn_iters)};
  return args;
}

// The parameters' data, after every check of the call (the residual's is the caller's: the fused op's pre reads
// the new residual).
void read_pre_inputs(MhcPreArgs& args, const Tensor& fn, const Tensor& scale, const Tensor& base,
                     const std::optional<Tensor>& norm_weight, std::vector<Tensor>& copies) {
  args.fn = readable<float>(fn, Reads::kVectors, copies);
  args.scale = readable<float>(scale, Reads::kScalars, copies);
  args.base = readable<float>(base, Reads::kScalars, copies);
  if (norm_weight.has_value()) args.norm_weight = readable<uint16_t>(*norm_weight, Reads::kVectors, copies);
}

// The GPU workspace of the pre kernels (partial sums, pre weights, split fn), sized and recorded in args;
// kept alive by the caller until the kernels are enqueued.
std::optional<Tensor> pre_workspace(MhcPreArgs& args, const Tensor& residual) {
#if defined(DSV4OPS_WITH_GPU)
  if (!residual.is_cpu() && args.tokens > 0) {
    // The split count is sized to the residual's device (its multiprocessors), which need not be the current one.
    torch::stable::accelerator::DeviceGuard guard(residual.get_device_index());
    args.k_splits = gpu::mhc_pre_k_splits(args.tokens, args.hidden, args.mixes);
    Tensor workspace = torch::stable::new_empty(
        residual, {gpu::mhc_pre_workspace_floats(args.tokens, args.hidden, args.mixes)}, ScalarType::Float);
    args.partials = static_cast<float*>(workspace.data_ptr());
    return workspace;
  }
#endif
  (void)args;
  (void)residual;
  return std::nullopt;
}

void run_pre(MhcPreArgs& args, const Tensor& residual, const char* op) {
  std::optional<Tensor> workspace = pre_workspace(args, residual);
  run_on_device(
      residual, args.tokens, op, [&](int64_t b, int64_t e) { cpu::mhc_pre(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_mhc_pre(args, stream)); },
      /*cpu_grain=*/1);
}

std::tuple<Tensor, Tensor, Tensor> mhc_pre(const Tensor& residual, const Tensor& fn, const Tensor& scale,
                                           const Tensor& base, double rms_eps, double pre_eps, double sinkhorn_eps,
                                           double post_mult, int64_t sinkhorn_iters,
                                           const std::optional<Tensor>& norm_weight, double norm_eps) {
  constexpr const char* kOp = "dsv4.mhc_pre";
  MhcPreArgs args = checked_pre(residual, fn, scale, base, mhc::kPreMixes, 3, rms_eps, pre_eps, sinkhorn_eps,
                                post_mult, sinkhorn_iters, norm_weight, norm_eps, kOp);
  std::vector<Tensor> copies;
  read_pre_inputs(args, fn, scale, base, norm_weight, copies);
  args.residual = readable<uint16_t>(residual, Reads::kVectors, copies);
  const int64_t t = args.tokens;
  Tensor post_mix = torch::stable::new_empty(residual, {t, int64_t{mhc::kHcMult}, 1}, ScalarType::Float);
  Tensor comb_mix = torch::stable::new_empty(residual, {t, int64_t{mhc::kHcMult}, int64_t{mhc::kHcMult}},
                                             ScalarType::Float);
  Tensor layer_input = torch::stable::new_empty(residual, {t, args.hidden});
  args.post_mix = static_cast<float*>(post_mix.data_ptr());
  args.comb_mix = static_cast<float*>(comb_mix.data_ptr());
  args.out = static_cast<uint16_t*>(layer_input.data_ptr());
  run_pre(args, residual, kOp);
  return {post_mix, comb_mix, layer_input};
}

Tensor hc_head(const Tensor& residual, const Tensor& fn, const Tensor& scale, const Tensor& base, double rms_eps,
               double eps) {
  constexpr const char* kOp = "dsv4.hc_head";
  MhcPreArgs args = checked_pre(residual, fn, scale, base, mhc::kHeadMixes, 1, rms_eps, eps, 0.0, 1.0, 1,
                                std::nullopt, 0.0, kOp);
  std::vector<Tensor> copies;
  read_pre_inputs(args, fn, scale, base, std::nullopt, copies);
  args.residual = readable<uint16_t>(residual, Reads::kVectors, copies);
  Tensor out = torch::stable::new_empty(residual, {args.tokens, args.hidden});
  args.out = static_cast<uint16_t*>(out.data_ptr());
  run_pre(args, residual, kOp);
  return out;
}

// Checks the post inputs and fills the sizes (the data: read_post_inputs).
MhcPostArgs checked_post(const Tensor& x, const Tensor& residual, const Tensor& post_mix, const Tensor& comb_mix,
                         const char* op) {
  const int64_t hidden = checked_residual(residual, op, /*collapses=*/false);
  const int64_t t = residual.size(0);
  check_dtype(x, op, "x", {ScalarType::BFloat16});
  STD_TORCH_CHECK(x.dim() == 2 && x.size(0) == t && x.size(1) == hidden, op, ": x must have shape [", t, ", ",
                  hidden, "], got ", shape_string(x));
  check_dtype(post_mix, op, "post_mix", {ScalarType::Float});
  const bool post_shape = (post_mix.dim() == 3 && post_mix.size(2) == 1) || post_mix.dim() == 2;
  STD_TORCH_CHECK(post_shape && post_mix.size(0) == t && post_mix.size(1) == mhc::kHcMult, op,
                  ": post_mix must have shape [", t, ", 4, 1] or [", t, ", 4], got ", shape_string(post_mix));
  check_dtype(comb_mix, op, "comb_mix", {ScalarType::Float});
  STD_TORCH_CHECK(comb_mix.dim() == 3 && comb_mix.size(0) == t && comb_mix.size(1) == mhc::kHcMult &&
                      comb_mix.size(2) == mhc::kHcMult,
                  op, ": comb_mix must have shape [", t, ", 4, 4], got ", shape_string(comb_mix));
  check_same_device_all(residual, {&x, &post_mix, &comb_mix}, op);
  return MhcPostArgs{nullptr, nullptr, nullptr, nullptr, nullptr, t, hidden};
}

// The post inputs' data, after every check of the call.
void read_post_inputs(MhcPostArgs& args, const Tensor& x, const Tensor& residual, const Tensor& post_mix,
                      const Tensor& comb_mix, std::vector<Tensor>& copies) {
  args.x = readable<uint16_t>(x, Reads::kVectors, copies);
  args.residual = readable<uint16_t>(residual, Reads::kVectors, copies);
  args.post_mix = readable<float>(post_mix, Reads::kScalars, copies);
  args.comb_mix = readable<float>(comb_mix, Reads::kScalars, copies);
}

Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post_mix, const Tensor& comb_mix) {
  constexpr const char* kOp = "dsv4.mhc_post";
  MhcPostArgs args = checked_post(x, residual, post_mix, comb_mix, kOp);
  std::vector<Tensor> copies;
  read_post_inputs(args, x, residual, post_mix, comb_mix, copies);
  Tensor out = torch::stable::new_empty(residual, {args.tokens, int64_t{mhc::kHcMult}, args.hidden});
  args.out = static_cast<uint16_t*>(out.data_ptr());
  run_on_device(
      residual, args.tokens, kOp, [&](int64_t b, int64_t e) { cpu::mhc_post(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_mhc_post(args, stream)); },
      /*cpu_grain=*/4);
  return out;
}

// post, then the next sub-layer's pre on the bf16 new residual: the same result as the unfused pair, in one
// call. (One-pass GPU forms that fed the post values straight into the pre's dot products measured slower
// than the post kernel followed by the pre kernels on the H200: at many tokens they hold too many registers,
// and for a few tokens the longer load chain of each chunk cost what the saved launch gained.)
std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_fused_post_pre(
    const Tensor& x, const Tensor& residual, const Tensor& post_mix, const Tensor& comb_mix, const Tensor& fn,
    const Tensor& scale, const Tensor& base, double rms_eps, double pre_eps, double sinkhorn_eps, double post_mult,
    int64_t sinkhorn_iters, const std::optional<Tensor>& norm_weight, double norm_eps) {
  constexpr const char* kOp = "dsv4.mhc_fused_post_pre";
  MhcPostArgs post = checked_post(x, residual, post_mix, comb_mix, kOp);
  // pre's checks on the old residual: the new one has its shape, dtype and device.
  MhcPreArgs pre = checked_pre(residual, fn, scale, base, mhc::kPreMixes, 3, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                               sinkhorn_iters, norm_weight, norm_eps, kOp);
  std::vector<Tensor> copies;
  read_post_inputs(post, x, residual, post_mix, comb_mix, copies);
  read_pre_inputs(pre, fn, scale, base, norm_weight, copies);
  const int64_t t = post.tokens;
  Tensor new_residual = torch::stable::new_empty(residual, {t, int64_t{mhc::kHcMult}, post.hidden});
  Tensor post_out = torch::stable::new_empty(residual, {t, int64_t{mhc::kHcMult}, 1}, ScalarType::Float);
  Tensor comb_out = torch::stable::new_empty(residual, {t, int64_t{mhc::kHcMult}, int64_t{mhc::kHcMult}},
                                             ScalarType::Float);
  Tensor layer_input = torch::stable::new_empty(residual, {t, post.hidden});
  post.out = static_cast<uint16_t*>(new_residual.data_ptr());
  pre.residual = post.out;
  pre.post_mix = static_cast<float*>(post_out.data_ptr());
  pre.comb_mix = static_cast<float*>(comb_out.data_ptr());
  pre.out = static_cast<uint16_t*>(layer_input.data_ptr());
  std::optional<Tensor> workspace = pre_workspace(pre, residual);
  run_on_device(
      residual, t, kOp,
      [&](int64_t b, int64_t e) {
        cpu::mhc_post(post, b, e);
        cpu::mhc_pre(pre, b, e);
      },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_mhc_fused_post_pre(post, pre, stream)); },
      /*cpu_grain=*/1);
  return {new_residual, post_out, comb_out, layer_input};
}

void register_mhc_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("mhc_pre", TORCH_BOX(&mhc_pre));
  m.impl("mhc_post", TORCH_BOX(&mhc_post));
  m.impl("mhc_fused_post_pre", TORCH_BOX(&mhc_fused_post_pre));
  m.impl("hc_head", TORCH_BOX(&hc_head));
}

}  // namespace
}  // namespace dsv4::bindings

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { dsv4::bindings::register_mhc_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { dsv4::bindings::register_mhc_ops(m); }
#endif
