// sm_90a warpgroup MMA (wgmma.mma_async) on FP8 e4m3 operands in shared memory, for the kernels that take
// Hopper's FP8 tensor-core path (sm_90 runs mma.sync's e4m3 shapes as f16 conversions plus f16 MMAs, about
// 200 TFLOP/s at best on the H200). Device helpers exist in sm_90a device passes only (DSV4_WGMMA); the host
// helper says whether the current device runs them.
//
// Numerics: the unit sums each k32 step's products and the running sum in fixed point aligned to the
// largest of them, keeping about 13-14 bits (not fp32); callers state where that is acceptable.
#pragma once

#include "dsv4/launch.h"
#include "dsv4/platform.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

#if DSV4_GPU_COMPILER && !defined(__HIPCC__)
namespace dsv4 {

#if defined(DSV4_WGMMA)
DSV4_DEVICE void wgmma_m64n64k32(float (&d)[32], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}
DSV4_DEVICE void wgmma_m64n128k32(float (&d)[64], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}
// A K-major tile of 128-byte rows in the 128-byte swizzle: start address, leading offset unused (1),
// 1024 bytes between 8-row groups, swizzle mode 1.
DSV4_DEVICE uint64_t swizzled_tile_descriptor(uint32_t shared_address) {
  return static_cast<uint64_t>((shared_address & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// The descriptor of the tile `bytes` further along K (a multiple of 16) from the one `descriptor` names:
// its start-address field (address / 16, 14 bits) advances without a carry, shared-window addresses
// being below 256 KiB. One add instead of recomputing the fields.
DSV4_DEVICE uint64_t descriptor_advanced(uint64_t descriptor, uint32_t bytes) { return descriptor + (bytes >> 4); }

// The first 1024-byte boundary at or after a shared-window address: where the tiles in the 128-byte swizzle
// start (the swizzle pattern repeats every 8 rows of 128 bytes).
DSV4_DEVICE uint32_t swizzle_atom_aligned(uint32_t shared_address) { return (shared_address + 1023u) & ~1023u; }

// Orders this thread's generic-proxy writes to shared memory (stores, completed cp.async copies) before later
// wgmma reads of it, which go through the async proxy; a barrier then extends that to the block.
DSV4_DEVICE void fence_shared_writes_for_wgmma() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads or writes of an accumulator across the wgmma fence and wait
// instructions (the asm statements that multiply into it do not say when the unit writes it).
template <int kCount>
DSV4_DEVICE void pin_registers(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif  // DSV4_WGMMA

// Whether the current device runs the wgmma kernels: a build whose NVIDIA code is sm_90a only (with plain
// sm_90 code beside it the runtime might load that, where the kernel traps) on a compute capability 9.0
// device. Asked once per device.
inline bool device_runs_wgmma() {
#if defined(DSV4_CUDA_SM90A_ONLY_BUILD)
  struct Site {};
  return remembered_for_device<Site>([](int device) {
    int major = 0;
    int minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
    return ok && major == 9 && minor == 0 ? DeviceAnswer::kYes : DeviceAnswer::kNo;
  });
#else
  return false;
#endif
}

}  // namespace dsv4
#endif
