// One attention layer's cache rows and decode queries captured from a model's own run, so that
// `strata bench attention` measures policies on trained attention (random rows give a certified
// recall nothing to exclude: the worst case, still available as --rows random).
//
// The model prefills `ctx` tokens of a needle trial (the kv-tokens needle on the char-level
// testbed vocabulary, else the text needle through the model's tokenizer; the built-in KJV
// haystack either way), with the full policy and bf16 rows, then decodes `steps` more tokens one
// at a time, teacher-forced: the rest of the haystack, ending with the trial's question and all
// but the last answer token when `steps` has room. Every layer's rows are kept as the cache
// stored them (bf16, as f32) and the chosen layer's decode queries as the cache received them
// (MLA: absorbed into the latent space, KvCache::Attend's q).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/geometry.h"
#include "model/model.h"

namespace strata::cli {

struct CapturedLayer {
  LayerGeometry geometry;  // the layer's cache geometry (kv_type bf16, attn_math the default)
  int layer = 0;           // the layer's index in the model's cache layers (Model::CacheLayers)
  int64_t ctx = 0;         // rows before the first decode step
  int steps = 0;           // decode steps captured
  // Rows [ctx + steps]: keys [n_kv_heads * k_dim] (MLA: the latent row), values
  // [n_kv_heads * v_dim] (empty for MLA, whose values are the key row's first v_dim).
  std::vector<float> k, v;
  std::vector<float> q;  // [steps, n_q_heads * k_dim]
  int64_t needle_depth = 0;  // where the trial's needle sits in the prefix
  std::string format;        // the needle format used ("kv-tokens" or "text")

  int64_t k_stride() const { return int64_t{geometry.n_kv_heads} * geometry.k_dim; }
  int64_t v_stride() const {
    return geometry.kind == AttnKind::kMla ? 0 : int64_t{geometry.n_kv_heads} * geometry.v_dim;
  }
  const float* key_row(int64_t t) const { return k.data() + t * k_stride(); }
  const float* val_row(int64_t t) const { return v.empty() ? nullptr : v.data() + t * v_stride(); }
  const float* query(int s) const {
    return q.data() + int64_t{s} * geometry.n_q_heads * geometry.k_dim;
  }
};

// The index into Model::CacheLayers that `layer` names among the layers of the kind asked (mla:
// MLA; gqa: GQA), global ones only (a sliding-window layer is never a policy's); layer < 0: the
// last of them. Errors: the model has none, or `layer` is not one of them (the message lists them).
StatusOr<int> ResolveAttentionLayer(const Model& model, bool mla, int layer);

// layer as ResolveAttentionLayer takes it. Errors: no such layer, ctx + steps past what the trial
// can hold, a model whose layer the run never queried through its cache.
StatusOr<CapturedLayer> CaptureLayer(Model& model, bool mla, int layer, int64_t ctx, int steps,
                                     uint64_t seed, ThreadPool* pool, std::ostream& progress);

}  // namespace strata::cli
