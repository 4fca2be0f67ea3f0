// Model: weights mapped from a GGUF file (or converted from an HF directory), the forward pass
// over the kv/ cache interface (chunked prefill, single-token decode), and logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "io/tokenizer.h"
#include "kv/cache.h"
#include "model/config.h"

namespace strata {

class Model {
 public:
  // path: a .gguf file, or a directory with config.json + *.safetensors (converted in memory).
  // load: how a .gguf file's bytes are held (mapped, or read into huge-page memory).
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                               GgufFile::Load load = GgufFile::Load::kMmap);
  // Builds a model from an already-open GGUF (takes ownership).
  static StatusOr<std::unique_ptr<Model>> FromGguf(std::unique_ptr<GgufFile> file);
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  // Null when the file carries no tokenizer metadata.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // Bytes of weight storage read per decoded token (all tensors except the embedding table, plus
  // one embedding row); for MoE, only the routed experts a token uses are counted.
  int64_t decode_weight_bytes() const;
  int64_t total_weight_bytes() const;

  // One LayerGeometry per attention layer, in layer order.
  virtual std::vector<LayerGeometry> CacheLayers() const = 0;
  // kv_type: how the cache stores rows (--kv-type; bf16 unless asked): f32 and f16 are read by
  // the full policy only, and any other policy is refused with an error naming it.
  StatusOr<std::unique_ptr<KvCache>> NewCache(std::unique_ptr<Policy> policy,
                                              DType kv_type = DType::kBF16) const;

  // Feeds `n` prompt tokens at positions cache->n_tokens()..+n in chunks of `chunk` tokens.
  // The end of the call is the compression point (observations are delivered, OnCompress runs).
  // logits_last: [n_vocab] for the last token (may be null); all_logits: [n, n_vocab] when non-null.
  // progress (may be empty) is called after each chunk with the tokens done and `n`, so a CLI can
  // show a long prompt's prefill without splitting it (each call is a compression point).
  using PrefillProgress = std::function<void(int64_t done, int64_t total)>;
  Status Prefill(const int32_t* tokens, int64_t n, int chunk, KvCache* cache, ThreadPool* pool,
                 float* logits_last, std::vector<float>* all_logits = nullptr,
                 const PrefillProgress& progress = {});
  // One token at position cache->n_tokens(); logits: [n_vocab].
  Status Decode(int32_t token, KvCache* cache, ThreadPool* pool, float* logits);

  // One decode step for B independent sequences: tokens[b] at position caches[b]->n_tokens() of
  // sequence b, each cache with its own policy and position. Each weight matrix is read once for
  // the whole batch (kernels/matmul.h MatVecBatch); attention runs per sequence through its own
  // cache. Contract: every cache sees exactly the events a solo Decode(tokens[b], caches[b])
  // gives it (one kDecode call: Append, ObserveQuery, Attend per layer), and logits[b] (rows of
  // `logits`, [B, n_vocab]; may be null) equals that solo Decode's logits bit for bit, for every
  // weight dtype, whatever the other sequences of the batch are.
  struct DecodeBatchOptions {
    // The context size (a server's -c): a sequence whose cache already holds ctx_limit tokens
    // cannot take another (an error naming it). 0: no limit.
    int64_t ctx_limit = 0;
    // When non-null, resized to B and filled with each sequence's own status once the step ran
    // (a policy failure of one sequence, e.g. an archive read error, fails that sequence's cache
    // only: the other rows' logits are still exact and their caches advanced).
    std::vector<Status>* row_status = nullptr;
  };
  // Errors: B < 1, a null or repeated cache, a cache built for another geometry (another model),
  // a token outside the vocabulary, a sequence at ctx_limit, or a cache already failed or inside
  // a call: InvalidArgument/FailedPrecondition naming the sequence index, returned before any
  // cache sees an event. After the step: the first failed sequence's error (named by index);
  // the others completed (see row_status).
  Status DecodeBatch(const int32_t* tokens, int B, KvCache* const* caches, ThreadPool* pool,
                     float* logits, const DecodeBatchOptions& options);
  Status DecodeBatch(const int32_t* tokens, int B, KvCache* const* caches, ThreadPool* pool,
                     float* logits) {
    return DecodeBatch(tokens, B, caches, pool, logits, DecodeBatchOptions());
  }

 protected:
  Model(std::unique_ptr<GgufFile> file, ModelConfig config);
  // Runs tokens at positions [cache->n_tokens(), +n) as one cache call (kv/policy.h): appends
  // their rows, returns final hidden states (before the output norm) in `hidden` [n, d_model].
  Status RunCall(const int32_t* tokens, int n, CallKind kind, KvCache* cache, ThreadPool* pool,
                 float* hidden);
  // The architecture's forward pass inside an open call: per layer, every row is appended
  // before the first query reads.
  virtual Status ForwardChunk(const int32_t* tokens, int n, KvCache* cache, ThreadPool* pool,
                              float* hidden) = 0;
  virtual Status LoadWeights() = 0;

  // Weight lookup with a shape check; errors name the tensor, expected and actual shapes.
  StatusOr<TensorView> Weight(const std::string& name, const std::vector<int64_t>& shape) const;
  StatusOr<TensorView> OptionalWeight(const std::string& name, const std::vector<int64_t>& shape,
                                      bool* present) const;
  void Embed(const int32_t* tokens, int n, float* x) const;
  void Logits(const float* hidden, int n, ThreadPool* pool, float* logits) const;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TensorView tok_embd_, output_norm_, output_;
  std::vector<float> output_norm_f32_;

 private:
  Status LoadCommon();
};

}  // namespace strata
