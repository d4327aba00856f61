// Raw-pointer launchers of the lightning-indexer ops (GPU builds). Torch-free, free of GPU runtime
// headers; `stream` is the hipStream_t / cudaStream_t. The bindings validate every argument first.
#pragma once

#include "indexer/indexer_args.h"

namespace dsv4::gpu {

// Largest k the GPU top-k serves (its sort buffer lives in shared memory); the bindings reject more.
inline constexpr int64_t kTopkMaxK = 4096;

// Whether the matrix-unit path serves these logits arguments (heads 16/32/64, dim 64/128, 16-byte
// aligned rows); the launchers fall back to a scalar kernel otherwise. Exposed for the tests' reporting.
bool mqa_logits_uses_mma(const MqaLogitsArgs& args);
bool paged_mqa_logits_uses_mma(const PagedMqaLogitsArgs& args);

LaunchStatus launch_fp8_mqa_logits(const MqaLogitsArgs& args, void* stream);
LaunchStatus launch_fp8_paged_mqa_logits(const PagedMqaLogitsArgs& args, void* stream);
LaunchStatus launch_topk_per_row(const TopkPerRowArgs& args, void* stream);

}  // namespace dsv4::gpu
