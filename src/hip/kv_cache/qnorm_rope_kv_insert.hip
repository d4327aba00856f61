// The fused Q/KV op family (spec/kv_cache.md §3, §5, §6): Q RMSNorm + GPT-J RoPE (padded heads zeroed;
// bf16 or per-tensor FP8 out) and KV [weighted RMSNorm +] RoPE + insert into an fp8_ds_mla, bf16 or
// per-tensor FP8 cache. One 32-lane group per (token, slot), slot
// 0..padded_heads-1 a Q head and slot padded_heads the KV row; each lane owns 16 consecutive dims:
// lanes 0..27 the NoPE dims (4 lanes per 64-dim quant block), lanes 28..31 the RoPE dims. A group is a
// warp on NVIDIA and half a wavefront on CDNA; its shuffles never leave it.
#include "dsv4/launch.h"
#include "dsv4/rope.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kGroupLanes = 32;
constexpr int kDimsPerLane = 16;
constexpr int kNopeLanes = ds_mla::kNopeDim / kDimsPerLane;  // 28
constexpr int kGroupsPerBlock = kElementwiseThreads / kGroupLanes;
constexpr int kLanesPerQuantBlock = ds_mla::kQuantBlock / kDimsPerLane;  // 4

DSV4_DEVICE void load_bf16x16(const uint16_t* src, float* values) {
  const uint4* vectors = reinterpret_cast<const uint4*>(src);
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const uint4 raw = vectors[v];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      values[8 * v + 2 * j] = bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
      values[8 * v + 2 * j + 1] = bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
    }
  }
}

DSV4_DEVICE void store_bf16x16(uint8_t* dst, const float* values) {
  uint4* vectors = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    uint32_t words[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      words[j] = float_to_bf16_bits(values[8 * v + 2 * j]) |
                 (static_cast<uint32_t>(float_to_bf16_bits(values[8 * v + 2 * j + 1])) << 16);
    }
    vectors[v] = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Rotates this lane's 8 pairs if it holds RoPE dims.
DSV4_DEVICE void rope_lane(float* values, int lane, const float* cos_sin_row) {
  if (lane < kNopeLanes) return;
#pragma unroll
  for (int j = 0; j < kDimsPerLane / 2; ++j) {
    const int pair = (lane - kNopeLanes) * (kDimsPerLane / 2) + j;
    rope_rotate_pair(values[2 * j], values[2 * j + 1], cos_sin_row[pair], cos_sin_row[ds_mla::kRopeDim / 2 + pair]);
  }
}

DSV4_DEVICE float group_sum(float value) {
#pragma unroll
  for (int mask = kGroupLanes / 2; mask >= 1; mask >>= 1) value += shuffle_xor(value, mask, kGroupLanes);
  return value;
}

DSV4_DEVICE float sum_of_squares(const float* values) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) sum += values[j] * values[j];
  return sum;
}

// 16 values to 16 FP8 bytes: fp8(clamp(v * multiplier, +-quant_max)).
template <Fp8Format F>
DSV4_DEVICE void store_fp8x16(uint8_t* dst, const float* values, float multiplier, float quant_max) {
  uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    words[j / 4] |= static_cast<uint32_t>(fp8_encode_clamped<F>(values[j] * multiplier, quant_max)) << (8 * (j % 4));
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

DSV4_DEVICE void round_to_bf16(float* values) {
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) values[j] = bf16_bits_to_float(float_to_bf16_bits(values[j]));
}

// This lane's 16 dims of a rotated, bf16-representable KV row into the fp8_ds_mla record at `slot`.
template <Fp8Format F>
DSV4_DEVICE void store_ds_mla_lane(const DsMlaCache& cache, int64_t slot, int lane, const float* values,
                                   float quant_max) {
  float amax = 0.0f;  // fmaxf ignores NaN
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) amax = fmaxf(amax, fabsf(values[j]));
#pragma unroll
  for (int mask = 1; mask < kLanesPerQuantBlock; mask <<= 1) {
    amax = fmaxf(amax, shuffle_xor(amax, mask, kLanesPerQuantBlock));
  }
  const ds_mla::RecordAddress address = ds_mla::record_address(slot, cache.block_size, cache.block_stride);
  uint8_t* data = cache.bytes + address.data;
  if (lane < kNopeLanes) {
    const uint8_t scale_byte = ue8m0_encode_rceil(amax, quant_max, ds_mla::kAmaxFloor);
    const float inverse_scale = ds_mla::ue8m0_inverse_scale(scale_byte);
    uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) {
      words[j / 4] |= static_cast<uint32_t>(ds_mla::quantize_nope_value<F>(values[j], inverse_scale, quant_max))
                      << (8 * (j % 4));
    }
    *reinterpret_cast<uint4*>(data + lane * kDimsPerLane) = make_uint4(words[0], words[1], words[2], words[3]);
    if (lane % kLanesPerQuantBlock == 0) cache.bytes[address.scale + lane / kLanesPerQuantBlock] = scale_byte;
  } else {
    store_bf16x16(data + ds_mla::kNopeDim + (lane - kNopeLanes) * 2 * kDimsPerLane, values);
    if (lane == kNopeLanes) cache.bytes[address.scale + ds_mla::kNumQuantBlocks] = 0;  // pad byte
  }
}

// One instance per encoding and KV store, so each holds only the state its variant needs (the kernel
// arguments would not fit the scalar registers otherwise).
template <Fp8Format F, KvRowStore S>
__global__ void __launch_bounds__(kElementwiseThreads) qnorm_rope_kv_insert_kernel(QnormRopeKvInsertArgs args) {
  constexpr bool kFp8Q = S == KvRowStore::kFp8Row;
  const int lane = threadIdx.x % kGroupLanes;
  const int64_t slots_per_token = args.padded_heads + 1;
  const int64_t groups = args.tokens * slots_per_token;
  for (int64_t group = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroupLanes; group < groups;
       group += static_cast<int64_t>(gridDim.x) * kGroupsPerBlock) {
    const int64_t token = group / slots_per_token;
    const int64_t head = group - token * slots_per_token;
    const int64_t position = args.position_ids[token];
    const bool position_ok = position >= 0 && position < args.positions;
    const float* cos_sin_row = args.cos_sin + (position_ok ? position : 0) * ds_mla::kRopeDim;
    float values[kDimsPerLane];
    if (head < args.padded_heads) {  // a Q slot (every branch below is uniform across the group)
      const int64_t row = token * args.padded_heads + head;
      const bool zero_row = head >= args.heads || !position_ok;
      if (!zero_row) {
        load_bf16x16(args.q_in + (token * args.heads + head) * ds_mla::kHeadDim + lane * kDimsPerLane, values);
        if (args.apply_q_norm) {
          const float factor = rms_inverse(group_sum(sum_of_squares(values)), ds_mla::kHeadDim, args.eps);
#pragma unroll
          for (int j = 0; j < kDimsPerLane; ++j) values[j] *= factor;
        }
        rope_lane(values, lane, cos_sin_row);
      }
      if constexpr (kFp8Q) {  // padded_heads == heads here; the zero byte is +0 in both encodings
        uint8_t* out = args.q_fp8 + row * ds_mla::kHeadDim + lane * kDimsPerLane;
        if (zero_row) {
          *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
        } else {
          store_fp8x16<F>(out, values, *args.q_scale_inverse, args.quant_max);
        }
      } else {
        uint8_t* out = reinterpret_cast<uint8_t*>(args.q_out + row * ds_mla::kHeadDim + lane * kDimsPerLane);
        if (zero_row) {
          reinterpret_cast<uint4*>(out)[0] = make_uint4(0, 0, 0, 0);
          reinterpret_cast<uint4*>(out)[1] = make_uint4(0, 0, 0, 0);
        } else {
          store_bf16x16(out, values);
        }
      }
      continue;
    }
    // The KV slot.
    if (token >= args.insert_tokens) continue;
    const int64_t slot = args.slot_mapping[token];
    const int64_t capacity = S == KvRowStore::kDsMlaRecord ? args.cache.capacity() : args.rows.capacity();
    if (slot < 0 || slot >= capacity || !position_ok) continue;
    load_bf16x16(args.kv + token * args.kv_row_stride + lane * kDimsPerLane, values);
    if (S == KvRowStore::kDsMlaRecord && args.kv_norm_weight != nullptr) {  // weighted RMSNorm, rounded to bf16 like the unfused rms_norm
      const float factor = rms_inverse(group_sum(sum_of_squares(values)), ds_mla::kHeadDim, args.eps);
      float weights[kDimsPerLane];
      load_bf16x16(args.kv_norm_weight + lane * kDimsPerLane, weights);
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) values[j] = values[j] * factor * weights[j];
      round_to_bf16(values);
    }
    rope_lane(values, lane, cos_sin_row);
    if constexpr (S == KvRowStore::kBf16Row) {
      store_bf16x16(args.rows.row(slot) + lane * 2 * kDimsPerLane, values);
    } else if constexpr (S == KvRowStore::kFp8Row) {
      store_fp8x16<F>(args.rows.row(slot) + lane * kDimsPerLane, values, 1.0f / *args.kv_scale, args.quant_max);
    } else {
      round_to_bf16(values);
      store_ds_mla_lane<F>(args.cache, slot, lane, values, args.quant_max);
    }
  }
}

}  // namespace

LaunchStatus launch_qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, void* stream) {
  const int64_t block_size =
      args.kv_store == KvRowStore::kDsMlaRecord ? args.cache.block_size : args.rows.block_size;
  if (args.tokens < 0 || args.heads < 0 || args.padded_heads < args.heads || block_size <= 0 ||
      (args.q_fp8 != nullptr) != (args.kv_store == KvRowStore::kFp8Row) ||
      (args.q_fp8 != nullptr && args.padded_heads != args.heads)) {
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t groups = args.tokens * (args.padded_heads + 1);
  if (groups == 0) return LaunchStatus::kOk;
  int64_t blocks = (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  blocks = blocks < kMaxElementwiseBlocks ? blocks : kMaxElementwiseBlocks;
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    const dim3 grid(static_cast<unsigned>(blocks));
    const dim3 block(kElementwiseThreads);
    switch (args.kv_store) {
      case KvRowStore::kBf16Row:
        hipLaunchKernelGGL((qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kBf16Row>), grid, block, 0, hip_stream,
                           args);
        break;
      case KvRowStore::kFp8Row:
        hipLaunchKernelGGL((qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kFp8Row>), grid, block, 0, hip_stream,
                           args);
        break;
      default:
        hipLaunchKernelGGL((qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kDsMlaRecord>), grid, block, 0,
                           hip_stream, args);
        break;
    }
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
