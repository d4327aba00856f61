// A wave64 execution model on the host, for running the gfx942 / gfx950 paths of the kernels in
// src/hip/ on a machine without an AMD GPU (tests/amd_sim). Each thread of a block is a fiber; the
// block's threads run one at a time on the calling OS thread and switch only where a thread waits
// for others: __syncthreads and the wave-wide operations (shuffles, votes, MFMA). Blocks run one
// after another, so `static` storage serves as shared memory.
//
// What it checks beyond the kernel's results: a wave operation that reads a lane that did not take
// part aborts, as does a wave whose lanes wait at two different wave operations of one lane group at
// once (the hardware would run them one after the other; the model cannot tell which lanes each takes);
// waits that can never end abort as a deadlock; dynamic shared memory starts filled with 0xCD bytes each
// block (static shared variables keep the previous block's values), and a launch over the chip's LDS, or
// over 1024 threads, fails like the runtime's.
//
// This header has no HIP types: it is shared by the kernels' shim (include/hip/hip_runtime.h, built
// with the kernels) and by the runtime (wave_sim.cpp, built with the tests).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv4_sim {

inline constexpr int kWaveSize = 64;

struct Index3 {
  uint32_t x, y, z;
};

// The calling thread's coordinates (valid inside a running kernel).
Index3& thread_index();
const Index3& block_index();
const Index3& block_dim();
const Index3& grid_dim();
int lane_id();

// The block's dynamic shared memory, aligned to kSharedAlignment bytes (the most a kernel asks for).
inline constexpr size_t kSharedAlignment = 1024;
void* dynamic_shared_memory();

void sync_block();

// A wave operation over the caller's aligned group of `width` lanes (a power of two <= kWaveSize): deposits
// `bytes` bytes (at most kSlotBytes) for the calling lane and waits for the group's other live lanes to do
// the same at this call site; where a branch keeps some of them elsewhere (waiting at the block barrier or
// at another wave operation, or ended), it runs with the lanes that came, as the hardware runs it with the
// others masked off. Then deposit_of(i) is lane i's deposit (aborting if lane i did not take part) and
// taken_part(i) says whether it did, until the caller's next wave operation.
// `site` tells call sites apart: call_site() called where the operation is (in an inlined function, so
// that every copy has its own).
inline constexpr size_t kSlotBytes = 160;
const void* call_site();
void wave_exchange(const void* mine, size_t bytes, int width, const void* site);
bool taken_part(int lane);
const unsigned char* deposit_of(int source);

// Runs body(context) for every thread of every block of the grid (x fastest), one block at a time.
// Returns 0, or a nonzero code the runtime's error query then reports (invalid configuration).
using KernelBody = void (*)(void* context);
int run_grid(Index3 grid, Index3 block, size_t dynamic_shared_bytes, KernelBody body, void* context);

// The chip being modelled: its LDS per block and name, set by the kernels' build (gfx942 or gfx950).
struct ChipModel {
  const char* arch_name;  // gcnArchName
  size_t lds_bytes;       // per block
  int compute_units;      // what the device reports (grids sized to "one wave of blocks" use it)
};
void set_chip(const ChipModel& chip);
const ChipModel& chip();
// The last launch's error code (0 if none), cleared by reading.
int take_last_error();

// ---- matrix and conversion instructions, per the ISA's definitions, lane by lane -----------------
// Every lane of the wave calls these at once (a wave operation at `site`, see wave_exchange). Operands are
// the lane's registers as raw 32-bit words; the result is the lane's accumulator registers.
enum class Fp8Kind : int { kFnuz = 0, kOcp = 1 };
// v_mfma_f32_16x16x16_bf16: a, b 2 words (4 bf16) each.
void mfma_16x16x16_bf16(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], const void* site);
// v_mfma_f32_16x16x32_bf16 (gfx950): a, b 4 words (8 bf16) each.
void mfma_16x16x32_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], const void* site);
// v_mfma_f32_16x16x32_fp8_fp8: a, b 2 words (8 e4m3 codes) each, decoded as `kind` (the chip's).
void mfma_16x16x32_fp8(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], Fp8Kind kind,
                       const void* site);
// v_mfma_scale_f32_16x16x128_f8f6f4 with both operands e4m3 (OCP): a, b 8 words (32 codes) each, one
// E8M0 scale byte per lane for A and for B (byte `opsel` of the scale word).
void mfma_scale_16x16x128_fp8(float (&c)[4], const uint32_t (&a)[8], const uint32_t (&b)[8], uint32_t scale_a,
                              int opsel_a, uint32_t scale_b, int opsel_b, const void* site);
// v_cvt_pk_fp8_f32: `lo` and `hi` to the chip's e4m3 codes (round to nearest even, no saturation: past the
// largest finite value gives the NaN code; the sign is kept on zero), into the low or high 16 bits of `old`.
int cvt_pk_fp8_f32(float lo, float hi, int old, bool high_word, Fp8Kind kind);

}  // namespace dsv4_sim
