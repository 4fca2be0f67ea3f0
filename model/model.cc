#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant.h"
#include "io/hf.h"
#include "io/tokenizer_json.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/gqa_prefill.h"

namespace strata {

namespace {
std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, GgufFile::Load load) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return NotFound("model path '" + path + "' does not exist");
  if (S_ISDIR(st.st_mode)) {
    HfConvertOptions opts;
    opts.out_dtype = DType::kF32;
    ASSIGN_OR_RETURN(GgufWriter w, ConvertHfDirectory(path, opts));
    const std::string tok = path + "/" + kTokenizerJsonName;
    if (stat(tok.c_str(), &st) == 0) RETURN_IF_ERROR(AddTokenizerJson(tok, &w));
    ASSIGN_OR_RETURN(auto file, GgufFile::FromBuffer(w.ToBytes(), path));
    return FromGguf(std::move(file));
  }
  ASSIGN_OR_RETURN(auto file, GgufFile::Open(path, load));
  return FromGguf(std::move(file));
}

StatusOr<std::unique_ptr<Model>> Model::FromGguf(std::unique_ptr<GgufFile> file) {
  ASSIGN_OR_RETURN(ModelConfig cfg, ModelConfig::FromGguf(*file));
  std::unique_ptr<Model> m;
  const std::string path = file->path();
  switch (cfg.arch) {
    case Arch::kLlama:
    case Arch::kQwen2:
      m = NewLlamaModel(std::move(file), cfg);
      break;
    case Arch::kDeepseek2:
      m = NewDeepseek2Model(std::move(file), cfg);
      break;
    case Arch::kGemma3:
      m = NewGemma3Model(std::move(file), cfg);
      break;
    case Arch::kKimiLinear:
      m = NewKimiLinearModel(std::move(file), cfg);
      break;
  }
  RETURN_IF_ERROR(m->LoadCommon().WithContext(path));
  RETURN_IF_ERROR(m->LoadWeights().WithContext(path));
  return m;
}

Model::Model(std::unique_ptr<GgufFile> file, ModelConfig config)
    : file_(std::move(file)), config_(std::move(config)) {}

StatusOr<TensorView> Model::Weight(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  bool present = false;
  ASSIGN_OR_RETURN(TensorView t, OptionalWeight(name, shape, &present));
  if (!present) return NotFound("missing tensor " + name + " (expected shape " + ShapeStr(shape) + ")");
  return t;
}

StatusOr<TensorView> Model::OptionalWeight(const std::string& name,
                                           const std::vector<int64_t>& shape,
                                           bool* present) const {
  const GgufTensorInfo* info = file_->FindTensor(name);
  *present = info != nullptr;
  if (!info) return TensorView();
  if (info->shape != shape) {
    return InvalidArgument("tensor " + name + " has shape " + ShapeStr(info->shape) +
                           ", expected " + ShapeStr(shape));
  }
  if (info->dtype != DType::kF32 && info->dtype != DType::kF16 && info->dtype != DType::kBF16 &&
      !IsQuantized(info->dtype)) {
    return Unimplemented("tensor " + name + " has type " + std::string(DTypeName(info->dtype)) +
                         "; weights must be F32, F16, BF16 or a block-quantized type (Q4_0 ... "
                         "Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS)");
  }
  return file_->Tensor(name);
}

Status Model::LoadCommon() {
  const ModelConfig& c = config_;
  const GgufTensorInfo* emb = file_->FindTensor("token_embd.weight");
  if (!emb) return NotFound("missing tensor token_embd.weight");
  if (emb->shape.size() != 2 || emb->shape[1] != c.d_model) {
    return InvalidArgument("tensor token_embd.weight has shape " + ShapeStr(emb->shape) +
                           ", expected [n_vocab, " + std::to_string(c.d_model) + "]");
  }
  config_.n_vocab = emb->shape[0];
  ASSIGN_OR_RETURN(tok_embd_, Weight("token_embd.weight", {config_.n_vocab, c.d_model}));
  ASSIGN_OR_RETURN(output_norm_, Weight("output_norm.weight", {c.d_model}));
  output_norm_f32_.resize(c.d_model);
  ToF32(output_norm_.dtype, output_norm_.data, output_norm_f32_.data(), c.d_model);
  bool has_output = false;
  ASSIGN_OR_RETURN(output_, OptionalWeight("output.weight", {config_.n_vocab, c.d_model}, &has_output));
  if (!has_output) output_ = tok_embd_;  // tied embeddings
  // "none" (llama.cpp's name for no vocabulary; `strata convert` writes it without a tokenizer).
  const GgufValue* tok_model = file_->Find("tokenizer.ggml.model");
  const bool no_vocab = tok_model != nullptr && tok_model->type == GgufType::kString &&
                        file_->GetString("tokenizer.ggml.model").value() == "none";
  if (tok_model != nullptr && !no_vocab) {
    ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromGguf(*file_));
    if (tokenizer_->vocab_size() > config_.n_vocab) {
      return InvalidArgument("tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                             " tokens but token_embd.weight has " +
                             std::to_string(config_.n_vocab) + " rows");
    }
  }
  return OkStatus();
}

int64_t Model::total_weight_bytes() const {
  int64_t b = 0;
  for (const auto& t : file_->tensors()) b += static_cast<int64_t>(t.n_bytes);
  return b;
}

int64_t Model::decode_weight_bytes() const {
  int64_t b = 0;
  const ModelConfig& c = config_;
  for (const auto& t : file_->tensors()) {
    if (t.name == "token_embd.weight") {
      b += DTypeRowBytes(t.dtype, c.d_model);
      if (output_.data == tok_embd_.data) b += static_cast<int64_t>(t.n_bytes);  // tied output
      continue;
    }
    const bool routed = t.name.find("_exps.") != std::string::npos;
    if (routed && c.n_experts > 0) {
      b += static_cast<int64_t>(t.n_bytes) / c.n_experts * c.n_experts_used;
    } else {
      b += static_cast<int64_t>(t.n_bytes);
    }
  }
  return b;
}

StatusOr<std::unique_ptr<KvCache>> Model::NewCache(std::unique_ptr<Policy> policy,
                                                   DType kv_type, AttnMath attn_math) const {
  std::vector<LayerGeometry> layers = CacheLayers();
  for (LayerGeometry& g : layers) {
    g.kv_type = kv_type;
    g.attn_math = attn_math;
  }
  return KvCache::Create(std::move(layers), std::move(policy), RecurrentLayers());
}

void Model::Embed(const int32_t* tokens, int n, float* x) const {
  for (int i = 0; i < n; ++i) {
    ToF32(tok_embd_.dtype, tok_embd_.row(tokens[i]), x + static_cast<int64_t>(i) * config_.d_model,
          config_.d_model);
  }
}

void Model::Logits(const float* hidden, int n, ThreadPool* pool, float* logits,
                   bool independent) const {
  const int d = config_.d_model;
  std::vector<float> xn(static_cast<size_t>(n) * d);
  for (int i = 0; i < n; ++i) {
    RmsNorm(hidden + static_cast<int64_t>(i) * d, output_norm_f32_.data(), d, config_.rms_eps,
            xn.data() + static_cast<int64_t>(i) * d);
  }
  if (n == 1) {
    MatVec(output_, xn.data(), logits, pool);
  } else if (independent) {
    MatVecBatch(output_, xn.data(), n, d, logits, config_.n_vocab, pool);
  } else {
    MatMul(output_, xn.data(), n, d, logits, config_.n_vocab, pool);
  }
  // Final logit soft-capping (gemma3 files that set it): cap * tanh(z / cap).
  if (const float cap = config_.final_logit_softcap; cap > 0.f) {
    const int64_t total = static_cast<int64_t>(n) * config_.n_vocab;
    for (int64_t i = 0; i < total; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

Model::Claim Model::ClaimStaged(const Rows& rows, int l, bool pays, StagedPrefixPlan* plan) {
  if (rows.independent || !pays) return Claim::kNone;
  for (int i = 0; i < rows.n; ++i) {
    if (rows.caches[i] != rows.caches[0] || !rows.live(i) || rows.pos[i] != rows.pos[0] + i) {
      return Claim::kNone;
    }
  }
  KvCache* cache = rows.caches[0];
  if (cache->ClaimDenseReads(l, rows.pos[0], rows.n)) return Claim::kDense;
  for (int i = 0; i < rows.n; ++i) {
    if (cache->observes(rows.pos[0] + i)) return Claim::kNone;
  }
  return cache->ClaimStagedReads(l, rows.pos[0], rows.n, plan) ? Claim::kPrefix : Claim::kNone;
}

namespace {

// The claimed chunk's attention, and its observations: the observed queries (a run of
// positions) as column sums where the policy takes them, else one by one.
Status StagedGqaAttention(KvCache* cache, int l, int64_t p0, int n, const float* q,
                          ThreadPool* pool, float* att) {
  const LayerGeometry& g = cache->geometry(l);
  const int64_t qd = int64_t{g.n_q_heads} * g.k_dim;
  int obs_a = n, obs_b = n;
  for (int i = 0; i < n; ++i) {
    if (!cache->observes(p0 + i)) continue;
    obs_a = std::min(obs_a, i);
    obs_b = i + 1;
  }
  if (obs_b > obs_a && cache->takes_column_sums()) {
    std::vector<double> col(static_cast<size_t>(g.n_kv_heads) * (p0 + obs_b), 0.0);
    GqaStagedAttention(cache->store(l), p0, n, q, pool, att, obs_a, obs_b, col.data());
    return cache->ObserveColumnSums(l, p0 + obs_a, p0 + obs_b, col.data());
  }
  for (int i = obs_a; i < obs_b; ++i) {
    RETURN_IF_ERROR(cache->ObserveQuery(l, p0 + i, &q[i * qd], pool));
  }
  GqaStagedAttention(cache->store(l), p0, n, q, pool, att);
  return OkStatus();
}

}  // namespace

Status Model::GqaAttention(const Rows& rows, int l, const float* q, ThreadPool* pool,
                           float* att) {
  const int n = rows.n;
  const LayerGeometry& g = rows.caches[0]->geometry(l);
  const int64_t qd = int64_t{g.n_q_heads} * g.k_dim, od = int64_t{g.n_q_heads} * g.v_dim;
  StagedPrefixPlan plan;
  const Claim claim = ClaimStaged(rows, l, GqaStagedPays(rows.n), &plan);
  if (claim == Claim::kDense) {
    return rows.Event(0, StagedGqaAttention(rows.caches[0], l, rows.pos[0], n, q, pool, att));
  }
  if (claim == Claim::kPrefix) {
    KvCache* cache = rows.caches[0];
    StagedPrefix prefix{plan, [cache, l](int h, int64_t s0, int64_t sn, float* k, float* v) {
                          cache->StagePrefixRows(l, h, s0, sn, k, v);
                        }};
    GqaStagedPrefixAttention(cache->store(l), prefix, rows.pos[0], n, q, pool, att);
    return OkStatus();
  }
  for (int i = 0; i < n; ++i) {
    KvCache* cache = rows.caches[i];
    const int64_t p = rows.pos[i];
    if (rows.live(i)) RETURN_IF_ERROR(rows.Event(i, cache->ObserveQuery(l, p, &q[i * qd], pool)));
    if (rows.live(i)) {
      RETURN_IF_ERROR(rows.Event(i, cache->Attend(l, &q[i * qd], p, pool, &att[i * od])));
    }
  }
  return OkStatus();
}

void Model::GatedFfn(const Rows& rows, const TensorView& gate, const TensorView& up,
                     const TensorView& down, Glu act, const float* x, int64_t d, int64_t ff,
                     float* g, float* u, ThreadPool* pool, float* out) {
  const MatVecBatchJob gate_up[] = {{gate, g, ff}, {up, u, ff}};
  ProjectMany(rows, gate_up, 2, x, d, pool);
  auto glu = [act](float* a, const float* b, int64_t m) {
    act == Glu::kSilu ? SwiGlu(a, b, m) : GeluTanhGlu(a, b, m);
  };
  if (rows.independent) {
    for (int i = 0; i < rows.n; ++i) glu(g + i * ff, u + i * ff, ff);
  } else {
    glu(g, u, rows.n * ff);
  }
  Project(rows, down, g, ff, out, d, pool);
}

void Model::Project(const Rows& rows, const TensorView& w, const float* in, int64_t in_dim,
                    float* out, int64_t out_dim, ThreadPool* pool) {
  if (rows.n == 1) {
    MatVec(w, in, out, pool);
  } else if (rows.independent) {
    MatVecBatch(w, in, rows.n, in_dim, out, out_dim, pool);
  } else {
    MatMul(w, in, rows.n, in_dim, out, out_dim, pool);
  }
}

void Model::ProjectMany(const Rows& rows, const MatVecBatchJob* jobs, int n_jobs,
                        const float* in, int64_t in_dim, ThreadPool* pool) {
  if (rows.n == 1 || rows.independent) {
    MatVecBatchMany(jobs, n_jobs, in, rows.n, in_dim, pool);  // n = 1: MatVecMany itself
    return;
  }
  for (int j = 0; j < n_jobs; ++j) {
    MatMul(jobs[j].w, in, rows.n, in_dim, jobs[j].y, jobs[j].y_stride, pool);
  }
}

Status Model::RunCall(const int32_t* tokens, int n, CallKind kind, KvCache* cache,
                      ThreadPool* pool, float* hidden) {
  RETURN_IF_ERROR(cache->BeginCall(n, kind, pool));
  const int64_t p0 = cache->n_tokens();
  std::vector<KvCache*> caches(n, cache);
  std::vector<int64_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = p0 + i;
  Rows rows;
  rows.tokens = tokens;
  rows.n = n;
  rows.caches = caches.data();
  rows.pos = pos.data();
  const Status s = ForwardChunk(rows, pool, hidden);
  const Status e = cache->EndCall();  // closes the call after a failure too
  RETURN_IF_ERROR(s);
  return e;
}

Status Model::Prefill(const int32_t* tokens, int64_t n, int chunk, KvCache* cache,
                      ThreadPool* pool, float* logits_last, std::vector<float>* all_logits,
                      const PrefillProgress& progress) {
  if (n <= 0) return InvalidArgument("prefill of " + std::to_string(n) + " tokens");
  if (chunk <= 0) return InvalidArgument("--chunk must be >= 1, got " + std::to_string(chunk));
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.n_vocab) {
      return InvalidArgument("token id " + std::to_string(tokens[i]) + " at prompt position " +
                             std::to_string(i) + " is outside the vocabulary [0, " +
                             std::to_string(config_.n_vocab) + ")");
    }
  }
  const int64_t first = cache->n_tokens();
  cache->BeginPrefill(first, first + n);
  const int d = config_.d_model;
  std::vector<float> hidden;
  if (all_logits) all_logits->assign(static_cast<size_t>(n) * config_.n_vocab, 0.f);
  for (int64_t b = 0; b < n; b += chunk) {
    const int m = static_cast<int>(std::min<int64_t>(chunk, n - b));
    hidden.assign(static_cast<size_t>(m) * d, 0.f);
    RETURN_IF_ERROR(RunCall(tokens + b, m, CallKind::kPrefill, cache, pool, hidden.data()));
    if (all_logits) {
      Logits(hidden.data(), m, pool, all_logits->data() + b * config_.n_vocab);
    } else if (logits_last && b + m == n) {
      Logits(hidden.data() + static_cast<int64_t>(m - 1) * d, 1, pool, logits_last);
    }
    if (progress) progress(b + m, n);
  }
  if (all_logits && logits_last) {
    std::memcpy(logits_last, all_logits->data() + (n - 1) * config_.n_vocab,
                sizeof(float) * config_.n_vocab);
  }
  return cache->EndPrefill(pool);
}

Status Model::Decode(int32_t token, KvCache* cache, ThreadPool* pool, float* logits) {
  if (token < 0 || token >= config_.n_vocab) {
    return InvalidArgument("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                           std::to_string(config_.n_vocab) + ")");
  }
  std::vector<float> hidden(config_.d_model);
  RETURN_IF_ERROR(RunCall(&token, 1, CallKind::kDecode, cache, pool, hidden.data()));
  if (logits) Logits(hidden.data(), 1, pool, logits);
  return OkStatus();
}

namespace {
// Where a cache's layers differ from the model's (kv_type aside: the cache chooses it); empty
// when they match.
std::string GeometryMismatch(const KvCache& cache, const std::vector<LayerGeometry>& want,
                             const RecurrentGeometry& want_rec) {
  if (!(cache.recurrent() == want_rec)) {
    return "holds " + std::to_string(cache.recurrent().n_layers) + " recurrent layers of " +
           std::to_string(cache.recurrent().state_floats) + " + " +
           std::to_string(cache.recurrent().conv_floats) + " floats, the model " +
           std::to_string(want_rec.n_layers) + " of " + std::to_string(want_rec.state_floats) +
           " + " + std::to_string(want_rec.conv_floats);
  }
  if (cache.n_layers() != static_cast<int>(want.size())) {
    return "has " + std::to_string(cache.n_layers()) + " layers, the model " +
           std::to_string(want.size());
  }
  for (int l = 0; l < cache.n_layers(); ++l) {
    const LayerGeometry& g = cache.geometry(l);
    const LayerGeometry& w = want[l];
    if (g.kind != w.kind || g.n_q_heads != w.n_q_heads || g.n_kv_heads != w.n_kv_heads ||
        g.k_dim != w.k_dim || g.v_dim != w.v_dim || g.rope_dim != w.rope_dim ||
        g.rope != w.rope || g.scale != w.scale) {
      return LayerName(w, l) + " is " + g.ToString() + ", the model's " +
             w.ToString();
    }
  }
  return "";
}
}  // namespace

Status Model::DecodeBatch(const int32_t* tokens, int B, KvCache* const* caches, ThreadPool* pool,
                          float* logits, const DecodeBatchOptions& options) {
  // Every check before the first event, so a refused batch leaves every cache as it was.
  if (B < 1) return InvalidArgument("DecodeBatch of " + std::to_string(B) + " sequences");
  if (options.ctx_limit < 0) {
    return InvalidArgument("DecodeBatch: context limit " + std::to_string(options.ctx_limit) +
                           " (0: none)");
  }
  if (tokens == nullptr || caches == nullptr) {
    return InvalidArgument("DecodeBatch: null tokens or caches array");
  }
  const std::vector<LayerGeometry> layers = CacheLayers();
  const RecurrentGeometry rec = RecurrentLayers();
  std::vector<const KvCache*> seen(caches, caches + B);
  std::sort(seen.begin(), seen.end());
  for (int b = 0; b < B; ++b) {
    const std::string seq = "DecodeBatch: sequence " + std::to_string(b) + ": ";
    KvCache* c = caches[b];
    if (c == nullptr) return InvalidArgument(seq + "null cache");
    if (tokens[b] < 0 || tokens[b] >= config_.n_vocab) {
      return InvalidArgument(seq + "token id " + std::to_string(tokens[b]) +
                             " is outside the vocabulary [0, " +
                             std::to_string(config_.n_vocab) + ")");
    }
    if (const std::string why = GeometryMismatch(*c, layers, rec); !why.empty()) {
      return InvalidArgument(seq + "the cache was not made for this model: it " + why);
    }
    if (options.ctx_limit > 0 && c->n_tokens() >= options.ctx_limit) {
      return OutOfRange(seq + "the cache holds " + std::to_string(c->n_tokens()) +
                        " tokens, the context limit is " + std::to_string(options.ctx_limit));
    }
    if (!c->status().ok()) {
      return InvalidArgument(seq + "the cache failed earlier: " + c->status().ToString());
    }
    if (c->in_call()) return InvalidArgument(seq + "the cache is inside another call");
  }
  for (int b = 1; b < B; ++b) {
    if (seen[b] == seen[b - 1]) {
      const int i = static_cast<int>(std::find(caches, caches + B, seen[b]) - caches);
      return InvalidArgument("DecodeBatch: sequence " + std::to_string(i) +
                             "'s cache appears twice in the batch (one decode call per sequence)");
    }
  }

  std::vector<Status> status(B);
  std::vector<uint8_t> open(B, 0);
  std::vector<int64_t> pos(B);
  for (int b = 0; b < B; ++b) {
    pos[b] = caches[b]->n_tokens();
    status[b] = caches[b]->BeginCall(1, CallKind::kDecode, pool);
    open[b] = status[b].ok();
  }
  const int64_t d = config_.d_model;
  std::vector<float> hidden(static_cast<size_t>(B) * d, 0.f);
  Rows rows;
  rows.tokens = tokens;
  rows.n = B;
  rows.caches = caches;
  rows.pos = pos.data();
  rows.independent = true;
  rows.status = status.data();
  Status pass = ForwardChunk(rows, pool, hidden.data());
  for (int b = 0; b < B; ++b) {
    if (!open[b]) continue;
    const Status e = caches[b]->EndCall();  // closes the call after a failure too
    if (status[b].ok() && !pass.ok()) status[b] = pass;
    if (status[b].ok()) status[b] = e;
  }
  if (logits) Logits(hidden.data(), B, pool, logits, /*independent=*/true);
  if (options.row_status) *options.row_status = status;
  for (int b = 0; b < B; ++b) {
    if (!status[b].ok()) {
      return status[b].WithContext("DecodeBatch: sequence " + std::to_string(b));
    }
  }
  return OkStatus();
}

}  // namespace strata
