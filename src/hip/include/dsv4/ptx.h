// The PTX instructions of the NVIDIA paths that CUDA has no intrinsic for, one function each, named after
// the instruction (callers keep their own guards on the architecture that has it). Code outside this header
// reaches them only through it, included as "dsv4/ptx.h": a host model of the device (tests/device_model)
// puts its own version of this header first on the include path. Declared in every NVIDIA pass, host
// included, because device code is parsed there too; device code only.
#pragma once

#include <cstdint>

#include "dsv4/platform.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1  // sm_90a's warpgroup MMA (wgmma.h)
#endif

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

// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (OCP codes), accumulating into d: a[0] row g, k 4t..4t+3
// (g = lane / 4, t = lane % 4); a[1] row g + 8; a[2], a[3] the same at k + 16; b[0] k 4t..4t+3 of column g,
// b[1] at k + 16; d as in m16n8k16. sm_89+. No side effects.
DSV4_DEVICE void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
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

// ---- asynchronous copies and matrix loads (sm_80+; ldmatrix sm_75+) --------------------------------------
// cp.async.cg.shared.global [shared_address], [global_address], 16.
DSV4_DEVICE void cp_async_cg_16(uint32_t shared_address, const void* global_address) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address), "l"(global_address) : "memory");
}
// The same with the .L2::256B prefetch hint.
DSV4_DEVICE void cp_async_cg_16_l2_256b(uint32_t shared_address, const void* global_address) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(shared_address), "l"(global_address)
               : "memory");
}
// With a source size (16 or 0): the bytes past it are zeros, and none is read from beyond it.
DSV4_DEVICE void cp_async_cg_16_src_size(uint32_t shared_address, const void* global_address, uint32_t src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global_address),
               "r"(src_size)
               : "memory");
}
// cp.async.ca.shared.global [shared_address], [global_address], 8.
DSV4_DEVICE void cp_async_ca_8(uint32_t shared_address, const void* global_address) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared_address), "l"(global_address) : "memory");
}
DSV4_DEVICE void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
DSV4_DEVICE void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// ldmatrix.sync.aligned.m8n8.x4.shared.b16, and its .trans form.
DSV4_DEVICE void ldmatrix_m8n8_x4_b16(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}
DSV4_DEVICE void ldmatrix_m8n8_x4_trans_b16(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

// ---- conversions and byte permutes --------------------------------------------------------------------
// cvt.rn.bf16x2.f32: `high` and `low` rounded to bf16 (nearest even), `low` in bits 0..15. sm_80+.
DSV4_DEVICE uint32_t cvt_rn_bf16x2_f32(float high, float low) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}
// cvt.f32.f16 of each half of `halves` (exact).
DSV4_DEVICE void cvt_f32_f16_halves(uint32_t halves, float& low, float& high) {
  asm("{\n .reg .b16 half_low, half_high;\n mov.b32 {half_low, half_high}, %2;\n cvt.f32.f16 %0, half_low;\n"
      " cvt.f32.f16 %1, half_high;\n}"
      : "=f"(low), "=f"(high)
      : "r"(halves));
}
// prmt.b32 d, x, 0, kSelector (default mode: nibble i of the selector picks byte i of d from the 8 bytes {0, x},
// its bit 3 replicating that byte's sign bit).
template <uint32_t kSelector>
DSV4_DEVICE uint32_t prmt_b32_with_zero(uint32_t x) {
  uint32_t result;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(result) : "r"(x), "n"(kSelector));
  return result;
}

// mul.rn.f16x2: the two f16 products of the halves of `a` and `b`.
DSV4_DEVICE uint32_t mul_rn_f16x2(uint32_t a, uint32_t b) {
  uint32_t product;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(product) : "r"(a), "r"(b));
  return product;
}

// ---- shared-window and streaming loads and stores ----------------------------------------------------
DSV4_DEVICE void st_shared_f32(uint32_t address, float value) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(address), "f"(value) : "memory");
}
DSV4_DEVICE void st_shared_b32(uint32_t address, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}
DSV4_DEVICE void st_shared_v4_b32(uint32_t address, const uint4& value) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(value.x), "r"(value.y), "r"(value.z),
               "r"(value.w)
               : "memory");
}
DSV4_DEVICE uint4 ld_shared_v4_b32(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}
// ld.global.nc.L1::no_allocate.v4.u32: 16 bytes read once (not kept in L1).
DSV4_DEVICE uint4 ld_global_nc_l1_no_allocate_v4(const void* address) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address));
  return v;
}

// ---- named barriers ---------------------------------------------------------------------------------
// bar.sync / bar.arrive on barrier `id` for `threads` threads (a multiple of 32) of the block.
DSV4_DEVICE void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
DSV4_DEVICE void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- mbarriers and bulk copies (sm_90) ----------------------------------------------------------------
// mbarrier.init.shared::cta.b64 with kCount expected arrivals; fence.mbarrier_init.release.cluster.
template <uint32_t kCount>
DSV4_DEVICE void mbarrier_init(uint32_t barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "n"(kCount));
}
DSV4_DEVICE void fence_mbarrier_init_release_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival, and `bytes` more transaction bytes for the phase.
DSV4_DEVICE void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}
// mbarrier.try_wait.parity.shared::cta.b64: whether the phase of parity `parity` has completed.
DSV4_DEVICE bool mbarrier_try_wait_parity(uint32_t barrier, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
  return done != 0;
}
// prefetch.tensormap of a tensor map (a __grid_constant__ kernel parameter) at its generic address.
DSV4_DEVICE void prefetch_tensormap(uint64_t tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}
// cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: the box of the tensor map
// at generic address `tensor_map` at coordinates (x, y, z) to `destination`, its bytes completing on `barrier`.
DSV4_DEVICE void cp_async_bulk_tensor_3d(uint32_t destination, uint64_t tensor_map, int32_t x, int32_t y, int32_t z,
                                         uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(destination),
      "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(barrier)
      : "memory");
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` (a multiple of 16) from `source`.
DSV4_DEVICE void cp_async_bulk(uint32_t destination, const void* source, uint32_t bytes, uint32_t barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   destination),
               "l"(source), "r"(bytes), "r"(barrier)
               : "memory");
}

#if defined(DSV4_WGMMA)
// ---- warpgroup MMA (sm_90a; wgmma.h has the descriptors) ------------------------------------------------
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

}  // namespace dsv4::ptx
#endif
