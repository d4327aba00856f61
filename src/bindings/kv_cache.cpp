// Bindings of the fp8_ds_mla cache utilities (schemas in schemas.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "common.h"
#include "cpu/kv_cache/kv_cache_cpu.h"
#include "ds_mla_cache.h"

namespace dsv4::bindings {
namespace {

constexpr int64_t kVectorBytes = 16;

bool aligned(const Tensor& t) { return is_aligned(t.data_ptr(), kVectorBytes); }

void check_index_vector(const Tensor& t, ScalarType dtype, int64_t length, const char* op, const char* arg) {
  check_dtype(t, op, arg, {dtype});
  STD_TORCH_CHECK(t.dim() == 1, op, ": ", arg, " must be 1-D, got shape ", shape_string(t));
  check_contiguous(t, op, arg);
  if (length >= 0) {
    STD_TORCH_CHECK(t.size(0) == length, op, ": ", arg, " must have ", length, " entries, got ", t.size(0));
  }
}

// bf16 [tokens, 512] rows: unit last stride, rows 16-byte aligned (any row stride that keeps them so).
void check_bf16_row_matrix(const Tensor& t, const char* op, const char* arg) {
  check_dtype(t, op, arg, {ScalarType::BFloat16});
  STD_TORCH_CHECK(t.dim() == 2 && t.size(1) == ds_mla::kHeadDim, op, ": ", arg, " must have shape [tokens, 512], got ",
                  shape_string(t));
  STD_TORCH_CHECK(t.stride(1) == 1 && (t.stride(0) * 2) % kVectorBytes == 0 && aligned(t), op, ": ", arg,
                  " rows must be contiguous and 16-byte aligned (stride ", t.stride(0), ")");
}

void quantize_and_insert_k_cache(const Tensor& k, Tensor k_cache, const Tensor& slot_mapping, int64_t block_size,
                                 int64_t fp8_format, double quant_max) {
  constexpr const char* kOp = "dsv4.quantize_and_insert_k_cache";
  check_bf16_row_matrix(k, kOp, "k");
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  KvInsertArgs args{};
  args.cache = checked_cache(k_cache, block_size, kOp, "k_cache", "block_size");
  check_index_vector(slot_mapping, ScalarType::Long, -1, kOp, "slot_mapping");
  STD_TORCH_CHECK(slot_mapping.size(0) <= k.size(0), kOp, ": slot_mapping has ", slot_mapping.size(0),
                  " entries for ", k.size(0), " rows of k");
  check_same_device(k, "k", k_cache, "k_cache", kOp);
  check_same_device(k, "k", slot_mapping, "slot_mapping", kOp);
  check_writes_apart({{k_cache, "k_cache"}}, {{k, "k"}, {slot_mapping, "slot_mapping"}}, kOp);
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
  check_no_self_overlap(out, kOp, "out");
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  const DsMlaCache cache = checked_cache(k_cache, block_size, kOp, "k_cache", "block_size");
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
  check_writes_apart({{out, "out"}}, {{k_cache, "k_cache"}, {seq_lens, "seq_lens"}, {block_table, "block_table"}},
                     kOp);
  if (gather_lens.has_value()) check_apart(*gather_lens, "gather_lens", out, "out", kOp);
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

// A plain [num_blocks, block_size, 512] cache of `dtypes` rows (spec/kv_cache.md §4.2-§4.3): rows
// contiguous, 16-byte aligned and apart, not overlapping.
PlainKvCache checked_plain_cache(const Tensor& cache, int64_t block_size, std::initializer_list<ScalarType> dtypes,
                                 const char* op) {
  check_dtype(cache, op, "k_cache", dtypes);
  STD_TORCH_CHECK(block_size > 0, op, ": cache_block_size must be positive, got ", block_size);
  STD_TORCH_CHECK(cache.dim() == 3 && cache.size(1) == block_size && cache.size(2) == ds_mla::kHeadDim, op,
                  ": k_cache must have shape [num_blocks, ", block_size, ", 512], got ", shape_string(cache));
  const int64_t element = cache.element_size();
  // A block's row stride matters only with more than one row (a size-1 dim may carry any stride).
  const int64_t row_stride = block_size > 1 ? cache.stride(1) : ds_mla::kHeadDim;
  STD_TORCH_CHECK(cache.stride(2) == 1 && (row_stride * element) % kVectorBytes == 0 &&
                      (cache.stride(0) * element) % kVectorBytes == 0 && aligned(cache),
                  op, ": k_cache rows must be contiguous, 16-byte aligned and a multiple of 16 bytes apart");
  STD_TORCH_CHECK(row_stride >= ds_mla::kHeadDim &&
                      (cache.size(0) <= 1 || cache.stride(0) >= (block_size - 1) * row_stride + ds_mla::kHeadDim),
                  op, ": k_cache rows overlap");
  return PlainKvCache{static_cast<uint8_t*>(cache.data_ptr()), cache.size(0), block_size, cache.stride(0) * element,
                      row_stride * element};
}

// Checks the KV side shared by the whole family (kv rows, indices, cos/sin table) and fills those launch
// arguments; the caller adds the cache.
QnormRopeKvInsertArgs checked_kv_side(const Tensor& kv, const Tensor& slot_mapping, const Tensor& position_ids,
                                      const Tensor& cos_sin_cache, int64_t tokens, int64_t fp8_format,
                                      double quant_max, const char* op) {
  check_bf16_row_matrix(kv, op, "kv");
  STD_TORCH_CHECK(kv.size(0) == tokens, op, ": kv must have ", tokens, " rows (one per token), got ", kv.size(0));
  check_index_vector(position_ids, ScalarType::Long, tokens, op, "position_ids");
  check_index_vector(slot_mapping, ScalarType::Long, -1, op, "slot_mapping");
  STD_TORCH_CHECK(slot_mapping.size(0) <= tokens, op, ": slot_mapping has ", slot_mapping.size(0), " entries for ",
                  tokens, " tokens");
  check_dtype(cos_sin_cache, op, "cos_sin_cache", {ScalarType::Float});
  STD_TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == ds_mla::kRopeDim, op,
                  ": cos_sin_cache must have shape [positions, 64] (cos || sin), got ", shape_string(cos_sin_cache));
  check_contiguous(cos_sin_cache, op, "cos_sin_cache");
  for (const Tensor* t : {&slot_mapping, &position_ids, &cos_sin_cache}) {
    check_same_device(kv, "kv", *t, "every other tensor argument", op);
  }
  const Fp8Format format = checked_fp8_format(fp8_format, op);
  QnormRopeKvInsertArgs args{};
  args.kv = static_cast<const uint16_t*>(kv.data_ptr());
  args.kv_row_stride = kv.stride(0);
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

void set_ds_mla_cache(QnormRopeKvInsertArgs& args, const Tensor& k_cache, const Tensor& kv, int64_t block_size,
                      const char* op) {
  args.kv_store = KvRowStore::kDsMlaRecord;
  args.cache = checked_cache(k_cache, block_size, op, "k_cache", "cache_block_size");
  check_same_device(kv, "kv", k_cache, "k_cache", op);
}

// The Q input: bf16 [tokens, heads >= 1, 512], contiguous. Checked before the KV side, so that a bad q
// is reported as such and not as a token-count mismatch.
void check_q(const Tensor& q, const char* arg, const char* op) {
  check_bf16_rows(q, 3, op, arg, "[tokens, heads, 512]");
  STD_TORCH_CHECK(q.size(1) >= 1, op, ": ", arg, " must have at least one head, got shape ", shape_string(q));
}

// Fills the Q side (q checked by check_q) and the norm settings.
void set_q_side(QnormRopeKvInsertArgs& args, const Tensor& q, const char* arg, const Tensor& kv, double eps,
                bool apply_q_norm, const char* op) {
  STD_TORCH_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  check_same_device(q, arg, kv, "kv", op);
  args.q_in = static_cast<const uint16_t*>(q.data_ptr());
  args.heads = q.size(1);
  args.padded_heads = q.size(1);
  args.eps = static_cast<float>(eps);
  args.apply_q_norm = apply_q_norm;
}

// A 1-element fp32 scale tensor on kv's device, read by the kernel (no host sync).
const float* checked_scalar(const Tensor& t, const Tensor& kv, const char* op, const char* arg) {
  check_dtype(t, op, arg, {ScalarType::Float});
  STD_TORCH_CHECK(t.numel() == 1, op, ": ", arg, " must have exactly one element, got shape ", shape_string(t));
  check_same_device(kv, "kv", t, arg, op);
  return static_cast<const float*>(t.data_ptr());
}

// Checks the fused op's inputs and fills its launch arguments (q_out is set by the caller).
QnormRopeKvInsertArgs checked_qnorm_rope_kv_insert(const Tensor& q_in, const Tensor& kv, const Tensor& k_cache,
                                                   const Tensor& slot_mapping, const Tensor& position_ids,
                                                   const Tensor& cos_sin_cache, int64_t q_head_padded, double eps,
                                                   int64_t cache_block_size, bool apply_q_norm, int64_t fp8_format,
                                                   double quant_max, const char* op) {
  check_q(q_in, "q_in", op);
  QnormRopeKvInsertArgs args = checked_kv_side(kv, slot_mapping, position_ids, cos_sin_cache, q_in.size(0),
                                               fp8_format, quant_max, op);
  set_ds_mla_cache(args, k_cache, kv, cache_block_size, op);
  check_writes_apart({{k_cache, "k_cache"}},
                     {{q_in, "q_in"}, {kv, "kv"}, {slot_mapping, "slot_mapping"}, {position_ids, "position_ids"},
                      {cos_sin_cache, "cos_sin_cache"}},
                     op);
  set_q_side(args, q_in, "q_in", kv, eps, apply_q_norm, op);
  STD_TORCH_CHECK(q_head_padded >= q_in.size(1), op, ": q_head_padded must be >= the ", q_in.size(1),
                  " heads of q_in, got ", q_head_padded);
  args.padded_heads = q_head_padded;
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
  check_writes_apart({{q_out, "q_out"}},
                     {{k_cache, "k_cache"}, {kv, "kv"}, {slot_mapping, "slot_mapping"},
                      {position_ids, "position_ids"}, {cos_sin_cache, "cos_sin_cache"}},
                     kOp);
  args.q_out = static_cast<uint16_t*>(q_out.data_ptr());
  run_qnorm_rope_kv_insert(args, q_in, kOp);
}

// spec/kv_cache.md §5, bf16 variant: Q rewritten in place, KV rotated into a plain bf16 cache.
void qnorm_rope_kv_insert_full_cache_bf16(Tensor q, const Tensor& kv, Tensor k_cache, const Tensor& slot_mapping,
                                          const Tensor& position_ids, const Tensor& cos_sin_cache, double eps,
                                          int64_t cache_block_size, bool apply_q_norm) {
  constexpr const char* kOp = "dsv4.qnorm_rope_kv_insert_full_cache_bf16";
  check_q(q, "q", kOp);
  QnormRopeKvInsertArgs args = checked_kv_side(kv, slot_mapping, position_ids, cos_sin_cache, q.size(0),
                                               static_cast<int64_t>(Fp8Format::kOCP),
                                               Fp8Traits<Fp8Format::kOCP>::kMaxFinite, kOp);  // unused: no FP8
  set_q_side(args, q, "q", kv, eps, apply_q_norm, kOp);
  args.kv_store = KvRowStore::kBf16Row;
  args.rows = checked_plain_cache(k_cache, cache_block_size, {ScalarType::BFloat16}, kOp);
  check_same_device(kv, "kv", k_cache, "k_cache", kOp);
  check_writes_apart({{q, "q"}, {k_cache, "k_cache"}},
                     {{kv, "kv"}, {slot_mapping, "slot_mapping"}, {position_ids, "position_ids"},
                      {cos_sin_cache, "cos_sin_cache"}},
                     kOp);
  args.q_out = static_cast<uint16_t*>(q.data_ptr());  // in place: each Q row is read before it is written
  run_qnorm_rope_kv_insert(args, q, kOp);
}

// spec/kv_cache.md §5, FP8 variant: Q (read only) into q_fp8 and KV into a plain FP8 cache, each scaled by a
// per-tensor factor from fp32 with no bf16 round. The bytes follow fp8_format whatever the float8 dtype of
// the tensors (on gfx942 vLLM keeps FNUZ bytes in float8_e4m3fn tensors).
void qnorm_rope_kv_insert_full_cache_fp8(const Tensor& q, const Tensor& kv, Tensor q_fp8, Tensor k_cache,
                                         const Tensor& slot_mapping, const Tensor& position_ids,
                                         const Tensor& cos_sin_cache, const Tensor& fp8_scale,
                                         const Tensor& q_fp8_scale_inv, double eps, int64_t cache_block_size,
                                         bool apply_q_norm, int64_t fp8_format, double quant_max) {
  constexpr const char* kOp = "dsv4.qnorm_rope_kv_insert_full_cache_fp8";
  const std::initializer_list<ScalarType> fp8_dtypes = {ScalarType::Float8_e4m3fn, ScalarType::Float8_e4m3fnuz,
                                                        ScalarType::Byte};
  check_q(q, "q", kOp);
  QnormRopeKvInsertArgs args =
      checked_kv_side(kv, slot_mapping, position_ids, cos_sin_cache, q.size(0), fp8_format, quant_max, kOp);
  set_q_side(args, q, "q", kv, eps, apply_q_norm, kOp);
  args.kv_store = KvRowStore::kFp8Row;
  args.rows = checked_plain_cache(k_cache, cache_block_size, fp8_dtypes, kOp);
  check_same_device(kv, "kv", k_cache, "k_cache", kOp);
  check_dtype(q_fp8, kOp, "q_fp8", fp8_dtypes);
  STD_TORCH_CHECK(q_fp8.dim() == 3 && q_fp8.size(0) == q.size(0) && q_fp8.size(1) == q.size(1) &&
                      q_fp8.size(2) == ds_mla::kHeadDim,
                  kOp, ": q_fp8 must have q's shape ", shape_string(q), ", got ", shape_string(q_fp8));
  check_contiguous(q_fp8, kOp, "q_fp8");
  STD_TORCH_CHECK(aligned(q_fp8), kOp, ": q_fp8 must start 16-byte aligned");
  check_same_device(kv, "kv", q_fp8, "q_fp8", kOp);
  args.q_fp8 = static_cast<uint8_t*>(q_fp8.data_ptr());
  args.q_scale_inverse = checked_scalar(q_fp8_scale_inv, kv, kOp, "q_fp8_scale_inv");
  args.kv_scale = checked_scalar(fp8_scale, kv, kOp, "fp8_scale");
  check_writes_apart({{q_fp8, "q_fp8"}, {k_cache, "k_cache"}},
                     {{q, "q"}, {kv, "kv"}, {slot_mapping, "slot_mapping"}, {position_ids, "position_ids"},
                      {cos_sin_cache, "cos_sin_cache"}, {fp8_scale, "fp8_scale"},
                      {q_fp8_scale_inv, "q_fp8_scale_inv"}},
                     kOp);
  run_qnorm_rope_kv_insert(args, q, kOp);
}

// The KV-only ops' arguments (spec/kv_cache.md §6): one slot per token, an fp8_ds_mla cache, no Q heads.
QnormRopeKvInsertArgs checked_kv_only(const Tensor& kv, const Tensor& k_cache, const Tensor& slot_mapping,
                                      const Tensor& position_ids, const Tensor& cos_sin_cache, int64_t cache_block_size,
                                      int64_t fp8_format, double quant_max, const char* op) {
  STD_TORCH_CHECK(kv.dim() == 2, op, ": kv must have shape [tokens, 512], got ", shape_string(kv));
  QnormRopeKvInsertArgs args =
      checked_kv_side(kv, slot_mapping, position_ids, cos_sin_cache, kv.size(0), fp8_format, quant_max, op);
  set_ds_mla_cache(args, k_cache, kv, cache_block_size, op);
  check_writes_apart({{k_cache, "k_cache"}},
                     {{kv, "kv"}, {slot_mapping, "slot_mapping"}, {position_ids, "position_ids"},
                      {cos_sin_cache, "cos_sin_cache"}},
                     op);
  STD_TORCH_CHECK(slot_mapping.size(0) == kv.size(0), op, ": slot_mapping must have one entry per token (",
                  kv.size(0), "), got ", slot_mapping.size(0));
  return args;
}

// The KV branch of the fused op alone (spec/kv_cache.md §6): the same kernel with no Q heads.
void kv_rope_quant_insert(const Tensor& kv, Tensor k_cache, const Tensor& slot_mapping, const Tensor& position_ids,
                          const Tensor& cos_sin_cache, int64_t cache_block_size, int64_t fp8_format,
                          double quant_max) {
  constexpr const char* kOp = "dsv4.kv_rope_quant_insert";
  QnormRopeKvInsertArgs args = checked_kv_only(kv, k_cache, slot_mapping, position_ids, cos_sin_cache,
                                               cache_block_size, fp8_format, quant_max, kOp);
  run_qnorm_rope_kv_insert(args, kv, kOp);  // heads = padded_heads = 0: only the KV slots
}

// kv_rope_quant_insert with a weighted RMSNorm of the KV row first (spec/kv_cache.md §6).
void kv_norm_rope_quant_insert(const Tensor& kv, const Tensor& norm_weight, Tensor k_cache,
                               const Tensor& slot_mapping, const Tensor& position_ids, const Tensor& cos_sin_cache,
                               double eps, int64_t cache_block_size, int64_t fp8_format, double quant_max) {
  constexpr const char* kOp = "dsv4.kv_norm_rope_quant_insert";
  QnormRopeKvInsertArgs args = checked_kv_only(kv, k_cache, slot_mapping, position_ids, cos_sin_cache,
                                               cache_block_size, fp8_format, quant_max, kOp);
  check_bf16_rows(norm_weight, 1, kOp, "norm_weight", "[512]");
  check_same_device(kv, "kv", norm_weight, "norm_weight", kOp);
  check_apart(norm_weight, "norm_weight", k_cache, "k_cache", kOp);
  STD_TORCH_CHECK(std::isfinite(eps) && eps >= 0, kOp, ": eps must be finite and >= 0, got ", eps);
  args.kv_norm_weight = static_cast<const uint16_t*>(norm_weight.data_ptr());
  args.eps = static_cast<float>(eps);
  run_qnorm_rope_kv_insert(args, kv, kOp);
}

void register_kv_cache_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("kv_rope_quant_insert", TORCH_BOX(&kv_rope_quant_insert));
  m.impl("kv_norm_rope_quant_insert", TORCH_BOX(&kv_norm_rope_quant_insert));
  m.impl("qnorm_rope_kv_insert_full_cache_bf16", TORCH_BOX(&qnorm_rope_kv_insert_full_cache_bf16));
  m.impl("qnorm_rope_kv_insert_full_cache_fp8", TORCH_BOX(&qnorm_rope_kv_insert_full_cache_fp8));
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
