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
#include "kernels/attn_math.h"
#include "io/tokenizer.h"
#include "kernels/matmul.h"
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

  // One LayerGeometry per attention layer, in layer order (kimi-linear: its MLA layers only).
  virtual std::vector<LayerGeometry> CacheLayers() const = 0;
  // The per-sequence state of the model's recurrent layers (kimi-linear's KDA layers), held by
  // each KvCache that NewCache makes; none by default.
  virtual RecurrentGeometry RecurrentLayers() const { return {}; }
  // kv_type: how the cache stores rows (--kv-type; bf16 unless asked): f32 and f16 are read by
  // the full policy only, and any other policy is refused with an error naming it.
  // attn_math: the attention dot-product arithmetic (--attn-math; the process default, f32 unless
  // the command line set it; each kernel resolves it).
  StatusOr<std::unique_ptr<KvCache>> NewCache(std::unique_ptr<Policy> policy,
                                              DType kv_type = DType::kBF16,
                                              AttnMath attn_math = DefaultAttnMath()) const;

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
  // a token outside the vocabulary, a cache already failed or inside a call: InvalidArgument; a
  // sequence at ctx_limit: OutOfRange; each naming the sequence index, returned before any cache
  // sees an event. After the step: the first failed sequence's error (named by index);
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
  // The rows of one forward pass: row i is token tokens[i] at position pos[i] of *caches[i],
  // inside that cache's open call. A prefill chunk is n rows of one cache; a decode batch
  // (DecodeBatch) one row per sequence.
  struct Rows {
    const int32_t* tokens = nullptr;
    int n = 0;
    KvCache* const* caches = nullptr;  // [n]
    const int64_t* pos = nullptr;      // [n]
    // Rows of different sequences: weight products by MatVecBatch (== MatVec per row bit for
    // bit, as a solo Decode computes them) instead of the prefill GEMM, row-wise elementwise ops.
    bool independent = false;
    // When non-null ([n], all OK on entry): a cache event's error on row i is recorded here and
    // row i takes no more events (its hidden state is then meaningless) while the other rows go
    // on; when null, the first error ends the pass.
    Status* status = nullptr;

    bool live(int i) const { return status == nullptr || status[i].ok(); }
    // The pass's verdict on an event of row i: OK to continue (recorded when per-row) or the error.
    Status Event(int i, Status s) const {
      if (s.ok() || status == nullptr) return s;
      status[i] = std::move(s);
      return OkStatus();
    }
  };
  // Whether the pass is a long prefill chunk of one sequence (`pays`: long enough for the
  // architecture's staged form) whose reads of layer l the cache grants in bulk: dense
  // (KvCache::ClaimDenseReads) or, where no query of the chunk is observed (a staged prefix has
  // no observation path), through a staged prefix (ClaimStagedReads, *plan filled); either
  // counts them as the chunk's reads of layer l.
  enum class Claim { kNone, kDense, kPrefix };
  static Claim ClaimStaged(const Rows& rows, int l, bool pays, StagedPrefixPlan* plan);
  // The gated FFN of every row: out = down(act(gate x) * (up x)) (x: [n, d]; g, u: [n, ff]
  // scratch; out: [n, d]); the activation row by row for independent rows (as each solo row).
  enum class Glu { kSilu, kGeluTanh };
  static void GatedFfn(const Rows& rows, const TensorView& gate, const TensorView& up,
                       const TensorView& down, Glu act, const float* x, int64_t d, int64_t ff,
                       float* g, float* u, ThreadPool* pool, float* out);
  // GQA attention of layer l for every row of the pass (q: [n, n_q_heads * k_dim], att: [n,
  // n_q_heads * v_dim]): a long prefill chunk staged where the cache grants it (dense or a staged
  // prefix, with the observed queries as column sums where the policy takes them), else each row
  // observed and read through its cache (sliding-window layers always so).
  static Status GqaAttention(const Rows& rows, int l, const float* q, ThreadPool* pool,
                             float* att);
  // The architecture's forward pass inside the rows' open calls: per layer, every row is
  // appended before the first query reads.
  virtual Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* hidden) = 0;
  // y = W x for every row of a pass: one row: MatVec; independent rows: MatVecBatch; else the
  // prefill GEMM (MatMul). in/out rows are in_dim/out_dim apart.
  static void Project(const Rows& rows, const TensorView& w, const float* in, int64_t in_dim,
                      float* out, int64_t out_dim, ThreadPool* pool);
  // Several products of the same input (q/k/v, gate/up) in one pool dispatch where the path
  // allows (MatVecMany, MatVecBatchMany); equal to Project per job. jobs[i].y_stride: out_dim.
  static void ProjectMany(const Rows& rows, const MatVecBatchJob* jobs, int n_jobs,
                          const float* in, int64_t in_dim, ThreadPool* pool);
  virtual Status LoadWeights() = 0;

  // Weight lookup with a shape check; errors name the tensor, expected and actual shapes.
  StatusOr<TensorView> Weight(const std::string& name, const std::vector<int64_t>& shape) const;
  StatusOr<TensorView> OptionalWeight(const std::string& name, const std::vector<int64_t>& shape,
                                      bool* present) const;
  void Embed(const int32_t* tokens, int n, float* x) const;
  // independent: the n rows are separate sequences (MatVecBatch, == MatVec per row).
  void Logits(const float* hidden, int n, ThreadPool* pool, float* logits,
              bool independent = false) const;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TensorView tok_embd_, output_norm_, output_;
  std::vector<float> output_norm_f32_;

 private:
  Status LoadCommon();
};

}  // namespace strata
