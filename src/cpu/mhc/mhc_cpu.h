// CPU backend of the mHC ops over the numerics the kernels use (dsv4/mhc.h). Arguments as for the GPU
// launchers (the workspace fields are unused); the bindings split the work across threads.
#pragma once

#include "mhc/mhc_launchers.h"

namespace dsv4::cpu {

// Tokens [begin, end) of args.
void mhc_pre(const MhcPreArgs& args, int64_t begin, int64_t end);

// Tokens [begin, end) of args.
void mhc_post(const MhcPostArgs& args, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
