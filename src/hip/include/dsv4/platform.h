// Portability layer for dsv4ops kernels: one source compiles as HIP (clang, gfx942/gfx950), as CUDA
// (nvcc, sm_90a) and as plain host C++ (the CPU backend and the C++ tests). Torch-free.
#pragma once

#include <cstdint>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define DSV4_GPU_COMPILER 1
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define DSV4_GPU_COMPILER 1
// The HIP runtime names kernels and launchers use, mapped onto CUDA.
using hipStream_t = cudaStream_t;
using hipError_t = cudaError_t;
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#if !defined(hipLaunchKernelGGL)  // (a host model of the device defines its own)
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif
#else
#define DSV4_GPU_COMPILER 0
#endif

// A kernel's dynamic shared memory (the launch's shared-memory bytes) as `type name[]`, at least
// `alignment`-aligned. A host model of the device defines it first, as a pointer to its own buffer.
#if DSV4_GPU_COMPILER && !defined(DSV4_DYNAMIC_SHARED)
#define DSV4_DYNAMIC_SHARED(type, name, alignment) extern __shared__ __align__(alignment) type name[]
#endif

#if DSV4_GPU_COMPILER
#define DSV4_HD __host__ __device__ __forceinline__
#define DSV4_DEVICE __device__ __forceinline__
#else
#define DSV4_HD inline
#define DSV4_DEVICE inline
#endif

// Full unrolling in shared host/device code: a GPU thread keeps small fixed-size arrays in registers only
// when every index is a compile-time constant. (Host compilers do without the hint.)
#if DSV4_GPU_COMPILER
#define DSV4_UNROLL _Pragma("unroll")
#else
#define DSV4_UNROLL
#endif

// True only in a device compilation pass (never in the host pass of a GPU build).
#if defined(__HIP_DEVICE_COMPILE__) || defined(__CUDA_ARCH__)
#define DSV4_DEVICE_PASS 1
#else
#define DSV4_DEVICE_PASS 0
#endif

namespace dsv4 {

// Threads per warp/wavefront of the device pass being compiled: 64 on the CDNA chips dsv4ops targets
// (gfx942, gfx950), 32 on NVIDIA. Host code must not size launches with it: a fat binary holds both.
#if defined(__HIP_PLATFORM_AMD__) || defined(__AMDGCN__)
inline constexpr int kWarpSize = 64;
#else
inline constexpr int kWarpSize = 32;
#endif

#if DSV4_GPU_COMPILER
// Stops the kernel: for code paths a launcher never picks in this device pass (no such instruction there).
// nvcc rejects __builtin_trap in device code; clang's HIP takes it.
DSV4_DEVICE void device_trap() {
#if defined(__CUDA_ARCH__)
  __trap();
#else
  __builtin_trap();
#endif
}
#endif

// Result of a raw-pointer launcher. The bindings turn anything but kOk into a Python exception.
enum class LaunchStatus : int {
  kOk = 0,
  kInvalidArgument = 1,  // a size or pointer the launcher cannot serve (the bindings check first)
  kLaunchFailed = 2,     // the runtime refused the launch
};

// Bit 7 of each byte of `word` set where that byte is zero, every other bit clear: a byte-parallel test on
// packed FP8 codes (no carry crosses a byte). Word: an unsigned integer type.
template <typename Word>
DSV4_HD constexpr Word zero_byte_flags(Word word) {
  constexpr Word kLow7 = static_cast<Word>(static_cast<Word>(~Word{0}) / 0xFF * 0x7F);
  return static_cast<Word>(~(((word & kLow7) + kLow7) | word | kLow7));
}

// a / b and a % b for a >= 0 and b > 0, in 32-bit arithmetic when both fit: a 64-bit division costs a
// GPU several times more instructions, enough to bound the cache kernels.
struct IndexSplit {
  int64_t quotient;
  int64_t remainder;
};

DSV4_HD IndexSplit divide_index(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) {
    const uint32_t quotient = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    return {quotient, static_cast<int64_t>(static_cast<uint32_t>(a) - quotient * static_cast<uint32_t>(b))};
  }
  return {a / b, a % b};
}

DSV4_HD bool is_aligned(const void* pointer, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

DSV4_HD uint32_t float_bits(float x) {
  union { float f; uint32_t u; } v{x};
  return v.u;
}

DSV4_HD float bits_float(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

#if DSV4_GPU_COMPILER
// Butterfly exchange within aligned groups of `width` lanes (a power of two <= 32, so the group never
// straddles a warp on either vendor).
DSV4_DEVICE float shuffle_xor(float value, int lane_mask, int width) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl_xor(value, lane_mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, value, lane_mask, width);
#endif
}

// The sum over each aligned group of kWidth lanes (a power of two <= 32) in every lane of the group: a
// butterfly, so every lane adds in the same order and the result does not depend on the lane.
template <int kWidth>
DSV4_DEVICE float group_sum(float value) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0, "a power of two <= 32");
#pragma unroll
  for (int mask = kWidth / 2; mask >= 1; mask >>= 1) value += shuffle_xor(value, mask, kWidth);
  return value;
}

// The value of `lane` (relative to the group of `width` lanes) in every lane of the group.
template <typename T>
DSV4_DEVICE T shuffle_from(T value, int lane, int width) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl(value, lane, width);
#else
  return __shfl_sync(0xffffffffu, value, lane, width);
#endif
}
#endif

}  // namespace dsv4
