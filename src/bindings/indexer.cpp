// Bindings of the lightning-indexer ops (schemas in schemas.cpp; spec/indexer.md): the CPU kernels and,
// in GPU builds, the kernels of src/hip/indexer (same checked entry points, the current stream).
#include "common.h"
#include "cpu/indexer/indexer_cpu.h"
#if defined(DSV4OPS_WITH_GPU)
#include "indexer/indexer_launchers.h"
#endif

namespace dsv4::bindings {
namespace {

bool is_fp8(ScalarType type) { return type == ScalarType::Float8_e4m3fn || type == ScalarType::Float8_e4m3fnuz; }
Fp8Format format_of(ScalarType type) {
  return type == ScalarType::Float8_e4m3fnuz ? Fp8Format::kFNUZ : Fp8Format::kOCP;
}

void check_fp8(const Tensor& t, const char* op, const char* arg) {
  STD_TORCH_CHECK(is_fp8(dtype_of(t)), op, ": ", arg, " must be float8_e4m3fn or float8_e4m3fnuz (decoded per its ",
                  "dtype), got ", dtype_name(dtype_of(t)));
}

void check_int32_vector(const Tensor& t, int64_t length, const char* op, const char* arg) {
  check_dtype(t, op, arg, {ScalarType::Int});
  STD_TORCH_CHECK(t.dim() == 1 && t.size(0) == length, op, ": ", arg, " must have shape [", length, "], got ",
                  shape_string(t));
  check_contiguous(t, op, arg);
}

Tensor fp8_mqa_logits(const Tensor& q, const Tensor& k, const Tensor& k_scale, const Tensor& weights,
                      const Tensor& ks, const Tensor& ke, bool clean_logits) {
  constexpr const char* kOp = "dsv4.fp8_mqa_logits";
  check_fp8(q, kOp, "q");
  check_fp8(k, kOp, "k");
  STD_TORCH_CHECK(q.dim() == 3 && q.size(2) >= 1 && q.stride(2) == 1, kOp,
                  ": q must have shape [M, H, D] with D contiguous, got ", shape_string(q));
  const int64_t m = q.size(0), heads = q.size(1), dim = q.size(2);
  STD_TORCH_CHECK(heads >= 1, kOp, ": q must have at least one head, got shape ", shape_string(q));
  STD_TORCH_CHECK(k.dim() == 2 && k.size(1) == dim && (k.size(1) <= 1 || k.stride(1) == 1), kOp,
                  ": k must have shape [N, ", dim, "] with D contiguous, got ", shape_string(k));
  const int64_t n = k.size(0);
  const bool scale_bytes = dtype_of(k_scale) == ScalarType::Byte;
  if (scale_bytes) {
    STD_TORCH_CHECK(k_scale.dim() == 2 && k_scale.size(0) == n && k_scale.size(1) == 4, kOp,
                    ": a uint8 k_scale must be [N, 4] (one fp32 per row), got ", shape_string(k_scale));
  } else {
    check_dtype(k_scale, kOp, "k_scale", {ScalarType::Float, ScalarType::Byte});
    STD_TORCH_CHECK(k_scale.numel() == n && (k_scale.dim() == 1 || (k_scale.dim() == 2 && k_scale.size(1) == 1)), kOp,
                    ": k_scale must be [N] or [N, 1] fp32 (N = ", n, "), got ", shape_string(k_scale));
  }
  check_contiguous(k_scale, kOp, "k_scale");
  check_dtype(weights, kOp, "weights", {ScalarType::Float});
  STD_TORCH_CHECK(weights.dim() == 2 && weights.size(0) == m && weights.size(1) == heads, kOp,
                  ": weights must be [", m, ", ", heads, "], got ", shape_string(weights));
  check_contiguous(weights, kOp, "weights");
  check_int32_vector(ks, m, kOp, "cu_seqlen_ks");
  check_int32_vector(ke, m, kOp, "cu_seqlen_ke");
  for (const Tensor* t : {&k, &k_scale, &weights, &ks, &ke}) check_same_device(q, "q", *t, "every other tensor", kOp);
  // The GPU kernels read the scales as fp32: a [N, 4] uint8 view off a 4-byte boundary is copied to one on it.
  const Tensor aligned_scale = q.is_cpu() ? k_scale : contiguous_aligned(k_scale, 4);
  check_gpu_grid_rows(q, m, 2, 128, kOp, "query rows");  // the matrix kernels: two rows a 128-thread block
  // sm_90a's warpgroup kernel: blocks of 128 rows along grid y (65535 of them).
  STD_TORCH_CHECK(q.is_cpu() || m <= int64_t{65535} * 128, kOp, ": at most 8388480 query rows on a GPU, got ", m);
  Tensor logits = torch::stable::new_empty(q, {m, n}, ScalarType::Float);
  MqaLogitsArgs args{static_cast<const uint8_t*>(q.data_ptr()), q.stride(0), q.stride(1), format_of(dtype_of(q)),
                     static_cast<const uint8_t*>(k.data_ptr()), k.stride(0), format_of(dtype_of(k)),
                     static_cast<const float*>(aligned_scale.data_ptr()), static_cast<const float*>(weights.data_ptr()),
                     static_cast<const int32_t*>(ks.data_ptr()), static_cast<const int32_t*>(ke.data_ptr()),
                     static_cast<float*>(logits.data_ptr()), n, m, n, heads, dim, clean_logits};
  run_on_device(
      q, m, kOp, [&](int64_t b, int64_t e) { cpu::fp8_mqa_logits(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_fp8_mqa_logits(args, stream)); },
      /*cpu_grain=*/1);
  return logits;
}

Tensor fp8_paged_mqa_logits(const Tensor& q, const Tensor& kv_cache, const Tensor& weights, const Tensor& context_lens,
                            const Tensor& block_tables, int64_t max_model_len, bool clean_logits, int64_t kv_format) {
  constexpr const char* kOp = "dsv4.fp8_paged_mqa_logits";
  check_fp8(q, kOp, "q");
  STD_TORCH_CHECK(q.dim() == 4 && q.size(1) >= 1 && q.size(3) >= 1, kOp,
                  ": q must have shape [B, next_n, H, D], got ", shape_string(q));
  check_contiguous(q, kOp, "q");
  const int64_t batch = q.size(0), next_n = q.size(1), heads = q.size(2), dim = q.size(3);
  STD_TORCH_CHECK(heads >= 1, kOp, ": q must have at least one head, got shape ", shape_string(q));
  check_dtype(kv_cache, kOp, "kv_cache", {ScalarType::Byte});
  STD_TORCH_CHECK(kv_cache.dim() >= 2, kOp, ": kv_cache must be [num_blocks, ...] bytes, got ", shape_string(kv_cache));
  int64_t block_bytes = 1;
  for (int64_t d = kv_cache.dim() - 1; d >= 1; --d) {
    STD_TORCH_CHECK(kv_cache.size(d) == 1 || kv_cache.stride(d) == block_bytes, kOp,
                    ": kv_cache must be contiguous after dim 0 (one block's bytes in a row)");
    block_bytes *= kv_cache.size(d);
  }
  STD_TORCH_CHECK(block_bytes > 0 && block_bytes % (dim + 4) == 0, kOp, ": a kv_cache block of ", block_bytes,
                  " bytes is not a whole number of ", dim + 4, "-byte entries (", dim, " FP8 bytes + an fp32 scale)");
  STD_TORCH_CHECK(kv_cache.size(0) <= 1 || kv_cache.stride(0) >= block_bytes, kOp, ": kv_cache blocks overlap");
  check_dtype(weights, kOp, "weights", {ScalarType::Float});
  STD_TORCH_CHECK(weights.dim() == 2 && weights.size(0) == batch * next_n && weights.size(1) == heads, kOp,
                  ": weights must be [", batch * next_n, ", ", heads, "], got ", shape_string(weights));
  check_contiguous(weights, kOp, "weights");
  check_dtype(context_lens, kOp, "context_lens", {ScalarType::Int});
  const bool per_row = context_lens.dim() == 2 && context_lens.size(1) == next_n && next_n > 1;
  STD_TORCH_CHECK(context_lens.size(0) == batch &&
                      (context_lens.dim() == 1 || (context_lens.dim() == 2 && (context_lens.size(1) == 1 || per_row))),
                  kOp, ": context_lens must be [", batch, "], [", batch, ", 1] or [", batch, ", ", next_n, "], got ",
                  shape_string(context_lens));
  check_contiguous(context_lens, kOp, "context_lens");
  check_dtype(block_tables, kOp, "block_tables", {ScalarType::Int});
  STD_TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == batch &&
                      (block_tables.size(1) <= 1 || block_tables.stride(1) == 1),
                  kOp, ": block_tables must be [", batch, ", max_blocks] with contiguous rows, got ",
                  shape_string(block_tables));
  STD_TORCH_CHECK(max_model_len >= 0, kOp, ": max_model_len must be >= 0, got ", max_model_len);
  for (const Tensor* t : {&kv_cache, &weights, &context_lens, &block_tables}) {
    check_same_device(q, "q", *t, "every other tensor", kOp);
  }
  STD_TORCH_CHECK(q.is_cpu() || (is_aligned(kv_cache.data_ptr(), 4) && (kv_cache.size(0) <= 1 || kv_cache.stride(0) % 4 == 0) &&
                                 (block_bytes / (dim + 4) * dim) % 4 == 0),
                  kOp, ": on a GPU the kv_cache blocks and their fp32 scales must be 4-byte aligned");
  check_gpu_grid_rows(q, batch * next_n, 2, 128, kOp, "query rows");
  // sm_90a's warpgroup and TMA kernels: a request along grid y.
  STD_TORCH_CHECK(q.is_cpu() || batch <= 65535, kOp, ": at most 65535 requests (B) on a GPU, got ", batch);
  Tensor logits = torch::stable::new_empty(q, {batch * next_n, max_model_len}, ScalarType::Float);
  PagedMqaLogitsArgs args{};
  args.q = static_cast<const uint8_t*>(q.data_ptr());
  args.q_format = format_of(dtype_of(q));
  args.cache = static_cast<const uint8_t*>(kv_cache.data_ptr());
  args.num_blocks = kv_cache.size(0);
  args.block_size = block_bytes / (dim + 4);
  args.block_stride = kv_cache.stride(0);
  args.kv_format = checked_fp8_format(kv_format, kOp);
  args.weights = static_cast<const float*>(weights.data_ptr());
  args.context_lens = static_cast<const int32_t*>(context_lens.data_ptr());
  args.lens_per_row = per_row;
  args.block_tables = static_cast<const int32_t*>(block_tables.data_ptr());
  args.table_row_stride = block_tables.stride(0);
  args.table_cols = block_tables.size(1);
  args.logits = static_cast<float*>(logits.data_ptr());
  args.logits_row_stride = max_model_len;
  args.max_model_len = max_model_len;
  args.batch = batch;
  args.next_n = next_n;
  args.heads = heads;
  args.dim = dim;
  args.clean = clean_logits;
  run_on_device(
      q, batch * next_n, kOp, [&](int64_t b, int64_t e) { cpu::fp8_paged_mqa_logits(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_fp8_paged_mqa_logits(args, stream)); },
      /*cpu_grain=*/1);
  return logits;
}

// The top-k kernels read rows at any row stride but their columns contiguous (spec §5 allows any strides): logits
// whose columns are strided are copied first (the caller keeps the copy alive).
Tensor row_major(const Tensor& logits) {
  return logits.dim() != 2 || logits.size(1) <= 1 || logits.stride(1) == 1 ? logits : torch::stable::contiguous(logits);
}

// logits: row_major's result.
TopkPerRowArgs checked_topk(const Tensor& logits, int64_t k, const Tensor& out, const char* op) {
  check_dtype(logits, op, "logits", {ScalarType::Float});
  STD_TORCH_CHECK(logits.dim() == 2, op, ": logits must be [rows, cols], got ", shape_string(logits));
  STD_TORCH_CHECK(k >= 1, op, ": k must be >= 1, got ", k);
  check_dtype(out, op, "out", {ScalarType::Int});
  STD_TORCH_CHECK(out.dim() == 2 && out.size(0) == logits.size(0) && out.size(1) == k, op, ": out must be [",
                  logits.size(0), ", ", k, "], got ", shape_string(out));
  check_contiguous(out, op, "out");
  check_same_device(logits, "logits", out, "out", op);
  TopkPerRowArgs args{};
  args.logits = static_cast<const float*>(logits.data_ptr());
  args.row_stride = logits.stride(0);
  args.cols = logits.size(1);
  args.out = static_cast<int32_t*>(out.data_ptr());
  args.rows = logits.size(0);
  args.k = k;
  return args;
}

void run_topk(const TopkPerRowArgs& args, const Tensor& logits, const char* op) {
#if defined(DSV4OPS_WITH_GPU)
  STD_TORCH_CHECK(logits.is_cpu() || args.k <= gpu::kTopkMaxK, op, ": the GPU kernel serves k <= ", gpu::kTopkMaxK,
                  ", got k = ", args.k);
  STD_TORCH_CHECK(logits.is_cpu() || args.cols <= 0x7fffffff, op, ": the GPU kernel serves rows of < 2^31 columns");
  check_gpu_grid_rows(logits, args.rows, 1, 512, op, "rows");  // a 512-thread block a row
#endif
  run_on_device(
      logits, args.rows, op, [&](int64_t b, int64_t e) { cpu::topk_per_row(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_topk_per_row(args, stream)); },
      /*cpu_grain=*/1);
}

void topk_per_row_prefill(const Tensor& any_logits, const Tensor& ks, const Tensor& ke, int64_t k, bool stable,
                          Tensor out) {
  constexpr const char* kOp = "dsv4.topk_per_row_prefill";
  const Tensor logits = row_major(any_logits);
  TopkPerRowArgs args = checked_topk(logits, k, out, kOp);
  check_int32_vector(ks, logits.size(0), kOp, "ks");
  check_int32_vector(ke, logits.size(0), kOp, "ke");
  check_same_device(logits, "logits", ks, "ks", kOp);
  check_same_device(logits, "logits", ke, "ke", kOp);
  args.starts = static_cast<const int32_t*>(ks.data_ptr());
  args.ends = static_cast<const int32_t*>(ke.data_ptr());
  args.stable = stable;
  run_topk(args, logits, kOp);
}

void topk_per_row_decode(const Tensor& any_logits, const Tensor& lens, int64_t k, bool stable, Tensor out) {
  constexpr const char* kOp = "dsv4.topk_per_row_decode";
  const Tensor logits = row_major(any_logits);
  TopkPerRowArgs args = checked_topk(logits, k, out, kOp);
  check_int32_vector(lens, logits.size(0), kOp, "lens");
  check_same_device(logits, "logits", lens, "lens", kOp);
  args.ends = static_cast<const int32_t*>(lens.data_ptr());
  args.stable = stable;
  run_topk(args, logits, kOp);
}

void register_indexer_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("fp8_mqa_logits", TORCH_BOX(&fp8_mqa_logits));
  m.impl("fp8_paged_mqa_logits", TORCH_BOX(&fp8_paged_mqa_logits));
  m.impl("topk_per_row_prefill", TORCH_BOX(&topk_per_row_prefill));
  m.impl("topk_per_row_decode", TORCH_BOX(&topk_per_row_decode));
}

}  // namespace
}  // namespace dsv4::bindings

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { dsv4::bindings::register_indexer_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { dsv4::bindings::register_indexer_ops(m); }
#endif
