#include "cli/bench_capture.h"

#include <algorithm>

#include "cli/common.h"
#include "core/dtype.h"
#include "eval/needle.h"
#include "kv/cache.h"
#include "kv/registry.h"

namespace strata::cli {

namespace {

std::vector<int> AttentionLayers(const Model& model, bool mla) {
  std::vector<int> out;
  const std::vector<LayerGeometry> layers = model.CacheLayers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerGeometry& g = layers[i];
    if ((g.kind == AttnKind::kMla) == mla && g.window == 0) out.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace

StatusOr<int> ResolveAttentionLayer(const Model& model, bool mla, int layer) {
  const std::vector<int> candidates = AttentionLayers(model, mla);
  if (candidates.empty()) {
    return InvalidArgument(std::string("the model has no global ") + (mla ? "MLA" : "GQA") +
                           " attention layer (--kind " + (mla ? "mla" : "gqa") + ")");
  }
  if (layer < 0) return candidates.back();
  if (std::find(candidates.begin(), candidates.end(), layer) == candidates.end()) {
    std::string list;
    for (int c : candidates) list += (list.empty() ? "" : ", ") + std::to_string(c);
    return InvalidArgument("--layer " + std::to_string(layer) + " is not one of the model's " +
                           (mla ? "MLA" : "GQA") + " cache layers (" + list + ")");
  }
  return layer;
}

StatusOr<CapturedLayer> CaptureLayer(Model& model, bool mla, int layer, int64_t ctx, int steps,
                                     uint64_t seed, ThreadPool* pool, std::ostream& progress) {
  ASSIGN_OR_RETURN(layer, ResolveAttentionLayer(model, mla, layer));
  if (ctx < 64) return InvalidArgument("--ctx must be >= 64 with model rows");
  if (steps < 1) return InvalidArgument("capture needs >= 1 decode step");

  // The trial: the testbed's kv-tokens needle when the vocabulary is the testbed's, else text.
  eval::NeedleOptions no;
  no.seed = seed;
  const Tokenizer* tok = model.tokenizer();
  const bool kv = tok == nullptr || TestbedVocabularyMismatch(*tok, no.kv).empty();
  no.format = kv ? eval::NeedleFormat::kKvTokens : eval::NeedleFormat::kText;
  ASSIGN_OR_RETURN(eval::NeedleBuilder builder, eval::NeedleBuilder::Create(model, no));
  // The prefix is long enough that the decode steps end with the question and all but the last
  // answer token where they have room; otherwise they are the haystack's continuation.
  ASSIGN_OR_RETURN(eval::NeedleTrial probe, builder.Build(std::max<int64_t>(ctx, 64), 0));
  const int64_t n_tail = static_cast<int64_t>(probe.query.size() + probe.answer.size()) - 1;
  const int64_t prefix_len = ctx + std::max<int64_t>(0, steps - n_tail);
  ASSIGN_OR_RETURN(eval::NeedleTrial trial, builder.Build(prefix_len, 0));
  std::vector<int32_t> seq = trial.prefix;
  seq.insert(seq.end(), trial.query.begin(), trial.query.end());
  seq.insert(seq.end(), trial.answer.begin(), trial.answer.end() - 1);
  seq.resize(ctx + steps);

  ASSIGN_OR_RETURN(std::unique_ptr<Policy> full, MakePolicy(PolicySpec{"full"}));
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, model.NewCache(std::move(full)));
  CapturedLayer c;
  c.layer = layer;
  c.ctx = ctx;
  c.steps = steps;
  c.geometry = cache->geometry(layer);
  c.needle_depth = trial.depth;
  c.format = eval::NeedleFormatName(no.format);
  const int64_t qn = int64_t{c.geometry.n_q_heads} * c.geometry.k_dim;
  c.q.reserve(static_cast<size_t>(steps * qn));
  int taken = 0;
  cache->set_query_tap([&](int l, int64_t pos, const float* q) {
    if (l != layer || pos < ctx) return;
    c.q.insert(c.q.end(), q, q + qn);
    ++taken;
  });
  progress << "capturing layer " << layer << " (model layer " << c.geometry.model_layer
           << "): prefill of " << ctx << " tokens, then " << steps << " decode steps ("
           << c.format << " needle at " << trial.depth << ")...\n"
           << std::flush;
  RETURN_IF_ERROR(model.Prefill(seq.data(), ctx, 256, cache.get(), pool, nullptr));
  std::vector<float> logits(model.config().n_vocab);
  for (int s = 0; s < steps; ++s) {
    RETURN_IF_ERROR(model.Decode(seq[ctx + s], cache.get(), pool, logits.data()));
  }
  cache->set_query_tap({});
  if (taken != steps) {
    return Internal("capture: layer " + std::to_string(layer) + " served " +
                    std::to_string(taken) + " decode queries through its cache, expected " +
                    std::to_string(steps));
  }
  const LayerStore& store = cache->store(layer);
  const LayerGeometry& g = c.geometry;
  const int64_t n = store.n_rows();
  c.k.resize(static_cast<size_t>(n * c.k_stride()));
  c.v.resize(static_cast<size_t>(n * c.v_stride()));
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < g.n_kv_heads; ++h) {
      store.KeyRowF32(h, t, &c.k[t * c.k_stride() + int64_t{h} * g.k_dim]);
      if (c.v_stride() == 0) continue;
      const uint16_t* vr = store.val_row(h, t);
      float* dst = &c.v[t * c.v_stride() + int64_t{h} * g.v_dim];
      for (int i = 0; i < g.v_dim; ++i) dst[i] = Bf16ToF32(vr[i]);
    }
  }
  return c;
}

}  // namespace strata::cli
