// The execution model of wave_sim.h: fibers (ucontext) for a block's threads, a round-robin scheduler that
// switches only where a thread waits, and launches in stream order with overlapping ones held back.
#include "wave_sim.h"

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace dsv4_sim {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;
// Window addresses of `static` shared variables: this, plus their offset from an anchor in the program's data
// (within +-2^29).
constexpr uint32_t kStaticWindowBase = 0xC0000000u;
const unsigned char g_static_window_anchor = 0;

[[noreturn]] void fail(const char* what) { model_error(what); }

enum class Wait { kNone, kBarrier, kClusterBarrier, kExchange, kNamedBarrier, kMbarrier };

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
  int linear = 0;      // its slot in the cluster's threads: block slot x the padded block, + its index
  int block_slot = 0;  // its block's rank in the cluster
  bool present = false;  // a slot of the padding after a block's last wave holds none
  bool done = false;
  Wait wait = Wait::kNone;
  uint64_t wait_generation = 0;  // the barrier generation it waits to pass, or the mbarrier phase's parity
  bool released = false;         // its wave operation ran
  uint64_t exchanges = 0;        // wave operations it took part in: its next deposit buffer is exchanges % 2
  uint64_t round_lanes = 0;      // the lanes and deposit buffers of its last wave operation
  uint64_t round_parity = 0;
  int named_barrier = 0;         // the named barrier it waits at
  uint32_t mbarrier = 0;         // the mbarrier it waits at, for the phase of parity wait_generation
  // Per AsyncUnit: its open group, and its committed groups, oldest first.
  std::vector<std::function<void()>> open_group[2];
  std::deque<std::vector<std::function<void()>>> groups[2];
};

// A lane deposits into its own two buffers in turn. It can deposit again into the buffer of an earlier
// run only after its next run was released, which needs every live lane of that run's group to have
// arrived there or to wait elsewhere -- so each reader of the earlier run has already read it (a lane reads
// its run's deposits as soon as it resumes, before it can wait again).
struct Wave {
  Round rounds[kWaveSize];  // at most one per lane
  unsigned char deposits[kWaveSize][2][kSlotBytes];
};

struct NamedBarrier {
  int arrived = 0;
  uint64_t generation = 0;
};

// An mbarrier's state: the arrivals a phase expects and still waits for, its transaction bytes still to come,
// the phases completed, and the bulk copies issued on it that have not landed.
struct Mbarrier {
  uint32_t expected = 0, pending = 0;
  int64_t transaction_bytes = 0;
  uint64_t completed_phases = 0;
  std::vector<std::pair<uint32_t, std::function<void()>>> copies;
};

struct Block {
  Index3 index;
  int live = 0;
  int arrived = 0;
  uint64_t generation = 0;
  int votes[2] = {0, 0};  // __syncthreads_count's, by the generation's parity
  NamedBarrier named[16];  // bar.sync / bar.arrive; 0 is the block barrier's (__syncthreads) and unused here
  std::map<uint32_t, Mbarrier> mbarriers;
};

struct Grid {
  Index3 grid{1, 1, 1};
  Index3 block{1, 1, 1};
  int threads = 0;        // a block's
  int cluster_blocks = 1;  // blocks run together (a thread block cluster)
  KernelBody body = nullptr;
  void* context = nullptr;
};

// A grid being run, a cluster of blocks at a time (one block but for thread block clusters): its threads'
// fibers (each block's padded to whole waves), waves, the blocks' state and dynamic shared memory.
struct GridRun {
  Grid grid;
  int block_slots = 0;  // thread slots a block takes: its threads rounded up to whole waves
  std::vector<Block> blocks;
  std::vector<Thread> threads;
  std::vector<Wave> waves;
  std::vector<std::vector<unsigned char>> shared;  // per block; kSharedAlignment spare bytes in front
  size_t shared_bytes = 0;
  // The cluster barrier (barrier.cluster): its threads still running, arrived, and its generation.
  int cluster_live = 0, cluster_arrived = 0;
  uint64_t cluster_generation = 0;
  // `static` shared variables: one copy of their section per block of a cluster, swapped in for the block
  // whose thread runs (the section holds `owner`'s).
  std::vector<std::vector<unsigned char>> static_copies;
  int owner = 0;
  Thread* current = nullptr;
  ucontext_t scheduler;
};

ChipModel g_chip{"gfx942:sramecc+:xnack-", 64 * 1024, 8};
int g_last_error = 0;
// The grid being run, and one more for a held-back launch run from inside it (wait_for_previous_grid).
GridRun g_runs[2];
GridRun* g_run = &g_runs[0];

Wave& wave_of(const Thread& thread) { return g_run->waves[thread.linear / kWaveSize]; }

unsigned char* shared_base_of(int block_slot) {
  std::vector<unsigned char>& buffer = g_run->shared[block_slot];
  const uintptr_t address = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + (kSharedAlignment - address % kSharedAlignment) % kSharedAlignment;
}
unsigned char* shared_base() { return shared_base_of(g_run->current->block_slot); }
Block& block_of(const Thread& thread) { return g_run->blocks[thread.block_slot]; }
Block& current_block() { return block_of(*g_run->current); }

// Back to the scheduler until it resumes this thread.
void yield() { swapcontext(&g_run->current->context, &g_run->scheduler); }

Thread& thread_at(const Wave& wave, int lane) {
  return g_run->threads[static_cast<size_t>(&wave - g_run->waves.data()) * kWaveSize + lane];
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
  for (int lane = first; lane < first + width; ++lane) {
    const Thread& thread = thread_at(wave, lane);
    count += thread.present && !thread.done;
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

void release_block(Block& block) {
  // The next generation's vote starts from zero; this one's stays until every thread read it (they all
  // must arrive at the next barrier before the one after it reuses the slot).
  block.votes[(block.generation + 1) % 2] = 0;
  block.arrived = 0;
  ++block.generation;
}

void release_cluster() {
  g_run->cluster_arrived = 0;
  ++g_run->cluster_generation;
}

Mbarrier& mbarrier_at(Block& block, uint32_t address) {
  const auto found = block.mbarriers.find(address);
  if (found == block.mbarriers.end()) fail("an mbarrier used before its init");
  return found->second;
}

void complete_phase_if_done(Mbarrier& barrier) {
  if (barrier.pending == 0 && barrier.transaction_bytes == 0) {
    ++barrier.completed_phases;
    barrier.pending = barrier.expected;
  }
}

// Lands the barrier's bulk copies; whether the phase of parity `parity` has completed.
bool mbarrier_phase_done(Block& block, uint32_t address, uint32_t parity) {
  Mbarrier& barrier = mbarrier_at(block, address);
  std::vector<std::pair<uint32_t, std::function<void()>>> copies = std::move(barrier.copies);
  barrier.copies.clear();
  for (const auto& [bytes, copy] : copies) {
    copy();
    Mbarrier& again = mbarrier_at(block, address);
    again.transaction_bytes -= bytes;
    complete_phase_if_done(again);
  }
  return mbarrier_at(block, address).completed_phases % 2 != parity;
}

bool blocked(const Thread& thread) {
  Block& block = block_of(thread);
  switch (thread.wait) {
    case Wait::kBarrier:
      return block.generation == thread.wait_generation;
    case Wait::kClusterBarrier:
      return g_run->cluster_generation == thread.wait_generation;
    case Wait::kExchange:
      return !thread.released;
    case Wait::kNamedBarrier:
      return block.named[thread.named_barrier].generation == thread.wait_generation;
    case Wait::kMbarrier:
      return !mbarrier_phase_done(block, thread.mbarrier, static_cast<uint32_t>(thread.wait_generation));
    default:
      return false;
  }
}

// After a pass over the block in which no thread could run: every live lane waits, so each pending run of
// a wave operation takes the lanes that reached it (the others of its group wait elsewhere). Returns
// whether there was one.
bool release_partial_rounds() {
  bool released = false;
  for (Wave& wave : g_run->waves) {
    for (Round& round : wave.rounds) {
      if (!round.open) continue;
      release_round(wave, round);
      released = true;
    }
  }
  return released;
}

void complete_groups(Thread& thread, int unit, size_t pending) {
  while (thread.groups[unit].size() > pending) {
    const std::vector<std::function<void()>> group = std::move(thread.groups[unit].front());
    thread.groups[unit].pop_front();
    for (const auto& work : group) work();
  }
}

void thread_entry() {
  g_run->grid.body(g_run->grid.context);
  for (int unit = 0; unit < 2; ++unit) {
    commit_deferred(static_cast<AsyncUnit>(unit));
    complete_groups(*g_run->current, unit, 0);
  }
  Thread& self = *g_run->current;
  self.done = true;
  self.wait = Wait::kNone;
  // A thread that ends releases the barriers the others wait at, as an exited wave does.
  release_full_rounds(wave_of(self));
  Block& block = block_of(self);
  --block.live;
  if (block.arrived > 0 && block.arrived == block.live) release_block(block);
  --g_run->cluster_live;
  if (g_run->cluster_arrived > 0 && g_run->cluster_arrived == g_run->cluster_live) release_cluster();
  swapcontext(&self.context, &g_run->scheduler);
  fail("a finished thread resumed");
}

// The section of `static` shared variables (the shims' __shared__), if the program has any.
extern "C" unsigned char __start_dsv4_static_shared[] __attribute__((weak));
extern "C" unsigned char __stop_dsv4_static_shared[] __attribute__((weak));
size_t static_shared_bytes() {
  return __start_dsv4_static_shared == nullptr ? 0 : static_cast<size_t>(__stop_dsv4_static_shared -
                                                                         __start_dsv4_static_shared);
}

// Makes block `slot`'s copy of the static shared variables the live one.
void own_static_shared(int slot) {
  if (slot == g_run->owner || g_run->grid.cluster_blocks == 1) return;
  const size_t bytes = static_shared_bytes();
  std::memcpy(g_run->static_copies[g_run->owner].data(), __start_dsv4_static_shared, bytes);
  std::memcpy(__start_dsv4_static_shared, g_run->static_copies[slot].data(), bytes);
  g_run->owner = slot;
}

// The order of a pass over the threads: slot order, or with DSV4_MODEL_REVERSE=1 in the environment the last
// wave first -- and on 32-lane warps, whose lanes NVIDIA does not run in lockstep, the last lane first too --
// so that a read that lacks the barrier or warp sync its write needs sees the old value in one of the two.
int slot_in_pass(int pass_index, int slots) {
  static const bool reverse = [] {
    const char* value = std::getenv("DSV4_MODEL_REVERSE");
    return value != nullptr && value[0] == '1';
  }();
  if (!reverse) return pass_index;
  if (kWaveSize == 32) return slots - 1 - pass_index;
  const int wave = pass_index / kWaveSize, lane = pass_index % kWaveSize;  // CDNA waves run in lockstep
  return (slots / kWaveSize - 1 - wave) * kWaveSize + lane;
}

// Runs the cluster of blocks first_x, first_x + 1, ... (at y, z) to its end.
void run_cluster(uint32_t first_x, uint32_t y, uint32_t z) {
  const int cluster = g_run->grid.cluster_blocks;
  for (int b = 0; b < cluster; ++b) {
    Block& block = g_run->blocks[b];
    block = Block{};
    block.index = {first_x + static_cast<uint32_t>(b), y, z};
    block.live = g_run->grid.threads;
    std::fill(shared_base_of(b), shared_base_of(b) + g_run->shared_bytes, static_cast<unsigned char>(0xCD));
  }
  g_run->cluster_live = cluster * g_run->grid.threads;
  g_run->cluster_arrived = 0;
  for (Wave& wave : g_run->waves) {
    for (Round& round : wave.rounds) round = Round{};
  }
  if (cluster > 1) {  // every block starts from the values the section has now, as each would one at a time
    for (auto& copy : g_run->static_copies) {
      copy.assign(__start_dsv4_static_shared, __start_dsv4_static_shared + static_shared_bytes());
    }
    g_run->owner = 0;
  }
  const int slots = cluster * g_run->block_slots;
  for (int slot = 0; slot < slots; ++slot) {
    Thread& thread = g_run->threads[slot];
    const int t = slot % g_run->block_slots;
    thread.linear = slot;
    thread.block_slot = slot / g_run->block_slots;
    thread.present = t < g_run->grid.threads;
    thread.index = {static_cast<uint32_t>(t % g_run->grid.block.x),
                    static_cast<uint32_t>((t / g_run->grid.block.x) % g_run->grid.block.y),
                    static_cast<uint32_t>(t / (g_run->grid.block.x * g_run->grid.block.y))};
    thread.done = !thread.present;
    thread.wait = Wait::kNone;
    thread.exchanges = 0;
    for (int unit = 0; unit < 2; ++unit) {
      thread.open_group[unit].clear();
      thread.groups[unit].clear();
    }
    if (!thread.present) continue;
    getcontext(&thread.context);
    thread.context.uc_stack.ss_sp = thread.stack.get();
    thread.context.uc_stack.ss_size = kStackBytes;
    thread.context.uc_link = nullptr;
    makecontext(&thread.context, thread_entry, 0);
  }
  int remaining = cluster * g_run->grid.threads;
  while (remaining > 0) {
    // One pass over the threads; each runs until it waits or ends. After a pass in which none could run,
    // every live thread waits: a wave operation that part of a wave reached then runs for those lanes;
    // without one, the waits can never end.
    bool ran = false;
    for (int pass_index = 0; pass_index < slots; ++pass_index) {
      Thread& thread = g_run->threads[slot_in_pass(pass_index, slots)];
      if (thread.done || blocked(thread)) continue;
      own_static_shared(thread.block_slot);
      g_run->current = &thread;
      swapcontext(&g_run->scheduler, &thread.context);
      ran = true;
      if (thread.done) --remaining;
    }
    g_run->current = nullptr;
    if (remaining > 0 && !ran && !release_partial_rounds()) {
      fail("deadlock: live threads wait at barriers or wave operations that others never reach");
    }
  }
  own_static_shared(0);
}

}  // namespace

void model_error(const char* what) {
  std::fprintf(stderr, "device model (%d-lane waves): %s\n", kWaveSize, what);
  std::abort();
}

Index3& thread_index() { return g_run->current->index; }
const Index3& block_index() { return current_block().index; }
Index3 running_block_dim{1, 1, 1};
Index3 running_grid_dim{1, 1, 1};
const Index3& block_dim() { return g_run->grid.block; }
const Index3& grid_dim() { return g_run->grid.grid; }
int lane_id() { return g_run->current->linear % kWaveSize; }  // blocks take whole waves of slots
void* dynamic_shared_memory() { return shared_base(); }

void sync_block() { sync_block_count(0); }

int sync_block_count(int predicate) {
  Thread& self = *g_run->current;
  Block& block = block_of(self);
  const uint64_t generation = block.generation;
  block.votes[generation % 2] += predicate != 0;
  self.wait = Wait::kBarrier;
  self.wait_generation = generation;
  if (++block.arrived == block.live) {
    release_block(block);
  } else {
    while (blocked(self)) yield();
  }
  self.wait = Wait::kNone;
  return block.votes[generation % 2];
}

void sync_cluster() {
  Thread& self = *g_run->current;
  self.wait = Wait::kClusterBarrier;
  self.wait_generation = g_run->cluster_generation;
  if (++g_run->cluster_arrived == g_run->cluster_live) {
    release_cluster();
  } else {
    while (blocked(self)) yield();
  }
  self.wait = Wait::kNone;
}

int cluster_rank() { return g_run->current->block_slot; }

float load_cluster_shared_f32(uint32_t window_address, int rank) {
  if (rank < 0 || rank >= g_run->grid.cluster_blocks) fail("a cluster rank past the cluster");
  float value;
  if (window_address < kStaticWindowBase - (uint32_t{1} << 29)) {
    if (window_address + sizeof value > g_run->shared_bytes) {
      fail("a cluster shared address past the dynamic shared memory");
    }
    std::memcpy(&value, shared_base_of(rank) + window_address, sizeof value);
    return value;
  }
  const unsigned char* live = shared_pointer(window_address);
  if (rank == g_run->owner) {
    std::memcpy(&value, live, sizeof value);
    return value;
  }
  const size_t offset = static_cast<size_t>(live - __start_dsv4_static_shared);
  if (live < __start_dsv4_static_shared || offset + sizeof value > static_shared_bytes()) {
    fail("a cluster shared address outside the shared variables");
  }
  std::memcpy(&value, g_run->static_copies[rank].data() + offset, sizeof value);
  return value;
}

__attribute__((noinline)) const void* call_site() { return __builtin_return_address(0); }

void wave_exchange(const void* mine, size_t bytes, int width, const void* site) {
  if (bytes > kSlotBytes) fail("wave operand too large");
  if (width < 1 || width > kWaveSize || (width & (width - 1)) != 0) fail("wave operation width");
  Thread& self = *g_run->current;
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

bool taken_part(int lane) { return lane >= 0 && lane < kWaveSize && (g_run->current->round_lanes >> lane & 1); }

const unsigned char* deposit_of(int source) {
  if (source < 0 || source >= kWaveSize) fail("wave operation reads a lane outside the wave");
  if (!taken_part(source)) fail("wave operation reads a lane that did not take part");
  const Thread& self = *g_run->current;
  return wave_of(self).deposits[source][g_run->current->round_parity >> source & 1];
}

namespace {

bool valid_configuration(Index3 grid, Index3 block, size_t dynamic_shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  return threads >= 1 && threads <= kMaxThreads && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.y <= 65535 &&
         grid.z <= 65535 && dynamic_shared_bytes <= g_chip.lds_bytes;
}

// Runs a valid grid on `run`, then makes the grid that was being run current again.
void run_valid_grid(GridRun& run, Index3 grid, Index3 block, int cluster_blocks, size_t dynamic_shared_bytes,
                    KernelBody body, void* context) {
  GridRun* const outer = g_run;
  g_run = &run;
  const int threads = static_cast<int>(uint64_t{block.x} * block.y * block.z);
  run.grid = {grid, block, threads, cluster_blocks, body, context};
  run.block_slots = (threads + kWaveSize - 1) / kWaveSize * kWaveSize;
  const size_t slots = static_cast<size_t>(cluster_blocks) * run.block_slots;
  if (run.threads.size() < slots) {
    const size_t old = run.threads.size();
    run.threads.resize(slots);
    for (size_t t = old; t < slots; ++t) run.threads[t].stack.reset(new unsigned char[kStackBytes]);
  }
  run.waves.resize(slots / kWaveSize);
  run.blocks.resize(cluster_blocks);
  run.shared.assign(cluster_blocks, std::vector<unsigned char>(dynamic_shared_bytes + kSharedAlignment, 0xCD));
  run.shared_bytes = dynamic_shared_bytes;
  run.static_copies.resize(cluster_blocks);
  const Index3 outer_grid_dim = running_grid_dim, outer_block_dim = running_block_dim;
  running_grid_dim = grid;
  running_block_dim = block;
  for (uint32_t z = 0; z < grid.z; ++z) {
    for (uint32_t y = 0; y < grid.y; ++y) {
      for (uint32_t x = 0; x < grid.x; x += cluster_blocks) run_cluster(x, y, z);
    }
  }
  running_grid_dim = outer_grid_dim;
  running_block_dim = outer_block_dim;
  g_run = outer;
}

void run_launch_body(void* context) { (*static_cast<const std::function<void()>*>(context))(); }

void run_launch(GridRun& run, const Launch& launch) {
  run_valid_grid(run, launch.grid, launch.block, launch.cluster_blocks, launch.dynamic_shared_bytes,
                 &run_launch_body, const_cast<std::function<void()>*>(&launch.body));
}

// Stream order: the launch held back (not run yet), the one waiting for the running kernel's
// wait_for_previous_grid(), and how many launches came since the last finish_launches().
std::optional<Launch> g_held;
std::optional<Launch> g_awaited;
int g_launches_since_finish = 0;

int held_back_phase() {
  static const int phase = [] {
    const char* value = std::getenv("DSV4_MODEL_PDL_PHASE");
    return value != nullptr && value[0] == '1' ? 1 : 0;
  }();
  return phase;
}

}  // namespace

uint32_t shared_window_address(const void* shared_pointer) {
  const auto* p = static_cast<const unsigned char*>(shared_pointer);
  const unsigned char* base = shared_base();
  if (p >= base && p < base + g_run->shared_bytes) return static_cast<uint32_t>(p - base);
  // A `static` shared variable: an offset from the program's data, far above the dynamic range.
  const int64_t offset = p - &g_static_window_anchor;
  if (offset < -(int64_t{1} << 29) || offset >= (int64_t{1} << 29)) {
    fail("a shared-window address of memory that is not shared");
  }
  return static_cast<uint32_t>(kStaticWindowBase + offset);
}

unsigned char* shared_pointer(uint32_t window_address) {
  if (window_address < kStaticWindowBase - (uint32_t{1} << 29)) {
    if (window_address >= g_run->shared_bytes) fail("a shared-window address past the dynamic shared memory");
    return shared_base() + window_address;
  }
  return const_cast<unsigned char*>(&g_static_window_anchor) +
         (static_cast<int64_t>(window_address) - kStaticWindowBase);
}

void defer(AsyncUnit unit, std::function<void()> work) {
  g_run->current->open_group[static_cast<int>(unit)].push_back(std::move(work));
}

void commit_deferred(AsyncUnit unit) {
  Thread& self = *g_run->current;
  const int u = static_cast<int>(unit);
  self.groups[u].push_back(std::move(self.open_group[u]));
  self.open_group[u].clear();
}

void complete_deferred(AsyncUnit unit, int pending) {
  complete_groups(*g_run->current, static_cast<int>(unit), static_cast<size_t>(pending < 0 ? 0 : pending));
}

void mbarrier_init(uint32_t barrier, uint32_t arrivals) {
  Mbarrier& state = current_block().mbarriers[barrier];
  state = Mbarrier{};
  state.expected = state.pending = arrivals;
}

void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes) {
  Mbarrier& state = mbarrier_at(current_block(), barrier);
  state.transaction_bytes += bytes;
  if (state.pending == 0) fail("more arrivals at an mbarrier than its phase expects");
  --state.pending;
  complete_phase_if_done(state);
}

void mbarrier_bulk_copy(uint32_t barrier, uint32_t bytes, std::function<void()> copy) {
  mbarrier_at(current_block(), barrier).copies.emplace_back(bytes, std::move(copy));
}

void mbarrier_wait_parity(uint32_t barrier, uint32_t parity) {
  Thread& self = *g_run->current;
  self.wait = Wait::kMbarrier;
  self.mbarrier = barrier;
  self.wait_generation = parity;
  while (blocked(self)) yield();
  self.wait = Wait::kNone;
}

void named_barrier(int id, int threads, bool wait) {
  if (id < 1 || id > 15 || threads < 1 || threads > g_run->grid.threads) fail("named barrier id or thread count");
  Thread& self = *g_run->current;
  NamedBarrier& barrier = current_block().named[id];
  const uint64_t generation = barrier.generation;
  if (++barrier.arrived == threads) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  if (!wait) return;
  self.wait = Wait::kNamedBarrier;
  self.named_barrier = id;
  self.wait_generation = generation;
  while (blocked(self)) yield();
  self.wait = Wait::kNone;
}

void require_exactly_lanes(uint64_t mask) {
  for (int lane = 0; lane < kWaveSize; ++lane) {
    if (taken_part(lane) != ((mask >> lane & 1u) != 0)) {
      fail("a *_sync warp operation without exactly the lanes of its mask");
    }
  }
}

int run_grid(Index3 grid, Index3 block, size_t dynamic_shared_bytes, KernelBody body, void* context) {
  if (g_run != &g_runs[0] || g_runs[0].current != nullptr) fail("run_grid inside a running kernel");
  if (!valid_configuration(grid, block, dynamic_shared_bytes)) {
    g_last_error = 9;  // invalid configuration
    return g_last_error;
  }
  run_valid_grid(g_runs[0], grid, block, 1, dynamic_shared_bytes, body, context);
  return 0;
}

int launch(Launch next) {
  if (g_run != &g_runs[0] || g_runs[0].current != nullptr) fail("a launch from inside a running kernel");
  const bool valid_cluster = next.cluster_blocks >= 1 && next.cluster_blocks <= 8 &&
                             next.grid.x % static_cast<uint32_t>(next.cluster_blocks) == 0;
  if (!valid_cluster || !valid_configuration(next.grid, next.block, next.dynamic_shared_bytes)) {
    g_last_error = 9;
    return g_last_error;
  }
  const bool hold = g_launches_since_finish++ % 2 == held_back_phase();
  if (g_held) {
    Launch held = std::move(*g_held);
    g_held.reset();
    if (next.overlapping && next.kernel != held.kernel) {
      // The dependent first; the held kernel when the dependent first waits for it (or after the dependent, if
      // it never does: it then reads nothing the held kernel writes).
      g_awaited = std::move(held);
      run_launch(g_runs[0], next);
      if (g_awaited) {
        held = std::move(*g_awaited);
        g_awaited.reset();
        run_launch(g_runs[0], held);
      }
      return 0;
    }
    run_launch(g_runs[0], held);
  }
  if (hold) {
    g_held = std::move(next);
  } else {
    run_launch(g_runs[0], next);
  }
  return 0;
}

void wait_for_previous_grid() {
  if (!g_awaited || g_run != &g_runs[0]) return;  // (a kernel run from here waits for nothing: all before it ran)
  const Launch awaited = std::move(*g_awaited);
  g_awaited.reset();
  run_launch(g_runs[1], awaited);
}

void finish_launches() {
  if (g_held) {
    const Launch held = std::move(*g_held);
    g_held.reset();
    run_launch(g_runs[0], held);
  }
  g_launches_since_finish = 0;
}

void set_chip(const ChipModel& chip) { g_chip = chip; }
const ChipModel& chip() { return g_chip; }
int take_last_error() {
  const int error = g_last_error;
  g_last_error = 0;
  return error;
}

}  // namespace dsv4_sim
