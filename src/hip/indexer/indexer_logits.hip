// Lightning-indexer logits on the matrix units (spec/indexer.md §3, §4):
//   logits[r, j] = k_scale[j] * sum_h weights[r, h] * ReLU(q[r, h, :] . k[j, :])
// (ReLU commutes with the positive k_scale), never materialising the [rows, heads, keys] scores.
//
// Work split. A block of 128 threads serves 2 query rows; the warps of a row (2 on NVIDIA, 1 wavefront
// on AMD) take interleaved sub-tiles of keys of the row's window, within the key chunk of the block
// (grid.y splits the key range so that few rows still fill the GPU). A warp keeps the FP8 fragments of
// all heads x dim of its query row in registers for the whole key loop; per sub-tile it loads each key
// row (FP8 bytes, straight from global memory: 16-byte loads, every byte of a fetched row used, one
// sub-tile ahead) as the B operand and runs one MMA per (16 heads, 32 dims) against it. The heads of the row are the MMA's M
// dimension, D its K dimension, the keys its N dimension. The epilogue applies ReLU and the head
// weights on the accumulator fragments, reduces over the lanes that hold the other heads, and writes one
// logit per key.
//   * NVIDIA sm_89+: mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, 8 keys per sub-tile.
//   * gfx942/gfx950: __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8, 16 keys per sub-tile; on gfx950 at 128
//     dims the double-rate v_mfma_f32_16x16x128_f8f6f4 instead (one per 16 heads: a lane's 32 bytes).
// Because a dot product does not depend on the order of its terms, a lane's operand bytes are a
// contiguous slice of the row (lane part p holds bytes [p * D/4, (p+1) * D/4) of its head row and of its
// key row) rather than the ISA's k order: A and B use the same permutation of d.
//
// Encodings (spec §2, §3.5). Byte 0x80 reads as +0 in either encoding: on gfx942 (whose FNUZ unit
// reads it as NaN) it is scrubbed to 0x00 in both operands; an OCP unit (NVIDIA, gfx950) reads it as -0,
// which adds nothing to a dot product, so it passes as is. The instruction's native encoding is OCP on
// NVIDIA and gfx950, FNUZ on gfx942. An operand
// in the other encoding is passed as raw bytes, which scales its value by a power of two (FNUZ value =
// OCP value / 2 byte for byte): the result is compensated exactly by 0.5 (FNUZ operand on an OCP unit)
// or 2 (OCP operand on gfx942) per operand. The only bytes this cannot carry are FNUZ 0x7F/0xFF
// (+-240) on an OCP unit, where they would read as NaN: they are clamped to +-224 (the project's FNUZ
// quant max, so no project writer emits them).
//
// Other shapes (heads not 16/32/64, dim not 64/128, rows not 16-byte aligned) use a scalar kernel with
// the CPU path's exact decode and summation order.
#include <cmath>

#include "dsv4/async_copy.h"
#include "dsv4/launch.h"
#include "dsv4/wgmma.h"
#if !defined(__HIPCC__)
#include <cudaTypedefs.h>  // CUtensorMap and the encoder's type (the encoder comes through the runtime)
#endif
#include "indexer/indexer_launchers.h"

#if DSV4_DEVICE_PASS && defined(__HIP_DEVICE_COMPILE__) && (defined(__gfx942__) || defined(__gfx950__))
#define DSV4_INDEXER_MFMA 1
#elif DSV4_DEVICE_PASS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DSV4_INDEXER_MMA_SYNC 1
#endif

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 2;      // query rows per block; warps per row = kThreads / kWarpSize / 2
constexpr int kMinBlocks = 3;        // resident blocks per SM the register budget must allow (12 warps on NVIDIA)
constexpr int64_t kTargetBlocks = 1056;  // about 8 per SM on current GPUs
constexpr int64_t kMinChunk = 64;     // keys per block at least, when the key range is split

DSV4_DEVICE int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

DSV4_DEVICE float minus_inf() { return -__builtin_huge_valf(); }

// Eight FP8 codes of an operand in `fnuz` (else OCP) encoding, as the matrix unit reads them (file comment).
DSV4_DEVICE uint64_t to_native(uint64_t x, bool fnuz) {
  constexpr uint64_t kSign = 0x8080808080808080ull;
#if defined(__gfx942__)
  (void)fnuz;
  return x & ~zero_byte_flags(x ^ kSign);  // 0x80 (the FNUZ unit's NaN) -> 0x00, in either encoding
#else
  // An OCP unit reads 0x80 as -0, which adds nothing: no scrub. FNUZ 0x7F/0xFF (+-240) would read as NaN:
  // they become 0x7E/0xFE (+-224).
  return fnuz ? x - (zero_byte_flags(~(x | kSign)) >> 7) : x;
#endif
}

// The exact factor that turns the unit's reading of an operand's raw bytes into the operand's value.
DSV4_DEVICE float native_factor(bool fnuz) {
#if defined(__gfx942__)
  return fnuz ? 1.0f : 2.0f;
#else
  return fnuz ? 0.5f : 1.0f;
#endif
}

// KS 8-byte words from p (16-byte aligned when KS is even, else 8-byte aligned).
template <int KS>
DSV4_DEVICE void load_words(const uint8_t* p, uint64_t (&w)[KS]) {
  if constexpr (KS % 2 == 0) {
#pragma unroll
    for (int i = 0; i < KS / 2; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[2 * i] = static_cast<uint64_t>(v.x) | (static_cast<uint64_t>(v.y) << 32);
      w[2 * i + 1] = static_cast<uint64_t>(v.z) | (static_cast<uint64_t>(v.w) << 32);
    }
  } else {
#pragma unroll
    for (int i = 0; i < KS; ++i) w[i] = reinterpret_cast<const uint64_t*>(p)[i];
  }
}

DSV4_DEVICE float lane_xor(float v, int mask) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl_xor(v, mask, kWarpSize);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

// Keys of the prefill op: contiguous rows.
struct ContiguousKeys {
  const uint8_t* k;
  int64_t row_stride;
  const float* scale;
  DSV4_DEVICE const uint8_t* bytes(int64_t key) const { return k + key * row_stride; }
  DSV4_DEVICE float key_scale(int64_t key) const { return scale[key]; }
};

// Keys of the decode op: the block-flat paged cache through one request's block-table row. A key whose
// table entry is missing or out of range has no bytes (nullptr).
struct PagedKeys {
  const uint8_t* cache;
  const int32_t* table;  // the request's row
  int64_t table_cols;
  int64_t num_blocks;
  int64_t block_size;
  int64_t block_stride;
  int64_t dim;
  DSV4_DEVICE const uint8_t* block(int64_t key, int64_t& entry) const {
    const IndexSplit split = divide_index(key, block_size);
    entry = split.remainder;
    const int64_t b = split.quotient < table_cols ? table[split.quotient] : -1;
    return (b < 0 || b >= num_blocks) ? nullptr : cache + b * block_stride;
  }
  DSV4_DEVICE const uint8_t* bytes(int64_t key) const {
    int64_t entry;
    const uint8_t* base = block(key, entry);
    return base != nullptr ? base + entry * dim : nullptr;
  }
  DSV4_DEVICE float key_scale(int64_t key) const {
    int64_t entry;
    const uint8_t* base = block(key, entry);
    return *reinterpret_cast<const float*>(base + block_size * dim + entry * 4);
  }
};

// What a lane fetches of one key, one sub-tile ahead of its use: its KS words of the key row, the key's
// scale and whether the key's block exists (zeros and no scale where it is missing).
template <int KS>
struct KeyFetch {
  uint64_t words[KS];
  float scale;
  bool present;
};

template <int KS, class Keys>
DSV4_DEVICE void fetch_key(const Keys& keys, int64_t key, int part, KeyFetch<KS>& f) {
  const uint8_t* kb = keys.bytes(key);
  f.present = kb != nullptr;
  if (f.present) {
    load_words<KS>(kb + part * 8 * KS, f.words);
    f.scale = keys.key_scale(key);
  } else {
#pragma unroll
    for (int s = 0; s < KS; ++s) f.words[s] = 0;
    f.scale = 0.0f;
  }
}

DSV4_DEVICE float lane_value(float v, int src) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl(v, src, kWarpSize);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

DSV4_DEVICE int lane_value(int v, int src) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl(v, src, kWarpSize);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

// One warp: logits of one query row for the keys [lo, hi), sub-tiles sub_first, sub_first + sub_step, ...
// q: the row's [HT * 16, KS * 32] codes at head_stride; w: its HT * 16 weights.
template <int HT, int KS, class Keys>
DSV4_DEVICE void row_logits(const uint8_t* q, int64_t head_stride, const float* w, const Keys& keys, int64_t lo,
                            int64_t hi, int sub_first, int sub_step, float factor, bool q_fnuz, bool k_fnuz,
                            float* out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#if defined(DSV4_INDEXER_MMA_SYNC)
  constexpr int kSub = 8;
  const int part = lane & 3;   // threadID_in_group: the lane's slice of every row
  const int krow = lane >> 2;  // groupID: A rows krow and krow + 8 of each head tile, B column (key) krow
  uint64_t a[HT][2][KS];
  float wt[HT][2];
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int head = ht * 16 + krow + 8 * half;
      load_words<KS>(q + head * head_stride + part * 8 * KS, a[ht][half]);
#pragma unroll
      for (int s = 0; s < KS; ++s) a[ht][half][s] = to_native(a[ht][half][s], q_fnuz);
      wt[ht][half] = w[head];
    }
  }
  const int64_t step = static_cast<int64_t>(sub_step) * kSub;
  int64_t base = lo + static_cast<int64_t>(sub_first) * kSub;
  KeyFetch<KS> next;  // the lane's key of the next sub-tile, loaded one iteration ahead
  if (base < hi) fetch_key<KS>(keys, base + krow < hi ? base + krow : hi - 1, part, next);
  for (; base < hi; base += step) {
    uint64_t b[KS];
#pragma unroll
    for (int s = 0; s < KS; ++s) b[s] = to_native(next.words[s], k_fnuz);
    const float key_scale = next.scale;
    const int key_present = next.present ? 1 : 0;
    if (base + step < hi) fetch_key<KS>(keys, base + step + krow < hi ? base + step + krow : hi - 1, part, next);
    float acc[HT][4];
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) acc[ht][0] = acc[ht][1] = acc[ht][2] = acc[ht][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const uint32_t b0 = static_cast<uint32_t>(b[s]), b1 = static_cast<uint32_t>(b[s] >> 32);
#pragma unroll
      for (int ht = 0; ht < HT; ++ht) {
        // a0: row krow, k 4p..4p+3; a1: row krow+8, same k; a2/a3: k 16+4p..; b0: k 4p..; b1: k 16+4p..
        ptx::mma_m16n8k32_e4m3(acc[ht],
                               {static_cast<uint32_t>(a[ht][0][s]), static_cast<uint32_t>(a[ht][1][s]),
                                static_cast<uint32_t>(a[ht][0][s] >> 32), static_cast<uint32_t>(a[ht][1][s] >> 32)},
                               {b0, b1});
      }
    }
    // c0, c1: head krow, keys 2p, 2p+1; c2, c3: head krow + 8, same keys.
    float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
      p0 += wt[ht][0] * fmaxf(acc[ht][0], 0.0f) + wt[ht][1] * fmaxf(acc[ht][2], 0.0f);
      p1 += wt[ht][0] * fmaxf(acc[ht][1], 0.0f) + wt[ht][1] * fmaxf(acc[ht][3], 0.0f);
    }
#pragma unroll
    for (int mask = 4; mask < 32; mask <<= 1) {
      p0 += lane_xor(p0, mask);
      p1 += lane_xor(p1, mask);
    }
    // Key 2p + e of the sub-tile was fetched by the lanes of group 2p + e.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float scale = lane_value(key_scale, (2 * part + e) * 4);
      const int present = lane_value(key_present, (2 * part + e) * 4);
      const int64_t j = base + 2 * part + e;
      if (krow == 0 && j < hi) out[j] = present ? (e == 0 ? p0 : p1) * (scale * factor) : minus_inf();
    }
  }
#elif defined(DSV4_INDEXER_MFMA)
  typedef float floatx4 __attribute__((ext_vector_type(4)));
  constexpr int kSub = 16;
  const int part = lane >> 4;  // the lane's slice of every row (k group)
  const int krow = lane & 15;  // A row (head) and B column (key) of the lane
  uint64_t a[HT][KS];
  float wt[HT][4];
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
    load_words<KS>(q + (ht * 16 + krow) * head_stride + part * 8 * KS, a[ht]);
#pragma unroll
    for (int s = 0; s < KS; ++s) a[ht][s] = to_native(a[ht][s], q_fnuz);
#pragma unroll
    for (int i = 0; i < 4; ++i) wt[ht][i] = w[ht * 16 + 4 * part + i];  // D rows 4p..4p+3 of the lane
  }
  const int64_t step = static_cast<int64_t>(sub_step) * kSub;
  int64_t base = lo + static_cast<int64_t>(sub_first) * kSub;
  KeyFetch<KS> next;  // the lane's key of the next sub-tile, loaded one iteration ahead
  if (base < hi) fetch_key<KS>(keys, base + krow < hi ? base + krow : hi - 1, part, next);
  for (; base < hi; base += step) {
    uint64_t b[KS];
#pragma unroll
    for (int s = 0; s < KS; ++s) b[s] = to_native(next.words[s], k_fnuz);
    const float key_scale = next.scale;
    const int key_present = next.present ? 1 : 0;
    if (base + step < hi) fetch_key<KS>(keys, base + step + krow < hi ? base + step + krow : hi - 1, part, next);
    floatx4 acc[HT];
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) acc[ht] = floatx4{0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__gfx950__)
    if constexpr (KS % 4 == 0) {
      // The block-scaled MFMA's form without scales (immediate zero scale operands select it), both operands
      // e4m3 (format code 0): a lane's four 8-byte words of each operand as its 32 bytes.
      typedef int Int8 __attribute__((ext_vector_type(8)));
      const auto words32 = [](const uint64_t* w) {
        return Int8{static_cast<int>(w[0]), static_cast<int>(w[0] >> 32), static_cast<int>(w[1]),
                    static_cast<int>(w[1] >> 32), static_cast<int>(w[2]), static_cast<int>(w[2] >> 32),
                    static_cast<int>(w[3]), static_cast<int>(w[3] >> 32)};
      };
#pragma unroll
      for (int s = 0; s < KS; s += 4) {
        const Int8 bw = words32(&b[s]);
#pragma unroll
        for (int ht = 0; ht < HT; ++ht) {
          acc[ht] = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(words32(&a[ht][s]), bw, acc[ht], 0, 0, 0, 0, 0,
                                                                     0);
        }
      }
    } else
#endif
    {
#pragma unroll
      for (int s = 0; s < KS; ++s) {
#pragma unroll
        for (int ht = 0; ht < HT; ++ht) {
          acc[ht] = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a[ht][s]), static_cast<long>(b[s]),
                                                               acc[ht], 0, 0, 0);
        }
      }
    }
    // acc[ht][i]: head ht * 16 + 4 * part + i, key krow.
    float p = 0.0f;
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p += wt[ht][i] * fmaxf(acc[ht][i], 0.0f);
    }
    p += lane_xor(p, 16);
    p += lane_xor(p, 32);
    const int64_t j = base + krow;
    if (part == 0 && j < hi) out[j] = key_present ? p * (key_scale * factor) : minus_inf();
  }
#else
  (void)lane, (void)q, (void)head_stride, (void)w, (void)keys, (void)lo, (void)hi, (void)sub_first, (void)sub_step;
  (void)factor, (void)q_fnuz, (void)k_fnuz, (void)out;
#if DSV4_DEVICE_PASS
  device_trap();  // never launched: the host picks the scalar kernel where no matrix unit path exists
#endif
#endif
}

struct RowPlace {
  int64_t row;
  int sub;            // this warp's index among the row's warps
  int warps_per_row;
  int lane_in_row;    // thread index among the row's threads
};

// reversed: the last rows first (in causal prefill they have the longest windows: the short ones then
// fill the tail of the grid).
DSV4_DEVICE RowPlace row_place(bool reversed) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps_per_row = (kThreads / kWarpSize) / kRowsPerBlock;
  const int64_t block = reversed ? static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x : blockIdx.x;
  RowPlace p;
  p.row = block * kRowsPerBlock + warp / warps_per_row;
  p.sub = warp % warps_per_row;
  p.warps_per_row = warps_per_row;
  p.lane_in_row = p.sub * kWarpSize + static_cast<int>(threadIdx.x) % kWarpSize;
  return p;
}

// -inf at the columns of [c0, c1) outside [start, stop), by the row's threads.
DSV4_DEVICE void fill_outside(float* out, int64_t c0, int64_t c1, int64_t start, int64_t stop, const RowPlace& p) {
  for (int64_t j = c0 + p.lane_in_row; j < c1; j += static_cast<int64_t>(p.warps_per_row) * kWarpSize) {
    if (j < start || j >= stop) out[j] = minus_inf();
  }
}

template <int HT, int KS>
__global__ void __launch_bounds__(kThreads, kMinBlocks) mqa_logits_mma_kernel(MqaLogitsArgs args, int64_t chunk) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const RowPlace p = row_place(/*reversed=*/true);
  if (p.row >= args.m) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t c1 = c0 + chunk < args.n ? c0 + chunk : args.n;
  const int64_t start = clamp64(args.ks[p.row], 0, args.n);
  const int64_t stop = clamp64(args.ke[p.row], start, args.n);
  float* out = args.logits + p.row * args.logits_row_stride;
  if (args.clean) fill_outside(out, c0, c1, start, stop, p);
  const int64_t lo = start > c0 ? start : c0;
  const int64_t hi = stop < c1 ? stop : c1;
  if (lo >= hi) return;
  const bool q_fnuz = args.q_format == Fp8Format::kFNUZ, k_fnuz = args.k_format == Fp8Format::kFNUZ;
  row_logits<HT, KS>(args.q + p.row * args.q_row_stride, args.q_head_stride, args.weights + p.row * args.heads,
                     ContiguousKeys{args.k, args.k_row_stride, args.k_scale}, lo, hi, p.sub, p.warps_per_row,
                     native_factor(q_fnuz) * native_factor(k_fnuz), q_fnuz, k_fnuz, out);
}

template <int HT, int KS>
__global__ void __launch_bounds__(kThreads, kMinBlocks) paged_mqa_logits_mma_kernel(PagedMqaLogitsArgs args, int64_t chunk) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const RowPlace p = row_place(/*reversed=*/false);
  const int64_t rows = args.batch * args.next_n;
  if (p.row >= rows) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t c1 = c0 + chunk < args.max_model_len ? c0 + chunk : args.max_model_len;
  const int64_t length = args.row_length(p.row);
  float* out = args.logits + p.row * args.logits_row_stride;
  if (args.clean) fill_outside(out, c0, c1, 0, length, p);
  const int64_t hi = length < c1 ? length : c1;
  if (c0 >= hi) return;
  const int64_t b = p.row / args.next_n;
  const bool q_fnuz = args.q_format == Fp8Format::kFNUZ, k_fnuz = args.kv_format == Fp8Format::kFNUZ;
  const PagedKeys keys{args.cache,      args.block_tables + b * args.table_row_stride,
                       args.table_cols, args.num_blocks,
                       args.block_size, args.block_stride,
                       args.dim};
  row_logits<HT, KS>(args.q + p.row * args.heads * args.dim, args.dim, args.weights + p.row * args.heads, keys, c0,
                     hi, p.sub, p.warps_per_row, native_factor(q_fnuz) * native_factor(k_fnuz), q_fnuz, k_fnuz,
                     out);
}

DSV4_DEVICE float indexer_value(uint8_t code, Fp8Format format) {
  return format == Fp8Format::kFNUZ ? indexer_fp8_value<Fp8Format::kFNUZ>(code)
                                    : indexer_fp8_value<Fp8Format::kOCP>(code);
}

// sum_h w[h] * ReLU(scale * (q_h . k)) in the CPU path's order.
DSV4_DEVICE float scalar_logit(const uint8_t* q, int64_t head_stride, Fp8Format q_format, const uint8_t* k,
                               Fp8Format k_format, const float* w, float scale, int64_t heads, int64_t dim) {
  float logit = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    float dot = 0.0f;
    for (int64_t d = 0; d < dim; ++d) dot += indexer_value(q[h * head_stride + d], q_format) * indexer_value(k[d], k_format);
    const float s = dot * scale;
    logit += w[h] * (s > 0.0f ? s : 0.0f);
  }
  return logit;
}

__global__ void __launch_bounds__(kElementwiseThreads) mqa_logits_scalar_kernel(MqaLogitsArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int64_t total = args.m * args.n;
  for (int64_t e = global_thread_index(); e < total; e += global_thread_count()) {
    const IndexSplit rc = divide_index(e, args.n);
    const int64_t i = rc.quotient, j = rc.remainder;
    const int64_t start = clamp64(args.ks[i], 0, args.n);
    const int64_t stop = clamp64(args.ke[i], start, args.n);
    float* out = args.logits + i * args.logits_row_stride + j;
    if (j < start || j >= stop) {
      if (args.clean) *out = minus_inf();
      continue;
    }
    *out = scalar_logit(args.q + i * args.q_row_stride, args.q_head_stride, args.q_format, args.k + j * args.k_row_stride,
                        args.k_format, args.weights + i * args.heads, args.k_scale[j], args.heads, args.dim);
  }
}

__global__ void __launch_bounds__(kElementwiseThreads) paged_mqa_logits_scalar_kernel(PagedMqaLogitsArgs args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  const int64_t total = args.batch * args.next_n * args.max_model_len;
  for (int64_t e = global_thread_index(); e < total; e += global_thread_count()) {
    const IndexSplit rc = divide_index(e, args.max_model_len);
    const int64_t r = rc.quotient, t = rc.remainder;
    float* out = args.logits + r * args.logits_row_stride + t;
    if (t >= args.row_length(r)) {
      if (args.clean) *out = minus_inf();
      continue;
    }
    const PagedKeys keys{args.cache,      args.block_tables + (r / args.next_n) * args.table_row_stride,
                         args.table_cols, args.num_blocks,
                         args.block_size, args.block_stride,
                         args.dim};
    const uint8_t* k = keys.bytes(t);
    *out = k == nullptr ? minus_inf()
                        : scalar_logit(args.q + r * args.heads * args.dim, args.dim, args.q_format, k, args.kv_format,
                                       args.weights + r * args.heads, keys.key_scale(t), args.heads, args.dim);
  }
}

#if !defined(__HIPCC__)
// ---- sm_90a: logits_wgmma_kernel (warpgroup MMA, Hopper's FP8 tensor-core path) ----------------------
// For heads 64 and dim 128 with OCP q and k (the encoding NVIDIA writers store; FNUZ operands keep the
// kernels above, which rewrite their codes), in both ops: a block of two warp groups owns kWgKeys
// consecutive keys, held in shared memory for the block's life, and a run of query rows (prefill: kWgRows
// rows; decode, where paged_logits_tma_kernel below does not serve the call: the next_n rows of one
// request, whose keys come through its block-table row). Each warp
// group multiplies its two 64-key tiles (M = keys, K = dim) by a row's q (N = heads), D[key, head] =
// k . q_h, so the heads lie along the accumulator's columns: a thread holds 16 heads of each of its 4 keys,
// applies ReLU and the weights, and the 4 lanes of a quad finish the sums (3 shuffles, after which each
// lane holds one key's logit). The rows' q (8 KB) and weights (256 B) come through a kWgStages-deep
// cp.async ring; rows whose window misses the block's keys skip the multiply. Operand tiles are 128-byte
// rows in the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)), as in the wgmma GEMM of wo_a.
// Numerics: the unit sums each 32-deep step of a dot product in fixed point aligned to the largest of its
// products and the running sum, keeping about 14 bits (dsv4/wgmma.h). Against the exact sums a logit is
// then off by up to ~1e-3 of its row's largest (random N(0,1) q and k, weights of mixed sign, on the
// H200), inside the spec's calc_diff < 1e-3 by orders of magnitude (spec §3.7); tests/test_indexer.py
// bounds the error elementwise from this model. The DeepGEMM and Triton peers on Hopper sum the same way.
constexpr int kWgKeys = 256;
constexpr int kWgRows = 128;
constexpr int kWgStages = 4;
constexpr int kWgThreads = 256;
constexpr int kWgHeads = 64;
constexpr int kWgDim = 128;
constexpr int kWgKeyBytes = kWgKeys * kWgDim;
constexpr int kWgQBytes = kWgHeads * kWgDim;
constexpr int kWgWeightBytes = kWgHeads * 4;
constexpr size_t kWgSharedBytes = kWgKeyBytes + kWgStages * (kWgQBytes + kWgWeightBytes) + 1024;  // + alignment

#if defined(DSV4_WGMMA)
// Scores of a warp group's two 64-key tiles (keys at a_tile, 128-byte rows) against one row's q (b_tile).
DSV4_DEVICE void wgmma_row_scores(float (&acc0)[32], float (&acc1)[32], uint32_t a_tile, uint32_t b_tile) {
  pin_registers(acc0);
  pin_registers(acc1);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kWgDim / 32; ++s) {
    wgmma_m64n64k32(acc0, swizzled_tile_descriptor(a_tile + 32 * s), swizzled_tile_descriptor(b_tile + 32 * s),
                    s > 0 ? 1u : 0u);
  }
#pragma unroll
  for (int s = 0; s < kWgDim / 32; ++s) {
    wgmma_m64n64k32(acc1, swizzled_tile_descriptor(a_tile + 64 * kWgDim + 32 * s),
                    swizzled_tile_descriptor(b_tile + 32 * s), s > 0 ? 1u : 0u);
  }
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(acc0);
  pin_registers(acc1);
}

// Adds w[h] ReLU(score) over this thread's heads of one 64-key tile's accumulator (the m64n64 layout: entry i
// is key row lane / 4 + 8 * ((i / 2) % 2), head 8 * (i / 4) + 2 * (lane % 4) + i % 2) into the sums of its low
// and high key, one fused multiply-add a head (at next_n = 2 these sums and the multiply set the decode
// kernel's pace); weights: the row's 64 fp32 head weights in shared memory. Kept in registers across the decode
// kernel's tiles instead, the weights made ptxas (CUDA 13.0) drop one of the pair path's two MMA chains, the PTX
// holding both: wrong logits.
DSV4_DEVICE void add_weighted_relu(const float* acc, const float* weights, int lane, float& low, float& high) {
  const float2* w = reinterpret_cast<const float2*>(weights) + (lane % 4);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 wj = w[4 * j];
    low = fmaf(wj.x, fmaxf(acc[4 * j], 0.0f), low);
    low = fmaf(wj.y, fmaxf(acc[4 * j + 1], 0.0f), low);
    high = fmaf(wj.x, fmaxf(acc[4 * j + 2], 0.0f), high);
    high = fmaf(wj.y, fmaxf(acc[4 * j + 3], 0.0f), high);
  }
}

// Quad reduction of v = (tile 0 low, tile 0 high, tile 1 low, tile 1 high) that leaves lane q with the sum of
// v[2 * (q >> 1 & 1) + (q & 1)] over the quad, the logit of its wgmma_lane_key: each step keeps half of the
// values and adds the partner's copy of them.
DSV4_DEVICE float quad_logit(const float (&v)[4], int lane) {
  const bool odd = (lane & 1) != 0;
  const float keep0 = odd ? v[1] : v[0], keep1 = odd ? v[3] : v[2];
  const float give0 = odd ? v[0] : v[1], give1 = odd ? v[2] : v[3];
  const float u0 = keep0 + lane_xor(give0, 1);
  const float u1 = keep1 + lane_xor(give1, 1);
  const bool upper = (lane & 2) != 0;
  return (upper ? u1 : u0) + lane_xor(upper ? u0 : u1, 2);
}

// sum_h w[h] ReLU(score) of this lane's key (wgmma_lane_key) from wgmma_row_scores' accumulators.
DSV4_DEVICE float wgmma_row_logit(const float (&acc0)[32], const float (&acc1)[32], const float* weights, int lane) {
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  add_weighted_relu(acc0, weights, lane, v[0], v[1]);
  add_weighted_relu(acc1, weights, lane, v[2], v[3]);
  return quad_logit(v, lane);
}

// Two rows at once: their q are adjacent 64-row tiles at b_tile (one 128-row B operand) and their weights
// adjacent at weights, so one m64n128k32 chain per 64-key tile scores both (columns 0-63 the first row's
// heads, 64-127 the second's: accumulator entries 0-31 and 32-63, each in the m64n64 layout).
DSV4_DEVICE void wgmma_pair_logits(uint32_t a_tile, uint32_t b_tile, const float* weights, int lane,
                                   float (&logit)[2]) {
  float v[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  float acc[64];
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    pin_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kWgDim / 32; ++s) {
      wgmma_m64n128k32(acc, swizzled_tile_descriptor(a_tile + tile * 64 * kWgDim + 32 * s),
                       swizzled_tile_descriptor(b_tile + 32 * s), s > 0 ? 1u : 0u);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(acc);
    add_weighted_relu(acc, weights, lane, v[0][2 * tile], v[0][2 * tile + 1]);
    add_weighted_relu(acc + 32, weights + kWgHeads, lane, v[1][2 * tile], v[1][2 * tile + 1]);
  }
  logit[0] = quad_logit(v[0], lane);
  logit[1] = quad_logit(v[1], lane);
}
#endif

// The key (offset in a kWgKeys tile) whose logit wgmma_row_logit leaves in this thread: tile bit 1 of the
// lane, half bit 0.
DSV4_DEVICE int wgmma_lane_key(int tid) {
  const int lane = tid % 32;
  return (tid / 128) * 128 + ((lane >> 1) & 1) * 64 + ((tid / 32) % 4) * 16 + lane / 4 + 8 * (lane & 1);
}

// 16-byte chunk c = tid + j * kWgThreads of a tile of 128-byte rows is row c / 8, column c % 8; a thread's
// rows are all equal mod 8, so its offset in the 128-byte swizzle is one XOR.
DSV4_DEVICE uint32_t wgmma_copy_offset(int tid) {
  return static_cast<uint32_t>(tid * 16) ^ static_cast<uint32_t>(((tid / 8) % 8) * 16);
}

// The prefill problem of a block: keys [n0, n0 + kWgKeys) of k, rows [r0, r0 + rows) with windows [ks, ke).
struct MqaWgmmaBlock {
  const MqaLogitsArgs& args;
  int64_t n0, r0, rows;
  DSV4_DEVICE explicit MqaWgmmaBlock(const MqaLogitsArgs& a)
      : args(a),
        n0(static_cast<int64_t>(blockIdx.x) * kWgKeys),
        r0((static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y) * kWgRows),  // long causal windows first
        rows(a.m - r0 < kWgRows ? a.m - r0 : kWgRows) {}
  DSV4_DEVICE int64_t key_limit() const { return args.n; }
  DSV4_DEVICE void window(int64_t t, int64_t& lo, int64_t& hi) const {
    lo = clamp64(args.ks[r0 + t], 0, args.n);
    hi = clamp64(args.ke[r0 + t], lo, args.n);
  }
  DSV4_DEVICE const uint8_t* key_bytes(int64_t key) const {
    return key < args.n ? args.k + key * args.k_row_stride : nullptr;
  }
  DSV4_DEVICE float key_scale(int64_t key) const { return args.k_scale[key]; }
  DSV4_DEVICE const uint8_t* q_row(int64_t t) const { return args.q + (r0 + t) * args.q_row_stride; }
  DSV4_DEVICE int64_t q_head_stride() const { return args.q_head_stride; }
  DSV4_DEVICE const float* weights(int64_t t) const { return args.weights + (r0 + t) * kWgHeads; }
  DSV4_DEVICE float* logits(int64_t t) const { return args.logits + (r0 + t) * args.logits_row_stride; }
  DSV4_DEVICE bool clean() const { return args.clean; }
};

// The decode problem of a block: keys [n0, n0 + kWgKeys) of request blockIdx.y's block-table row, its next_n
// rows, row t seeing [0, row_length). A key whose block is missing has no bytes (its logit is -inf).
struct PagedWgmmaBlock {
  const PagedMqaLogitsArgs& args;
  PagedKeys keys;
  int64_t n0, r0, rows;
  DSV4_DEVICE explicit PagedWgmmaBlock(const PagedMqaLogitsArgs& a)
      : args(a),
        keys{a.cache, a.block_tables + static_cast<int64_t>(blockIdx.y) * a.table_row_stride, a.table_cols,
             a.num_blocks, a.block_size, a.block_stride, a.dim},
        n0(static_cast<int64_t>(blockIdx.x) * kWgKeys),
        r0(static_cast<int64_t>(blockIdx.y) * a.next_n),
        rows(a.next_n) {}
  DSV4_DEVICE int64_t key_limit() const { return args.max_model_len; }
  DSV4_DEVICE void window(int64_t t, int64_t& lo, int64_t& hi) const {
    lo = 0;
    hi = args.row_length(r0 + t);
  }
  DSV4_DEVICE const uint8_t* key_bytes(int64_t key) const {
    return key < args.max_model_len ? keys.bytes(key) : nullptr;
  }
  DSV4_DEVICE float key_scale(int64_t key) const { return keys.key_scale(key); }
  DSV4_DEVICE const uint8_t* q_row(int64_t t) const { return args.q + (r0 + t) * kWgHeads * kWgDim; }
  DSV4_DEVICE int64_t q_head_stride() const { return kWgDim; }
  DSV4_DEVICE const float* weights(int64_t t) const { return args.weights + (r0 + t) * kWgHeads; }
  DSV4_DEVICE float* logits(int64_t t) const { return args.logits + (r0 + t) * args.logits_row_stride; }
  DSV4_DEVICE bool clean() const { return args.clean; }
};

template <class Block, class Args>
__global__ void __launch_bounds__(kWgThreads, 2) logits_wgmma_kernel(Args args) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
#if defined(DSV4_WGMMA)
  DSV4_DYNAMIC_SHARED(uint8_t, wg_shared, 1024);
  const Block block(args);
  const uint32_t shared_raw = shared_window_address(wg_shared);
  const uint32_t padding = swizzle_atom_aligned(shared_raw) - shared_raw;
  const uint32_t keys_tile = shared_raw + padding;
  const uint32_t q_tiles = keys_tile + kWgKeyBytes;
  const uint32_t weight_tiles = q_tiles + kWgStages * kWgQBytes;
  const float* weight_tiles_generic =
      reinterpret_cast<const float*>(wg_shared + padding + kWgKeyBytes + kWgStages * kWgQBytes);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int64_t n0 = block.n0;
  const int64_t rows = block.rows;
  const int64_t key_limit = block.key_limit();
  const int64_t key_end = key_limit - n0 < kWgKeys ? key_limit : n0 + kWgKeys;

  const int64_t my_key = n0 + wgmma_lane_key(tid);
  const bool key_inside = my_key < key_limit;
  const auto fill_row = [&](int64_t t, int64_t lo, int64_t hi) {  // -inf at this lane's key outside the window
    if (block.clean() && key_inside && (my_key < lo || my_key >= hi)) block.logits(t)[my_key] = minus_inf();
  };

  // A block none of whose rows sees its keys only writes -inf (causal prefill: about half the blocks).
  bool sees = false;
  for (int64_t t = tid; t < rows; t += kWgThreads) {
    int64_t lo, hi;
    block.window(t, lo, hi);
    sees = sees || (lo < hi && lo < key_end && hi > n0);
  }
  if (!__syncthreads_or(sees)) {
    for (int64_t t = 0; t < rows; ++t) {
      int64_t lo, hi;
      block.window(t, lo, hi);
      fill_row(t, lo, hi);
    }
    return;
  }

  // Missing keys are filled with zeros.
  const uint32_t copy_offset = wgmma_copy_offset(tid);
#pragma unroll
  for (int j = 0; j < kWgKeyBytes / 16 / kWgThreads; ++j) {
    const int c = tid + j * kWgThreads;
    const uint8_t* row_bytes = block.key_bytes(n0 + c / 8);
    const uint8_t* src = row_bytes != nullptr ? row_bytes + (c % 8) * 16 : block.q_row(0);
    copy_async_16_or_zeros(keys_tile + copy_offset + j * kWgThreads * 16, src, row_bytes != nullptr);
  }
  const auto issue_row = [&](int64_t t) {  // row t into stage t % kWgStages; an empty group past the rows
    if (t < rows) {
      const uint8_t* q = block.q_row(t);
      const int64_t head_stride = block.q_head_stride();
      const uint32_t stage = static_cast<uint32_t>(t % kWgStages);
#pragma unroll
      for (int j = 0; j < kWgQBytes / 16 / kWgThreads; ++j) {
        const int c = tid + j * kWgThreads;
        const uint8_t* src = q + (c / 8) * head_stride + (c % 8) * 16;
        copy_async_16(q_tiles + stage * kWgQBytes + copy_offset + j * kWgThreads * 16, src);
      }
      if (tid < kWgWeightBytes / 16) {
        copy_async_16(weight_tiles + stage * kWgWeightBytes + tid * 16, block.weights(t) + tid * 4);
      }
    }
    copy_async_commit();
  };
#pragma unroll
  for (int t = 0; t < kWgStages - 1; ++t) issue_row(t);  // the keys travel in the first group

  const bool key_present = key_inside && block.key_bytes(my_key) != nullptr;
  const float key_scale = key_present ? block.key_scale(my_key) : 0.0f;
  const uint32_t a_tile = keys_tile + (tid / 128) * 128 * kWgDim;
  float acc0[32], acc1[32];
  for (int64_t t = 0; t < rows; ++t) {
    // Groups committed: t + kWgStages - 1; with at most kWgStages - 2 pending, row t (and the keys) landed.
    copy_async_wait<kWgStages - 2>();
    fence_shared_writes_for_wgmma();
    __syncthreads();  // every thread's copies visible; every warp group done with row t - 1's stage
    issue_row(t + kWgStages - 1);
    int64_t lo, hi;
    block.window(t, lo, hi);
    if (!(lo < hi && lo < key_end && hi > n0)) {
      fill_row(t, lo, hi);
      continue;
    }
    const uint32_t stage = static_cast<uint32_t>(t % kWgStages);
    wgmma_row_scores(acc0, acc1, a_tile, q_tiles + stage * kWgQBytes);
    const float logit = wgmma_row_logit(acc0, acc1, weight_tiles_generic + stage * kWgHeads, lane);
    if (key_inside) {
      float* out = block.logits(t) + my_key;
      if (my_key >= lo && my_key < hi) {
        *out = key_present ? logit * key_scale : minus_inf();
      } else if (block.clean()) {
        *out = minus_inf();
      }
    }
  }
  copy_async_wait<0>();
#else
  (void)args;
#if DSV4_DEVICE_PASS
  device_trap();  // no wgmma in this device pass; the launcher picks this kernel only where it runs
#endif
#endif
}

// ---- sm_90a decode: paged_logits_tma_kernel ------------------------------------------------------------
// The decode op with up to kTmaMaxRows rows per request and a cache block size in {8, ..., 256}: a block
// keeps one request's rows (q, weights) in shared memory and streams a run of its kWgKeys-key tiles through a
// kTmaStages-deep ring filled by the tensor memory accelerator: per cache block of a tile one box copy of its
// keys (a 3-D tensor map over the cache's key bytes, landing in the 128-byte swizzle the wgmma descriptors
// read) and one bulk copy of its scales, all completing on the stage's mbarrier. Warp 0 reads the block-table
// entries and issues the copies, so the memory system sees whole tiles in flight; the kernels fed by
// cp.async reach about a third of the copy bandwidth on the H200 (the load-store path caps the gather there).
// A missing block is not copied (its keys' logits are -inf; its rows in the stage hold stale bytes whose
// scores are discarded). Tiles past every row's length are only filled with -inf. grid = (runs of tiles,
// requests), two blocks per SM.
// Measured on the H200 (so that the next change starts from it): deeper rings (3 stages of 256 keys, or 4-5 of
// 128) and one row a block for next_n = 2 were all slower. With next_n = 2 a tile's multiply plus its
// ReLU-weighted sums, not its copy, set the pace: dropping either one brings those rows to the next_n = 1 time.
// That pace is about the prefill kernel's per multiply (~650 TFLOP/s at B = 32, 128k: a third of the FP8 peak).
// bench/micro/indexer_wgmma_rate.cu runs this tile's pattern with its operands resident in shared memory (H200, two
// blocks an SM): the chains alone at ~1.93 PFLOP/s (the FP8 peak), with the ReLU-weighted sums ~1.34 PFLOP/s; at
// B = 32, next_n = 2, 128k that is ~26 us of multiplies and sums against ~36 us for a copy of the same bytes, and the
// kernel takes ~53 us, nearer their sum than their maximum: the copies and the multiplies alternate more than they
// overlap. ncu (base clocks; B = 32, next_n = 2, 128k) has the SMs issuing on ~50% of cycles, DRAM ~46% busy and a
// quarter of the warps' samples at a barrier (the wgmma wait, the per-tile __syncthreads): a warp group's serial chain
// (copy wait, multiply, wait, 128 fp32 ReLU-weighted terms per thread a tile) is not hidden by the four warp groups an
// SM holds. Also tried and dropped, same-run A/B over B = 32 / 128, next_n = 1 / 2, 8k-128k: one block per SM of four
// independent warp groups, each with its own 3-stage ring of 128-key tiles and no block-wide barrier (1.1-1.3x slower
// in every cell), or two such warp groups a block with 2 stages each, two blocks an SM (1.03-1.16x slower); L2
// prefetches (cp.async.bulk.prefetch.tensor) of the 2 or 4 tiles past the ring (1.1-1.6x slower); the table entries
// looked up 2-3 tiles ahead (no change); each stage released by the warps' arrivals on an mbarrier that only warp 0
// waits for, instead of the per-tile __syncthreads (no change); the pair path as four 64-column chains, each chain's
// ReLU sums overlapping the next chain (no faster; one next_n = 2 test at block size 32 then gave wrong logits,
// calc_diff 0.02); more runs a request than one wave of two blocks an SM (runs for 3, 4 or 8 blocks an SM: 1.2-1.5x
// slower at 8k-32k; at 128k from 5% faster, B = 128 next_n = 1 at 4 blocks, to 1.15x slower). A one-warp-group block
// that keeps the next sub-tile's chain in flight across the tile loop needs two 64-register accumulators (255
// registers: two blocks an SM), and ptxas (CUDA 13.0) then serializes every wgmma (C7518, "WG.DP in divergent path":
// the chain in flight crosses branches on the rows' lengths); compiled only, not run.
// Where the 32k cells' time goes (ncu, B = 32, 32k, at the profiler's base clock of 1.34 GHz): next_n = 1 18.3 us,
// next_n = 2 22.5 us, 1.36x their times at the 1.98 GHz boost clock (a 1.48x clock ratio), so about three quarters
// of the time scales with the SM clock, not with DRAM (33-41% busy); SMs active 85% of the elapsed cycles, issuing
// on 31-35% of them. Stall samples: the end-of-tile __syncthreads 18-24%, long-scoreboard waits at the tile loop's
// head (probably the copy's barrier) 8-13%, the wgmma waits 6-8%. Fewer SM cycles a tile (less waiting between
// the two warp groups), rather than more copies in flight, is what these cells need.
constexpr int kTmaStages = 2;
constexpr int kTmaMaxRows = 2;  // next_n served (DSv4 decode: 1, or 2 with one MTP token)
constexpr int kTmaMaxBoxes = kWgKeys / 8;  // cache blocks per tile at the smallest block size served
constexpr uint32_t kTmaQOffset = kTmaStages * kWgKeyBytes;
constexpr uint32_t kTmaWeightOffset = kTmaQOffset + kTmaMaxRows * kWgQBytes;
constexpr uint32_t kTmaScaleOffset = kTmaWeightOffset + kTmaMaxRows * kWgWeightBytes;
constexpr uint32_t kTmaPresentOffset = kTmaScaleOffset + kTmaStages * kWgKeys * 4;
constexpr uint32_t kTmaBarrierOffset = kTmaPresentOffset + kTmaStages * kTmaMaxBoxes;
constexpr size_t kTmaSharedBytes = kTmaBarrierOffset + kTmaStages * 8 + 1024;  // + alignment

__global__ void __launch_bounds__(kWgThreads, 2)
    paged_logits_tma_kernel(PagedMqaLogitsArgs args, const __grid_constant__ CUtensorMap key_map,
                            int64_t tiles_per_block) {
#if defined(DSV4_WGMMA)
  // The tensor map is a launch parameter, not data of the kernel before: its descriptor is fetched while that
  // kernel finishes rather than by the first copy, which every block waits on.
  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(reinterpret_cast<uint64_t>(&key_map));
  }
#endif
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
#if defined(DSV4_WGMMA)
  DSV4_DYNAMIC_SHARED(uint8_t, wg_shared, 1024);
  const PagedWgmmaBlock block(args);  // its keys, rows and windows (its n0 is not used: tiles run below)
  const uint32_t shared_raw = shared_window_address(wg_shared);
  const uint32_t padding = swizzle_atom_aligned(shared_raw) - shared_raw;
  const uint32_t base = shared_raw + padding;
  uint8_t* const base_generic = wg_shared + padding;
  const float* weights_generic = reinterpret_cast<const float*>(base_generic + kTmaWeightOffset);
  const float* scales_generic = reinterpret_cast<const float*>(base_generic + kTmaScaleOffset);
  uint8_t* present_generic = base_generic + kTmaPresentOffset;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int64_t rows = block.rows;
  const int64_t key_limit = block.key_limit();
  const int64_t block_size = args.block_size;
  const int boxes = static_cast<int>(kWgKeys / block_size);
  const int64_t tile_count = (key_limit + kWgKeys - 1) / kWgKeys;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * tiles_per_block;
  const int64_t last = first + tiles_per_block < tile_count ? first + tiles_per_block : tile_count;
  // Warp 0, lane l: the block-table entry of cache block l of tile first + i, -1 where that block lies past the
  // keys or the table row; then the cache block it names, -1 for none. The entry does not depend on the rows'
  // lengths, so the first tiles' entries are loaded together with the lengths (one memory round trip before
  // the first copy, not two): they are checked only after the lengths' loads are issued.
  const auto table_entry = [&](int64_t i) -> int32_t {
    const int64_t column = (first + i) * boxes + lane;  // a tile is a whole number of cache blocks
    // & rather than &&: no branches, so the load's consumers can wait until the lengths' loads are issued
    const bool inside = (first + i < last) & (lane < boxes) & (column * block_size < key_limit) &
                        (column < args.table_cols);
    return inside ? block.keys.table[column] : -1;
  };
  const int32_t num_blocks = static_cast<int32_t>(args.num_blocks);  // < 2^31 (paged_logits_tma_shape)
  const auto cache_block_of = [&](int32_t entry) -> int32_t { return entry < num_blocks ? entry : -1; };
  int32_t first_entries[kTmaStages];
#pragma unroll
  for (int i = 0; i < kTmaStages; ++i) first_entries[i] = tid < 32 ? table_entry(i) : -1;
  int64_t hi_pair[kTmaMaxRows] = {0, 0};  // the rows' windows are [0, length), read once (not after every tile)
  int64_t longest = 0;
#pragma unroll
  for (int t = 0; t < kTmaMaxRows; ++t) {
    int64_t lo;
    if (t < rows) block.window(t, lo, hi_pair[t]);
    longest = hi_pair[t] > longest ? hi_pair[t] : longest;
  }
  const int64_t seen_tiles = (longest + kWgKeys - 1) / kWgKeys;
  const int64_t visible_end = last < seen_tiles ? last : seen_tiles;  // tiles [first, visible_end) are multiplied

  // Warp 0: tile first + i into stage i % kTmaStages (nothing for a tile no row sees). Lane l takes cache block
  // l of the tile: its table entry, its key box and its scales. The entry is looked up a tile ahead, so that the
  // load's latency hides behind a tile's multiply instead of stalling warp 0, and with it warp group 0, after
  // every tile.
  const auto lookup_tile = [&](int64_t i) -> int32_t {
    return first + i < visible_end ? cache_block_of(table_entry(i)) : -1;
  };
  const auto issue_tile = [&](int64_t i, int32_t cache_block) {
    if (first + i >= visible_end) return;
    const uint32_t stage = static_cast<uint32_t>(i % kTmaStages);
    const uint32_t barrier = base + kTmaBarrierOffset + stage * 8;
    const bool present = cache_block >= 0;
    if (lane < boxes) present_generic[stage * kTmaMaxBoxes + lane] = present ? 1 : 0;
    __syncwarp();  // the flags before lane 0's arrive, which releases them to the waiting threads
    const uint32_t copies = static_cast<uint32_t>(__popc(__ballot_sync(0xffffffffu, present)));
    if (lane == 0) {
      ptx::mbarrier_arrive_expect_tx(barrier, copies * static_cast<uint32_t>(block_size * (kWgDim + 4)));
    }
    if (present) {
      const uint32_t keys_destination = base + stage * kWgKeyBytes + static_cast<uint32_t>(lane * block_size * kWgDim);
      ptx::cp_async_bulk_tensor_3d(keys_destination, reinterpret_cast<uint64_t>(&key_map), 0, 0,
                                   static_cast<int32_t>(cache_block), barrier);
      const uint8_t* scales = args.cache + cache_block * args.block_stride + block_size * kWgDim;
      ptx::cp_async_bulk(base + kTmaScaleOffset + (stage * kWgKeys + static_cast<uint32_t>(lane * block_size)) * 4,
                         scales, static_cast<uint32_t>(block_size * 4), barrier);
    }
  };

  // The first tiles' copies are issued before the rows' q and weights have landed, so that the two loads'
  // latencies overlap (a block of a few tiles spends a good part of its time waiting for its first tile).
  if (first < visible_end) {
    const uint32_t copy_offset = wgmma_copy_offset(tid);
    for (int t = 0; t < rows; ++t) {  // rows <= kTmaMaxRows
      const uint8_t* q = block.q_row(t);
#pragma unroll
      for (int j = 0; j < kWgQBytes / 16 / kWgThreads; ++j) {
        const int c = tid + j * kWgThreads;
        copy_async_16(base + kTmaQOffset + t * kWgQBytes + copy_offset + j * kWgThreads * 16,
                      q + (c / 8) * kWgDim + (c % 8) * 16);
      }
      if (tid < kWgWeightBytes / 16) {
        copy_async_16(base + kTmaWeightOffset + t * kWgWeightBytes + tid * 16, block.weights(t) + tid * 4);
      }
    }
    copy_async_commit();
    if (tid < 32) {
      int32_t cache_blocks[kTmaStages];
#pragma unroll
      for (int i = 0; i < kTmaStages; ++i) {
        cache_blocks[i] = first + i < visible_end ? cache_block_of(first_entries[i]) : -1;
      }
      if (tid == 0) {
        for (int s = 0; s < kTmaStages; ++s) ptx::mbarrier_init<1>(base + kTmaBarrierOffset + s * 8);
        ptx::fence_mbarrier_init_release_cluster();
      }
      __syncwarp();  // the barriers initialized before any lane's copy names them
#pragma unroll
      for (int i = 0; i < kTmaStages; ++i) issue_tile(i, cache_blocks[i]);
    }
    copy_async_wait<0>();
    fence_shared_writes_for_wgmma();
  }
  __syncthreads();  // q, weights and the barriers ready

  float acc0[32], acc1[32];
  for (int64_t i = 0; first + i < last; ++i) {
    const int64_t n0 = (first + i) * kWgKeys;
    const int key_offset = wgmma_lane_key(tid);
    const int64_t my_key = n0 + key_offset;
    const bool key_inside = my_key < key_limit;
    if (first + i >= visible_end) {  // no row sees this tile (nor any later one)
      for (int64_t t = 0; t < rows && block.clean() && key_inside; ++t) block.logits(t)[my_key] = minus_inf();
      continue;
    }
    const int32_t next_cache_block = tid < 32 ? lookup_tile(i + kTmaStages) : -1;
    const uint32_t stage = static_cast<uint32_t>(i % kTmaStages);
    const uint32_t parity = static_cast<uint32_t>((i / kTmaStages) & 1);
    while (!ptx::mbarrier_try_wait_parity(base + kTmaBarrierOffset + stage * 8, parity)) {
    }
    const bool key_present = key_inside && present_generic[stage * kTmaMaxBoxes + key_offset / block_size] != 0;
    const float key_scale = scales_generic[stage * kWgKeys + key_offset];
    const uint32_t a_tile = base + stage * kWgKeyBytes + (tid / 128) * 128 * kWgDim;
    float pair[2] = {0.0f, 0.0f};
    const bool both = rows == 2 && hi_pair[0] > n0 && hi_pair[1] > n0;  // one 128-column chain scores both rows
    if (both) wgmma_pair_logits(a_tile, base + kTmaQOffset, weights_generic, lane, pair);
#pragma unroll
    for (int t = 0; t < kTmaMaxRows; ++t) {
      if (t >= rows) break;
      const int64_t hi = hi_pair[t];
      float* out = block.logits(t) + my_key;
      if (hi <= n0) {  // this row sees none of the tile
        if (block.clean() && key_inside) *out = minus_inf();
        continue;
      }
      float logit = pair[t];
      if (!both) {
        wgmma_row_scores(acc0, acc1, a_tile, base + kTmaQOffset + static_cast<uint32_t>(t) * kWgQBytes);
        logit = wgmma_row_logit(acc0, acc1, weights_generic + t * kWgHeads, lane);
      }
      if (key_inside) {
        if (my_key < hi) {
          *out = key_present ? logit * key_scale : minus_inf();
        } else if (block.clean()) {
          *out = minus_inf();
        }
      }
    }
    __syncthreads();  // every warp group done with this stage
    if (tid < 32) issue_tile(i + kTmaStages, next_cache_block);
  }
#else
  (void)args;
  (void)key_map;
  (void)tiles_per_block;
#if DSV4_DEVICE_PASS
  device_trap();  // no wgmma in this device pass; the launcher picks this kernel only where it runs
#endif
#endif
}

// The 3-D tensor map (128 key bytes, block_size keys, num_blocks blocks) over the cache's key region, boxes of
// one cache block in the 128-byte swizzle. The encoder is the driver's, reached through the runtime.
bool encode_paged_key_map(const PagedMqaLogitsArgs& args, CUtensorMap* map) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function) : nullptr;
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kWgDim), static_cast<cuuint64_t>(args.block_size),
                              static_cast<cuuint64_t>(args.num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kWgDim), static_cast<cuuint64_t>(args.block_stride)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kWgDim), static_cast<cuuint32_t>(args.block_size), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(args.cache), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool paged_logits_tma_shape(const PagedMqaLogitsArgs& args) {
  const int64_t bs = args.block_size;
  return args.next_n <= kTmaMaxRows && bs >= 8 && bs <= kWgKeys && kWgKeys % bs == 0 && args.num_blocks >= 1 &&
         args.num_blocks <= 0x7fffffff && args.block_stride % 16 == 0;
}

LaunchStatus launch_paged_logits_tma(const PagedMqaLogitsArgs& args, const CUtensorMap& key_map, void* stream) {
  if (!allow_dynamic_shared_memory<paged_logits_tma_kernel>(kTmaSharedBytes)) return LaunchStatus::kLaunchFailed;
  // Two blocks per SM in one wave where the requests allow: each request's tiles split into 2 * SMs / batch runs.
  const int64_t tiles = (args.max_model_len + kWgKeys - 1) / kWgKeys;
  int64_t runs = 2 * device_multiprocessors() / args.batch;
  runs = runs < 1 ? 1 : (runs > tiles ? tiles : runs);
  const int64_t per_block = (tiles + runs - 1) / runs;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block), static_cast<unsigned>(args.batch));
  launch_overlapping(paged_logits_tma_kernel, grid, dim3(kWgThreads), kTmaSharedBytes,
                     static_cast<hipStream_t>(stream), args, key_map, per_block);
  return last_launch_status();
}

template <class Block, class Args>
LaunchStatus launch_logits_wgmma(const Args& args, int64_t keys, int64_t row_blocks, void* stream) {
  if (!allow_dynamic_shared_memory<logits_wgmma_kernel<Block, Args>>(kWgSharedBytes)) {
    return LaunchStatus::kLaunchFailed;
  }
  const dim3 grid(static_cast<unsigned>((keys + kWgKeys - 1) / kWgKeys), static_cast<unsigned>(row_blocks));
  launch_overlapping(logits_wgmma_kernel<Block, Args>, grid, dim3(kWgThreads), kWgSharedBytes,
                     static_cast<hipStream_t>(stream), args);
  return last_launch_status();
}

bool wgmma_logits_shape(int64_t heads, int64_t dim, Fp8Format q_format, Fp8Format k_format, const float* weights) {
  return device_runs_wgmma() && heads == kWgHeads && dim == kWgDim && q_format == Fp8Format::kOCP &&
         k_format == Fp8Format::kOCP && is_aligned(weights, 16);
}

bool mqa_logits_uses_wgmma(const MqaLogitsArgs& args) {
  return wgmma_logits_shape(args.heads, args.dim, args.q_format, args.k_format, args.weights) &&
         (args.m + kWgRows - 1) / kWgRows <= 65535 && (args.n + kWgKeys - 1) / kWgKeys <= 0x7fffffff;
}

bool paged_mqa_logits_uses_wgmma(const PagedMqaLogitsArgs& args) {
  return wgmma_logits_shape(args.heads, args.dim, args.q_format, args.kv_format, args.weights) &&
         args.batch <= 65535 && (args.max_model_len + kWgKeys - 1) / kWgKeys <= 0x7fffffff;
}
#endif

bool mma_shape(int64_t heads, int64_t dim) {
  return (heads == 16 || heads == 32 || heads == 64) && (dim == 64 || dim == 128);
}

// Keys per block: the key range is split until about kTargetBlocks blocks run.
int64_t key_chunk(int64_t rows, int64_t width) {
  const int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  int64_t splits = (kTargetBlocks + row_blocks - 1) / row_blocks;
  const int64_t max_splits = (width + kMinChunk - 1) / kMinChunk;
  splits = splits < max_splits ? splits : max_splits;
  splits = splits < 1 ? 1 : splits;
  int64_t chunk = (width + splits - 1) / splits;
  chunk = (chunk + 63) / 64 * 64;
  const int64_t min_chunk = (width + 65534) / 65535;  // grid.y limit
  return chunk < min_chunk ? min_chunk : chunk;
}

template <template <int, int> class Launch, class Args>
LaunchStatus launch_mma(const Args& args, int64_t rows, int64_t width, void* stream) {
  const int64_t chunk = key_chunk(rows, width);
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((width + chunk - 1) / chunk));
  const int ht = static_cast<int>(args.heads / 16);
  const bool d128 = args.dim == 128;
  switch (ht) {
    case 1: d128 ? Launch<1, 4>::run(grid, args, chunk, stream) : Launch<1, 2>::run(grid, args, chunk, stream); break;
    case 2: d128 ? Launch<2, 4>::run(grid, args, chunk, stream) : Launch<2, 2>::run(grid, args, chunk, stream); break;
    case 4: d128 ? Launch<4, 4>::run(grid, args, chunk, stream) : Launch<4, 2>::run(grid, args, chunk, stream); break;
    default: return LaunchStatus::kInvalidArgument;
  }
  return last_launch_status();
}

template <int HT, int KS>
struct LaunchMqa {
  static void run(dim3 grid, const MqaLogitsArgs& args, int64_t chunk, void* stream) {
    launch_overlapping(mqa_logits_mma_kernel<HT, KS>, grid, dim3(kThreads), 0, static_cast<hipStream_t>(stream),
                       args, chunk);
  }
};

template <int HT, int KS>
struct LaunchPaged {
  static void run(dim3 grid, const PagedMqaLogitsArgs& args, int64_t chunk, void* stream) {
    launch_overlapping(paged_mqa_logits_mma_kernel<HT, KS>, grid, dim3(kThreads), 0,
                       static_cast<hipStream_t>(stream), args, chunk);
  }
};

}  // namespace

bool mqa_logits_uses_mma(const MqaLogitsArgs& args) {
  return mma_shape(args.heads, args.dim) && is_aligned(args.q, 16) && args.q_row_stride % 16 == 0 &&
         args.q_head_stride % 16 == 0 && is_aligned(args.k, 16) && args.k_row_stride % 16 == 0;
}

bool paged_mqa_logits_uses_mma(const PagedMqaLogitsArgs& args) {
  return mma_shape(args.heads, args.dim) && is_aligned(args.q, 16) && is_aligned(args.cache, 16) &&
         args.block_stride % 16 == 0;
}

LaunchStatus launch_fp8_mqa_logits(const MqaLogitsArgs& args, void* stream) {
  if (args.m < 0 || args.n < 0 || args.heads < 1 || args.dim < 1) return LaunchStatus::kInvalidArgument;
  if (args.m == 0 || args.n == 0) return LaunchStatus::kOk;
#if !defined(__HIPCC__)
  if (mqa_logits_uses_mma(args) && mqa_logits_uses_wgmma(args)) {
    return launch_logits_wgmma<MqaWgmmaBlock>(args, args.n, (args.m + kWgRows - 1) / kWgRows, stream);
  }
#endif
  if (mqa_logits_uses_mma(args)) return launch_mma<LaunchMqa>(args, args.m, args.n, stream);
  launch_overlapping(mqa_logits_scalar_kernel, dim3(elementwise_blocks(args.m * args.n)), dim3(kElementwiseThreads), 0,
                     static_cast<hipStream_t>(stream), args);
  return last_launch_status();
}

LaunchStatus launch_fp8_paged_mqa_logits(const PagedMqaLogitsArgs& args, void* stream) {
  if (args.batch < 0 || args.next_n < 1 || args.max_model_len < 0 || args.heads < 1 || args.dim < 1 ||
      args.block_size < 1) {
    return LaunchStatus::kInvalidArgument;
  }
  const int64_t rows = args.batch * args.next_n;
  if (rows == 0 || args.max_model_len == 0) return LaunchStatus::kOk;
#if !defined(__HIPCC__)
  if (paged_mqa_logits_uses_mma(args) && paged_mqa_logits_uses_wgmma(args)) {
    CUtensorMap key_map;
    if (paged_logits_tma_shape(args) && encode_paged_key_map(args, &key_map)) {
      return launch_paged_logits_tma(args, key_map, stream);
    }
    return launch_logits_wgmma<PagedWgmmaBlock>(args, args.max_model_len, args.batch, stream);
  }
#endif
  if (paged_mqa_logits_uses_mma(args)) return launch_mma<LaunchPaged>(args, rows, args.max_model_len, stream);
  launch_overlapping(paged_mqa_logits_scalar_kernel, dim3(elementwise_blocks(rows * args.max_model_len)),
                     dim3(kElementwiseThreads), 0, static_cast<hipStream_t>(stream), args);
  return last_launch_status();
}

}  // namespace dsv4::gpu
