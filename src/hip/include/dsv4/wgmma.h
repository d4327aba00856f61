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
#include "dsv4/ptx.h"  // the instructions, and DSV4_WGMMA

#if DSV4_GPU_COMPILER && !defined(__HIPCC__)
namespace dsv4 {

#if defined(DSV4_WGMMA)
using ptx::wgmma_m64n64k32;
using ptx::wgmma_m64n128k32;
using ptx::wgmma_m64n64k16_f16_rs;
using ptx::wgmma_m64n128k16_f16_rs;
using ptx::wgmma_m64n16k16_bf16;
using ptx::wgmma_m64n256k16_bf16_b_mn_major;
using ptx::fence_shared_writes_for_wgmma;
using ptx::wgmma_fence;
using ptx::wgmma_commit;
using ptx::wgmma_wait;
using ptx::pin_registers;

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
