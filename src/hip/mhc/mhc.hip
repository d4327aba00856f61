// mHC kernels (spec/mhc.md): mhc_pre and hc_head as three kernels (dot products, per-token epilogue,
// collapse); mhc_post as one streaming kernel. The numerics of the epilogue are dsv4/mhc.h, shared with
// the CPU path.
//
// Dot products on the matrix units (mhc_tile_mma.h): a warp takes 16 tokens, a block 4 warps. fn is
// fp32 and the units take bf16, so each 64-wide chunk of fn is split, once per block, into three bf16
// planes hi + mid + lo that sum to it exactly; the products with the bf16 stream values are then exact and
// only the accumulation rounds, as in an fp32 dot product. The flattened row is split into k_splits
// slices over the grid's second dimension, so that a handful of tokens (decode) still fills the GPU; each
// slice writes its partial sums, which the epilogue kernel adds in a fixed order (no atomics: the result
// does not depend on scheduling).
#include "dsv4/bf16.h"
#include "dsv4/launch.h"
#include "mhc_launchers.h"
#include "mhc_tile_mma.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kHalfLanes = 32;     // reductions stay within 32-lane groups on both vendors
constexpr int kTargetBlocks = 264;  // about two per SM on current GPUs
constexpr int kDotsWarps = 4;
constexpr int kDotsTokens = kDotsWarps * tile::kRows;  // tokens per dots block
constexpr int kSplitPlanes = 3;                        // fn = hi + mid + lo
constexpr int kEpilogueThreads = 128;

DSV4_DEVICE float half_group_sum(float value) {
#pragma unroll
  for (int mask = kHalfLanes / 2; mask >= 1; mask >>= 1) value += shuffle_xor(value, mask, kHalfLanes);
  return value;
}

DSV4_DEVICE float bf16_low(uint32_t word) { return bits_float(word << 16); }
DSV4_DEVICE float bf16_high(uint32_t word) { return bits_float(word & 0xffff0000u); }

DSV4_DEVICE uint32_t word_of(const uint4 (&run)[2], int w) {
  const uint4& half = run[w / 4];
  switch (w % 4) {
    case 0: return half.x;
    case 1: return half.y;
    case 2: return half.z;
    default: return half.w;
  }
}

// 4 consecutive fp32 values split into three bf16 planes (hi, mid, lo), each packed as 4 bf16.
DSV4_DEVICE void split_planes(const float4& v, uint2 (&planes)[kSplitPlanes]) {
  const float values[4] = {v.x, v.y, v.z, v.w};
  uint16_t bits[kSplitPlanes][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float rest = values[j];
#pragma unroll
    for (int p = 0; p < kSplitPlanes; ++p) {
      bits[p][j] = float_to_bf16_bits(rest);
      rest = rest - bf16_bits_to_float(bits[p][j]);  // exact: rest keeps fewer significant bits each time
    }
  }
#pragma unroll
  for (int p = 0; p < kSplitPlanes; ++p) {
    planes[p] = make_uint2(bits[p][0] | (static_cast<uint32_t>(bits[p][1]) << 16),
                           bits[p][2] | (static_cast<uint32_t>(bits[p][3]) << 16));
  }
}

template <int kMixes>
__global__ void __launch_bounds__(kDotsWarps * kWarpSize) mhc_dots_kernel(MhcPreArgs args) {
  constexpr int kBlockThreads = kDotsWarps * kWarpSize;
  constexpr int kColTiles = (kMixes + tile::kCols - 1) / tile::kCols;
  // The chunk of fn in operand order: [column tile][plane][half of the run][column][run], so that a
  // warp's 16-byte reads of its B runs are contiguous.
  __shared__ uint4 fn_runs[kColTiles][kSplitPlanes][2][tile::kCols][tile::kRuns];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int run = tile::run_of(lane);
  const int64_t count = mhc::kHcMult * args.hidden;
  const int64_t chunks = count / tile::kChunk;
  const int64_t first_chunk = chunks * blockIdx.y / args.k_splits;
  const int64_t end_chunk = chunks * (blockIdx.y + 1) / args.k_splits;
  const int64_t warp_token = static_cast<int64_t>(blockIdx.x) * kDotsTokens + warp * tile::kRows;

  const uint16_t* rows[tile::kRowsPerLane];
  bool valid[tile::kRowsPerLane];
#pragma unroll
  for (int i = 0; i < tile::kRowsPerLane; ++i) {
    const int64_t token = warp_token + tile::a_row(lane, i);
    valid[i] = token < args.tokens;
    rows[i] = args.residual + (valid[i] ? token : 0) * count + run * tile::kRunLength;
  }
  float acc[kColTiles][tile::kAccumulators];
  float squares[tile::kRowsPerLane];
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int e = 0; e < tile::kAccumulators; ++e) acc[c][e] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < tile::kRowsPerLane; ++i) squares[i] = 0.0f;

  // Software pipeline: the next chunk's fn values wait in registers (staged) and this chunk's stream
  // values are in flight while the block synchronizes.
  constexpr int kVectorsPerColumn = tile::kChunk / 4;
  constexpr int kStageVectors = kColTiles * tile::kCols * kVectorsPerColumn;
  constexpr int kStaged = (kStageVectors + kBlockThreads - 1) / kBlockThreads;
  float4 staged[kStaged];
  const auto stage = [&](int64_t chunk) {
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int f = threadIdx.x + s * kBlockThreads;
      const int m = f / kVectorsPerColumn;
      staged[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (f < kStageVectors && m < kMixes) {
        staged[s] = *reinterpret_cast<const float4*>(args.fn + m * count + chunk * tile::kChunk +
                                                     4 * (f % kVectorsPerColumn));
      }
    }
  };
  const auto store_staged = [&]() {
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int f = threadIdx.x + s * kBlockThreads;
      if (f < kStageVectors) {
        const int m = f / kVectorsPerColumn;
        const int k = 4 * (f % kVectorsPerColumn);
        const int within = k % tile::kRunLength;
        uint2 planes[kSplitPlanes];
        split_planes(staged[s], planes);
#pragma unroll
        for (int p = 0; p < kSplitPlanes; ++p) {
          uint4& slot = fn_runs[m / tile::kCols][p][within / 8][m % tile::kCols][k / tile::kRunLength];
          reinterpret_cast<uint2*>(&slot)[(within % 8) / 4] = planes[p];
        }
      }
    }
  };

  if (first_chunk < end_chunk) stage(first_chunk);
  for (int64_t chunk = first_chunk; chunk < end_chunk; ++chunk) {
    uint4 a_runs[tile::kRowsPerLane][2];
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) {
      if (valid[i]) {
        const uint4* src = reinterpret_cast<const uint4*>(rows[i] + chunk * tile::kChunk);
        a_runs[i][0] = src[0];
        a_runs[i][1] = src[1];
      } else {
        a_runs[i][0] = a_runs[i][1] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    __syncthreads();  // the previous chunk's fn is no longer read
    store_staged();
    __syncthreads();
    if (chunk + 1 < end_chunk) stage(chunk + 1);
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) {
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        const uint32_t word = word_of(a_runs[i], w);
        squares[i] += bf16_low(word) * bf16_low(word) + bf16_high(word) * bf16_high(word);
      }
    }
#pragma unroll
    for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
      for (int p = 0; p < kSplitPlanes; ++p) {
        const uint4 b_runs[2] = {fn_runs[c][p][0][tile::b_col(lane)][run], fn_runs[c][p][1][tile::b_col(lane)][run]};
#pragma unroll
        for (int step = 0; step < 4; ++step) {
          uint32_t a[tile::kRowsPerLane][2];
#pragma unroll
          for (int i = 0; i < tile::kRowsPerLane; ++i) {
            a[i][0] = word_of(a_runs[i], 2 * step);
            a[i][1] = word_of(a_runs[i], 2 * step + 1);
          }
          const uint32_t b[2] = {word_of(b_runs, 2 * step), word_of(b_runs, 2 * step + 1)};
          tile::mma_step(acc[c], a, b);
        }
      }
    }
  }
  // The sum of squares of a row: its runs are spread over kRuns lanes.
#pragma unroll
  for (int i = 0; i < tile::kRowsPerLane; ++i) {
    squares[i] += shuffle_xor(squares[i], tile::kRunLaneMask0, kWarpSize);
    squares[i] += shuffle_xor(squares[i], tile::kRunLaneMask1, kWarpSize);
  }
  float* partials = args.partials + static_cast<int64_t>(blockIdx.y) * args.tokens * (kMixes + 1);
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int e = 0; e < tile::kAccumulators; ++e) {
      const int64_t token = warp_token + tile::d_row(lane, e);
      const int mix = c * tile::kCols + tile::d_col(lane, e);
      if (token < args.tokens && mix < kMixes) partials[token * (kMixes + 1) + mix] = acc[c][e];
    }
  }
  if (run == 0) {
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) {
      const int64_t token = warp_token + tile::a_row(lane, i);
      if (token < args.tokens) partials[token * (kMixes + 1) + kMixes] = squares[i];
    }
  }
}

// One thread per token: the partial sums in split order, then the epilogue; the pre weights go to the
// workspace for the collapse.
template <int kMixes>
__global__ void __launch_bounds__(kEpilogueThreads) mhc_epilogue_kernel(MhcPreArgs args, float* pre_weights) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kEpilogueThreads + threadIdx.x;
  if (token >= args.tokens) return;
  float sums[kMixes + 1];
#pragma unroll
  for (int m = 0; m <= kMixes; ++m) sums[m] = 0.0f;
  for (int s = 0; s < args.k_splits; ++s) {
    const float* partial = args.partials + (s * args.tokens + token) * (kMixes + 1);
#pragma unroll
    for (int m = 0; m <= kMixes; ++m) sums[m] += partial[m];
  }
  const int64_t count = mhc::kHcMult * args.hidden;
  float weights[mhc::kHcMult];
  if constexpr (kMixes == mhc::kPreMixes) {
    float post[mhc::kHcMult];
    mhc::pre_epilogue(sums, sums[kMixes], count, args.scale, args.base, args.config, weights, post,
                      args.comb_mix + token * mhc::kHcMult * mhc::kHcMult);
#pragma unroll
    for (int i = 0; i < mhc::kHcMult; ++i) args.post_mix[token * mhc::kHcMult + i] = post[i];
  } else {
    mhc::head_epilogue(sums, sums[kMixes], count, args.scale, args.base, args.config, weights);
  }
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) pre_weights[token * mhc::kHcMult + i] = weights[i];
}

DSV4_DEVICE float block_sum(float value, float* scratch) {
  value = half_group_sum(value);
  const int half = threadIdx.x / kHalfLanes;
  if (threadIdx.x % kHalfLanes == 0) scratch[half] = value;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / kHalfLanes; ++i) total += scratch[i];
  __syncthreads();
  return total;
}

// 8 collapsed values of hidden dims [8v, 8v+8): sum_i pre_i * residual_i.
DSV4_DEVICE void collapse8(const uint16_t* residual, int64_t hidden, int64_t v, const float* pre, float* out) {
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) {
    const uint4 raw = *reinterpret_cast<const uint4*>(residual + i * hidden + 8 * v);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[2 * j] += pre[i] * bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
      out[2 * j + 1] += pre[i] * bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
    }
  }
}

DSV4_DEVICE uint4 pack_bf16x8(const float* values) {
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    words[j] = float_to_bf16_bits(values[2 * j]) | (static_cast<uint32_t>(float_to_bf16_bits(values[2 * j + 1])) << 16);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// One block per token: layer_input from the pre weights of the epilogue kernel.
__global__ void __launch_bounds__(kThreads) mhc_collapse_kernel(MhcPreArgs args, const float* pre_weights) {
  __shared__ float scratch[kThreads / kHalfLanes];
  const int64_t token = blockIdx.x;
  float pre[mhc::kHcMult];
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) pre[i] = pre_weights[token * mhc::kHcMult + i];
  const uint16_t* residual = args.residual + token * mhc::kHcMult * args.hidden;
  uint16_t* out = args.out + token * args.hidden;
  const int64_t vectors = args.hidden / 8;
  float norm = 1.0f;
  if (args.norm_weight != nullptr) {  // a first pass for the RMS of the collapsed row
    float squares = 0.0f;
    for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
      float values[8];
      collapse8(residual, args.hidden, v, pre, values);
#pragma unroll
      for (int j = 0; j < 8; ++j) squares += values[j] * values[j];
    }
    norm = mhc::rms_factor(block_sum(squares, scratch), args.hidden, args.norm_eps);
  }
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    float values[8];
    collapse8(residual, args.hidden, v, pre, values);
    if (args.norm_weight != nullptr) {
      const uint4 raw = *reinterpret_cast<const uint4*>(args.norm_weight + 8 * v);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        values[2 * j] = values[2 * j] * norm * bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
        values[2 * j + 1] = values[2 * j + 1] * norm * bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
      }
    }
    *reinterpret_cast<uint4*>(out + 8 * v) = pack_bf16x8(values);
  }
}

__global__ void __launch_bounds__(kThreads) mhc_post_kernel(MhcPostArgs args) {
  constexpr int kStreams = mhc::kHcMult;
  const int64_t vectors_per_token = args.hidden / 8;
  const int64_t vectors = args.tokens * vectors_per_token;
  for (int64_t index = global_thread_index(); index < vectors; index += global_thread_count()) {
    const IndexSplit split = divide_index(index, vectors_per_token);
    const int64_t token = split.quotient;
    const int64_t v = split.remainder;
    const float* post = args.post_mix + token * kStreams;
    const float* comb = args.comb_mix + token * kStreams * kStreams;
    const uint16_t* residual = args.residual + token * kStreams * args.hidden + 8 * v;
    float x[8];
    float streams[kStreams][8];
    {
      const uint4 raw = *reinterpret_cast<const uint4*>(args.x + token * args.hidden + 8 * v);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[2 * j] = bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
        x[2 * j + 1] = bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
      }
    }
#pragma unroll
    for (int i = 0; i < kStreams; ++i) {
      const uint4 raw = *reinterpret_cast<const uint4*>(residual + i * args.hidden);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        streams[i][2 * j] = bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
        streams[i][2 * j + 1] = bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
      }
    }
    uint16_t* out = args.out + token * kStreams * args.hidden + 8 * v;
#pragma unroll
    for (int j_stream = 0; j_stream < kStreams; ++j_stream) {
      float values[8];
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        float value = post[j_stream] * x[d];
#pragma unroll
        for (int i = 0; i < kStreams; ++i) value += comb[i * kStreams + j_stream] * streams[i][d];
        values[d] = value;
      }
      *reinterpret_cast<uint4*>(out + j_stream * args.hidden) = pack_bf16x8(values);
    }
  }
}

template <int kMixes>
void launch_pre_kernels(const MhcPreArgs& args, hipStream_t stream) {
  const dim3 dots_grid(static_cast<unsigned>((args.tokens + kDotsTokens - 1) / kDotsTokens),
                       static_cast<unsigned>(args.k_splits));
  // kWarpSize is a device-pass constant; the host sizes the block from the vendor it compiles for.
#if defined(__HIPCC__)
  constexpr int kHostWarpSize = 64;
#else
  constexpr int kHostWarpSize = 32;
#endif
  hipLaunchKernelGGL((mhc_dots_kernel<kMixes>), dots_grid, dim3(kDotsWarps * kHostWarpSize), 0, stream, args);
  float* pre_weights = args.partials + static_cast<int64_t>(args.k_splits) * args.tokens * (kMixes + 1);
  hipLaunchKernelGGL((mhc_epilogue_kernel<kMixes>),
                     dim3(static_cast<unsigned>((args.tokens + kEpilogueThreads - 1) / kEpilogueThreads)),
                     dim3(kEpilogueThreads), 0, stream, args, pre_weights);
  hipLaunchKernelGGL(mhc_collapse_kernel, dim3(static_cast<unsigned>(args.tokens)), dim3(kThreads), 0, stream, args,
                     static_cast<const float*>(pre_weights));
}

}  // namespace

int mhc_pre_k_splits(int64_t tokens, int64_t hidden) {
  const int64_t blocks = (tokens + kDotsTokens - 1) / kDotsTokens;
  const int64_t chunks = mhc::kHcMult * hidden / tile::kChunk;
  int64_t splits = blocks >= kTargetBlocks ? 1 : (kTargetBlocks + blocks - 1) / blocks;
  splits = splits < chunks ? splits : chunks;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

int64_t mhc_pre_workspace_floats(int64_t tokens, int64_t hidden, int mixes) {
  return static_cast<int64_t>(mhc_pre_k_splits(tokens, hidden)) * tokens * (mixes + 1) + tokens * mhc::kHcMult;
}

LaunchStatus launch_mhc_pre(const MhcPreArgs& args, void* stream) {
  if (args.tokens < 0 || args.hidden <= 0 || (mhc::kHcMult * args.hidden) % tile::kChunk != 0 ||
      args.hidden % 8 != 0 || args.k_splits != mhc_pre_k_splits(args.tokens, args.hidden) ||
      (args.mixes != mhc::kPreMixes && args.mixes != mhc::kHeadMixes)) {
    return LaunchStatus::kInvalidArgument;
  }
  if (args.tokens == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
  if (args.mixes == mhc::kPreMixes) {
    launch_pre_kernels<mhc::kPreMixes>(args, hip_stream);
  } else {
    launch_pre_kernels<mhc::kHeadMixes>(args, hip_stream);
  }
  return last_launch_status();
}

LaunchStatus launch_mhc_post(const MhcPostArgs& args, void* stream) {
  if (args.tokens < 0 || args.hidden <= 0 || args.hidden % 8 != 0) return LaunchStatus::kInvalidArgument;
  const int64_t vectors = args.tokens * (args.hidden / 8);
  if (vectors == 0) return LaunchStatus::kOk;
  hipLaunchKernelGGL(mhc_post_kernel, dim3(elementwise_blocks(vectors)), dim3(kThreads), 0,
                     static_cast<hipStream_t>(stream), args);
  return last_launch_status();
}

}  // namespace dsv4::gpu
