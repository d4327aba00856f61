// The PTX instructions of the NVIDIA paths that CUDA has no intrinsic for, one function each, named after
// the instruction (callers keep their own guards on the architecture that has it). Code outside this header
// reaches them only through it, included as "dsv4/ptx.h": a host model of the device (tests/device_model)
// puts its own version of this header first on the include path. Declared in every NVIDIA pass, host
// included, because device code is parsed there too; device code only.
//
// (async_copy.h and wgmma.h, and the kernels that include them, still hold their own PTX: the model does
// not run those kernels yet.)
#pragma once

#include <cstdint>

#include "dsv4/platform.h"

#if defined(__CUDACC__) && !defined(__HIPCC__)
namespace dsv4::ptx {

// cvt.rn.satfinite.e4m3x2.f32: `high` and `low` as OCP e4m3 codes (nearest even; finite values past the
// range and infinities saturate to +-448), `low`'s code in bits 0..7 and `high`'s in bits 8..15. sm_89+.
DSV4_DEVICE uint16_t cvt_rn_satfinite_e4m3x2_f32(float high, float low) {
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(high), "f"(low));
  return packed;
}

// cvt.rn.f16x2.e4m3x2 on each half of `four_codes` (four OCP codes, low byte first): codes 0, 1 as the f16
// pair `first`, codes 2, 3 as `second`, each pair's lower code in the low half. Exact. sm_89+.
DSV4_DEVICE void cvt_rn_f16x2_e4m3x2_halves(uint32_t four_codes, uint32_t& first, uint32_t& second) {
  asm("{\n .reg .b16 low, high;\n mov.b32 {low, high}, %2;\n cvt.rn.f16x2.e4m3x2 %0, low;\n"
      " cvt.rn.f16x2.e4m3x2 %1, high;\n}"
      : "=r"(first), "=r"(second)
      : "r"(four_codes));
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, accumulating into d: the warp's fragments as PTX
// defines them (a: 4 registers of 2 bf16, b: 2, d: 4 fp32). sm_80+. No side effects: the compiler may
// schedule it freely.
DSV4_DEVICE void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// griddepcontrol.wait / griddepcontrol.launch_dependents (programmatic dependent launch, sm_90+).
DSV4_DEVICE void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
DSV4_DEVICE void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Thread block clusters (sm_90+): %cluster_ctarank; barrier.cluster.arrive.release + wait.acquire; a float
// loaded (ld.shared::cluster) from the shared memory of the cluster's block `rank` at the address that
// `shared_address` (a shared-window address of this block) maps to there (mapa).
DSV4_DEVICE uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

DSV4_DEVICE void barrier_cluster_arrive_wait() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

DSV4_DEVICE float ld_shared_cluster_f32(uint32_t shared_address, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_address), "r"(rank));
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(value) : "r"(remote) : "memory");
  return value;
}

}  // namespace dsv4::ptx
#endif
