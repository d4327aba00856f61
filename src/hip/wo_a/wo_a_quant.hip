// wo_a elementwise kernels (spec/wo_a.md §3): inverse_rope_group_quant and inverse_rope. The per-element
// numerics are the CPU path's own (dsv4/rope.h rope_unrotate_pair, dsv4/ue8m0.h ue8m0_encode_rceil,
// dsv4/ds_mla.h ue8m0_inverse_scale, dsv4/fp8.h fp8_encode_clamped, two at a time through dsv4/fp8x2.h),
// so the bytes equal the CPU bytes.
//
// Both kernels are memory bound and treat the input as a flat array: o [S, H, 512] read as [S, G, D]
// is the same element order as x_fp8 [S, G, D] (spec §3.5), so element e of o becomes byte e of x_fp8.
// group quant: a thread owns 32 consecutive lanes of one head's row (four 16-byte loads, two 16-byte
// stores); a quant group of group_size lanes is group_size / 32 consecutive threads (1, 2 or 4), whose
// amax is a butterfly of shuffles. 448 = 14 * 32, so a thread's lanes are all NoPE or all rope lanes. Rows
// (token, head) go in blocks of 8, and the 32 consecutive items of a block cover one 128-lane quarter of
// its 8 rows (4 threads a row): a 32-lane warp then works on one quarter, so only the warps of the last
// quarter hold rope lanes and pay for the rope's table loads and rotation (with 32 lanes of one row a
// thread, every warp held two rope threads and waited for them). The item's row, quarter and lanes come
// from shifts and masks, not divisions.
// inverse_rope: a thread owns 8 lanes (one 16-byte load and store).
// Grid-stride loops over the threads' items (a multiple of 128 for the quantizer, with the rows past the
// end idle; a multiple of 64 for inverse_rope), so a warp (32 lanes on NVIDIA) is always wholly active
// or wholly done, and a shuffle group (<= 4 aligned lanes) on either vendor too.
#include "dsv4/bf16.h"
#include "dsv4/ds_mla.h"
#include "dsv4/fp8.h"
#include "dsv4/fp8x2.h"
#include "dsv4/launch.h"
#include "dsv4/rope.h"
#include "dsv4/ue8m0.h"
#include "dsv4/wo_a.h"
#include "wo_a_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kHeadDim = 512;
constexpr int kRopeDim = 64;
constexpr int kNopeDim = kHeadDim - kRopeDim;
constexpr float kGroupAmaxFloor = 1e-8f;  // spec §3.3, as the CPU path
constexpr int kQuantLanes = 32;           // lanes per thread, group quant
constexpr int kQuarterLanes = 128;        // lanes of a row per 32 consecutive group-quant items
constexpr int kQuarterThreads = kQuarterLanes / kQuantLanes;               // 4
constexpr int kBlockRows = 32 / kQuarterThreads;                           // 8
constexpr int64_t kRowBlockItems = int64_t{kBlockRows} * kHeadDim / kQuantLanes;  // 128
constexpr int kRopeLanes = 8;             // lanes per thread, inverse_rope

template <int kCount>
DSV4_DEVICE void load_bf16(const uint16_t* src, bool vector, float* values) {
  if (vector) {
#pragma unroll
    for (int v = 0; v < kCount / 8; ++v) unpack_bf16x8(*reinterpret_cast<const uint4*>(src + 8 * v), values + 8 * v);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) values[i] = bf16_bits_to_float(src[i]);
  }
}

// RopeTable::value with the table's dtype known at compile time (fewer branches: on AMDGPU a branch
// per load costs scalar registers).
template <bool kBf16Table>
DSV4_DEVICE float table_value(const RopeTable& rope, int64_t row, int column) {
  const int64_t index = row * kRopeDim + column;
  if constexpr (kBf16Table) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(rope.cos_sin)[index]);
  } else {
    return static_cast<const float*>(rope.cos_sin)[index];
  }
}

// Rotates lanes [lane, lane + count) of a head back when they are rope lanes (all or none of them are).
template <int kCount, bool kBf16Table>
DSV4_DEVICE void unrotate(const RopeTable& rope, int64_t token, int lane, float* values) {
  if (lane < kNopeDim) return;
  const int64_t row = rope.row_of(token);
  const int first_pair = (lane - kNopeDim) / 2;
#pragma unroll
  for (int p = 0; p < kCount / 2; ++p) {
    rope_unrotate_pair(values[2 * p], values[2 * p + 1], table_value<kBf16Table>(rope, row, first_pair + p),
                       table_value<kBf16Table>(rope, row, kRopeDim / 2 + first_pair + p));
  }
}

// The thread's values times the group's inverse scale into FP8 bytes, 4 per word: the general clamped
// encode, or (kInRange: finite values whose scaled magnitude is within range) the bare conversion.
template <Fp8Format F, bool kInRange>
DSV4_DEVICE void encode_scaled(const float (&values)[kQuantLanes], float inverse, float quant_max,
                               uint32_t (&words)[kQuantLanes / 4]) {
  const auto pair = [&](int i) {
    return kInRange ? fp8x2_encode_in_range<F>(values[i] * inverse, values[i + 1] * inverse, quant_max)
                    : fp8x2_encode_clamped<F>(values[i] * inverse, values[i + 1] * inverse, quant_max);
  };
#pragma unroll
  for (int w = 0; w < kQuantLanes / 4; ++w) words[w] = pair(4 * w) | (pair(4 * w + 2) << 16);
}

// flat_scales: x_scale is contiguous [tokens, groups, D / group_size], so a group's scale byte is number
// flat lane / group_size.
template <Fp8Format F, int kGroupThreads, bool kBf16Table>
__global__ void __launch_bounds__(kElementwiseThreads)
    group_quant_kernel(InverseRopeGroupQuantArgs args, int64_t items, bool vector, bool flat_scales) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  // The GEMM that reads x_fp8 may launch now and wait for this kernel's end itself: at decode sizes this
  // hides its launch behind the quantization.
  release_dependents();
  constexpr int kGroupLanes = kGroupThreads * kQuantLanes;
  const int64_t rows = args.tokens * args.heads;
  for (int64_t item = global_thread_index(); item < items; item += global_thread_count()) {
    const auto unsigned_item = static_cast<uint64_t>(item);
    const int within = static_cast<int>(unsigned_item % kRowBlockItems);
    const int64_t row = static_cast<int64_t>(unsigned_item / kRowBlockItems) * kBlockRows +
                        (within % 32) / kQuarterThreads;
    const int lane = within / 32 * kQuarterLanes + within % kQuarterThreads * kQuantLanes;  // of the head
    const bool valid = row < rows;
    const int64_t flat = row * kHeadDim + lane;
    float values[kQuantLanes];
    if (valid) {
      load_bf16<kQuantLanes>(args.o + flat, vector, values);
      if (args.apply_inverse_rope && lane >= kNopeDim) {
        unrotate<kQuantLanes, kBf16Table>(args.rope, divide_index(row, args.heads).quotient, lane, values);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kQuantLanes; ++i) values[i] = 0.0f;
    }
    float amax = 0.0f;        // fmaxf ignores NaN, as the CPU path's std::fmax
    float non_finite = 0.0f;  // stays 0 unless a value is NaN or infinite (v * 0 is NaN then)
#pragma unroll
    for (int i = 0; i < kQuantLanes; ++i) {
      amax = fmaxf(amax, fabsf(values[i]));
      non_finite = fmaf(values[i], 0.0f, non_finite);
    }
#pragma unroll
    for (int mask = kGroupThreads / 2; mask >= 1; mask >>= 1) {
      amax = fmaxf(amax, shuffle_xor(amax, mask, kGroupThreads));
    }
    non_finite = group_sum<kGroupThreads>(non_finite);
    const uint8_t byte = ue8m0_encode_rceil(amax, args.quant_max, kGroupAmaxFloor);
    const float inverse = ds_mla::ue8m0_inverse_scale(byte);
    // The usual group: finite, and its amax scaled (exactly, by a power of two) stays in range, so every
    // scaled value does: the general encode's clamps and NaN handling would change nothing.
    const bool in_range =
        non_finite == 0.0f && amax * inverse <= fminf(args.quant_max, Fp8Traits<F>::kMaxFinite);
    uint32_t words[kQuantLanes / 4];
    if (in_range) {
      encode_scaled<F, true>(values, inverse, args.quant_max, words);
    } else {
      encode_scaled<F, false>(values, inverse, args.quant_max, words);
    }
    if (!valid) continue;
    uint8_t* out = args.x_fp8 + flat;
    if (vector) {
#pragma unroll
      for (int v = 0; v < kQuantLanes / 16; ++v) {
        *reinterpret_cast<uint4*>(out + 16 * v) =
            make_uint4(words[4 * v], words[4 * v + 1], words[4 * v + 2], words[4 * v + 3]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kQuantLanes; ++i) out[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
    }
    if (item % kGroupThreads == 0) {
      if (flat_scales) {
        args.x_scale[flat / kGroupLanes] = byte;
      } else {
        const IndexSplit token_head = divide_index(row, args.heads);
        const IndexSplit gk = divide_index(token_head.remainder * kHeadDim + lane, args.heads * kHeadDim / args.groups);
        args.x_scale[token_head.quotient * args.scale_token_stride + gk.quotient * args.scale_group_stride +
                     gk.remainder / kGroupLanes * args.scale_block_stride] = byte;
      }
    }
  }
}

template <bool kBf16Table>
__global__ void __launch_bounds__(kElementwiseThreads)
    inverse_rope_kernel(InverseRopeArgs args, int64_t items, bool vector) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int64_t items_per_token = args.heads * (kHeadDim / kRopeLanes);
  for (int64_t item = global_thread_index(); item < items; item += global_thread_count()) {
    const IndexSplit split = divide_index(item, items_per_token);
    const int64_t flat = item * kRopeLanes;
    float values[kRopeLanes];
    load_bf16<kRopeLanes>(args.o + flat, vector, values);
    unrotate<kRopeLanes, kBf16Table>(args.rope, split.quotient, static_cast<int>((split.remainder * kRopeLanes) % kHeadDim),
                         values);
    // Every lane goes through fp32 and back, as on the CPU (NaN as the one canonical quiet NaN).
    uint32_t words[kRopeLanes / 2];
#pragma unroll
    for (int i = 0; i < kRopeLanes / 2; ++i) {
      words[i] = static_cast<uint32_t>(wo_a::rope_output_bits(values[2 * i])) |
                 (static_cast<uint32_t>(wo_a::rope_output_bits(values[2 * i + 1])) << 16);
    }
    uint16_t* out = args.out + flat;
    if (vector) {
      *reinterpret_cast<uint4*>(out) = make_uint4(words[0], words[1], words[2], words[3]);
    } else {
#pragma unroll
      for (int i = 0; i < kRopeLanes; ++i) out[i] = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
    }
  }
}

template <Fp8Format F, bool kBf16Table>
void launch_group_quant(const InverseRopeGroupQuantArgs& args, int64_t items, bool vector, bool flat_scales,
                        hipStream_t stream) {
  const dim3 grid(elementwise_blocks(items));
  const dim3 block(kElementwiseThreads);
  const auto launch = [&](auto kernel) {
    launch_overlapping(kernel, grid, block, 0, stream, args, items, vector, flat_scales);
  };
  switch (args.group_size) {
    case 32:
      launch(group_quant_kernel<F, 1, kBf16Table>);
      break;
    case 64:
      launch(group_quant_kernel<F, 2, kBf16Table>);
      break;
    default:
      launch(group_quant_kernel<F, 4, kBf16Table>);
      break;
  }
}

}  // namespace

LaunchStatus launch_inverse_rope_group_quant(const InverseRopeGroupQuantArgs& args, void* stream) {
  if (args.tokens < 0 || args.heads < 1 || args.groups < 1 || (args.heads * kHeadDim) % args.groups != 0 ||
      (args.group_size != 32 && args.group_size != 64 && args.group_size != 128) ||
      ((args.heads * kHeadDim) / args.groups) % args.group_size != 0 || !(args.quant_max > 0.0f)) {
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t rows = args.tokens * args.heads;
  if (rows == 0) return LaunchStatus::kOk;
  const int64_t items = (rows + kBlockRows - 1) / kBlockRows * kRowBlockItems;
  const bool vector = is_aligned(args.o, 16) && is_aligned(args.x_fp8, 16);
  const int64_t group_scales = args.heads * kHeadDim / args.groups / args.group_size;  // per (token, group)
  const bool flat_scales = (args.groups == 1 || args.scale_group_stride == group_scales) &&
                           args.scale_token_stride == args.groups * group_scales &&
                           (group_scales == 1 || args.scale_block_stride == 1);
  const auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(args.format, [&](auto tag) {
    if (args.rope.bf16) {
      launch_group_quant<decltype(tag)::value, true>(args, items, vector, flat_scales, hip_stream);
    } else {
      launch_group_quant<decltype(tag)::value, false>(args, items, vector, flat_scales, hip_stream);
    }
  });
  return last_launch_status();
}

LaunchStatus launch_inverse_rope(const InverseRopeArgs& args, void* stream) {
  if (args.tokens < 0 || args.heads < 1) return LaunchStatus::kInvalidArgument;
  const int64_t items = args.tokens * args.heads * (kHeadDim / kRopeLanes);
  if (items == 0) return LaunchStatus::kOk;
  const bool vector = is_aligned(args.o, 16) && is_aligned(args.out, 16);
  const dim3 grid(elementwise_blocks(items));
  const auto hip_stream = static_cast<hipStream_t>(stream);
  if (args.rope.bf16) {
    launch_overlapping(inverse_rope_kernel<true>, grid, dim3(kElementwiseThreads), 0, hip_stream, args, items, vector);
  } else {
    launch_overlapping(inverse_rope_kernel<false>, grid, dim3(kElementwiseThreads), 0, hip_stream, args, items, vector);
  }
  return last_launch_status();
}

}  // namespace dsv4::gpu
