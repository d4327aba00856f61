"""Fake (meta) implementations of every dsv4 op: shapes and dtypes only, for torch.compile and opcheck."""

import torch

from .platform import Fp8Format


@torch.library.register_fake("dsv4::ue8m0_to_float")
def _ue8m0_to_float(scale):
    return torch.empty_like(scale, dtype=torch.float32)


@torch.library.register_fake("dsv4::float_to_ue8m0_lossless")
def _float_to_ue8m0_lossless(scale):
    return torch.empty_like(scale, dtype=torch.uint8), torch.empty_like(scale, dtype=torch.uint8)


@torch.library.register_fake("dsv4::fp8_encode")
def _fp8_encode(x, fp8_format, quant_max):
    return torch.empty_like(x, dtype=Fp8Format(fp8_format).torch_dtype)


@torch.library.register_fake("dsv4::fp8_block_dequantize")
def _fp8_block_dequantize(x, scale, block_rows, block_cols, fp8_format, out_dtype):
    return torch.empty_like(x, dtype=out_dtype)


@torch.library.register_fake("dsv4::e4m3fn_to_fnuz")
def _e4m3fn_to_fnuz(weight, scale):
    weight_dtype = torch.float8_e4m3fnuz if weight.dtype == torch.float8_e4m3fn else weight.dtype
    return torch.empty_like(weight, dtype=weight_dtype), torch.empty_like(scale)


@torch.library.register_fake("dsv4::e4m3fn_to_fnuz_")
def _e4m3fn_to_fnuz_inplace(weight, scale):
    return None


@torch.library.register_fake("dsv4::quantize_and_insert_k_cache")
def _quantize_and_insert_k_cache(k, k_cache, slot_mapping, block_size, fp8_format, quant_max):
    return None


@torch.library.register_fake("dsv4::dequantize_and_gather_k_cache")
def _dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, fp8_format):
    return None


@torch.library.register_fake("dsv4::qnorm_rope_kv_insert")
def _qnorm_rope_kv_insert(q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
                          cache_block_size, apply_q_norm, fp8_format, quant_max):
    return q_in.new_empty((q_in.shape[0], q_head_padded, q_in.shape[2]))


@torch.library.register_fake("dsv4::qnorm_rope_kv_insert.out")
def _qnorm_rope_kv_insert_out(q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
                              cache_block_size, apply_q_norm, fp8_format, quant_max, *, q_out):
    return None


@torch.library.register_fake("dsv4::kv_rope_quant_insert")
def _kv_rope_quant_insert(kv, k_cache, slot_mapping, position_ids, cos_sin_cache, cache_block_size, fp8_format,
                          quant_max):
    return None


@torch.library.register_fake("dsv4::kv_norm_rope_quant_insert")
def _kv_norm_rope_quant_insert(kv, norm_weight, k_cache, slot_mapping, position_ids, cos_sin_cache, eps,
                               cache_block_size, fp8_format, quant_max):
    return None


@torch.library.register_fake("dsv4::qnorm_rope_kv_insert_full_cache_bf16")
def _qnorm_rope_kv_insert_full_cache_bf16(q, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, eps,
                                          cache_block_size, apply_q_norm):
    return None


@torch.library.register_fake("dsv4::qnorm_rope_kv_insert_full_cache_fp8")
def _qnorm_rope_kv_insert_full_cache_fp8(q, kv, q_fp8, k_cache, slot_mapping, position_ids, cos_sin_cache,
                                         fp8_scale, q_fp8_scale_inv, eps, cache_block_size, apply_q_norm,
                                         fp8_format, quant_max):
    return None


def _mhc_pre_outputs(residual):
    t, streams, hidden = residual.shape
    return (residual.new_empty((t, streams, 1), dtype=torch.float32),
            residual.new_empty((t, streams, streams), dtype=torch.float32), residual.new_empty((t, hidden)))


@torch.library.register_fake("dsv4::mhc_pre")
def _mhc_pre(residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters, norm_weight,
             norm_eps):
    return _mhc_pre_outputs(residual)


@torch.library.register_fake("dsv4::mhc_post")
def _mhc_post(x, residual, post_mix, comb_mix):
    return residual.new_empty(residual.shape)  # contiguous, whatever the residual's layout


@torch.library.register_fake("dsv4::mhc_fused_post_pre")
def _mhc_fused_post_pre(x, residual, post_mix, comb_mix, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                        sinkhorn_iters, norm_weight, norm_eps):
    return (residual.new_empty(residual.shape),) + _mhc_pre_outputs(residual)


@torch.library.register_fake("dsv4::hc_head")
def _hc_head(residual, fn, scale, base, rms_eps, eps):
    return residual.new_empty((residual.shape[0], residual.shape[2]))


def _group_quant_shapes(o, num_groups, group_size):
    d = o.shape[1] * o.shape[2] // num_groups
    return (o.shape[0], num_groups, d), (o.shape[0], num_groups, d // group_size)


@torch.library.register_fake("dsv4::inverse_rope_group_quant")
def _inverse_rope_group_quant(o, positions, cos_sin, num_groups, group_size, fp8_format, quant_max, apply_inverse_rope):
    x_shape, scale_shape = _group_quant_shapes(o, num_groups, group_size)
    dtype = torch.float8_e4m3fnuz if fp8_format == 1 else torch.float8_e4m3fn
    return o.new_empty(x_shape, dtype=dtype), o.new_empty(scale_shape, dtype=torch.uint8)


@torch.library.register_fake("dsv4::inverse_rope_group_quant.out")
def _inverse_rope_group_quant_out(o, positions, cos_sin, num_groups, group_size, fp8_format, quant_max, apply_inverse_rope, *,
                                  x_fp8, x_scale):
    return None


@torch.library.register_fake("dsv4::inverse_rope")
def _inverse_rope(o, positions, cos_sin):
    return torch.empty_like(o)


@torch.library.register_fake("dsv4::bmm_a8w8_mxscale")
def _bmm_a8w8_mxscale(x, w, x_scale, w_scale, out_dtype, reduced_precision_block_sums=False):
    return x.new_empty((x.shape[0], x.shape[1], w.shape[1]), dtype=out_dtype)


@torch.library.register_fake("dsv4::bmm_a8w8_mxscale.out")
def _bmm_a8w8_mxscale_out(x, w, x_scale, w_scale, *, out, reduced_precision_block_sums=False):
    return None


@torch.library.register_fake("dsv4::sparse_mla_decode")
def _sparse_mla_decode(q, main_cache, main_indices, main_indptr, main_block_size, extra_cache, extra_indices,
                       extra_indptr, extra_block_size, attn_sink, scale, main_format, extra_format, num_splits, cos_sin,
                       positions, *, out):
    return None


@torch.library.register_fake("dsv4::fp8_mqa_logits")
def _fp8_mqa_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


@torch.library.register_fake("dsv4::fp8_paged_mqa_logits")
def _fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, clean_logits, kv_format):
    return q.new_empty((q.shape[0] * q.shape[1], max_model_len), dtype=torch.float32)


@torch.library.register_fake("dsv4::topk_per_row_prefill")
def _topk_per_row_prefill(logits, ks, ke, k, stable, *, out):
    return None


@torch.library.register_fake("dsv4::topk_per_row_decode")
def _topk_per_row_decode(logits, lens, k, stable, *, out):
    return None
