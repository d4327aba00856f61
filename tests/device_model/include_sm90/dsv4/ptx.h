// The model's stand-in for src/hip/include/dsv4/ptx.h (same functions, same contracts): each PTX
// instruction on ../../wave_sim.h. Found before the real header because this folder is first on the include
// path of the sm_90a kernel build.
#pragma once

#include <cstdint>

#include "dsv4/platform.h"

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

[[noreturn]] inline uint32_t cluster_ctarank() { ::dsv4_sim::model_error("thread block clusters are not modelled"); }
[[noreturn]] inline void barrier_cluster_arrive_wait() {
  ::dsv4_sim::model_error("thread block clusters are not modelled");
}
[[noreturn]] inline float ld_shared_cluster_f32(uint32_t, uint32_t) {
  ::dsv4_sim::model_error("thread block clusters are not modelled");
}

}  // namespace dsv4::ptx
