// Per-row top-k of the lightning indexer (spec/indexer.md §5), with exactly the CPU kernel's contract:
// candidates are the columns of [start, end) (clamped to the row) whose logit is neither NaN nor -inf;
// the chosen set is the min(k, candidates) best by (value descending, column ascending), -0 equal to +0;
// output order is that same order, or ascending column when stable; -1 pads the row to k.
//
// One block of 512 threads per row. The k-th best candidate is found by radix select over a 64-bit
// key that makes every candidate distinct: the order-preserving bits of the value, then the column
// (ascending, only when values tie at the boundary). The row is read twice from global memory:
//   1. a 4096-bin histogram of the top 12 bits of the value key finds the coarse bin B that holds the
//      k-th best (or shows that every candidate is chosen);
//   2. candidates above B are chosen outright (straight into the sort buffer); those in B ("ties")
//      are copied to shared memory, where 8-bit (then 4-bit) digit passes over the remaining 20 value
//      bits, and column passes if values still tie, find the boundary; the chosen ties join the sort
//      buffer. When B holds more candidates than shared memory does, the same passes read them from
//      the row instead (it stays in L2), 8 loads in flight per thread.
// A bitonic sort in shared memory puts the chosen candidates in output order.
#include "dsv4/launch.h"
#include "indexer/indexer_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kBins = 256;  // digit passes: 8 bits
constexpr int kCoarseShift = 20;  // the first pass bins the top 12 bits of the value key
constexpr int kCoarseBins = 1 << (32 - kCoarseShift);
constexpr int kCoarseBinsPerThread = kCoarseBins / kTopkThreads;  // 8, two 16-byte loads
constexpr int kScanLanes = 32;                                    // one warp sums the threads' bins
constexpr int kThreadsPerScanLane = kTopkThreads / kScanLanes;    // 16
// Dynamic shared memory: the sort buffer (k rounded up to a power of two, 8 bytes each), then the tie
// buffer in the rest; the coarse histogram overlays both during the first pass. 40 KB keeps every k up
// to kTopkMaxK under the 48 KB a launch gets without opting in (and under gfx942's 64 KB of LDS).
constexpr int kRegionBytes = 40 * 1024;
static_assert(kCoarseBinsPerThread == 8 && kCoarseBins * 4 <= kRegionBytes, "coarse histogram layout");
static_assert(kTopkMaxK * 8 < kRegionBytes, "the sort buffer leaves room for ties");

// Larger for a better value; -0 and +0 map to the same key.
DSV4_DEVICE uint32_t order_key(float v) {
  const uint32_t bits = v == 0.0f ? 0u : float_bits(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

DSV4_DEVICE bool is_candidate(float v) { return v == v && v > -__builtin_huge_valf(); }

struct SelectState {
  uint32_t prefix;  // value-key digits found so far (the coarse bin's 12 bits first)
  uint32_t mask;
  uint32_t need;    // how many of the candidates matching prefix/mask are still to be chosen
  uint32_t count;   // candidates matching prefix/mask
  uint32_t total;   // candidates in the row
  int bin;          // the coarse bin of the k-th best; -1: every candidate is chosen
  uint32_t column_prefix;  // column digits found so far, among candidates whose value key is prefix
  uint32_t column_mask;
  uint32_t last_column;  // chosen: value key above prefix, or equal to it with column <= last_column
  uint32_t sorted_count;  // entries in the sort buffer
  uint32_t tie_count;     // candidates in the coarse bin
};

// hist[bin] += 1. A plain shared-memory atomic: the first pass spreads typical logits over many of its
// 4096 bins, and the later passes see only the few hundred candidates of one bin. (Grouping a warp's
// equal bins with __match_any_sync first made the whole op twice as slow on the H200.)
DSV4_DEVICE void hist_add(uint32_t* hist, uint32_t bin) { atomicAdd(&hist[bin], 1u); }

// fn(v, j) for the row's columns j = t, t + kTopkThreads, ..., with kBatch loads in flight per thread
// (columns past the row read as NaN, which is no candidate).
constexpr int kBatch = 8;

template <class Fn>
DSV4_DEVICE void row_for_each(const float* x, int64_t len, int t, Fn&& fn) {
  for (int64_t j0 = t; j0 < len; j0 += static_cast<int64_t>(kTopkThreads) * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = j0 + static_cast<int64_t>(u) * kTopkThreads;
      v[u] = j < len ? x[j] : __builtin_nanf("");
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) fn(v[u], j0 + static_cast<int64_t>(u) * kTopkThreads);
  }
}

// Inclusive prefix sums of hist (ascending) into scan; needs kBins <= blockDim.x.
DSV4_DEVICE void scan_bins(const uint32_t* hist, uint32_t* scan) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < kBins) scan[t] = hist[t];
  __syncthreads();
  for (int offset = 1; offset < kBins; offset <<= 1) {
    uint32_t add = 0;
    if (t < kBins && t >= offset) add = scan[t - offset];
    __syncthreads();
    if (t < kBins) scan[t] += add;
    __syncthreads();
  }
}

// The sort buffer's entry for a chosen candidate: ascending order is output order.
DSV4_DEVICE unsigned long long sort_entry(uint32_t key, uint32_t column, bool stable) {
  return stable ? static_cast<unsigned long long>(column)
                : ~((static_cast<unsigned long long>(key) << 32) | (0xffffffffu - column));
}

// From the coarse histogram: st.total, and unless every candidate is chosen (total <= k), the bin B
// where the k-th best falls (counting from the top bin down) with st.prefix/mask/need/count for it.
// Thread t owns bins [8t, 8t + 8); one warp turns the threads' sums into "candidates above".
DSV4_DEVICE void find_coarse_bin(const uint32_t* coarse, uint32_t* thread_sums, uint32_t* group_above,
                                 SelectState& st, uint32_t k) {
  const int t = static_cast<int>(threadIdx.x);
  const uint4 low = reinterpret_cast<const uint4*>(coarse)[2 * t];
  const uint4 high = reinterpret_cast<const uint4*>(coarse)[2 * t + 1];
  thread_sums[t] = low.x + low.y + low.z + low.w + high.x + high.y + high.z + high.w;
  __syncthreads();
  if (t < kScanLanes) {
    uint32_t group = 0;
    for (int i = 0; i < kThreadsPerScanLane; ++i) group += thread_sums[t * kThreadsPerScanLane + i];
    uint32_t at_or_above = group;  // this lane's group and every higher one
    for (int offset = 1; offset < kScanLanes; offset <<= 1) {
      const uint32_t higher = shuffle_from(at_or_above, (t + offset) % kScanLanes, kScanLanes);
      if (t + offset < kScanLanes) at_or_above += higher;
    }
    group_above[t] = at_or_above - group;
    if (t == 0) st.total = at_or_above;
  }
  __syncthreads();
  if (st.total <= k) return;
  const int group_end = (t / kThreadsPerScanLane + 1) * kThreadsPerScanLane;
  uint32_t above = group_above[t / kThreadsPerScanLane];
  for (int i = t + 1; i < group_end; ++i) above += thread_sums[i];
  for (int b = kCoarseBinsPerThread * t + kCoarseBinsPerThread - 1; b >= kCoarseBinsPerThread * t; --b) {
    const uint32_t in_bin = coarse[b];
    if (above < k && above + in_bin >= k) {
      st.bin = b;
      st.prefix = static_cast<uint32_t>(b) << kCoarseShift;
      st.mask = ~0u << kCoarseShift;
      st.need = k - above;
      st.count = in_bin;
    }
    above += in_bin;
  }
}

__global__ void __launch_bounds__(kTopkThreads) topk_per_row_kernel(TopkPerRowArgs args, int sort_size,
                                                                   int tie_capacity) {
  wait_for_previous_kernel();  // launched to overlap the kernel before it (launch_overlapping)
  DSV4_DYNAMIC_SHARED(unsigned long long, region, 16);  // kRegionBytes
  unsigned long long* sorted = region;            // sort_size entries
  uint2* ties = reinterpret_cast<uint2*>(region + sort_size);  // tie_capacity (value key, column) pairs
  uint32_t* coarse = reinterpret_cast<uint32_t*>(region);      // first pass only
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t scan[kBins];
  __shared__ uint32_t thread_sums[kTopkThreads];
  __shared__ uint32_t group_above[kScanLanes];
  __shared__ SelectState st;

  const int t = static_cast<int>(threadIdx.x);
  const int64_t r = blockIdx.x;
  int64_t start = args.starts != nullptr ? args.starts[r] : 0;
  start = start < 0 ? 0 : (start > args.cols ? args.cols : start);
  int64_t stop = args.ends[r];
  stop = stop < start ? start : (stop > args.cols ? args.cols : stop);
  const int64_t len = stop - start;
  const float* x = args.logits + r * args.row_stride + start;
  const uint32_t k = static_cast<uint32_t>(args.k);
  const bool stable = args.stable;

  for (int i = t; i < kCoarseBins; i += kTopkThreads) coarse[i] = 0;
  if (t == 0) {
    st.bin = -1;
    st.last_column = 0xffffffffu;
    st.sorted_count = 0;
    st.tie_count = 0;
  }
  __syncthreads();
  row_for_each(x, len, t, [&](float v, int64_t) {
    if (is_candidate(v)) hist_add(coarse, order_key(v) >> kCoarseShift);
  });
  __syncthreads();
  find_coarse_bin(coarse, thread_sums, group_above, st, k);
  __syncthreads();  // the coarse histogram is dead from here: its memory holds sorted and ties
  const int bin = st.bin;  // -1: every bin is above it, every candidate chosen
  row_for_each(x, len, t, [&](float v, int64_t j) {
    if (!is_candidate(v)) return;
    const uint32_t key = order_key(v);
    const int key_bin = static_cast<int>(key >> kCoarseShift);
    if (key_bin > bin) {
      const uint32_t slot = atomicAdd(&st.sorted_count, 1u);
      if (slot < static_cast<uint32_t>(sort_size)) sorted[slot] = sort_entry(key, static_cast<uint32_t>(j), stable);
    } else if (key_bin == bin) {
      const uint32_t slot = atomicAdd(&st.tie_count, 1u);
      if (slot < static_cast<uint32_t>(tie_capacity)) ties[slot] = make_uint2(key, static_cast<uint32_t>(j));
    }
  });
  __syncthreads();

  if (bin >= 0) {
    // fn(value key, column) for every candidate of the coarse bin: from shared memory when they fit.
    const uint32_t tie_count = st.tie_count;
    const bool ties_in_shared = tie_count <= static_cast<uint32_t>(tie_capacity);
    auto for_each_tie = [&](auto&& fn) {
      if (ties_in_shared) {
        for (uint32_t i = static_cast<uint32_t>(t); i < tie_count; i += kTopkThreads) fn(ties[i].x, ties[i].y);
      } else {
        row_for_each(x, len, t, [&](float v, int64_t j) {
          if (!is_candidate(v)) return;
          const uint32_t key = order_key(v);
          if (static_cast<int>(key >> kCoarseShift) == bin) fn(key, static_cast<uint32_t>(j));
        });
      }
    };
    // Value passes over the 20 bits below the coarse bin (8, 8, then 4), until the candidates matching
    // the digits found are all to be chosen.
    for (int shift = kCoarseShift - 8; shift > -8 && st.need < st.count; shift -= 8) {
      const int digit_shift = shift < 0 ? 0 : shift;
      const uint32_t digit_mask = shift < 0 ? (0xffu >> -shift) : 0xffu;
      if (t < kBins) hist[t] = 0;
      __syncthreads();
      const uint32_t prefix = st.prefix, mask = st.mask, need = st.need;  // read before any thread updates st
      for_each_tie([&](uint32_t key, uint32_t) {
        if ((key & mask) == prefix) hist_add(hist, (key >> digit_shift) & digit_mask);
      });
      __syncthreads();
      scan_bins(hist, scan);
      // Bins above d hold scan[255] - scan[d] candidates; d is the bin where the need-th best falls.
      if (t < kBins) {
        const uint32_t above = scan[kBins - 1] - scan[t];
        if (above < need && above + hist[t] >= need) {
          st.need = need - above;
          st.prefix = prefix | (static_cast<uint32_t>(t) << digit_shift);
          st.mask = mask | (digit_mask << digit_shift);
          st.count = hist[t];
        }
      }
      __syncthreads();
    }
    // Column passes (ascending) among the candidates whose whole value key ties at the boundary.
    if (st.need < st.count) {
      const uint32_t threshold = st.prefix;
      if (t == 0) {
        st.column_prefix = 0;
        st.column_mask = 0;
      }
      int top = 0;
      while (top < 24 && ((static_cast<uint64_t>(len - 1)) >> (top + 8)) != 0) top += 8;
      for (int shift = top; shift >= 0; shift -= 8) {
        if (t < kBins) hist[t] = 0;
        __syncthreads();
        const uint32_t prefix = st.column_prefix, mask = st.column_mask, need = st.need;
        for_each_tie([&](uint32_t key, uint32_t column) {
          if (key == threshold && (column & mask) == prefix) hist_add(hist, (column >> shift) & 0xffu);
        });
        __syncthreads();
        scan_bins(hist, scan);
        if (t < kBins) {
          const uint32_t below = scan[t] - hist[t];
          if (below < need && below + hist[t] >= need) {
            st.need = need - below;
            st.column_prefix = prefix | (static_cast<uint32_t>(t) << shift);
            st.column_mask = mask | (0xffu << shift);
          }
        }
        __syncthreads();
      }
      if (t == 0) st.last_column = st.column_prefix;  // the need-th smallest tied column: ties up to it are chosen
      __syncthreads();
    }
    // The chosen candidates of the coarse bin join the sort buffer.
    const uint32_t prefix = st.prefix, mask = st.mask, last_column = st.last_column;
    for_each_tie([&](uint32_t key, uint32_t column) {
      const uint32_t digits = key & mask;
      if (digits > prefix || (digits == prefix && column <= last_column)) {
        const uint32_t slot = atomicAdd(&st.sorted_count, 1u);
        if (slot < static_cast<uint32_t>(sort_size)) sorted[slot] = sort_entry(key, column, stable);
      }
    });
    __syncthreads();
  }
  const uint32_t chosen = st.sorted_count < static_cast<uint32_t>(sort_size) ? st.sorted_count
                                                                             : static_cast<uint32_t>(sort_size);
  for (int i = static_cast<int>(chosen) + t; i < sort_size; i += kTopkThreads) sorted[i] = ~0ull;
  __syncthreads();
  // Bitonic sort, ascending.
  for (int size = 2; size <= sort_size; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = t; i < sort_size / 2; i += kTopkThreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool ascending = (lo & size) == 0;
        const unsigned long long a = sorted[lo], b = sorted[hi];
        if ((a > b) == ascending) {
          sorted[lo] = b;
          sorted[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  int32_t* out = args.out + r * args.k;
  for (int64_t i = t; i < args.k; i += kTopkThreads) {
    int32_t value = -1;
    if (i < static_cast<int64_t>(chosen)) {
      const unsigned long long s = sorted[i];
      value = stable ? static_cast<int32_t>(s) : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(~s));
    }
    out[i] = value;
  }
}

}  // namespace

LaunchStatus launch_topk_per_row(const TopkPerRowArgs& args, void* stream) {
  if (args.rows < 0 || args.k < 1 || args.k > kTopkMaxK || args.cols < 0 || args.cols > 0x7fffffff) {
    return LaunchStatus::kInvalidArgument;
  }
  if (args.rows == 0) return LaunchStatus::kOk;
  const int64_t most = args.k < args.cols ? args.k : args.cols;
  int sort_size = 1;
  while (sort_size < most) sort_size <<= 1;
  const int tie_capacity = kRegionBytes / static_cast<int>(sizeof(unsigned long long)) - sort_size;
  launch_overlapping(topk_per_row_kernel, dim3(static_cast<unsigned>(args.rows)), dim3(kTopkThreads), kRegionBytes,
                     static_cast<hipStream_t>(stream), args, sort_size, tie_capacity);
  return last_launch_status();
}

}  // namespace dsv4::gpu
