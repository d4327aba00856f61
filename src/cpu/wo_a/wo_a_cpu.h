// CPU backend of the wo_a ops over the shared numerics (dsv4/fp8.h, dsv4/ue8m0.h, dsv4/rope.h).
#pragma once

#include "wo_a/wo_a_args.h"

namespace dsv4::cpu {

// Tokens [begin, end) of args.
void inverse_rope_group_quant(const InverseRopeGroupQuantArgs& args, int64_t begin, int64_t end);

// Tokens [begin, end) of args.
void inverse_rope(const InverseRopeArgs& args, int64_t begin, int64_t end);

// Rows m in [begin, end) of args.
void bmm_a8w8_mxscale(const BmmA8W8MxScaleArgs& args, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
