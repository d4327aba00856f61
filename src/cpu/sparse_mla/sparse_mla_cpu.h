// CPU backend of dsv4.sparse_mla_decode, in the split-K form the GPU kernels use: per slice of a row's
// keys (m, l, acc) partials, then one reduce with the sink.
#pragma once

#include "sparse_mla/sparse_mla_args.h"

namespace dsv4::cpu {

// Query rows [begin, end) of args.
void sparse_mla_decode(const SparseMlaDecodeArgs& args, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
