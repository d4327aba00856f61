// CPU backend of the fp8_ds_mla cache utilities, over the record numerics the kernels use
// (dsv4/ds_mla.h). Arguments as for the GPU launchers; the bindings split the work across threads.
#pragma once

#include "kv_cache/kv_cache_launchers.h"

namespace dsv4::cpu {

// Tokens [begin, end) of args.
void qnorm_rope_kv_insert(const QnormRopeKvInsertArgs& args, int64_t begin, int64_t end);

// Tokens [begin, end) of args.
void quantize_and_insert_k_cache(const KvInsertArgs& args, int64_t begin, int64_t end);

// Requests [begin, end) of args.
void dequantize_and_gather_k_cache(const KvGatherArgs& args, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
