// An execution model of a GPU on the host, for running the device paths of the kernels in src/hip/ on a
// machine without the GPU (tests/device_model): wave64 for gfx942 / gfx950, 32-lane warps for NVIDIA sm_90a
// (kWaveSize, fixed per build by DSV4_SIM_WAVE_SIZE). Each thread of a block is a fiber; the block's threads
// run one at a time on the calling OS thread and switch only where a thread waits for others: __syncthreads
// and the wave-wide operations (shuffles, votes, matrix instructions). Blocks run one after another (the
// blocks of a thread block cluster together), so `static` storage serves as shared memory: the shims put it
// in one section, of which each block of a cluster has its own copy while the cluster runs.
//
// What it checks beyond the kernel's results: a wave operation that reads a lane that did not take
// part aborts, as does a wave whose lanes wait at two different wave operations of one lane group at
// once (the hardware would run them one after the other; the model cannot tell which lanes each takes);
// waits that can never end abort as a deadlock; dynamic shared memory starts filled with 0xCD bytes each
// block (static shared variables keep the previous block's values), and a launch over the chip's LDS, or
// over 1024 threads, fails like the runtime's.
//
// Launches through launch() follow stream order, but a kernel launched to overlap the one before it
// (programmatic dependent launch) may run its part before wait_for_previous_grid() before that kernel runs
// at all -- what the hardware allows of it, at its extreme: a read of the earlier kernel's output before
// the wait then sees the buffer's old contents.
//
// This header has no HIP or CUDA types: it is shared by the kernels' shims (include_cdna/, include_sm90/,
// built with the kernels) and by the runtime (wave_sim.cpp and the instruction sets, built with the tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace dsv4_sim {

#if !defined(DSV4_SIM_WAVE_SIZE)
#error "define DSV4_SIM_WAVE_SIZE: 64 (CDNA) or 32 (NVIDIA)"
#endif
inline constexpr int kWaveSize = DSV4_SIM_WAVE_SIZE;
static_assert(kWaveSize == 32 || kWaveSize == 64, "a wave of 32 or 64 lanes");

struct Index3 {
  uint32_t x, y, z;
};

// Stops the program with `what` on stderr: something the modelled hardware would not do as the kernel
// expects, or that the model cannot model.
[[noreturn]] void model_error(const char* what);

// The calling thread's coordinates (valid inside a running kernel).
Index3& thread_index();
const Index3& block_index();
const Index3& block_dim();
const Index3& grid_dim();
// The same two of the kernel running now, as variables (the shims' gridDim and blockDim refer to them).
extern Index3 running_block_dim;
extern Index3 running_grid_dim;
int lane_id();

// Thread block clusters (NVIDIA): the calling block's rank in its cluster; the cluster barrier
// (barrier.cluster.arrive.release + wait.acquire: every thread of the cluster's blocks); a float of the
// shared memory of the cluster's block `rank` at the window address that names it in the caller's own (mapa
// + ld.shared::cluster). Blocks of a cluster run at the same time; each has its own shared memory, its
// `static` shared variables included.
int cluster_rank();
void sync_cluster();
float load_cluster_shared_f32(uint32_t window_address, int rank);

// The block's dynamic shared memory, aligned to kSharedAlignment bytes (the most a kernel asks for).
inline constexpr size_t kSharedAlignment = 1024;
void* dynamic_shared_memory();

void sync_block();
// __syncthreads_count: the barrier, then the number of the block's threads that arrived with a nonzero
// predicate.
int sync_block_count(int predicate);

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
// Stops the program unless the lanes that took part in the caller's last wave operation are exactly those of
// `mask`: the rule of CUDA's *_sync warp operations (a lane of the mask elsewhere or exited, or a lane outside
// it taking part, is undefined behaviour there).
void require_exactly_lanes(uint64_t mask);

// Runs body(context) for every thread of every block of the grid (x fastest), one block at a time, now.
// Returns 0, or a nonzero code the runtime's error query then reports (invalid configuration).
using KernelBody = void (*)(void* context);
int run_grid(Index3 grid, Index3 block, size_t dynamic_shared_bytes, KernelBody body, void* context);

// A kernel launch as the shims make it: `body` runs the kernel on the calling thread (its parameters copied
// in), `kernel` tells kernels apart, `overlapping` marks a programmatic dependent launch.
struct Launch {
  Index3 grid, block;
  size_t dynamic_shared_bytes;
  std::function<void()> body;
  const void* kernel;
  bool overlapping;
  int cluster_blocks = 1;  // thread block clusters: blocks x .. x + cluster_blocks - 1 run together
};
// Checks the configuration (returns nonzero, as run_grid, if the runtime would refuse it) and runs the
// launch in stream order. Every other launch since the last finish_launches() (the first, third, ... one,
// or with DSV4_MODEL_PDL_PHASE=1 in the environment the second, fourth, ...) is held back; if the launch
// after it overlaps it (and is another kernel), that one runs first and the held one runs when the first of
// its threads reaches wait_for_previous_grid(); otherwise the held one runs first. Two runs of a test
// program, one per phase, see every pair of consecutive launches run the dependent's early part first.
int launch(Launch launch);
// griddepcontrol.wait: runs the held-back kernel before the caller goes on.
void wait_for_previous_grid();
// Runs whatever is held back: the host's synchronization points (the launchers' error query).
void finish_launches();

// The chip being modelled, set by the test program (gfx942, gfx950 or sm_90a).
struct ChipModel {
  const char* arch_name;  // gcnArchName (AMD)
  size_t lds_bytes;       // shared memory a block may have (NVIDIA: after the kernel's opt-in)
  int compute_units;      // what the device reports (grids sized to "one wave of blocks" use it)
};
void set_chip(const ChipModel& chip);
const ChipModel& chip();
// The last launch's error code (0 if none), cleared by reading.
int take_last_error();

// ---- shared memory addresses, asynchronous copies, named barriers (the NVIDIA model) -------------------
// The 32-bit shared-window address of a shared variable (cvta.to.shared), and back. The running kernel's
// dynamic shared memory sits at window addresses [0, its size) (below 2^18, as on the hardware, for the
// wgmma descriptors' 14-bit address fields); `static` shared variables elsewhere.
uint32_t shared_window_address(const void* shared_pointer);
unsigned char* shared_pointer(uint32_t window_address);
// Work the hardware does asynchronously to the thread that issued it (cp.async copies, wgmma products), kept
// per thread and unit: `defer` adds to the calling thread's open group, `commit_deferred` closes the group
// (possibly empty), `complete_deferred` does every group but the `pending` most recent -- as late as the
// hardware may do it, so a read before the wait sees the old contents. A thread that ends does the rest.
enum class AsyncUnit : int { kCopy = 0, kMatrix = 1 };
void defer(AsyncUnit unit, std::function<void()> work);
void commit_deferred(AsyncUnit unit);
void complete_deferred(AsyncUnit unit, int pending);
// mbarriers (sm_90), by window address, per block: init with the arrivals a phase expects; arrive (with
// expect_tx: `bytes` more transaction bytes for the phase); a bulk copy whose bytes complete on the barrier,
// done when a thread waits on it (as late as the hardware may do it); and the wait for the completion of the
// phase of parity `parity`, which blocks until then (a kernel's try_wait loop ends at once).
void mbarrier_init(uint32_t barrier, uint32_t arrivals);
void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes);
void mbarrier_bulk_copy(uint32_t barrier, uint32_t bytes, std::function<void()> copy);
void mbarrier_wait_parity(uint32_t barrier, uint32_t parity);
// bar.sync / bar.arrive: barrier `id` (1..15; 0 is __syncthreads) of the block completes when `threads`
// threads have arrived; sync waits for that, arrive does not.
void named_barrier(int id, int threads, bool wait);

// ---- CDNA matrix and conversion instructions, per the ISA's definitions, lane by lane ---------
// (cdna_instructions.cpp, in the wave64 programs.) Every lane of the wave calls these at once (a wave
// operation at `site`, see wave_exchange). Operands are the lane's registers as raw 32-bit words; the
// result is the lane's accumulator registers.
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

// ---- NVIDIA PTX instructions, per the PTX ISA, lane by lane (nvidia_instructions.cpp, 32-lane programs) ----
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: every lane of the warp at once (a wave operation at
// `site`), with the fragments of the PTX ISA (group g = lane / 4, t = lane % 4): a[0] = A[g][2t, 2t + 1],
// a[1] = A[g + 8][2t, 2t + 1], a[2] and a[3] the same at k + 8; b[0] = B[2t, 2t + 1][g], b[1] at k + 8;
// d[0], d[1] = D[g][2t, 2t + 1], d[2], d[3] = D[g + 8][2t, 2t + 1].
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site);
// cvt.rn.satfinite.e4m3x2.f32: OCP codes, nearest even, finite overflow and infinities saturating to the
// largest finite value, NaN to 0x7F; `low` in bits 0..7.
uint16_t cvt_rn_satfinite_e4m3x2_f32(float high, float low);
// cvt.rn.f16x2.e4m3x2 of each 16-bit half of `four_codes` (NaN codes to 0x7FFF).
void cvt_rn_f16x2_e4m3x2_halves(uint32_t four_codes, uint32_t& first, uint32_t& second);
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (OCP codes): a[0] = A[g][4t .. 4t + 3], a[1] = A[g + 8][..],
// a[2], a[3] the same at k + 16; b[0] = B[4t .. 4t + 3][g], b[1] at k + 16; d as in m16n8k16.
void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const void* site);
// cvt.rn.bf16x2.f32 (NaN to 0x7FFF) and cvt.f32.f16 of each half.
uint32_t cvt_rn_bf16x2_f32(float high, float low);
void cvt_f32_f16_halves(uint32_t halves, float& low, float& high);
// mul.rn.f16x2: each half's product, rounded to f16 (nearest even).
uint32_t mul_rn_f16x2(uint32_t a, uint32_t b);
// prmt.b32 d, x, 0, selector in the default mode.
uint32_t prmt_b32(uint32_t x, uint32_t y, uint32_t selector);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: every lane of the warp at once (a wave operation at
// `site`); lane l gives the address of row l % 8 of matrix l / 8.
void ldmatrix_x4(uint32_t (&r)[4], uint32_t window_address, bool transpose, const void* site);
// wgmma.mma_async with both operands in shared memory (descriptors as the PTX ISA defines them: start
// address, leading and stride byte offsets, swizzle mode; the swizzled layouts only), fp32 accumulators:
// d (+)= A[64 x K] B[K x n], this thread's share of D in the wgmma accumulator layout (its warp's 16 of the
// warpgroup's 64 rows). A is K-major; B K-major, or MN-major where `b_mn_major` (16-bit elements). K = 16
// for 16-bit elements, 32 for e4m3 (OCP). Deferred (AsyncUnit::kMatrix): the unit may read its operands
// until the thread waits for the group, so the product is taken then; `d` must stay in place until that wait.
enum class MatrixElement : int { kBf16, kF16, kE4m3 };
void wgmma(float* d, int n, uint64_t a_descriptor, uint64_t b_descriptor, bool accumulate, MatrixElement element,
           bool b_mn_major);
// The same with A from registers (f16: the m16n8k16 A fragment of the warp's 16 rows, 4 words a thread),
// B K-major f16: a wave operation at `site` when issued (the registers are read then).
void wgmma_a_registers_f16(float* d, int n, const uint32_t (&a)[4], uint64_t b_descriptor, bool accumulate,
                           const void* site);

}  // namespace dsv4_sim
