// Rows a policy stages itself for a long prefill chunk (Policy::ClaimStagedReads, e.g. KIVI's
// quantized groups), shared by GQA's staged prefill (model/gqa_prefill.h) and MLA's expanded one
// (model/mla.h): a query at limit L reads rows [0, plan.Split(L)) as stage() gives them and rows
// [plan.Split(L), L) from the store.
#pragma once

#include <cstdint>
#include <functional>

#include "kv/policy.h"

namespace strata {

// stage(h, s0, sn, keys, values): f32 keys [sn, k_dim] and, unless values is null, values
// [sn, v_dim] of KV head h, rows [s0, s0 + sn) (KvCache::StagePrefixRows); called from the
// pool's threads. MLA: h = 0, the keys are the latent rows [c_hat ; r] and values are not asked
// for (they are the rows' first d_c entries).
struct StagedPrefix {
  StagedPrefixPlan plan;
  std::function<void(int h, int64_t s0, int64_t sn, float* keys, float* values)> stage;
};

}  // namespace strata
