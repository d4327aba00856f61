// Launch helpers for elementwise kernels (device builds only). Torch-free.
#pragma once

#include <cstring>

#include "dsv4/platform.h"
#include "dsv4/ptx.h"

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

// The current device's index, or -1 where the runtime cannot say.
inline int current_device() {
  int device = 0;
#if defined(__HIPCC__)
  return hipGetDevice(&device) == hipSuccess ? device : -1;
#else
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
#endif
}

// The current device's multiprocessor (CU) count, for grids sized to one wave of resident blocks; 128
// if the runtime cannot say.
inline int device_multiprocessors() {
  const int device = current_device();
  int count = 0;
#if defined(__HIPCC__)
  if (device < 0 || hipDeviceGetAttribute(&count, hipDeviceAttributeMultiprocessorCount, device) != hipSuccess) {
    count = 0;
  }
#else
  if (device < 0 || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    count = 0;
  }
#endif
  return count > 0 ? count : 128;
}

// Answers kept per device: a yes/no property of the current device that does not change while the process
// runs, asked once per device (of the first 64; others ask every time) and per `Site`, a distinct type for each
// property. ask(device) returns kYes, kNo, or kUnknown when it cannot tell (asked again next time). False
// where there is no current device. (Two threads asking at once both ask and store the same answer.)
enum class DeviceAnswer : int { kUnknown = 0, kYes = 1, kNo = 2 };
template <typename Site, typename Ask>
bool remembered_for_device(Ask ask) {
  constexpr int kMaxDevices = 64;
  static DeviceAnswer known[kMaxDevices] = {};
  const int device = current_device();
  if (device < 0) return false;
  if (device >= kMaxDevices) return ask(device) == DeviceAnswer::kYes;
  if (known[device] == DeviceAnswer::kUnknown) known[device] = ask(device);
  return known[device] == DeviceAnswer::kYes;
}

// Whether the current device's FP8 matrix units read e4m3 as FNUZ (gfx942) rather than OCP (gfx950,
// NVIDIA). Host side: one ROCm binary can hold code for both AMD chips.
inline bool device_matrix_units_read_fnuz() {
#if defined(__HIPCC__)
  struct Site {};
  return remembered_for_device<Site>([](int device) {
    hipDeviceProp_t properties;
    if (hipGetDeviceProperties(&properties, device) != hipSuccess) return DeviceAnswer::kUnknown;
    return std::strncmp(properties.gcnArchName, "gfx942", 6) == 0 ? DeviceAnswer::kYes : DeviceAnswer::kNo;
  });
#else
  return false;
#endif
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

#if !defined(__HIPCC__)
// Lets kKernel launch with `bytes` (fixed per kernel instance) of dynamic shared memory: above 48 KB NVIDIA
// needs an opt-in, made once per instance and device. False when the runtime refuses (asked again next
// time); its error is cleared so that the next launch's check does not report it.
template <auto kKernel>
struct SharedMemoryOptIn {};
template <auto kKernel>
bool allow_dynamic_shared_memory(size_t bytes) {
  return remembered_for_device<SharedMemoryOptIn<kKernel>>([bytes](int) {
    if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
        cudaSuccess) {
      return DeviceAnswer::kYes;
    }
    (void)cudaGetLastError();
    return DeviceAnswer::kUnknown;
  });
}
#endif

// Programmatic dependent launch (NVIDIA sm_90 and later): a kernel launched with launch_overlapping() may
// start while the kernel before it on the stream is still running, once every block of that kernel has
// called release_dependents() or exited; it saves a launch's latency between short kernels. Before the
// dependent reads anything that kernel wrote, or writes anything at all, it calls
// wait_for_previous_kernel(), which returns once that kernel has finished and its writes are visible (at
// once for a plain launch). A kernel calls release_dependents() only once everything it depends on has
// finished (at its start after a plain launch, after its wait otherwise), so that what a dependent reads
// before its own wait, other than the releasing kernel's output, is complete. With HIP the launch is plain
// and both calls do nothing.
//
// launch_overlapping_in_clusters() also groups every `cluster_blocks` consecutive blocks along x into a
// thread block cluster (NVIDIA sm_90 and later: run at the same time, each able to read the others' shared
// memory; grid.x a multiple of it). Callers on HIP pass 1.
template <typename... Params, typename... Args>
void launch_overlapping_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                    hipStream_t stream, unsigned cluster_blocks, const Args&... args) {
#if defined(__HIPCC__)
  (void)cluster_blocks;
  hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, args...);
#else
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster_blocks;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster_blocks > 1 ? 2 : 1;
  (void)cudaLaunchKernelEx(&config, kernel, args...);  // an error stays for last_launch_status()
#endif
}

template <typename... Params, typename... Args>
void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, hipStream_t stream,
                        const Args&... args) {
  launch_overlapping_in_clusters(kernel, grid, block, shared_bytes, stream, 1u, args...);
}

DSV4_DEVICE void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::griddepcontrol_wait();
#endif
}

DSV4_DEVICE void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::griddepcontrol_launch_dependents();
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Thread block clusters (launch_overlapping_in_clusters): this block's rank in its cluster, a barrier of all
// threads of the cluster's blocks (release/acquire: shared-memory writes before it are seen by every block
// after it), and a float read from the shared memory of the cluster's block `rank` at the address that
// `shared_address` (a shared-window address of this block) names there.
DSV4_DEVICE uint32_t cluster_block_rank() { return ptx::cluster_ctarank(); }

DSV4_DEVICE void cluster_barrier() { ptx::barrier_cluster_arrive_wait(); }

DSV4_DEVICE float load_cluster_shared_f32(uint32_t shared_address, uint32_t rank) {
  return ptx::ld_shared_cluster_f32(shared_address, rank);
}
#endif

// A 16-byte load answered by the device-wide cache level, not the multiprocessor's own (NVIDIA
// ld.global.cg): for data a kernel reads before wait_for_previous_kernel() that an earlier kernel wrote, so
// that no line this multiprocessor cached before that write can answer it (the earlier kernel's writes are
// known to have reached the device-wide level, not to have been seen by this grid). A plain load on HIP,
// where the launches are plain.
DSV4_DEVICE uint4 load_past_local_cache(const uint4* address) {
#if defined(__CUDA_ARCH__)
  return __ldcg(address);
#else
  return *address;
#endif
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
