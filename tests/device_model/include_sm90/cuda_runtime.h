// The CUDA names the kernels of src/hip/ use, for their NVIDIA sm_90a paths built as host code on the
// 32-lane model of ../wave_sim.h (DSV4_SIM_WAVE_SIZE=32). Only the kernels' translation units see it: they
// are compiled by clang with __CUDACC__ and __CUDA_ARCH__=900 defined, so that every `#if` picks the NVIDIA
// device code, and with this folder first on the include path (its dsv4/ptx.h stands in for the kernels'
// PTX). Semantics follow CUDA's: a *_sync warp operation needs every lane of its mask, and only those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ != 900
#error "define __CUDA_ARCH__=900: the sm_90a paths are the ones modelled"
#endif

#include "../device_common.h"

// ---- warp operations ------------------------------------------------------------------------------
// Lane src_lane % width of the caller's group of `width` lanes.
template <typename T>
DSV4_SIM_WAVE_OPERATION T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int self = ::dsv4_sim::lane_id();
  ::dsv4_sim::wave_exchange(&var, sizeof(T), warpSize, ::dsv4_sim::call_site());
  ::dsv4_sim::require_exactly_lanes(mask);
  return ::dsv4_sim::read_lane<T>((src_lane & (width - 1)) + (self & ~(width - 1)));
}
// Lane self ^ lane_mask, or the caller's own value where that lane is past the caller's group.
template <typename T>
DSV4_SIM_WAVE_OPERATION T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int self = ::dsv4_sim::lane_id();
  int source = self ^ lane_mask;
  if (source >= ((self + width) & ~(width - 1))) source = self;
  ::dsv4_sim::wave_exchange(&var, sizeof(T), warpSize, ::dsv4_sim::call_site());
  ::dsv4_sim::require_exactly_lanes(mask);
  return ::dsv4_sim::read_lane<T>(source);
}
DSV4_SIM_WAVE_OPERATION void __syncwarp(unsigned mask = 0xffffffffu) {
  const int none = 0;
  ::dsv4_sim::wave_exchange(&none, sizeof none, warpSize, ::dsv4_sim::call_site());
  ::dsv4_sim::require_exactly_lanes(mask);
}

DSV4_SIM_WAVE_OPERATION unsigned __ballot_sync(unsigned mask, int predicate) {
  const int mine = predicate != 0;
  ::dsv4_sim::wave_exchange(&mine, sizeof mine, warpSize, ::dsv4_sim::call_site());
  ::dsv4_sim::require_exactly_lanes(mask);
  unsigned ballot = 0;
  for (int lane = 0; lane < warpSize; ++lane) {
    if ((mask >> lane & 1u) && ::dsv4_sim::read_lane<int>(lane)) ballot |= 1u << lane;
  }
  return ballot;
}
DSV4_SIM_WAVE_OPERATION int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
// CUDA's integer min and max of device code.
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }

// ---- shared-window addresses, loads and traps ---------------------------------------------------------
inline size_t __cvta_generic_to_shared(const void* pointer) {
  return ::dsv4_sim::shared_window_address(pointer);
}
template <typename T>
T __ldcg(const T* address) {
  return *address;
}
[[noreturn]] inline void __trap() { ::dsv4_sim::model_error("__trap() in a kernel"); }

// ---- the runtime API the launchers call ------------------------------------------------------------
using cudaStream_t = struct dsv4_sim_stream*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

// The launchers' error query ends their launches: whatever the model held back runs first.
inline cudaError_t cudaGetLastError() {
  ::dsv4_sim::finish_launches();
  return static_cast<cudaError_t>(::dsv4_sim::take_last_error());
}
inline const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "invalid launch configuration (device model)";
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
// An H100 / H200: compute capability 9.0.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = ::dsv4_sim::chip().compute_units;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
// Two blocks per multiprocessor, whatever the kernel: the grids sized by it stay small.
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  *blocks = 2;
  return cudaSuccess;
}

namespace dsv4_sim {
// Dynamic shared memory past 48 KB needs the kernel's opt-in (cudaFuncSetAttribute), up to the chip's.
inline constexpr size_t kSharedBytesWithoutOptIn = 48 * 1024;
inline std::map<const void*, size_t>& shared_opt_ins() {
  static std::map<const void*, size_t> opt_ins;
  return opt_ins;
}
template <typename... Params, typename... Args>
cudaError_t launch_checked(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, bool overlapping,
                           int cluster_blocks, const Args&... args) {
  const auto opt_in = shared_opt_ins().find(reinterpret_cast<const void*>(kernel));
  const size_t allowed = opt_in == shared_opt_ins().end() ? kSharedBytesWithoutOptIn : opt_in->second;
  if (shared_bytes > allowed) return cudaErrorInvalidValue;  // stays for the next error query, as the runtime's
  return static_cast<cudaError_t>(
      launch_kernel(kernel, grid, block, shared_bytes, overlapping, cluster_blocks, args...));
}
}  // namespace dsv4_sim

template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > ::dsv4_sim::chip().lds_bytes) {
    return cudaErrorInvalidValue;
  }
  ::dsv4_sim::shared_opt_ins()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  return cudaSuccess;
}

enum cudaLaunchAttributeID {
  cudaLaunchAttributeClusterDimension = 4,
  cudaLaunchAttributeProgrammaticStreamSerialization = 5,
};
struct cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

// Programmatic dependent launch as wave_sim.h holds it back; clusters along x (the only kind the kernels use).
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...), const Args&... args) {
  bool overlapping = false;
  int cluster_blocks = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const cudaLaunchAttribute& attribute = config->attrs[i];
    if (attribute.id == cudaLaunchAttributeProgrammaticStreamSerialization) {
      overlapping = attribute.val.programmaticStreamSerializationAllowed != 0;
    } else if (attribute.id == cudaLaunchAttributeClusterDimension) {
      const auto& cluster = attribute.val.clusterDim;
      if (cluster.y != 1 || cluster.z != 1) ::dsv4_sim::model_error("clusters along y or z are not modelled");
      cluster_blocks = static_cast<int>(cluster.x);
    }
  }
  return ::dsv4_sim::launch_checked(kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes, overlapping,
                                    cluster_blocks, args...);
}

// A kernel parameter passed by its address in the parameter space (tensor maps): a plain parameter here.
#define __grid_constant__

// platform.h's HIP launch macro, which nvcc spells with <<< >>>.
#define hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, ...)                                  \
  ((void)(stream), ::dsv4_sim::launch_checked((kernel), dim3(grid), dim3(block), (shared_bytes), false, 1, \
                                              __VA_ARGS__))
