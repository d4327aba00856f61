// Asynchronous global -> shared copies on NVIDIA (cp.async, sm_80 and later), for the kernels that stage tiles
// through shared memory while earlier tiles are multiplied. Shared addresses are in the shared window
// (shared_window_address). After copy_async_wait, a thread's completed copies are visible to itself; other
// threads read them after a barrier, and wgmma (the async proxy) after fence_shared_writes_for_wgmma
// (dsv4/wgmma.h) as well.
#pragma once

#include "dsv4/platform.h"
#include "dsv4/ptx.h"

#if DSV4_GPU_COMPILER && !defined(__HIPCC__)
namespace dsv4 {

// A pointer into shared memory as the 32-bit shared-window address that cp.async, ldmatrix and the wgmma
// descriptors take.
DSV4_DEVICE uint32_t shared_window_address(const void* shared_pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(shared_pointer));
}

#if defined(__CUDA_ARCH__)
DSV4_DEVICE void copy_async_16(uint32_t shared_address, const void* global_address) {
  ptx::cp_async_cg_16(shared_address, global_address);
}
// copy_async_16 for a stream read once in pieces (a weight's rows, a K block at a time): the hint has the
// device-wide cache fetch the whole 256-byte span around the piece, so the DRAM sees longer runs of a row.
DSV4_DEVICE void copy_async_16_stream(uint32_t shared_address, const void* global_address) {
  ptx::cp_async_cg_16_l2_256b(shared_address, global_address);
}
// 16 bytes where `present`, else 16 zero bytes (nothing is read).
DSV4_DEVICE void copy_async_16_or_zeros(uint32_t shared_address, const void* global_address, bool present) {
  ptx::cp_async_cg_16_src_size(shared_address, global_address, present ? 16 : 0);
}
// 8 bytes (copies under 16 bytes go through L1: .ca).
DSV4_DEVICE void copy_async_8(uint32_t shared_address, const void* global_address) {
  ptx::cp_async_ca_8(shared_address, global_address);
}
// Closes the thread's group of the copies issued since its last commit (an empty group where there were none).
DSV4_DEVICE void copy_async_commit() { ptx::cp_async_commit_group(); }
// Waits until at most kPending of the thread's committed groups are still in flight.
template <int kPending>
DSV4_DEVICE void copy_async_wait() {
  ptx::cp_async_wait_group<kPending>();
}
#if __CUDA_ARCH__ >= 750
// ldmatrix .x4 (no transpose) from a shared-window address: lane l gives the address of row l % 8 of 8x8 matrix
// l / 8 (16-byte rows, 16-byte aligned; the callers place the four matrices); register i then holds matrix i's
// row lane / 4, b16 elements 2 (lane % 4) and + 1.
DSV4_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address) {
  ptx::ldmatrix_m8n8_x4_b16(r, shared_address);
}
#endif
#else
// The host pass parses the kernels that call these; it never runs them.
DSV4_DEVICE void copy_async_16(uint32_t, const void*) {}
DSV4_DEVICE void copy_async_16_or_zeros(uint32_t, const void*, bool) {}
DSV4_DEVICE void copy_async_8(uint32_t, const void*) {}
DSV4_DEVICE void copy_async_commit() {}
template <int kPending>
DSV4_DEVICE void copy_async_wait() {}
#endif

}  // namespace dsv4
#endif
