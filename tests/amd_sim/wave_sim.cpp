// The wave64 model of wave_sim.h: fibers (ucontext) for a block's threads, a round-robin scheduler that
// switches only where a thread waits, and the matrix / conversion instructions lane by lane.
#include "wave_sim.h"

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"

namespace dsv4_sim {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "wave64 model: %s\n", what);
  std::abort();
}

enum class Wait { kNone, kBarrier, kExchange };

// One pending run of a wave operation: the lanes of one aligned group that wait at one call site.
struct Round {
  const void* site = nullptr;
  int group_first = 0;  // the group: lanes [group_first, group_first + width)
  int width = 0;
  uint64_t lanes = 0;    // the lanes that arrived
  uint64_t parity = 0;   // the deposit buffer each of them used
  bool open = false;
};

struct Thread {
  ucontext_t context;
  std::unique_ptr<unsigned char[]> stack;
  Index3 index;
  int linear = 0;
  bool done = false;
  Wait wait = Wait::kNone;
  uint64_t wait_generation = 0;  // of the block, when it began to wait at the barrier
  bool released = false;         // its wave operation ran
  uint64_t exchanges = 0;        // wave operations it took part in: its next deposit buffer is exchanges % 2
  uint64_t round_lanes = 0;      // the lanes and deposit buffers of its last wave operation
  uint64_t round_parity = 0;
};

// A lane deposits into its own two buffers in turn. It can deposit again into the buffer of an earlier
// run only after its next run was released, which needs every live lane of that run's group to have
// arrived there or to wait elsewhere -- so each reader of the earlier run has already read it (a lane reads
// its run's deposits as soon as it resumes, before it can wait again).
struct Wave {
  Round rounds[kWaveSize];  // at most one per lane
  unsigned char deposits[kWaveSize][2][kSlotBytes];
};

struct Block {
  Index3 index;
  int live = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

struct Grid {
  Index3 grid{1, 1, 1};
  Index3 block{1, 1, 1};
  int threads = 0;
  KernelBody body = nullptr;
  void* context = nullptr;
};

ChipModel g_chip{"gfx942:sramecc+:xnack-", 64 * 1024, 8};
int g_last_error = 0;
Grid g_grid;
Block g_block;
std::vector<Thread> g_threads;
std::vector<Wave> g_waves;
std::vector<unsigned char> g_shared;  // kSharedAlignment spare bytes in front
size_t g_shared_bytes = 0;
Thread* g_current = nullptr;
ucontext_t g_scheduler;

Wave& wave_of(const Thread& thread) { return g_waves[thread.linear / kWaveSize]; }

unsigned char* shared_base() {
  const uintptr_t address = reinterpret_cast<uintptr_t>(g_shared.data());
  return g_shared.data() + (kSharedAlignment - address % kSharedAlignment) % kSharedAlignment;
}

// Back to the scheduler until it resumes this thread.
void yield() { swapcontext(&g_current->context, &g_scheduler); }

Thread& thread_at(const Wave& wave, int lane) {
  return g_threads[static_cast<size_t>(&wave - g_waves.data()) * kWaveSize + lane];
}

void release_round(Wave& wave, Round& round) {
  for (int lane = 0; lane < kWaveSize; ++lane) {
    if (!(round.lanes >> lane & 1)) continue;
    Thread& thread = thread_at(wave, lane);
    thread.released = true;
    thread.round_lanes = round.lanes;
    thread.round_parity = round.parity;
  }
  round = Round{};
}

// Live lanes of [first, first + width) of the wave.
int live_lanes(const Wave& wave, int first, int width) {
  int count = 0;
  const int base = static_cast<int>(&wave - g_waves.data()) * kWaveSize;
  for (int lane = first; lane < first + width; ++lane) {
    count += base + lane < g_grid.threads && !thread_at(wave, lane).done;
  }
  return count;
}

// Releases the wave's runs whose group has arrived in full (every live lane of it).
void release_full_rounds(Wave& wave) {
  for (Round& round : wave.rounds) {
    if (round.open && __builtin_popcountll(round.lanes) == live_lanes(wave, round.group_first, round.width)) {
      release_round(wave, round);
    }
  }
}

void release_block() {
  g_block.arrived = 0;
  ++g_block.generation;
}

bool blocked(const Thread& thread) {
  switch (thread.wait) {
    case Wait::kBarrier:
      return g_block.generation == thread.wait_generation;
    case Wait::kExchange:
      return !thread.released;
    default:
      return false;
  }
}

// After a pass over the block in which no thread could run: every live lane waits, so each pending run of
// a wave operation takes the lanes that reached it (the others of its group wait elsewhere). Returns
// whether there was one.
bool release_partial_rounds() {
  bool released = false;
  for (Wave& wave : g_waves) {
    for (Round& round : wave.rounds) {
      if (!round.open) continue;
      release_round(wave, round);
      released = true;
    }
  }
  return released;
}

void thread_entry() {
  g_grid.body(g_grid.context);
  Thread& self = *g_current;
  self.done = true;
  self.wait = Wait::kNone;
  // A thread that ends releases the barriers the others wait at, as an exited wave does.
  release_full_rounds(wave_of(self));
  --g_block.live;
  if (g_block.arrived > 0 && g_block.arrived == g_block.live) release_block();
  swapcontext(&self.context, &g_scheduler);
  fail("a finished thread resumed");
}

void run_block() {
  g_block.live = g_grid.threads;
  g_block.arrived = 0;
  const int waves = (g_grid.threads + kWaveSize - 1) / kWaveSize;
  for (int w = 0; w < waves; ++w) {
    for (Round& round : g_waves[w].rounds) round = Round{};
  }
  std::fill(shared_base(), shared_base() + g_shared_bytes, static_cast<unsigned char>(0xCD));
  for (int t = 0; t < g_grid.threads; ++t) {
    Thread& thread = g_threads[t];
    thread.linear = t;
    thread.index = {static_cast<uint32_t>(t % g_grid.block.x),
                    static_cast<uint32_t>((t / g_grid.block.x) % g_grid.block.y),
                    static_cast<uint32_t>(t / (g_grid.block.x * g_grid.block.y))};
    thread.done = false;
    thread.wait = Wait::kNone;
    thread.exchanges = 0;
    getcontext(&thread.context);
    thread.context.uc_stack.ss_sp = thread.stack.get();
    thread.context.uc_stack.ss_size = kStackBytes;
    thread.context.uc_link = nullptr;
    makecontext(&thread.context, thread_entry, 0);
  }
  int remaining = g_grid.threads;
  while (remaining > 0) {
    // One pass over the threads; each runs until it waits or ends. After a pass in which none could run,
    // every live thread waits: a wave operation that part of a wave reached then runs for those lanes;
    // without one, the waits can never end.
    bool ran = false;
    for (int t = 0; t < g_grid.threads; ++t) {
      Thread& thread = g_threads[t];
      if (thread.done || blocked(thread)) continue;
      g_current = &thread;
      swapcontext(&g_scheduler, &thread.context);
      ran = true;
      if (thread.done) --remaining;
    }
    g_current = nullptr;
    if (remaining > 0 && !ran && !release_partial_rounds()) {
      fail("deadlock: live threads wait at barriers or wave operations that others never reach");
    }
  }
}

}  // namespace

Index3& thread_index() { return g_current->index; }
const Index3& block_index() { return g_block.index; }
const Index3& block_dim() { return g_grid.block; }
const Index3& grid_dim() { return g_grid.grid; }
int lane_id() { return g_current->linear % kWaveSize; }
void* dynamic_shared_memory() { return shared_base(); }

void sync_block() {
  Thread& self = *g_current;
  self.wait = Wait::kBarrier;
  self.wait_generation = g_block.generation;
  if (++g_block.arrived == g_block.live) {
    release_block();
  } else {
    while (blocked(self)) yield();
  }
  self.wait = Wait::kNone;
}

__attribute__((noinline)) const void* call_site() { return __builtin_return_address(0); }

void wave_exchange(const void* mine, size_t bytes, int width, const void* site) {
  if (bytes > kSlotBytes) fail("wave operand too large");
  if (width < 1 || width > kWaveSize || (width & (width - 1)) != 0) fail("wave operation width");
  Thread& self = *g_current;
  Wave& wave = wave_of(self);
  const int lane = self.linear % kWaveSize;
  const int parity = static_cast<int>(self.exchanges++ % 2);
  std::memcpy(wave.deposits[lane][parity], mine, bytes);
  const int group_first = lane / width * width;
  // Join the group's pending run at this site, or open one. Another pending run of the same group at
  // another site means lanes of one group on both sides of a branch at once.
  Round* joined = nullptr;
  for (Round& round : wave.rounds) {
    if (!round.open || group_first >= round.group_first + round.width || round.group_first >= group_first + width) {
      continue;
    }
    if (round.site != site || round.width != width) fail("lanes of a wave wait at different wave operations at once");
    joined = &round;
  }
  if (joined == nullptr) {
    joined = &wave.rounds[lane];  // free: a lane is in at most one run, and a run opened by lane l sits at l
    *joined = Round{site, group_first, width, 0, 0, true};
  }
  joined->lanes |= uint64_t{1} << lane;
  joined->parity |= uint64_t{static_cast<unsigned>(parity)} << lane;
  self.wait = Wait::kExchange;
  self.released = false;
  if (__builtin_popcountll(joined->lanes) == live_lanes(wave, group_first, width)) release_round(wave, *joined);
  while (blocked(self)) yield();
  self.wait = Wait::kNone;
}

bool taken_part(int lane) { return lane >= 0 && lane < kWaveSize && (g_current->round_lanes >> lane & 1); }

const unsigned char* deposit_of(int source) {
  if (source < 0 || source >= kWaveSize) fail("wave operation reads a lane outside the wave");
  if (!taken_part(source)) fail("wave operation reads a lane that did not take part");
  const Thread& self = *g_current;
  return wave_of(self).deposits[source][g_current->round_parity >> source & 1];
}

int run_grid(Index3 grid, Index3 block, size_t dynamic_shared_bytes, KernelBody body, void* context) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const bool valid = threads >= 1 && threads <= kMaxThreads && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 &&
                     grid.y <= 65535 && grid.z <= 65535 && dynamic_shared_bytes <= g_chip.lds_bytes;
  if (!valid) {
    g_last_error = 9;  // hipErrorInvalidConfiguration
    return g_last_error;
  }
  g_grid = {grid, block, static_cast<int>(threads), body, context};
  if (g_threads.size() < threads) {
    const size_t old = g_threads.size();
    g_threads.resize(threads);
    for (size_t t = old; t < threads; ++t) g_threads[t].stack.reset(new unsigned char[kStackBytes]);
  }
  g_waves.resize((threads + kWaveSize - 1) / kWaveSize);
  g_shared.assign(dynamic_shared_bytes + kSharedAlignment, 0xCD);
  g_shared_bytes = dynamic_shared_bytes;
  for (uint32_t z = 0; z < grid.z; ++z) {
    for (uint32_t y = 0; y < grid.y; ++y) {
      for (uint32_t x = 0; x < grid.x; ++x) {
        g_block.index = {x, y, z};
        run_block();
      }
    }
  }
  return 0;
}

void set_chip(const ChipModel& chip) { g_chip = chip; }
const ChipModel& chip() { return g_chip; }
int take_last_error() {
  const int error = g_last_error;
  g_last_error = 0;
  return error;
}

// ---- matrix instructions ---------------------------------------------------------------------------
// Every lane deposits its operands; each lane then computes its own four accumulator values from all of
// them. Products are exact in double and summed there, then added to the accumulator once: the unit's
// own order and internal precision are not modelled (tests compare with the tolerance of an fp32 sum).
namespace {

// 16 x 16 output tiles: lane l holds D[4 (l / 16) + r][l % 16] in accumulator r.
int acc_row(int lane, int r) { return 4 * (lane / 16) + r; }
int acc_col(int lane) { return lane % 16; }

struct MatrixOperands {
  uint32_t a[8];
  uint32_t b[8];
  uint32_t scale_a;
  uint32_t scale_b;
};
static_assert(sizeof(MatrixOperands) <= kSlotBytes, "deposit size");

float bf16_value(const uint32_t* words, int index) {
  const uint32_t word = words[index / 2];
  return dsv4::bf16_bits_to_float(static_cast<uint16_t>(index % 2 ? word >> 16 : word & 0xffffu));
}

uint8_t byte_of(const uint32_t* words, int index) {
  return static_cast<uint8_t>(words[index / 4] >> (8 * (index % 4)));
}

float fp8_value(uint8_t code, Fp8Kind kind) {
  return kind == Fp8Kind::kFnuz ? dsv4::fp8_decode<dsv4::Fp8Format::kFNUZ>(code)
                                : dsv4::fp8_decode<dsv4::Fp8Format::kOCP>(code);
}

// For each of the lane's accumulators: c[r] += sum over the k groups g (lanes 16 g + row of A, 16 g + col
// of B) of group_product(lane of A, lane of B).
template <typename GroupProduct>
void accumulate(float (&c)[4], const MatrixOperands& mine, const void* site, GroupProduct group_product) {
  wave_exchange(&mine, sizeof mine, kWaveSize, site);
  const int lane = lane_id();
  for (int r = 0; r < 4; ++r) {
    const int row = acc_row(lane, r), col = acc_col(lane);
    double sum = 0.0;
    for (int g = 0; g < 4; ++g) {
      MatrixOperands a_lane, b_lane;
      std::memcpy(&a_lane, deposit_of(16 * g + row), sizeof a_lane);
      std::memcpy(&b_lane, deposit_of(16 * g + col), sizeof b_lane);
      sum += group_product(a_lane, b_lane);
    }
    c[r] = static_cast<float>(static_cast<double>(c[r]) + sum);
  }
}

// The lane's operand words.
template <int kWords>
MatrixOperands operands_of(const uint32_t (&a)[kWords], const uint32_t (&b)[kWords]) {
  static_assert(kWords <= 8, "operand words");
  MatrixOperands mine{};
  std::memcpy(mine.a, a, sizeof a);
  std::memcpy(mine.b, b, sizeof b);
  return mine;
}

// Products of bf16 operands: a lane holds 2 values per word, k group g's values in the lanes of group g.
template <int kWords>
void mfma_bf16(float (&c)[4], const uint32_t (&a)[kWords], const uint32_t (&b)[kWords], const void* site) {
  accumulate(c, operands_of(a, b), site, [](const MatrixOperands& x, const MatrixOperands& y) {
    double sum = 0.0;
    for (int j = 0; j < 2 * kWords; ++j) sum += static_cast<double>(bf16_value(x.a, j)) * bf16_value(y.b, j);
    return sum;
  });
}

}  // namespace

void mfma_16x16x16_bf16(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], const void* site) {
  mfma_bf16(c, a, b, site);
}

void mfma_16x16x32_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], const void* site) {
  mfma_bf16(c, a, b, site);
}

void mfma_16x16x32_fp8(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2], Fp8Kind kind,
                       const void* site) {
  accumulate(c, operands_of(a, b), site, [kind](const MatrixOperands& x, const MatrixOperands& y) {
    double sum = 0.0;
    for (int j = 0; j < 8; ++j) {
      sum += static_cast<double>(fp8_value(byte_of(x.a, j), kind)) * fp8_value(byte_of(y.b, j), kind);
    }
    return sum;
  });
}

void mfma_scale_16x16x128_fp8(float (&c)[4], const uint32_t (&a)[8], const uint32_t (&b)[8], uint32_t scale_a,
                              int opsel_a, uint32_t scale_b, int opsel_b, const void* site) {
  MatrixOperands mine = operands_of(a, b);
  mine.scale_a = (scale_a >> (8 * opsel_a)) & 0xffu;
  mine.scale_b = (scale_b >> (8 * opsel_b)) & 0xffu;
  // Lane 16 g + i holds 32 codes of k group g (k in [32 g, 32 g + 32)) for row / column i and that group's
  // E8M0 byte: 2^(byte - 127), NaN for 255.
  accumulate(c, mine, site, [](const MatrixOperands& x, const MatrixOperands& y) {
    if (x.scale_a == 255 || y.scale_b == 255) return std::nan("");
    double sum = 0.0;
    for (int j = 0; j < 32; ++j) {
      sum += static_cast<double>(fp8_value(byte_of(x.a, j), Fp8Kind::kOcp)) * fp8_value(byte_of(y.b, j), Fp8Kind::kOcp);
    }
    return std::ldexp(sum, static_cast<int>(x.scale_a) - 127 + static_cast<int>(y.scale_b) - 127);
  });
}

// ---- conversion ----------------------------------------------------------------------------------
namespace {
template <dsv4::Fp8Format F>
uint32_t convert_no_saturation(float x) {
  using T = dsv4::Fp8Traits<F>;
  // Past the largest finite value by half its step or more (ties away from the odd FNUZ 0x7F, towards
  // the even OCP 0x7E), and Inf / NaN: the NaN code.
  const float magnitude = std::fabs(x);
  const bool overflow = F == dsv4::Fp8Format::kFNUZ ? !(magnitude < 248.0f) : !(magnitude <= 464.0f);
  if (overflow) return F == dsv4::Fp8Format::kFNUZ ? 0x80u : (std::signbit(x) ? 0xFFu : 0x7Fu);
  uint32_t code = dsv4::fp8_encode_software<F>(x);
  if ((code & 0x7Fu) == 0 && std::signbit(x)) code = 0x80u;  // the unit keeps a zero's sign
  return code;
}
}  // namespace

int cvt_pk_fp8_f32(float lo, float hi, int old, bool high_word, Fp8Kind kind) {
  const auto convert = [kind](float x) {
    return kind == Fp8Kind::kFnuz ? convert_no_saturation<dsv4::Fp8Format::kFNUZ>(x)
                                  : convert_no_saturation<dsv4::Fp8Format::kOCP>(x);
  };
  const uint32_t pair = convert(lo) | (convert(hi) << 8);
  const uint32_t word = static_cast<uint32_t>(old);
  return static_cast<int>(high_word ? (word & 0xffffu) | (pair << 16) : (word & 0xffff0000u) | pair);
}

}  // namespace dsv4_sim
