// Every dsv4 op schema, in one place. Semantics: ../../shared/spec and README's op table.
// Encodings are passed as int fp8_format: 0 = OCP e4m3fn, 1 = FNUZ e4m3fnuz (dsv4::Fp8Format).
#include "common.h"

STABLE_TORCH_LIBRARY(dsv4, m) {
  // FP8 / UE8M0 conversions (spec/kv_cache.md §7-§8, spec/wo_a.md §5.3).
  m.def("ue8m0_to_float(Tensor scale) -> Tensor");
  m.def("float_to_ue8m0_lossless(Tensor scale) -> (Tensor bytes, Tensor refusal)");
  m.def("fp8_encode(Tensor x, int fp8_format, float quant_max) -> Tensor");
  m.def(
      "fp8_block_dequantize(Tensor x, Tensor scale, int block_rows, int block_cols, int fp8_format, "
      "ScalarType out_dtype) -> Tensor");
  m.def("e4m3fn_to_fnuz(Tensor weight, Tensor scale) -> (Tensor weight_fnuz, Tensor scale_fnuz)");
  m.def("e4m3fn_to_fnuz_(Tensor(a!) weight, Tensor(b!) scale) -> ()");

  // Fused Q RMSNorm + RoPE and KV RoPE + UE8M0 quantization + fp8_ds_mla insert (spec/kv_cache.md §3).
  m.def(
      "qnorm_rope_kv_insert(Tensor q_in, Tensor kv, Tensor(a!) k_cache, Tensor slot_mapping, Tensor position_ids, "
      "Tensor cos_sin_cache, int q_head_padded, float eps, int cache_block_size, bool apply_q_norm, "
      "int fp8_format, float quant_max) -> Tensor");
  m.def(
      "qnorm_rope_kv_insert.out(Tensor q_in, Tensor kv, Tensor(a!) k_cache, Tensor slot_mapping, "
      "Tensor position_ids, Tensor cos_sin_cache, int q_head_padded, float eps, int cache_block_size, "
      "bool apply_q_norm, int fp8_format, float quant_max, *, Tensor(b!) q_out) -> ()");

  // Full-cache variants (spec/kv_cache.md §5): plain bf16 cache with Q in place; plain per-tensor FP8 cache
  // with a separate FP8 Q.
  m.def(
      "qnorm_rope_kv_insert_full_cache_bf16(Tensor(a!) q, Tensor kv, Tensor(b!) k_cache, Tensor slot_mapping, "
      "Tensor position_ids, Tensor cos_sin_cache, float eps, int cache_block_size, bool apply_q_norm) -> ()");
  m.def(
      "qnorm_rope_kv_insert_full_cache_fp8(Tensor q, Tensor kv, Tensor(a!) q_fp8, Tensor(b!) k_cache, "
      "Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, Tensor fp8_scale, Tensor q_fp8_scale_inv, "
      "float eps, int cache_block_size, bool apply_q_norm, int fp8_format, float quant_max) -> ()");

  // KV-only variants (spec/kv_cache.md §6).
  m.def(
      "kv_rope_quant_insert(Tensor kv, Tensor(a!) k_cache, Tensor slot_mapping, Tensor position_ids, "
      "Tensor cos_sin_cache, int cache_block_size, int fp8_format, float quant_max) -> ()");
  m.def(
      "kv_norm_rope_quant_insert(Tensor kv, Tensor norm_weight, Tensor(a!) k_cache, Tensor slot_mapping, "
      "Tensor position_ids, Tensor cos_sin_cache, float eps, int cache_block_size, int fp8_format, "
      "float quant_max) -> ()");

  // fp8_ds_mla cache utilities (spec/kv_cache.md §4.1, §9.1, §9.2).
  m.def(
      "quantize_and_insert_k_cache(Tensor k, Tensor(a!) k_cache, Tensor slot_mapping, int block_size, "
      "int fp8_format, float quant_max) -> ()");
  m.def(
      "dequantize_and_gather_k_cache(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, Tensor? gather_lens, "
      "Tensor block_table, int block_size, int offset, int fp8_format) -> ()");

  // mHC, hc_mult 4 (spec/mhc.md §2-§4).
  m.def(
      "mhc_pre(Tensor residual, Tensor fn, Tensor scale, Tensor base, float rms_eps, float pre_eps, "
      "float sinkhorn_eps, float post_mult, int sinkhorn_iters, Tensor? norm_weight, float norm_eps) "
      "-> (Tensor post_mix, Tensor comb_mix, Tensor layer_input)");
  m.def("mhc_post(Tensor x, Tensor residual, Tensor post_mix, Tensor comb_mix) -> Tensor");
  m.def(
      "mhc_fused_post_pre(Tensor x, Tensor residual, Tensor post_mix, Tensor comb_mix, Tensor fn, Tensor scale, "
      "Tensor base, float rms_eps, float pre_eps, float sinkhorn_eps, float post_mult, int sinkhorn_iters, "
      "Tensor? norm_weight, float norm_eps) -> (Tensor residual_cur, Tensor post_mix_cur, Tensor comb_mix_cur, "
      "Tensor layer_input_cur)");
  m.def("hc_head(Tensor residual, Tensor fn, Tensor scale, Tensor base, float rms_eps, float eps) -> Tensor");

  // wo_a (spec/wo_a.md): inverse RoPE, inverse RoPE + UE8M0 group quantization, grouped FP8 GEMM with
  // 1x128 / 128x128 UE8M0 block scales.
  m.def(
      "inverse_rope_group_quant(Tensor o, Tensor positions, Tensor cos_sin, int num_groups, int group_size, "
      "int fp8_format, float quant_max, bool apply_inverse_rope) -> (Tensor x_fp8, Tensor x_scale)");
  m.def(
      "inverse_rope_group_quant.out(Tensor o, Tensor positions, Tensor cos_sin, int num_groups, int group_size, "
      "int fp8_format, float quant_max, bool apply_inverse_rope, *, Tensor(a!) x_fp8, Tensor(b!) x_scale) -> ()");
  m.def("inverse_rope(Tensor o, Tensor positions, Tensor cos_sin) -> Tensor");
  // reduced_precision_block_sums: the caller accepts each 128-deep block summed in the matrix unit's own
  // precision where that is below fp32 (sm_90's FP8 wgmma), for its speed; ignored elsewhere.
  m.def(
      "bmm_a8w8_mxscale(Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, ScalarType out_dtype, "
      "bool reduced_precision_block_sums=False) -> Tensor");
  m.def(
      "bmm_a8w8_mxscale.out(Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, *, Tensor(a!) out, "
      "bool reduced_precision_block_sums=False) -> ()");

  // Sparse MLA decode over the fp8_ds_mla SWA ("main") and compressed ("extra") caches, with an attention
  // sink (spec/sparse_mla_decode.md).
  m.def(
      "sparse_mla_decode(Tensor q, Tensor main_cache, Tensor main_indices, Tensor main_indptr, int main_block_size, "
      "Tensor? extra_cache, Tensor? extra_indices, Tensor? extra_indptr, int extra_block_size, Tensor? attn_sink, "
      "float scale, int main_format, int extra_format, int num_splits, Tensor? cos_sin, Tensor? positions, *, "
      "Tensor(a!) out) -> ()");

  // Lightning indexer (spec/indexer.md): FP8 MQA logits (prefill), paged FP8 MQA logits (decode, MTP rows),
  // per-row top-k.
  m.def(
      "fp8_mqa_logits(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seqlen_ks, Tensor cu_seqlen_ke, "
      "bool clean_logits) -> Tensor");
  m.def(
      "fp8_paged_mqa_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_tables, "
      "int max_model_len, bool clean_logits, int kv_format) -> Tensor");
  m.def("topk_per_row_prefill(Tensor logits, Tensor ks, Tensor ke, int k, bool stable, *, Tensor(a!) out) -> ()");
  m.def("topk_per_row_decode(Tensor logits, Tensor lens, int k, bool stable, *, Tensor(a!) out) -> ()");
}
