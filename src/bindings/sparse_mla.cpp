// Binding of dsv4.sparse_mla_decode (schema in schemas.cpp; spec/sparse_mla_decode.md): the same checked
// entry point for the CPU kernel and the GPU split-K kernels (src/hip/sparse_mla/), the latter on the
// current stream with an fp32 partials workspace allocated here.
#include <cmath>
#include <optional>
#include <string>

#include "common.h"
#include "cpu/sparse_mla/sparse_mla_cpu.h"
#include "ds_mla_cache.h"
#if defined(DSV4OPS_WITH_GPU)
#include "sparse_mla/sparse_mla_launchers.h"
#endif

namespace dsv4::bindings {
namespace {

constexpr int64_t kHeadDim = 512;
constexpr int64_t kMaxSplits = 64;

void check_rows(const Tensor& t, const char* op, const char* arg) {
  check_dtype(t, op, arg, {ScalarType::BFloat16});
  STD_TORCH_CHECK(t.dim() == 3 && t.size(2) == kHeadDim && t.stride(2) == 1, op, ": ", arg,
                  " must have shape [tokens, heads, 512] with the last dim contiguous, got ", shape_string(t));
}

// One cache with its index lists; side: "main" or "extra", the prefix of the arguments' names.
SparseKeySource checked_source(const Tensor& cache, const Tensor& indices, const Tensor& indptr, int64_t block_size,
                               int64_t fp8_format, int64_t tokens, const Tensor& q, const char* op,
                               const std::string& side) {
  const std::string cache_arg = side + "_cache", indices_arg = side + "_indices", indptr_arg = side + "_indptr";
  const DsMlaCache checked = checked_cache(cache, block_size, op, cache_arg.c_str(), (side + "_block_size").c_str());
  check_dtype(indices, op, indices_arg.c_str(), {ScalarType::Int});
  STD_TORCH_CHECK(indices.dim() == 1, op, ": ", indices_arg, " must be 1-D, got ", shape_string(indices));
  check_contiguous(indices, op, indices_arg.c_str());
  check_dtype(indptr, op, indptr_arg.c_str(), {ScalarType::Int});
  STD_TORCH_CHECK(indptr.dim() == 1 && indptr.size(0) == tokens + 1, op, ": ", indptr_arg, " must have ", tokens + 1,
                  " entries, got ", shape_string(indptr));
  check_contiguous(indptr, op, indptr_arg.c_str());
  check_same_device(q, "q", cache, cache_arg.c_str(), op);
  check_same_device(q, "q", indices, indices_arg.c_str(), op);
  check_same_device(q, "q", indptr, indptr_arg.c_str(), op);
  return SparseKeySource{checked.bytes, checked.num_blocks, block_size, checked.block_stride,
                         static_cast<const int32_t*>(indices.data_ptr()), indices.size(0),
                         static_cast<const int32_t*>(indptr.data_ptr()), checked_fp8_format(fp8_format, op)};
}

void sparse_mla_decode(const Tensor& q, const Tensor& main_cache, const Tensor& main_indices,
                       const Tensor& main_indptr, int64_t main_block_size, const std::optional<Tensor>& extra_cache,
                       const std::optional<Tensor>& extra_indices, const std::optional<Tensor>& extra_indptr,
                       int64_t extra_block_size, const std::optional<Tensor>& attn_sink, double scale,
                       int64_t main_format, int64_t extra_format, int64_t num_splits,
                       const std::optional<Tensor>& cos_sin, const std::optional<Tensor>& positions, Tensor out) {
  constexpr const char* kOp = "dsv4.sparse_mla_decode";
  check_rows(q, kOp, "q");
  check_rows(out, kOp, "out");
  check_no_self_overlap(out, kOp, "out");
  STD_TORCH_CHECK(out.size(0) == q.size(0) && out.size(1) == q.size(1), kOp, ": out must have q's shape ",
                  shape_string(q), ", got ", shape_string(out));
  check_same_device(q, "q", out, "out", kOp);
  const int64_t tokens = q.size(0);
  SparseMlaDecodeArgs args{};
  args.main = checked_source(main_cache, main_indices, main_indptr, main_block_size, main_format, tokens, q, kOp,
                             "main");
  const bool has_extra = extra_cache.has_value();
  STD_TORCH_CHECK(has_extra == extra_indices.has_value() && has_extra == extra_indptr.has_value(), kOp,
                  ": extra_cache, extra_indices and extra_indptr come together");
  if (has_extra) {
    args.extra = checked_source(*extra_cache, *extra_indices, *extra_indptr, extra_block_size, extra_format, tokens, q,
                                kOp, "extra");
  }
  if (attn_sink.has_value()) {
    check_dtype(*attn_sink, kOp, "attn_sink", {ScalarType::Float});
    STD_TORCH_CHECK(attn_sink->dim() == 1 && attn_sink->size(0) >= q.size(1), kOp, ": attn_sink must be 1-D with at ",
                    "least ", q.size(1), " entries (one per head), got ", shape_string(*attn_sink));
    check_contiguous(*attn_sink, kOp, "attn_sink");
    check_same_device(q, "q", *attn_sink, "attn_sink", kOp);
    args.sink = static_cast<const float*>(attn_sink->data_ptr());
  }
  STD_TORCH_CHECK(std::isfinite(scale) && scale > 0, kOp, ": scale must be finite and positive, got ", scale);
  STD_TORCH_CHECK(num_splits >= 0 && num_splits <= kMaxSplits, kOp, ": num_splits must be in [0, ", kMaxSplits,
                  "] (0: automatic), got ", num_splits);
  STD_TORCH_CHECK(cos_sin.has_value() == positions.has_value(), kOp,
                  ": cos_sin and positions come together (they switch on the inverse-RoPE epilogue)");
  if (cos_sin.has_value()) {
    check_dtype(*cos_sin, kOp, "cos_sin", {ScalarType::Float, ScalarType::BFloat16});
    STD_TORCH_CHECK(cos_sin->dim() == 2 && cos_sin->size(1) == 64 && cos_sin->size(0) >= 1, kOp,
                    ": cos_sin must have shape [positions >= 1, 64], got ", shape_string(*cos_sin));
    check_contiguous(*cos_sin, kOp, "cos_sin");
    check_dtype(*positions, kOp, "positions", {ScalarType::Long, ScalarType::Int});
    STD_TORCH_CHECK(positions->dim() == 1 && positions->size(0) >= tokens, kOp, ": positions must be 1-D with at least ",
                    tokens, " entries, got ", shape_string(*positions));
    check_contiguous(*positions, kOp, "positions");
    check_same_device(q, "q", *cos_sin, "cos_sin", kOp);
    check_same_device(q, "q", *positions, "positions", kOp);
    args.inverse_rope = true;
    args.rope = RopeTable{cos_sin->data_ptr(), dtype_of(*cos_sin) == ScalarType::BFloat16, cos_sin->size(0),
                          positions->data_ptr(), dtype_of(*positions) == ScalarType::Long};
  }
  check_writes_apart({{out, "out"}},
                     {{q, "q"}, {main_cache, "main_cache"}, {main_indices, "main_indices"},
                      {main_indptr, "main_indptr"}},
                     kOp);
  if (has_extra) {
    check_writes_apart({{out, "out"}},
                       {{*extra_cache, "extra_cache"}, {*extra_indices, "extra_indices"},
                        {*extra_indptr, "extra_indptr"}},
                       kOp);
  }
  if (attn_sink.has_value()) check_apart(*attn_sink, "attn_sink", out, "out", kOp);
  if (cos_sin.has_value()) check_writes_apart({{out, "out"}}, {{*cos_sin, "cos_sin"}, {*positions, "positions"}}, kOp);
  args.q = static_cast<const uint16_t*>(q.data_ptr());
  args.q_token_stride = q.stride(0);
  args.q_head_stride = q.stride(1);
  args.scale = static_cast<float>(scale);
  args.num_splits = num_splits == 0 ? 1 : static_cast<int>(num_splits);  // the CPU path: one slice per row
  args.out = static_cast<uint16_t*>(out.data_ptr());
  args.out_token_stride = out.stride(0);
  args.out_head_stride = out.stride(1);
  args.tokens = tokens;
  args.heads = q.size(1);
  std::optional<Tensor> workspace;  // keeps the GPU partials alive until the kernels are enqueued
#if defined(DSV4OPS_WITH_GPU)
  if (!q.is_cpu() && tokens > 0 && args.heads > 0) {
    check_gpu_grid_rows(q, tokens, 1, 256, kOp, "query rows");  // a 256-thread partial block per row
    STD_TORCH_CHECK(args.heads <= 65535, kOp, ": at most 65535 heads on the GPU, got ", args.heads);
    // The split count is sized to q's device (its multiprocessors), which need not be the current one.
    torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
    args.num_splits = gpu::sparse_mla_decode_num_splits(args, static_cast<int>(num_splits));
    const int64_t workspace_floats = gpu::sparse_mla_workspace_floats(args);  // 0: one split, no partials
    if (workspace_floats > 0) {
      workspace = torch::stable::new_empty(q, {workspace_floats}, ScalarType::Float);
      args.partials = static_cast<float*>(workspace->data_ptr());
    }
  }
#endif
  run_on_device(
      q, args.heads > 0 ? tokens : 0, kOp, [&](int64_t b, int64_t e) { cpu::sparse_mla_decode(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_sparse_mla_decode(args, stream)); },
      /*cpu_grain=*/1);
}

void register_sparse_mla_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("sparse_mla_decode", TORCH_BOX(&sparse_mla_decode));
}

}  // namespace
}  // namespace dsv4::bindings

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { dsv4::bindings::register_sparse_mla_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { dsv4::bindings::register_sparse_mla_ops(m); }
#endif
