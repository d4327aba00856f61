// dsv4::sparse_mla_decode on the GPU (spec/sparse_mla_decode.md §3-§4): split-K flash decoding over the
// fp8_ds_mla SWA ("main") and compressed ("extra") caches.
//
// Partial kernel: one block of 256 threads per (query row t, block of 16 heads, or 32 on NVIDIA when
// H > 16 in batches of more than 16 (row, 16-head) pairs, split s). Heads are the MMA M dimension (rows of
// heads >= H are zero and never written). Split s walks positions [n*s/S, n*(s+1)/S) of the row's key
// list (its main indices, then its extra indices; n = both counts), 32 positions a tile:
//   1. Slot lookup: negative or out-of-cache slots are marked invalid and never read; record addresses
//      in int64 (key_record_address). NVIDIA copies the next tile's raw records into a shared stage
//      with cp.async while the current tile is computed; AMD loads each tile's records into registers.
//   2. The records are decoded into a bf16 [32, 512] shared tile (NVIDIA: from the stage, each thread a
//      16-value NoPE piece within one scale block per pass and one RoPE piece; AMD: 32 threads per key,
//      from registers): NoPE bytes through a 256-entry table of the cache's own encoding (NVIDIA: pieces
//      of normal codes by integer operations, other OCP pieces by the FP8 conversion instruction) times
//      the block's UE8M0 scale, the RoPE tail copied, every non-finite value replaced by 0 (the CPU
//      kernel's values exactly).
//   3. S = Q K^T on the matrix units (Q in shared memory): warp w computes the 16x16 S tiles of keys
//      [16 (w % 2), +16) over a slice of the 512 dims for every head group; the slices are summed in
//      shared memory.
//   4. Online softmax per head row in fp32 (m, l); P rounded once to bf16 (l sums the rounded values).
//   5. acc = acc * alpha + P V with V = K (all 512 dims), each warp owning 512 / warps output dims.
// One split: the reduce is fused at the end (sink, normalization, inverse RoPE, bf16 out). Several: the
// split's (m, l, acc[512]) go to the fp32 workspace (an empty split: m = -FLT_MAX, l = 0), and the
// reduce kernel (one block per (t, head)) folds the splits in index order, adds the sink to the
// denominator only, optionally rotates dims 448..511 back (inverse GPT-J RoPE) and writes bf16.
//
// Matrix instructions: NVIDIA mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (two per 16x16x16
// step; fragments through ldmatrix.x4, .trans for V); gfx942 (and gfx90a)
// __builtin_amdgcn_mfma_f32_16x16x16bf16_1k (v_mfma_f32_16x16x16_bf16); gfx950 the double-rate
// v_mfma_f32_16x16x32_bf16, two of those steps per instruction (mma_pair).
#include <cfloat>

#include "dsv4/async_copy.h"
#include "dsv4/bf16.h"
#include "dsv4/ds_mla.h"
#include "dsv4/fp8x2.h"
#include "dsv4/launch.h"
#include "dsv4/mfma.h"
#include "dsv4/rope.h"
#include "dsv4/ue8m0.h"
#include "dsv4/wgmma.h"
#include "sparse_mla/sparse_mla_launchers.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(__AMDGCN__)
#define DSV4_SPARSE_MLA_MFMA_LAYOUT 1  // wave64, 16x16x16 MFMA fragments
#else
#define DSV4_SPARSE_MLA_MFMA_LAYOUT 0  // warp32, m16n8k16 mma.sync fragments
#endif

namespace dsv4::gpu {
namespace {

constexpr int kDim = ds_mla::kHeadDim;  // 512
constexpr int kThreads = 256;
constexpr int kHeadsPerBlock = 16;  // the MMA M dimension
constexpr int kTileKeys = 32;
constexpr int kKeyStride = kDim + 8;      // bf16 per shared key row: 1040 bytes, rows 4 banks apart
constexpr int kProbStride = kTileKeys + 8;  // bf16 per shared P row
constexpr int kThreadsPerKey = 32;
constexpr int kKeysPerPass = kThreads / kThreadsPerKey;  // 8
constexpr int kPasses = kTileKeys / kKeysPerPass;        // 4
constexpr int kPieceDims = 8;
constexpr int kReduceThreads = kDim / 4;                                  // 128, 4 dims each
constexpr int kMaxSplits = 64;      // the launcher's limit (explicit or automatic)
constexpr int kMaxAutoSplits = 64;  // NVIDIA (1152 keys a row: 36 one-tile splits); AMD: max_auto_splits()
constexpr int kKeysPerSplitMin = kTileKeys;  // automatic splits: at least one tile each

static_assert(kTileKeys == 32 && kKeysPerPass * kPasses == kTileKeys, "tile shape");
static_assert(kMaxSplits <= kReduceThreads, "the reduce reads one split's (m, l) per thread");

#if DSV4_GPU_COMPILER

// ---- 16x16x16 bf16 MMA step on one warp: C[16x16] += A[16x16] B[16x16] -------------------------------
// A is row-major (rows = heads, k contiguous). B element (k, n) comes from shared memory either
// "n-major" (base[n * ld + k], the key tile read as K^T) or "k-major" (base[k * ld + n], the key tile
// read as V).
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
// gfx9 MFMA 16x16x16 bf16, wave64: lane l holds A[l % 16][4 (l / 16) + j] and B[4 (l / 16) + j][l % 16]
// (j = 0..3, element j in bits 16j..16j+15 of the 64-bit operand), and D[4 (l / 16) + r][l % 16] in
// accumulator r (0..3).
constexpr int kAccPerTile = 4;
typedef short Bf16x4 __attribute__((ext_vector_type(4)));
typedef float Floatx4 __attribute__((ext_vector_type(4)));
struct FragA { uint32_t r[2]; };
struct FragB { uint32_t r[2]; };
struct Acc { float v[4]; };

DSV4_DEVICE int acc_row(int lane, int r) { return 4 * (lane / 16) + r; }
DSV4_DEVICE int acc_col(int lane, int r) { return lane % 16; }

DSV4_DEVICE FragA load_a(const uint16_t* base, int ld, int lane) {
  const uint2 v = *reinterpret_cast<const uint2*>(base + (lane % 16) * ld + 4 * (lane / 16));
  return FragA{{v.x, v.y}};
}
DSV4_DEVICE FragB load_b_nmajor(const uint16_t* base, int ld, int lane) {
  const uint2 v = *reinterpret_cast<const uint2*>(base + (lane % 16) * ld + 4 * (lane / 16));
  return FragB{{v.x, v.y}};
}
DSV4_DEVICE FragB load_b_kmajor(const uint16_t* base, int ld, int lane) {
  const uint16_t* p = base + 4 * (lane / 16) * ld + lane % 16;
  return FragB{{static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[ld]) << 16),
                static_cast<uint32_t>(p[2 * ld]) | (static_cast<uint32_t>(p[3 * ld]) << 16)}};
}
DSV4_DEVICE void mma(Acc& c, const FragA& a, const FragB& b) {
#if defined(__gfx942__) || defined(__gfx950__) || defined(__gfx90a__)
  Bf16x4 av, bv;
  av[0] = static_cast<short>(a.r[0] & 0xffffu);
  av[1] = static_cast<short>(a.r[0] >> 16);
  av[2] = static_cast<short>(a.r[1] & 0xffffu);
  av[3] = static_cast<short>(a.r[1] >> 16);
  bv[0] = static_cast<short>(b.r[0] & 0xffffu);
  bv[1] = static_cast<short>(b.r[0] >> 16);
  bv[2] = static_cast<short>(b.r[1] & 0xffffu);
  bv[3] = static_cast<short>(b.r[1] >> 16);
  Floatx4 cv = {c.v[0], c.v[1], c.v[2], c.v[3]};
  cv = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, cv, 0, 0, 0);
  c.v[0] = cv[0];
  c.v[1] = cv[1];
  c.v[2] = cv[2];
  c.v[3] = cv[3];
#else
  (void)c, (void)a, (void)b;
  device_trap();  // no bf16 MFMA on this target
#endif
}
#if defined(__gfx950__)
// Two 16-deep steps at once on gfx950's double-rate v_mfma_f32_16x16x32_bf16: a lane's 8 values of A (its
// values of step 0, then of step 1) and of B in the same order, so every k pairs with itself (a dot product
// does not depend on the order of its terms).
#define DSV4_SPARSE_MLA_PAIRED_STEPS 1
DSV4_DEVICE void mma_pair(Acc& c, const FragA& a0, const FragA& a1, const FragB& b0, const FragB& b1) {
  mfma_16x16x32_bf16(c.v, {a0.r[0], a0.r[1], a1.r[0], a1.r[1]}, {b0.r[0], b0.r[1], b1.r[0], b1.r[1]});
}
#endif
#else
// NVIDIA m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, q = lane % 4:
// A regs a0..a3 = (row g, k 2q..2q+1), (row g+8, k 2q..), (row g, k 2q+8..), (row g+8, k 2q+8..);
// B regs b0, b1 = (k 2q..2q+1, n g), (k 2q+8..2q+9, n g); C c0..c3 = (row g, n 2q..2q+1), (row g+8,
// n 2q..2q+1). Lower k (or n) in the low half. A 16-wide n tile is two n8 MMAs: accumulators 0..3
// cover n 0..7, 4..7 cover n 8..15; B regs 0, 1 and 2, 3 likewise.
constexpr int kAccPerTile = 8;
struct FragA { uint32_t r[4]; };
struct FragB { uint32_t r[4]; };
struct Acc { float v[8]; };

DSV4_DEVICE int acc_row(int lane, int r) { return lane / 4 + 8 * ((r % 4) / 2); }
DSV4_DEVICE int acc_col(int lane, int r) { return 8 * (r / 4) + 2 * (lane % 4) + (r % 2); }

// A from shared memory: matrices (rows 0..7 | 8..15) x (k 0..7 | 8..15), rows varying fastest: a0..a3.
DSV4_DEVICE FragA load_a(const uint16_t* base, int ld, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const int matrix = lane / 8;
  FragA a;
  ldmatrix_x4(a.r, shared_window_address(base + (8 * (matrix % 2) + lane % 8) * ld + 8 * (matrix / 2)));
  return a;
#else
  const uint16_t* p = base + (lane / 4) * ld + 2 * (lane % 4);
  return FragA{{*reinterpret_cast<const uint32_t*>(p), *reinterpret_cast<const uint32_t*>(p + 8 * ld),
                *reinterpret_cast<const uint32_t*>(p + 8), *reinterpret_cast<const uint32_t*>(p + 8 * ld + 8)}};
#endif
}
// B stored n-major (rows = n, k contiguous): matrices (n 0..7 | 8..15) x (k 0..7 | 8..15), k varying
// fastest: B regs 0..3.
DSV4_DEVICE FragB load_b_nmajor(const uint16_t* base, int ld, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const int matrix = lane / 8;
  FragB b;
  ldmatrix_x4(b.r, shared_window_address(base + (8 * (matrix / 2) + lane % 8) * ld + 8 * (matrix % 2)));
  return b;
#else
  const uint16_t* p = base + (lane / 4) * ld + 2 * (lane % 4);
  return FragB{{*reinterpret_cast<const uint32_t*>(p), *reinterpret_cast<const uint32_t*>(p + 8),
                *reinterpret_cast<const uint32_t*>(p + 8 * ld), *reinterpret_cast<const uint32_t*>(p + 8 * ld + 8)}};
#endif
}
// `base` in shared memory, rows 16-byte aligned. ldmatrix .x4 .trans: lane l gives the address of row l % 8
// of 8x8 matrix l / 8 = (k 0..7 | 8..15) x (n 0..7 | 8..15), k varying fastest; register i then holds
// matrix i's elements (k 2q, 2q+1; n g), which are B regs 0..3 in the order above.
DSV4_DEVICE FragB load_b_kmajor(const uint16_t* base, int ld, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const int matrix = lane / 8;
  const uint16_t* row = base + (8 * (matrix % 2) + lane % 8) * ld + 8 * (matrix / 2);
  const uint32_t address = shared_window_address(row);
  FragB b;
  ptx::ldmatrix_m8n8_x4_trans_b16(b.r, address);
  return b;
#else
  const uint16_t* p = base + 2 * (lane % 4) * ld + lane / 4;
  auto pair = [&](int k, int n) {
    return static_cast<uint32_t>(p[k * ld + n]) | (static_cast<uint32_t>(p[(k + 1) * ld + n]) << 16);
  };
  return FragB{{pair(0, 0), pair(8, 0), pair(0, 8), pair(8, 8)}};
#endif
}
DSV4_DEVICE void mma(Acc& c, const FragA& a, const FragB& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Accumulators 4h..4h+3 in place (copies of them cost the scheduler extra moves).
    ptx::mma_m16n8k16_bf16(*reinterpret_cast<float(*)[4]>(&c.v[4 * h]), a.r, {b.r[2 * h], b.r[2 * h + 1]});
  }
#else
  (void)c, (void)a, (void)b;
  device_trap();  // no bf16 mma.sync before sm_80
#endif
}
#endif

constexpr int kWarps = kThreads / kWarpSize;        // 8 NVIDIA, 4 AMD
constexpr int kDimParts = kWarps / 2;               // S: 2 key halves x kDimParts dim slices
constexpr int kPartDims = kDim / kDimParts;         // 128 NVIDIA, 256 AMD
constexpr int kScoreSteps = kPartDims / 16;
constexpr int kWarpDims = kDim / kWarps;            // P V: output dims per warp, 64 / 128
constexpr int kOutTiles = kWarpDims / 16;
static_assert(kWarps % 2 == 0 && kTileKeys == 2 * 16, "two 16-key halves of the tile");

// ---- key decode ---------------------------------------------------------------------------------------
// One thread's loads of one key (32 threads per key): 8 NoPE bytes of the first half, and 8 NoPE bytes of
// the second half (lanes 0..23) or 16 RoPE bytes (lanes 24..31), with the two block scales.
struct KeyLoad {
  uint2 low;
  uint4 high;
  uint32_t scales;  // low scale byte | high scale byte << 8
  int table;        // < 0: no key (zeros)
};

// The 256-entry decode table of a cache's encoding: ds_mla's dequantize_nope_value at a unit scale (FNUZ
// 0x80 reads +0); the block scale, a power of two, multiplies the entry exactly afterwards. The NaN codes
// hold +0 here: the spec scrubs their values to +0 whatever the scale, and 0 times any scale but a NaN
// one is +0, so only unusual scales need the per-value scrub (decode_fp8x8).
DSV4_DEVICE float table_value(Fp8Format format, uint8_t code) {
  const float value = format == Fp8Format::kFNUZ ? ds_mla::dequantize_nope_value<Fp8Format::kFNUZ>(code, 1.0f)
                                                 : ds_mla::dequantize_nope_value<Fp8Format::kOCP>(code, 1.0f);
  return value == value ? value : 0.0f;
}

#if defined(__CUDA_ARCH__)
// prmt with sign-replicating selectors (nibble bit 3 set): result byte i is 0xff or 0x00 after the top bit
// of the byte of x that nibble i of kSelector names (its low 3 bits).
template <uint32_t kSelector>
DSV4_DEVICE uint32_t byte_sign_masks(uint32_t x) {
  return ptx::prmt_b32_with_zero<kSelector>(x);
}
#endif

// Two bf16 with every non-finite value (exponent all ones) replaced by +0: the spec's NaN scrub, on both
// halves at once. x = the exponent bits that are zero; a half is finite iff its x is non-zero, and then
// x + 0x7f80 (at most 0xff00: no carry into the other half) has bit 15 set.
DSV4_DEVICE uint32_t scrub_bf16x2(uint32_t word) {
  const uint32_t flags = (~word & 0x7f807f80u) + 0x7f807f80u;  // bit 15 / 31: that half is finite
#if defined(__CUDA_ARCH__)
  const uint32_t keep = byte_sign_masks<0xBB99u>(flags);  // bytes 0-1 after bit 15, bytes 2-3 after bit 31
#else
  const uint32_t keep = ((flags >> 15) & 0x00010001u) * 0xffffu;
#endif
  return word & keep;
}

// Two fp32 values to bf16 (round to nearest even; low half = first). sm_90 has the conversion instruction;
// elsewhere the shared software rounding (the same bits for every non-NaN value; NaN is scrubbed anyway).
DSV4_DEVICE uint32_t bf16x2(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return ptx::cvt_rn_bf16x2_f32(high, low);
#else
  return float_to_bf16_bits(low) | (float_to_bf16_bits(high) << 16);
#endif
}

// Scale bytes up to this one keep every table value times the scale finite through the bf16 rounding
// (|value| <= 448, 448 * 2^(240-127) < 2^122): no value of the block needs the scrub.
constexpr uint32_t kLargestUnscrubbedScale = 240;

// The block scale of a decode: ue8m0_decode without its NaN case. Byte 255 reads as +Inf here, and every
// product with it (Inf, or NaN for a zero code) is scrubbed to +0 by finish_block, as a NaN scale's are.
DSV4_DEVICE float decode_block_scale(uint32_t scale_byte) {
  return bits_float(scale_byte == 0 ? 0x00400000u : scale_byte << 23);
}

// A decoded block's 4 bf16 pairs, scrubbed only where the scale could make a value non-finite (a huge
// scale, or the NaN scale byte 255).
DSV4_DEVICE uint4 finish_block(uint32_t (&pairs)[4], uint32_t scale_byte) {
  if (scale_byte > kLargestUnscrubbedScale) {
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs[j] = scrub_bf16x2(pairs[j]);
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

// 8 codes of one 64-dim block into 8 bf16 (4 words) through the decode table.
// `tables` is the pair of decode tables (main, extra; 1 KB each) and table_offset the byte offset of the
// key's own (0 or 1024): OR-ing it into each code's byte index saves an add per value.
DSV4_DEVICE uint4 decode_fp8x8(uint2 codes, uint32_t scale_byte, const float (*tables)[256], uint32_t table_offset) {
  const char* table_bytes = reinterpret_cast<const char*>(tables);
  const auto entry = [&](uint32_t index_bytes) {
    return *reinterpret_cast<const float*>(table_bytes + (index_bytes | table_offset));
  };
  const float block_scale = decode_block_scale(scale_byte);
  const uint32_t words[2] = {codes.x, codes.y};
  uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t word = words[j / 2] >> (16 * (j % 2));
    pairs[j] = bf16x2(entry((word << 2) & 0x3fcu) * block_scale, entry((word >> 6) & 0x3fcu) * block_scale);
  }
  return finish_block(pairs, scale_byte);
}

// NVIDIA sm_89+ decodes OCP keys with the FP8 conversion instructions instead of the table: every e4m3
// value is exact in f16 and in fp32, so the product with the block scale and its bf16 rounding are the
// table path's, without its shared-memory lookups (random banks: the most shared-memory traffic of a tile).
// FNUZ keys (no conversion instruction here) and the other targets keep the table.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DSV4_SPARSE_MLA_OCP_CONVERT 1

// An f16 pair (low half first) to fp32.
DSV4_DEVICE void f16x2_to_float2(uint32_t halves, float& low, float& high) {
  ptx::cvt_f32_f16_halves(halves, low, high);
}

// decode_fp8x8 for an OCP block. The NaN codes (0x7f, 0xff) become 0x00 first, +0 like their table entry.
DSV4_DEVICE uint4 decode_ocp_fp8x8(uint2 codes, uint32_t scale_byte) {
  const float block_scale = decode_block_scale(scale_byte);
  uint32_t words[2] = {codes.x, codes.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // A byte's low 7 bits plus one reach bit 7 (no carry leaves the byte) only for 0x7f: a NaN code.
    words[i] &= ~byte_sign_masks<0xBA98u>((words[i] & 0x7f7f7f7fu) + 0x01010101u);
  }
  uint32_t pairs[4];
  ocp_fp8x4_to_f16x4(words[0], pairs[0], pairs[1]);
  ocp_fp8x4_to_f16x4(words[1], pairs[2], pairs[3]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float low, high;
    f16x2_to_float2(pairs[j], low, high);
    pairs[j] = bf16x2(low * block_scale, high * block_scale);
  }
  return finish_block(pairs, scale_byte);
}
#endif

// NVIDIA: the next tile's records are copied into shared memory asynchronously (cp.async, sm_80+) while
// the current tile is computed. The AMD targets load each tile's records straight into registers.
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
#define DSV4_SPARSE_MLA_ASYNC_STAGE 0
constexpr int kPassesInFlight = 2;  // key loads in flight per thread before they are decoded
#else
#define DSV4_SPARSE_MLA_ASYNC_STAGE 1
constexpr int kStageStride = ds_mla::kDataBytes + 16;      // 592: rows stay 16-byte aligned
constexpr int kStageChunks = ds_mla::kDataBytes / 16;      // 36 copies of 16 bytes a record
constexpr int kStageThreadsPerKey = kThreads / kTileKeys;  // 8
#endif

// The block's shared memory for kGroups groups of 16 heads (dynamic shared memory: up to 107 KB on
// NVIDIA, two blocks a multiprocessor; 57 KB on AMD).
template <int kGroups>
struct Shared {
  static constexpr int kRows = kGroups * kHeadsPerBlock;
  uint16_t keys[kTileKeys * kKeyStride];  // bf16 key tile (first: 16-byte aligned)
  uint16_t q[kRows * kKeyStride];         // bf16 Q rows of the block's heads (heads >= H: zeros)
  uint16_t probs[kRows * kProbStride];
  float tables[2][256];  // main, extra
  float scores[kDimParts][kRows][kTileKeys];
  float alpha[kRows];
  float row_m[kRows];  // one split: the final (m, l) of each head row, for the fused epilogue
  float row_l[kRows];
  const uint8_t* key_data[kTileKeys];
  const uint8_t* key_scales[kTileKeys];
  int key_table[kTileKeys];
#if DSV4_SPARSE_MLA_ASYNC_STAGE
  // The next tile's raw records (576 data bytes, then the 8 scale bytes), copied in while this tile is
  // computed, and their tables (< 0: no key).
  alignas(16) uint8_t stage[kTileKeys * kStageStride];
  int stage_table[kTileKeys];
#endif
};

// ds_mla::record_address of a slot (>= 0) with a shift and a mask where the cache's block size (> 0) is a
// power of two, as it is in practice (64): the division costs ~20 instructions a key and tile.
DSV4_DEVICE ds_mla::RecordAddress key_record_address(const SparseKeySource& source, int64_t slot) {
  const int64_t block_size = source.block_size;
  if ((block_size & (block_size - 1)) == 0) {
    return ds_mla::record_address_in_block(slot >> __popcll(static_cast<unsigned long long>(block_size - 1)),
                                           slot & (block_size - 1), block_size, source.block_stride);
  }
  return ds_mla::record_address(slot, block_size, source.block_stride);
}

// Slot of position p (< the row's count) of row t's key list, its cache, and whether it may be read.
template <class Sh>
DSV4_DEVICE void locate_key(const SparseMlaDecodeArgs& args, int64_t main_begin, int64_t main_count,
                            int64_t extra_begin, int64_t p, Sh& sh, int i) {
  const bool from_main = p < main_count;
  const SparseKeySource& source = from_main ? args.main : args.extra;
  const int64_t slot = from_main ? source.indices[main_begin + p] : source.indices[extra_begin + p - main_count];
  int table = -1;
  if (slot >= 0 && slot < source.capacity()) {
    const ds_mla::RecordAddress address = key_record_address(source, slot);
    sh.key_data[i] = source.bytes + address.data;
    sh.key_scales[i] = source.bytes + address.scale;
    table = from_main ? 0 : 1;
  }
  sh.key_table[i] = table;
}

#if !DSV4_SPARSE_MLA_ASYNC_STAGE
constexpr int kHalfDims = kDim / 2;                                          // 256
constexpr int kFirstRopeLane = (ds_mla::kNopeDim - kHalfDims) / kPieceDims;  // 24

// AMD: one thread's share of a record at data / scales (global memory; 32 threads a key); table < 0: no key.
DSV4_DEVICE KeyLoad load_key(const uint8_t* data, const uint8_t* scales, int table, int lane) {
  KeyLoad load;
  load.table = table;
  load.low = make_uint2(0, 0);
  load.high = make_uint4(0, 0, 0, 0);
  load.scales = 0;
  if (load.table < 0) return load;
  load.low = *reinterpret_cast<const uint2*>(data + lane * kPieceDims);
  load.scales = scales[lane * kPieceDims / ds_mla::kQuantBlock];
  if (lane < kFirstRopeLane) {
    const uint2 high = *reinterpret_cast<const uint2*>(data + kHalfDims + lane * kPieceDims);
    load.high = make_uint4(high.x, high.y, 0, 0);
    load.scales |= static_cast<uint32_t>(scales[(kHalfDims + lane * kPieceDims) / ds_mla::kQuantBlock]) << 8;
  } else {
    load.high = *reinterpret_cast<const uint4*>(data + ds_mla::kNopeDim + (lane - kFirstRopeLane) * 2 * kPieceDims);
  }
  return load;
}

// ocp_tables: bit i set when table i (0 main, 1 extra) decodes an OCP cache.
DSV4_DEVICE void store_key(const KeyLoad& load, uint16_t* row, int lane, const float (*tables)[256],
                           uint32_t ocp_tables) {
  uint4 low = make_uint4(0, 0, 0, 0);
  uint4 high = make_uint4(0, 0, 0, 0);
  if (load.table >= 0) {
    const uint2 high_codes = make_uint2(load.high.x, load.high.y);
#if defined(DSV4_SPARSE_MLA_OCP_CONVERT)
    if ((ocp_tables >> load.table) & 1u) {  // uniform across the key's 32 threads (a warp)
      low = decode_ocp_fp8x8(load.low, load.scales & 0xffu);
      if (lane < kFirstRopeLane) high = decode_ocp_fp8x8(high_codes, (load.scales >> 8) & 0xffu);
    } else
#else
    (void)ocp_tables;
#endif
    {
      const uint32_t table_offset = static_cast<uint32_t>(load.table) * sizeof(tables[0]);
      low = decode_fp8x8(load.low, load.scales & 0xffu, tables, table_offset);
      if (lane < kFirstRopeLane) high = decode_fp8x8(high_codes, (load.scales >> 8) & 0xffu, tables, table_offset);
    }
    if (lane >= kFirstRopeLane) {
      high = make_uint4(scrub_bf16x2(load.high.x), scrub_bf16x2(load.high.y), scrub_bf16x2(load.high.z),
                        scrub_bf16x2(load.high.w));
    }
  }
  *reinterpret_cast<uint4*>(row + lane * kPieceDims) = low;
  *reinterpret_cast<uint4*>(row + kHalfDims + lane * kPieceDims) = high;
}
#endif

#if DSV4_SPARSE_MLA_ASYNC_STAGE
// The slot at position p of the row's key list (its main indices, then its extra ones); -1 past `last`
// (then never used). Loaded a tile ahead of its copies, so that the index load's latency is hidden: kept
// 32-bit (as stored) until used, since widening it right after the load would wait for the load there.
DSV4_DEVICE int32_t fetch_slot(const SparseMlaDecodeArgs& args, int64_t main_begin, int64_t main_count,
                               int64_t extra_begin, int64_t p, int64_t last) {
  if (p >= last) return -1;
  return p < main_count ? args.main.indices[main_begin + p] : args.extra.indices[extra_begin + p - main_count];
}

// Starts the copies of the records at positions [tile, tile + 32) (< last) of the row's key list into the
// stage, by kWorkers threads: kWorkers / 32 per key (each holding its slot, fetched earlier), each copying
// its share of the 36 chunks of 16 bytes; the last of them also the 8 scale bytes. Invalid slots are marked
// and never read.
template <int kWorkers = kThreads>
DSV4_DEVICE void stage_tile(const SparseMlaDecodeArgs& args, int64_t main_count, int64_t tile, int64_t last,
                            int64_t slot, uint8_t* stage, int* stage_table, int tid) {
  constexpr int kPerKey = kWorkers / kTileKeys;
  const int key = tid / kPerKey;
  const int sub = tid % kPerKey;
  const int64_t p = tile + key;
  int table = -1;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  if (p < last) {
    const bool from_main = p < main_count;
    const SparseKeySource& source = from_main ? args.main : args.extra;
    if (slot >= 0 && slot < source.capacity()) {
      const ds_mla::RecordAddress address = key_record_address(source, slot);
      data = source.bytes + address.data;
      scales = source.bytes + address.scale;
      table = from_main ? 0 : 1;
    }
  }
  if (sub == 0) stage_table[key] = table;
  if (table < 0) return;
  uint8_t* dst = stage + key * kStageStride;
  // The stage is addressed by generic pointers; each copy converts its own (the address arithmetic of every
  // copy then stays independent).
  const auto copy16 = [](uint8_t* shared_dst, const uint8_t* global_src) {
    copy_async_16(shared_window_address(shared_dst), global_src);
  };
#pragma unroll
  for (int i = 0; i < (kStageChunks + kPerKey - 1) / kPerKey; ++i) {
    const int c = sub + i * kPerKey;
    if (c < kStageChunks) copy16(dst + 16 * c, data + 16 * c);
  }
  if (sub == kPerKey - 1) copy_async_8(shared_window_address(dst + ds_mla::kDataBytes), scales);
}

// Decode of a staged tile in steps that every lane of a warp runs alike (no branch on the lane): the 448
// NoPE dims of a key are 28 pieces of 16 values (each within one 64-dim scale block, whose scale it decodes
// once), 896 pieces a tile, dealt to the block's threads in three and a half passes (the half pass on
// whole warps); the 64 RoPE dims are 8 pieces of 8 bf16, one per thread.
constexpr int kNopePieceDims = 16;
constexpr int kNopePiecesPerKey = ds_mla::kNopeDim / kNopePieceDims;  // 28
constexpr int kNopePieces = kTileKeys * kNopePiecesPerKey;           // 896
constexpr int kNopePasses = (kNopePieces + kThreads - 1) / kThreads;  // 4, the last one partial
constexpr int kRopePiecesPerKey = ds_mla::kRopeDim / kPieceDims;      // 8
static_assert(kNopePieces % kWarpSize == 0, "the partial pass ends on a warp boundary");
static_assert(kTileKeys * kRopePiecesPerKey == kThreads, "one RoPE piece a thread");

// NoPE piece `piece` (dims [16 piece, +16)) of a staged record: its 16 codes and its block's scale byte.
struct StagedPiece {
  uint4 codes;
  uint32_t scale_byte;
};
DSV4_DEVICE StagedPiece load_staged_piece(const uint8_t* record, int piece) {
  return {*reinterpret_cast<const uint4*>(record + piece * kNopePieceDims),
          record[ds_mla::kDataBytes + piece * kNopePieceDims / ds_mla::kQuantBlock]};
}

// The paths for the pieces the integer decode does not take (table >= 0). Out of line: rare, and large next
// to the integer path (the decode loops stay small in the instruction cache).
struct DecodedPiece {
  uint4 low, high;
};
__device__ __noinline__ DecodedPiece decode_nope_piece_general(const StagedPiece staged, int table,
                                                               const float (*tables)[256], uint32_t ocp_tables) {
  const uint4 codes = staged.codes;
  const uint32_t scale_byte = staged.scale_byte;
#if defined(DSV4_SPARSE_MLA_OCP_CONVERT)
  if ((ocp_tables >> table) & 1u) {
    return {decode_ocp_fp8x8(make_uint2(codes.x, codes.y), scale_byte),
            decode_ocp_fp8x8(make_uint2(codes.z, codes.w), scale_byte)};
  }
#else
  (void)ocp_tables;
#endif
  const uint32_t table_offset = static_cast<uint32_t>(table) * sizeof(tables[0]);
  return {decode_fp8x8(make_uint2(codes.x, codes.y), scale_byte, tables, table_offset),
          decode_fp8x8(make_uint2(codes.z, codes.w), scale_byte, tables, table_offset)};
}

// A staged NoPE piece as two chunks of 8 bf16; table < 0 (no key): zeros.
DSV4_DEVICE void decode_nope_piece(const StagedPiece& staged, int table, const float (*tables)[256],
                                   uint32_t ocp_tables, uint4& low, uint4& high) {
  low = make_uint4(0, 0, 0, 0);
  high = make_uint4(0, 0, 0, 0);
  if (table < 0) return;
  const uint4 codes = staged.codes;
  const uint32_t scale_byte = staged.scale_byte;
  // Nearly every piece of real keys: the integer decode of ds_mla.h (no table lookups, no conversion
  // instructions, fewer instructions than either). Zero, subnormal and NaN codes and unusual scales take the
  // general paths.
  const uint32_t decodable = ds_mla::integer_decodable_fp8x4(codes.x) & ds_mla::integer_decodable_fp8x4(codes.y) &
                             ds_mla::integer_decodable_fp8x4(codes.z) & ds_mla::integer_decodable_fp8x4(codes.w);
  if (decodable == 0x80808080u && scale_byte - ds_mla::kIntegerDecodeMinScale <=
                                      ds_mla::kIntegerDecodeMaxScale - ds_mla::kIntegerDecodeMinScale) {
    const uint32_t exponent_bias = ((ocp_tables >> table) & 1u) ? Fp8Traits<Fp8Format::kOCP>::kExponentBias
                                                                 : Fp8Traits<Fp8Format::kFNUZ>::kExponentBias;
    const uint32_t offset = ds_mla::integer_decode_offset(scale_byte, exponent_bias);
    const auto pairs = [offset](uint32_t x, uint32_t y) {
      return make_uint4(ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<0>(x), offset),
                        ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<1>(x), offset),
                        ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<0>(y), offset),
                        ds_mla::integer_decode_bf16x2(ds_mla::spread_fp8_pair<1>(y), offset));
    };
    low = pairs(codes.x, codes.y);
    high = pairs(codes.z, codes.w);
    return;
  }
  const DecodedPiece decoded = decode_nope_piece_general(staged, table, tables, ocp_tables);
  low = decoded.low;
  high = decoded.high;
}

DSV4_DEVICE void decode_staged_nope(const uint8_t* record, int table, int piece, const float (*tables)[256],
                                    uint32_t ocp_tables, uint4& low, uint4& high) {
  if (table < 0) {
    low = high = make_uint4(0, 0, 0, 0);
    return;
  }
  decode_nope_piece(load_staged_piece(record, piece), table, tables, ocp_tables, low, high);
}

// Stores a decoded NoPE piece's two chunks. Pieces 4..7 of each group of 8 store theirs in the other order: a
// quarter warp's first stores then fall on distinct banks (in the plain and in the swizzled tiles).
DSV4_DEVICE void store_piece(int piece, uint4* low_dst, uint4* high_dst, uint4 low, uint4 high) {
  if ((piece >> 2) & 1) {
    *high_dst = high;
    *low_dst = low;
  } else {
    *low_dst = low;
    *high_dst = high;
  }
}

// RoPE piece `piece` (8 bf16) of a staged record, non-finite values as +0; table < 0: zeros.
DSV4_DEVICE uint4 staged_rope(const uint8_t* record, int table, int piece) {
  if (table < 0) return make_uint4(0, 0, 0, 0);
  const uint4 v = *reinterpret_cast<const uint4*>(record + ds_mla::kNopeDim + piece * 2 * kPieceDims);
  return make_uint4(scrub_bf16x2(v.x), scrub_bf16x2(v.y), scrub_bf16x2(v.z), scrub_bf16x2(v.w));
}

// The staged tile into the bf16 key tile, by all threads of the block.
template <class Sh>
DSV4_DEVICE void decode_staged_tile(Sh& sh, int tid, uint32_t ocp_tables) {
  // Every pass in flight for 16 heads (H200: 2% faster at T = 128 than two); two for 32 heads, which
  // would spill with four (128 registers a thread).
  constexpr int kUnroll = Sh::kRows == kHeadsPerBlock ? kNopePasses : 2;
#pragma unroll kUnroll
  for (int pass = 0; pass < kNopePasses; ++pass) {
    const int job = pass * kThreads + tid;
    if (job < kNopePieces) {  // false only in the last pass, for whole warps
      const int key = job / kNopePiecesPerKey;
      const int piece = job % kNopePiecesPerKey;
      uint4 low, high;
      decode_staged_nope(sh.stage + key * kStageStride, sh.stage_table[key], piece, sh.tables, ocp_tables, low, high);
      uint16_t* dst = sh.keys + key * kKeyStride + piece * kNopePieceDims;
      store_piece(piece, reinterpret_cast<uint4*>(dst), reinterpret_cast<uint4*>(dst + kPieceDims), low, high);
    }
  }
  const int key = tid / kRopePiecesPerKey;
  const int piece = tid % kRopePiecesPerKey;
  *reinterpret_cast<uint4*>(sh.keys + key * kKeyStride + ds_mla::kNopeDim + piece * kPieceDims) =
      staged_rope(sh.stage + key * kStageStride, sh.stage_table[key], piece);
}
#endif

// Two blocks per multiprocessor on NVIDIA (at most 128 registers a thread): one block's MMA work hides
// the other's record loads and barriers.
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
#define DSV4_SPARSE_MLA_BOUNDS __launch_bounds__(kThreads)
#else
#define DSV4_SPARSE_MLA_BOUNDS __launch_bounds__(kThreads, 2)
#endif

// kGroups groups of 16 heads share each decoded key tile (1 or 2; the MMA B fragments of K and V are
// loaded once for all groups).
template <int kGroups>
__global__ void DSV4_SPARSE_MLA_BOUNDS sparse_mla_partial_kernel(SparseMlaDecodeArgs args) {
  using Sh = Shared<kGroups>;
  constexpr int kRows = Sh::kRows;
  constexpr int kThreadsPerRow = kThreads / kRows;          // softmax: 16 (one group) or 8 threads a row
  constexpr int kColsPerThread = kTileKeys / kThreadsPerRow;  // 2 or 4 keys a thread
  static_assert(kThreads % kRows == 0 && kTileKeys % kThreadsPerRow == 0, "softmax thread layout");
  DSV4_DYNAMIC_SHARED(unsigned char, shared_bytes, 16);
  Sh& sh = *reinterpret_cast<Sh*>(shared_bytes);
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int64_t t = blockIdx.x;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  // Launched to overlap the kernel before (launch_overlapping): nothing is read or written before its end.
  // Blocks release the reduce kernel as they exit.
  wait_for_previous_kernel();

  // The row's key list: main positions [0, main_count), then extra ones.
  const int64_t main_begin = args.main.row_begin(t);
  const int64_t main_count = args.main.row_end(t) - main_begin;
  int64_t extra_begin = 0;
  int64_t extra_count = 0;
  if (args.extra.bytes != nullptr) {
    extra_begin = args.extra.row_begin(t);
    extra_count = args.extra.row_end(t) - extra_begin;
  }
  const int64_t count = main_count + extra_count;
  const int64_t first = count * split / splits;
  const int64_t last = count * (split + 1) / splits;

  const int key_half = warp % 2;
  const int part = warp / 2;
  Acc acc[kGroups][kOutTiles];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
#pragma unroll
      for (int r = 0; r < kAccPerTile; ++r) acc[g][j].v[r] = 0.0f;
    }
  }
  const int softmax_row = tid / kThreadsPerRow;
  const int softmax_col = (tid % kThreadsPerRow) * kColsPerThread;
  float m = -FLT_MAX;
  float l = 0.0f;
  const uint32_t ocp_tables =
      (args.main.format == Fp8Format::kOCP ? 1u : 0u) | (args.extra.format == Fp8Format::kOCP ? 2u : 0u);

#if DSV4_SPARSE_MLA_ASYNC_STAGE
  // The first tile's copies fly while the decode tables and Q are set up; each thread holds the slot of
  // its key in the tile after the one being copied.
  const int stage_key = tid / kStageThreadsPerKey;
  if (first < last) {
    stage_tile(args, main_count, first, last,
               fetch_slot(args, main_begin, main_count, extra_begin, first + stage_key, last), sh.stage,
               sh.stage_table, tid);
  }
  copy_async_commit();
  int32_t next_slot = fetch_slot(args, main_begin, main_count, extra_begin, first + kTileKeys + stage_key, last);
#endif
  for (int c = tid; c < 512; c += kThreads) {
    sh.tables[c / 256][c % 256] =
        table_value(c < 256 ? args.main.format : args.extra.format, static_cast<uint8_t>(c % 256));
  }
  {
    const uint16_t* q_row = args.q + t * args.q_token_stride;
    if (is_aligned(q_row, 16) && args.q_head_stride % 8 == 0) {  // the usual contiguous q: 16-byte loads
      for (int i = tid; i < kRows * kDim / 8; i += kThreads) {
        const int row = i / (kDim / 8);
        const int dim = i % (kDim / 8) * 8;
        const int64_t head = h0 + row;
        *reinterpret_cast<uint4*>(sh.q + row * kKeyStride + dim) =
            head < args.heads ? *reinterpret_cast<const uint4*>(q_row + head * args.q_head_stride + dim)
                              : make_uint4(0, 0, 0, 0);
      }
    } else {
      for (int i = tid; i < kRows * kDim; i += kThreads) {
        const int row = i / kDim;
        const int dim = i % kDim;
        const int64_t head = h0 + row;
        sh.q[row * kKeyStride + dim] = head < args.heads ? q_row[head * args.q_head_stride + dim] : uint16_t{0};
      }
    }
  }

  for (int64_t tile = first; tile < last; tile += kTileKeys) {
#if DSV4_SPARSE_MLA_ASYNC_STAGE
    // This tile's records are in the stage (and the previous tile's compute is done): decode them into
    // the key tile, then start copying the next tile's records.
    copy_async_wait<0>();
    __syncthreads();
    if (tid < kTileKeys) sh.key_table[tid] = sh.stage_table[tid];
    decode_staged_tile(sh, tid, ocp_tables);
    __syncthreads();
    if (tile + kTileKeys < last) {
      stage_tile(args, main_count, tile + kTileKeys, last, next_slot, sh.stage, sh.stage_table, tid);
      next_slot = fetch_slot(args, main_begin, main_count, extra_begin, tile + 2 * kTileKeys + stage_key, last);
    }
    copy_async_commit();
#else
    const int key_lane = tid % kThreadsPerKey;
    const int key_group = tid / kThreadsPerKey;
    if (tid < kTileKeys) {
      if (tile + tid < last) {
        locate_key(args, main_begin, main_count, extra_begin, tile + tid, sh, tid);
      } else {
        sh.key_table[tid] = -1;
      }
    }
    __syncthreads();
#pragma unroll
    for (int batch = 0; batch < kPasses; batch += kPassesInFlight) {
      KeyLoad loads[kPassesInFlight];
#pragma unroll
      for (int i = 0; i < kPassesInFlight; ++i) {
        const int key = (batch + i) * kKeysPerPass + key_group;
        loads[i] = load_key(sh.key_data[key], sh.key_scales[key], sh.key_table[key], key_lane);
      }
#pragma unroll
      for (int i = 0; i < kPassesInFlight; ++i) {
        store_key(loads[i], sh.keys + ((batch + i) * kKeysPerPass + key_group) * kKeyStride, key_lane, sh.tables,
                  ocp_tables);
      }
    }
    __syncthreads();
#endif

    // Partial scores of this warp: keys [16 key_half, +16) over dims [part * kPartDims, +kPartDims), for
    // every head group (one K^T fragment load serves them all).
    {
      Acc s[kGroups];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
#pragma unroll
        for (int r = 0; r < kAccPerTile; ++r) s[g].v[r] = 0.0f;
      }
      const uint16_t* kbase = sh.keys + 16 * key_half * kKeyStride + part * kPartDims;
      const uint16_t* qbase = sh.q + part * kPartDims;
#if DSV4_SPARSE_MLA_PAIRED_STEPS
      static_assert(kScoreSteps % 2 == 0, "paired steps");
#pragma unroll 2
      for (int step = 0; step < kScoreSteps; step += 2) {
        const FragB b0 = load_b_nmajor(kbase + 16 * step, kKeyStride, lane);
        const FragB b1 = load_b_nmajor(kbase + 16 * (step + 1), kKeyStride, lane);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const uint16_t* qrow = qbase + g * kHeadsPerBlock * kKeyStride + 16 * step;
          mma_pair(s[g], load_a(qrow, kKeyStride, lane), load_a(qrow + 16, kKeyStride, lane), b0, b1);
        }
      }
#else
#pragma unroll 4
      for (int step = 0; step < kScoreSteps; ++step) {
        const FragB b = load_b_nmajor(kbase + 16 * step, kKeyStride, lane);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          mma(s[g], load_a(qbase + g * kHeadsPerBlock * kKeyStride + 16 * step, kKeyStride, lane), b);
        }
      }
#endif
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
#pragma unroll
        for (int r = 0; r < kAccPerTile; ++r) {
          sh.scores[part][g * kHeadsPerBlock + acc_row(lane, r)][16 * key_half + acc_col(lane, r)] = s[g].v[r];
        }
      }
    }
    __syncthreads();

    // Online softmax: kThreadsPerRow threads per head row.
    {
      float sc[kColsPerThread];
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const int key = softmax_col + c;
        float dot = 0.0f;
#pragma unroll
        for (int p = 0; p < kDimParts; ++p) dot += sh.scores[p][softmax_row][key];
        sc[c] = sh.key_table[key] >= 0 ? args.scale * dot : -INFINITY;
        tile_max = fmaxf(tile_max, sc[c]);
      }
#pragma unroll
      for (int mask = kThreadsPerRow / 2; mask > 0; mask /= 2) {
        tile_max = fmaxf(tile_max, shuffle_xor(tile_max, mask, kThreadsPerRow));
      }
      const float m_new = fmaxf(m, tile_max);
      const float a = expf(m - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const uint16_t bits = float_to_bf16_bits(expf(sc[c] - m_new));
        sh.probs[softmax_row * kProbStride + softmax_col + c] = bits;
        sum += bf16_bits_to_float(bits);
      }
      sum = group_sum<kThreadsPerRow>(sum);
      l = l * a + sum;
      m = m_new;
      if (tid % kThreadsPerRow == 0) sh.alpha[softmax_row] = a;
    }
    __syncthreads();

    // acc = acc * alpha + P V over this warp's output dims (one V fragment load serves every group).
    {
      const uint16_t* vbase = sh.keys + warp * kWarpDims;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
#pragma unroll
        for (int r = 0; r < kAccPerTile; ++r) {
          const float row_alpha = sh.alpha[g * kHeadsPerBlock + acc_row(lane, r)];
#pragma unroll
          for (int j = 0; j < kOutTiles; ++j) acc[g][j].v[r] *= row_alpha;
        }
      }
#if DSV4_SPARSE_MLA_PAIRED_STEPS
      static_assert(kTileKeys == 32, "one pair of 16-key steps a tile");
      FragA p[2][kGroups];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          p[kk][g] = load_a(sh.probs + g * kHeadsPerBlock * kProbStride + 16 * kk, kProbStride, lane);
        }
      }
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const FragB b0 = load_b_kmajor(vbase + 16 * j, kKeyStride, lane);
        const FragB b1 = load_b_kmajor(vbase + 16 * kKeyStride + 16 * j, kKeyStride, lane);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) mma_pair(acc[g][j], p[0][g], p[1][g], b0, b1);
      }
#else
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) {
        FragA p[kGroups];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          p[g] = load_a(sh.probs + g * kHeadsPerBlock * kProbStride + 16 * kk, kProbStride, lane);
        }
#pragma unroll
        for (int j = 0; j < kOutTiles; ++j) {
          const FragB b = load_b_kmajor(vbase + 16 * kk * kKeyStride + 16 * j, kKeyStride, lane);
#pragma unroll
          for (int g = 0; g < kGroups; ++g) mma(acc[g][j], p[g], b);
        }
      }
#endif
    }
    __syncthreads();
  }

  if (splits == 1) {
    // One split: the reduce fused here (sink, normalization, inverse RoPE, bf16 out), no partials.
    if (tid % kThreadsPerRow == 0) {
      sh.row_m[softmax_row] = m;
      sh.row_l[softmax_row] = l;
    }
    __syncthreads();
    const int64_t rope_row = args.inverse_rope ? args.rope.row_of(t) : 0;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
#pragma unroll
      for (int r = 0; r < kAccPerTile; ++r) {
        const int row = g * kHeadsPerBlock + acc_row(lane, r);
        const int64_t head = h0 + row;
        const SinkFold fold =
            fold_sink(head_sink(args, head), sh.row_m[row], sh.row_l[row]);
#pragma unroll
        for (int j = 0; j < kOutTiles; ++j) {
          acc[g][j].v[r] = fold.empty ? 0.0f : (fold.weight * acc[g][j].v[r]) / fold.denominator;
        }
      }
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const int tile_dim = warp * kWarpDims + 16 * j;  // warp-uniform: the tile is all NoPE or all RoPE
        if (args.inverse_rope && tile_dim >= ds_mla::kNopeDim) {
          float partner[kAccPerTile];  // the value of the other dim of each element's pair (column ^ 1)
#pragma unroll
          for (int r = 0; r < kAccPerTile; ++r) {
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
            partner[r] = shuffle_xor(acc[g][j].v[r], 1, 16);
#else
            partner[r] = acc[g][j].v[r ^ 1];
#endif
          }
#pragma unroll
          for (int r = 0; r < kAccPerTile; ++r) {
            const int dim = tile_dim + acc_col(lane, r);
            const int pair = (dim - ds_mla::kNopeDim) / 2;
            const bool even = dim % 2 == 0;
            float a = even ? acc[g][j].v[r] : partner[r];
            float b = even ? partner[r] : acc[g][j].v[r];
            rope_unrotate_pair(a, b, args.rope.value(rope_row, pair),
                               args.rope.value(rope_row, ds_mla::kRopeDim / 2 + pair));
            acc[g][j].v[r] = even ? a : b;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kAccPerTile; ++r) {
        const int64_t head = h0 + g * kHeadsPerBlock + acc_row(lane, r);
        if (head >= args.heads) continue;
        uint16_t* out_row = args.out + t * args.out_token_stride + head * args.out_head_stride;
#pragma unroll
        for (int j = 0; j < kOutTiles; ++j) {
          out_row[warp * kWarpDims + 16 * j + acc_col(lane, r)] = float_to_bf16_bits(acc[g][j].v[r]);
        }
      }
    }
    return;
  }

  // The split's partials.
  const int64_t row_base = (t * splits + split) * args.heads;
  float* acc_out = args.partials;
  float* ml_out = args.partials + args.tokens * splits * args.heads * kDim;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
#pragma unroll
      for (int r = 0; r < kAccPerTile; ++r) {
        const int64_t head = h0 + g * kHeadsPerBlock + acc_row(lane, r);
        if (head < args.heads) {
          acc_out[(row_base + head) * kDim + warp * kWarpDims + 16 * j + acc_col(lane, r)] = acc[g][j].v[r];
        }
      }
#else
      // Accumulators r and r + 1 (r even) are adjacent dims of one row: one 8-byte store.
#pragma unroll
      for (int r = 0; r < kAccPerTile; r += 2) {
        const int64_t head = h0 + g * kHeadsPerBlock + acc_row(lane, r);
        if (head < args.heads) {
          *reinterpret_cast<float2*>(acc_out + (row_base + head) * kDim + warp * kWarpDims + 16 * j +
                                     acc_col(lane, r)) = make_float2(acc[g][j].v[r], acc[g][j].v[r + 1]);
        }
      }
#endif
    }
  }
  if (tid % kThreadsPerRow == 0 && h0 + softmax_row < args.heads) {
    ml_out[(row_base + h0 + softmax_row) * 2] = m;
    ml_out[(row_base + h0 + softmax_row) * 2 + 1] = l;
  }
}

#if !defined(__HIPCC__)
// ---- sm_90a: sparse_mla_wgmma_kernel (warpgroup MMA, warp-specialized) ------------------------------------
// For batches with enough (row, 64-head) blocks and long rows (sparse_mla_uses_wgmma). A block of three warp
// groups serves one query row t, 64 heads (rows of heads >= H are zero and never written) and one split. The
// producer group copies the records of 32-key tiles into a ring of stages (cp.async, two tiles ahead) and
// decodes each, as above, into a bf16 key tile in the 128-byte swizzle: 8 planes of 64 dims, row k of a plane
// holding key k's 64 dims, 16-byte chunk c at c ^ (k % 8). One such tile serves both products: read K-major
// it is K (S = Q K^T, N = keys), read MN-major it is V (O += P V, N = dims). Q (64 x 512) sits in the same
// layout. The two consumer groups multiply: group w scores keys [16 w, +16) of a tile (m64n16k16 over the 512
// dims), the groups exchange their row maxima, each writes its half of P (bf16, 64-byte swizzle) and
// multiplies all of P by dims [256 w, +256) of V (m64n256k16; the 64 x 256 fp32 accumulators stay in
// registers). A ring of three key tiles lies between them, handed over through named barriers (full: decoded;
// empty: its P V done), so that the decode of tile i + 1 runs while tile i is multiplied. The softmax, its
// bf16 rounding of P, the sink and the epilogues follow the kernel above (the sums of l in another order).
// Measured on the H200 (so that the next change starts from it), 64 heads, T = 128, 640 keys a row: the
// producer sets the pace. In ncu's warp-state samples the consumers wait at barriers ~60% of their time, most at
// the one where a decoded tile arrives; a producer warp (~700 instructions a tile) issues on ~16% of its cycles,
// held by instruction fetch (~28%) and fixed-latency dependencies (~22%), almost never by the consumers. One
// producer warp a scheduler is the limit, so the next design should give part of the decode to the idle
// consumers or shorten the producer's code. Tried and dropped: a branch-free decode of each producer thread's 7
// pieces (one block whose chains interleave) was 3-6% slower (65.5 -> 69.5 us), and one piece at a time (not
// unrolled: half the loop's code) 10-16% slower (73.9 us); two producer groups (512 threads) do not compile,
// since ptxas gives every thread the average of 128 registers whatever setmaxnreg asks; P V(i - 1) issued after
// QK(i), to run beside the softmax of tile i, needs a second P tile (4 KB) the block's shared memory lacks;
// QK(i + 1) issued before the softmax of tile i (scores in flight across the loop's end) made ptxas serialize
// every wgmma of the kernel. Nor did it pay to drop the producer group: two groups (256 threads, 255 registers,
// no spills, the MMAs kept asynchronous) that each decode half of tile i + 1 behind their own QK(i) and PV(i)
// (two key tiles, three record stages) were 1-11% slower on the H200 (graph replay, same run: 64 heads, 640
// keys a row, T = 128 66.6 -> 71.3 us, T = 32 29.2 -> 30.5; 128 heads, 1152 keys, T = 128 205.4 -> 228.1;
// 192-384 keys 1-5%; sparse MLA GPU tests of the kernel's sizes passed on it). In ncu (base clocks, 64 heads,
// T = 128) its warps issued on 33% of cycles, ~1180 instructions a warp a tile (the decode ~370, the
// accumulator rescale 128), stalled per issue ~1.3 cycles on instruction fetch, ~1.3 on fixed-latency
// dependencies, ~0.7 on shared-memory results and ~0.5 at barriers: spread over every warp, the decode still
// issues slowly.
constexpr int kWgHeads = 64;
constexpr int kWgGroupThreads = 128;
constexpr int kWgConsumerThreads = 2 * kWgGroupThreads;
constexpr int kWgThreads = kWgConsumerThreads + kWgGroupThreads;  // + the producer group
constexpr int kWgPlaneDims = 64;                                   // one 128-byte swizzled row
constexpr int kWgPlanes = kDim / kWgPlaneDims;                     // 8
constexpr int kWgQPlaneBytes = kWgHeads * 128;                     // 8 KB
constexpr int kWgKeyPlaneBytes = kTileKeys * 128;                  // 4 KB
constexpr int kWgKeyTileBytes = kWgPlanes * kWgKeyPlaneBytes;      // 32 KB
constexpr int kWgKeyTiles = 3;
constexpr int kWgProbRowBytes = kTileKeys * 2;                     // 64: the 64-byte swizzle
constexpr int kWgProbTileBytes = kWgHeads * kWgProbRowBytes;       // 4 KB
constexpr int kWgScoreKeys = kTileKeys / 2;                        // keys a consumer group scores
constexpr int kWgOutDims = kDim / 2;                               // dims a consumer group accumulates
constexpr int kWgStages = 3;                                       // record stages
// Named barriers (0 is __syncthreads): the producer's own, the consumers' two, then full and empty per key tile.
constexpr int kBarrierProducer = 1;
constexpr int kBarrierScores = 2;
constexpr int kBarrierProbs = 3;
constexpr int kBarrierFull = 4;
constexpr int kBarrierEmpty = kBarrierFull + kWgKeyTiles;
static_assert(kBarrierEmpty + kWgKeyTiles <= 16, "16 named barriers");

struct WgmmaShared {  // at a 1024-byte boundary: the swizzled tiles first
  uint8_t q[kWgPlanes * kWgQPlaneBytes];
  uint8_t keys[kWgKeyTiles][kWgKeyTileBytes];
  uint8_t probs[kWgProbTileBytes];
  alignas(16) uint8_t stage[kWgStages][kTileKeys * kStageStride];
  int stage_table[kWgStages][kTileKeys];
  int key_table[kWgKeyTiles][kTileKeys];  // < 0: no key (score -inf)
  float tables[2][256];
  float row_max[2][kWgHeads];  // per consumer group
  float row_l[2][kWgHeads];
};
constexpr size_t kWgSharedBytes = sizeof(WgmmaShared) + 1024;  // + alignment
// The epilogue's staging of the block's 64 result rows over q and keys (contiguous): bf16 or fp32 rows.
constexpr int kWgOutRowBytes = kDim * 2;
constexpr int kWgOutChunks = kWgOutRowBytes / 16;
constexpr int kWgPartialRowBytes = kDim * 4;
constexpr int kWgPartialChunks = kWgPartialRowBytes / 16;
static_assert(offsetof(WgmmaShared, keys) == sizeof(WgmmaShared::q) &&
                  kWgHeads * kWgPartialRowBytes <= sizeof(WgmmaShared::q) + sizeof(WgmmaShared::keys),
              "the staged rows fit in q and the key tiles");
static_assert(kWgSharedBytes <= 227 * 1024, "an sm_90 block's shared memory");

#if defined(DSV4_WGMMA)
DSV4_DEVICE void named_barrier_sync(int id, int threads) { ptx::bar_sync(id, threads); }
DSV4_DEVICE void named_barrier_arrive(int id, int threads) { ptx::bar_arrive(id, threads); }

// Offset of 16-byte chunk `chunk` (dims [8 chunk, +8)) of row `row` in a tile of 128-byte swizzled planes.
DSV4_DEVICE uint32_t swizzled_chunk_offset(int row, int chunk, int plane_bytes) {
  return static_cast<uint32_t>((chunk / 8) * plane_bytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// The staged tile into a swizzled key tile, by the producer group (decode_staged_tile's pieces). Each thread
// reads all its 7 pieces before it decodes any: with one producer warp a scheduler, nothing else hides a
// shared-memory read's latency.
constexpr int kWgPiecesPerWorker = kNopePieces / kWgGroupThreads;  // 7
static_assert(kNopePieces % kWgGroupThreads == 0, "whole passes");
DSV4_DEVICE void decode_staged_tile_swizzled(const uint8_t* stage, const int* stage_table, uint8_t* tile,
                                             int* key_table, const float (*tables)[256], uint32_t ocp_tables,
                                             int worker) {
  if (worker < kTileKeys) key_table[worker] = stage_table[worker];
  StagedPiece staged[kWgPiecesPerWorker];
  int table[kWgPiecesPerWorker];
#pragma unroll
  for (int j = 0; j < kWgPiecesPerWorker; ++j) {
    const int job = worker + j * kWgGroupThreads;
    const int key = job / kNopePiecesPerKey;
    table[j] = stage_table[key];
    staged[j] = load_staged_piece(stage + key * kStageStride, job % kNopePiecesPerKey);
  }
#pragma unroll
  for (int j = 0; j < kWgPiecesPerWorker; ++j) {
    const int job = worker + j * kWgGroupThreads;
    const int key = job / kNopePiecesPerKey;
    const int piece = job % kNopePiecesPerKey;
    uint4 low, high;
    decode_nope_piece(staged[j], table[j], tables, ocp_tables, low, high);
    store_piece(piece, reinterpret_cast<uint4*>(tile + swizzled_chunk_offset(key, 2 * piece, kWgKeyPlaneBytes)),
                reinterpret_cast<uint4*>(tile + swizzled_chunk_offset(key, 2 * piece + 1, kWgKeyPlaneBytes)), low,
                high);
  }
#pragma unroll
  for (int job = worker; job < kTileKeys * kRopePiecesPerKey; job += kWgGroupThreads) {
    const int key = job / kRopePiecesPerKey;
    const int piece = job % kRopePiecesPerKey;
    *reinterpret_cast<uint4*>(tile + swizzled_chunk_offset(key, ds_mla::kNopeDim / kPieceDims + piece,
                                                           kWgKeyPlaneBytes)) =
        staged_rope(stage + key * kStageStride, stage_table[key], piece);
  }
}


// Scores of the consumer group's 16 keys of a tile: S[64 x 16] = Q K^T over the 512 dims (32 steps of 16).
DSV4_DEVICE void issue_scores(float (&s)[8], uint32_t q_tile, uint32_t key_tile, int group) {
  const uint64_t q_descriptor = swizzled_tile_descriptor(q_tile);
  const uint64_t key_descriptor = swizzled_tile_descriptor(key_tile + group * kWgScoreKeys * 128);
  pin_registers(s);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kDim / 16; ++step) {
    const uint32_t k_offset = static_cast<uint32_t>((step % 4) * 32);  // 16 dims along the 128-byte row
    wgmma_m64n16k16_bf16(s, descriptor_advanced(q_descriptor, (step / 4) * kWgQPlaneBytes + k_offset),
                         descriptor_advanced(key_descriptor, (step / 4) * kWgKeyPlaneBytes + k_offset),
                         step > 0 ? 1u : 0u);
  }
  wgmma_commit();
}

// O[64 x 256] += P[64 x 32] V[32 x 256] for the consumer group's dims (two steps of 16 keys).
DSV4_DEVICE void issue_values(float (&o)[128], uint32_t prob_tile, uint32_t key_tile, int group) {
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kTileKeys / 16; ++step) {
    wgmma_m64n256k16_bf16_b_mn_major(
        o, swizzled64_tile_descriptor(prob_tile + step * 32),
        mn_major_swizzled_descriptor(key_tile + group * (kWgOutDims / kWgPlaneDims) * kWgKeyPlaneBytes +
                                         step * 16 * 128,
                                     kWgKeyPlaneBytes),
        1u);
  }
  wgmma_commit();
}

// The row's key list and this split's part of it, as every kernel of the file reads them.
struct SplitKeys {
  int64_t main_begin, main_count, extra_begin, first, last;
};
DSV4_DEVICE SplitKeys split_keys(const SparseMlaDecodeArgs& args, int64_t t, int split, int splits) {
  SplitKeys k;
  k.main_begin = args.main.row_begin(t);
  k.main_count = args.main.row_end(t) - k.main_begin;
  k.extra_begin = 0;
  int64_t extra_count = 0;
  if (args.extra.bytes != nullptr) {
    k.extra_begin = args.extra.row_begin(t);
    extra_count = args.extra.row_end(t) - k.extra_begin;
  }
  const int64_t count = k.main_count + extra_count;
  // Through a shuffle from lane 0: equal in every thread anyway, and the compiler then sees the loops over
  // them warp-uniform (it keeps MMAs asynchronous only on paths it sees so).
  k.first = shuffle_from(count * split / splits, 0, kWarpSize);
  k.last = shuffle_from(count * (split + 1) / splits, 0, kWarpSize);
  return k;
}

// The producer group: records copied two tiles ahead, each tile decoded into key tile i % 3 once the
// consumers are done with the tile there before.
DSV4_DEVICE void produce_key_tiles(const SparseMlaDecodeArgs& args, const SplitKeys& k, WgmmaShared& sh,
                                   int worker) {
  for (int c = worker; c < 512; c += kWgGroupThreads) {
    sh.tables[c / 256][c % 256] =
        table_value(c < 256 ? args.main.format : args.extra.format, static_cast<uint8_t>(c % 256));
  }
  const uint32_t ocp_tables =
      (args.main.format == Fp8Format::kOCP ? 1u : 0u) | (args.extra.format == Fp8Format::kOCP ? 2u : 0u);
  const int stage_key = worker / (kWgGroupThreads / kTileKeys);
  const auto slot_at = [&](int64_t p) {
    return fetch_slot(args, k.main_begin, k.main_count, k.extra_begin, p + stage_key, k.last);
  };
  const auto stage_records = [&](int64_t tile, int32_t slot, int index) {
    if (tile < k.last) {
      stage_tile<kWgGroupThreads>(args, k.main_count, tile, k.last, slot, sh.stage[index], sh.stage_table[index],
                                  worker);
    }
    copy_async_commit();
  };
  stage_records(k.first, slot_at(k.first), 0);
  stage_records(k.first + kTileKeys, slot_at(k.first + kTileKeys), 1);
  int32_t next_slot = slot_at(k.first + 2 * kTileKeys);
  int i = 0;
  for (int64_t tile = k.first; tile < k.last; tile += kTileKeys, ++i) {
    // Tile i's records landed (tile i + 1's may still fly) and, after the barrier, every producer thread's
    // are visible and every thread is done with tile i - 1's stage: tile i + 2's records go there.
    copy_async_wait<1>();
    named_barrier_sync(kBarrierProducer, kWgGroupThreads);
    stage_records(tile + 2 * kTileKeys, next_slot, (i + 2) % kWgStages);
    next_slot = slot_at(tile + 3 * kTileKeys);
    const int key_tile = i % kWgKeyTiles;
    if (i >= kWgKeyTiles) named_barrier_sync(kBarrierEmpty + key_tile, kWgThreads);  // P V of tile i - 3 done
    decode_staged_tile_swizzled(sh.stage[i % kWgStages], sh.stage_table[i % kWgStages], sh.keys[key_tile],
                                sh.key_table[key_tile], sh.tables, ocp_tables, worker);
    fence_shared_writes_for_wgmma();
    named_barrier_arrive(kBarrierFull + key_tile, kWgThreads);
  }
}
#endif

__global__ void __launch_bounds__(kWgThreads, 1) sparse_mla_wgmma_kernel(SparseMlaDecodeArgs args) {
  // Launched to overlap the kernel before (launch_overlapping): nothing is read or written before its end.
  wait_for_previous_kernel();
#if defined(DSV4_WGMMA)
  DSV4_DYNAMIC_SHARED(unsigned char, wg_shared, 1024);
  const uint32_t shared_raw = shared_window_address(wg_shared);
  const uint32_t padding = swizzle_atom_aligned(shared_raw) - shared_raw;
  WgmmaShared& sh = *reinterpret_cast<WgmmaShared*>(wg_shared + padding);
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kWgHeads;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const SplitKeys k = split_keys(args, t, split, splits);
  const int group = shuffle_from(tid / kWgGroupThreads, 0, kWarpSize);  // warp-uniform to the compiler as well
  if (group == 2) {
    produce_key_tiles(args, k, sh, tid - kWgConsumerThreads);
    return;
  }
  const int lane = tid % kWarpSize;
  const int row0 = 16 * ((tid / kWarpSize) % 4) + lane / 4;  // this thread's head rows: row0 and row0 + 8
  const int quad = lane % 4;
  const uint32_t q_tile = shared_window_address(sh.q);

  {  // Q into its swizzled tile (heads >= H: zeros)
    const uint16_t* q_row = args.q + t * args.q_token_stride;
    const bool aligned = is_aligned(q_row, 16) && args.q_head_stride % 8 == 0;
    for (int c = tid; c < kWgHeads * kDim / 8; c += kWgConsumerThreads) {  // head row c / 64, dims 8 (c % 64)
      const int row = c / (kDim / 8);
      const int chunk = c % (kDim / 8);
      const int64_t head = h0 + row;
      const uint16_t* src = q_row + head * args.q_head_stride + chunk * 8;
      const uint32_t offset = swizzled_chunk_offset(row, chunk, kWgQPlaneBytes);
      if (aligned) {
        copy_async_16_or_zeros(q_tile + offset, head < args.heads ? src : q_row, head < args.heads);
      } else {
        uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (head < args.heads) {
          for (int e = 0; e < 8; ++e) v[e] = src[e];
        }
        *reinterpret_cast<uint4*>(sh.q + offset) = *reinterpret_cast<const uint4*>(v);
      }
    }
    copy_async_commit();
    copy_async_wait<0>();
    fence_shared_writes_for_wgmma();
    named_barrier_sync(kBarrierScores, kWgConsumerThreads);
  }

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.0f;
  float s[8];
  float m[2] = {-FLT_MAX, -FLT_MAX};
  float l[2] = {0.0f, 0.0f};  // this thread's part of each row's sum: its own keys
  // Every wait is for all groups: the compiler keeps the MMAs asynchronous only where it can see that no
  // accumulator is touched while its MMA runs.
  int i = 0;
  for (int64_t tile = k.first; tile < k.last; tile += kTileKeys, ++i) {
    const int key_tile = i % kWgKeyTiles;
    // 1. QK(i) once the producer has decoded tile i; then S(i) and PV(i - 1) done, which frees the key tile
    //    of tile i - 1 for tile i + 2 (both groups' arrivals count).
    named_barrier_sync(kBarrierFull + key_tile, kWgThreads);
    issue_scores(s, q_tile, shared_window_address(sh.keys[key_tile]), group);
    wgmma_wait<0>();
    pin_registers(s);
    pin_registers(o);
    if (i >= 1 && tile + 2 * kTileKeys < k.last) {
      named_barrier_arrive(kBarrierEmpty + (i - 1) % kWgKeyTiles, kWgThreads);
    }
    // 2. Scores scaled, missing keys -inf, the row maxima exchanged.
    float sc[8];
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = group * kWgScoreKeys + 8 * (j / 4) + 2 * quad + (j % 2);
      sc[j] = sh.key_table[key_tile][key] >= 0 ? args.scale * s[j] : -INFINITY;
      tile_max[(j / 2) % 2] = fmaxf(tile_max[(j / 2) % 2], sc[j]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], shuffle_xor(tile_max[r], 1, 4));
      tile_max[r] = fmaxf(tile_max[r], shuffle_xor(tile_max[r], 2, 4));
    }
    if (quad == 0) {
      sh.row_max[group][row0] = tile_max[0];
      sh.row_max[group][row0 + 8] = tile_max[1];
    }
    named_barrier_sync(kBarrierScores, kWgConsumerThreads);  // row maxima out; PV(i - 1) done in both groups
    // 3. P(i) in bf16, the running sums, P into its tile.
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], fmaxf(tile_max[r], sh.row_max[1 - group][row0 + 8 * r]));
      alpha[r] = expf(m[r] - m_new);
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const int r = (j / 2) % 2;
      const uint32_t pair = bf16x2(expf(sc[j] - m[r]), expf(sc[j + 1] - m[r]));
      sum[r] += bf16_bits_to_float(static_cast<uint16_t>(pair & 0xffffu)) +
                bf16_bits_to_float(static_cast<uint16_t>(pair >> 16));
      const int row = row0 + 8 * r;
      const int chunk = 2 * group + j / 4;  // keys [8 chunk, +8) of the row
      *reinterpret_cast<uint32_t*>(sh.probs + row * kWgProbRowBytes + ((chunk ^ ((row >> 1) & 3)) * 16) +
                                   4 * quad) = pair;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
    fence_shared_writes_for_wgmma();
    named_barrier_sync(kBarrierProbs, kWgConsumerThreads);  // P(i) complete
    // 4. PV(i).
#pragma unroll
    for (int j = 0; j < 128; ++j) o[j] *= alpha[(j / 2) % 2];
    issue_values(o, shared_window_address(sh.probs), shared_window_address(sh.keys[key_tile]), group);
  }
  wgmma_wait<0>();
  pin_registers(o);

  // Each row's sum: the quad's parts, then the two groups'.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += shuffle_xor(l[r], 1, 4);
    l[r] += shuffle_xor(l[r], 2, 4);
  }
  if (quad == 0) {
    sh.row_l[group][row0] = l[0];
    sh.row_l[group][row0 + 8] = l[1];
  }
  named_barrier_sync(kBarrierScores, kWgConsumerThreads);
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = sh.row_l[0][row0 + 8 * r] + sh.row_l[1][row0 + 8 * r];

  // Accumulator j of this thread: head row row0 + 8 ((j / 2) % 2), dim 256 group + 8 (j / 4) + 2 quad + j % 2.
  // The block's 64 result rows leave through shared memory, so that global memory sees whole 16-byte chunks
  // of rows (two-byte stores scattered over 8 rows a warp, and a division per value, took a fifth of the
  // call at 20 tiles a row: 100 -> 78 us on the H200). Q's tile and the key tiles hold them: every product of
  // both groups is done (the barrier above) and the producer has nothing left to write.
  const int dim0 = group * kWgOutDims + 2 * quad;
  uint8_t* const staging = sh.q;
  if (splits == 1) {
    // One split: sink, normalization, inverse RoPE, bf16 (the kernel above's epilogue) into a [64 x 512]
    // bf16 tile (16-byte chunk c of row r at c ^ (r % 8): a warp's 8 rows on distinct banks).
    const int64_t rope_row = args.inverse_rope ? args.rope.row_of(t) : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      const int64_t head = h0 + row;
      const SinkFold fold = fold_sink(head_sink(args, head), m[r], l[r]);
      const float factor = fold.weight / fold.denominator;
#pragma unroll
      for (int n = 0; n < kWgOutDims / 8; ++n) {
        float a = fold.empty ? 0.0f : o[4 * n + 2 * r] * factor;
        float b = fold.empty ? 0.0f : o[4 * n + 2 * r + 1] * factor;
        const int dim = dim0 + 8 * n;
        if (args.inverse_rope && dim >= ds_mla::kNopeDim) {
          const int pair = (dim - ds_mla::kNopeDim) / 2;
          rope_unrotate_pair(a, b, args.rope.value(rope_row, pair),
                             args.rope.value(rope_row, ds_mla::kRopeDim / 2 + pair));
        }
        const int chunk = dim / 8;
        *reinterpret_cast<uint32_t*>(staging + row * kWgOutRowBytes + ((chunk ^ (row % 8)) * 16) + 4 * quad) =
            float_to_bf16_bits(a) | (static_cast<uint32_t>(float_to_bf16_bits(b)) << 16);
      }
    }
    named_barrier_sync(kBarrierScores, kWgConsumerThreads);
    const bool aligned = is_aligned(args.out, 16) && args.out_token_stride % 8 == 0 && args.out_head_stride % 8 == 0;
    for (int c = tid; c < kWgHeads * kWgOutChunks; c += kWgConsumerThreads) {
      const int row = c / kWgOutChunks;
      const int chunk = c % kWgOutChunks;
      const int64_t head = h0 + row;
      if (head >= args.heads) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(staging + row * kWgOutRowBytes + ((chunk ^ (row % 8)) * 16));
      uint16_t* dst = args.out + t * args.out_token_stride + head * args.out_head_stride + chunk * 8;
      if (aligned) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        for (int e = 0; e < 8; ++e) dst[e] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
      }
    }
    return;
  }
  // The split's partials (the reduce kernel's input): (m, l) per row, and the fp32 accumulators through a
  // [64 x 512] fp32 tile (16-byte chunk c of row r at c ^ 2 (r % 8)) to the block's 64 consecutive rows.
  const int64_t row_base = (t * splits + split) * args.heads;
  float* acc_out = args.partials;
  float* ml_out = args.partials + args.tokens * splits * args.heads * kDim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
#pragma unroll
    for (int n = 0; n < kWgOutDims / 8; ++n) {
      const int chunk = (dim0 + 8 * n) / 4;
      *reinterpret_cast<float2*>(staging + row * kWgPartialRowBytes + ((chunk ^ (2 * (row % 8))) * 16) +
                                 8 * (quad % 2)) = make_float2(o[4 * n + 2 * r], o[4 * n + 2 * r + 1]);
    }
    const int64_t head = h0 + row;
    if (group == 0 && quad == 0 && head < args.heads) {
      ml_out[(row_base + head) * 2] = m[r];
      ml_out[(row_base + head) * 2 + 1] = l[r];
    }
  }
  named_barrier_sync(kBarrierScores, kWgConsumerThreads);
  for (int c = tid; c < kWgHeads * kWgPartialChunks; c += kWgConsumerThreads) {
    const int row = c / kWgPartialChunks;
    const int chunk = c % kWgPartialChunks;
    const int64_t head = h0 + row;
    if (head >= args.heads) continue;
    *reinterpret_cast<float4*>(acc_out + (row_base + head) * kDim + chunk * 4) =
        *reinterpret_cast<const float4*>(staging + row * kWgPartialRowBytes + ((chunk ^ (2 * (row % 8))) * 16));
  }
#endif
}
#endif  // !__HIPCC__

// One block per (t, head). The splits' (m, l) are read once, in parallel, into shared memory; every
// thread then folds them in split order (the same order and arithmetic as a serial loop) and sums its 4
// dims of the splits' accumulators with several loads in flight: at T = 1 a serial chain of 36 global
// loads per step would cost more than the partial kernel itself.
__global__ void __launch_bounds__(kReduceThreads) sparse_mla_reduce_kernel(SparseMlaDecodeArgs args) {
  __shared__ float split_m[kMaxSplits];
  __shared__ float split_l[kMaxSplits];
  wait_for_previous_kernel();  // the partial kernel's results (a launch overlapping its end)
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int d0 = threadIdx.x * 4;
  const int splits = args.num_splits;
  const float* acc_in = args.partials;
  const float* ml_in = args.partials + args.tokens * splits * args.heads * kDim;
  if (static_cast<int>(threadIdx.x) < splits) {
    const int64_t row = (t * splits + threadIdx.x) * args.heads + h;
    split_m[threadIdx.x] = ml_in[row * 2];
    split_l[threadIdx.x] = ml_in[row * 2 + 1];
  }
  __syncthreads();
  const float sink = head_sink(args, h);
  float m_all = sink;
  for (int s = 0; s < splits; ++s) m_all = fmaxf(m_all, split_m[s]);
  float denominator = expf(sink - m_all);
  float out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
  for (int s = 0; s < splits; ++s) {
    const int64_t row = (t * splits + s) * args.heads + h;
    const float weight = expf(split_m[s] - m_all);
    denominator += weight * split_l[s];
    const float4 a = *reinterpret_cast<const float4*>(acc_in + row * kDim + d0);
    out[0] += weight * a.x;
    out[1] += weight * a.y;
    out[2] += weight * a.z;
    out[3] += weight * a.w;
  }
  const bool empty = reduced_row_is_empty(denominator, sink);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = empty ? 0.0f : out[i] / denominator;
  if (args.inverse_rope && d0 >= ds_mla::kNopeDim) {
    const int64_t rope_row = args.rope.row_of(t);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int pair = (d0 - ds_mla::kNopeDim) / 2 + i;
      rope_unrotate_pair(out[2 * i], out[2 * i + 1], args.rope.value(rope_row, pair),
                         args.rope.value(rope_row, ds_mla::kRopeDim / 2 + pair));
    }
  }
  uint16_t* out_row = args.out + t * args.out_token_stride + h * args.out_head_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) out_row[d0 + i] = float_to_bf16_bits(out[i]);
}

#endif  // DSV4_GPU_COMPILER

// Heads per partial block: 32 (two groups sharing each decoded tile) on NVIDIA when H > 16, except for the
// smallest batches: with at most 16 (token, 16-head) blocks the split count supplies the parallelism and
// a block's latency decides the time, and a one-group block finishes its tiles sooner (H200, T = 1, 64 or
// 128 heads: 12.0-13.5 us against 15.2-16.8 at 192-640 keys a row; at T = 8, 128 heads, one group was
// slower: 58.8 us against 52.4). The AMD targets keep one group: two would exceed gfx942's 64 KB of LDS.
constexpr int64_t kMaxOneGroupBlocks = 16;

// The most splits the automatic choice takes: spec §4 bounds it at 16 on gfx942 and 32 on gfx950 (whose
// partials traffic and reduce the H200-fitted model below does not describe).
int max_auto_splits() {
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
  return device_matrix_units_read_fnuz() ? 16 : 32;  // FNUZ matrix units: gfx942
#else
  return kMaxAutoSplits;
#endif
}

int heads_per_block(int64_t tokens, int64_t heads) {
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
  (void)tokens, (void)heads;
  return kHeadsPerBlock;
#else
  if (heads <= kHeadsPerBlock) return kHeadsPerBlock;
  const int64_t one_group_blocks = tokens * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return one_group_blocks <= kMaxOneGroupBlocks ? kHeadsPerBlock : 2 * kHeadsPerBlock;
#endif
}

template <int kGroups>
LaunchStatus launch_partial(const SparseMlaDecodeArgs& args, hipStream_t stream) {
#if DSV4_GPU_COMPILER
  constexpr int kRows = kGroups * kHeadsPerBlock;
  const size_t shared_bytes = sizeof(Shared<kGroups>);
#if !defined(__HIPCC__)
  if (!allow_dynamic_shared_memory<sparse_mla_partial_kernel<kGroups>>(shared_bytes)) {
    return LaunchStatus::kLaunchFailed;
  }
#endif
  const dim3 grid(static_cast<unsigned>(args.tokens), static_cast<unsigned>((args.heads + kRows - 1) / kRows),
                  static_cast<unsigned>(args.num_splits));
  launch_overlapping(sparse_mla_partial_kernel<kGroups>, grid, dim3(kThreads), shared_bytes, stream, args);
  return last_launch_status();
#else
  (void)args, (void)stream;
  return LaunchStatus::kInvalidArgument;
#endif
}

#if !defined(__HIPCC__)
// The warpgroup-MMA kernel serves calls of more than 32 heads (it pads them to 64) with at least 32 (row,
// 64-head) blocks and rows of at least 192 keys on average, on a device that runs it. Elsewhere the 16/32-head
// kernel was as fast or faster on the H200. Measured there, both kernels in the same run (bench, graph
// replay), at 64 / 128 heads: rows of 192 keys, T = 32: 28.5 against 31.1 us (64 blocks); T = 128: 31.5
// against 54.1 and 57.6 against 100.5; rows of 384 keys, T = 32: 26.1 against 29.5 and 43.8 against 45.4;
// T = 128: 45.7 against 81.1 and 87.5 against 153.9; 640-1152 keys 1.3-1.9x. Rows of 192 keys at 32 blocks
// (64 heads, T = 32) lost (28.7 against 25.0) until its split count was fitted to the H200 (wgmma_num_splits):
// since, L2-warm, same run, 19.2 against 22.9 us (T = 48: 26.8 against 26.9). Fewer blocks or keys were not
// measured with this kernel's current form (before its epilogue went through shared memory: 64 heads at T = 8
// 20.6 us against 19.1, T = 1 14.6 against 11.2; 16 heads T = 128 86.6 against 50.7).
constexpr int64_t kWgMinHeads = 33;
constexpr int64_t kWgMinBlocks = 32;
constexpr int64_t kWgMinKeysPerRow = 192;

bool sparse_mla_uses_wgmma(const SparseMlaDecodeArgs& args) {
  if (args.heads < kWgMinHeads || args.tokens <= 0) return false;
  const int64_t keys = args.main.index_count + (args.extra.bytes != nullptr ? args.extra.index_count : 0);
  const int64_t blocks = args.tokens * ((args.heads + kWgHeads - 1) / kWgHeads);
  return blocks >= kWgMinBlocks && keys >= kWgMinKeysPerRow * args.tokens && device_runs_wgmma();
}

// Its split count: one block a multiprocessor (its shared memory), so the least modelled time of
// ceil(blocks * splits / multiprocessors) rounds of (a block's fixed cost + its tiles), plus the reduce and
// the partials for several splits. The block and tile costs are the H200's (64 heads, T = 128, one split:
// ~14 us a block besides ~2.5 us a 32-key tile). Against the earlier guesses (3 us, 1.3 us) they split more
// where rows are short, each choice measured faster (H200, L2-warm, one split count against the other):
// T = 32 rows of 512 keys at 128 heads 52.0 -> 38.6 us (2 splits, was 1), of 384 keys 42.1 -> 32.5; T = 64
// rows of 512 keys at 64 heads 52.4 -> 39.0 us (2, was 1); T = 24 / 48 rows of 384 keys 42.6 -> 30.0 and
// 42.2 -> 30.3 us; T = 32 rows of 384 keys at 64 heads 24.8 -> 24.1 us (4, was 3).
int wgmma_num_splits(const SparseMlaDecodeArgs& args) {
  const int64_t blocks = args.tokens * ((args.heads + kWgHeads - 1) / kWgHeads);
  const int64_t multiprocessors = device_multiprocessors();
  if (blocks >= multiprocessors) return 1;
  constexpr double kBlockFixedNs = 14000;
  constexpr double kTileNs = 2500;
  constexpr double kReduceNs = 2500;
  constexpr double kPartialRowNs = 1.0;
  const int64_t keys = args.main.index_count + (args.extra.bytes != nullptr ? args.extra.index_count : 0);
  const int64_t per_row = (keys + args.tokens - 1) / args.tokens;
  const int64_t tiles = (per_row + kTileKeys - 1) / kTileKeys;
  const int64_t max_splits = tiles < 1 ? 1 : (tiles > kMaxAutoSplits ? kMaxAutoSplits : tiles);
  const int64_t padded_heads = (args.heads + kWgHeads - 1) / kWgHeads * kWgHeads;
  int64_t best = 1;
  double best_cost = -1;
  for (int64_t splits = 1; splits <= max_splits; ++splits) {
    const int64_t rounds = (blocks * splits + multiprocessors - 1) / multiprocessors;
    double cost = static_cast<double>(rounds) *
                  (kBlockFixedNs + kTileNs * static_cast<double>((tiles + splits - 1) / splits));
    if (splits > 1) cost += kReduceNs + kPartialRowNs * static_cast<double>(args.tokens * padded_heads * splits);
    if (best_cost < 0 || cost < best_cost) {
      best = splits;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

LaunchStatus launch_wgmma_partial(const SparseMlaDecodeArgs& args, hipStream_t stream) {
  if (!allow_dynamic_shared_memory<sparse_mla_wgmma_kernel>(kWgSharedBytes)) return LaunchStatus::kLaunchFailed;
  const dim3 grid(static_cast<unsigned>(args.tokens), static_cast<unsigned>((args.heads + kWgHeads - 1) / kWgHeads),
                  static_cast<unsigned>(args.num_splits));
  launch_overlapping(sparse_mla_wgmma_kernel, grid, dim3(kWgThreads), kWgSharedBytes, stream, args);
  return last_launch_status();
}
#endif

}  // namespace

int sparse_mla_decode_num_splits(const SparseMlaDecodeArgs& args, int requested) {
  if (requested > 0) return requested;
  if (args.tokens <= 0 || args.heads <= 0) return 1;
#if !defined(__HIPCC__)
  if (sparse_mla_uses_wgmma(args)) return wgmma_num_splits(args);
#endif
  const int64_t rows_per_block = heads_per_block(args.tokens, args.heads);
  const int64_t blocks = args.tokens * ((args.heads + rows_per_block - 1) / rows_per_block);
  const int64_t multiprocessors = device_multiprocessors();
  // Resident partial blocks: two a multiprocessor on NVIDIA (registers and shared memory allow it), one
  // on the AMD targets (57 KB of LDS each).
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
  constexpr int64_t kResidentPerMultiprocessor = 1;
  constexpr double kSharedSlowdown = 1.0;  // blocks beyond one a multiprocessor run in later waves
#else
  constexpr int64_t kResidentPerMultiprocessor = 2;
  // Two blocks on one multiprocessor each take ~1.3x as long as a block alone, so a second block pays
  // only when it saves more (H200, T = 1, 128 heads, 1152 keys: 18 splits, 144 blocks, 18.0 us against
  // 16.1 at 16 splits, 128 blocks; T = 8: 8 splits, 256 blocks, 39.3 us against 44.2 at 4).
  constexpr double kSharedSlowdown = 1.3;
#endif
  if (blocks >= kResidentPerMultiprocessor * multiprocessors) return 1;
  // The split count with the least modelled time: the busiest multiprocessor's blocks times (a block's
  // fixed cost: the first loads, Q, the partial write; plus its tiles and keys), plus for several splits
  // the reduce (its loop over the splits) and the fp32 partials written and read back (one 2 KB row per
  // token, head and split). The constants fit H200 sweeps of 1 to 36 splits at T = 1, 8, 32 and 128
  // (8 to 128 heads, 192 to 1152 keys a row); 32-head blocks spend 1.15x a 16-head block's time a tile.
  // Ties go to fewer splits. The average keys per row stands in for every row's.
  constexpr double kBlockFixedNs = 5000;
  constexpr double kTileNs = 500;
  constexpr double kKeyNs = 70;
  constexpr double kTwoGroupScale = 1.15;
  constexpr double kSplitNs = 100;
  constexpr double kPartialRowNs = 0.2;
  const int64_t padded_heads = (args.heads + rows_per_block - 1) / rows_per_block * rows_per_block;
  const int64_t keys = args.main.index_count + (args.extra.bytes != nullptr ? args.extra.index_count : 0);
  const int64_t per_row = (keys + args.tokens - 1) / args.tokens;
  int64_t max_splits = (per_row + kKeysPerSplitMin - 1) / kKeysPerSplitMin;
  const int64_t cap = max_auto_splits();
  max_splits = max_splits > cap ? cap : (max_splits < 1 ? 1 : max_splits);
  int64_t best = 1;
  double best_cost = -1;
  for (int64_t splits = 1; splits <= max_splits; ++splits) {
    const int64_t per_multiprocessor = (blocks * splits + multiprocessors - 1) / multiprocessors;
    const double crowding = per_multiprocessor == 1
                                ? 1.0
                                : kSharedSlowdown * static_cast<double>(per_multiprocessor) /
                                      static_cast<double>(kResidentPerMultiprocessor);
    const int64_t split_keys = (per_row + splits - 1) / splits;
    const int64_t tiles = (split_keys + kTileKeys - 1) / kTileKeys;
    double work = kTileNs * static_cast<double>(tiles) + kKeyNs * static_cast<double>(split_keys);
    if (rows_per_block == 2 * kHeadsPerBlock) work *= kTwoGroupScale;
    double cost = crowding * (kBlockFixedNs + work);
    if (splits > 1) {
      cost += kSplitNs * static_cast<double>(splits) +
              kPartialRowNs * static_cast<double>(args.tokens * padded_heads * splits);
    }
    if (best_cost < 0 || cost < best_cost) {
      best = splits;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

int64_t sparse_mla_workspace_floats(const SparseMlaDecodeArgs& args) {
  return args.num_splits > 1 ? args.tokens * args.num_splits * args.heads * (kDim + 2) : 0;
}

LaunchStatus launch_sparse_mla_decode(const SparseMlaDecodeArgs& args, void* stream) {
  if (args.tokens < 0 || args.heads <= 0 || args.num_splits < 1 || args.num_splits > kMaxSplits ||
      args.tokens > 0x7fffffff || args.heads > 65535 || (args.num_splits > 1 && args.partials == nullptr)) {
    return LaunchStatus::kInvalidArgument;
  }
  if (args.tokens == 0) return LaunchStatus::kOk;
  auto hip_stream = static_cast<hipStream_t>(stream);
#if DSV4_SPARSE_MLA_MFMA_LAYOUT
  const LaunchStatus partial = launch_partial<1>(args, hip_stream);
#else
  const LaunchStatus partial = sparse_mla_uses_wgmma(args) ? launch_wgmma_partial(args, hip_stream)
                               : heads_per_block(args.tokens, args.heads) == 2 * kHeadsPerBlock
                                   ? launch_partial<2>(args, hip_stream)
                                   : launch_partial<1>(args, hip_stream);
#endif
  if (partial != LaunchStatus::kOk || args.num_splits == 1) return partial;
  const dim3 reduce_grid(static_cast<unsigned>(args.tokens), static_cast<unsigned>(args.heads));
  launch_overlapping(sparse_mla_reduce_kernel, reduce_grid, dim3(kReduceThreads), 0, hip_stream, args);
  return last_launch_status();
}

}  // namespace dsv4::gpu
