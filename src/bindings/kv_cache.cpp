// Bindings of the fp8_ds_mla cache utilities (schemas in schemas.cpp).
#include <algorithm>
#include <cmath>
#include <optional>

#include "common.h"
#include "cpu/kv_cache/kv_cache_cpu.h"

namespace dsv4::bindings {
namespace {

constexpr int64_t kVectorBytes = 16;

bool aligned(const Tensor& t) { return is_aligned(t.data_ptr(), kVectorBytes); }

// A uint8 fp8_ds_mla cache: dims after the first are contiguous (one block's bytes), each block holds
// block_size records, blocks are 16-byte aligned. Only size(0) and stride(0) are used afterwards.
DsMlaCache checked_cache(const Tensor& cache, int64_t block_size, const char* op, const char* arg) {
  check_dtype(cache, op, arg, {ScalarType::Byte});
  STD_TORCH_CHECK(cache.dim() >= 2, op, ": ", arg, " must have at least 2 dims [num_blocks, ...], got shape ",
                  shape_string(cache));
  STD_TORCH_CHECK(block_size > 0, op, ": block_size must be positive, got ", block_size);
  int64_t block_bytes = 1;
  for (int64_t d = cache.dim() - 1; d >= 1; --d) {
    STD_TORCH_CHECK(cache.size(d) == 1 || cache.stride(d) == block_bytes, op, ": ", arg,
                    " must be contiguous after dim 0 (one block's bytes in a row), got shape ", shape_string(cache));
    block_bytes *= cache.size(d);
  }
  STD_TORCH_CHECK(block_bytes >= block_size * ds_mla::kRecordBytes, op, ": ", arg, " blocks of ", block_bytes,
                  " bytes cannot hold block_size=", block_size, " records of ", ds_mla::kRecordBytes, " bytes");
  STD_TORCH_CHECK(cache.size(0) <= 1 || cache.stride(0) >= block_bytes, op, ": ", arg, " blocks overlap (stride(0)=",
                  cache.stride(0), " < ", block_bytes, " bytes per block)");
  STD_TORCH_CHECK(aligned(cache) && cache.stride(0) % kVectorBytes == 0, op, ": ", arg,
                  " must start 16-byte aligned with a block stride that is a multiple of 16 bytes (stride(0)=",
                  cache.stride(0), ")");
  return DsMlaCache{static_cast<uint8_t*>(cache.data_ptr()), cache.size(0), cache.stride(0), block_size};
}

void check_index_vector(const Tensor& t, ScalarType dtype, int64_t length, const char* op, const char* arg) {
  check_dtype(t, op, arg, {dtype});
  STD_TORCH_CHECK(t.dim() == 1, op, ": ", arg, " must be 1-D, got shape ", shape_string(t));
  check_contiguous(t, op, arg);
  if (length >= 0) {
    STD_TORCH_CHECK(t.size(0) == length, op, ": ", arg, " must have ", length, " entries, got ", t.size(0));
  }
}

void quantize_and_insert_k_cache(const Tensor& k, Tensor k_cache, const Tensor& slot_mapping, int64_t block_size,
                                 int64_t fp8_format, double quant_max) {
  constexpr const char* kOp = "dsv4.quantize_and_insert_k_cache";
  check_dtype(k, kOp, "k", {ScalarType::BFloat16});
  STD_TORCH_CHECK(k.dim() == 2 && k.size(1) == ds_mla::kHeadDim, kOp, ": k must have shape [tokens, 512], got ",
                  shape_string(k));
  STD_TORCH_CHECK(k.stride(1) == 1 && (k.stride(0) * 2) % kVectorBytes == 0 && aligned(k), kOp,
                  ": k rows must be contiguous and 16-byte aligned (stride ", k.stride(0), ")");
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  KvInsertArgs args{};
  args.cache = checked_cache(k_cache, block_size, kOp, "k_cache");
  check_index_vector(slot_mapping, ScalarType::Long, -1, kOp, "slot_mapping");
  STD_TORCH_CHECK(slot_mapping.size(0) <= k.size(0), kOp, ": slot_mapping has ", slot_mapping.size(0),
                  " entries for ", k.size(0), " rows of k");
  check_same_device(k, "k", k_cache, "k_cache", kOp);
  check_same_device(k, "k", slot_mapping, "slot_mapping", kOp);
  args.k = static_cast<const uint16_t*>(k.data_ptr());
  args.k_row_stride = k.stride(0);
  args.slot_mapping = static_cast<const int64_t*>(slot_mapping.data_ptr());
  args.tokens = slot_mapping.size(0);
  args.format = format;
  args.quant_max = checked_quant_max(quant_max, format, kOp);
  run_on_device(
      k, args.tokens, kOp, [&](int64_t b, int64_t e) { cpu::quantize_and_insert_k_cache(args, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_quantize_and_insert_k_cache(args, stream));
      },
      /*cpu_grain=*/64);
}

void dequantize_and_gather_k_cache(Tensor out, const Tensor& k_cache, const Tensor& seq_lens,
                                   const std::optional<Tensor>& gather_lens, const Tensor& block_table,
                                   int64_t block_size, int64_t offset, int64_t fp8_format) {
  constexpr const char* kOp = "dsv4.dequantize_and_gather_k_cache";
  check_dtype(out, kOp, "out", {ScalarType::BFloat16});
  STD_TORCH_CHECK(out.dim() == 3 && out.size(2) == ds_mla::kHeadDim, kOp,
                  ": out must have shape [requests, rows, 512], got ", shape_string(out));
  STD_TORCH_CHECK(out.stride(2) == 1 && (out.stride(0) * 2) % kVectorBytes == 0 &&
                      (out.stride(1) * 2) % kVectorBytes == 0 && aligned(out),
                  kOp, ": out rows must be contiguous and 16-byte aligned");
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  const DsMlaCache cache = checked_cache(k_cache, block_size, kOp, "k_cache");
  const int64_t requests = out.size(0);
  check_index_vector(seq_lens, ScalarType::Int, requests, kOp, "seq_lens");
  if (gather_lens.has_value()) check_index_vector(*gather_lens, ScalarType::Int, requests, kOp, "gather_lens");
  check_dtype(block_table, kOp, "block_table", {ScalarType::Int});
  STD_TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == requests &&
                      (block_table.size(1) <= 1 || block_table.stride(1) == 1),
                  kOp, ": block_table must have shape [", requests, ", max_blocks] with contiguous rows, got ",
                  shape_string(block_table));
  STD_TORCH_CHECK(offset >= 0 && offset <= out.size(1), kOp, ": offset must be in [0, ", out.size(1), "], got ",
                  offset);
  check_same_device(out, "out", k_cache, "k_cache", kOp);
  check_same_device(out, "out", seq_lens, "seq_lens", kOp);
  check_same_device(out, "out", block_table, "block_table", kOp);
  if (gather_lens.has_value()) check_same_device(out, "out", *gather_lens, "gather_lens", kOp);
  KvGatherArgs args{};
  args.out = static_cast<uint16_t*>(out.data_ptr());
  args.out_request_stride = out.stride(0);
  args.out_row_stride = out.stride(1);
  args.out_rows = out.size(1);
  args.cache = cache.bytes;
  args.num_blocks = cache.num_blocks;
  args.block_stride = cache.block_stride;
  args.block_size = block_size;
  args.seq_lens = static_cast<const int32_t*>(seq_lens.data_ptr());
  args.gather_lens = gather_lens.has_value() ? static_cast<const int32_t*>(gather_lens->data_ptr()) : nullptr;
  args.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  args.table_row_stride = block_table.stride(0);
  args.table_cols = block_table.size(1);
  args.requests = requests;
  args.offset = offset;
  args.format = format;
  run_on_device(
      out, out.size(1) - offset > 0 ? requests : 0, kOp,
      [&](int64_t b, int64_t e) { cpu::dequantize_and_gather_k_cache(args, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_dequantize_and_gather_k_cache(args, stream));
      },
      /*cpu_grain=*/1);
}

void check_bf16_rows(const Tensor& t, int64_t dims, const char* op, const char* arg, const char* shape) {
  check_dtype(t, op, arg, {ScalarType::BFloat16});
  STD_TORCH_CHECK(t.dim() == dims && t.size(dims - 1) == ds_mla::kHeadDim, op, ": ", arg, " must have shape ", shape,
                  ", got ", shape_string(t));
  check_contiguous(t, op, arg);
  STD_TORCH_CHECK(aligned(t), op, ": ", arg, " must start 16-byte aligned");
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const uint8_t*>(a.data_ptr());
  const auto* b0 = static_cast<const uint8_t*>(b.data_ptr());
  const auto* a1 = a0 + a.numel() * static_cast<int64_t>(a.element_size());
  const auto* b1 = b0 + b.numel() * static_cast<int64_t>(b.element_size());
  return a0 < b1 && b0 < a1;
}

// Checks the KV side shared by the fused op and the KV-only op, and fills those launch arguments.
QnormRopeKvInsertArgs checked_kv_side(const Tensor& kv, const Tensor& k_cache, const Tensor& slot_mapping,
                                      const Tensor& position_ids, const Tensor& cos_sin_cache, int64_t tokens,
                                      int64_t cache_block_size, int64_t fp8_format, double quant_max, const char* op) {
  check_bf16_rows(kv, 2, op, "kv", "[tokens, 512]");
  STD_TORCH_CHECK(kv.size(0) == tokens, op, ": kv must have ", tokens, " rows (one per token), got ", kv.size(0));
  check_index_vector(position_ids, ScalarType::Long, tokens, op, "position_ids");
  check_index_vector(slot_mapping, ScalarType::Long, -1, op, "slot_mapping");
  STD_TORCH_CHECK(slot_mapping.size(0) <= tokens, op, ": slot_mapping has ", slot_mapping.size(0), " entries for ",
                  tokens, " tokens");
  check_dtype(cos_sin_cache, op, "cos_sin_cache", {ScalarType::Float});
  STD_TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == ds_mla::kRopeDim, op,
                  ": cos_sin_cache must have shape [positions, 64] (cos || sin), got ", shape_string(cos_sin_cache));
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  const Fp8Format format = checked_fp8_format(fp8_format, op);
  QnormRopeKvInsertArgs args{};
  args.cache = checked_cache(k_cache, cache_block_size, op, "k_cache");
  for (const Tensor* t : {&k_cache, &slot_mapping, &position_ids, &cos_sin_cache}) {
    check_same_device(kv, "kv", *t, "every other tensor argument", op);
  }
  args.kv = static_cast<const uint16_t*>(kv.data_ptr());
  args.slot_mapping = static_cast<const int64_t*>(slot_mapping.data_ptr());
  args.insert_tokens = slot_mapping.size(0);
  args.position_ids = static_cast<const int64_t*>(position_ids.data_ptr());
  args.cos_sin = static_cast<const float*>(cos_sin_cache.data_ptr());
  args.positions = cos_sin_cache.size(0);
  args.tokens = tokens;
  args.format = format;
  args.quant_max = checked_quant_max(quant_max, format, op);
  return args;
}

// Checks the fused op's inputs and fills its launch arguments (q_out is set by the caller).
QnormRopeKvInsertArgs checked_qnorm_rope_kv_insert(const Tensor& q_in, const Tensor& kv, const Tensor& k_cache,
                                                   const Tensor& slot_mapping, const Tensor& position_ids,
                                                   const Tensor& cos_sin_cache, int64_t q_head_padded, double eps,
                                                   int64_t cache_block_size, bool apply_q_norm, int64_t fp8_format,
                                                   double quant_max, const char* op) {
  check_bf16_rows(q_in, 3, op, "q_in", "[tokens, heads, 512]");
  STD_TORCH_CHECK(q_in.size(1) >= 1 && q_head_padded >= q_in.size(1), op, ": q_head_padded must be >= the ",
                  q_in.size(1), " heads of q_in, got ", q_head_padded);
  STD_TORCH_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  QnormRopeKvInsertArgs args = checked_kv_side(kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_in.size(0),
                                               cache_block_size, fp8_format, quant_max, op);
  check_same_device(q_in, "q_in", kv, "kv", op);
  args.q_in = static_cast<const uint16_t*>(q_in.data_ptr());
  args.heads = q_in.size(1);
  args.padded_heads = q_head_padded;
  args.eps = static_cast<float>(eps);
  args.apply_q_norm = apply_q_norm;
  return args;
}

void run_qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, const Tensor& on, const char* op) {
  run_on_device(
      on, args.tokens, op, [&](int64_t b, int64_t e) { cpu::qnorm_rope_kv_insert(args, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_qnorm_rope_kv_insert(args, stream));
      },
      /*cpu_grain=*/4);
}

Tensor qnorm_rope_kv_insert(const Tensor& q_in, const Tensor& kv, Tensor k_cache, const Tensor& slot_mapping,
                            const Tensor& position_ids, const Tensor& cos_sin_cache, int64_t q_head_padded,
                            double eps, int64_t cache_block_size, bool apply_q_norm, int64_t fp8_format,
                            double quant_max) {
  constexpr const char* kOp = "dsv4.qnorm_rope_kv_insert";
  QnormRopeKvInsertArgs args =
      checked_qnorm_rope_kv_insert(q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
                                   cache_block_size, apply_q_norm, fp8_format, quant_max, kOp);
  Tensor q_out = torch::stable::new_empty(q_in, {q_in.size(0), q_head_padded, int64_t{ds_mla::kHeadDim}});
  args.q_out = static_cast<uint16_t*>(q_out.data_ptr());
  run_qnorm_rope_kv_insert(args, q_in, kOp);
  return q_out;
}

void qnorm_rope_kv_insert_out(const Tensor& q_in, const Tensor& kv, Tensor k_cache, const Tensor& slot_mapping,
                              const Tensor& position_ids, const Tensor& cos_sin_cache, int64_t q_head_padded,
                              double eps, int64_t cache_block_size, bool apply_q_norm, int64_t fp8_format,
                              double quant_max, Tensor q_out) {
  constexpr const char* kOp = "dsv4.qnorm_rope_kv_insert.out";
  QnormRopeKvInsertArgs args =
      checked_qnorm_rope_kv_insert(q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
                                   cache_block_size, apply_q_norm, fp8_format, quant_max, kOp);
  check_bf16_rows(q_out, 3, kOp, "q_out", "[tokens, q_head_padded, 512]");
  STD_TORCH_CHECK(q_out.size(0) == q_in.size(0) && q_out.size(1) == q_head_padded, kOp, ": q_out must have shape [",
                  q_in.size(0), ", ", q_head_padded, ", 512], got ", shape_string(q_out));
  check_same_device(q_in, "q_in", q_out, "q_out", kOp);
  const bool in_place = q_out.data_ptr() == q_in.data_ptr() && q_head_padded == q_in.size(1);
  STD_TORCH_CHECK(in_place || !overlaps(q_out, q_in), kOp,
                  ": q_out may alias q_in only exactly and only when q_head_padded equals the number of heads");
  STD_TORCH_CHECK(!overlaps(q_out, kv) && !overlaps(q_out, k_cache), kOp, ": q_out must not overlap kv or k_cache");
  args.q_out = static_cast<uint16_t*>(q_out.data_ptr());
  run_qnorm_rope_kv_insert(args, q_in, kOp);
}

// The KV branch of the fused op alone (spec/kv_cache.md §6): the same kernel with no Q heads.
void kv_rope_quant_insert(const Tensor& kv, Tensor k_cache, const Tensor& slot_mapping, const Tensor& position_ids,
                          const Tensor& cos_sin_cache, int64_t cache_block_size, int64_t fp8_format,
                          double quant_max) {
  constexpr const char* kOp = "dsv4.kv_rope_quant_insert";
  STD_TORCH_CHECK(kv.dim() == 2, kOp, ": kv must have shape [tokens, 512], got ", shape_string(kv));
  QnormRopeKvInsertArgs args = checked_kv_side(kv, k_cache, slot_mapping, position_ids, cos_sin_cache, kv.size(0),
                                               cache_block_size, fp8_format, quant_max, kOp);
  STD_TORCH_CHECK(slot_mapping.size(0) == kv.size(0), kOp, ": slot_mapping must have one entry per token (",
                  kv.size(0), "), got ", slot_mapping.size(0));
  run_qnorm_rope_kv_insert(args, kv, kOp);  // heads = padded_heads = 0: only the KV slots
}

void register_kv_cache_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("kv_rope_quant_insert", TORCH_BOX(&kv_rope_quant_insert));
  m.impl("qnorm_rope_kv_insert", TORCH_BOX(&qnorm_rope_kv_insert));
  m.impl("qnorm_rope_kv_insert.out", TORCH_BOX(&qnorm_rope_kv_insert_out));
  m.impl("quantize_and_insert_k_cache", TORCH_BOX(&quantize_and_insert_k_cache));
  m.impl("dequantize_and_gather_k_cache", TORCH_BOX(&dequantize_and_gather_k_cache));
}

}  // namespace
}  // namespace dsv4::bindings

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { dsv4::bindings::register_kv_cache_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { dsv4::bindings::register_kv_cache_ops(m); }
#endif
