// What the device shims of the model (include_cdna/hip/hip_runtime.h, include_sm90/cuda_runtime.h) have in
// common: the qualifiers, vector types, thread coordinates, block barrier, atomics and intrinsics that HIP
// and CUDA spell alike, and the kernel launch, on wave_sim.h. Only the kernels' translation units see it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "wave_sim.h"

// ---- qualifiers ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Blocks run one at a time, each to its end (but those of a thread block cluster, which swap copies of the
// section in turn): a static local is the block's shared variable.
#define __shared__ static __attribute__((section("dsv4_static_shared")))
// `extern __shared__` arrays (see dsv4/platform.h): the block's dynamic shared memory.
#define DSV4_DYNAMIC_SHARED(type, name, alignment) \
  type* const name = static_cast<type*>(::dsv4_sim::dynamic_shared_memory())

// ---- vector types -------------------------------------------------------------------------------
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

struct dim3 {
  uint32_t x, y, z;
  constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define threadIdx (::dsv4_sim::thread_index())
#define blockIdx (::dsv4_sim::block_index())
// Variables, not macros: launch configurations have members of these names.
inline const ::dsv4_sim::Index3& blockDim = ::dsv4_sim::running_block_dim;
inline const ::dsv4_sim::Index3& gridDim = ::dsv4_sim::running_grid_dim;
#define warpSize (::dsv4_sim::kWaveSize)

// ---- block and wave operations ------------------------------------------------------------------
inline void __syncthreads() { ::dsv4_sim::sync_block(); }
inline int __syncthreads_count(int predicate) { return ::dsv4_sim::sync_block_count(predicate); }
inline int __syncthreads_or(int predicate) { return ::dsv4_sim::sync_block_count(predicate) != 0; }
inline int __syncthreads_and(int predicate) { return ::dsv4_sim::sync_block_count(!predicate) == 0; }

namespace dsv4_sim {
// The value of lane `source` of the caller's last wave operation, as T.
template <typename T>
T read_lane(int source) {
  static_assert(sizeof(T) <= kSlotBytes, "wave operand too large");
  T value;
  std::memcpy(&value, deposit_of(source), sizeof(T));
  return value;
}
}  // namespace dsv4_sim

// Inlined into their callers, so that call_site() tells each place that calls one apart.
#define DSV4_SIM_WAVE_OPERATION inline __attribute__((always_inline))

// ---- atomics (the block's threads never run at the same time) ------------------------------------
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

// ---- integer and float intrinsics ----------------------------------------------------------------
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
// Byte i of the result is byte (selector >> 4i) & 7 of the 8-byte value {b, a} (a in bytes 0-3).
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned selector) {
  const uint64_t both = (static_cast<uint64_t>(b) << 32) | a;
  unsigned result = 0;
  for (int i = 0; i < 4; ++i) {
    result |= static_cast<unsigned>((both >> (8 * ((selector >> (4 * i)) & 7))) & 0xff) << (8 * i);
  }
  return result;
}
// The kernels build with -ffp-contract=off here, so these round like the device's _rn forms.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __frcp_rn(float a) { return 1.0f / a; }

// ---- launches ------------------------------------------------------------------------------------
namespace dsv4_sim {
template <typename... Params, typename... Args>
int launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, bool overlapping,
                  int cluster_blocks, const Args&... args) {
  return launch(Launch{{grid.x, grid.y, grid.z},
                       {block.x, block.y, block.z},
                       shared_bytes,
                       [kernel, args...]() { kernel(args...); },  // copies, as a launch's parameters are
                       reinterpret_cast<const void*>(kernel),
                       overlapping,
                       cluster_blocks});
}

template <typename To, typename From>
To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
}  // namespace dsv4_sim
