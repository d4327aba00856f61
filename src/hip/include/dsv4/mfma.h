// gfx950 matrix instructions shared by the kernels that have a form for them. Device code only.
#pragma once

#include "dsv4/platform.h"

#if DSV4_GPU_COMPILER && defined(__gfx950__)
namespace dsv4::gpu {

// c += A B over 32 k on gfx950's double-rate v_mfma_f32_16x16x32_bf16 (fp32 accumulation): a lane's 8 bf16
// of A and of B as four 32-bit words each, low value first. A caller that packs both operands in the same
// k order gets every k paired with itself (a dot product does not depend on the order of its terms).
DSV4_DEVICE void mfma_16x16x32_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  typedef __bf16 Bf16x8 __attribute__((ext_vector_type(8)));
  typedef uint32_t Words4 __attribute__((ext_vector_type(4)));
  typedef float Floatx4 __attribute__((ext_vector_type(4)));
  const Bf16x8 a_operand = __builtin_bit_cast(Bf16x8, Words4{a[0], a[1], a[2], a[3]});
  const Bf16x8 b_operand = __builtin_bit_cast(Bf16x8, Words4{b[0], b[1], b[2], b[3]});
  Floatx4 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a_operand, b_operand, acc, 0, 0, 0);
  c[0] = acc[0];
  c[1] = acc[1];
  c[2] = acc[2];
  c[3] = acc[3];
}

}  // namespace dsv4::gpu
#endif
