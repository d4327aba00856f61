// mHC kernels (spec/mhc.md): mhc_pre and hc_head as a dot-product kernel and a per-token epilogue +
// collapse kernel; mhc_post as one streaming kernel. The numerics of the epilogue are dsv4/mhc.h, shared
// with the CPU path.
//
// Dot products: a block holds 4 * kTokensPerThread tokens; its 256 threads are 64 k-lanes x 4 token
// groups. For each 256-wide chunk of the flattened row, fn's rows for the chunk are staged in shared
// memory once and serve every token of the block; a k-lane takes 4 consecutive values of each of its
// tokens. The row is split into k_splits slices over the grid's second dimension, so that a handful of
// tokens (decode) still fills the GPU; each slice writes its partial sums, which the epilogue kernel adds
// in a fixed order (no atomics: the result does not depend on scheduling).
#include "dsv4/bf16.h"
#include "dsv4/launch.h"
#include "mhc_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kKLanes = 64;
constexpr int kTokenGroups = kThreads / kKLanes;  // 4
constexpr int kChunk = 4 * kKLanes;               // 256 values of the row per step
constexpr int kHalfLanes = 32;                    // reductions stay within 32-lane groups on both vendors
constexpr int kTargetBlocks = 264;                // about two per SM on current GPUs

DSV4_DEVICE void load_bf16x4(const uint16_t* src, float* values) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src);
  values[0] = bf16_bits_to_float(static_cast<uint16_t>(raw.x & 0xffffu));
  values[1] = bf16_bits_to_float(static_cast<uint16_t>(raw.x >> 16));
  values[2] = bf16_bits_to_float(static_cast<uint16_t>(raw.y & 0xffffu));
  values[3] = bf16_bits_to_float(static_cast<uint16_t>(raw.y >> 16));
}

DSV4_DEVICE float half_group_sum(float value) {
#pragma unroll
  for (int mask = kHalfLanes / 2; mask >= 1; mask >>= 1) value += shuffle_xor(value, mask, kHalfLanes);
  return value;
}

template <int kMixes, int kTokensPerThread>
__global__ void __launch_bounds__(kThreads) mhc_dots_kernel(MhcPreArgs args) {
  constexpr int kTokensPerBlock = kTokenGroups * kTokensPerThread;
  __shared__ float4 fn_chunk[kMixes][kKLanes];
  __shared__ float halves[kTokensPerBlock][2][kMixes + 1];
  const int lane = threadIdx.x % kKLanes;
  const int group = threadIdx.x / kKLanes;
  const int64_t count = mhc::kHcMult * args.hidden;
  const int64_t chunks = count / kChunk;
  const int64_t first_chunk = chunks * blockIdx.y / args.k_splits;
  const int64_t end_chunk = chunks * (blockIdx.y + 1) / args.k_splits;
  const int64_t first_token = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock;

  float dots[kTokensPerThread][kMixes];
  float squares[kTokensPerThread];
#pragma unroll
  for (int p = 0; p < kTokensPerThread; ++p) {
    squares[p] = 0.0f;
#pragma unroll
    for (int m = 0; m < kMixes; ++m) dots[p][m] = 0.0f;
  }
  // Software pipeline: the next chunk's fn values wait in registers (staged) and this chunk's stream
  // values are in flight while the block synchronizes, so neither load's latency stalls the arithmetic.
  constexpr int kStaged = (kMixes * kKLanes + kThreads - 1) / kThreads;
  float4 staged[kStaged];
  const auto stage = [&](int64_t chunk) {
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int i = threadIdx.x + s * kThreads;
      if (i < kMixes * kKLanes) {
        staged[s] = *reinterpret_cast<const float4*>(args.fn + (i / kKLanes) * count + chunk * kChunk +
                                                     4 * (i % kKLanes));
      }
    }
  };
  if (first_chunk < end_chunk) stage(first_chunk);
  for (int64_t chunk = first_chunk; chunk < end_chunk; ++chunk) {
    const int64_t k0 = chunk * kChunk;
    float x[kTokensPerThread][4];
#pragma unroll
    for (int p = 0; p < kTokensPerThread; ++p) {
      const int64_t token = first_token + group + kTokenGroups * p;
      if (token < args.tokens) {
        load_bf16x4(args.residual + token * count + k0 + 4 * lane, x[p]);
      } else {
        x[p][0] = x[p][1] = x[p][2] = x[p][3] = 0.0f;
      }
    }
    __syncthreads();  // the previous chunk's fn is no longer read
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int i = threadIdx.x + s * kThreads;
      if (i < kMixes * kKLanes) fn_chunk[i / kKLanes][i % kKLanes] = staged[s];
    }
    __syncthreads();
    if (chunk + 1 < end_chunk) stage(chunk + 1);
#pragma unroll
    for (int p = 0; p < kTokensPerThread; ++p) {
      squares[p] += x[p][0] * x[p][0] + x[p][1] * x[p][1] + x[p][2] * x[p][2] + x[p][3] * x[p][3];
    }
#pragma unroll
    for (int m = 0; m < kMixes; ++m) {
      const float4 f = fn_chunk[m][lane];
#pragma unroll
      for (int p = 0; p < kTokensPerThread; ++p) {
        dots[p][m] += x[p][0] * f.x + x[p][1] * f.y + x[p][2] * f.z + x[p][3] * f.w;
      }
    }
  }
  // Reduce over the 64 k-lanes of each token: within each 32-lane half, then the two halves.
#pragma unroll
  for (int p = 0; p < kTokensPerThread; ++p) {
    const int slot_token = group + kTokenGroups * p;
#pragma unroll
    for (int m = 0; m <= kMixes; ++m) {
      const float total = half_group_sum(m < kMixes ? dots[p][m] : squares[p]);
      if (lane % kHalfLanes == 0) halves[slot_token][lane / kHalfLanes][m] = total;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTokensPerBlock * (kMixes + 1); i += kThreads) {
    const int slot_token = i / (kMixes + 1);
    const int m = i % (kMixes + 1);
    const int64_t token = first_token + slot_token;
    if (token < args.tokens) {
      args.partials[(blockIdx.y * args.tokens + token) * (kMixes + 1) + m] =
          halves[slot_token][0][m] + halves[slot_token][1][m];
    }
  }
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

// One block per token: the partial sums in split order, the epilogue, then the collapse.
template <int kMixes>
__global__ void __launch_bounds__(kThreads) mhc_collapse_kernel(MhcPreArgs args) {
  __shared__ float sums[kMixes + 1];
  __shared__ float pre[mhc::kHcMult];
  __shared__ float scratch[kThreads / kHalfLanes];
  const int64_t token = blockIdx.x;
  if (threadIdx.x <= kMixes) {
    float total = 0.0f;
    for (int s = 0; s < args.k_splits; ++s) total += args.partials[(s * args.tokens + token) * (kMixes + 1) + threadIdx.x];
    sums[threadIdx.x] = total;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t count = mhc::kHcMult * args.hidden;
    float weights[mhc::kHcMult];
    if constexpr (kMixes == mhc::kPreMixes) {
      float post[mhc::kHcMult];
      mhc::pre_epilogue(sums, sums[kMixes], count, args.scale, args.base, args.config, weights, post,
                        args.comb_mix + token * mhc::kHcMult * mhc::kHcMult);
      for (int i = 0; i < mhc::kHcMult; ++i) args.post_mix[token * mhc::kHcMult + i] = post[i];
    } else {
      mhc::head_epilogue(sums, sums[kMixes], count, args.scale, args.base, args.config, weights);
    }
    for (int i = 0; i < mhc::kHcMult; ++i) pre[i] = weights[i];
  }
  __syncthreads();
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

template <int kMixes, int kTokensPerThread>
void launch_dots(const MhcPreArgs& args, hipStream_t stream) {
  constexpr int kTokensPerBlock = kTokenGroups * kTokensPerThread;
  const dim3 grid(static_cast<unsigned>((args.tokens + kTokensPerBlock - 1) / kTokensPerBlock),
                  static_cast<unsigned>(args.k_splits));
  hipLaunchKernelGGL((mhc_dots_kernel<kMixes, kTokensPerThread>), grid, dim3(kThreads), 0, stream, args);
}

constexpr int64_t kManyTokens = 64;  // from here on a thread takes 4 tokens (fn staged once per 16)

}  // namespace

int mhc_pre_k_splits(int64_t tokens, int64_t hidden) {
  const int64_t tokens_per_block = kTokenGroups * (tokens >= kManyTokens ? 4 : 1);
  const int64_t blocks = (tokens + tokens_per_block - 1) / tokens_per_block;
  const int64_t chunks = mhc::kHcMult * hidden / kChunk;
  int64_t splits = blocks >= kTargetBlocks ? 1 : (kTargetBlocks + blocks - 1) / blocks;
  splits = splits < chunks ? splits : chunks;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

LaunchStatus launch_mhc_pre(const MhcPreArgs& args, void* stream) {
  if (args.tokens < 0 || args.hidden <= 0 || (mhc::kHcMult * args.hidden) % kChunk != 0 || args.hidden % 8 != 0 ||
      args.k_splits < 1 || (args.mixes != mhc::kPreMixes && args.mixes != mhc::kHeadMixes)) {
    return LaunchStatus::kInvalidArgument;
  }
  if (args.tokens == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
  const bool many = args.tokens >= kManyTokens;
  if (args.mixes == mhc::kPreMixes) {
    many ? launch_dots<mhc::kPreMixes, 4>(args, hip_stream) : launch_dots<mhc::kPreMixes, 1>(args, hip_stream);
    hipLaunchKernelGGL((mhc_collapse_kernel<mhc::kPreMixes>), dim3(static_cast<unsigned>(args.tokens)),
                       dim3(kThreads), 0, hip_stream, args);
  } else {
    many ? launch_dots<mhc::kHeadMixes, 4>(args, hip_stream) : launch_dots<mhc::kHeadMixes, 1>(args, hip_stream);
    hipLaunchKernelGGL((mhc_collapse_kernel<mhc::kHeadMixes>), dim3(static_cast<unsigned>(args.tokens)),
                       dim3(kThreads), 0, hip_stream, args);
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
