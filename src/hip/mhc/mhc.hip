// mHC kernels (spec/mhc.md): mhc_pre and hc_head as three kernels (dot products, per-token epilogue,
// collapse), after a fourth that splits fn for many tokens, and as two for a few tokens (the epilogue and
// the collapse of a token in one block); mhc_post as one streaming kernel; mhc_fused_post_pre, on AMD, as
// pre with post made inside its dot-product kernel (dots_block's kFusePost). The numerics of the epilogue
// are dsv4/mhc.h, shared with the CPU path.
//
// Dot products on the matrix units (mhc_tile_mma.h): a warp takes one or two 16-token tiles, a block 4
// warps. fn is fp32 and the units take bf16, so each 64-wide chunk of fn is split into three bf16 planes
// hi + mid + lo that sum to it exactly; the products with the bf16 stream values are then exact and only the
// accumulation rounds, as in an fp32 dot product. With a few token blocks each block splits its chunks
// itself; with more, one small kernel splits fn once into the workspace and the blocks copy the planes
// (the split is most of a block's instructions otherwise). The sums of squares run on the fp32 pipe beside
// them: each lane squares its own run values, and a row's lanes add their sums in a fixed order at the end
// (as products on the matrix units they took 2 of every 11 NVIDIA MMAs, a tile times its own transpose of
// which only the diagonal was used). The flattened row is split into k_splits slices over the grid's
// second dimension, so that a handful of tokens (decode) still fills the GPU; each slice writes its partial
// sums, which the epilogue kernel adds in a fixed order (no atomics: the result does not depend on
// scheduling).
//
// Where pre's time goes (H200, inputs past the L2, per kernel): hidden 4096, 1024 tokens: fn split 2.5 us,
// dots 17.1, epilogue 7.0, collapse 8.7 (42 MB: 4.8 TB/s, so its residual reads partly hit the L2); 8192 tokens:
// 2.5, 78.9, 9.6, 76.6; hidden 7168, 1024 tokens: 3.3, 25.7, 6.9, 16.8; 8192 tokens: 3.5, 132.3, 9.4, 133.6.
// The dots and the collapse each read the whole residual, so at 8192 tokens those two reads and the output
// take 142 / 248 us at the copy bandwidth, more than 70% of it allows for the bytes the op must move (113 /
// 197 us). Reading the residual once needs each token's flattened row on chip from its dots to its collapse,
// with the epilogue's latency (the Sinkhorn steps, a serial chain) hidden behind other tokens' loads and dots:
// e.g. a cluster of 16 blocks, each holding its slice of fn (hidden 4096: 96 KB fp32) and three 16-token
// residual slices (3 x 32 KB: one loading, one in its dots, one waiting for its epilogue), adding the slices'
// sums through distributed shared memory. At hidden 7168 the fn slice alone is 168 KB, which leaves room for
// one residual slice: no overlap.
// Tried (commit cd0926c, NVIDIA, taken out again): one persistent kernel of 16-block clusters, each block keeping
// its fn slice in shared memory, dot warps streaming token tiles from DRAM into partial sums, and other warps of
// each block running the epilogue of the tile's tokens and collapsing them from the L2 behind a split-phase cluster
// barrier. H200, same run: hidden 4096, 256 / 1024 / 8192 tokens 23.3 / 59.4 / 389.5 us against 21.6 / 36.4 / 168.5
// for these kernels; hidden 7168 60.8 / 151.0 / 874.4 against 27.9 / 55.5 / 279.9. Only 7 such clusters are
// resident (112 multiprocessors), and a tile took ~21 us where its DRAM reads take ~5: each block's epilogue
// (the Sinkhorn chain) and collapse of its few tokens ran one tile at a time, and the dot warps waited for them
// at the barrier. What it needs: many tokens' epilogues in flight a block (several tiles in the epilogue stage
// at once) and the collapse's loads all issued together.
#include <type_traits>

#include "dsv4/bf16.h"
#include "dsv4/launch.h"
#include "mhc_launchers.h"
#include "mhc_tile_mma.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kHalfLanes = 32;     // reductions stay within 32-lane groups on both vendors
constexpr int kTargetBlocks = 528;  // dots blocks: about four per SM on current GPUs, at most one wave
constexpr int kDotsWarps = 4;
// 16-token tiles per warp in the pre dots kernel: two from kTwoTileMinTokens tokens (each fn chunk in
// shared memory then serves twice the tokens; with fewer tokens the extra blocks of one tile pay more).
constexpr int64_t kTwoTileMinTokens = 2048;
DSV4_HD constexpr int dots_tiles_per_warp(int64_t tokens) { return tokens >= kTwoTileMinTokens ? 2 : 1; }
DSV4_HD constexpr int64_t dots_block_tokens(int tiles_per_warp) { return int64_t{kDotsWarps} * tiles_per_warp * 16; }
// Floats per token and k slice in the partial sums: the mixes and the sum of squares, padded for 16-byte
// loads.
DSV4_HD constexpr int partial_stride(int mixes) { return (mixes + 1 + 3) / 4 * 4; }
constexpr int kSplitPlanes = 3;                        // fn = hi + mid + lo
// Token blocks from which fn is split once by its own kernel rather than by every block.
constexpr int64_t kPresplitMinTokenBlocks = 4;
// Upper bound of the bytes of one split chunk of fn (FnChunk) on either vendor, for the host's workspace
// size: columns padded to 16 (the CDNA tile width; NVIDIA's 8 divides it).
DSV4_HD constexpr int64_t split_chunk_bytes_bound(int mixes) {
  return int64_t{(mixes + 15) / 16 * 16} * kSplitPlanes * tile::kChunk * 2;
}
constexpr int kEpilogueThreads = 128;
// Lanes per token in the epilogue: 16 (one per comb value), or 32 (two loading lanes per comb value) from
// kWideEpilogueMinSplits k slices on (decode), whose loads then take half the rounds.
constexpr int kCombLanes = 16;
constexpr int kWideEpilogueMinSplits = 33;
constexpr int kMaxSplits = 128;
// Tokens up to which one kernel runs each token's epilogue and collapse (a block per token: a launch saved,
// and the token's residual loads during its epilogue). Beyond, pre's epilogue (the Sinkhorn chain) holds
// each block's collapse back too long; the head's (a sigmoid) does not. H200, same run, merged vs separate:
// pre 13.3-16.9 vs 16.1-20.4 us at 65-128 tokens, 22.4 vs 19.3 at 192 (hidden 4096); hc_head 6.4-21.4 vs
// 8.9-22.0 us at 65-768 tokens, 27.2 vs 26.5 at 1024. Pre merged at every size, later run (inputs past the L2):
// hidden 4096 256 tokens 21.5 -> 25.3 us, 1024 36.7 -> 69.9, 2048 56.0 -> 134.0, 8192 172.1 -> 440.5; hidden
// 7168 1024 tokens 56.0 -> 88.5, 8192 289.9 -> 530.7.
DSV4_HD constexpr int64_t merged_epilogue_max_tokens(int mixes) { return mixes == mhc::kPreMixes ? 128 : 768; }
// Tokens up to which the post and dots kernels are launched to overlap the kernel before them
// (launch_overlapping): each waits for it before reading, and the launch latency between short kernels is
// hidden (measured up to 64 tokens; larger sizes launch plainly, where a launch latency is small against
// the kernels' run time). The one-kernel epilogue + collapse always overlaps the dots kernel, which releases
// it only once the residual's writer has finished (the dots kernel waits for that writer, or for a split of
// fn launched after it, or was itself launched after it, or -- the fused dots kernel -- is that writer, and
// the residual loads after the wait).
constexpr int64_t kChainedMaxTokens = 64;
// Rounds of each thread's collapse vectors that kernel loads before the epilogue: all of them up to
// hidden 8192 (4 rounds of 256 threads x 8 values).
constexpr int kCollapsePrefetchRounds = 4;

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

// One 64-wide chunk of fn for every mix, as the B operand: [column tile][plane][half of the run][column]
// [run] (a warp's 16-byte reads of its runs are then contiguous).
template <int kMixes>
struct FnChunk {
  static constexpr int kColTiles = (kMixes + tile::kCols - 1) / tile::kCols;
  static constexpr int kVectorsPerColumn = tile::kChunk / 4;
  static constexpr int kVectors = kColTiles * tile::kCols * kVectorsPerColumn;  // float4 loads per chunk
  uint4 runs[kColTiles][kSplitPlanes][2][tile::kCols][tile::kRuns];
  static constexpr int kUint4s = kColTiles * kSplitPlanes * 2 * tile::kCols * tile::kRuns;

  // float4 number f of the chunk starting at fn + k0 (zero for the padding columns).
  static DSV4_DEVICE float4 load(const float* fn, int64_t count, int64_t k0, int f) {
    const int m = f / kVectorsPerColumn;
    if (m >= kMixes) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return *reinterpret_cast<const float4*>(fn + m * count + k0 + 4 * (f % kVectorsPerColumn));
  }

  // The same for chunk `chunk` of the stream-interleaved order of the fused post + pre dots: dims
  // [16 chunk, + 16) of each stream, run r holding stream r.
  static DSV4_DEVICE float4 load_by_stream(const float* fn, int64_t count, int64_t chunk, int f) {
    const int m = f / kVectorsPerColumn;
    if (m >= kMixes) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int k = 4 * (f % kVectorsPerColumn);
    const int64_t stream = k / tile::kRunLength;
    const int64_t column = stream * (count / mhc::kHcMult) + chunk * tile::kRunLength + k % tile::kRunLength;
    return *reinterpret_cast<const float4*>(fn + m * count + column);
  }

  DSV4_DEVICE void store(int f, const float4& value) {
    const int m = f / kVectorsPerColumn;
    const int k = 4 * (f % kVectorsPerColumn);
    const int within = k % tile::kRunLength;
    uint2 planes[kSplitPlanes];
    split_planes(value, planes);
#pragma unroll
    for (int p = 0; p < kSplitPlanes; ++p) {
      uint4& slot = runs[m / tile::kCols][p][within / 8][m % tile::kCols][k / tile::kRunLength];
      reinterpret_cast<uint2*>(&slot)[(within % 8) / 4] = planes[p];
    }
  }
};

// The lane's sums of squares of its run values, one per row of A it holds (fp32; the products are exact).
using LaneSquares = float[tile::kRowsPerLane];

// Adds the squares of the 4 bf16 values of two words to `sum`.
DSV4_DEVICE void add_squares(float& sum, uint32_t low, uint32_t high) {
  const uint32_t words[2] = {low, high};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const float first = bf16_bits_to_float(static_cast<uint16_t>(words[w] & 0xffffu));
    const float second = bf16_bits_to_float(static_cast<uint16_t>(words[w] >> 16));
    sum = fmaf(first, first, sum);
    sum = fmaf(second, second, sum);
  }
}

// The lane's share of half `h` of one chunk (steps 2h and 2h + 1: values 8h..8h+7 of every run): its A
// values times every column tile and plane of the chunk, and times themselves for the squares.
template <int kMixes>
DSV4_DEVICE void accumulate_half(float (&acc)[FnChunk<kMixes>::kColTiles][tile::kAccumulators], LaneSquares& squares,
                                 const uint4 (&a_half)[tile::kRowsPerLane], const FnChunk<kMixes>& chunk, int lane,
                                 int h) {
  const int col = tile::b_col(lane);
  const int run = tile::run_of(lane);
#pragma unroll
  for (int i = 0; i < tile::kRowsPerLane; ++i) {
    add_squares(squares[i], a_half[i].x, a_half[i].y);
    add_squares(squares[i], a_half[i].z, a_half[i].w);
  }
#pragma unroll
  for (int c = 0; c < FnChunk<kMixes>::kColTiles; ++c) {
#pragma unroll
    for (int p = 0; p < kSplitPlanes; ++p) {
      const uint4 b_half = chunk.runs[c][p][h][col][run];  // one 16-byte load
      tile::mma_two_steps(acc[c], a_half, b_half);
    }
  }
}

// The whole chunk: both halves.
template <int kMixes>
DSV4_DEVICE void accumulate_chunk(float (&acc)[FnChunk<kMixes>::kColTiles][tile::kAccumulators], LaneSquares& squares,
                                  const uint4 (&a_runs)[tile::kRowsPerLane][2], const FnChunk<kMixes>& chunk,
                                  int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint4 a_half[tile::kRowsPerLane];
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) a_half[i] = a_runs[i][h];
    accumulate_half<kMixes>(acc, squares, a_half, chunk, lane, h);
  }
}

// The warp's partial sums (dot products and sums of squares of its 16 tokens) for k slice `split`.
template <int kMixes>
DSV4_DEVICE void write_partials(const MhcPreArgs& args, int split, int64_t warp_token, int lane,
                                float (&acc)[FnChunk<kMixes>::kColTiles][tile::kAccumulators],
                                const LaneSquares& squares) {
  // Layout [token][split][mix]: the epilogue's lanes then read a token's slices contiguously.
  const auto partial = [&](int64_t token) {
    return args.partials + (token * args.k_splits + split) * partial_stride(kMixes);
  };
#pragma unroll
  for (int c = 0; c < FnChunk<kMixes>::kColTiles; ++c) {
#pragma unroll
    for (int e = 0; e < tile::kAccumulators; ++e) {
      const int64_t token = warp_token + tile::d_row(lane, e);
      const int mix = c * tile::kCols + tile::d_col(lane, e);
      if (token < args.tokens && mix < kMixes) partial(token)[mix] = acc[c][e];
    }
  }
  // A row's sum of squares: its run lanes' sums, added pairwise (a fixed order); the run-0 lane writes it.
#pragma unroll
  for (int i = 0; i < tile::kRowsPerLane; ++i) {
    float sum = squares[i];
#pragma unroll
    for (int r = 1; r < tile::kRuns; r *= 2) sum += shuffle_xor(sum, r * tile::kRunLaneStride, kWarpSize);
    const int64_t token = warp_token + tile::a_row(lane, i);
    if (tile::run_of(lane) == 0 && token < args.tokens) partial(token)[kMixes] = sum;
  }
}

// The 64-wide chunks [first, end) of slice blockIdx.y out of `chunks`.
struct ChunkSlice {
  int64_t first;
  int64_t end;
};
DSV4_DEVICE ChunkSlice chunk_slice(int64_t chunks, int k_splits) {
  return {chunks * blockIdx.y / k_splits, chunks * (blockIdx.y + 1) / k_splits};
}

// fn split once for every block: the chunks' FnChunk images in chunk order (kByStream: the fused dots'
// stream-interleaved chunks).
template <int kMixes, bool kByStream = false>
__global__ void __launch_bounds__(kThreads) mhc_split_fn_kernel(const float* fn, int64_t count, FnChunk<kMixes>* chunks) {
  using Chunk = FnChunk<kMixes>;
  static_assert(sizeof(Chunk) <= split_chunk_bytes_bound(kMixes), "the host sizes the workspace by this bound");
  release_dependents();  // launched plainly: what the dots kernel reads before its wait is complete
  const int64_t vectors = count / tile::kChunk * Chunk::kVectors;
  for (int64_t index = global_thread_index(); index < vectors; index += global_thread_count()) {
    const IndexSplit split = divide_index(index, Chunk::kVectors);
    const int f = static_cast<int>(split.remainder);
    if constexpr (kByStream) {
      chunks[split.quotient].store(f, Chunk::load_by_stream(fn, count, split.quotient, f));
    } else {
      chunks[split.quotient].store(f, Chunk::load(fn, count, split.quotient * tile::kChunk, f));
    }
  }
}

DSV4_DEVICE uint4 float4_bits(const float4& v) {
  return make_uint4(float_bits(v.x), float_bits(v.y), float_bits(v.z), float_bits(v.w));
}
DSV4_DEVICE float4 bits_float4(const uint4& v) {
  return make_float4(bits_float(v.x), bits_float(v.y), bits_float(v.z), bits_float(v.w));
}

// Post's values of destination stream j at 8 dims (mhc::post_value per dim): post_j and comb column j, x and
// the 4 source streams there.
DSV4_DEVICE void post_values8(float post_j, const float (&x)[8], const float (&comb_column)[mhc::kHcMult],
                              const float (&streams)[mhc::kHcMult][8], float (&values)[8]) {
#pragma unroll
  for (int d = 0; d < 8; ++d) {
    float sources[mhc::kHcMult];
#pragma unroll
    for (int i = 0; i < mhc::kHcMult; ++i) sources[i] = streams[i][d];
    values[d] = mhc::post_value(post_j, x[d], comb_column, sources);
  }
}

// x and the old residual at one row's dims of a chunk, for the fused post: x's 16 values, then the 4
// streams' (two 16-byte halves each).
struct PostInputs {
  uint4 x[2];
  uint4 streams[mhc::kHcMult][2];
};

// The dots kernels' block. kPresplit: the chunks come split from mhc_split_fn_kernel (split_fn); otherwise
// the block splits them. kFusePost (mhc_fused_post_pre): the A values are post's output, made here from x
// and the old residual with mhc_post's arithmetic (rounded to bf16 the same way) and stored to post.out
// (= args.residual) on the way; chunk c then holds dims [16 c, + 16) of every stream, run r stream r
// (FnChunk::load_by_stream), so that a lane makes its run from x and the four old streams at those dims.
// The op then reads x and the old residual once, where post followed by pre also reads post's output back.
template <int kMixes, bool kPresplit, int kDotsTilesPerWarp, bool kFusePost>
DSV4_DEVICE void dots_block(const MhcPreArgs& args, const FnChunk<kMixes>* split_fn, const MhcPostArgs& post) {
  static_assert(dots_block_tokens(kDotsTilesPerWarp) == kDotsWarps * kDotsTilesPerWarp * tile::kRows, "16-row tiles");
  static_assert(!kFusePost || kMixes == mhc::kPreMixes, "post fuses with pre only");
  using Chunk = FnChunk<kMixes>;
  constexpr int kBlockThreads = kDotsWarps * kWarpSize;
  __shared__ Chunk fn_chunks[2];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int run = tile::run_of(lane);
  const int64_t count = mhc::kHcMult * args.hidden;
  // The slice: chunks of the flattened row [4 * hidden].
  const ChunkSlice slice = chunk_slice(count / tile::kChunk, args.k_splits);
  const int64_t steps = slice.end - slice.first;
  const auto k_of = [&](int64_t step) { return (slice.first + step) * tile::kChunk; };
  const int64_t warp_token =
      static_cast<int64_t>(blockIdx.x) * dots_block_tokens(kDotsTilesPerWarp) + warp * kDotsTilesPerWarp * tile::kRows;

  const uint16_t* rows[kDotsTilesPerWarp][tile::kRowsPerLane];
  bool valid[kDotsTilesPerWarp][tile::kRowsPerLane];
  float acc[kDotsTilesPerWarp][Chunk::kColTiles][tile::kAccumulators];
  LaneSquares squares[kDotsTilesPerWarp];
#pragma unroll
  for (int m = 0; m < kDotsTilesPerWarp; ++m) {
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) {
      const int64_t token = warp_token + m * tile::kRows + tile::a_row(lane, i);
      valid[m][i] = token < args.tokens;
      rows[m][i] = args.residual + (valid[m][i] ? token : 0) * count + run * tile::kRunLength;
    }
#pragma unroll
    for (int c = 0; c < Chunk::kColTiles; ++c) {
#pragma unroll
      for (int e = 0; e < tile::kAccumulators; ++e) acc[m][c][e] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < tile::kRowsPerLane; ++i) squares[m][i] = 0.0f;
  }
  // kFusePost: each row's post weight and comb column for the lane's stream (run r makes stream r).
  float post_weight[kDotsTilesPerWarp][tile::kRowsPerLane];
  float comb_column[kDotsTilesPerWarp][tile::kRowsPerLane][mhc::kHcMult];
  if constexpr (kFusePost) {
#pragma unroll
    for (int m = 0; m < kDotsTilesPerWarp; ++m) {
#pragma unroll
      for (int i = 0; i < tile::kRowsPerLane; ++i) {
        const int64_t token = valid[m][i] ? warp_token + m * tile::kRows + tile::a_row(lane, i) : 0;
        post_weight[m][i] = post.post_mix[token * mhc::kHcMult + run];
#pragma unroll
        for (int s = 0; s < mhc::kHcMult; ++s) {
          comb_column[m][i][s] = post.comb_mix[(token * mhc::kHcMult + s) * mhc::kHcMult + run];
        }
      }
    }
  }

  // A thread's share of one chunk: 16-byte pieces of its split image, or float4s of fn to split.
  constexpr int kPieces = kPresplit ? Chunk::kUint4s : Chunk::kVectors;
  constexpr int kStaged = (kPieces + kBlockThreads - 1) / kBlockThreads;
  uint4 staged[kStaged];
  const auto stage = [&](int64_t step) {
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int f = threadIdx.x + s * kBlockThreads;
      if (f < kPieces) {
        if constexpr (kPresplit) {
          staged[s] = reinterpret_cast<const uint4*>(split_fn + slice.first + step)[f];
        } else if constexpr (kFusePost) {
          staged[s] = float4_bits(Chunk::load_by_stream(args.fn, count, slice.first + step, f));
        } else {
          staged[s] = float4_bits(Chunk::load(args.fn, count, k_of(step), f));
        }
      }
    }
  };
  using Runs = uint4[kDotsTilesPerWarp][tile::kRowsPerLane][2];
  const auto load_a = [&](int64_t k0, Runs& a_runs) {
#pragma unroll
    for (int m = 0; m < kDotsTilesPerWarp; ++m) {
#pragma unroll
      for (int i = 0; i < tile::kRowsPerLane; ++i) {
        if (valid[m][i]) {
          const uint4* src = reinterpret_cast<const uint4*>(rows[m][i] + k0);
          a_runs[m][i][0] = src[0];
          a_runs[m][i][1] = src[1];
        } else {
          a_runs[m][i][0] = a_runs[m][i][1] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  };
  // What a step's A values come from, loaded a step ahead: the runs themselves, or (kFusePost) post's inputs.
  using Pending = std::conditional_t<kFusePost, PostInputs[kDotsTilesPerWarp][tile::kRowsPerLane], Runs>;
  const auto load_pending = [&](int64_t step, Pending& pending) {
    if constexpr (kFusePost) {
      const int64_t d0 = (slice.first + step) * tile::kRunLength;
#pragma unroll
      for (int m = 0; m < kDotsTilesPerWarp; ++m) {
#pragma unroll
        for (int i = 0; i < tile::kRowsPerLane; ++i) {
          PostInputs& in = pending[m][i];
          if (valid[m][i]) {
            const int64_t token = warp_token + m * tile::kRows + tile::a_row(lane, i);
            const uint4* x = reinterpret_cast<const uint4*>(post.x + token * args.hidden + d0);
            in.x[0] = x[0];
            in.x[1] = x[1];
#pragma unroll
            for (int s = 0; s < mhc::kHcMult; ++s) {
              const uint4* stream =
                  reinterpret_cast<const uint4*>(post.residual + (token * mhc::kHcMult + s) * args.hidden + d0);
              in.streams[s][0] = stream[0];
              in.streams[s][1] = stream[1];
            }
          } else {
            in = PostInputs{};
          }
        }
      }
    } else {
      load_a(k_of(step), pending);
    }
  };
  // A step's runs from what was loaded for it; kFusePost: post's values, also stored to post.out.
  const auto take_runs = [&](int64_t step, const Pending& pending, Runs& a_runs) {
#pragma unroll
    for (int m = 0; m < kDotsTilesPerWarp; ++m) {
#pragma unroll
      for (int i = 0; i < tile::kRowsPerLane; ++i) {
        if constexpr (kFusePost) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float x[8];
            float streams[mhc::kHcMult][8];
            unpack_bf16x8(pending[m][i].x[h], x);
#pragma unroll
            for (int s = 0; s < mhc::kHcMult; ++s) unpack_bf16x8(pending[m][i].streams[s][h], streams[s]);
            float values[8];
            post_values8(post_weight[m][i], x, comb_column[m][i], streams, values);
            a_runs[m][i][h] = pack_bf16x8(values);
          }
          if (valid[m][i]) {
            const int64_t token = warp_token + m * tile::kRows + tile::a_row(lane, i);
            uint4* out = reinterpret_cast<uint4*>(post.out + (token * mhc::kHcMult + run) * args.hidden +
                                                  (slice.first + step) * tile::kRunLength);
            out[0] = a_runs[m][i][0];
            out[1] = a_runs[m][i][1];
          }
        } else {
          a_runs[m][i][0] = pending[m][i][0];
          a_runs[m][i][1] = pending[m][i][1];
        }
      }
    }
  };
  const auto store_staged = [&](Chunk& chunk) {
#pragma unroll
    for (int s = 0; s < kStaged; ++s) {
      const int f = threadIdx.x + s * kBlockThreads;
      if (f < kPieces) {
        if constexpr (kPresplit) {
          reinterpret_cast<uint4*>(&chunk)[f] = staged[s];
        } else {
          chunk.store(f, bits_float4(staged[s]));
        }
      }
    }
  };
  // Pipeline: while a chunk is multiplied (fn from one shared buffer), the next chunk's stream values and
  // fn values load into registers, and the fn values then go to the other buffer: one barrier per chunk.
  // Stream values two chunks ahead through a cp.async ring in shared memory instead (NVIDIA; three stages,
  // each lane copying its own 16-byte halves of its runs) were slower on the H200 at every size, same run:
  // hidden 4096, 1024 tokens 36.6 -> 46.5 us, 8192 tokens 172.6 -> 245.8; hidden 7168, 8192 tokens 285.3 ->
  // 411.1; 1-64 tokens 0-8% slower (mHC GPU tests passed on it). The same with each copy instruction covering
  // 64 contiguous bytes of a row (a row's lanes copying for each other, then __syncwarp): no better (46.7,
  // 247.2, 413.1 against 36.7, 171.6, 286.0). The L1 that the ring's shared memory (42 / 66 KB a block) takes
  // away explains only part of that: this path with the L1 at its smallest (carve-out preference 100% shared)
  // was 7-10% slower (36.0 -> 38.4, 170.2 -> 184.7, 279.9 -> 307.0 us).
  Pending next_runs;
  // Launched to overlap the kernel before it. With kPresplit that is the fn split, which released this
  // kernel at its start: the residual, complete before the split began, loads before the wait for the split
  // chunks. Otherwise it may be the residual's writer (chained decode): nothing is read before its end.
  if (kPresplit && steps > 0) load_pending(0, next_runs);
  wait_for_previous_kernel();
  release_dependents();
  if (steps > 0) {
    stage(0);
    if (!kPresplit) load_pending(0, next_runs);
    store_staged(fn_chunks[0]);
    __syncthreads();
  }
  for (int64_t step = 0; step < steps; ++step) {
    Runs a_runs;
    take_runs(step, next_runs, a_runs);
    const bool more = step + 1 < steps;
    if (more) {
      stage(step + 1);
      load_pending(step + 1, next_runs);
    }
#pragma unroll
    for (int m = 0; m < kDotsTilesPerWarp; ++m) {
      accumulate_chunk<kMixes>(acc[m], squares[m], a_runs[m], fn_chunks[step % 2], lane);
    }
    // The other buffer was last read in the previous step, before the barrier that ended it.
    if (more) store_staged(fn_chunks[(step + 1) % 2]);
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < kDotsTilesPerWarp; ++m) {
    write_partials<kMixes>(args, blockIdx.y, warp_token + m * tile::kRows, lane, acc[m], squares[m]);
  }
}

template <int kMixes, bool kPresplit, int kDotsTilesPerWarp>
__global__ void __launch_bounds__(kDotsWarps * kWarpSize)
    mhc_dots_kernel(MhcPreArgs args, const FnChunk<kMixes>* split_fn) {
  dots_block<kMixes, kPresplit, kDotsTilesPerWarp, false>(args, split_fn, MhcPostArgs{});
}

// The dots of mhc_fused_post_pre, post's output made and stored on the way (dots_block's kFusePost).
template <bool kPresplit, int kDotsTilesPerWarp>
__global__ void __launch_bounds__(kDotsWarps * kWarpSize)
    mhc_fused_dots_kernel(MhcPreArgs args, const FnChunk<mhc::kPreMixes>* split_fn, MhcPostArgs post) {
  dots_block<mhc::kPreMixes, kPresplit, kDotsTilesPerWarp, true>(args, split_fn, post);
}

// sums[index] for a runtime index, without dynamic indexing (which would move sums to local memory).
template <int kCount>
DSV4_DEVICE float select(const float (&values)[kCount], int index) {
  float chosen = 0.0f;
#pragma unroll
  for (int i = 0; i < kCount; ++i) chosen = i == index ? values[i] : chosen;
  return chosen;
}

// The epilogue of one token by a group of kLanes lanes: the partial sums of the k slices (lane l adds
// slices l, l + kLanes, ..., then a butterfly: a fixed order), then the epilogue of dsv4/mhc.h spread over
// lanes: lane e < 16 holds comb value e (row e / 4, column e % 4) through the Sinkhorn steps (lanes 16-31
// of a 32-lane group repeat them), whose row and column sums are butterflies in the pairwise order of
// mhc::sum4, so the result equals the one-thread form; lanes 0-3 write the pre weights (to pre_out[0..3],
// for the collapse) and lanes 4-7 the post weights. Only where `writes` does a lane store, so that other
// groups of a warp may run it for the same token and keep every shuffle full-width.
template <int kMixes, int kLanes>
DSV4_DEVICE void epilogue_token(const MhcPreArgs& args, int64_t token, int group_lane, bool writes, float* pre_out) {
  static_assert(kLanes == kCombLanes || kLanes == 2 * kCombLanes, "16 or 32 lanes per token");
  constexpr int kStreams = mhc::kHcMult;
  constexpr int kStride = partial_stride(kMixes);
  float sums[kStride];  // the mixes, the sum of squares, then padding (never written, never used)
#pragma unroll
  for (int m = 0; m < kStride; ++m) sums[m] = 0.0f;
#pragma unroll 4
  for (int s = group_lane; s < args.k_splits; s += kLanes) {
    const float4* partial = reinterpret_cast<const float4*>(args.partials + (token * args.k_splits + s) * kStride);
#pragma unroll
    for (int v = 0; v < kStride / 4; ++v) {
      const float4 value = partial[v];
      sums[4 * v] += value.x;
      sums[4 * v + 1] += value.y;
      sums[4 * v + 2] += value.z;
      sums[4 * v + 3] += value.w;
    }
  }
#pragma unroll
  for (int m = 0; m <= kMixes; ++m) sums[m] = group_sum<kLanes>(sums[m]);
  const float r = mhc::rms_factor(sums[kMixes], kStreams * args.hidden, args.config.rms_eps);
  if (writes && group_lane < kStreams) {
    pre_out[group_lane] = mhc::pre_weight(select(sums, group_lane), r, args.scale, args.base[group_lane], args.config);
  }
  if constexpr (kMixes == mhc::kPreMixes) {
    if (writes && group_lane >= kStreams && group_lane < 2 * kStreams) {
      args.post_mix[token * kStreams + group_lane - kStreams] =
          mhc::post_weight(select(sums, group_lane), r, args.scale, args.base[group_lane], args.config);
    }
    constexpr int kComb = kStreams * kStreams;
    static_assert(kComb == kCombLanes, "one lane per comb value");
    const int e = group_lane % kComb;
    const float eps = args.config.sinkhorn_eps;
    const float logit = mhc::comb_logit(select(sums, 2 * kStreams + e), r, args.scale, args.base[2 * kStreams + e]);
    float row_max = fmaxf(logit, shuffle_xor(logit, 1, kComb));
    row_max = fmaxf(row_max, shuffle_xor(row_max, 2, kComb));
    const float exponential = expf(logit - row_max);
    float row_sum = exponential + shuffle_xor(exponential, 1, kComb);
    row_sum = row_sum + shuffle_xor(row_sum, 2, kComb);
    float c = exponential * mhc::reciprocal(row_sum) + eps;
    const auto normalize = [&](int first_mask) {  // 1: rows, 4: columns
      float sum = c + shuffle_xor(c, first_mask, kComb);
      sum = sum + shuffle_xor(sum, 2 * first_mask, kComb);
      c = c * mhc::reciprocal(sum + eps);
    };
    normalize(4);
    for (int pair = 1; pair < args.config.sinkhorn_iters; ++pair) {
      normalize(1);
      normalize(4);
    }
    if (writes && group_lane < kComb) args.comb_mix[token * kComb + e] = c;
  }
}

template <int kMixes, int kLanes>
__global__ void __launch_bounds__(kEpilogueThreads) mhc_epilogue_kernel(MhcPreArgs args, float* pre_weights) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * (kEpilogueThreads / kLanes) + threadIdx.x / kLanes;
  if (token >= args.tokens) return;  // the whole group: all its lanes share the token
  epilogue_token<kMixes, kLanes>(args, token, threadIdx.x % kLanes, true, pre_weights + token * mhc::kHcMult);
}

DSV4_DEVICE float block_sum(float value, float* scratch) {
  value = group_sum<kHalfLanes>(value);
  const int half = threadIdx.x / kHalfLanes;
  if (threadIdx.x % kHalfLanes == 0) scratch[half] = value;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / kHalfLanes; ++i) total += scratch[i];
  __syncthreads();
  return total;
}

// The 4 streams' bf16 values at hidden dims [8v, 8v+8) of one token.
using StreamVectors = uint4[mhc::kHcMult];

DSV4_DEVICE void load_stream_vectors(const uint16_t* residual, int64_t hidden, int64_t v, StreamVectors& raw) {
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) raw[i] = *reinterpret_cast<const uint4*>(residual + i * hidden + 8 * v);
}

// 8 collapsed values from the streams' values there: sum_i pre_i * residual_i.
DSV4_DEVICE void collapse8(const StreamVectors& raw, const float* pre, float* out) {
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) {
    const uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[2 * j] += pre[i] * bf16_bits_to_float(static_cast<uint16_t>(words[j] & 0xffffu));
      out[2 * j + 1] += pre[i] * bf16_bits_to_float(static_cast<uint16_t>(words[j] >> 16));
    }
  }
}

// A thread's vectors of its first kRounds rounds (v = threadIdx.x + round * kThreads), loaded ahead.
template <int kRounds>
struct PrefetchedVectors {
  StreamVectors raw[kRounds];
};
template <>
struct PrefetchedVectors<0> {};

// Read before the kernel's wait for the dots kernel (mhc_epilogue_collapse_kernel), so past the
// multiprocessor's cache: the residual's writer finished before the dots kernel released this one.
template <int kRounds>
DSV4_DEVICE void prefetch_vectors(const uint16_t* residual, int64_t hidden, PrefetchedVectors<kRounds>& prefetched) {
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    const int64_t v = threadIdx.x + round * kThreads;
    if (v < hidden / 8) {
#pragma unroll
      for (int i = 0; i < mhc::kHcMult; ++i) {
        prefetched.raw[round][i] = load_past_local_cache(reinterpret_cast<const uint4*>(residual + i * hidden + 8 * v));
      }
    }
  }
}

// layer_input of one token by the whole block, from its pre weights; the thread's first kRounds rounds of
// vectors come in `prefetched`, the others are loaded here.
template <int kRounds>
DSV4_DEVICE void collapse_token(const MhcPreArgs& args, int64_t token, const float (&pre)[mhc::kHcMult],
                                float* scratch, const PrefetchedVectors<kRounds>& prefetched) {
  const uint16_t* residual = args.residual + token * mhc::kHcMult * args.hidden;
  uint16_t* out = args.out + token * args.hidden;
  const int64_t vectors = args.hidden / 8;
  // visit(v, collapsed values) for each of the thread's vectors; the prefetched rounds unrolled, so that
  // their registers stay registers.
  const auto for_each_vector = [&](auto&& visit) {
    float values[8];
    if constexpr (kRounds > 0) {
#pragma unroll
      for (int round = 0; round < kRounds; ++round) {
        const int64_t v = threadIdx.x + round * kThreads;
        if (v < vectors) {
          collapse8(prefetched.raw[round], pre, values);
          visit(v, values);
        }
      }
    }
    for (int64_t v = threadIdx.x + kRounds * kThreads; v < vectors; v += kThreads) {
      StreamVectors raw;
      load_stream_vectors(residual, args.hidden, v, raw);
      collapse8(raw, pre, values);
      visit(v, values);
    }
  };
  float norm = 1.0f;
  if (args.norm_weight != nullptr) {  // a first pass for the RMS of the collapsed row
    float squares = 0.0f;
    for_each_vector([&](int64_t, float(&values)[8]) {
#pragma unroll
      for (int j = 0; j < 8; ++j) squares += values[j] * values[j];
    });
    norm = mhc::rms_factor(block_sum(squares, scratch), args.hidden, args.norm_eps);
  }
  for_each_vector([&](int64_t v, float(&values)[8]) {
    if (args.norm_weight != nullptr) {
      float weight[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(args.norm_weight + 8 * v), weight);
#pragma unroll
      for (int j = 0; j < 8; ++j) values[j] = values[j] * norm * weight[j];
    }
    *reinterpret_cast<uint4*>(out + 8 * v) = pack_bf16x8(values);
  });
}

// One block per token: layer_input from the pre weights of the epilogue kernel.
__global__ void __launch_bounds__(kThreads) mhc_collapse_kernel(MhcPreArgs args, const float* pre_weights) {
  __shared__ float scratch[kThreads / kHalfLanes];
  const int64_t token = blockIdx.x;
  float pre[mhc::kHcMult];
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) pre[i] = pre_weights[token * mhc::kHcMult + i];
  collapse_token(args, token, pre, scratch, PrefetchedVectors<0>{});
}

// One block per token: its epilogue (by the first warp, whose lane groups all run it so that its shuffles
// stay full-width; the first group writes), then its collapse. For a few tokens, where a kernel launch
// costs more than a block's wait for its own epilogue. kResidualFromDots: the dots kernel before it wrote
// the residual (mhc_fused_dots_kernel).
template <int kMixes, int kLanes, bool kResidualFromDots>
__global__ void __launch_bounds__(kThreads) mhc_epilogue_collapse_kernel(MhcPreArgs args) {
  __shared__ float scratch[kThreads / kHalfLanes];
  __shared__ float pre_shared[mhc::kHcMult];
  const int64_t token = blockIdx.x;
  // The collapse's stream values do not depend on the epilogue: loaded first, their latency overlaps the
  // epilogue, and unless the dots kernel before this one wrote them, the dots kernel's end too (it releases
  // this kernel only once the residual's writer has finished).
  PrefetchedVectors<kCollapsePrefetchRounds> prefetched;
  const uint16_t* residual = args.residual + token * mhc::kHcMult * args.hidden;
  if constexpr (!kResidualFromDots) prefetch_vectors(residual, args.hidden, prefetched);
  wait_for_previous_kernel();  // the partial sums (and with kResidualFromDots the residual)
  if constexpr (kResidualFromDots) prefetch_vectors(residual, args.hidden, prefetched);
  if (threadIdx.x < kWarpSize) {
    epilogue_token<kMixes, kLanes>(args, token, threadIdx.x % kLanes, threadIdx.x < kLanes, pre_shared);
  }
  __syncthreads();
  float pre[mhc::kHcMult];
#pragma unroll
  for (int i = 0; i < mhc::kHcMult; ++i) pre[i] = pre_shared[i];
  collapse_token(args, token, pre, scratch, prefetched);
}

__global__ void __launch_bounds__(kThreads) mhc_post_kernel(MhcPostArgs args) {
  constexpr int kStreams = mhc::kHcMult;
  // Launched to overlap the kernel before (decode sizes): nothing is read before its end. It releases the
  // kernel after it as its blocks exit, not at their start: releasing early made mhc_fused_post_pre at
  // T = 64 slower on the H200 (Flash 15.3 -> 18.8 us, Pro 18.5 -> 24.9), probably because the dots blocks,
  // launched early, crowd onto the few multiprocessors the post leaves free.
  wait_for_previous_kernel();
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
    unpack_bf16x8(*reinterpret_cast<const uint4*>(args.x + token * args.hidden + 8 * v), x);
#pragma unroll
    for (int i = 0; i < kStreams; ++i) {
      unpack_bf16x8(*reinterpret_cast<const uint4*>(residual + i * args.hidden), streams[i]);
    }
    uint16_t* out = args.out + token * kStreams * args.hidden + 8 * v;
#pragma unroll
    for (int j_stream = 0; j_stream < kStreams; ++j_stream) {
      float comb_column[kStreams];
#pragma unroll
      for (int i = 0; i < kStreams; ++i) comb_column[i] = comb[i * kStreams + j_stream];
      float values[8];
      post_values8(post[j_stream], x, comb_column, streams, values);
      *reinterpret_cast<uint4*>(out + j_stream * args.hidden) = pack_bf16x8(values);
    }
  }
}

// kWarpSize is a device-pass constant; the host sizes blocks from the vendor it compiles for.
#if defined(__HIPCC__)
constexpr int kHostWarpSize = 64;
#else
constexpr int kHostWarpSize = 32;
#endif

int64_t token_blocks(int64_t tokens) {
  const int64_t block_tokens = dots_block_tokens(dots_tiles_per_warp(tokens));
  return (tokens + block_tokens - 1) / block_tokens;
}
bool presplit_fn(int64_t tokens) { return token_blocks(tokens) >= kPresplitMinTokenBlocks; }

// The workspace, in floats: the partial sums [tokens][k_splits][partial_stride], the pre weights [tokens][4],
// then, where fn is split once, its split chunks from a 256-byte boundary.
struct PreWorkspaceLayout {
  int64_t pre_weights;
  int64_t split_fn;
  int64_t floats;
};
PreWorkspaceLayout pre_workspace_layout(int64_t tokens, int64_t hidden, int mixes) {
  constexpr int64_t kAlignFloats = 64;
  PreWorkspaceLayout layout{};
  layout.pre_weights = static_cast<int64_t>(mhc_pre_k_splits(tokens, hidden, mixes)) * tokens * partial_stride(mixes);
  layout.split_fn = (layout.pre_weights + tokens * mhc::kHcMult + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  const int64_t chunks = mhc::kHcMult * hidden / tile::kChunk;
  layout.floats = presplit_fn(tokens) ? layout.split_fn + chunks * split_chunk_bytes_bound(mixes) / 4
                                      : layout.pre_weights + tokens * mhc::kHcMult;
  return layout;
}

// mhc_fused_post_pre runs post inside the dots kernel (mhc_fused_dots_kernel) on AMD; on NVIDIA post, then pre.
// H200 (graph replay, inputs past the L2), the fused one-tile form against post then pre in the same run: hidden
// 4096, 1 / 64 / 1024 tokens 11.7 / 15.9 / 80.7 us against 11.8 / 15.2 / 55.6; hidden 7168 15.5 / 21.4 / 130.9 against
// 13.9 / 18.3 / 86.8 (its 230-240 registers a thread leave one or two blocks an SM, where the plain dots kernel runs
// more). The fused two-tile form (from kTwoTileMinTokens tokens) needs more registers than a thread has there (255
// and 544 bytes of stack with CUDA 13.0: two rows of A a lane, each with x and four streams' 32 bytes in flight).
#if defined(__HIPCC__)
constexpr bool kFusedDots = true;
#else
constexpr bool kFusedDots = false;
#endif

// The dot products (after splitting fn, where that pays), the epilogue, then the collapse. With `post`
// (mhc_fused_post_pre, where kFusedDots), the dots kernel makes post's output (args.residual) from
// post's inputs.
template <int kMixes>
void launch_pre_kernels(const MhcPreArgs& args, hipStream_t stream, const MhcPostArgs* post = nullptr) {
  const PreWorkspaceLayout layout = pre_workspace_layout(args.tokens, args.hidden, kMixes);
  const int64_t count = mhc::kHcMult * args.hidden;
  const dim3 dots_grid(static_cast<unsigned>(token_blocks(args.tokens)), static_cast<unsigned>(args.k_splits));
  const dim3 dots_block(kDotsWarps * kHostWarpSize);
  // The dots kernel: the plain one, or with `post` the fused one (pre's 24 mixes only).
  const auto launch_dots = [&](auto presplit, auto tiles, const FnChunk<kMixes>* chunks, bool overlapping) {
    constexpr bool kPresplit = decltype(presplit)::value;
    constexpr int kTiles = decltype(tiles)::value;
    if constexpr (kMixes == mhc::kPreMixes && kFusedDots) {
      if (post != nullptr) {
        launch_overlapping(mhc_fused_dots_kernel<kPresplit, kTiles>, dots_grid, dots_block, 0, stream, args, chunks,
                           *post);
        return;
      }
    }
    if (overlapping) {
      launch_overlapping(mhc_dots_kernel<kMixes, kPresplit, kTiles>, dots_grid, dots_block, 0, stream, args, chunks);
    } else {
      hipLaunchKernelGGL((mhc_dots_kernel<kMixes, kPresplit, kTiles>), dots_grid, dots_block, 0, stream, args, chunks);
    }
  };
  using Presplit = std::true_type;
  using Unsplit = std::false_type;
  using OneTile = std::integral_constant<int, 1>;
  using TwoTiles = std::integral_constant<int, 2>;
  if (presplit_fn(args.tokens)) {
    auto* split_fn = reinterpret_cast<FnChunk<kMixes>*>(args.partials + layout.split_fn);
    // A grid-stride loop: the vector count here need only be about right (FnChunk's tile width is a
    // device-pass constant).
    const int64_t vectors = count / tile::kChunk * split_chunk_bytes_bound(kMixes) / (kSplitPlanes * 2 * 4);
    bool by_stream = false;  // the fused dots' stream-interleaved chunks
    if constexpr (kMixes == mhc::kPreMixes && kFusedDots) {
      if (post != nullptr) {
        hipLaunchKernelGGL((mhc_split_fn_kernel<kMixes, true>), dim3(elementwise_blocks(vectors)), dim3(kThreads), 0,
                           stream, args.fn, count, split_fn);
        by_stream = true;
      }
    }
    if (!by_stream) {
      hipLaunchKernelGGL((mhc_split_fn_kernel<kMixes>), dim3(elementwise_blocks(vectors)), dim3(kThreads), 0, stream,
                         args.fn, count, split_fn);
    }
    // Overlapping the split, whose run the dots blocks' first residual loads then overlap.
    const auto* chunks = static_cast<const FnChunk<kMixes>*>(split_fn);
    if (dots_tiles_per_warp(args.tokens) == 2) {
      launch_dots(Presplit{}, TwoTiles{}, chunks, true);
    } else {
      launch_dots(Presplit{}, OneTile{}, chunks, true);
    }
  } else {
    // One tile per warp: two start past the presplit threshold, so token_blocks() counted one-tile blocks.
    static_assert(kTwoTileMinTokens / dots_block_tokens(2) >= kPresplitMinTokenBlocks, "two tiles only presplit");
    launch_dots(Unsplit{}, OneTile{}, nullptr, args.tokens <= kChainedMaxTokens);
  }
  if (args.tokens <= merged_epilogue_max_tokens(kMixes)) {
    const dim3 grid(static_cast<unsigned>(args.tokens));
    const auto launch_merged = [&](auto residual_from_dots) {
      constexpr bool kResidualFromDots = decltype(residual_from_dots)::value;
      if (args.k_splits >= kWideEpilogueMinSplits) {
        launch_overlapping(mhc_epilogue_collapse_kernel<kMixes, 2 * kCombLanes, kResidualFromDots>, grid,
                           dim3(kThreads), 0, stream, args);
      } else {
        launch_overlapping(mhc_epilogue_collapse_kernel<kMixes, kCombLanes, kResidualFromDots>, grid, dim3(kThreads),
                           0, stream, args);
      }
    };
    if constexpr (kMixes == mhc::kPreMixes && kFusedDots) {
      if (post != nullptr) {
        launch_merged(std::true_type{});
        return;
      }
    }
    launch_merged(std::false_type{});
    return;
  }
  float* pre_weights = args.partials + layout.pre_weights;
  const auto epilogue = [&](auto kernel, int lanes) {
    const int64_t tokens_per_block = kEpilogueThreads / lanes;
    hipLaunchKernelGGL(kernel, dim3(static_cast<unsigned>((args.tokens + tokens_per_block - 1) / tokens_per_block)),
                       dim3(kEpilogueThreads), 0, stream, args, pre_weights);
  };
  if (args.k_splits >= kWideEpilogueMinSplits) {
    epilogue(mhc_epilogue_kernel<kMixes, 2 * kCombLanes>, 2 * kCombLanes);
  } else {
    epilogue(mhc_epilogue_kernel<kMixes, kCombLanes>, kCombLanes);
  }
  hipLaunchKernelGGL(mhc_collapse_kernel, dim3(static_cast<unsigned>(args.tokens)), dim3(kThreads), 0, stream, args,
                     static_cast<const float*>(pre_weights));
}

bool valid_pre(const MhcPreArgs& args) {
  return args.tokens >= 0 && args.hidden > 0 && args.hidden % tile::kChunk == 0 &&
         reinterpret_cast<uintptr_t>(args.partials) % 16 == 0 &&
         args.k_splits == mhc_pre_k_splits(args.tokens, args.hidden, args.mixes) &&
         (args.mixes == mhc::kPreMixes || args.mixes == mhc::kHeadMixes);
}

bool valid_post(const MhcPostArgs& args) { return args.tokens >= 0 && args.hidden > 0 && args.hidden % 8 == 0; }

void launch_post_kernel(const MhcPostArgs& args, hipStream_t stream) {
  const dim3 grid(elementwise_blocks(args.tokens * (args.hidden / 8)));
  if (args.tokens <= kChainedMaxTokens) {
    launch_overlapping(mhc_post_kernel, grid, dim3(kThreads), 0, stream, args);
  } else {
    hipLaunchKernelGGL(mhc_post_kernel, grid, dim3(kThreads), 0, stream, args);
  }
}

// Dots blocks resident at once on the device (one wave) for the kernel that serves `tokens` and `mixes`.
template <int kMixes>
int64_t dots_wave_blocks(int64_t tokens) {
  const int threads = kDotsWarps * kHostWarpSize;
  if (!presplit_fn(tokens)) return one_wave_blocks<mhc_dots_kernel<kMixes, false, 1>>(threads);
  if (dots_tiles_per_warp(tokens) == 2) return one_wave_blocks<mhc_dots_kernel<kMixes, true, 2>>(threads);
  return one_wave_blocks<mhc_dots_kernel<kMixes, true, 1>>(threads);
}

}  // namespace

int mhc_pre_k_splits(int64_t tokens, int64_t hidden, int mixes) {
  // Slices are ranges of 64-wide chunks of the flattened row.
  const int64_t blocks = token_blocks(tokens);
  const int64_t chunks = mhc::kHcMult * hidden / tile::kChunk;
  int64_t splits = blocks >= kTargetBlocks ? 1 : (kTargetBlocks + blocks - 1) / blocks;
  // Never more blocks than one wave where the token blocks leave room: a second, partial wave would leave
  // most multiprocessors idle while it runs (H200, 24 mixes from 2048 tokens: 164 registers a thread, three
  // blocks a multiprocessor, 396 resident against the 528 aimed at).
  const int64_t wave = mixes == mhc::kPreMixes ? dots_wave_blocks<mhc::kPreMixes>(tokens)
                                               : dots_wave_blocks<mhc::kHeadMixes>(tokens);
  if (blocks * splits > wave && blocks <= wave) splits = wave / blocks;
  splits = splits < chunks ? splits : chunks;
  // At most four slices per epilogue lane (loaded together): more serial loads there would cost a decode
  // step more than the extra dots blocks save.
  splits = splits < kMaxSplits ? splits : kMaxSplits;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

int64_t mhc_pre_workspace_floats(int64_t tokens, int64_t hidden, int mixes) {
  return pre_workspace_layout(tokens, hidden, mixes).floats;
}

LaunchStatus launch_mhc_pre(const MhcPreArgs& args, void* stream) {
  if (!valid_pre(args)) return LaunchStatus::kInvalidArgument;
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
  if (!valid_post(args)) return LaunchStatus::kInvalidArgument;
  if (args.tokens == 0) return LaunchStatus::kOk;
  launch_post_kernel(args, static_cast<hipStream_t>(stream));
  return last_launch_status();
}

LaunchStatus launch_mhc_fused_post_pre(const MhcPostArgs& post, const MhcPreArgs& pre, void* stream) {
  const bool chained = pre.mixes == mhc::kPreMixes && post.tokens == pre.tokens && post.hidden == pre.hidden &&
                       post.out == pre.residual;
  if (!chained || !valid_post(post) || !valid_pre(pre)) return LaunchStatus::kInvalidArgument;
  if (pre.tokens == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
  if (kFusedDots) {  // post made inside the dots kernel: x and the old residual read once
    launch_pre_kernels<mhc::kPreMixes>(pre, hip_stream, &post);
    return last_launch_status();
  }
  launch_post_kernel(post, hip_stream);
  const LaunchStatus status = last_launch_status();
  if (status != LaunchStatus::kOk) return status;
  launch_pre_kernels<mhc::kPreMixes>(pre, hip_stream);
  return last_launch_status();
}

}  // namespace dsv4::gpu
