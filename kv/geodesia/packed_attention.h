// Geodesia-KV packed attention over a whole GradedLayer: the layer driver of the packed kernel
// (kernels/packed_attention.h, re-exported here for the policy and its tests).
#pragma once

#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/packed_attention.h"
#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

// Whole layer: query heads [h * G, (h + 1) * G) read KV head h (G = n_q_heads / n_kv_heads), all
// blocks, every (head, split) pair one task on the pool, merged per head in split order.
// q: [n_q_heads, head_dim]; st: n_heads = n_q_heads (merged into).
void PackedAttendLayer(const GradedLayer& layer, const float* q, int n_q_heads, float scale,
                       int n_splits, ThreadPool* pool, SoftmaxStates* st);

}  // namespace strata::geodesia
