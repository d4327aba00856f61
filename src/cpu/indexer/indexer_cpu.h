// CPU backend of the lightning-indexer ops over the shared decode rule (indexer/indexer_args.h).
#pragma once

#include "indexer/indexer_args.h"

namespace dsv4::cpu {

// Rows [begin, end) of args.
void fp8_mqa_logits(const MqaLogitsArgs& args, int64_t begin, int64_t end);

// Rows [begin, end) of args (r = b * next_n + n).
void fp8_paged_mqa_logits(const PagedMqaLogitsArgs& args, int64_t begin, int64_t end);

// Rows [begin, end) of args.
void topk_per_row(const TopkPerRowArgs& args, int64_t begin, int64_t end);

}  // namespace dsv4::cpu
