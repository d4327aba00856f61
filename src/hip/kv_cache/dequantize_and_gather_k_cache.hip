// dsv4::dequantize_and_gather_k_cache: fp8_ds_mla records back to bf16 rows (spec/kv_cache.md §9.2).
// 32 threads per gathered token, 16 dims each (8 in each half of the row): NoPE bytes decoded with their
// block's scale, the bf16 RoPE tail copied. Block ids are checked against the table and the cache.
#include "dsv4/launch.h"
#include "kv_cache_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreadsPerToken = 32;
constexpr int kPieceDims = 8;
constexpr int kHalfDims = ds_mla::kHeadDim / 2;                               // 256
constexpr int kFirstRopeLane = (ds_mla::kNopeDim - kHalfDims) / kPieceDims;  // 24
constexpr int kTokensPerBlock = kElementwiseThreads / kThreadsPerToken;
constexpr int64_t kMaxGridRequests = 65535;
constexpr int64_t kMinTokenBlocks = 8;
constexpr int kRowsInFlight = 2;  // per warp; r + i stays below 32 since this divides 32

// 8 NoPE bytes to bf16 through the block's table of ds_mla::dequantize_nope_value at a unit scale (a
// shared-memory load and a multiply instead of a bit-field decode per value; the scale is a power of two,
// so the product is exact and equal to dequantize_nope_value's). From ds_mla::kTruncationExactScaleByte
// up, the bf16 of each product is the top half of its bits, so pairs are packed with one byte permute
// (measured ~8% faster than rounding every value on the H200).
template <Fp8Format F>
DSV4_DEVICE uint4 decode_fp8x8(uint2 codes, uint8_t scale_byte, const float* decoded) {
  const float block_scale = ue8m0_decode(scale_byte);
  const uint32_t words[2] = {codes.x, codes.y};
  float values[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t code = (words[i / 4] >> (8 * (i % 4))) & 0xffu;
    values[i] = decoded[code] * block_scale;
  }
  uint32_t pairs[4];
  if (scale_byte >= ds_mla::kTruncationExactScaleByte) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pairs[j] = __byte_perm(float_bits(values[2 * j]), float_bits(values[2 * j + 1]), 0x7632);  // top halves
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t high = float_to_bf16_bits(values[2 * j + 1]);
      pairs[j] = float_to_bf16_bits(values[2 * j]) | (high << 16);
    }
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

// One gathered row's loads: the lane's NoPE bytes and scales of both halves (or the RoPE tail).
struct RowLoad {
  int32_t block;  // < 0: a zero row
  uint2 low_codes;
  uint2 high_codes;
  uint4 rope;
  uint8_t low_scale;
  uint8_t high_scale;
};

DSV4_DEVICE RowLoad begin_row(const KvGatherArgs& args, int32_t block, int32_t position, int lane) {
  RowLoad load;
  load.block = block;
  if (block < 0) return load;
  const ds_mla::RecordAddress address =
      ds_mla::record_address_in_block(block, position, args.block_size, args.block_stride);
  const uint8_t* data = args.cache + address.data;
  const uint8_t* scales = args.cache + address.scale;
  // Lane l: dims [8l, 8l+8) and [256+8l, 256+8l+8); lanes 24..31 of the second half hold the bf16
  // RoPE tail. Every load and store of the group covers one contiguous span.
  load.low_codes = *reinterpret_cast<const uint2*>(data + lane * kPieceDims);
  load.low_scale = scales[lane * kPieceDims / ds_mla::kQuantBlock];
  if (lane < kFirstRopeLane) {
    load.high_codes = *reinterpret_cast<const uint2*>(data + kHalfDims + lane * kPieceDims);
    load.high_scale = scales[(kHalfDims + lane * kPieceDims) / ds_mla::kQuantBlock];
  } else {
    load.rope = *reinterpret_cast<const uint4*>(data + ds_mla::kNopeDim + (lane - kFirstRopeLane) * 2 * kPieceDims);
  }
  return load;
}

template <Fp8Format F>
DSV4_DEVICE void finish_row(const RowLoad& load, uint16_t* out, int lane, const float* decoded) {
  uint4 low = make_uint4(0, 0, 0, 0);
  uint4 high = make_uint4(0, 0, 0, 0);
  if (load.block >= 0) {
    low = decode_fp8x8<F>(load.low_codes, load.low_scale, decoded);
    high = lane < kFirstRopeLane ? decode_fp8x8<F>(load.high_codes, load.high_scale, decoded)
                                 : load.rope;
  }
  *reinterpret_cast<uint4*>(out + lane * kPieceDims) = low;
  *reinterpret_cast<uint4*>(out + kHalfDims + lane * kPieceDims) = high;
}

// Each warp gathers rows first, first + stride, ... of each request. For each chunk of 32 of them, lane j
// looks up row j's table entry, so one round of table loads serves 32 rows; the records of
// kRowsInFlight rows are then loaded together before either is decoded and stored. At most 64 registers
// a thread (4 blocks per multiprocessor on NVIDIA): measured best with two rows in flight. The grid is
// one wave (one_wave_blocks).
template <Fp8Format F>
__global__ void __launch_bounds__(kElementwiseThreads, 4) dequantize_and_gather_kernel(KvGatherArgs args) {
  // The decode table reads no input, so it is built while the kernel before this one finishes.
  __shared__ float decoded[256];
  for (int code = threadIdx.x; code < 256; code += blockDim.x) {
    decoded[code] = ds_mla::dequantize_nope_value<F>(static_cast<uint8_t>(code), 1.0f);
  }
  __syncthreads();
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int lane = threadIdx.x % kThreadsPerToken;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + threadIdx.x / kThreadsPerToken;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTokensPerBlock;
  for (int64_t request = blockIdx.y; request < args.requests; request += gridDim.y) {
    const int64_t seq_len = args.seq_len(request);
    const int64_t count = args.rows_to_gather(request);
    if (first >= count) continue;
    uint16_t* rows = args.out + request * args.out_request_stride + args.offset * args.out_row_stride;
    const int64_t group_rows = (count - first + stride - 1) / stride;
    for (int64_t chunk = 0; chunk < group_rows; chunk += kThreadsPerToken) {
      KvGatherArgs::Location mine{-1, 0};  // block ids and positions fit 32 bits (int32 table, block_size)
      if (chunk + lane < group_rows) mine = args.locate(request, seq_len - count + first + (chunk + lane) * stride);
      const int32_t my_block = static_cast<int32_t>(mine.block);
      const int32_t my_position = static_cast<int32_t>(mine.position);
      const int chunk_rows = group_rows - chunk < kThreadsPerToken ? static_cast<int>(group_rows - chunk)
                                                                   : kThreadsPerToken;
      for (int r = 0; r < chunk_rows; r += kRowsInFlight) {
        RowLoad loads[kRowsInFlight];
        // Lanes past chunk_rows hold block -1, so rows past the chunk load nothing.
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          loads[i] = begin_row(args, shuffle_from(my_block, r + i, kThreadsPerToken),
                               shuffle_from(my_position, r + i, kThreadsPerToken), lane);
        }
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          if (r + i < chunk_rows) {
            finish_row<F>(loads[i], rows + (first + (chunk + r + i) * stride) * args.out_row_stride, lane, decoded);
          }
        }
      }
    }
  }
}

}  // namespace

LaunchStatus launch_dequantize_and_gather_k_cache(const KvGatherArgs& args, void* stream) {
  if (args.requests < 0 || args.block_size <= 0 || args.offset < 0 || args.offset > args.out_rows) {
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t rows = args.out_rows - args.offset;
  if (args.requests == 0 || rows == 0) return LaunchStatus::kOk;
  const int64_t request_blocks = args.requests < kMaxGridRequests ? args.requests : kMaxGridRequests;
  auto hip_stream = static_cast<hipStream_t>(stream);
  with_fp8_format(args.format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    const int64_t wave = one_wave_blocks<dequantize_and_gather_kernel<kFormat>>(kElementwiseThreads);
    int64_t token_blocks = (rows + kTokensPerBlock - 1) / kTokensPerBlock;
    int64_t token_block_cap = wave / request_blocks;
    token_block_cap = token_block_cap > kMinTokenBlocks ? token_block_cap : kMinTokenBlocks;
    token_blocks = token_blocks < token_block_cap ? token_blocks : token_block_cap;
    const dim3 grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(request_blocks));
    launch_overlapping(dequantize_and_gather_kernel<kFormat>, grid, dim3(kElementwiseThreads), 0, hip_stream, args);
  });
  return last_launch_status();
}

}  // namespace dsv4::gpu
