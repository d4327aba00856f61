// The HIP names the kernels of src/hip/ use, for their gfx942 / gfx950 paths built as host code on the
// wave64 model of ../../wave_sim.h (DSV4_SIM_WAVE_SIZE=64). Only the kernels' translation units see it:
// they are compiled by clang with __HIPCC__, __HIP_PLATFORM_AMD__, __AMDGCN__, __HIP_DEVICE_COMPILE__ and
// __gfx942__ or __gfx950__ defined, so that every `#if` picks the AMD device code, and with this folder
// first on the include path. Semantics follow HIP's (and, for the builtins, the ISA's), not CUDA's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if !defined(__gfx942__) && !defined(__gfx950__)
#error "define __gfx942__ or __gfx950__: the chip the kernels are built for"
#endif

#include "../../device_common.h"

// HIP: lane (src & (width - 1)) of the caller's group of `width` lanes.
template <typename T>
DSV4_SIM_WAVE_OPERATION T __shfl(T var, int src_lane, int width = warpSize) {
  const int self = ::dsv4_sim::lane_id();
  ::dsv4_sim::wave_exchange(&var, sizeof(T), width, ::dsv4_sim::call_site());
  return ::dsv4_sim::read_lane<T>((src_lane & (width - 1)) + (self & ~(width - 1)));
}
// HIP: lane self ^ mask, or the caller's own value where that lane is past the caller's group.
template <typename T>
DSV4_SIM_WAVE_OPERATION T __shfl_xor(T var, int lane_mask, int width = warpSize) {
  const int self = ::dsv4_sim::lane_id();
  int source = self ^ lane_mask;
  if (source >= ((self + width) & ~(width - 1))) source = self;
  ::dsv4_sim::wave_exchange(&var, sizeof(T), width, ::dsv4_sim::call_site());
  return ::dsv4_sim::read_lane<T>(source);
}
DSV4_SIM_WAVE_OPERATION unsigned long long __ballot(int predicate) {
  const int mine = predicate != 0;
  ::dsv4_sim::wave_exchange(&mine, sizeof mine, warpSize, ::dsv4_sim::call_site());
  unsigned long long mask = 0;
  for (int lane = 0; lane < warpSize; ++lane) {
    if (::dsv4_sim::taken_part(lane) && ::dsv4_sim::read_lane<int>(lane)) mask |= 1ull << lane;
  }
  return mask;
}
DSV4_SIM_WAVE_OPERATION int __any(int predicate) { return __ballot(predicate) != 0; }

// ---- the runtime API the launchers call ----------------------------------------------------------
using hipStream_t = struct dsv4_sim_stream*;
enum hipError_t { hipSuccess = 0, hipErrorInvalidConfiguration = 9, hipErrorInvalidValue = 1 };
enum hipDeviceAttribute_t { hipDeviceAttributeMultiprocessorCount = 1 };
struct hipDeviceProp_t {
  char gcnArchName[256];
  int multiProcessorCount;
};
// The launchers' error query ends their launches: whatever the model held back runs first.
inline hipError_t hipGetLastError() {
  ::dsv4_sim::finish_launches();
  return static_cast<hipError_t>(::dsv4_sim::take_last_error());
}
inline const char* hipGetErrorString(hipError_t error) {
  return error == hipSuccess ? "no error" : "invalid launch configuration (device model)";
}
inline hipError_t hipGetDevice(int* device) {
  *device = 0;
  return hipSuccess;
}
inline hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int) {
  if (attribute != hipDeviceAttributeMultiprocessorCount) return hipErrorInvalidValue;
  *value = ::dsv4_sim::chip().compute_units;
  return hipSuccess;
}
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* properties, int) {
  std::memset(properties, 0, sizeof *properties);
  std::strncpy(properties->gcnArchName, ::dsv4_sim::chip().arch_name, sizeof properties->gcnArchName - 1);
  properties->multiProcessorCount = ::dsv4_sim::chip().compute_units;
  return hipSuccess;
}
// Two blocks per compute unit, whatever the kernel: the grids sized by it stay small.
template <typename Kernel>
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  *blocks = 2;
  return hipSuccess;
}

#define hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, ...) \
  ((void)(stream), ::dsv4_sim::launch_kernel((kernel), dim3(grid), dim3(block), (shared_bytes), false, 1, __VA_ARGS__))

// ---- the AMDGPU builtins the kernels use, on ../../wave_sim.h ------------------------------------
namespace dsv4_sim {
#if defined(__gfx942__)
inline constexpr Fp8Kind kChipFp8 = Fp8Kind::kFnuz;
#else
inline constexpr Fp8Kind kChipFp8 = Fp8Kind::kOcp;
#endif

typedef float Floatx4 __attribute__((ext_vector_type(4)));
typedef uint32_t Words2 __attribute__((ext_vector_type(2)));
typedef uint32_t Words4 __attribute__((ext_vector_type(4)));
typedef uint32_t Words8 __attribute__((ext_vector_type(8)));

inline Floatx4 from_acc(const float (&c)[4]) { return Floatx4{c[0], c[1], c[2], c[3]}; }

template <typename A, typename B>
DSV4_SIM_WAVE_OPERATION Floatx4 builtin_mfma_16x16x16_bf16(A a, B b, Floatx4 c) {
  const Words2 a_words = bits_as<Words2>(a), b_words = bits_as<Words2>(b);
  float acc[4] = {c[0], c[1], c[2], c[3]};
  mfma_16x16x16_bf16(acc, {a_words[0], a_words[1]}, {b_words[0], b_words[1]}, call_site());
  return from_acc(acc);
}
template <typename A, typename B>
DSV4_SIM_WAVE_OPERATION Floatx4 builtin_mfma_16x16x32_bf16(A a, B b, Floatx4 c) {
  const Words4 a_words = bits_as<Words4>(a), b_words = bits_as<Words4>(b);
  float acc[4] = {c[0], c[1], c[2], c[3]};
  mfma_16x16x32_bf16(acc, {a_words[0], a_words[1], a_words[2], a_words[3]},
                     {b_words[0], b_words[1], b_words[2], b_words[3]}, call_site());
  return from_acc(acc);
}
DSV4_SIM_WAVE_OPERATION Floatx4 builtin_mfma_16x16x32_fp8(long a, long b, Floatx4 c) {
  const Words2 a_words = bits_as<Words2>(a), b_words = bits_as<Words2>(b);
  float acc[4] = {c[0], c[1], c[2], c[3]};
  mfma_16x16x32_fp8(acc, {a_words[0], a_words[1]}, {b_words[0], b_words[1]}, kChipFp8, call_site());
  return from_acc(acc);
}
// `unscaled`: the call's scale operands are immediate zeros, from which LLVM selects the instruction without
// scales, v_mfma_f32_16x16x128_f8f6f4 (the device check asserts that no scaled MFMA remains where a kernel
// relies on it); the scaled one reads a zero byte as 2^-127.
template <typename A, typename B>
DSV4_SIM_WAVE_OPERATION Floatx4 builtin_mfma_scale_16x16x128(A a, B b, Floatx4 c, int a_format, int b_format,
                                                             int opsel_a, int scale_a, int opsel_b, int scale_b,
                                                             bool unscaled) {
  if (a_format != 0 || b_format != 0) __builtin_trap();  // only e4m3 x e4m3 is modelled
  const Words8 a_words = bits_as<Words8>(a), b_words = bits_as<Words8>(b);
  uint32_t a_array[8], b_array[8];
  for (int i = 0; i < 8; ++i) a_array[i] = a_words[i], b_array[i] = b_words[i];
  float acc[4] = {c[0], c[1], c[2], c[3]};
  constexpr uint32_t kUnitScale = 127;
  mfma_scale_16x16x128_fp8(acc, a_array, b_array, unscaled ? kUnitScale : static_cast<uint32_t>(scale_a),
                           unscaled ? 0 : opsel_a, unscaled ? kUnitScale : static_cast<uint32_t>(scale_b),
                           unscaled ? 0 : opsel_b, call_site());
  return from_acc(acc);
}
}  // namespace dsv4_sim

#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, cbsz, abid, blgp) \
  ::dsv4_sim::builtin_mfma_16x16x16_bf16((a), (b), (c))
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, cbsz, abid, blgp) \
  ::dsv4_sim::builtin_mfma_16x16x32_bf16((a), (b), (c))
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, cbsz, abid, blgp) \
  ::dsv4_sim::builtin_mfma_16x16x32_fp8((a), (b), (c))
#define __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, a_format, b_format, opsel_a, scale_a, opsel_b, \
                                                         scale_b)                                                \
  ::dsv4_sim::builtin_mfma_scale_16x16x128(                                                                      \
      (a), (b), (c), (a_format), (b_format), (opsel_a), (scale_a), (opsel_b), (scale_b),                         \
      __builtin_constant_p((opsel_a) == 0 && (scale_a) == 0 && (opsel_b) == 0 && (scale_b) == 0) &&               \
          (opsel_a) == 0 && (scale_a) == 0 && (opsel_b) == 0 && (scale_b) == 0)
#define __builtin_amdgcn_cvt_pk_fp8_f32(lo, hi, old, high_word) \
  ::dsv4_sim::cvt_pk_fp8_f32((lo), (hi), (old), (high_word), ::dsv4_sim::kChipFp8)
