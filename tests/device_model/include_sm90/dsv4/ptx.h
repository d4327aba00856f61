// The model's stand-in for src/hip/include/dsv4/ptx.h (same functions, same contracts): each PTX
// instruction on ../../wave_sim.h. Found before the real header because this folder is first on the include
// path of the sm_90a kernel build.
#pragma once

#include <cstdint>
#include <cstring>

#include <cudaTypedefs.h>

#include "dsv4/platform.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

namespace dsv4::ptx {

DSV4_DEVICE uint16_t cvt_rn_satfinite_e4m3x2_f32(float high, float low) {
  return ::dsv4_sim::cvt_rn_satfinite_e4m3x2_f32(high, low);
}

DSV4_DEVICE void cvt_rn_f16x2_e4m3x2_halves(uint32_t four_codes, uint32_t& first, uint32_t& second) {
  ::dsv4_sim::cvt_rn_f16x2_e4m3x2_halves(four_codes, first, second);
}

DSV4_SIM_WAVE_OPERATION void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::dsv4_sim::mma_m16n8k16_bf16(d, a, b, ::dsv4_sim::call_site());
}

DSV4_DEVICE void griddepcontrol_wait() { ::dsv4_sim::wait_for_previous_grid(); }
// Dependents start early in the model whether or not this is called (see wave_sim.h).
DSV4_DEVICE void griddepcontrol_launch_dependents() {}

DSV4_DEVICE uint32_t cluster_ctarank() { return static_cast<uint32_t>(::dsv4_sim::cluster_rank()); }
DSV4_DEVICE void barrier_cluster_arrive_wait() { ::dsv4_sim::sync_cluster(); }
DSV4_DEVICE float ld_shared_cluster_f32(uint32_t shared_address, uint32_t rank) {
  return ::dsv4_sim::load_cluster_shared_f32(shared_address, static_cast<int>(rank));
}

// ---- shared-window and streaming loads and stores ----------------------------------------------------
template <typename T>
DSV4_DEVICE void store_shared(uint32_t address, const T& value) {
  std::memcpy(::dsv4_sim::shared_pointer(address), &value, sizeof value);
}
DSV4_DEVICE void st_shared_f32(uint32_t address, float value) { store_shared(address, value); }
DSV4_DEVICE void st_shared_b32(uint32_t address, uint32_t value) { store_shared(address, value); }
DSV4_DEVICE void st_shared_v4_b32(uint32_t address, const uint4& value) { store_shared(address, value); }
DSV4_DEVICE uint4 ld_shared_v4_b32(uint32_t address) {
  uint4 value;
  std::memcpy(&value, ::dsv4_sim::shared_pointer(address), sizeof value);
  return value;
}
DSV4_DEVICE uint4 ld_global_nc_l1_no_allocate_v4(const void* address) {
  uint4 value;
  std::memcpy(&value, address, sizeof value);
  return value;
}

// ---- asynchronous copies and matrix loads ----------------------------------------------------------------
DSV4_DEVICE void cp_async_cg_16_src_size(uint32_t shared_address, const void* global_address, uint32_t src_size) {
  unsigned char* destination = ::dsv4_sim::shared_pointer(shared_address);
  const auto* source = static_cast<const unsigned char*>(global_address);
  ::dsv4_sim::defer(::dsv4_sim::AsyncUnit::kCopy, [destination, source, src_size] {
    std::memcpy(destination, source, src_size);
    std::memset(destination + src_size, 0, 16 - src_size);
  });
}
DSV4_DEVICE void cp_async_cg_16(uint32_t shared_address, const void* global_address) {
  cp_async_cg_16_src_size(shared_address, global_address, 16);
}
DSV4_DEVICE void cp_async_cg_16_l2_256b(uint32_t shared_address, const void* global_address) {
  cp_async_cg_16_src_size(shared_address, global_address, 16);
}
DSV4_DEVICE void cp_async_ca_8(uint32_t shared_address, const void* global_address) {
  unsigned char* destination = ::dsv4_sim::shared_pointer(shared_address);
  const auto* source = static_cast<const unsigned char*>(global_address);
  ::dsv4_sim::defer(::dsv4_sim::AsyncUnit::kCopy, [destination, source] { std::memcpy(destination, source, 8); });
}
DSV4_DEVICE void cp_async_commit_group() { ::dsv4_sim::commit_deferred(::dsv4_sim::AsyncUnit::kCopy); }
template <int kPending>
DSV4_DEVICE void cp_async_wait_group() {
  ::dsv4_sim::complete_deferred(::dsv4_sim::AsyncUnit::kCopy, kPending);
}
DSV4_SIM_WAVE_OPERATION void ldmatrix_m8n8_x4_b16(uint32_t (&r)[4], uint32_t shared_address) {
  ::dsv4_sim::ldmatrix_x4(r, shared_address, false, ::dsv4_sim::call_site());
}
DSV4_SIM_WAVE_OPERATION void ldmatrix_m8n8_x4_trans_b16(uint32_t (&r)[4], uint32_t shared_address) {
  ::dsv4_sim::ldmatrix_x4(r, shared_address, true, ::dsv4_sim::call_site());
}

DSV4_SIM_WAVE_OPERATION void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::dsv4_sim::mma_m16n8k32_e4m3(d, a, b, ::dsv4_sim::call_site());
}

// ---- mbarriers and bulk copies ----------------------------------------------------------------------
template <uint32_t kCount>
DSV4_DEVICE void mbarrier_init(uint32_t barrier) {
  ::dsv4_sim::mbarrier_init(barrier, kCount);
}
DSV4_DEVICE void fence_mbarrier_init_release_cluster() {}
DSV4_DEVICE void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes) {
  ::dsv4_sim::mbarrier_arrive_expect_tx(barrier, bytes);
}
DSV4_DEVICE bool mbarrier_try_wait_parity(uint32_t barrier, uint32_t parity) {
  ::dsv4_sim::mbarrier_wait_parity(barrier, parity);
  return true;
}
DSV4_DEVICE void prefetch_tensormap(uint64_t) {}
// The box at (x, y, z) of a byte tensor map (cudaTypedefs.h here), rows of box[0] bytes one after another from
// `destination`, through the map's swizzle; coordinates past the tensor read as zeros.
DSV4_DEVICE void cp_async_bulk_tensor_3d(uint32_t destination, uint64_t tensor_map, int32_t x, int32_t y, int32_t z,
                                         uint32_t barrier) {
  const CUtensorMap map = *reinterpret_cast<const CUtensorMap*>(tensor_map);
  if (map.rank != 3) ::dsv4_sim::model_error("a 3-D tensor copy through a tensor map of another rank");
  const int swizzle_bits = map.swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 3
                           : map.swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 2
                           : map.swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 1
                                                                      : 0;
  const uint32_t bytes = map.box[0] * map.box[1] * map.box[2];
  ::dsv4_sim::mbarrier_bulk_copy(barrier, bytes, [map, destination, x, y, z, swizzle_bits] {
    uint32_t offset = 0;
    for (uint32_t k = 0; k < map.box[2]; ++k) {
      for (uint32_t j = 0; j < map.box[1]; ++j) {
        for (uint32_t i = 0; i < map.box[0]; ++i, ++offset) {
          const int64_t c0 = int64_t{x} + i, c1 = int64_t{y} + j, c2 = int64_t{z} + k;
          const bool inside = c0 >= 0 && c1 >= 0 && c2 >= 0 && static_cast<uint64_t>(c0) < map.dims[0] &&
                              static_cast<uint64_t>(c1) < map.dims[1] && static_cast<uint64_t>(c2) < map.dims[2];
          const uint32_t address = destination + offset;
          const uint32_t swizzled = address ^ (((address >> 7) & ((1u << swizzle_bits) - 1u)) << 4);
          *::dsv4_sim::shared_pointer(swizzled) =
              inside ? map.global[c0 * map.strides[0] + c1 * map.strides[1] + c2 * map.strides[2]] : 0;
        }
      }
    }
  });
}
DSV4_DEVICE void cp_async_bulk(uint32_t destination, const void* source, uint32_t bytes, uint32_t barrier) {
  unsigned char* to = ::dsv4_sim::shared_pointer(destination);
  const auto* from = static_cast<const unsigned char*>(source);
  ::dsv4_sim::mbarrier_bulk_copy(barrier, bytes, [to, from, bytes] { std::memcpy(to, from, bytes); });
}

// ---- conversions and byte permutes --------------------------------------------------------------------
DSV4_DEVICE uint32_t cvt_rn_bf16x2_f32(float high, float low) { return ::dsv4_sim::cvt_rn_bf16x2_f32(high, low); }
DSV4_DEVICE void cvt_f32_f16_halves(uint32_t halves, float& low, float& high) {
  ::dsv4_sim::cvt_f32_f16_halves(halves, low, high);
}
template <uint32_t kSelector>
DSV4_DEVICE uint32_t prmt_b32_with_zero(uint32_t x) {
  return ::dsv4_sim::prmt_b32(x, 0, kSelector);
}
DSV4_DEVICE uint32_t mul_rn_f16x2(uint32_t a, uint32_t b) { return ::dsv4_sim::mul_rn_f16x2(a, b); }

// ---- named barriers ---------------------------------------------------------------------------------
DSV4_DEVICE void bar_sync(int id, int threads) { ::dsv4_sim::named_barrier(id, threads, true); }
DSV4_DEVICE void bar_arrive(int id, int threads) { ::dsv4_sim::named_barrier(id, threads, false); }

#if defined(DSV4_WGMMA)
// ---- warpgroup MMA ------------------------------------------------------------------------------------
DSV4_DEVICE void wgmma_m64n64k32(float (&d)[32], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  ::dsv4_sim::wgmma(d, 64, a_desc, b_desc, accumulate != 0, ::dsv4_sim::MatrixElement::kE4m3, false);
}
DSV4_DEVICE void wgmma_m64n128k32(float (&d)[64], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  ::dsv4_sim::wgmma(d, 128, a_desc, b_desc, accumulate != 0, ::dsv4_sim::MatrixElement::kE4m3, false);
}
DSV4_SIM_WAVE_OPERATION void wgmma_m64n64k16_f16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                     uint32_t accumulate) {
  ::dsv4_sim::wgmma_a_registers_f16(d, 64, a, b_desc, accumulate != 0, ::dsv4_sim::call_site());
}
DSV4_SIM_WAVE_OPERATION void wgmma_m64n128k16_f16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                      uint32_t accumulate) {
  ::dsv4_sim::wgmma_a_registers_f16(d, 128, a, b_desc, accumulate != 0, ::dsv4_sim::call_site());
}
DSV4_DEVICE void wgmma_m64n16k16_bf16(float (&d)[8], uint64_t a_desc, uint64_t b_desc, uint32_t accumulate) {
  ::dsv4_sim::wgmma(d, 16, a_desc, b_desc, accumulate != 0, ::dsv4_sim::MatrixElement::kBf16, false);
}
DSV4_DEVICE void wgmma_m64n256k16_bf16_b_mn_major(float (&d)[128], uint64_t a_desc, uint64_t b_desc,
                                                  uint32_t accumulate) {
  ::dsv4_sim::wgmma(d, 256, a_desc, b_desc, accumulate != 0, ::dsv4_sim::MatrixElement::kBf16, true);
}
// Memory and register ordering: every access happens in program order here.
DSV4_DEVICE void fence_shared_writes_for_wgmma() {}
DSV4_DEVICE void wgmma_fence() {}
DSV4_DEVICE void wgmma_commit() { ::dsv4_sim::commit_deferred(::dsv4_sim::AsyncUnit::kMatrix); }
template <int kPending>
DSV4_DEVICE void wgmma_wait() {
  ::dsv4_sim::complete_deferred(::dsv4_sim::AsyncUnit::kMatrix, kPending);
}
template <int kCount>
DSV4_DEVICE void pin_registers(float (&)[kCount]) {}
#endif  // DSV4_WGMMA

}  // namespace dsv4::ptx
