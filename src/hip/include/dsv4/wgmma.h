// sm_90a warpgroup MMA (wgmma.mma_async) on FP8 e4m3, f16 and bf16 operands (in shared memory; f16 A also from
// registers), for the kernels that take Hopper's tensor-core path (sm_90 runs mma.sync's e4m3 shapes as f16
// conversions plus f16 MMAs, about 200 TFLOP/s at best on the H200). Device helpers exist in sm_90a device passes
// only (DSV4_WGMMA); the host helper says whether the current device runs them.
//
// Numerics of the FP8 forms: the unit sums each k32 step's products and the running sum in fixed point aligned
// to the largest of them, keeping about 13-14 bits (not fp32); callers state where that is acceptable. The f16
// and bf16 forms sum in fp32 (as mma.sync does; the wo_a GEMM's fp32-sum tests hold on the H200).
#pragma once

#include "dsv4/launch.h"
#include "dsv4/platform.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

#if DSV4_GPU_COMPILER && !defined(__HIPCC__)
namespace dsv4 {

#if defined(DSV4_WGMMA)
// The "+f" operands of accumulators d[i], ..., d[i + 7] (and of 32 from d[i]) for the wgmma asm statements.
#define DSV4_WGMMA_ACC8(d, i)                                                                               \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define DSV4_WGMMA_ACC32(d, i) \
  DSV4_WGMMA_ACC8(d, i), DSV4_WGMMA_ACC8(d, (i) + 8), DSV4_WGMMA_ACC8(d, (i) + 16), DSV4_WGMMA_ACC8(d, (i) + 24)

// Accumulator operand numbers of the asm statements below.
#define DSV4_WGMMA_D32                                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DSV4_WGMMA_D64                                                                              \
  DSV4_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// A wrapper `name(d, a_desc, b_desc, accumulate)` of a wgmma with both operands in shared memory, 32 or 64 fp32
// accumulators per thread: D (+)= A B, `instruction` the opcode with its shape and types, `flags` its immediate
// operands after the accumulate predicate (accumulate = 0 overwrites D).
#define DSV4_WGMMA_SS_32(name, instruction, flags)                                                                 \
  DSV4_DEVICE void name(float(&d)[32], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" instruction " {" DSV4_WGMMA_D32 "}, %32, %33, p, " flags \
                 ";\n}\n"                                                                                            \
                 : DSV4_WGMMA_ACC32(d, 0)                                                                            \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));                                                       \
  }
#define DSV4_WGMMA_SS_64(name, instruction, flags)                                                                 \
  DSV4_DEVICE void name(float(&d)[64], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" instruction " {" DSV4_WGMMA_D64 "}, %64, %65, p, " flags \
                 ";\n}\n"                                                                                            \
                 : DSV4_WGMMA_ACC32(d, 0), DSV4_WGMMA_ACC32(d, 32)                                                   \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));                                                       \
  }
// FP8 e4m3 operands, K-major (the only layout of the 8-bit forms).
DSV4_WGMMA_SS_32(wgmma_m64n64k32, "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", "1, 1")
DSV4_WGMMA_SS_64(wgmma_m64n128k32, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3", "1, 1")
// A wrapper `name(d, a, b_desc, accumulate)` of an f16 wgmma with A in registers: a[0..3] are the thread's
// four words of A (f16 pairs) in the m16n8k16 A-fragment layout of its warp's 16 rows (word 0: row lane / 4,
// k 2 (lane % 4) and + 1; word 1: that row + 8; words 2 and 3: the same rows, k + 8), B K-major in shared
// memory. The unit reads the registers after the instruction issues: they must stay unchanged until the wait
// for its group (ptxas keeps them so).
#define DSV4_WGMMA_RS_32(name, instruction)                                                                      \
  DSV4_DEVICE void name(float(&d)[32], const uint32_t(&a)[4], uint64_t b_desc, uint32_t accumulate) {             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" instruction " {" DSV4_WGMMA_D32                      \
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                  \
                 : DSV4_WGMMA_ACC32(d, 0)                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));                     \
  }
#define DSV4_WGMMA_RS_64(name, instruction)                                                                      \
  DSV4_DEVICE void name(float(&d)[64], const uint32_t(&a)[4], uint64_t b_desc, uint32_t accumulate) {             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" instruction " {" DSV4_WGMMA_D64                      \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                                  \
                 : DSV4_WGMMA_ACC32(d, 0), DSV4_WGMMA_ACC32(d, 32)                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));                     \
  }
DSV4_WGMMA_RS_32(wgmma_m64n64k16_f16_rs, "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
DSV4_WGMMA_RS_64(wgmma_m64n128k16_f16_rs, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16")
// D[64 x 16] (+)= A[64 x 16] B[16 x 16], bf16 operands in shared memory, both K-major, fp32 accumulators;
// accumulate = 0 overwrites D.
DSV4_DEVICE void wgmma_m64n16k16_bf16(float (&d)[8], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : DSV4_WGMMA_ACC8(d, 0)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}
// D[64 x 256] (+)= A[64 x 16] B[16 x 256], bf16 operands in shared memory: A K-major, B MN-major (its N
// dimension contiguous, the transposed form: mn_major_swizzled_descriptor).
DSV4_DEVICE void wgmma_m64n256k16_bf16_b_mn_major(float (&d)[128], uint64_t a_desc, uint64_t b_desc,
                                                  uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : DSV4_WGMMA_ACC32(d, 0), DSV4_WGMMA_ACC32(d, 32), DSV4_WGMMA_ACC32(d, 64), DSV4_WGMMA_ACC32(d, 96)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}
// A K-major tile of 128-byte rows in the 128-byte swizzle: start address, leading offset unused (1),
// 1024 bytes between 8-row groups, swizzle mode 1.
DSV4_DEVICE uint64_t swizzled_tile_descriptor(uint32_t shared_address) {
  return static_cast<uint64_t>((shared_address & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// The same tile read MN-major (as a B operand whose N dimension runs along the 128-byte rows: 64 bf16 of N per
// row, K down the rows): 1024 bytes between 8-row groups along K, `atom_stride` bytes between the 64-wide
// column blocks along N (the leading offset of the MN-major layouts).
DSV4_DEVICE uint64_t mn_major_swizzled_descriptor(uint32_t shared_address, uint32_t atom_stride) {
  return static_cast<uint64_t>((shared_address & 0x3ffffu) >> 4) | (static_cast<uint64_t>(atom_stride >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}

// A K-major tile of 64-byte rows in the 64-byte swizzle (16-byte chunk c of row r at c ^ ((r / 2) % 4)): 512
// bytes between 8-row groups, swizzle mode 2. The tile starts on a 512-byte boundary.
DSV4_DEVICE uint64_t swizzled64_tile_descriptor(uint32_t shared_address) {
  return static_cast<uint64_t>((shared_address & 0x3ffffu) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
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

// Orders this warp group's register accesses before the wgmma issued after it (needed before the first wgmma and
// whenever its accumulators or operands were touched by other instructions).
DSV4_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of the wgmma issued since the last commit.
DSV4_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending of the warp group's committed groups are still running.
template <int kPending>
DSV4_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

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
