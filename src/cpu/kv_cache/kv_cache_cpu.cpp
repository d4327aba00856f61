#include "kv_cache_cpu.h"

#include <cmath>
#include <cstring>

#include "dsv4/bf16.h"
#include "dsv4/rope.h"

namespace dsv4::cpu {
namespace {

template <Fp8Format F>
void write_record(const uint16_t* k, const DsMlaCache& cache, float quant_max, int64_t slot) {
  const ds_mla::RecordAddress address = ds_mla::record_address(slot, cache.block_size, cache.block_stride);
  uint8_t* data = cache.bytes + address.data;
  uint8_t* scales = cache.bytes + address.scale;
  for (int block = 0; block < ds_mla::kNumQuantBlocks; ++block) {
    const uint16_t* x = k + block * ds_mla::kQuantBlock;
    float amax = 0.0f;  // std::fmax ignores NaN
    for (int i = 0; i < ds_mla::kQuantBlock; ++i) amax = std::fmax(amax, std::fabs(bf16_bits_to_float(x[i])));
    const uint8_t scale_byte = ue8m0_encode_rceil(amax, quant_max, ds_mla::kAmaxFloor);
    const float inverse_scale = ds_mla::ue8m0_inverse_scale(scale_byte);
    for (int i = 0; i < ds_mla::kQuantBlock; ++i) {
      data[block * ds_mla::kQuantBlock + i] =
          ds_mla::quantize_nope_value<F>(bf16_bits_to_float(x[i]), inverse_scale, quant_max);
    }
    scales[block] = scale_byte;
  }
  scales[ds_mla::kNumQuantBlocks] = 0;
  std::memcpy(data + ds_mla::kNopeDim, k + ds_mla::kNopeDim, 2 * ds_mla::kRopeDim);  // little-endian bf16
}

template <Fp8Format F>
void read_record(const KvGatherArgs& args, int64_t slot, uint16_t* out) {
  const ds_mla::RecordAddress address = ds_mla::record_address(slot, args.block_size, args.block_stride);
  ds_mla::decode_record<F>(args.cache + address.data, args.cache + address.scale, out);
}

// One row of 512 bf16 values into fp32: optional RMSNorm (weightless, or with a bf16 weight and the
// result rounded to bf16), then GPT-J RoPE on dims 448..511.
void norm_rope_row(const uint16_t* in, float* values, bool apply_norm, const uint16_t* norm_weight, float eps,
                   const float* cos_sin_row) {
  float sum = 0.0f;
  for (int i = 0; i < ds_mla::kHeadDim; ++i) {
    values[i] = bf16_bits_to_float(in[i]);
    sum += values[i] * values[i];
  }
  if (apply_norm) {
    const float factor = rms_inverse(sum, ds_mla::kHeadDim, eps);
    for (int i = 0; i < ds_mla::kHeadDim; ++i) {
      values[i] *= factor;
      if (norm_weight != nullptr) {
        values[i] = bf16_bits_to_float(float_to_bf16_bits(values[i] * bf16_bits_to_float(norm_weight[i])));
      }
    }
  }
  for (int pair = 0; pair < ds_mla::kRopeDim / 2; ++pair) {
    rope_rotate_pair(values[ds_mla::kNopeDim + 2 * pair], values[ds_mla::kNopeDim + 2 * pair + 1], cos_sin_row[pair],
                     cos_sin_row[ds_mla::kRopeDim / 2 + pair]);
  }
}

template <Fp8Format F>
void store_fp8_row(uint8_t* out, const float* values, float multiplier, float quant_max) {
  for (int i = 0; i < ds_mla::kHeadDim; ++i) {
    out[i] = fp8_encode_clamped_nan_to_min<F>(values[i] * multiplier, quant_max);
  }
}

template <Fp8Format F>
void store_kv_row(const QnormRopeKvInsertArgs& args, int64_t slot, const float* values) {
  uint16_t rounded[ds_mla::kHeadDim];
  switch (args.kv_store) {
    case KvRowStore::kBf16Row: {
      uint8_t* row = args.rows.row(slot);
      for (int i = 0; i < ds_mla::kHeadDim; ++i) rounded[i] = float_to_bf16_bits(values[i]);
      std::memcpy(row, rounded, sizeof(rounded));
      break;
    }
    case KvRowStore::kFp8Row:
      store_fp8_row<F>(args.rows.row(slot), values, 1.0f / *args.kv_scale, args.quant_max);
      break;
    default:
      for (int i = 0; i < ds_mla::kHeadDim; ++i) rounded[i] = float_to_bf16_bits(values[i]);
      write_record<F>(rounded, args.cache, args.quant_max, slot);
      break;
  }
}

}  // namespace

void qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, int64_t begin, int64_t end) {
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    float values[ds_mla::kHeadDim];
    for (int64_t token = begin; token < end; ++token) {
      const int64_t position = args.position_ids[token];
      const bool position_ok = position >= 0 && position < args.positions;
      const float* cos_sin_row = args.cos_sin + (position_ok ? position : 0) * ds_mla::kRopeDim;
      if (token < args.insert_tokens && position_ok) {
        const int64_t slot = args.slot_mapping[token];
        if (slot >= 0 && slot < args.kv_capacity()) {
          norm_rope_row(args.kv + token * args.kv_row_stride, values, args.kv_norm_weight != nullptr,
                        args.kv_norm_weight, args.eps, cos_sin_row);
          store_kv_row<kFormat>(args, slot, values);
        }
      }
      for (int64_t head = 0; head < args.padded_heads; ++head) {
        const int64_t row = token * args.padded_heads + head;
        const bool zero_row = head >= args.heads || !position_ok;
        if (!zero_row) {
          norm_rope_row(args.q_in + (token * args.heads + head) * ds_mla::kHeadDim, values, args.apply_q_norm,
                        nullptr, args.eps, cos_sin_row);
        }
        if (args.q_fp8 != nullptr) {  // the zero byte is +0 in both encodings
          uint8_t* out = args.q_fp8 + row * ds_mla::kHeadDim;
          if (zero_row) {
            std::memset(out, 0, ds_mla::kHeadDim);
          } else {
            store_fp8_row<kFormat>(out, values, *args.q_scale_inverse, args.quant_max);
          }
          continue;
        }
        uint16_t* out = args.q_out + row * ds_mla::kHeadDim;
        if (zero_row) {
          std::memset(out, 0, 2 * ds_mla::kHeadDim);
          continue;
        }
        for (int i = 0; i < ds_mla::kHeadDim; ++i) out[i] = float_to_bf16_bits(values[i]);
      }
    }
  });
}

void quantize_and_insert_k_cache(const KvInsertArgs& args, int64_t begin, int64_t end) {
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    for (int64_t token = begin; token < end; ++token) {
      const int64_t slot = args.slot_mapping[token];
      if (slot < 0 || slot >= args.cache.capacity()) continue;
      write_record<kFormat>(args.k + token * args.k_row_stride, args.cache, args.quant_max, slot);
    }
  });
}

void dequantize_and_gather_k_cache(const KvGatherArgs& args, int64_t begin, int64_t end) {
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    for (int64_t request = begin; request < end; ++request) {
      const int64_t seq_len = args.seq_len(request);
      const int64_t count = args.rows_to_gather(request);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t logical = seq_len - count + i;
        const KvGatherArgs::Location location = args.locate(request, logical);
        uint16_t* out = args.out + request * args.out_request_stride + (args.offset + i) * args.out_row_stride;
        if (location.block < 0) {
          std::memset(out, 0, 2 * ds_mla::kHeadDim);
          continue;
        }
        read_record<kFormat>(args, location.block * args.block_size + location.position, out);
      }
    }
  });
}

}  // namespace dsv4::cpu
