// Per-row top-k of the lightning indexer (spec/indexer.md §5), with exactly the CPU kernel's contract:
// candidates are the columns of [start, end) (clamped to the row) whose logit is neither NaN nor -inf;
// the chosen set is the min(k, candidates) best by (value descending, column ascending), -0 equal to +0;
// output order is that same order, or ascending column when stable; -1 pads the row to k.
//
// One block of 512 threads per row. The k-th best candidate is found by radix select over a 64-bit
// key that makes every candidate distinct: the order-preserving bits of the value (four 8-bit passes,
// each a histogram in shared memory over the candidates that match the digits found so far) and then
// the column (ascending, as many 8-bit passes as the row width needs, only when the value ties at the
// boundary). A final pass gathers the chosen candidates (exactly min(k, candidates)) into shared memory,
// where a bitonic sort puts them in output order. The row is read from global memory once per pass
// (it stays in L2), 8 loads in flight per thread.
#include "dsv4/launch.h"
#include "indexer/indexer_launchers.h"

namespace dsv4::gpu {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kBins = 256;

// Larger for a better value; -0 and +0 map to the same key.
DSV4_DEVICE uint32_t order_key(float v) {
  const uint32_t bits = v == 0.0f ? 0u : float_bits(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

DSV4_DEVICE bool is_candidate(float v) { return v == v && v > -__builtin_huge_valf(); }

struct SelectState {
  uint32_t prefix;  // digits found so far (of the value key, then of the column)
  uint32_t mask;
  uint32_t need;    // how many of the candidates matching prefix/mask are still to be chosen
  uint32_t count;   // candidates matching prefix/mask after the last pass
  int all;          // every candidate is chosen
};

// hist[bin] += 1 for every calling lane; on NVIDIA the lanes of a warp that hit the same bin add once
// (the first pass sees few distinct bins: typical logits share their top exponent bits).
DSV4_DEVICE void hist_add(uint32_t* hist, uint32_t bin) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  const unsigned peers = __match_any_sync(__activemask(), bin);
  if ((threadIdx.x & 31u) == static_cast<unsigned>(__ffs(peers) - 1)) atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
#else
  atomicAdd(&hist[bin], 1u);
#endif
}

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

__global__ void __launch_bounds__(kTopkThreads) topk_per_row_kernel(TopkPerRowArgs args, int sort_size) {
  extern __shared__ unsigned long long sorted[];  // sort_size entries
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t scan[kBins];
  __shared__ SelectState st;
  __shared__ uint32_t gathered;

  const int t = static_cast<int>(threadIdx.x);
  const int64_t r = blockIdx.x;
  int64_t start = args.starts != nullptr ? args.starts[r] : 0;
  start = start < 0 ? 0 : (start > args.cols ? args.cols : start);
  int64_t stop = args.ends[r];
  stop = stop < start ? start : (stop > args.cols ? args.cols : stop);
  const int64_t len = stop - start;
  const float* x = args.logits + r * args.row_stride + start;
  const uint32_t k = static_cast<uint32_t>(args.k);

  if (t == 0) {
    st.prefix = 0;
    st.mask = 0;
    st.need = k;
    st.all = 0;
    gathered = 0;
  }
  // Value passes: the key of the need-th best candidate, digit by digit from the top.
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (t < kBins) hist[t] = 0;
    __syncthreads();
    const uint32_t prefix = st.prefix, mask = st.mask, need = st.need;  // read before any thread updates st
    row_for_each(x, len, t, [&](float v, int64_t) {
      if (!is_candidate(v)) return;
      const uint32_t key = order_key(v);
      if ((key & mask) == prefix) hist_add(hist, (key >> shift) & 0xffu);
    });
    __syncthreads();
    scan_bins(hist, scan);
    // Bins above d hold scan[255] - scan[d] candidates; d is the bin where the need-th best falls.
    const uint32_t total = scan[kBins - 1];
    if (shift == 24 && total <= k) {
      if (t == 0) st.all = 1;
      __syncthreads();
      break;
    }
    if (t < kBins) {
      const uint32_t above = total - scan[t];
      if (above < need && above + hist[t] >= need) {
        st.need = need - above;
        st.prefix = prefix | (static_cast<uint32_t>(t) << shift);
        st.mask = mask | (0xffu << shift);
        st.count = hist[t];
      }
    }
    __syncthreads();
  }
  const bool all = st.all != 0;
  const uint32_t threshold = st.prefix;
  // Column passes (ascending) among the candidates equal to the threshold, when only some of them are chosen.
  uint32_t last_column = 0xffffffffu;
  if (!all && st.need < st.count) {
    const uint32_t eq_need = st.need;
    __syncthreads();
    if (t == 0) {
      st.prefix = 0;
      st.mask = 0;
    }
    int top = 0;
    while (top < 24 && ((static_cast<uint64_t>(len - 1)) >> (top + 8)) != 0) top += 8;
    uint32_t need = eq_need;
    for (int shift = top; shift >= 0; shift -= 8) {
      if (t < kBins) hist[t] = 0;
      __syncthreads();
      const uint32_t prefix = st.prefix, mask = st.mask;
      row_for_each(x, len, t, [&](float v, int64_t j) {
        if (!is_candidate(v) || order_key(v) != threshold) return;
        const uint32_t column = static_cast<uint32_t>(j);
        if ((column & mask) == prefix) hist_add(hist, (column >> shift) & 0xffu);
      });
      __syncthreads();
      scan_bins(hist, scan);
      if (t < kBins) {
        const uint32_t below = scan[t] - hist[t];
        if (below < need && below + hist[t] >= need) {
          st.need = need - below;
          st.prefix = prefix | (static_cast<uint32_t>(t) << shift);
          st.mask = mask | (0xffu << shift);
        }
      }
      __syncthreads();
      need = st.need;
    }
    last_column = st.prefix;  // the need-th smallest tied column: ties up to it are chosen
  }
  // Gather the chosen candidates with their sort keys (ascending sort = output order).
  row_for_each(x, len, t, [&](float v, int64_t j) {
    if (!is_candidate(v)) return;
    const uint32_t key = order_key(v);
    const uint32_t column = static_cast<uint32_t>(j);
    if (all || key > threshold || (key == threshold && column <= last_column)) {
      const uint32_t slot = atomicAdd(&gathered, 1u);
      if (slot < static_cast<uint32_t>(sort_size)) {
        sorted[slot] = args.stable ? static_cast<unsigned long long>(column)
                                   : ~((static_cast<unsigned long long>(key) << 32) | (0xffffffffu - column));
      }
    }
  });
  __syncthreads();
  const uint32_t chosen = gathered < static_cast<uint32_t>(sort_size) ? gathered : static_cast<uint32_t>(sort_size);
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
      value = args.stable ? static_cast<int32_t>(s) : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(~s));
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
  hipLaunchKernelGGL(topk_per_row_kernel, dim3(static_cast<unsigned>(args.rows)), dim3(kTopkThreads),
                     sort_size * sizeof(unsigned long long), static_cast<hipStream_t>(stream), args, sort_size);
  return last_launch_status();
}

}  // namespace dsv4::gpu
