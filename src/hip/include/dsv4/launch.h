// Launch helpers for elementwise kernels (device builds only). Torch-free.
#pragma once

#include "dsv4/platform.h"

#if DSV4_GPU_COMPILER
namespace dsv4 {

inline constexpr int kElementwiseThreads = 256;
// Grid-stride loops cover the rest; the cap keeps the grid within every runtime's limits without a
// per-call device query.
inline constexpr int64_t kMaxElementwiseBlocks = 1 << 16;

inline unsigned elementwise_blocks(int64_t work_items) {
  int64_t blocks = (work_items + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks > kMaxElementwiseBlocks) blocks = kMaxElementwiseBlocks;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// The current device's multiprocessor (CU) count, for grids sized to one wave of resident blocks; 128
// if the runtime cannot say.
inline int device_multiprocessors() {
  int device = 0;
  int count = 0;
#if defined(__HIPCC__)
  if (hipGetDevice(&device) != hipSuccess ||
      hipDeviceGetAttribute(&count, hipDeviceAttributeMultiprocessorCount, device) != hipSuccess) {
    count = 0;
  }
#else
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    count = 0;
  }
#endif
  return count > 0 ? count : 128;
}

// Blocks of `threads` threads of `kKernel` that are resident at once on the whole device (one wave): the
// occupancy its compiled form allows per multiprocessor, times their count. The cache gather and the fused
// insert family launch one wave whose warps loop over the work. On the H200 that beat 0.5, 1.5, 2 and 4
// waves at every gather size, and gained 2-5% on the fused insert's main variants (the FP8 full-cache
// variant lost 6%). Queried once per kernel and process (the first device's answer).
template <auto kKernel>
int64_t one_wave_blocks(int threads) {
  static const int64_t blocks = [threads] {
    int per_multiprocessor = 0;
#if defined(__HIPCC__)
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kKernel, threads, 0) != hipSuccess) {
      per_multiprocessor = 0;
    }
#else
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kKernel, threads, 0) != cudaSuccess) {
      per_multiprocessor = 0;
    }
#endif
    return static_cast<int64_t>(per_multiprocessor > 0 ? per_multiprocessor : 1) * device_multiprocessors();
  }();
  return blocks;
}

inline LaunchStatus last_launch_status() {
  return hipGetLastError() == hipSuccess ? LaunchStatus::kOk : LaunchStatus::kLaunchFailed;
}

DSV4_DEVICE int64_t global_thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

DSV4_DEVICE int64_t global_thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace dsv4
#endif
