// bmm_a8w8_mxscale (spec/wo_a.md §4): Y[m, g, n] = sum_kb 2^(xs - 127) * 2^(ws - 127) * sum_{k in kb} x * w,
// x [M, G, K] and w [G, N, K] FP8 with K contiguous, x_scale [M, G, K/128] and w_scale [G, N/128, K/128]
// UE8M0 bytes, fp32 accumulation, out [M, G, N] bf16 or fp32 at any M/G strides.
//
// Matrix units, per device pass:
//   NVIDIA sm_89+:  mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (OCP operands), tile 16 x 8;
//   gfx942:         v_mfma_f32_16x16x32_fp8_fp8 on FNUZ operands, tile 16 x 16;
//   gfx950:         v_mfma_scale_f32_16x16x128_f8f6f4 on OCP operands, tile 16 x 16: one instruction per
//                   128-deep K block, the unit applying both UE8M0 bytes and accumulating in fp32.
// Elsewhere (and on gfx950 for FNUZ operands) each 128-deep K block is multiplied into a fresh fp32
// fragment, which is then folded into the running fp32 sum with the block's scale 2^(xs + ws - 254)
// (exact: a power of two, spec §4.5). Operands in the other encoding than the unit's take one more factor 2
// (an FNUZ byte is worth half the OCP byte), and the codes that do not carry over (NaN, OCP -0, FNUZ +-240)
// are rewritten per fragment (to_unit_encoding).
//
// The k permutation: a lane loads 16 consecutive bytes of an x row and of a w row per 64-deep half block,
// and the products over k are matched by giving the A and B slots the same permutation of k (a dot
// product does not depend on the order of its terms). NVIDIA (lane = 4 * gid + tid): A rows gid and
// gid + 8 and B column gid take the lane's bytes [16 * tid, 16 * tid + 16) of the half; MMA s in {0, 1}
// takes bytes 8s..8s+3 as slots 4*tid..4*tid+3 and bytes 8s+4..8s+7 as slots 16+4*tid..16+4*tid+3
// (A registers 0/2, B registers 0/1). AMD (lane = 16 * q + i): A row i and B column i take bytes
// [16 q, 16 q + 16); MFMA s takes bytes 8s..8s+7 as slots 8q..8q+7; gfx950's block-scaled MFMA takes the
// lane's 16 bytes of both halves as its 32 operand bytes.
//
// Work split (256 threads a block):
//   * M <= 64 (decode: the op reads the weight once and is bound by it): bmm_kernel, split-K. A block owns
//     16 rows and 16 columns of one group (64 blocks per group and M tile for N = 1024); every warp covers
//     them over a strided share of the K blocks; the warps' fp32 sums are added in shared memory in warp
//     order (deterministic, no atomics). On NVIDIA (aligned rows, operands in the unit's encoding) each
//     lane stages the fragments of several K blocks through shared memory by cp.async (launch_staged: 2-4
//     K blocks a warp in flight, 16 or 32 rows and 16 or 32 columns a block); elsewhere fragments come
//     straight from global memory, the next K block's weight in flight in registers while one multiplies.
//   * M > 64: bmm_tiled_kernel, a 128 x 64 tile through double-buffered shared memory (below).
//   * M > 64 with rows that are not 16-byte aligned: bmm_kernel with the warps splitting a 128-wide N
//     tile, each over the whole K (element-wise loads).
//   * sm_90a, when the caller allows reduced-precision block sums: bmm_wgmma_kernel (warpgroup MMA, the
//     FP8 tensor-core path of sm_90), whose unit sums each 128-deep block in fixed point aligned to the
//     block's largest product, keeping about 14 bits (an entry whose block sums cancel heavily can be off
//     by ~2^-13 of its largest product); every block is still folded into an fp32 sum with its scales.
//     The other kernels accumulate in fp32 throughout (mma.sync.e4m3 runs as f16 MMAs on sm_90).
//   * sm_90a, fp32 sums (the default), from 33 rows where its tiles fill the GPU (below): bmm_wgmma_f16_kernel,
//     f16 wgmma (every e4m3 value is exact in f16; the unit sums in fp32 as the mma.sync path does) with A
//     converted in registers and B through an f16 copy in shared memory; where the rows' block scales allow
//     it exactly, A carries them and the whole K sums in one fp32 accumulator. About 460 TFLOP/s on the H200
//     at its 256 x 128 tiles (one block of 8 warps per SM): the f16 B operand's reads by the unit plus the
//     staging and conversion traffic come near the shared-memory bandwidth, 8 warps hide little latency, and
//     the f16 multiplies that carry the scales in A cost 8-10% (measured by leaving them out; the profiler
//     counts f16 math and the tensor unit as one shared pipe), where leaving out the conversions costs none.
//     Its 64 x 64 tiles (where the larger ones are too few) split K over a thread block cluster of two blocks,
//     which add their sums through distributed shared memory in rank order (deterministic, no workspace):
//     a 64 x 64 block's one warp group issues about one instruction in 4 cycles on its own (the conversions'
//     dependent chains), so two blocks an SM on half of K each go faster than one on all of it.
// Rows past M load zeros and are not stored. 64-bit offsets throughout.
#include <type_traits>

#include "dsv4/async_copy.h"
#include "dsv4/bf16.h"
#include "dsv4/fp8x2.h"
#include "dsv4/launch.h"
#include "dsv4/ue8m0.h"
#include "dsv4/wgmma.h"
#include "wo_a_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockK = 128;
constexpr int kHalfK = 64;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DSV4_WO_A_MMA_NV 1
#elif defined(__gfx942__) || defined(__gfx950__)
#define DSV4_WO_A_MFMA 1
#endif

#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
constexpr int kTileN = 16;     // MFMA 16x16x32
constexpr int kLaneRows = 4;   // accumulator rows per lane and M tile
#else
constexpr int kTileN = 8;      // mma m16n8k32
constexpr int kLaneRows = 2;
#endif
constexpr int kWarps = kThreads / kWarpSize;

struct Frag16 {
  uint32_t u[4];
};

template <bool kVector>
DSV4_DEVICE Frag16 load16(const uint8_t* p) {
  Frag16 f;
  if constexpr (kVector) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    f.u[0] = v.x;
    f.u[1] = v.y;
    f.u[2] = v.z;
    f.u[3] = v.w;
  } else {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      f.u[w] = static_cast<uint32_t>(p[4 * w]) | (static_cast<uint32_t>(p[4 * w + 1]) << 8) |
               (static_cast<uint32_t>(p[4 * w + 2]) << 16) | (static_cast<uint32_t>(p[4 * w + 3]) << 24);
    }
  }
  return f;
}

// c += A * B over the 32 k slots of sub-step s (s = 0, 1) of a half block (see the file comment).
// NVIDIA: a_lo = row gid, a_hi = row gid + 8. AMD: a_lo = row i (a_hi unused).
DSV4_DEVICE void mma_step(float* c, const Frag16& a_lo, const Frag16& a_hi, const Frag16& b, int s) {
#if defined(DSV4_WO_A_MMA_NV)
  ptx::mma_m16n8k32_e4m3(*reinterpret_cast<float(*)[4]>(c),
                         {a_lo.u[2 * s], a_hi.u[2 * s], a_lo.u[2 * s + 1], a_hi.u[2 * s + 1]},
                         {b.u[2 * s], b.u[2 * s + 1]});
#elif defined(DSV4_WO_A_MFMA)
  typedef float Float4 __attribute__((ext_vector_type(4)));
  (void)a_hi;
  const long a = static_cast<long>((static_cast<uint64_t>(a_lo.u[2 * s + 1]) << 32) | a_lo.u[2 * s]);
  const long bb = static_cast<long>((static_cast<uint64_t>(b.u[2 * s + 1]) << 32) | b.u[2 * s]);
  Float4 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, bb, acc, 0, 0, 0);
  c[0] = acc[0];
  c[1] = acc[1];
  c[2] = acc[2];
  c[3] = acc[3];
#else
  (void)c;
  (void)a_lo;
  (void)a_hi;
  (void)b;
  (void)s;
#if DSV4_DEVICE_PASS
  device_trap();  // no FP8 matrix unit in this device pass; the launcher is never reached there
#endif
#endif
}

// 2^e exactly, e in [-149, 127].
DSV4_DEVICE float pow2i(int e) {
  return e >= -126 ? bits_float(static_cast<uint32_t>(e + 127) << 23) : bits_float(1u << (e + 149));
}

// Operands in the other encoding than the unit's (an FNUZ operand on an OCP unit: NVIDIA, gfx950; an OCP
// operand on gfx942's FNUZ unit). Their bytes go to the unit as they are, worth twice or half their value
// (encoding_shift), except the codes that do not carry over, which mma_step_foreign rewrites per step:
//   * FNUZ unit reading OCP: -0 (0x80) would be FNUZ NaN and becomes 0x00; OCP NaN (0x7F, 0xFF) becomes
//     FNUZ NaN (0x80) -- exactly ocp_byte_to_fnuz_byte, four bytes at a time.
//   * OCP unit reading FNUZ: FNUZ NaN (0x80) would be OCP -0 and becomes OCP NaN (0x7F). +-240 (0x7F,
//     0xFF) would be OCP NaN, and its doubled value +-480 is past OCP's largest, 448: the main word takes
//     +-448 (0x7E, 0xFE) and a fix word the remaining +-32 (0x60, 0xE0), zero elsewhere; a warp whose
//     fragments hold any such byte adds the fix products (rare: the step costs one extra MMA or three).
// Byte masks of a 32-bit word: 0x80 in each byte that is 0x80 / whose magnitude bits are all ones.
DSV4_DEVICE uint32_t bytes_equal_0x80(uint32_t w) { return zero_byte_flags(w ^ 0x80808080u); }
DSV4_DEVICE uint32_t bytes_magnitude_0x7f(uint32_t w) { return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; }
// (mask >> 7) * byte: byte in each marked byte of the word (no carries: one bit per byte).
DSV4_DEVICE uint32_t spread(uint32_t mask, uint32_t byte) { return (mask >> 7) * byte; }

struct UnitWord {
  uint32_t main;
  uint32_t fix;
};

DSV4_DEVICE UnitWord to_unit_encoding(uint32_t w) {
#if defined(__gfx942__)
  const uint32_t negative_zero = bytes_equal_0x80(w);
  const uint32_t nan = bytes_magnitude_0x7f(w);
  return {(w & ~spread(negative_zero | nan, 0xFFu)) | nan, 0u};
#else
  const uint32_t nan = bytes_equal_0x80(w);
  const uint32_t largest = bytes_magnitude_0x7f(w);
  return {(w ^ spread(nan, 0xFFu)) - spread(largest, 1u), spread(largest, 0x60u) | (w & largest)};
#endif
}

#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
DSV4_DEVICE bool warp_any(bool predicate) { return __any(predicate); }
#else
DSV4_DEVICE bool warp_any(bool predicate) { return __any_sync(0xffffffffu, predicate); }
#endif

// The factors f1 * f2 = 2^(xs + ws - 254 + shift), each exact; NaN when either byte is the E8M0 NaN.
struct BlockScale {
  float f1;
  float f2;
};

DSV4_DEVICE BlockScale block_scale(uint32_t xs, uint32_t ws, int shift) {
  const int e = static_cast<int>(xs) + static_cast<int>(ws) - 254 + shift;
  int e1 = e < -126 ? -126 : (e > 127 ? 127 : e);
  int e2 = e - e1;
  e2 = e2 < -149 ? -149 : (e2 > 127 ? 127 : e2);
  const bool nan = xs == kUe8m0NaN || ws == kUe8m0NaN;
  return {nan ? bits_float(0x7fc00000u) : pow2i(e1), pow2i(e2)};
}

// mma_step for operands that may be in the other encoding than the unit's (x_foreign / w_foreign: which
// are; see to_unit_encoding). Warp-uniform flags: the fix products are warp-wide MMAs.
DSV4_DEVICE void mma_step_foreign(float* c, const Frag16& a_lo, const Frag16& a_hi, const Frag16& b, int s,
                                  bool x_foreign, bool w_foreign) {
  Frag16 main_a_lo = a_lo, main_a_hi = a_hi, main_b = b;
  Frag16 fix_a_lo{}, fix_a_hi{}, fix_b{};
  uint32_t a_fix_bits = 0, b_fix_bits = 0;
#pragma unroll
  for (int i = 2 * s; i < 2 * s + 2; ++i) {
    if (x_foreign) {
      const UnitWord lo = to_unit_encoding(a_lo.u[i]);
      const UnitWord hi = to_unit_encoding(a_hi.u[i]);
      main_a_lo.u[i] = lo.main;
      main_a_hi.u[i] = hi.main;
      fix_a_lo.u[i] = lo.fix;
      fix_a_hi.u[i] = hi.fix;
      a_fix_bits |= lo.fix | hi.fix;
    }
    if (w_foreign) {
      const UnitWord word = to_unit_encoding(b.u[i]);
      main_b.u[i] = word.main;
      fix_b.u[i] = word.fix;
      b_fix_bits |= word.fix;
    }
  }
  mma_step(c, main_a_lo, main_a_hi, main_b, s);
#if defined(__gfx942__)
  (void)fix_a_lo;
  (void)fix_a_hi;
  (void)fix_b;
  (void)a_fix_bits;
  (void)b_fix_bits;
#else
  const bool a_fix = warp_any(a_fix_bits != 0);
  const bool b_fix = warp_any(b_fix_bits != 0);
  if (a_fix) mma_step(c, fix_a_lo, fix_a_hi, main_b, s);
  if (b_fix) mma_step(c, main_a_lo, main_a_hi, fix_b, s);
  if (a_fix && b_fix) mma_step(c, fix_a_lo, fix_a_hi, fix_b, s);
#endif
}

// The unit's operand encoding against each operand's: the exponent shift of the product.
DSV4_DEVICE int encoding_shift(const BmmA8W8MxScaleArgs& args) {
#if defined(__gfx942__)
  // FNUZ unit: an OCP byte read as FNUZ is worth half.
  return (args.x_format == Fp8Format::kOCP ? 1 : 0) + (args.w_format == Fp8Format::kOCP ? 1 : 0);
#else
  // OCP unit: an FNUZ byte read as OCP is worth twice.
  return -(args.x_format == Fp8Format::kFNUZ ? 1 : 0) - (args.w_format == Fp8Format::kFNUZ ? 1 : 0);
#endif
}

// The matrix unit's encoding in this device pass (host code asks device_matrix_units_read_fnuz()).
#if defined(__gfx942__)
constexpr Fp8Format kUnitFormat = Fp8Format::kFNUZ;
#else
constexpr Fp8Format kUnitFormat = Fp8Format::kOCP;
#endif

// gfx950's block-scaled MFMA multiplies a whole 128-deep K block and applies both scale bytes itself, so
// operands in the unit's encoding need no software fold there (a foreign operand's encoding shift and
// rewritten codes keep the fold).
#if defined(__gfx950__)
constexpr bool kUnitAppliesBlockScales = true;
#else
constexpr bool kUnitAppliesBlockScales = false;
#endif

// c += 2^(xs - 127) * 2^(ws - 127) * (the products of one 128-deep K block), gfx950 only:
// v_mfma_scale_f32_16x16x128_f8f6f4 with both operands e4m3 (format code 0). A lane's 32 operand bytes are
// its 16-byte fragments of the block's two halves, in the same order for A and B (the k permutation of the
// file comment). The unit reads one E8M0 byte per lane, for A row / B column lane % 16 and k group lane / 16;
// the four k groups of a row share the block's byte. fp32 accumulation; a 255 (NaN) byte gives NaN.
DSV4_DEVICE void mma_block_scaled(float* c, const Frag16& a_half0, const Frag16& a_half1, const Frag16& b_half0,
                                  const Frag16& b_half1, uint32_t xs, uint32_t ws) {
#if defined(__gfx950__)
  typedef int Int8 __attribute__((ext_vector_type(8)));
  typedef float Float4 __attribute__((ext_vector_type(4)));
  const Int8 a = {static_cast<int>(a_half0.u[0]), static_cast<int>(a_half0.u[1]), static_cast<int>(a_half0.u[2]),
                  static_cast<int>(a_half0.u[3]), static_cast<int>(a_half1.u[0]), static_cast<int>(a_half1.u[1]),
                  static_cast<int>(a_half1.u[2]), static_cast<int>(a_half1.u[3])};
  const Int8 b = {static_cast<int>(b_half0.u[0]), static_cast<int>(b_half0.u[1]), static_cast<int>(b_half0.u[2]),
                  static_cast<int>(b_half0.u[3]), static_cast<int>(b_half1.u[0]), static_cast<int>(b_half1.u[1]),
                  static_cast<int>(b_half1.u[2]), static_cast<int>(b_half1.u[3])};
  // The scale bytes must come from VGPRs: from an SGPR or an inline constant the unit reads bits [30:23]
  // instead, and LLVM 20 (the device check's gfx950 compiler) still allows those operand kinds there.
  asm("" : "+v"(xs), "+v"(ws));
  Float4 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, acc, 0, 0, 0, static_cast<int>(xs), 0,
                                                        static_cast<int>(ws));
  c[0] = acc[0];
  c[1] = acc[1];
  c[2] = acc[2];
  c[3] = acc[3];
#else
  (void)c;
  (void)a_half0;
  (void)a_half1;
  (void)b_half0;
  (void)b_half1;
  (void)xs;
  (void)ws;  // never called: only gfx950 applies block scales in the unit (kUnitAppliesBlockScales)
#endif
}

// part += the products of one 64-deep half block: a, this lane's x fragments (two rows per M tile); b, its
// weight fragments (one per N tile).
template <int kMTiles, int kNTiles, bool kForeign>
DSV4_DEVICE void multiply_half(float* part, const Frag16 (&a)[kMTiles][2], const Frag16* b, bool x_foreign,
                               bool w_foreign) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        float* c = &part[(mt * kNTiles + nt) * 4];
        if constexpr (kForeign) {
          mma_step_foreign(c, a[mt][0], a[mt][1], b[nt], s, x_foreign, w_foreign);
        } else {
          mma_step(c, a[mt][0], a[mt][1], b[nt], s);
        }
      }
    }
  }
}

// 16-byte chunks a lane stages per K block on the staged path (kRing > 0): the weight fragments of its
// kNTiles N tiles and the x fragments of its two rows in each of kMTiles M tiles, for both 64-deep halves.
template <int kMTiles, int kNTiles>
constexpr int kStagedChunks = 2 * (kNTiles + 2 * kMTiles);

// kForeign: an operand may be in the other encoding than the unit's (mma_step_foreign); a separate
// instantiation, so that the common case carries none of its code or registers.
// kRing > 0 (NVIDIA, split-K, aligned rows, the unit's encoding): the fragments of kRing K blocks per warp
// go through shared memory by cp.async instead of one K block ahead in registers; see launch_staged.
template <int kMTiles, int kBlockN, bool kSplitK, bool kVector, bool kForeign, int kRing = 0>
__global__ void __launch_bounds__(kThreads) bmm_kernel(BmmA8W8MxScaleArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  constexpr int kWarpsN = kSplitK ? 1 : kWarps;
  constexpr int kWarpsK = kSplitK ? kWarps : 1;
  constexpr int kNTiles = kBlockN / (kWarpsN * kTileN);
  static_assert(kNTiles >= 1 && kNTiles * kWarpsN * kTileN == kBlockN, "N tile");
  static_assert(kBlockK % kBlockN == 0 || kBlockN % kBlockK == 0, "N tile vs scale block");
  constexpr int kAcc = kMTiles * kNTiles * 4;

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warp_n = kSplitK ? 0 : warp;
  const int warp_k = kSplitK ? warp : 0;
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
  const int frag_row = lane % 16;  // A row / B column of this lane
  const int segment = lane / 16;   // 16-byte segment of a half block
#else
  const int frag_row = lane / 4;
  const int segment = lane % 4;
#endif
  const int64_t group = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * (kMTiles * 16);
  const int64_t n_warp = static_cast<int64_t>(blockIdx.y) * kBlockN + warp_n * (kNTiles * kTileN);
  const int64_t k_blocks = args.k / kBlockK;
  const int shift = encoding_shift(args);
  const bool x_foreign = kForeign && args.x_format != kUnitFormat;
  const bool w_foreign = kForeign && args.w_format != kUnitFormat;
  constexpr bool kHardwareScales = kUnitAppliesBlockScales && !kForeign;

  // Row pointers of this lane's fragments (rows past M read row 0's... never: they are masked to zero).
  const uint8_t* x_rows[kMTiles][2];
  bool row_ok[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + mt * 16 + frag_row + 8 * h;
      row_ok[mt][h] = m < args.m && (h == 0 || kLaneRows == 2);
      x_rows[mt][h] = args.x + (row_ok[mt][h] ? m : 0) * args.x_stride_m + group * args.x_stride_g + segment * 16;
    }
  }
  const uint8_t* w_rows[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    w_rows[nt] = args.w + group * args.w_stride_g + (n_warp + nt * kTileN + frag_row) * args.w_stride_n + segment * 16;
  }
  const uint8_t* w_scale_row =
      args.w_scale + group * args.w_scale_stride_g + (n_warp / kBlockK) * args.w_scale_stride_nb;
  // The accumulator rows of this lane: NVIDIA c0,c1 row gid, c2,c3 row gid + 8; AMD c_r row 4q + r (the
  // scale bytes are addressed per K block: pointers held across the loop would cost registers).
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
  const int64_t lane_m = m0 + 4 * (lane / 16);
  constexpr int kLaneRowStep = 1;
#else
  const int64_t lane_m = m0 + lane / 4;
  constexpr int kLaneRowStep = 8;
#endif
  const uint8_t* x_scale_group = args.x_scale + group * args.x_scale_stride_g;

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  // K block kb's scale bytes: the weight's (ws) and this lane's rows' (xs; 127, a factor 1, past M): its
  // accumulator rows where the block is folded in software, its A fragment row (xs[mt][0]) where the unit
  // applies the scales.
  const auto load_block_scales = [&](int64_t kb, uint32_t& ws, uint32_t (&xs)[kMTiles][kLaneRows]) {
    ws = w_scale_row[kb];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kHardwareScales) {
        const int64_t m = m0 + mt * 16 + frag_row;
        xs[mt][0] = m < args.m ? x_scale_group[m * args.x_scale_stride_m + kb] : 127u;
      } else {
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) {
          const int64_t m = lane_m + mt * 16 + r * kLaneRowStep;
          xs[mt][r] = m < args.m ? x_scale_group[m * args.x_scale_stride_m + kb] : 127u;
        }
      }
    }
  };
  // acc += a K block's product with its scales.
  const auto fold_block = [&](const float (&part)[kAcc], uint32_t ws, const uint32_t (&xs)[kMTiles][kLaneRows]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < kLaneRows; ++r) {
        const BlockScale f = block_scale(xs[mt][r], ws, shift);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const float* c = &part[(mt * kNTiles + nt) * 4];
          float* sum = &acc[(mt * kNTiles + nt) * 4];
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
          sum[r] += (c[r] * f.f1) * f.f2;
#else
          sum[2 * r] += (c[2 * r] * f.f1) * f.f2;
          sum[2 * r + 1] += (c[2 * r + 1] * f.f1) * f.f2;
#endif
        }
      }
    }
  };

#if !defined(__HIPCC__)
  if constexpr (kRing > 0) {
    static_assert(kSplitK && kVector && !kForeign, "staged path: split-K, aligned rows, the unit's encoding");
    // Each lane copies its own fragments of kRing K blocks into its slots of shared memory and reads them
    // back itself (no barrier: a thread's completed copies are visible to it). Chunk order per K block:
    // B [half][nt], then A [half][mt][h]; lane-major, so a warp's 16-byte reads are conflict-free.
    constexpr int kChunks = kStagedChunks<kMTiles, kNTiles>;
    DSV4_DYNAMIC_SHARED(uint4, staged, 16);
    uint4* lane_slots = staged + static_cast<int64_t>(warp) * kRing * kChunks * kWarpSize + lane;
    uint32_t ws_ring[kRing];
    uint32_t xs_ring[kRing][kMTiles][kLaneRows];
    const auto issue = [&](int slot, int64_t kb) {
      if (kb < k_blocks) {
        uint4* chunk = lane_slots + slot * kChunks * kWarpSize;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            copy_async_16_stream(shared_window_address(chunk + (half * kNTiles + nt) * kWarpSize),
                                 w_rows[nt] + kb * kBlockK + half * kHalfK);
          }
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int c = 2 * kNTiles + (half * kMTiles + mt) * 2 + h;
              copy_async_16_or_zeros(shared_window_address(chunk + c * kWarpSize),
                                     x_rows[mt][h] + kb * kBlockK + half * kHalfK, row_ok[mt][h]);
            }
          }
        }
        load_block_scales(kb, ws_ring[slot], xs_ring[slot]);
      }
      copy_async_commit();  // an empty group keeps the count uniform
    };
#pragma unroll
    for (int slot = 0; slot < kRing; ++slot) issue(slot, warp_k + slot * kWarpsK);
    for (int64_t base = warp_k; base < k_blocks; base += kRing * kWarpsK) {
#pragma unroll
      for (int slot = 0; slot < kRing; ++slot) {
        const int64_t kb = base + slot * kWarpsK;
        if (kb >= k_blocks) break;
        // Groups committed: kRing + (K blocks done); at most kRing - 1 pending: this block has landed.
        copy_async_wait<kRing - 1>();
        const uint4* chunk = lane_slots + slot * kChunks * kWarpSize;
        float part[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) part[i] = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          Frag16 b[kNTiles];
          Frag16 a[kMTiles][2];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const uint4 v = chunk[(half * kNTiles + nt) * kWarpSize];
            b[nt] = Frag16{{v.x, v.y, v.z, v.w}};
          }
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4 v = chunk[(2 * kNTiles + (half * kMTiles + mt) * 2 + h) * kWarpSize];
              a[mt][h] = Frag16{{v.x, v.y, v.z, v.w}};
            }
          }
          multiply_half<kMTiles, kNTiles, kForeign>(part, a, b, x_foreign, w_foreign);
        }
        fold_block(part, ws_ring[slot], xs_ring[slot]);
        // The slot is refilled once its fragments are consumed (the MMAs above read them).
        issue(slot, kb + kRing * kWarpsK);
      }
    }
  }
#endif
  if constexpr (kRing == 0) {
    // The weight fragments of the next K block are in flight while this one is multiplied (the weight is
    // the stream that bounds small M).
    // The block's scale bytes come with them.
    Frag16 b_next[2][kNTiles];
    uint32_t ws_next = 0;
    uint32_t xs_next[kMTiles][kLaneRows];
    const auto load_b = [&](int64_t kb) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          b_next[half][nt] = load16<kVector>(w_rows[nt] + kb * kBlockK + half * kHalfK);
        }
      }
      load_block_scales(kb, ws_next, xs_next);
    };
    if (warp_k < k_blocks) load_b(warp_k);

    for (int64_t kb = warp_k; kb < k_blocks; kb += kWarpsK) {
      Frag16 b_block[2][kNTiles];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) b_block[half][nt] = b_next[half][nt];
      }
      const uint32_t ws = ws_next;
      uint32_t xs_block[kMTiles][kLaneRows];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) xs_block[mt][r] = xs_next[mt][r];
      }
      if (kb + kWarpsK < k_blocks) load_b(kb + kWarpsK);
      if constexpr (kHardwareScales) {
        Frag16 a[2][kMTiles];  // [half][mt]: AMD fragments hold one row (a_hi unused)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            a[half][mt] = row_ok[mt][0] ? load16<kVector>(x_rows[mt][0] + kb * kBlockK + half * kHalfK)
                                        : Frag16{{0u, 0u, 0u, 0u}};
          }
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            mma_block_scaled(&acc[(mt * kNTiles + nt) * 4], a[0][mt], a[1][mt], b_block[0][nt], b_block[1][nt],
                             xs_block[mt][0], ws);
          }
        }
      } else {
        float part[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) part[i] = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t k = kb * kBlockK + half * kHalfK;
          Frag16 a[kMTiles][2];
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (row_ok[mt][h]) {
                a[mt][h] = load16<kVector>(x_rows[mt][h] + k);
              } else {
                a[mt][h] = Frag16{{0u, 0u, 0u, 0u}};
              }
            }
          }
          multiply_half<kMTiles, kNTiles, kForeign>(part, a, b_block[half], x_foreign, w_foreign);
        }
        fold_block(part, ws, xs_block);
      }
    }
  }

  if constexpr (kSplitK) {
    __shared__ float partials[kWarpsK > 1 ? kWarpsK - 1 : 1][kAcc][kWarpSize];
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) partials[warp - 1][i][lane] = acc[i];
    }
    __syncthreads();
    if (warp > 0) return;
    for (int w = 0; w < kWarpsK - 1; ++w) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += partials[w][i][lane];
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
        const int64_t m = m0 + mt * 16 + 4 * (lane / 16) + i;
        const int64_t n = n_warp + nt * kTileN + lane % 16;
#else
        const int64_t m = m0 + mt * 16 + lane / 4 + 8 * (i / 2);
        const int64_t n = n_warp + nt * kTileN + 2 * (lane % 4) + (i % 2);
#endif
        if (m >= args.m) continue;
        const float value = acc[(mt * kNTiles + nt) * 4 + i];
        const int64_t offset = m * args.out_stride_m + group * args.out_stride_g + n;
        if (args.out_fp32) {
          static_cast<float*>(args.out)[offset] = value;
        } else {
          static_cast<uint16_t*>(args.out)[offset] = float_to_bf16_bits(value);
        }
      }
    }
  }
}

// Large M: a 128 x 64 output tile per block, K in stages of 64 (two per scale block) staged through
// shared memory while earlier stages multiply (NVIDIA: a 4-buffer cp.async ring, three stages in flight;
// AMD: double-buffered, the next stage held in registers and stored after the multiply). Warps: (warps / 2)
// along M x 2 along N, each a (128 / (warps / 2)) x 32 tile (NVIDIA 32 x 32 = 2 x 4 unit tiles, AMD 64 x 32 =
// 4 x 2). A 64-byte shared row makes a lane's 16-byte fragment
// reads conflict-free (the 8 lanes of a phase read 128 contiguous bytes). Operands in the unit's encoding
// only (the launcher sends the others to bmm_kernel): gfx950's block-scaled MFMA carries no encoding shift.
constexpr int kTileM = 128;
constexpr int kTileNLarge = 64;
constexpr int kStageK = 64;
constexpr int kAChunks = kTileM * kStageK / 16 / kThreads;       // 16-byte chunks per thread and stage
constexpr int kBChunks = kTileNLarge * kStageK / 16 / kThreads;
static_assert(kAChunks * kThreads * 16 == kTileM * kStageK && kBChunks * kThreads * 16 == kTileNLarge * kStageK,
              "staging");

__global__ void __launch_bounds__(kThreads) bmm_tiled_kernel(BmmA8W8MxScaleArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  constexpr int kWarpsN = 2;
  constexpr int kWarpsM = kWarps / kWarpsN;
  constexpr int kWarpN = kTileNLarge / kWarpsN;
  constexpr int kMTiles = kTileM / kWarpsM / 16;
  constexpr int kNTiles = kWarpN / kTileN;
  constexpr int kAcc = kMTiles * kNTiles * 4;
#if defined(__CUDA_ARCH__)
  constexpr int kStages = 4;  // cp.async ring: three stages in flight while one multiplies (48 KiB)
#else
  constexpr int kStages = 2;
#endif
  __shared__ __attribute__((aligned(16))) uint8_t a_stage[kStages][kTileM * kStageK];
  __shared__ __attribute__((aligned(16))) uint8_t b_stage[kStages][kTileNLarge * kStageK];

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
  const int frag_row = lane % 16;
  const int segment = lane / 16;
#else
  const int frag_row = lane / 4;
  const int segment = lane % 4;
#endif
  const int64_t group = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileNLarge;
  const int64_t stages = args.k / kStageK;
  const int shift = encoding_shift(args);

  // Staging: chunk c = threadIdx.x + j * kThreads is row c / 4, bytes [16 (c % 4), 16 (c % 4) + 16).
  const uint8_t* a_src[kAChunks];
  const uint8_t* b_src[kBChunks];
  bool a_ok[kAChunks];
#pragma unroll
  for (int j = 0; j < kAChunks; ++j) {
    const int c = static_cast<int>(threadIdx.x) + j * kThreads;
    const int64_t m = m0 + c / 4;
    a_ok[j] = m < args.m;
    a_src[j] = args.x + (a_ok[j] ? m : 0) * args.x_stride_m + group * args.x_stride_g + (c % 4) * 16;
  }
#pragma unroll
  for (int j = 0; j < kBChunks; ++j) {
    const int c = static_cast<int>(threadIdx.x) + j * kThreads;
    b_src[j] = args.w + group * args.w_stride_g + (n0 + c / 4) * args.w_stride_n + (c % 4) * 16;
  }
#if defined(__CUDA_ARCH__)
  // NVIDIA: cp.async straight into shared memory (rows past M are zero-filled: source size 0).
  const auto issue_stage = [&](int64_t stage, int buffer) {
    const int64_t k = stage * kStageK;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      const uint32_t a_dst = shared_window_address(&a_stage[buffer][c * 16]);
      copy_async_16_or_zeros(a_dst, a_src[j] + k, a_ok[j]);
    }
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      const uint32_t b_dst = shared_window_address(&b_stage[buffer][c * 16]);
      copy_async_16(b_dst, b_src[j] + k);
    }
    copy_async_commit();
  };
#else
  uint4 a_regs[kAChunks];
  uint4 b_regs[kBChunks];
#endif
#if !defined(__CUDA_ARCH__)
  // AMD: the next stage waits in registers while this one multiplies, then goes to shared memory.
  const auto load_stage = [&](int64_t stage) {
    const int64_t k = stage * kStageK;
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      a_regs[j] = a_ok[j] ? *reinterpret_cast<const uint4*>(a_src[j] + k) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) b_regs[j] = *reinterpret_cast<const uint4*>(b_src[j] + k);
  };
  const auto store_stage = [&](int buffer) {
#pragma unroll
    for (int j = 0; j < kAChunks; ++j) {
      *reinterpret_cast<uint4*>(&a_stage[buffer][(threadIdx.x + j * kThreads) * 16]) = a_regs[j];
    }
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      *reinterpret_cast<uint4*>(&b_stage[buffer][(threadIdx.x + j * kThreads) * 16]) = b_regs[j];
    }
  };
#endif

  // The first accumulator row of this lane (NVIDIA: rows gid, gid + 8; AMD: rows 4q .. 4q + 3 of each
  // M tile); the scale rows are addressed when a block is folded (pointers held across the loop would
  // cost registers).
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
  const int64_t lane_m = m0 + warp_m * (kMTiles * 16) + 4 * (lane / 16);
  constexpr int kLaneRowStep = 1;
#else
  const int64_t lane_m = m0 + warp_m * (kMTiles * 16) + lane / 4;
  constexpr int kLaneRowStep = 8;
#endif
  const uint8_t* x_scale_group = args.x_scale + group * args.x_scale_stride_g;
  const uint8_t* w_scale_row = args.w_scale + group * args.w_scale_stride_g + (n0 / kBlockK) * args.w_scale_stride_nb;

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) {
      issue_stage(s, s);
    } else {
      copy_async_commit();  // an empty group keeps the count uniform
    }
  }
#else
  load_stage(0);
  store_stage(0);
  __syncthreads();
#endif
  const int64_t k_blocks = args.k / kBlockK;
  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    float part[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) part[i] = 0.0f;
    // gfx950: the unit applies the block's scales, so a lane's half-0 fragments wait in registers until
    // its half-1 fragments are read, and the block's scale bytes (the lane's A fragment rows') come first.
    Frag16 a_held[2][kMTiles];
    Frag16 b_held[2][kNTiles];
    uint32_t ws_held = 127u;
    uint32_t xs_held[kMTiles];
    if constexpr (kUnitAppliesBlockScales) {
      ws_held = w_scale_row[kb];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int64_t m = m0 + warp_m * (kMTiles * 16) + mt * 16 + frag_row;
        xs_held[mt] = m < args.m ? x_scale_group[m * args.x_scale_stride_m + kb] : 127u;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // stage 2 kb + half lives in buffer stage % kStages
      const int64_t stage = 2 * kb + half;
      const int buffer = static_cast<int>(stage % kStages);
#if defined(__CUDA_ARCH__)
      // Groups committed so far: stage + kStages - 1; with at most kStages - 2 pending, this stage's landed.
      copy_async_wait<kStages - 2>();
      __syncthreads();  // every thread's copies visible, and every warp done with the buffer refilled next
      if (stage + kStages - 1 < stages) {
        issue_stage(stage + kStages - 1, static_cast<int>((stage + kStages - 1) % kStages));
      } else {
        copy_async_commit();
      }
#else
      const bool more = stage + 1 < stages;
      if (more) load_stage(stage + 1);
#endif
      Frag16 b[kNTiles];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int row = warp_n * kWarpN + nt * kTileN + frag_row;
        const uint4 v = *reinterpret_cast<const uint4*>(&b_stage[buffer][row * kStageK + segment * 16]);
        b[nt] = Frag16{{v.x, v.y, v.z, v.w}};
      }
      if constexpr (kUnitAppliesBlockScales) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) b_held[half][nt] = b[nt];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const int row = warp_m * (kMTiles * 16) + mt * 16 + frag_row;
          const uint4 v = *reinterpret_cast<const uint4*>(&a_stage[buffer][row * kStageK + segment * 16]);
          a_held[half][mt] = Frag16{{v.x, v.y, v.z, v.w}};
        }
        if (half == 1) {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
              mma_block_scaled(&acc[(mt * kNTiles + nt) * 4], a_held[0][mt], a_held[1][mt], b_held[0][nt],
                               b_held[1][nt], xs_held[mt], ws_held);
            }
          }
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Frag16 a[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp_m * (kMTiles * 16) + mt * 16 + frag_row + (kLaneRows == 2 ? 8 * h : 0);
            if (h == 0 || kLaneRows == 2) {
              const uint4 v = *reinterpret_cast<const uint4*>(&a_stage[buffer][row * kStageK + segment * 16]);
              a[h] = Frag16{{v.x, v.y, v.z, v.w}};
            } else {
              a[h] = a[0];
            }
          }
#pragma unroll
          for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) mma_step(&part[(mt * kNTiles + nt) * 4], a[0], a[1], b[nt], s);
          }
        }
      }
#if !defined(__CUDA_ARCH__)
      if (more) store_stage(buffer ^ 1);
      __syncthreads();
#endif
    }
    if constexpr (!kUnitAppliesBlockScales) {  // the software fold (gfx950: done by the unit)
      const uint32_t ws = w_scale_row[kb];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) {
          const int64_t m = lane_m + mt * 16 + r * kLaneRowStep;
          const uint32_t xs = m < args.m ? x_scale_group[m * args.x_scale_stride_m + kb] : 127u;
          const BlockScale f = block_scale(xs, ws, shift);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const float* c = &part[(mt * kNTiles + nt) * 4];
            float* sum = &acc[(mt * kNTiles + nt) * 4];
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
            sum[r] += (c[r] * f.f1) * f.f2;
#else
            sum[2 * r] += (c[2 * r] * f.f1) * f.f2;
            sum[2 * r + 1] += (c[2 * r + 1] * f.f1) * f.f2;
#endif
          }
        }
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#if defined(__AMDGCN__) || defined(__HIP_PLATFORM_AMD__)
        const int64_t m = m0 + warp_m * (kMTiles * 16) + mt * 16 + 4 * (lane / 16) + i;
        const int64_t n = n0 + warp_n * kWarpN + nt * kTileN + lane % 16;
#else
        const int64_t m = m0 + warp_m * (kMTiles * 16) + mt * 16 + lane / 4 + 8 * (i / 2);
        const int64_t n = n0 + warp_n * kWarpN + nt * kTileN + 2 * (lane % 4) + (i % 2);
#endif
        if (m >= args.m) continue;
        const float value = acc[(mt * kNTiles + nt) * 4 + i];
        const int64_t offset = m * args.out_stride_m + group * args.out_stride_g + n;
        if (args.out_fp32) {
          static_cast<float*>(args.out)[offset] = value;
        } else {
          static_cast<uint16_t*>(args.out)[offset] = float_to_bf16_bits(value);
        }
      }
    }
  }
}

#if !defined(__HIPCC__)
// ---- NVIDIA sm_90a: warpgroup MMA ----------------------------------------------------------------------
// sm_90 runs mma.sync's e4m3 shape as f16 conversions plus f16 MMAs (SASS F2FP.F16.E4M3.UNPACK_B and
// HMMA.16816): about 200 TFLOP/s at best on the H200. Its FP8 tensor-core path is the warpgroup
// instruction wgmma.mma_async, which reads its operands from shared memory through descriptors.
// bmm_wgmma_kernel: a (64 * kWarpGroups) x kBlockN output tile per block, each warp group (128 threads)
// a 64-row slice of it. Every 128-deep K block (one scale block) is staged by all threads through a
// kStages-deep cp.async ring: A and B rows of 128 bytes in the 128-byte swizzle the descriptors describe
// (16-byte chunk c of row r at chunk c ^ (r % 8), tiles on 1024-byte boundaries). The block's four k32
// steps multiply into a fresh fp32 fragment that is folded into the running sum with the block's scales,
// exactly as in the kernels above. Rows past M are zero-filled and not stored.

template <int kWarpGroups, int kBlockN>
struct WgmmaShape {
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kStageBytes = (kBlockM + kBlockN) * kBlockK;
  static constexpr int kChunks = kStageBytes / 16 / kThreads;  // 16-byte copies per thread and stage
  static constexpr int kAcc = kBlockN / 2;                      // fp32 accumulators per thread
  static_assert(kChunks * 16 * kThreads == kStageBytes, "staging");
};

// A thread's 16-byte copies of one K block's stage in the wgmma kernels: copy j is chunk c = tid + j * threads,
// row c / 8 of A (the first kBlockM rows: copies j < kACopies) or of B, 16-byte column c % 8, stored at column
// (c % 8) ^ (row % 8) (the 128-byte swizzle). A thread's rows are all equal mod 8 (threads is a multiple of 64),
// so its swizzle is one XOR for all its copies. Sources are addressed from two row pointers and their strides
// (a pointer per copy would cost registers); copies of A at or past row M are zero-filled, not read.
template <int kBlockM, int kThreads>
struct StageCopies {
  static constexpr int kRowsPerCopy = kThreads / 8;
  static constexpr int kACopies = kBlockM / kRowsPerCopy;
  static_assert(kBlockM % kRowsPerCopy == 0, "whole copies of A");
  uint32_t offset;           // in the stage
  const uint8_t* a_source;   // the thread's first row of A, K block 0
  const uint8_t* b_source;   // and of B
  int64_t a_step;            // bytes between its rows of A
  int64_t b_step;            // and of B
  int a_inside;              // its copies of A below row M

  DSV4_DEVICE StageCopies(const BmmA8W8MxScaleArgs& args, int tid, int64_t m0, int64_t n0, int64_t group) {
    offset = static_cast<uint32_t>(tid * 16) ^ static_cast<uint32_t>(((tid / 8) % 8) * 16);
    const int64_t first_a_row = m0 + tid / 8;
    a_source = args.x + first_a_row * args.x_stride_m + group * args.x_stride_g + (tid % 8) * 16;
    b_source = args.w + group * args.w_stride_g + (n0 + tid / 8) * args.w_stride_n + (tid % 8) * 16;
    a_step = kRowsPerCopy * args.x_stride_m;
    b_step = kRowsPerCopy * args.w_stride_n;
    const int64_t rows_left = args.m - first_a_row;
    a_inside = rows_left <= 0 ? 0
                              : static_cast<int>(rows_left >= kACopies * kRowsPerCopy
                                                     ? kACopies
                                                     : (rows_left + kRowsPerCopy - 1) / kRowsPerCopy);
  }
};

// sum[i] += product[i] * 2^(xs + ws - 254 + shift) through block_scale's two exact factors (any bytes: subnormal
// and overflowing factors, the E8M0 NaN), xs the row's byte: xs_lo for entries i % 4 < 2, xs_hi for the others.
template <int kAcc>
DSV4_DEVICE void fold_with_two_factors(const float (&product)[kAcc], float (&sum)[kAcc], uint32_t xs_lo,
                                       uint32_t xs_hi, uint32_t ws, int shift) {
  const BlockScale f_lo = block_scale(xs_lo, ws, shift);
  const BlockScale f_hi = block_scale(xs_hi, ws, shift);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const BlockScale& f = (i % 4) < 2 ? f_lo : f_hi;
    sum[i] += (product[i] * f.f1) * f.f2;
  }
}

#if defined(DSV4_WGMMA)  // (used by the wgmma kernels' bodies, which exist in sm_90a device passes only)
// Two adjacent outputs (a fragment's entries i, i + 1) at `offset` of out, fp32 or bf16.
DSV4_DEVICE void store_output_pair(const BmmA8W8MxScaleArgs& args, int64_t offset, float v0, float v1) {
  if (args.out_fp32) {
    float* out = static_cast<float*>(args.out) + offset;
    out[0] = v0;
    out[1] = v1;
  } else {
    uint16_t* out = static_cast<uint16_t*>(args.out) + offset;
    out[0] = float_to_bf16_bits(v0);
    out[1] = float_to_bf16_bits(v1);
  }
}
#endif  // DSV4_WGMMA

template <int kWarpGroups, int kBlockN, int kStages>
constexpr size_t wgmma_shared_bytes() {
  return static_cast<size_t>(kStages) * WgmmaShape<kWarpGroups, kBlockN>::kStageBytes + 1024;  // + alignment
}

template <int kWarpGroups, int kBlockN, int kStages>
__global__ void __launch_bounds__(128 * kWarpGroups) bmm_wgmma_kernel(BmmA8W8MxScaleArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
#if defined(DSV4_WGMMA)
  using Shape = WgmmaShape<kWarpGroups, kBlockN>;
  constexpr int kAcc = Shape::kAcc;
  DSV4_DYNAMIC_SHARED(uint8_t, wgmma_shared, 1024);
  const uint32_t shared_base = swizzle_atom_aligned(shared_window_address(wgmma_shared));
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp_group = tid / 128;
  const int warp_in_group = (tid / 32) % 4;
  const int64_t group = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * Shape::kBlockM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const int64_t k_blocks = args.k / kBlockK;
  const int shift = encoding_shift(args);

  using Copies = StageCopies<Shape::kBlockM, Shape::kThreads>;
  constexpr int kACopies = Copies::kACopies;
  static_assert(kACopies < Shape::kChunks, "copies of A, then of B");
  const Copies copies(args, tid, m0, n0, group);
  // The 64 x 64 tiles of a group (16 for N = 1024) share their A rows: each starts at its own K block and
  // wraps around, so that at any moment they read different A lines instead of all asking the L2 for the
  // same ones. H200, graph replay, same run: G = 8, M = 64 15.1 us against 15.7-16.0; M = 32 13.3 against
  // 14.1; G = 4, M = 64 13.6 against 14.2. The wider tiles lose by it (G = 16, M = 64, 64 x 128: 24.4
  // against 23.8-24.1; G = 8, M = 4096, 128 x 128: 443 against 430-434) and start at K block 0.
  constexpr bool kRotateK = kWarpGroups == 1 && kBlockN == 64;
  const int64_t k_first = kRotateK ? static_cast<int64_t>(blockIdx.x) * k_blocks / gridDim.x : 0;
  const auto source_block = [&](int64_t kb) {
    const int64_t rotated = kb + k_first;
    return rotated < k_blocks ? rotated : rotated - k_blocks;
  };
  const auto issue_stage = [&](int64_t kb) {
    const uint32_t stage = shared_base + static_cast<uint32_t>(kb % kStages) * Shape::kStageBytes + copies.offset;
    const int64_t source = source_block(kb);
    const uint8_t* a_block = copies.a_source + source * kBlockK;
#pragma unroll
    for (int j = 0; j < Shape::kChunks; ++j) {
      const uint32_t target = stage + j * Shape::kThreads * 16;
      if (j < kACopies) {
        const bool inside = j < copies.a_inside;
        copy_async_16_or_zeros(target, inside ? a_block + j * copies.a_step : args.x, inside);
      } else {
        // One warp group a block: small M, each weight tile read by one block (the hint gained 0-2% there
        // on the H200); the 128-row tiles re-read it from the device-wide cache (2% slower with the hint).
        if constexpr (kWarpGroups == 1) {
          copy_async_16_stream(target, copies.b_source + (j - kACopies) * copies.b_step + source * kBlockK);
        } else {
          copy_async_16(target, copies.b_source + (j - kACopies) * copies.b_step + source * kBlockK);
        }
      }
    }
    copy_async_commit();
  };

  // This thread's accumulator rows: row_lo (fragment entries i % 4 < 2) and row_lo + 8.
  const int64_t row_lo = m0 + warp_group * 64 + warp_in_group * 16 + lane / 4;
  const int64_t row_hi = row_lo + 8;
  const uint8_t* x_scale_group = args.x_scale + group * args.x_scale_stride_g;
  const uint8_t* x_scale_lo = row_lo < args.m ? x_scale_group + row_lo * args.x_scale_stride_m : nullptr;
  const uint8_t* x_scale_hi = row_hi < args.m ? x_scale_group + row_hi * args.x_scale_stride_m : nullptr;
  const uint8_t* w_scale_row = args.w_scale + group * args.w_scale_stride_g + (n0 / kBlockK) * args.w_scale_stride_nb;

  // Block kb's product is folded while block kb + 1's multiplies (two fragments, used in turn), so the
  // unit's latency is hidden behind the fold; block kb's scale bytes are loaded when its product is issued
  // and read at its fold, one K block later (their latency, an L2 round trip, would otherwise stall every
  // block). A buffer is refilled two K blocks after its product was issued: by then every warp group has
  // waited for that product (at its previous K block) and passed the barrier.
  const auto load_scales = [&](int64_t kb, uint32_t& lo, uint32_t& hi, uint32_t& w) {
    const int64_t source = source_block(kb);
    lo = x_scale_lo != nullptr ? x_scale_lo[source] : 127u;
    hi = x_scale_hi != nullptr ? x_scale_hi[source] : 127u;
    w = w_scale_row[source];
  };
  // One warp group a multiprocessor at small M issues every instruction of a K block's step itself, so the
  // usual case takes the short path: both rows' factors 2^(xs + ws - 254 + shift) normal floats and no NaN
  // byte, one fused multiply-add per entry (product * f is exact there, so it rounds as the two-step form,
  // unless the scaled product overflows); otherwise block_scale's two factors.
  const auto fold = [&](float (&product)[kAcc], float (&sum)[kAcc], uint32_t xs_lo, uint32_t xs_hi, uint32_t ws) {
    const int e_lo = static_cast<int>(xs_lo + ws) - 254 + shift;
    const int e_hi = static_cast<int>(xs_hi + ws) - 254 + shift;
    const bool normal = e_lo >= -126 && e_lo <= 127 && e_hi >= -126 && e_hi <= 127;
    if (normal && xs_lo != kUe8m0NaN && xs_hi != kUe8m0NaN && ws != kUe8m0NaN) {
      const float f_lo = bits_float(static_cast<uint32_t>(e_lo + 127) << 23);
      const float f_hi = bits_float(static_cast<uint32_t>(e_hi + 127) << 23);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) sum[i] = fmaf(product[i], (i % 4) < 2 ? f_lo : f_hi, sum[i]);
      return;
    }
    fold_with_two_factors(product, sum, xs_lo, xs_hi, ws, shift);
  };

  float acc[kAcc];
  float part_even[kAcc];  // the products of even K blocks
  float part_odd[kAcc];   // and of odd ones
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  uint32_t pending_xs_lo = 127u, pending_xs_hi = 127u, pending_ws = 127u;  // scales of the product in flight

  // K blocks in flight: one buffer fewer than the ring, the buffer of a block waiting for the product before it.
  constexpr int kAhead = kStages - 2;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_blocks) {
      issue_stage(s);
    } else {
      copy_async_commit();  // an empty group keeps the count uniform
    }
  }
  // One K block: its product into `product`, then (fold_previous) the previous block's, in `previous`, folded.
  const auto step = [&](bool fold_previous, int64_t kb, float (&product)[kAcc], float (&previous)[kAcc]) {
    // Groups committed so far: kb + kAhead; with at most kAhead - 1 pending, block kb has landed.
    copy_async_wait<kAhead - 1>();
    fence_shared_writes_for_wgmma();
    __syncthreads();  // every thread's copies visible; every warp group done with block kb - 2's buffer
    if (kb + kAhead < k_blocks) {
      issue_stage(kb + kAhead);
    } else {
      copy_async_commit();
    }
    uint32_t xs_lo, xs_hi, ws;
    load_scales(kb, xs_lo, xs_hi, ws);

    const uint32_t stage = shared_base + static_cast<uint32_t>(kb % kStages) * Shape::kStageBytes;
    const uint64_t a_tile = swizzled_tile_descriptor(stage + warp_group * 64 * kBlockK);
    const uint64_t b_tile = swizzled_tile_descriptor(stage + Shape::kBlockM * kBlockK);
    pin_registers(product);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kBlockK / 32; ++s) {
      const uint64_t a_desc = descriptor_advanced(a_tile, 32 * s);
      const uint64_t b_desc = descriptor_advanced(b_tile, 32 * s);
      if constexpr (kBlockN == 128) {
        wgmma_m64n128k32(product, a_desc, b_desc, s > 0 ? 1u : 0u);
      } else {
        wgmma_m64n64k32(product, a_desc, b_desc, s > 0 ? 1u : 0u);
      }
    }
    wgmma_commit();
    if (fold_previous) {
      wgmma_wait<1>();  // block kb - 1's product is done
      pin_registers(previous);
      fold(previous, acc, pending_xs_lo, pending_xs_hi, pending_ws);
    }
    pending_xs_lo = xs_lo;
    pending_xs_hi = xs_hi;
    pending_ws = ws;
  };
  // Every path through these calls alternates the two fragments (k_blocks >= 1: the launcher's contract), so
  // that the compiler can keep the products in flight instead of serializing the unit.
  step(false, 0, part_even, part_odd);
  int64_t kb = 1;
  for (; kb + 1 < k_blocks; kb += 2) {
    step(true, kb, part_odd, part_even);
    step(true, kb + 1, part_even, part_odd);
  }
  if (kb < k_blocks) {
    step(true, kb, part_odd, part_even);
    wgmma_wait<0>();
    pin_registers(part_odd);
    fold(part_odd, acc, pending_xs_lo, pending_xs_hi, pending_ws);
  } else {
    wgmma_wait<0>();
    pin_registers(part_even);
    fold(part_even, acc, pending_xs_lo, pending_xs_hi, pending_ws);
  }
  copy_async_wait<0>();

  // Fragment entry i: row row_lo + 8 * ((i / 2) % 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
#pragma unroll
  for (int i = 0; i < kAcc; i += 2) {
    const int64_t m = (i % 4) < 2 ? row_lo : row_hi;
    if (m >= args.m) continue;
    const int64_t offset = m * args.out_stride_m + group * args.out_stride_g + n0 + 8 * (i / 4) + 2 * (lane % 4);
    store_output_pair(args, offset, acc[i], acc[i + 1]);
  }
#else
  (void)args;
#if DSV4_DEVICE_PASS
  device_trap();  // no wgmma in this device pass; the launcher only picks this kernel for sm_90a builds on sm_90
#endif
#endif
}

// ---- The exact form on f16 wgmma, A from registers ----
// bmm_wgmma_f16_kernel: the fp32 sums (the default numerics) on f16 wgmma, which sums its products in fp32 (every
// e4m3 value is exact in f16). The FP8 K blocks land through a cp.async ring as in bmm_wgmma_kernel. A warp reads
// its 16 rows of A straight from the landed FP8 stage into registers (ldmatrix, byte pairs read as b16) and
// converts them there; only B goes through shared memory in f16, converted once per block by all threads into
// one of two copies. The k order within each 16-wide step is permuted the same way for A and B (a dot product
// does not depend on the order of its terms): step s takes the FP8 bytes 16 s .. 16 s + 15 of a row, and the
// lane holding bytes 4t .. 4t+3 of a row feeds k slots {2t, 2t+1} (bytes 4t, 4t+1) and {2t+8, 2t+9} (bytes
// 4t+2, 4t+3); B's copy places its converted pairs at the same slots. A warp group owns kSubTiles 64-row slices
// of the block's rows.
//
// Scales: where every row of the block has its block scales 2^(xs + ws - 254) within 2^15 of its largest (and no
// E8M0 NaN byte), each K block of A is multiplied in f16 by its scale relative to that largest, 2^-d with
// d <= 15, which is exact (an e4m3 value's lowest bit, >= 2^-9, stays >= 2^-24, f16's smallest subnormal), and
// the unit sums all of K in one fp32 accumulator per entry: no per-block fold, K blocks back to back. Any other
// block multiplies each K block into a fresh fragment and folds it in fp32 with its scales, as bmm_wgmma_kernel
// does, one 64-row slice at a time.
template <int kWarpGroups, int kSubTiles, int kBlockN>
struct F16Shape {
  static constexpr int kBlockM = 64 * kWarpGroups * kSubTiles;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kStageBytes = (kBlockM + kBlockN) * kBlockK;
  static constexpr int kChunks = kStageBytes / 16 / kThreads;  // 16-byte copies per thread and stage
  static constexpr int kAcc = kBlockN / 2;                      // fp32 accumulators per thread and slice
  static constexpr uint32_t kCopyBytes = static_cast<uint32_t>(kBlockN) * kBlockK * 2;  // B's f16 copy
  static_assert(kChunks * 16 * kThreads == kStageBytes, "staging");
};

template <int kWarpGroups, int kSubTiles, int kBlockN, int kStages>
constexpr size_t wgmma_f16_shared_bytes() {
  using Shape = F16Shape<kWarpGroups, kSubTiles, kBlockN>;
  return static_cast<size_t>(kStages) * Shape::kStageBytes + 2 * Shape::kCopyBytes + 1024;  // + alignment
}

#if defined(DSV4_WGMMA)  // (helpers of the kernel below, whose body exists in sm_90a device passes only)
// 2^-d in both halves of an f16 pair, d in [0, 15] (2^-15 is subnormal).
DSV4_DEVICE uint32_t f16x2_inverse_power_of_two(int d) {
  const uint32_t half = d <= 14 ? static_cast<uint32_t>(15 - d) << 10 : 0x0200u;
  return half | (half << 16);
}

// K split over a cluster of kKSplit blocks: each block leaves its kAcc fp32 sums in its own shared memory at
// `base` (entry i of thread t at word i * kThreads + t), and thread t adds the entries of its block's share,
// pairs i / 2 with (i / 2) % kKSplit == rank, over the blocks in rank order (the same order wherever it runs);
// its other totals are 0. The caller's threads are done with the shared memory at base.
template <int kKSplit, int kThreads, int kAcc>
DSV4_DEVICE void add_sums_over_cluster(const float (&sums)[kAcc], float (&totals)[kAcc], uint32_t base, int tid,
                                       int rank) {
  const auto entry_address = [&](int i) { return base + static_cast<uint32_t>((i * kThreads + tid) * 4); };
#pragma unroll
  for (int i = 0; i < kAcc; ++i) ptx::st_shared_f32(entry_address(i), sums[i]);
  cluster_barrier();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    totals[i] = 0.0f;
    if ((i / 2) % kKSplit != rank) continue;
    totals[i] = load_cluster_shared_f32(entry_address(i), 0);
#pragma unroll
    for (int r = 1; r < kKSplit; ++r) totals[i] += load_cluster_shared_f32(entry_address(i), r);
  }
  // No block leaves while another reads its shared memory. Before the callers' stores, so that the barrier's
  // release waits for these reads only (after the stores, ncu put 3.4% of the warps' samples at G = 8, M = 64 on
  // that wait in bmm_wgmma_f16_kernel; H200 timing moved within run-to-run spread, 21.3 -> 20.9 us).
  cluster_barrier();
}
#endif  // DSV4_WGMMA

template <int kWarpGroups, int kSubTiles, int kBlockN, int kStages, int kKSplit>
__global__ void __launch_bounds__(128 * kWarpGroups) bmm_wgmma_f16_kernel(BmmA8W8MxScaleArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
#if defined(DSV4_WGMMA)
  using Shape = F16Shape<kWarpGroups, kSubTiles, kBlockN>;
  constexpr int kAcc = Shape::kAcc;
  constexpr int kAhead = kStages - 1;  // K blocks in flight
  static_assert(kAhead >= 2, "the wait for the next block leaves one group pending");
  constexpr int kSteps = kBlockK / 16;
  DSV4_DYNAMIC_SHARED(uint8_t, wgmma_shared, 1024);
  const uint32_t shared_base = swizzle_atom_aligned(shared_window_address(wgmma_shared));
  const uint32_t copy_base = shared_base + kStages * Shape::kStageBytes;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = static_cast<int>(threadIdx.x % 32);  // (unsigned: a shift, a mask)
  const int warp_group = static_cast<int>(threadIdx.x / 128);
  const int warp_in_group = static_cast<int>((threadIdx.x / 32) % 4);
  const int64_t group = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * Shape::kBlockM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kKSplit) * kBlockN;
  // With kKSplit > 1 the kKSplit blocks of a cluster share one output tile, each multiplying a contiguous share
  // of the K blocks (k_first on, k_blocks of them, at least one: the launcher's condition); they add their sums
  // in rank order at the end (finish). Every block scans the scales of all K blocks, so they agree on the form.
  static_assert(kKSplit == 1 || (kWarpGroups == 1 && kSubTiles == 1), "split K: one 64-row slice a block");
  const int split_rank = kKSplit > 1 ? static_cast<int>(cluster_block_rank()) : 0;
  const int64_t all_k_blocks = args.k / kBlockK;
  const int64_t k_first = all_k_blocks * split_rank / kKSplit;
  const int64_t k_blocks = all_k_blocks * (split_rank + 1) / kKSplit - k_first;
  const int shift = encoding_shift(args);

  // Staging as in bmm_wgmma_kernel (StageCopies).
  using Copies = StageCopies<Shape::kBlockM, Shape::kThreads>;
  constexpr int kRowsPerCopy = Copies::kRowsPerCopy;
  constexpr int kACopies = Copies::kACopies;
  const Copies copies(args, tid, m0, n0, group);
  // Stage buffers go by slot (kb % kStages, kept by the callers: a 64-bit modulo per use would cost more).
  // The sources walk by integer steps (the copies past row M read nothing: their addresses are never used).
  const auto issue_stage = [&](int64_t kb, int slot) {
    const uint32_t stage = shared_base + static_cast<uint32_t>(slot) * Shape::kStageBytes + copies.offset;
    const uint64_t k_offset = static_cast<uint64_t>((k_first + kb) * kBlockK);
    uint64_t a_address = reinterpret_cast<uint64_t>(copies.a_source) + k_offset;
    uint64_t b_address = reinterpret_cast<uint64_t>(copies.b_source) + k_offset;
#pragma unroll
    for (int j = 0; j < Shape::kChunks; ++j) {
      const uint32_t target = stage + j * Shape::kThreads * 16;
      if (j < kACopies) {
        copy_async_16_or_zeros(target, reinterpret_cast<const void*>(a_address), j < copies.a_inside);
        a_address += static_cast<uint64_t>(copies.a_step);
      } else {
        if constexpr (kWarpGroups * kSubTiles == 1) {
          copy_async_16_stream(target, reinterpret_cast<const void*>(b_address));
        } else {
          copy_async_16(target, reinterpret_cast<const void*>(b_address));
        }
        b_address += static_cast<uint64_t>(copies.b_step);
      }
    }
    copy_async_commit();
  };

  // This thread's rows in slice u: its accumulator rows (and rows of A in its fragments) row(u) and row(u) + 8.
  const auto slice_row = [&](int u) -> int64_t {
    return m0 + (warp_group * kSubTiles + u) * 64 + warp_in_group * 16 + lane / 4;
  };
  const uint8_t* x_scale_group = args.x_scale + group * args.x_scale_stride_g;
  const uint8_t* w_scale_row = args.w_scale + group * args.w_scale_stride_g + (n0 / kBlockK) * args.w_scale_stride_nb;
  // The scale bytes of K block kb for the rows of slice u (127 past M, whose A is zero).
  const auto load_scales = [&](int64_t kb, int u, uint32_t& lo, uint32_t& hi) {
    const int64_t row = slice_row(u);
    lo = row < args.m ? x_scale_group[row * args.x_scale_stride_m + kb] : 127u;
    hi = row + 8 < args.m ? x_scale_group[(row + 8) * args.x_scale_stride_m + kb] : 127u;
  };

  // The first K blocks load while the scales are checked.
  const auto issue_first_stages = [&]() {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < k_blocks) {
        issue_stage(s, s);
      } else {
        copy_async_commit();  // an empty group keeps the count uniform
      }
    }
  };
  issue_first_stages();

  // The rows' largest block exponents xs + ws over K, and whether every block lies within 2^15 of them. The 4
  // lanes that hold the same rows (lane / 4) read every 4th K block each, kScanUnroll of them in flight (8, all
  // of K = 4096, with one slice; 4 with two, whose registers are short), and combine their extremes. This scan
  // runs before the first multiply, with nothing else to hide its loads.
  constexpr int kScanUnroll = kSubTiles == 1 ? 8 : 4;
  int top[kSubTiles][2];
  int bottom[kSubTiles][2];
  bool within = true;
#pragma unroll
  for (int u = 0; u < kSubTiles; ++u) {
    top[u][0] = top[u][1] = 0;
    bottom[u][0] = bottom[u][1] = 1 << 20;
  }
#pragma unroll kScanUnroll
  for (int64_t kb = lane % 4; kb < all_k_blocks; kb += 4) {
    const uint32_t ws = w_scale_row[kb];
#pragma unroll
    for (int u = 0; u < kSubTiles; ++u) {
      uint32_t xs[2];
      load_scales(kb, u, xs[0], xs[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        within = within && xs[h] != kUe8m0NaN && ws != kUe8m0NaN;
        const int e = static_cast<int>(xs[h] + ws);
        top[u][h] = max(top[u][h], e);
        bottom[u][h] = min(bottom[u][h], e);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kSubTiles; ++u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int distance = 1; distance < 4; distance *= 2) {
        top[u][h] = max(top[u][h], __shfl_xor_sync(0xffffffffu, top[u][h], distance));
        bottom[u][h] = min(bottom[u][h], __shfl_xor_sync(0xffffffffu, bottom[u][h], distance));
      }
      within = within && top[u][h] - bottom[u][h] <= 15;
    }
  }
  const bool scaled_in_f16 = __syncthreads_and(within) != 0;

  // B of the K block in stage `slot` into f16 copy `copy_index` (the block's number % 2; two 64-wide atoms of kBlockN
  // 128-byte rows in the 128-byte swizzle). Chunk c = tid + j * threads of B's part: row c / 8, stored at column q =
  // tid % 8, holding FP8 bytes 16 p .. 16 p + 15 with p = q ^ (row % 8), which become step p's 16 slots: the low halves
  // of its 4 words at slots 0..7, the high halves at 8..15. Threads with p >= 4 store the high halves first (their
  // words' halves swapped before the conversion), so that each store of the 8 threads of a row covers all 8 16-byte
  // bank groups (p and p + 4 land on the same ones, an atom apart).
  constexpr int kBChunks = kBlockN * 8 / Shape::kThreads;
  const int convert_row = tid / 8;
  const int convert_step = (tid % 8) ^ (convert_row % 8);
  const uint32_t convert_low = static_cast<uint32_t>(((2 * (convert_step % 4)) ^ (convert_row % 8)) * 16);
  const uint32_t convert_high = static_cast<uint32_t>(((2 * (convert_step % 4) + 1) ^ (convert_row % 8)) * 16);
  const uint32_t convert_target = static_cast<uint32_t>((convert_step / 4) * kBlockN * 128 + convert_row * 128);
  const bool high_first = convert_step >= 4;
  const uint32_t convert_first = high_first ? convert_high : convert_low;
  const uint32_t convert_second = high_first ? convert_low : convert_high;
  const uint32_t halves_selector = high_first ? 0x1032u : 0x3210u;  // prmt: swap the halves, or not
  const auto convert_b = [&](int slot, int copy_index) {
    const uint32_t stage = shared_base + static_cast<uint32_t>(slot) * Shape::kStageBytes + Shape::kBlockM * 128 +
                           static_cast<uint32_t>(tid * 16);
    const uint32_t copy = copy_base + static_cast<uint32_t>(copy_index) * Shape::kCopyBytes + convert_target;
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      const uint4 codes = ptx::ld_shared_v4_b32(stage + static_cast<uint32_t>(j * Shape::kThreads * 16));
      uint4 first, second;  // the low halves' slots then the high halves', in the order stored
      ocp_fp8x4_to_f16x4(__byte_perm(codes.x, 0u, halves_selector), first.x, second.x);
      ocp_fp8x4_to_f16x4(__byte_perm(codes.y, 0u, halves_selector), first.y, second.y);
      ocp_fp8x4_to_f16x4(__byte_perm(codes.z, 0u, halves_selector), first.z, second.z);
      ocp_fp8x4_to_f16x4(__byte_perm(codes.w, 0u, halves_selector), first.w, second.w);
      const uint32_t row_at = copy + static_cast<uint32_t>(j * kRowsPerCopy * 128);
      ptx::st_shared_v4_b32(row_at + convert_first, first);
      ptx::st_shared_v4_b32(row_at + convert_second, second);
    }
  };

  // A of the K block in stage `slot` for this warp's 16 rows of slice u: per pair of steps one ldmatrix
  // .x4 (matrix i: rows 8 (i % 2) .. + 7 of the warp's, FP8 bytes of step 2p + i / 2), each of its words
  // converted to two f16 pairs (fragment words 0 and 2, or 1 and 3), times the rows' factors when `scale`.
  using AFragments = uint32_t[kSteps][4];
  const auto load_a = [&](int slot, int u, AFragments& a, uint32_t factor_lo, uint32_t factor_hi, bool scale) {
    const int row = (warp_group * kSubTiles + u) * 64 + warp_in_group * 16 + lane % 8 + 8 * ((lane / 8) % 2);
    const uint32_t stage =
        shared_base + static_cast<uint32_t>(slot) * Shape::kStageBytes + static_cast<uint32_t>(row * 128);
#pragma unroll
    for (int p = 0; p < kSteps / 2; ++p) {
      const int chunk = 2 * p + lane / 16;
      uint32_t words[4];
      ldmatrix_x4(words, stage + static_cast<uint32_t>((chunk ^ (lane % 8)) * 16));  // row % 8 = lane % 8
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint32_t (&f)[4] = a[2 * p + q];
        ocp_fp8x4_to_f16x4(words[2 * q], f[0], f[2]);
        ocp_fp8x4_to_f16x4(words[2 * q + 1], f[1], f[3]);
        if (scale) {
          f[0] = ptx::mul_rn_f16x2(f[0], factor_lo);
          f[2] = ptx::mul_rn_f16x2(f[2], factor_lo);
          f[1] = ptx::mul_rn_f16x2(f[1], factor_hi);
          f[3] = ptx::mul_rn_f16x2(f[3], factor_hi);
        }
      }
    }
  };

  // The K block's 8 steps into d (accumulating from the first when accumulate_first).
  const auto multiply = [&](float (&d)[kAcc], const AFragments& a, uint32_t copy, bool accumulate_first) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint64_t b_desc =
          swizzled_tile_descriptor(copy + static_cast<uint32_t>((s / 4) * kBlockN * 128 + 32 * (s % 4)));
      const uint32_t accumulate = s > 0 || accumulate_first ? 1u : 0u;
      if constexpr (kBlockN == 128) {
        wgmma_m64n128k16_f16_rs(d, a[s], b_desc, accumulate);
      } else {
        wgmma_m64n64k16_f16_rs(d, a[s], b_desc, accumulate);
      }
    }
  };

  // With a split K, block split_rank adds up and stores the entry pairs i / 2 = split_rank mod kKSplit (finish).
  const auto owns_pair = [&](int i) { return kKSplit == 1 || (i / 2) % kKSplit == split_rank; };
  // Slice u's sums to out, times 2^(top - 254 + shift) per row when they carry the rows' largest scales (as two
  // exact factors). Fragment entry i: row row(u) + 8 * ((i / 2) % 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
  const auto store = [&](int u, const float (&sums)[kAcc], bool scaled) {
    BlockScale factors[2] = {{1.0f, 1.0f}, {1.0f, 1.0f}};
    if (scaled) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t e = static_cast<uint32_t>(top[u][h]);  // <= 508: two bytes below the E8M0 NaN
        factors[h] = block_scale(e / 2, e - e / 2, shift);
      }
    }
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
      if (!owns_pair(i)) continue;
      const int h = (i / 2) % 2;
      const int64_t m = slice_row(u) + 8 * h;
      if (m >= args.m) continue;
      const int64_t offset = m * args.out_stride_m + group * args.out_stride_g + n0 + 8 * (i / 4) + 2 * (lane % 4);
      store_output_pair(args, offset, (sums[i] * factors[h].f1) * factors[h].f2,
                        (sums[i + 1] * factors[h].f1) * factors[h].f2);
    }
  };

  // Slice u's sums to out once every K block is multiplied (with a split K, added over the cluster first).
  const auto finish = [&](int u, const float (&sums)[kAcc], bool scaled) {
    if constexpr (kKSplit == 1) {
      store(u, sums, scaled);
    } else {
      copy_async_wait<0>();
      __syncthreads();  // every warp is done with the stage buffers
      float totals[kAcc];
      add_sums_over_cluster<kKSplit, 128>(sums, totals, shared_base, tid, split_rank);
      store(u, totals, scaled);
    }
  };

  // One pass over K for slice u, A double-buffered (the next block's A loaded while the block multiplies): the
  // scaled form where a warp group has one slice; the per-block form, whose product and fold need the registers,
  // one slice a pass.
  const auto pass = [&](auto scaled_tag, int u, bool first_stages_issued) {
    constexpr bool kScaled = decltype(scaled_tag)::value;
    float acc[kAcc];
    float product[kScaled ? 1 : kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    AFragments a_first, a_second;
    uint32_t xs[2] = {}, ws = 127u;  // the scale bytes of the block multiplied next
    const auto load_block_a = [&](int slot, AFragments& a) {
      if constexpr (kScaled) {
        const auto factor = [&](int h) {
          return f16x2_inverse_power_of_two(top[u][h] - static_cast<int>(xs[h] + ws));
        };
        load_a(slot, u, a, factor(0), factor(1), true);
      } else {
        load_a(slot, u, a, 0u, 0u, false);
      }
    };

    if (!first_stages_issued) {
      __syncthreads();  // the previous pass is done with the shared buffers
      issue_first_stages();
    }
    load_scales(k_first, u, xs[0], xs[1]);
    ws = w_scale_row[k_first];
    copy_async_wait<kAhead - 1>();
    __syncthreads();
    convert_b(0, 0);
    fence_shared_writes_for_wgmma();
    load_block_a(0, a_first);  // block 0: slot 0
    __syncthreads();

    // K block kb, in stage `slot`.
    const auto step = [&](int64_t kb, int slot, AFragments& a, AFragments& a_next) {
      const bool more = kb + 1 < k_blocks;
      uint32_t next_xs[2], next_ws = 127u;
      if (more) {
        load_scales(k_first + kb + 1, u, next_xs[0], next_xs[1]);
        next_ws = w_scale_row[k_first + kb + 1];
      }
      const uint32_t copy = copy_base + static_cast<uint32_t>(kb & 1) * Shape::kCopyBytes;
      if constexpr (kScaled) {
        pin_registers(acc);
      } else {
        pin_registers(product);
      }
      wgmma_fence();
      if constexpr (kScaled) {
        multiply(acc, a, copy, kb > 0);
      } else {
        multiply(product, a, copy, false);
      }
      wgmma_commit();
      if constexpr (!kScaled) {
        wgmma_wait<0>();
        pin_registers(product);
        fold_with_two_factors(product, acc, xs[0], xs[1], ws, shift);
      } else {
        wgmma_wait<1>();  // block kb - 1's product done: its A registers (a_next) and B copy are free
      }
      if (!more) return;
      xs[0] = next_xs[0];
      xs[1] = next_xs[1];
      ws = next_ws;
      // Groups committed: kAhead + kb; with kAhead - 2 pending, block kb + 1 has landed.
      copy_async_wait<kAhead - 2>();
      __syncthreads();  // block kb + 1 visible; every warp group done with copy (kb + 1) % 2 and stage kb - 1
      const int next_slot = slot + 1 == kStages ? 0 : slot + 1;
      if (kb + kAhead < k_blocks) {
        issue_stage(kb + kAhead, slot == 0 ? kStages - 1 : slot - 1);  // block kb - 1's slot (kAhead = kStages - 1)
      } else {
        copy_async_commit();
      }
      convert_b(next_slot, static_cast<int>((kb + 1) & 1));
      fence_shared_writes_for_wgmma();
      load_block_a(next_slot, a_next);
      __syncthreads();  // copy (kb + 1) % 2 complete
    };
    int slot = 0;
    const auto advance = [&]() { slot = slot + 1 == kStages ? 0 : slot + 1; };
    for (int64_t kb = 0; kb < k_blocks; kb += 2) {
      step(kb, slot, a_first, a_second);
      advance();
      if (kb + 1 < k_blocks) step(kb + 1, slot, a_second, a_first);
      advance();
    }
    wgmma_wait<0>();
    pin_registers(acc);
    finish(u, acc, kScaled);
    copy_async_wait<0>();
  };
  // The scaled form with two slices a warp group, the slices' multiplies interleaved: slice 0's of block kb is
  // issued while slice 1's of block kb - 1 runs, and each slice's A of its next block is loaded while the other
  // slice's multiply runs, so that the unit always has the next multiply queued.
  const auto pass_interleaved = [&]() {
    float acc[2][kAcc];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[u][i] = 0.0f;
    }
    AFragments a[2];
    uint32_t xs[2][2] = {}, ws[2] = {127u, 127u};  // slice u's scale bytes for its next A load
    const auto fetch_scales = [&](int u, int64_t kb) {
      if (kb < k_blocks) {
        load_scales(k_first + kb, u, xs[u][0], xs[u][1]);
        ws[u] = w_scale_row[k_first + kb];
      }
    };
    const auto load_slice_a = [&](int slot, int u) {
      const auto factor = [&](int h) {
        return f16x2_inverse_power_of_two(top[u][h] - static_cast<int>(xs[u][h] + ws[u]));
      };
      load_a(slot, u, a[u], factor(0), factor(1), true);
    };
    fetch_scales(0, 0);
    fetch_scales(1, 0);
    copy_async_wait<kAhead - 1>();
    __syncthreads();
    convert_b(0, 0);
    fence_shared_writes_for_wgmma();
    load_slice_a(0, 0);
    fetch_scales(0, 1);
    __syncthreads();
    int slot = 0;  // block kb's stage
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      // Here: slice 0's A of block kb loaded, B's copy kb % 2 complete, slice 1's multiply of kb - 1 running.
      const uint32_t copy = copy_base + static_cast<uint32_t>(kb & 1) * Shape::kCopyBytes;
      pin_registers(acc[0]);
      wgmma_fence();
      multiply(acc[0], a[0], copy, kb > 0);
      wgmma_commit();
      wgmma_wait<1>();  // slice 1's multiply of kb - 1 done: its A registers are free
      pin_registers(acc[1]);
      load_slice_a(slot, 1);
      fetch_scales(1, kb + 1);
      wgmma_fence();
      multiply(acc[1], a[1], copy, kb > 0);
      wgmma_commit();
      if (kb + 1 == k_blocks) break;
      // Groups committed: kAhead + kb; with kAhead - 2 pending, block kb + 1 has landed.
      copy_async_wait<kAhead - 2>();
      __syncthreads();  // block kb + 1 visible; every warp group done with copy (kb + 1) % 2 and stage kb - 1
      const int next_slot = slot + 1 == kStages ? 0 : slot + 1;
      convert_b(next_slot, static_cast<int>((kb + 1) & 1));
      fence_shared_writes_for_wgmma();
      // Issued after the conversion, whose fence would otherwise wait on the copies' address registers.
      if (kb + kAhead < k_blocks) {
        issue_stage(kb + kAhead, slot == 0 ? kStages - 1 : slot - 1);  // block kb - 1's slot (kAhead = kStages - 1)
      } else {
        copy_async_commit();
      }
      __syncthreads();  // copy (kb + 1) % 2 complete
      wgmma_wait<1>();  // slice 0's multiply of kb done (each warp group loads its A past the barrier on its own)
      pin_registers(acc[0]);
      load_slice_a(next_slot, 0);
      fetch_scales(0, kb + 2);
      slot = next_slot;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      pin_registers(acc[u]);
      store(u, acc[u], true);
    }
    copy_async_wait<0>();
  };
  if (scaled_in_f16) {
    if constexpr (kSubTiles == 2) {
      pass_interleaved();
    } else {
      pass(std::true_type{}, 0, true);
    }
  } else {
    for (int u = 0; u < kSubTiles; ++u) pass(std::false_type{}, u, u == 0);
  }
#else
  (void)args;
#if DSV4_DEVICE_PASS
  device_trap();  // no wgmma in this device pass; the launcher only picks this kernel for sm_90a builds on sm_90
#endif
#endif
}

// ---- Decode sizes on f16 wgmma: the weight as the A operand ----
// bmm_wgmma_f16_small_m_kernel: the fp32 sums for M <= 64 (taken from 33 rows), where the op streams the weight once
// and the tokens are few. The roles of bmm_wgmma_f16_kernel are swapped: the weight rows are the MMA's M dimension (a
// block owns 128 of them, one row block of w_scale; a warp group 64) and go from global memory straight into registers,
// kSmallMWeightAhead K blocks ahead, where they become the f16 A fragments; the tokens are its N dimension (64, the
// ones past M zero), converted to f16 by all threads once per K block into a ring of kSmallMTokenStages shared copies
// that both warp groups read. No weight byte passes through shared memory, and each is converted once. In the scaled
// form (below) a warp group multiplies each K block as two chains (even and odd k steps into two accumulators, added at
// the end), so that the unit has four independent chains an SM.
// Measured on the H200 (N = 1024, K = 4096, graph replay, weights past the L2), against the f16 kernels it
// replaces there (64 x 64 tiles split over two blocks, 64 x 128 tiles): G = 8, M = 64 19.9 us against 21.2;
// G = 16, M = 64 33.6 against 36.2; G = 8, M = 40 19.0 against 20.6 (~215-256 TFLOP/s, a quarter of the f16
// peak). With fewer weight rows (G <= 4 at N = 1024) its K splits over 4 or 8 blocks lost to the kernels below
// (G = 4: 24.0 against 15.8; G = 1: 10.0 against 6.8), so it is not taken there. Also measured: the first
// version, one accumulator chain a warp group and 4 K blocks of weight loads in flight, was slower at G = 16
// (41.2 us; G = 8 20.0); its proxy fence before each barrier (SASS MEMBAR.ALL.CTA) is not the limit (left out,
// timing only: 19.9 against 20.0 at G = 8); staging the weight and token bytes by cp.async into per-thread
// shared slots, 6 K blocks deep, instead of register loads was slower still (34.8 us at G = 8).
// Profile (ncu, base clocks, G = 16, M = 64): one block of 8 warps an SM issues on 30% of cycles; the stalls are mostly
// global-load latency (the A conversion waiting on a load: 14% of samples, a branch before it 7%) and the per-K-block
// barrier (~10%); DRAM 35% busy, so more weight bytes in flight looked like the lever. Tried since, same-run A/B
// against this kernel before the copy below (H200, graph replay; G = 8 M = 64 / G = 16 M = 64 / G = 8 M = 40 at 19.6 /
// 33.5 / 18.5 us), all slower or mixed: an L2 prefetch of the rows 4-12 K blocks ahead (+2-3 us in every cell); the
// weight through a TMA ring of 2-8 stages of 16 KiB in the 128-byte swizzle (mbarrier-completed box copies, 60 fewer
// registers), 21.7-23.8 / 33.5-38.7 / 20.5-22.7, slower the more stages; the same ring with four accumulator chains a
// warp group (no change); each half of the next weight block loaded right after its half of the conversion (21.3 / 36.4
// / 20.8). The schedule ptxas (CUDA 13.0) makes is sensitive to the form of the code: converting from a copy of the
// loaded bytes (weight_of; the same arithmetic, 242 registers) runs the unsplit kernel faster, G = 16, M = 64 30.9 us
// against 33.5-33.9 and M = 40 29.6 against 32.5-32.6 (same run, twice each; a version without the unused block index,
// 31.0 / 29.8), but the split kernel slower (G = 8, M = 64: 22.9 against 19.6), so only the unsplit kernel takes the
// copy. Re-measure both after touching this loop or the compiler.
// The k permutation: in each K block lane t = lane % 4 holds bytes 32 t .. 32 t + 31 of its two weight rows
// (lane / 4 and lane / 4 + 8 of its warp's 16); step s takes bytes 32 t + 4 s .. 32 t + 4 s + 3 as k slots
// {2t, 2t+1} and {2t+8, 2t+9}, and the token copy puts each token's bytes at the same slots.
// Scales: a block's weight rows share one w_scale byte per K block. Where every token's 2^(xs + ws - 254) lies
// within 2^15 of its largest over K (and no byte is the E8M0 NaN), the token copy carries the scales relative to
// that largest (exact, as in bmm_wgmma_f16_kernel) and all of K sums in one fp32 accumulator; otherwise each K
// block multiplies into a fresh fragment, folded per token with its two exact factors. K splits over a cluster
// of kKSplit blocks, which add their sums in rank order as bmm_wgmma_f16_kernel's do.
constexpr int kSmallMTokens = 64;       // the MMA's N: a block serves M <= 64
constexpr int kSmallMWeightRows = 128;  // a block's weight rows
constexpr int kSmallMThreads = 256;     // two warp groups, 64 weight rows each
constexpr int kSmallMTokenStages = 3;
constexpr int kSmallMWeightAhead = 2;   // K blocks of weight loads in flight (32 KiB a block)
constexpr uint32_t kSmallMCopyBytes = kSmallMTokens * kBlockK * 2;  // one K block's f16 token copy

constexpr size_t small_m_shared_bytes() {
  return static_cast<size_t>(kSmallMTokenStages) * kSmallMCopyBytes + 1024;  // + alignment
}

#if defined(DSV4_WGMMA)
DSV4_DEVICE uint32_t word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// One output at `offset` of out, fp32 or bf16.
DSV4_DEVICE void store_output_one(const BmmA8W8MxScaleArgs& args, int64_t offset, float v) {
  if (args.out_fp32) {
    static_cast<float*>(args.out)[offset] = v;
  } else {
    static_cast<uint16_t*>(args.out)[offset] = float_to_bf16_bits(v);
  }
}
#endif  // DSV4_WGMMA

template <int kKSplit>
__global__ void __launch_bounds__(kSmallMThreads) bmm_wgmma_f16_small_m_kernel(BmmA8W8MxScaleArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
#if defined(DSV4_WGMMA)
  constexpr int kAcc = kSmallMTokens / 2;
  constexpr int kSteps = kBlockK / 16;
  DSV4_DYNAMIC_SHARED(uint8_t, wgmma_shared, 1024);
  __shared__ int token_top[kSmallMTokens];
  __shared__ uint8_t token_scales[kSmallMTokenStages][kSmallMTokens];  // x_scale bytes of the copies' K blocks
  const uint32_t copy_base = swizzle_atom_aligned(shared_window_address(wgmma_shared));
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int part = lane % 4;  // which 32 bytes of a K block this thread's weight rows and token take
  const int warp_group = tid / 128;
  const int warp_in_group = (tid / 32) % 4;
  const int64_t group = blockIdx.z;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kKSplit) * kSmallMWeightRows;
  const int split_rank = kKSplit > 1 ? static_cast<int>(cluster_block_rank()) : 0;
  const int64_t all_k_blocks = args.k / kBlockK;
  const int64_t k_first = all_k_blocks * split_rank / kKSplit;
  const int64_t k_blocks = all_k_blocks * (split_rank + 1) / kKSplit - k_first;
  const int shift = encoding_shift(args);

  // The token this thread converts (and scans the scales of): tid / 4, its bytes 32 part .. of each K block.
  const int copy_token = tid / 4;
  const bool token_inside = copy_token < args.m;
  const uint8_t* x_scale_group = args.x_scale + group * args.x_scale_stride_g;
  const uint8_t* x_scale_row = x_scale_group + copy_token * args.x_scale_stride_m;
  const uint8_t* x_row = args.x + copy_token * args.x_stride_m + group * args.x_stride_g + part * 32;
  const uint8_t* w_scale_row = args.w_scale + group * args.w_scale_stride_g + (n0 / kBlockK) * args.w_scale_stride_nb;
  const int64_t weight_row = n0 + warp_group * 64 + warp_in_group * 16 + lane / 4;  // and weight_row + 8
  const uint8_t* w_lo = args.w + group * args.w_stride_g + weight_row * args.w_stride_n + part * 32;
  const uint8_t* w_hi = w_lo + 8 * args.w_stride_n;

  // The weight loads of the first K blocks go out before the scale scan.
  struct WeightBytes {
    uint4 lo[2];  // row weight_row, bytes 32 part .. + 31
    uint4 hi[2];  // row weight_row + 8
  };
  const auto load_weight = [&](int64_t kb, WeightBytes& b) {
    const int64_t offset = (k_first + kb) * kBlockK;
    b.lo[0] = ptx::ld_global_nc_l1_no_allocate_v4(w_lo + offset);
    b.lo[1] = ptx::ld_global_nc_l1_no_allocate_v4(w_lo + offset + 16);
    b.hi[0] = ptx::ld_global_nc_l1_no_allocate_v4(w_hi + offset);
    b.hi[1] = ptx::ld_global_nc_l1_no_allocate_v4(w_hi + offset + 16);
  };
  WeightBytes raw[kSmallMWeightAhead];  // K block kb in raw[kb % kSmallMWeightAhead]
#pragma unroll
  for (int j = 0; j < kSmallMWeightAhead; ++j) {
    if (j < k_blocks) load_weight(j, raw[j]);
  }

  // Each token's largest block exponent xs + ws over all of K (every block of a cluster scans all K blocks, so
  // they agree on the form), and whether every block lies within 2^15 of it: the 4 threads of a token read
  // every 4th K block each and combine their extremes.
  int top = 0, bottom = 1 << 20;
  bool within = true;
  if (token_inside) {
#pragma unroll 8
    for (int64_t kb = part; kb < all_k_blocks; kb += 4) {
      const uint32_t xs = x_scale_row[kb];
      const uint32_t ws = w_scale_row[kb];
      within = within && xs != kUe8m0NaN && ws != kUe8m0NaN;
      const int e = static_cast<int>(xs + ws);
      top = max(top, e);
      bottom = min(bottom, e);
    }
  }
#pragma unroll
  for (int distance = 1; distance < 4; distance *= 2) {
    top = max(top, __shfl_xor_sync(0xffffffffu, top, distance));
    bottom = min(bottom, __shfl_xor_sync(0xffffffffu, bottom, distance));
  }
  within = within && (!token_inside || top - bottom <= 15);
  if (part == 0) token_top[copy_token] = top;
  const bool scaled_in_f16 = __syncthreads_and(within) != 0;

  // The token copy of one K block: this thread's 32 bytes of its token and their scale.
  struct TokenBytes {
    uint4 v[2];
    uint32_t xs;      // the token's x_scale byte (127 past M)
    uint32_t factor;  // f16x2 2^(xs + ws - top), used in the scaled form only (where top - xs - ws <= 15)
  };
  const auto load_tokens = [&](int64_t kb, TokenBytes& t) {
    if (token_inside) {
      t.v[0] = *reinterpret_cast<const uint4*>(x_row + (k_first + kb) * kBlockK);
      t.v[1] = *reinterpret_cast<const uint4*>(x_row + (k_first + kb) * kBlockK + 16);
      t.xs = x_scale_row[k_first + kb];
      t.factor = f16x2_inverse_power_of_two(top - static_cast<int>(t.xs + w_scale_row[k_first + kb]));
    } else {
      t.v[0] = t.v[1] = make_uint4(0u, 0u, 0u, 0u);
      t.xs = 127u;
      t.factor = 0u;
    }
  };
  // Copy `slot`: two 64-slot atoms (steps 0-3, 4-7) of 64 token rows of 128 bytes in the 128-byte swizzle. Word s
  // of the thread's bytes is step s's slots {2 part, +1} (16-byte chunk 2 (s % 4)) and {2 part + 8, +9} (chunk
  // 2 (s % 4) + 1), 4 bytes at 4 part: the 8 tokens x 4 parts of a warp's store hit 32 different banks.
  const uint32_t token_at = static_cast<uint32_t>(copy_token * 128 + part * 4);
  const uint32_t token_swizzle = static_cast<uint32_t>(copy_token % 8);
  const auto store_tokens = [&](const TokenBytes& t, int slot, bool scaled) {
    const uint32_t copy = copy_base + static_cast<uint32_t>(slot) * kSmallMCopyBytes + token_at;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      uint32_t low, high;
      ocp_fp8x4_to_f16x4(word_of(t.v[s / 4], s % 4), low, high);
      if (scaled) {
        low = ptx::mul_rn_f16x2(low, t.factor);
        high = ptx::mul_rn_f16x2(high, t.factor);
      }
      const uint32_t atom = copy + static_cast<uint32_t>((s / 4) * kSmallMTokens * 128);
      const uint32_t chunk = static_cast<uint32_t>(2 * (s % 4));
      ptx::st_shared_b32(atom + ((chunk ^ token_swizzle) * 16), low);
      ptx::st_shared_b32(atom + (((chunk + 1) ^ token_swizzle) * 16), high);
    }
    if (!scaled && part == 0) token_scales[slot][copy_token] = static_cast<uint8_t>(t.xs);
  };

  using AFragments = uint32_t[kSteps][4];
  const auto convert_a = [&](const WeightBytes& b, AFragments& a) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      ocp_fp8x4_to_f16x4(word_of(b.lo[s / 4], s % 4), a[s][0], a[s][2]);
      ocp_fp8x4_to_f16x4(word_of(b.hi[s / 4], s % 4), a[s][1], a[s][3]);
    }
  };
  // K block kb's weight bytes, by value: the unsplit kernel converts this copy of `ahead`, the split one `ahead`
  // itself (the same arithmetic; the schedules ptxas makes of the two forms differ: see the kernel's comment).
  const auto weight_of = [&](int64_t kb, const WeightBytes& ahead) -> WeightBytes {
    (void)kb;
    return ahead;
  };
  const auto multiply = [&](float (&d)[kAcc], const AFragments& a, int slot, bool accumulate_first) {
    const uint32_t copy = copy_base + static_cast<uint32_t>(slot) * kSmallMCopyBytes;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint64_t b_desc =
          swizzled_tile_descriptor(copy + static_cast<uint32_t>((s / 4) * kSmallMTokens * 128 + 32 * (s % 4)));
      wgmma_m64n64k16_f16_rs(d, a[s], b_desc, s > 0 || accumulate_first ? 1u : 0u);
    }
  };
  const auto multiply_two_chains = [&](float (&even)[kAcc], float (&odd)[kAcc], const AFragments& a, int slot,
                                       bool accumulate_first) {
    const uint32_t copy = copy_base + static_cast<uint32_t>(slot) * kSmallMCopyBytes;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint64_t b_desc =
          swizzled_tile_descriptor(copy + static_cast<uint32_t>((s / 4) * kSmallMTokens * 128 + 32 * (s % 4)));
      if (s % 2 == 0) {
        wgmma_m64n64k16_f16_rs(even, a[s], b_desc, s > 1 || accumulate_first ? 1u : 0u);
      } else {
        wgmma_m64n64k16_f16_rs(odd, a[s], b_desc, s > 1 || accumulate_first ? 1u : 0u);
      }
    }
  };
  // Accumulator entry i: weight row weight_row + 8 * ((i / 2) % 2), token 8 * (i / 4) + 2 * part + i % 2.
  const auto entry_token = [&](int i) { return 8 * (i / 4) + 2 * part + i % 2; };
  // The folded form: sum += product * 2^(xs + ws - 254 + shift) per token, K block kb (in token copy `slot`).
  const auto fold_block = [&](const float (&product)[kAcc], float (&sum)[kAcc], int64_t kb, int slot) {
    const uint32_t ws = w_scale_row[k_first + kb];
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const BlockScale f = block_scale(token_scales[slot][8 * j + 2 * part + e], ws, shift);
        sum[4 * j + e] += (product[4 * j + e] * f.f1) * f.f2;
        sum[4 * j + 2 + e] += (product[4 * j + 2 + e] * f.f1) * f.f2;
      }
    }
  };

  const auto owns_pair = [&](int i) { return kKSplit == 1 || (i / 2) % kKSplit == split_rank; };
  const auto store = [&](const float (&sums)[kAcc], bool scaled) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      if (!owns_pair(i)) continue;
      const int token = entry_token(i);
      if (token >= args.m) continue;
      BlockScale f = {1.0f, 1.0f};
      if (scaled) {
        const uint32_t e = static_cast<uint32_t>(token_top[token]);  // <= 508: two bytes below the E8M0 NaN
        f = block_scale(e / 2, e - e / 2, shift);
      }
      const int64_t row = weight_row + 8 * ((i / 2) % 2);
      store_output_one(args, token * args.out_stride_m + group * args.out_stride_g + row, (sums[i] * f.f1) * f.f2);
    }
  };
  // The sums to out (with a split K, added over the cluster first).
  const auto finish = [&](const float (&sums)[kAcc], bool scaled) {
    if constexpr (kKSplit == 1) {
      store(sums, scaled);
    } else {
      __syncthreads();  // every warp group is done with the token copies
      float totals[kAcc];
      add_sums_over_cluster<kKSplit, kSmallMThreads>(sums, totals, copy_base, tid, split_rank);
      store(totals, scaled);
    }
  };

  // One pass over the block's K blocks. K block kb multiplies from copy kb % kSmallMTokenStages and A fragments
  // a[kb % 2] (the scaled form into acc and, its odd k steps, product); meanwhile block kb + 1's A is converted
  // and its tokens copied, and the weight of block kb + 1 + kSmallMWeightAhead and the tokens of block kb + 3
  // are loaded.
  const auto pass = [&](auto scaled_tag) {
    constexpr bool kScaled = decltype(scaled_tag)::value;
    float acc[kAcc];
    float product[kAcc];  // the folded form's block product, the scaled form's second chain
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = product[i] = 0.0f;
    TokenBytes tokens[2];  // K block kb's in tokens[kb % 2]
    AFragments a[2];
    load_tokens(0, tokens[0]);
    if (1 < k_blocks) load_tokens(1, tokens[1]);
    store_tokens(tokens[0], 0, kScaled);
    if (2 < k_blocks) load_tokens(2, tokens[0]);
    if constexpr (kKSplit == 1) {
      convert_a(weight_of(0, raw[0]), a[0]);
    } else {
      convert_a(raw[0], a[0]);
    }
    if (kSmallMWeightAhead < k_blocks) load_weight(kSmallMWeightAhead, raw[0]);
    fence_shared_writes_for_wgmma();
    __syncthreads();

    // K block kb with kb % 2 == kPhase (static register indices).
    const auto step = [&](auto phase_tag, int64_t kb) {
      constexpr int kPhase = decltype(phase_tag)::value;
      constexpr int kNext = (kPhase + 1) % kSmallMWeightAhead;
      const int slot = static_cast<int>(kb % kSmallMTokenStages);
      pin_registers(acc);
      pin_registers(product);
      wgmma_fence();
      if constexpr (kScaled) {
        multiply_two_chains(acc, product, a[kPhase % 2], slot, kb > 0);
      } else {
        multiply(product, a[0], slot, false);
      }
      wgmma_commit();
      if constexpr (kScaled) {
        wgmma_wait<1>();  // block kb - 1's multiply done: its A registers and token copy are free
      } else {
        wgmma_wait<0>();
        pin_registers(product);
        fold_block(product, acc, kb, slot);
      }
      if (kb + 1 >= k_blocks) return;
      if constexpr (kKSplit == 1) {
        convert_a(weight_of(kb + 1, raw[kNext]), a[kScaled ? kNext % 2 : 0]);
      } else {
        convert_a(raw[kNext], a[kScaled ? kNext % 2 : 0]);
      }
      if (kb + 1 + kSmallMWeightAhead < k_blocks) load_weight(kb + 1 + kSmallMWeightAhead, raw[kNext]);
      // Copy (kb + 1) % 3 last served block kb - 2, which both warp groups finished before the last barrier.
      store_tokens(tokens[kNext % 2], slot == kSmallMTokenStages - 1 ? 0 : slot + 1, kScaled);
      if (kb + 3 < k_blocks) load_tokens(kb + 3, tokens[kNext % 2]);
      fence_shared_writes_for_wgmma();
      __syncthreads();  // copy (kb + 1) % 3 complete
    };
    for (int64_t kb = 0; kb < k_blocks; kb += 2) {
      step(std::integral_constant<int, 0>{}, kb);
      if (kb + 1 < k_blocks) step(std::integral_constant<int, 1>{}, kb + 1);
    }
    wgmma_wait<0>();
    pin_registers(acc);
    pin_registers(product);
    if constexpr (kScaled) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += product[i];
    }
    finish(acc, kScaled);
  };
  if (scaled_in_f16) {
    pass(std::true_type{});
  } else {
    pass(std::false_type{});
  }
#else
  (void)args;
#if DSV4_DEVICE_PASS
  device_trap();  // no wgmma in this device pass; the launcher only picks this kernel for sm_90a builds on sm_90
#endif
#endif
}

// kKSplit > 1: clusters of kKSplit blocks along x share each output tile, splitting its K blocks (at least one
// each: all_k_blocks >= kKSplit, checked by the caller).
template <int kWarpGroups, int kSubTiles, int kBlockN, int kStages, int kKSplit = 1>
LaunchStatus launch_wgmma_f16(const BmmA8W8MxScaleArgs& args, hipStream_t stream) {
  using Shape = F16Shape<kWarpGroups, kSubTiles, kBlockN>;
  constexpr auto kernel = bmm_wgmma_f16_kernel<kWarpGroups, kSubTiles, kBlockN, kStages, kKSplit>;
  constexpr size_t shared_bytes = wgmma_f16_shared_bytes<kWarpGroups, kSubTiles, kBlockN, kStages>();
  const int64_t m_tiles = (args.m + Shape::kBlockM - 1) / Shape::kBlockM;
  if (m_tiles > 65535 || args.groups > 65535 || args.k / kBlockK < kKSplit) return LaunchStatus::kInvalidArgument;
  if (!allow_dynamic_shared_memory<kernel>(shared_bytes)) return LaunchStatus::kLaunchFailed;
  const dim3 grid(static_cast<unsigned>(args.n / kBlockN * kKSplit), static_cast<unsigned>(m_tiles),
                  static_cast<unsigned>(args.groups));
  launch_overlapping_in_clusters(kernel, grid, dim3(Shape::kThreads), shared_bytes, stream, kKSplit, args);
  return last_launch_status();
}

template <int kKSplit>
LaunchStatus launch_wgmma_f16_small_m(const BmmA8W8MxScaleArgs& args, hipStream_t stream) {
  constexpr auto kernel = bmm_wgmma_f16_small_m_kernel<kKSplit>;
  constexpr size_t shared_bytes = small_m_shared_bytes();
  if (args.m > kSmallMTokens || args.groups > 65535 || args.k / kBlockK < kKSplit) {
    return LaunchStatus::kInvalidArgument;
  }
  if (!allow_dynamic_shared_memory<kernel>(shared_bytes)) return LaunchStatus::kLaunchFailed;
  const dim3 grid(static_cast<unsigned>(args.n / kSmallMWeightRows * kKSplit), 1u, static_cast<unsigned>(args.groups));
  launch_overlapping_in_clusters(kernel, grid, dim3(kSmallMThreads), shared_bytes, stream, kKSplit, args);
  return last_launch_status();
}

template <int kWarpGroups, int kBlockN, int kStages>
LaunchStatus launch_wgmma(const BmmA8W8MxScaleArgs& args, hipStream_t stream) {
  using Shape = WgmmaShape<kWarpGroups, kBlockN>;
  constexpr size_t shared_bytes = wgmma_shared_bytes<kWarpGroups, kBlockN, kStages>();
  const int64_t m_tiles = (args.m + Shape::kBlockM - 1) / Shape::kBlockM;
  if (m_tiles > 65535 || args.groups > 65535) return LaunchStatus::kInvalidArgument;
  if (!allow_dynamic_shared_memory<bmm_wgmma_kernel<kWarpGroups, kBlockN, kStages>>(shared_bytes)) {
    return LaunchStatus::kLaunchFailed;
  }
  const dim3 grid(static_cast<unsigned>(args.n / kBlockN), static_cast<unsigned>(m_tiles),
                  static_cast<unsigned>(args.groups));
  launch_overlapping(bmm_wgmma_kernel<kWarpGroups, kBlockN, kStages>, grid, dim3(Shape::kThreads),
                     shared_bytes, stream, args);
  return last_launch_status();
}
#endif  // !__HIPCC__

template <int kMTiles, int kBlockN, bool kSplitK, bool kForeign = false>
LaunchStatus launch_config(const BmmA8W8MxScaleArgs& args, bool vector, hipStream_t stream) {
  const int64_t m_tiles = (args.m + kMTiles * 16 - 1) / (kMTiles * 16);
  if (m_tiles > 0x7fffffff || args.groups > 65535 || args.n / kBlockN > 65535) return LaunchStatus::kInvalidArgument;
  // x: the M tiles (fastest: the blocks that share a weight tile run together), y: N tiles, z: groups.
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(args.n / kBlockN),
                  static_cast<unsigned>(args.groups));
  if (vector) {
    launch_overlapping(bmm_kernel<kMTiles, kBlockN, kSplitK, true, kForeign>, grid, dim3(kThreads), 0, stream, args);
  } else {
    launch_overlapping(bmm_kernel<kMTiles, kBlockN, kSplitK, false, kForeign>, grid, dim3(kThreads), 0, stream, args);
  }
  return last_launch_status();
}

#if !defined(__HIPCC__)
// The staged split-K kernel: a block owns kMTiles x 16 rows and kBlockN columns, each warp keeps kRing of its K
// blocks in flight through shared memory (kRing x 4 to 8 KiB a warp).
template <int kBlockN, int kRing, int kMTiles = 1>
LaunchStatus launch_staged(const BmmA8W8MxScaleArgs& args, hipStream_t stream) {
  constexpr size_t shared_bytes =
      static_cast<size_t>(kWarps) * kRing * kStagedChunks<kMTiles, kBlockN / kTileN> * kWarpSize * 16;
  constexpr auto kernel = bmm_kernel<kMTiles, kBlockN, true, true, false, kRing>;
  const int64_t m_tiles = (args.m + kMTiles * 16 - 1) / (kMTiles * 16);
  if (m_tiles > 0x7fffffff || args.groups > 65535 || args.n / kBlockN > 65535) return LaunchStatus::kInvalidArgument;
  if (!allow_dynamic_shared_memory<kernel>(shared_bytes)) {
    return launch_config<1, 16, true>(args, true, stream);  // a device with less shared memory a block
  }
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(args.n / kBlockN),
                  static_cast<unsigned>(args.groups));
  launch_overlapping(kernel, grid, dim3(kThreads), shared_bytes, stream, args);
  return last_launch_status();
}
#endif

}  // namespace

LaunchStatus launch_bmm_a8w8_mxscale(const BmmA8W8MxScaleArgs& args, void* stream) {
  if (args.m < 0 || args.groups < 1 || args.n < kBlockK || args.k < kBlockK || args.n % kBlockK != 0 ||
      args.k % kBlockK != 0) {
    return LaunchStatus::kInvalidArgument;
  }
  if (args.m == 0) return LaunchStatus::kOk;
  const bool vector = is_aligned(args.x, 16) && is_aligned(args.w, 16) && args.x_stride_m % 16 == 0 &&
                      args.x_stride_g % 16 == 0 && args.w_stride_g % 16 == 0 && args.w_stride_n % 16 == 0;
  const auto hip_stream = static_cast<hipStream_t>(stream);
#if !defined(__HIPCC__)
  // sm_90a with reduced-precision block sums allowed: the wgmma kernel where it beats the kernels below
  // (H200, N = 1024, K = 4096): 128 x 128 tiles above M = 64 when there are at least 128 of them (M = 4096,
  // G = 8: 438 us against 1458), else 64 x 128 tiles from M = 17 when there are 128 of them (M = 64,
  // G = 16: 25 us against 92), else 64 x 64 tiles with at least 64 of them (M = 64, G = 8: 16 us against
  // 46). Up to M = 16, and with fewer tiles (M <= 64 at G <= 2), the split-K kernel keeps the lead (M = 16,
  // G = 8: 13.5 us against 16.7; M = 64, G = 1: 6.6 against 16.4). Nor did splitting the 64 x 64 tiles' K over a
  // cluster of 2, 4 or 8 blocks (sums added in rank order through distributed shared memory) win there: H100,
  // graph replay, same run, M = 64 / 32: G = 2 10.6 / 7.3 us for the split-K kernel against 10.1 / 9.9 (2 blocks),
  // 14.8 / 14.6 (4), 20.5 / 20.4 (8); G = 1 6.9 / 5.1 against 9.5 / 9.3, 8.1 / 8.0, 14.1 / 13.9: more blocks
  // a tile cost more than their shorter K saves.
  // With fp32 sums, bmm_wgmma_f16_kernel where it beats the mma.sync kernels (H200, graph replay): 256 x 128
  // tiles when at least 128 of them fill the GPU, else the 128 x 128 tiles above M = 64, the 64 x 128 tiles
  // from 33 rows and the 64 x 64 tiles from 33 rows when there are 64 of them. Chosen on a same-run comparison of
  // an earlier build of the kernel (G = 8: M = 4096 749 us against 869 for the 128 x 128 tiles, M = 16384 2879
  // against 3341; G = 1, M = 4096 98.6 against 110.3; but G = 8, M = 256 58.9 against 97.2 for the 256-row
  // tiles, G = 1, M = 1024 38.4 against 90.6). The 64 x 64 tiles split K over two blocks (4 stages each, two
  // blocks an SM) from 2 K blocks; H200, one run, split / unsplit (8 stages) / mma.sync kernels: G = 8, M = 64
  // 21.3 / 24.6 / 35.9 us; G = 4, M = 128 20.8 / 24.2 / 34.4; G = 2, M = 256 20.0 / 23.1 / 31.9; G = 1, M = 256
  // 15.2 / 22.3 / 17.2; G = 1, M = 512 20.3 / 20.3 / 46.6. Splitting over 4 blocks was slower (G = 8, M = 64:
  // 36.4), and so was splitting the 64 x 128 tiles that G = 16, M = 64 takes (45.6 against 36.2 in one run).
  // From 33 to 64 rows with 64 or more 128-row weight tiles (N = 1024: G >= 8), bmm_wgmma_f16_small_m_kernel
  // instead (its comment has the numbers), which takes the 64 x 64 and 64 x 128 tiles' place there.
  // (Grids of more than 65535 M tiles, M > 4M rows, take the kernels below, whose M tiles run along x.)
  // (OCP operands only: the FNUZ codes an OCP unit cannot hold are rewritten per fragment by the kernels below.)
  if (vector && args.x_format == Fp8Format::kOCP && args.w_format == Fp8Format::kOCP &&
      (args.m + 63) / 64 <= 65535 && device_runs_wgmma()) {
    const int64_t tall_tiles = (args.m + 255) / 256 * (args.n / 128) * args.groups;
    const int64_t large_tiles = (args.m + 127) / 128 * (args.n / 128) * args.groups;
    const int64_t wide_tiles = (args.m + 63) / 64 * (args.n / 128) * args.groups;
    const int64_t small_tiles = (args.m + 63) / 64 * (args.n / 64) * args.groups;
    if (args.reduced_precision_block_sums) {
      if (args.m > 64 && large_tiles >= 128) return launch_wgmma<2, 128, 4>(args, hip_stream);
      if (args.m > 16 && wide_tiles >= 128) return launch_wgmma<1, 128, 6>(args, hip_stream);
      if (args.m > 16 && small_tiles >= 64) return launch_wgmma<1, 64, 8>(args, hip_stream);
    } else {
      if (args.m > 64 && tall_tiles >= 128) return launch_wgmma_f16<2, 2, 128, 3>(args, hip_stream);
      if (args.m > 64 && large_tiles >= 128) return launch_wgmma_f16<2, 1, 128, 5>(args, hip_stream);
      // 33-64 rows with at least 64 blocks of 128 weight rows (N = 1024: G >= 8): the weight as the A operand,
      // K split over two blocks where there are fewer than 128 of them (and K has two blocks).
      const int64_t weight_row_tiles = args.n / kSmallMWeightRows * args.groups;
      if (args.m > 32 && args.m <= kSmallMTokens && weight_row_tiles >= 64) {
        if (weight_row_tiles < 128 && args.k / kBlockK >= 2) return launch_wgmma_f16_small_m<2>(args, hip_stream);
        return launch_wgmma_f16_small_m<1>(args, hip_stream);
      }
      if (args.m > 32 && wide_tiles >= 128) return launch_wgmma_f16<1, 1, 128, 6>(args, hip_stream);
      if (args.m > 32 && small_tiles >= 64) {
        if (args.k / kBlockK >= 2) return launch_wgmma_f16<1, 1, 64, 4, 2>(args, hip_stream);
        return launch_wgmma_f16<1, 1, 64, 8>(args, hip_stream);
      }
    }
  }
#endif
  // M <= 64: 16-row tiles (H200: 13.7 us for M = 16, G = 8, where 64-row tiles took 50 us at M = 64 with
  // one 254-register block per SM); the M tiles of an N tile are neighbours in the grid, so the weight
  // tile they share is read from DRAM about once.
  const int64_t m_tiles = (args.m + kTileM - 1) / kTileM;
  // Up to M = 256, a tiled grid of less than one block per SM of a current GPU (H200: 132) leaves most of
  // it idle (M = 256, G = 1: 32 blocks, 52 us): the split-K kernel's many small blocks serve it instead.
  constexpr int64_t kFewBlocks = 132;
  const bool few_tiles = args.m <= 256 && m_tiles * (args.n / kTileNLarge) * args.groups < kFewBlocks;
  // Operands in the other encoding than the unit's (a compatibility path: each platform's own callers
  // store its encoding) take the bmm_kernel instantiations that rewrite their codes.
  const Fp8Format unit_format = device_matrix_units_read_fnuz() ? Fp8Format::kFNUZ : Fp8Format::kOCP;
  if (args.x_format != unit_format || args.w_format != unit_format) {
    if (args.m <= 64 || few_tiles) return launch_config<1, 16, true, true>(args, vector, hip_stream);
    return launch_config<4, 128, false, true>(args, vector, hip_stream);
  }
#if !defined(__HIPCC__)
  // NVIDIA: the staged split-K kernel (H200, N = 1024, K = 4096, against the register-prefetch kernel in the
  // same run): grids of at most one 16-column block per SM (M <= 16 at G <= 2) keep 4 K blocks a warp in
  // flight (G = 1, M = 1: 4.1 us against 6.0; G = 2, M = 16: 5.8 against 6.9); larger ones take 32 columns
  // and 2 K blocks a warp, so that two blocks fit an SM (G = 8, M = 1: 12.7 against 15.0; G = 16, M = 1:
  // 22.4 against 26.8; G = 16, M = 16: 24.6 against 29.6; G = 2, M = 64: 9.8 against 13.1).
  if ((args.m <= 64 || few_tiles) && vector) {
    const int64_t narrow_blocks = (args.m + 15) / 16 * (args.n / 16) * args.groups;
    if (narrow_blocks <= kFewBlocks) return launch_staged<16, 4>(args, hip_stream);
    // Two M tiles a block (each staged weight fragment serves 32 rows) where that grid, of 16 columns a block or
    // else 32, is at most one block an SM: H100, graph replay, same run, one tile -> two (us): G = 2, M = 48 10.2 ->
    // 9.7, M = 64 10.4 -> 9.7 (32 columns), M = 32 7.3 -> 7.6; G = 1, M = 64 6.8 -> 6.9, M = 48 6.3 -> 6.8. The wo_a
    // forward (the quantization, then this kernel launched to overlap it) gains more: G = 1, T = 64 12.5 -> 10.0;
    // G = 2, T = 32 12.9 -> 10.4, T = 64 14.4 -> 13.0. Four M tiles a block spill (255 registers).
    if (args.m <= 64) {
      const int64_t pair_tiles = (args.m + 31) / 32;
      if (pair_tiles * (args.n / 16) * args.groups <= kFewBlocks) return launch_staged<16, 2, 2>(args, hip_stream);
      if (pair_tiles * (args.n / 32) * args.groups <= kFewBlocks) return launch_staged<32, 2, 2>(args, hip_stream);
    }
    return launch_staged<32, 2>(args, hip_stream);
  }
#endif
  if (args.m <= 64 || few_tiles) return launch_config<1, 16, true>(args, vector, hip_stream);
  // Unaligned rows (no staging), or more 128-row tiles than grid y holds (M > 8M rows): the M tiles along x.
  if (!vector || m_tiles > 65535) return launch_config<4, 128, false>(args, vector, hip_stream);
  if (args.groups > 65535) return LaunchStatus::kInvalidArgument;
  const dim3 grid(static_cast<unsigned>(args.n / kTileNLarge), static_cast<unsigned>(m_tiles),
                  static_cast<unsigned>(args.groups));
  launch_overlapping(bmm_tiled_kernel, grid, dim3(kThreads), 0, hip_stream, args);
  return last_launch_status();
}

}  // namespace dsv4::gpu
