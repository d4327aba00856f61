// A warp-wide bf16 matrix product on the matrix units, for the mHC dot products: per step,
// D[16 x kCols] += A[16 x 16] * B[16 x kCols] with fp32 accumulation (NVIDIA: mma.sync m16n8k16; CDNA:
// MFMA 16x16x16 bf16, on gfx950 two steps at once by MFMA 16x16x32 bf16). Device code only.
//
// Operand runs: a dot product is a sum over k, so any order of k serves as long as A and B use the same
// one. Each lane therefore loads one contiguous run of 16 k values (two 16-byte loads) per 64-wide chunk
// of k, for each of its rows of A and for its column of B, and step s of the chunk uses values 4s..4s+3
// of every run. The lane -> (row, run) and accumulator -> (row, column) maps below differ per vendor.
#pragma once

#include "dsv4/mfma.h"
#include "dsv4/platform.h"
#include "dsv4/ptx.h"

#if DSV4_GPU_COMPILER
namespace dsv4::gpu::tile {

inline constexpr int kRows = 16;      // rows of A and D per warp
inline constexpr int kChunk = 64;     // k values per chunk: 4 steps of 16
inline constexpr int kRunLength = 16; // k values of one lane's run
inline constexpr int kRuns = kChunk / kRunLength;

#if defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx950__)
#define DSV4_TILE_MFMA 1
// v_mfma_f32_16x16x16_bf16 on a 64-lane wave: lane l holds row (column) l % 16 and k group l / 16.
inline constexpr int kCols = 16;
inline constexpr int kRowsPerLane = 1;
DSV4_DEVICE int a_row(int lane, int /*i*/) { return lane % 16; }
DSV4_DEVICE int b_col(int lane) { return lane % 16; }
DSV4_DEVICE int run_of(int lane) { return lane / 16; }
DSV4_DEVICE int d_row(int lane, int e) { return 4 * (lane / 16) + e; }
DSV4_DEVICE int d_col(int lane, int /*e*/) { return lane % 16; }
inline constexpr int kRunLaneStride = 16;  // the lanes of one row's runs: lane + 16 r
#else
// NVIDIA mma.sync m16n8k16: lane l holds rows l / 4 and l / 4 + 8 of A, column l / 4 of B, and run
// l % 4.
inline constexpr int kCols = 8;
inline constexpr int kRowsPerLane = 2;
DSV4_DEVICE int a_row(int lane, int i) { return (lane % 32) / 4 + 8 * i; }
DSV4_DEVICE int b_col(int lane) { return (lane % 32) / 4; }
DSV4_DEVICE int run_of(int lane) { return lane % 4; }
DSV4_DEVICE int d_row(int lane, int e) { return (lane % 32) / 4 + 8 * (e / 2); }
DSV4_DEVICE int d_col(int lane, int e) { return 2 * (lane % 4) + e % 2; }
inline constexpr int kRunLaneStride = 1;  // the lanes of one row's runs: lane + r
#endif
inline constexpr int kAccumulators = 4;  // fp32 accumulator values per lane and column tile

// One step: a[i] holds the two 32-bit words (4 bf16, in run order) of row a_row(lane, i) for this step,
// b the two words of column b_col(lane).
DSV4_DEVICE void mma_step(float (&d)[kAccumulators], const uint32_t (&a)[kRowsPerLane][2], const uint32_t (&b)[2]) {
#if defined(DSV4_TILE_MFMA)
  typedef short short4_t __attribute__((ext_vector_type(4)));
  typedef float float4_t __attribute__((ext_vector_type(4)));
  union Operand { uint32_t words[2]; short4_t vector; };
  Operand a_operand{{a[0][0], a[0][1]}};
  Operand b_operand{{b[0], b[1]}};
  float4_t c = {d[0], d[1], d[2], d[3]};
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a_operand.vector, b_operand.vector, c, 0, 0, 0);
  d[0] = c[0];
  d[1] = c[1];
  d[2] = c[2];
  d[3] = c[3];
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Fragment registers: a0 = row r, k {2t, 2t+1}; a1 = row r + 8; a2 = row r, k {2t+8, 2t+9}; a3 = row
  // r + 8. With runs, k {2t, 2t+1} is the step's first word and k {2t+8, 2t+9} its second.
  ptx::mma_m16n8k16_bf16(d, {a[0][0], a[1][0], a[0][1], a[1][1]}, b);
#elif DSV4_DEVICE_PASS
#error "mhc_tile_mma.h: the mHC kernels need bf16 matrix instructions (NVIDIA sm_80 and later, CDNA gfx90a/gfx942/gfx950)"
#else
  (void)d;  // the host pass: never called
  (void)a;
  (void)b;
#endif
}

// Two steps (values 4s..4s+7 of every run: words x, y of `a` and `b` are step s, z, w step s + 1): on gfx950
// one double-rate v_mfma_f32_16x16x32_bf16 (a lane's 8 values of A and of B in the same order: a dot
// product does not depend on the order of its terms), elsewhere two mma_steps.
DSV4_DEVICE void mma_two_steps(float (&d)[kAccumulators], const uint4 (&a)[kRowsPerLane], const uint4 b) {
#if defined(__gfx950__)
  mfma_16x16x32_bf16(d, {a[0].x, a[0].y, a[0].z, a[0].w}, {b.x, b.y, b.z, b.w});
#else
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    uint32_t a_step[kRowsPerLane][2];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      a_step[i][0] = step == 0 ? a[i].x : a[i].z;
      a_step[i][1] = step == 0 ? a[i].y : a[i].w;
    }
    const uint32_t b_step[2] = {step == 0 ? b.x : b.z, step == 0 ? b.y : b.w};
    mma_step(d, a_step, b_step);
  }
#endif
}

}  // namespace dsv4::gpu::tile
#endif
