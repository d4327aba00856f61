// The fused Q/KV op family (spec/kv_cache.md §3, §5, §6): Q RMSNorm + GPT-J RoPE (padded heads zeroed;
// bf16 or per-tensor FP8 out) and KV [weighted RMSNorm +] RoPE + insert into an fp8_ds_mla, bf16 or
// per-tensor FP8 cache.
//
// One 32-lane group per (token, slot): slots 0..padded_heads-1 are Q heads, slot padded_heads the KV row.
// Lane l holds dims [8l, 8l+8) and [256+8l, 256+8l+8) of the 512-dim row (its two "pieces"), so every
// load and store instruction of the group covers one contiguous span. In the second piece, lanes 0..23
// hold NoPE dims 256..447 and lanes 24..31 the RoPE dims 448..511; 8 lanes make one 64-dim quantization
// block. A group is a warp on NVIDIA and half a wavefront on CDNA; its shuffles never leave it.
//
// A job issues its row load together with its position load, never behind it: the row is read whatever
// the position (it is in bounds) and whether to use it is decided once both are in flight. Each group
// loops over jobs and issues the next job's loads before it computes and stores the current one.
#include "dsv4/bf16.h"
#include "dsv4/fp8x2.h"
#include "dsv4/launch.h"
#include "dsv4/rope.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kGroupLanes = 32;
constexpr int kPieceDims = 8;
constexpr int kHalfDims = ds_mla::kHeadDim / 2;                                  // 256
constexpr int kFirstRopeLane = (ds_mla::kNopeDim - kHalfDims) / kPieceDims;     // 24
constexpr int kLanesPerQuantBlock = ds_mla::kQuantBlock / kPieceDims;           // 8
constexpr int kGroupsPerBlock = kElementwiseThreads / kGroupLanes;

// A lane's 16 values of one row: piece h holds dims h*256 + 8*lane + j.
struct Share {
  float v[2][kPieceDims];
};

// The same, as loaded: bf16 bits.
struct RawShare {
  uint4 piece[2];
};

DSV4_DEVICE RawShare load_share(const uint16_t* row, int lane) {
  RawShare raw;
#pragma unroll
  for (int h = 0; h < 2; ++h) raw.piece[h] = *reinterpret_cast<const uint4*>(row + h * kHalfDims + lane * kPieceDims);
  return raw;
}

DSV4_DEVICE Share unpack_share(const RawShare& raw) {
  Share s;
#pragma unroll
  for (int h = 0; h < 2; ++h) unpack_bf16x8(raw.piece[h], s.v[h]);
  return s;
}

// Row of bf16 (element pointer) or of FP8 bytes.
DSV4_DEVICE void store_bf16_share(uint16_t* row, int lane, const Share& s) {
#pragma unroll
  for (int h = 0; h < 2; ++h) *reinterpret_cast<uint4*>(row + h * kHalfDims + lane * kPieceDims) = pack_bf16x8(s.v[h]);
}

DSV4_DEVICE void store_zero_bf16_share(uint16_t* row, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) *reinterpret_cast<uint4*>(row + h * kHalfDims + lane * kPieceDims) = make_uint4(0, 0, 0, 0);
}

// fp8(clamp(v * multiplier, +-quant_max)) for 8 values, NaN to -quant_max as the upstream writers (spec
// kv_cache §5, §7.4), two per conversion instruction where the device has a paired one (dsv4/fp8x2.h: the
// same bytes as fp8_encode_clamped_nan_to_min on each value).
template <Fp8Format F>
DSV4_DEVICE uint2 pack_fp8x8(const float* values, float multiplier, float quant_max) {
  uint32_t words[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < kPieceDims; j += 2) {
    words[j / 4] |= fp8x2_encode_clamped_nan_to_min<F>(values[j] * multiplier, values[j + 1] * multiplier, quant_max)
                    << (8 * (j % 4));
  }
  return make_uint2(words[0], words[1]);
}

template <Fp8Format F>
DSV4_DEVICE void store_fp8_share(uint8_t* row, int lane, const Share& s, float multiplier, float quant_max) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    *reinterpret_cast<uint2*>(row + h * kHalfDims + lane * kPieceDims) = pack_fp8x8<F>(s.v[h], multiplier, quant_max);
  }
}

DSV4_DEVICE void store_zero_fp8_share(uint8_t* row, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) *reinterpret_cast<uint2*>(row + h * kHalfDims + lane * kPieceDims) = make_uint2(0, 0);
}

// 1 / RMS of the whole row (all 32 lanes take part).
DSV4_DEVICE float row_rms_inverse(const Share& s, float eps) {
  float sum = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < kPieceDims; ++j) sum += s.v[h][j] * s.v[h][j];
  }
  return rms_inverse(group_sum<kGroupLanes>(sum), ds_mla::kHeadDim, eps);
}

// Rotates the lane's RoPE dims (second piece of lanes 24..31: pairs 4*(lane-24) .. +3).
DSV4_DEVICE void rope_share(Share& s, int lane, const float* cos_sin_row) {
  if (lane < kFirstRopeLane) return;
#pragma unroll
  for (int j = 0; j < kPieceDims / 2; ++j) {
    const int pair = (lane - kFirstRopeLane) * (kPieceDims / 2) + j;
    rope_rotate_pair(s.v[1][2 * j], s.v[1][2 * j + 1], cos_sin_row[pair], cos_sin_row[ds_mla::kRopeDim / 2 + pair]);
  }
}

DSV4_DEVICE void round_share_to_bf16(Share& s) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < kPieceDims; ++j) s.v[h][j] = bf16_bits_to_float(float_to_bf16_bits(s.v[h][j]));
  }
}

// amax of a 64-dim quantization block: 8 values in each of its 8 lanes.
DSV4_DEVICE float quant_block_amax(const float* values) {
  float amax = 0.0f;  // fmaxf ignores NaN
#pragma unroll
  for (int j = 0; j < kPieceDims; ++j) amax = fmaxf(amax, fabsf(values[j]));
#pragma unroll
  for (int mask = 1; mask < kLanesPerQuantBlock; mask <<= 1) {
    amax = fmaxf(amax, shuffle_xor(amax, mask, kLanesPerQuantBlock));
  }
  return amax;
}

// 8 NoPE values of one quantization block into their record bytes (and the block's scale byte, once).
template <Fp8Format F>
DSV4_DEVICE void store_nope_piece(uint8_t* data, uint8_t* scales, int first_dim, int lane, const float* values,
                                  float amax, float quant_max) {
  const uint8_t scale_byte = ue8m0_encode_rceil(amax, quant_max, ds_mla::kAmaxFloor);
  const float inverse_scale = ds_mla::ue8m0_inverse_scale(scale_byte);
  uint32_t words[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < kPieceDims; ++j) {
    words[j / 4] |= static_cast<uint32_t>(ds_mla::quantize_nope_value<F>(values[j], inverse_scale, quant_max))
                    << (8 * (j % 4));
  }
  *reinterpret_cast<uint2*>(data + first_dim) = make_uint2(words[0], words[1]);
  if (lane % kLanesPerQuantBlock == 0) scales[first_dim / ds_mla::kQuantBlock] = scale_byte;
}

// The lane's share of a rotated, bf16-representable KV row into the fp8_ds_mla record at `slot`.
template <Fp8Format F>
DSV4_DEVICE void store_ds_mla_share(const DsMlaCache& cache, int64_t slot, int lane, const Share& s, float quant_max) {
  const ds_mla::RecordAddress address = ds_mla::record_address(slot, cache.block_size, cache.block_stride);
  uint8_t* data = cache.bytes + address.data;
  uint8_t* scales = cache.bytes + address.scale;
  const float low_amax = quant_block_amax(s.v[0]);
  const float high_amax = quant_block_amax(s.v[1]);  // lanes 24..31: the RoPE dims, not used
  store_nope_piece<F>(data, scales, lane * kPieceDims, lane, s.v[0], low_amax, quant_max);
  if (lane < kFirstRopeLane) {
    store_nope_piece<F>(data, scales, kHalfDims + lane * kPieceDims, lane, s.v[1], high_amax, quant_max);
  } else {  // the bf16 RoPE tail, and the record's pad byte
    *reinterpret_cast<uint4*>(data + ds_mla::kNopeDim + (lane - kFirstRopeLane) * 2 * kPieceDims) =
        pack_bf16x8(s.v[1]);
    if (lane == kFirstRopeLane) scales[ds_mla::kNumQuantBlocks] = 0;
  }
}

// One (token, slot) job: its indices and its row as loaded.
struct Job {
  int64_t token;
  int64_t head;  // == padded_heads: the KV row
  int64_t position;
  int64_t slot;  // KV only; -1 when the token has none
  RawShare raw;
};

// Issues the job's loads. Rows are read whatever the position (they are in bounds); whether to use
// them is decided after the loads are in flight.
DSV4_DEVICE Job begin_job(const QnormRopeKvInsertArgs& args, const IndexSplit& place, int lane) {
  Job job;
  job.token = place.quotient;
  job.head = place.remainder;
  job.position = args.position_ids[job.token];
  job.slot = -1;
  if (job.head < args.heads) {
    job.raw = load_share(args.q_in + (job.token * args.heads + job.head) * ds_mla::kHeadDim, lane);
  } else if (job.head == args.padded_heads && job.token < args.insert_tokens) {
    job.slot = args.slot_mapping[job.token];
    job.raw = load_share(args.kv + job.token * args.kv_row_stride, lane);
  }
  return job;
}

template <Fp8Format F, KvRowStore S>
DSV4_DEVICE void finish_job(const QnormRopeKvInsertArgs& args, const Job& job, int lane) {
  const bool position_ok = job.position >= 0 && job.position < args.positions;
  const float* cos_sin_row = args.cos_sin + (position_ok ? job.position : 0) * ds_mla::kRopeDim;
  if (job.head < args.padded_heads) {  // a Q slot (every branch below is uniform across the group)
    const int64_t row = job.token * args.padded_heads + job.head;
    const bool zero_row = job.head >= args.heads || !position_ok;
    Share s;
    if (!zero_row) {
      s = unpack_share(job.raw);
      if (args.apply_q_norm) {
        const float factor = row_rms_inverse(s, args.eps);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int j = 0; j < kPieceDims; ++j) s.v[h][j] *= factor;
        }
      }
      rope_share(s, lane, cos_sin_row);
    }
    if constexpr (S == KvRowStore::kFp8Row) {  // padded_heads == heads; the zero byte is +0 in both encodings
      uint8_t* out = args.q_fp8 + row * ds_mla::kHeadDim;
      if (zero_row) {
        store_zero_fp8_share(out, lane);
      } else {
        store_fp8_share<F>(out, lane, s, *args.q_scale_inverse, args.quant_max);
      }
    } else {
      uint16_t* out = args.q_out + row * ds_mla::kHeadDim;
      if (zero_row) {
        store_zero_bf16_share(out, lane);
      } else {
        store_bf16_share(out, lane, s);
      }
    }
    return;
  }
  // The KV slot.
  const int64_t capacity = S == KvRowStore::kDsMlaRecord ? args.cache.capacity() : args.rows.capacity();
  if (job.slot < 0 || job.slot >= capacity || !position_ok) return;
  Share s = unpack_share(job.raw);
  if (S == KvRowStore::kDsMlaRecord && args.kv_norm_weight != nullptr) {
    // Weighted RMSNorm, rounded to bf16 like the unfused rms_norm.
    const float factor = row_rms_inverse(s, args.eps);
    const Share weight = unpack_share(load_share(args.kv_norm_weight, lane));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < kPieceDims; ++j) s.v[h][j] = s.v[h][j] * factor * weight.v[h][j];
    }
    round_share_to_bf16(s);
  }
  rope_share(s, lane, cos_sin_row);
  if constexpr (S == KvRowStore::kBf16Row) {
    store_bf16_share(reinterpret_cast<uint16_t*>(args.rows.row(job.slot)), lane, s);
  } else if constexpr (S == KvRowStore::kFp8Row) {
    store_fp8_share<F>(args.rows.row(job.slot), lane, s, 1.0f / *args.kv_scale, args.quant_max);
  } else {
    round_share_to_bf16(s);
    store_ds_mla_share<F>(args.cache, job.slot, lane, s, args.quant_max);
  }
}

// One instance per encoding and KV store, so each holds only the state its variant needs (the kernel
// arguments would not fit the scalar registers otherwise).
template <Fp8Format F, KvRowStore S>
__global__ void __launch_bounds__(kElementwiseThreads) qnorm_rope_kv_insert_kernel(QnormRopeKvInsertArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int lane = threadIdx.x % kGroupLanes;
  const int64_t groups = args.tokens * (args.padded_heads + 1);
  const int64_t group_count = static_cast<int64_t>(gridDim.x) * kGroupsPerBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroupLanes;
  if (first >= groups) return;
  // The (token, slot) of the group's job, advanced by adds: the stride is divided once, not every job.
  const int64_t slots = args.padded_heads + 1;
  const IndexSplit stride = divide_index(group_count, slots);
  IndexSplit place = divide_index(first, slots);
  const auto advance = [&] {
    place.quotient += stride.quotient;
    place.remainder += stride.remainder;
    if (place.remainder >= slots) {
      place.remainder -= slots;
      place.quotient += 1;
    }
  };
  // Software pipeline: the next job's loads are in flight while this one computes and stores.
  Job next = begin_job(args, place, lane);
  for (int64_t group = first; group < groups; group += group_count) {
    const Job current = next;
    if (group + group_count < groups) {
      advance();
      next = begin_job(args, place, lane);
    }
    finish_job<F, S>(args, current, lane);
  }
}

// KV-only calls (padded_heads == 0: kv_rope_quant_insert, kv_norm_rope_quant_insert; always the
// fp8_ds_mla store): one job per group and turn, without the next job's loads held in registers. With a
// wave of groups covering ~one job each at prefill sizes, the pipelining buys little, and its registers
// (79 in the general kernel) leave 3 blocks a multiprocessor; the H200 profile at N = 8192 was issue-bound
// at 37.5% occupancy.
template <Fp8Format F>
__global__ void __launch_bounds__(kElementwiseThreads) kv_only_insert_kernel(QnormRopeKvInsertArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int lane = threadIdx.x % kGroupLanes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroupsPerBlock;
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroupLanes;
       token < args.tokens; token += stride) {
    finish_job<F, KvRowStore::kDsMlaRecord>(args, begin_job(args, IndexSplit{token, 0}, lane), lane);
  }
}

}  // namespace

LaunchStatus launch_qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, void* stream) {
  const int64_t block_size =
      args.kv_store == KvRowStore::kDsMlaRecord ? args.cache.block_size : args.rows.block_size;
  if (args.tokens < 0 || args.heads < 0 || args.padded_heads < args.heads || block_size <= 0 ||
      (args.q_fp8 != nullptr) != (args.kv_store == KvRowStore::kFp8Row) ||
      (args.q_fp8 != nullptr && args.padded_heads != args.heads) ||
      (args.kv_norm_weight != nullptr && args.kv_store != KvRowStore::kDsMlaRecord)) {  // the KV norm: records only
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t groups = args.tokens * (args.padded_heads + 1);
  if (groups == 0) return LaunchStatus::kOk;
  const int64_t needed_blocks = (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  auto hip_stream = static_cast<hipStream_t>(stream);
  // At most one wave (one_wave_blocks); groups then loop over jobs, keeping the next job's loads in flight.
  const auto grid = [&](int64_t wave) {
    return dim3(static_cast<unsigned>(needed_blocks < wave ? needed_blocks : wave));
  };
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    constexpr auto kBf16 = qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kBf16Row>;
    constexpr auto kFp8 = qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kFp8Row>;
    constexpr auto kDsMla = qnorm_rope_kv_insert_kernel<kFormat, KvRowStore::kDsMlaRecord>;
    const dim3 block(kElementwiseThreads);
    if (args.padded_heads == 0 && args.kv_store == KvRowStore::kDsMlaRecord) {
      constexpr auto kKvOnly = kv_only_insert_kernel<kFormat>;
      launch_overlapping(kKvOnly, grid(one_wave_blocks<kKvOnly>(kElementwiseThreads)), block, 0, hip_stream, args);
      return;
    }
    switch (args.kv_store) {
      case KvRowStore::kBf16Row:
        launch_overlapping(kBf16, grid(one_wave_blocks<kBf16>(kElementwiseThreads)), block, 0, hip_stream, args);
        break;
      case KvRowStore::kFp8Row:
        launch_overlapping(kFp8, grid(one_wave_blocks<kFp8>(kElementwiseThreads)), block, 0, hip_stream, args);
        break;
      default:
        launch_overlapping(kDsMla, grid(one_wave_blocks<kDsMla>(kElementwiseThreads)), block, 0, hip_stream, args);
        break;
    }
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
