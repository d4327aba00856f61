// Raw-pointer launchers of dsv4.sparse_mla_decode (GPU builds; spec/sparse_mla_decode.md). Torch-free,
// free of GPU runtime headers; `stream` is the hipStream_t / cudaStream_t. The bindings validate every
// argument first and allocate the fp32 partials (sparse_mla_workspace_floats) into args.partials.
#pragma once

#include "sparse_mla/sparse_mla_args.h"

namespace dsv4::gpu {

// The split count a launch uses: `requested` when > 0, else one chosen from the number of (row, head
// group) blocks against the device's multiprocessor count and the average keys per row.
int sparse_mla_decode_num_splits(const SparseMlaDecodeArgs& args, int requested);

// fp32 elements of the partials workspace: per (row, split, head) 512 accumulators, then (m, l).
int64_t sparse_mla_workspace_floats(const SparseMlaDecodeArgs& args);

// The split-K partial kernel, then the reduce (sink, optional inverse RoPE, bf16 out). args.num_splits
// must be the value sparse_mla_decode_num_splits returned; args.partials must hold
// sparse_mla_workspace_floats(args) floats.
LaunchStatus launch_sparse_mla_decode(const SparseMlaDecodeArgs& args, void* stream);

}  // namespace dsv4::gpu
