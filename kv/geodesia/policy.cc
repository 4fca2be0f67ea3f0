// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/policy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <sstream>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/geodesia/accounting.h"
#include "kv/geodesia/packed_attention.h"
#include "kv/geodesia/quest.h"
#include "kv/geodesia/residual.h"

namespace strata {

using geodesia::AllocBlock;
using geodesia::GradedLayer;
using geodesia::kBlockTokens;
using geodesia::kLevels;
using geodesia::kNumLevels;

namespace {

// Blocks per unit of read work (a (KV head, chunk) task). Fixed, so results do not depend on the
// pool size.
constexpr int64_t kChunkBlocks = 16;

// Contiguous states for n units of G heads x dv.
struct StateArray {
  int G = 0, dv = 0;
  std::vector<float> m, d, o;
  void Resize(int64_t n, int g, int v) {
    G = g;
    dv = v;
    m.resize(n * G);
    d.resize(n * G);
    o.resize(n * G * dv);
  }
  SoftmaxStates at(int64_t i) {
    SoftmaxStates s;
    s.n_heads = G;
    s.dv = dv;
    s.m = m.data() + i * G;
    s.d = d.data() + i * G;
    s.o = o.data() + i * G * dv;
    return s;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

std::string GeodesiaConfig::ToString() const {
  std::ostringstream s;
  s << "profile " << (profile == Profile::kRetrieval ? "retrieval" : "reference") << ", bits "
    << bits << ", group ";
  if (!group_auto) {
    s << group;
  } else if (auto_head_dim > 0) {
    s << group << " (auto: head dim " << auto_head_dim << ")";
  } else {
    s << "auto (the largest power of two dividing 64 and the head dim)";
  }
  s << ", decay " << decay << ", window " << window
    << ", sinks " << sinks << ", rd-frac " << rd_frac << ", quest-keep " << quest_keep
    << ", ratchet " << (ratchet == geodesia::Ratchet::kReference ? "reference" : "clean")
    << ", requant " << (requant == geodesia::DemotionMode::kOnce ? "once" : "cascade")
    << ", candidates "
    << (candidates == geodesia::Candidates::kReference ? "reference" : "exact")
    << ", mass " << (mass == Mass::kExact ? "exact" : "compressed")
    << ", budget " << (budget_all ? "all" : "levels");
  if (mass_power != 1) s << ", mass-power " << mass_power;
  if (floor != 1) s << ", floor " << floor;
  if (!predecessor_exact) s << ", predecessor coded";
  if (salience != 0) s << ", salience " << salience;
  if (rd_value_score) s << ", rd-score value";
  if (math != geodesia::PackedMath::kF32) s << ", attn-math " << geodesia::PackedMathName(math);
  if (value_weight != 0) s << ", value-weight " << value_weight;
  return s.str();
}

GeodesiaConfig GeodesiaConfig::RetrievalProfile(GeodesiaConfig c) {
  c.profile = Profile::kRetrieval;
  c.bits = 3.4;
  c.floor = 2;
  c.sinks = 0;
  c.window = 0;
  c.predecessor_exact = false;
  return c;
}

namespace {
// Each policy's default profile: geodesia's is retrieval (issue 18), Compressed-Quest's the
// reference (its own tables; over an exact cache the profile only moves which pages are hot).
GeodesiaConfig::Profile DefaultProfile(bool cquest) {
  return cquest ? GeodesiaConfig::Profile::kReference : GeodesiaConfig::Profile::kRetrieval;
}
const char* ProfileName(GeodesiaConfig::Profile p) {
  return p == GeodesiaConfig::Profile::kRetrieval ? "retrieval" : "reference";
}
}  // namespace

PolicySettings GeodesiaSettings(bool cquest) {
  // The declared defaults are those of the policy's default profile; the help of each setting a
  // profile moves names the other profile's value.
  const GeodesiaConfig ref;
  const GeodesiaConfig ret = GeodesiaConfig::RetrievalProfile(ref);
  const bool retrieval = DefaultProfile(cquest) == GeodesiaConfig::Profile::kRetrieval;
  const GeodesiaConfig& c = retrieval ? ret : ref;
  const GeodesiaConfig& other = retrieval ? ref : ret;
  auto num = [](double v) { std::ostringstream s; s << v; return s.str(); };
  const std::string other_name = std::string("profile=") + (retrieval ? "reference" : "retrieval");
  auto alt = [&](const std::string& value) { return " (" + other_name + ": " + value + ")"; };
  using geodesia::DemotionMode;
  using geodesia::Ratchet;
  PolicySettings p;
  p.policy = cquest ? "cquest" : "geodesia";
  p.budget = "bits";
  p.settings = {
      SettingDecl::Enum("profile", ProfileName(DefaultProfile(cquest)), {"retrieval", "reference"},
                        cquest ? "defaults of floor, sinks, window and predecessor: retrieval = "
                                 "floor 2, sinks 0, window 0, predecessor coded; reference = "
                                 "floor 1, sinks 4, window 128, predecessor exact (bits stays "
                                 "16 unless given)"
                               : "defaults of bits, floor, sinks, window and predecessor: "
                                 "retrieval = bits 3.4, floor 2, sinks 0, window 0, predecessor "
                                 "coded (every token keeps codes; docs/geodesia.md); reference = "
                                 "the paper's method (bits 5, floor 1, sinks 4, window 128, "
                                 "predecessor exact)"),
      // Compressed-Quest's own defaults: an exact cache (16 bits) read through the Quest gate.
      SettingDecl::Real("bits", cquest ? 16.0 : c.bits,
                        "budget in bits per value per layer (16: every block exact)" +
                            (cquest ? std::string() : alt(num(other.bits))))
          .Min(0.25)
          .Max(16)
          .Shared(),
      SettingDecl::Int("group", c.group, "quantization group size")
          .Min(1)
          .Max(kBlockTokens)
          .Constraint("a power of two dividing 64 and the head dim")
          .Auto("auto: the largest power of two dividing 64 and the head dim")
          .Shared(),
      SettingDecl::Real("decay", c.decay, "EMA decay of the block attention mass")
          .Min(0)
          .Max(1)
          .Shared(),
      SettingDecl::Int("window", c.window,
                       "recent tokens kept exact" + alt(std::to_string(other.window)))
          .Min(0)
          .Shared(),
      SettingDecl::Int("sinks", c.sinks,
                       "first tokens kept exact (whole 64-token blocks; 0: no sink block)" +
                           alt(std::to_string(other.sinks)))
          .Min(0)
          .Shared(),
      SettingDecl::Real("rd-frac", c.rd_frac,
                        "fraction of prompt tokens kept as exact residual rows (0: off)")
          .Min(0)
          .Max(1)
          .Shared(),
      SettingDecl::Real("quest-keep", cquest ? 0.125 : c.quest_keep,
                        "fraction of closed pages read per query (1: the Quest gate off)")
          .Min(0, /*open=*/true)
          .Max(1)
          .Shared(),
      SettingDecl::Enum("ratchet", c.ratchet == Ratchet::kReference ? "reference" : "clean",
                        {"reference", "clean"}, "allocator ratchet")
          .Shared(),
      SettingDecl::Enum("requant", c.requant == DemotionMode::kOnce ? "once" : "cascade",
                        {"once", "cascade"}, "demotion re-encoding: from the exact row or level by "
                                             "level")
          .Shared(),
      SettingDecl::Enum("mass", c.mass == GeodesiaConfig::Mass::kExact ? "exact" : "compressed",
                        {"exact", "compressed"},
                        "source of the decode attention mass: exact = the first query over exact "
                        "keys (reference; keeps a bf16 copy of every key, charged as resident); "
                        "compressed = over the stored cache"),
      SettingDecl::Enum("candidates",
                        c.candidates == geodesia::Candidates::kReference ? "reference" : "exact",
                        {"reference", "exact"},
                        "allocator multipliers: reference = every non-hot block's later steps "
                        "(quantized blocks' too, which cannot move); exact = still-movable blocks'"),
      SettingDecl::Int("floor", c.floor,
                       "lowest block level in bits (1: centroids allowed, the reference; 2, 4 "
                       "or 8: no block below it)" + alt(std::to_string(other.floor)))
          .Min(1)
          .Max(16)
          .Constraint("a ladder level: 1, 2, 4, 8 or 16"),
      SettingDecl::Enum("predecessor", c.predecessor_exact ? "exact" : "coded",
                        {"exact", "coded"},
                        "the closed block before the query's block: exact = hot (the reference); "
                        "coded = graded like any closed block (with window <= 64 only the "
                        "query's block stays exact)" +
                            alt(other.predecessor_exact ? "exact" : "coded")),
      SettingDecl::Real("salience", c.salience,
                        "query-independent mass share mixed into every block: damage = (mass + "
                        "salience / blocks) x error (0: the reference)")
          .Min(0),
      SettingDecl::Enum("rd-score", c.rd_value_score ? "value" : "mass", {"mass", "value"},
                        "RD residual token score: mass = prefill attention x value residual^2 "
                        "(reference); value = value residual^2 alone (query-independent)"),
      SettingDecl::Real("mass-power", c.mass_power, "exponent p of the block mass").Min(0, true),
      SettingDecl::Real("value-weight", c.value_weight, "weight w_v of the value error").Min(0),
      SettingDecl::Enum("budget", c.budget_all ? "all" : "levels", {"levels", "all"},
                        "levels: the budget covers the block levels; all: residual rows and "
                        "boxes too"),
      SettingDecl::Enum("attn-math", "cache", {"cache", "f32", "int8"},
                        "arithmetic of the packed read: cache = the cache's --attn-math (int8 -> "
                        "int8, else f32), f32 exact, int8 integer dot products on the codes "
                        "(kernels/packed_attention.h)"),
  };
  return p;
}

StatusOr<GeodesiaConfig> GeodesiaConfig::FromSpec(const PolicySpec& spec, bool cquest) {
  const PolicySettings decl = GeodesiaSettings(cquest);
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(decl, spec.settings));
  // The profile's values first; the settings given explicitly override them below (a setting not
  // given reads its declared default, which is the DEFAULT profile's, hence the `given` checks).
  const bool retrieval = s.text("profile") == "retrieval";
  GeodesiaConfig c = retrieval ? RetrievalProfile(GeodesiaConfig{}) : GeodesiaConfig{};
  const GeodesiaConfig profile = c;
  auto num = [](double v) { std::ostringstream s; s << v; return s.str(); };
  c.bits = s.given("bits") || cquest ? s.Real("bits") : profile.bits;
  // The cheapest representation is every block a centroid: 2 D 16 bits per 2 * 64 * D values.
  const double centroid_bpv = 0.25;
  if (!std::isfinite(c.bits) || c.bits < centroid_bpv) {
    return InvalidArgument("--bits = " + num(c.bits) +
                           " is below the all-centroid cost of 0.25 bits/value: no allocation can "
                           "meet it (the exact residual rows of --rd-frac are charged above the "
                           "budget, never instead of it)");
  }
  if (s.given("group")) {
    const int64_t group = s.Int("group");
    if (group < 1 || group > 64 || 64 % group != 0) {
      return InvalidArgument("--group = " + std::to_string(group) +
                             " must divide the 64-token block (1, 2, 4, ..., 64)");
    }
    c.group = static_cast<int>(group);
  } else {
    c.group_auto = true;  // Bind picks it from the head dim
  }
  c.decay = s.Real("decay");
  c.window = s.given("window") ? s.Int("window") : profile.window;
  c.sinks = s.given("sinks") ? s.Int("sinks") : profile.sinks;
  c.rd_frac = s.Real("rd-frac");
  c.quest_keep = s.Real("quest-keep");
  c.ratchet = s.text("ratchet") == "clean" ? geodesia::Ratchet::kClean
                                           : geodesia::Ratchet::kReference;
  c.requant = s.text("requant") == "cascade" ? geodesia::DemotionMode::kCascade
                                             : geodesia::DemotionMode::kOnce;
  c.mass = s.text("mass") == "compressed" ? Mass::kCompressed : Mass::kExact;
  c.candidates = s.text("candidates") == "exact" ? geodesia::Candidates::kExact
                                                 : geodesia::Candidates::kReference;
  c.mass_power = s.Real("mass-power");
  const int64_t fl = s.given("floor") ? s.Int("floor") : profile.floor;
  if (geodesia::LevelIndex(static_cast<int>(fl)) < 0) {
    return InvalidArgument("--floor = " + std::to_string(fl) +
                           " is not a ladder level (1, 2, 4, 8 or 16 bits)");
  }
  c.floor = static_cast<int>(fl);
  c.predecessor_exact =
      s.given("predecessor") ? s.text("predecessor") == "exact" : profile.predecessor_exact;
  c.salience = s.Real("salience");
  c.rd_value_score = s.text("rd-score") == "value";
  c.value_weight = s.Real("value-weight");
  c.budget_all = s.text("budget") == "all";
  c.math_from_cache = s.text("attn-math") == "cache";
  c.math = s.text("attn-math") == "int8" ? geodesia::PackedMath::kInt8 : geodesia::PackedMath::kF32;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Per-layer state

struct GeodesiaPolicy::Layer {
  LayerGeometry g;
  int D = 0, G = 0, n_kv = 0;
  std::unique_ptr<GradedLayer> graded;
  std::unique_ptr<geodesia::PrefillObserver> observer;
  std::vector<geodesia::MassEma> ema;              // [n_kv]
  std::vector<int64_t> alloc_runs;                 // [n_kv] allocator runs (introspection)
  // Error proxies e(L) (ek + w_v ev) of each block at ladder indices 1..4, computed on the
  // block's representation at ladder index err_at (-1: not computed yet). [n_kv][nb]
  std::vector<std::vector<std::array<float, kNumLevels - 1>>> err;
  std::vector<std::vector<int8_t>> err_at;
  std::vector<std::vector<int64_t>> res_pos;       // [n_kv]
  bool active = false;
  bool first_query_pending = true;  // the next read is the first query of its call
  int64_t q_offset = 0;             // first query position of the current call
  int64_t released_upto = 0;        // LayerStore pages [0, released_upto) are released
  std::vector<std::vector<int64_t>> last_blocks;  // [n_q] graded blocks of the last read
  std::vector<uint16_t> kbuf, vbuf;               // [n_kv, D] append scratch
  std::vector<uint16_t> kblock, vblock;           // [n_kv, 64, D] a closing block's rows
  std::vector<std::vector<uint16_t>> exact_keys;  // mass exact: [n_kv][T * D] bf16 keys
};

// Read scratch, reused across reads and shared by the layers (a read uses it only while it runs,
// and reads of different layers never overlap: KvCache::Attend is not reentrant either). Kept per
// layer, it held every layer's chunk states at once: 14 MiB a layer at 1M tokens, 4 KV heads,
// G = 7, D = 128, i.e. 0.37 GiB of peak RSS over 28 layers.
struct GeodesiaPolicy::ReadScratch {
  StateArray chunk, tail;                         // chunk states, per-head tail
  std::vector<std::vector<float>> bm, bd;         // [n_kv][nb * G] per-block partials
  std::vector<std::vector<int64_t>> unions;       // [n_kv] blocks read
};

GeodesiaPolicy::GeodesiaPolicy(GeodesiaConfig config, std::string name)
    : c_(std::move(config)), name_(std::move(name)), scratch_(std::make_unique<ReadScratch>()) {}
GeodesiaPolicy::~GeodesiaPolicy() = default;

StatusOr<std::unique_ptr<Policy>> GeodesiaPolicy::Clone() const {
  auto c = std::make_unique<GeodesiaPolicy>(c_, name_);
  c->layers_.reserve(layers_.size());
  for (const std::unique_ptr<Layer>& L : layers_) {
    auto M = std::make_unique<Layer>();
    M->g = L->g;
    M->D = L->D;
    M->G = L->G;
    M->n_kv = L->n_kv;
    if (L->graded) M->graded = std::make_unique<GradedLayer>(L->graded->Clone());
    if (L->observer) M->observer = std::make_unique<geodesia::PrefillObserver>(*L->observer);
    M->ema = L->ema;
    M->alloc_runs = L->alloc_runs;
    M->err = L->err;
    M->err_at = L->err_at;
    M->res_pos = L->res_pos;
    M->active = L->active;
    M->first_query_pending = L->first_query_pending;
    M->q_offset = L->q_offset;
    M->released_upto = L->released_upto;
    M->last_blocks = L->last_blocks;
    M->kbuf = L->kbuf;
    M->vbuf = L->vbuf;
    M->kblock = L->kblock;
    M->vblock = L->vblock;
    M->exact_keys = L->exact_keys;
    c->layers_.push_back(std::move(M));
  }
  c->any_active_ = any_active_;
  c->stats_ = stats_;
  c->fail_next_demotion_ = fail_next_demotion_;
  return std::unique_ptr<Policy>(std::move(c));
}

Status GeodesiaPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  if (layers.empty()) return InvalidArgument(name_ + ": the model has no attention layers");
  if (c_.group_auto) {
    // The default group: the largest power of two dividing 64 and every layer's head dim.
    c_.group = kBlockTokens;
    for (const LayerGeometry& g : layers) {
      while (g.k_dim % c_.group != 0 && c_.group > 1) c_.group /= 2, c_.auto_head_dim = g.k_dim;
    }
    if (c_.auto_head_dim == 0) c_.auto_head_dim = layers[0].k_dim;
  }
  if (c_.math_from_cache) c_.math = geodesia::PackedCodesMath(layers[0].attn_math);
  layers_.clear();
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    const std::string where = LayerName(g, l) + " (" + g.ToString() + ")";
    if (g.kind != AttnKind::kGqa) {
      return InvalidArgument(name_ + " needs GQA/MHA layers (per-KV-head K/V rows); " + where +
                             " is MLA");
    }
    if (g.k_dim != g.v_dim) {
      return InvalidArgument(name_ + " needs equal key and value head dims; " + where +
                             " has k_dim " + std::to_string(g.k_dim) + " and v_dim " +
                             std::to_string(g.v_dim));
    }
    if (g.k_dim % c_.group != 0) {
      return InvalidArgument("--group = " + std::to_string(c_.group) +
                             " does not divide the head dim " + std::to_string(g.k_dim) + " of " +
                             where);
    }
    geodesia::GradedConfig gc;
    gc.n_kv_heads = g.n_kv_heads;
    gc.head_dim = g.k_dim;
    gc.group_size = c_.group;
    gc.demotion = c_.requant;
    // Boxes only feed the compressed-Quest page bound; §1.5 charges them only with the gate on, so
    // a plain Geodesia cache does not keep them (0.25 bits/value at P = 64).
    gc.boxes = c_.quest();
    // The open block is held once, in the LayerStore page that receives the rows.
    gc.external_open = !c_.graded_open_block;
    auto graded = GradedLayer::Create(gc);
    if (!graded.ok()) return graded.status().WithContext(where);
    auto L = std::make_unique<Layer>();
    L->g = g;
    L->D = g.k_dim;
    L->G = g.group_size();
    L->n_kv = g.n_kv_heads;
    L->graded = std::make_unique<GradedLayer>(std::move(graded).value());
    L->observer = std::make_unique<geodesia::PrefillObserver>(g.n_kv_heads, L->G, c_.rd_frac > 0);
    L->ema.resize(g.n_kv_heads);
    L->alloc_runs.assign(g.n_kv_heads, 0);
    L->err.resize(g.n_kv_heads);
    L->err_at.resize(g.n_kv_heads);
    L->res_pos.resize(g.n_kv_heads);
    L->last_blocks.resize(g.n_q_heads);
    // The exact keys feed only the allocator's mass: none kept when it never runs (bits >= 16).
    if (c_.mass == GeodesiaConfig::Mass::kExact && c_.allocate()) {
      L->exact_keys.resize(g.n_kv_heads);
    }
    L->kbuf.resize(static_cast<size_t>(g.n_kv_heads) * g.k_dim);
    L->vbuf.resize(static_cast<size_t>(g.n_kv_heads) * g.k_dim);
    layers_.push_back(std::move(L));
  }
  return OkStatus();
}

int64_t GeodesiaPolicy::observation_queries(int64_t prompt_len) const {
  // The prior is applied once: later prefills need no observation (and their rows may be gone).
  return any_active_ ? 0 : c_.n_obs();
}

Status GeodesiaPolicy::OnPrefillStats(int layer, const LayerStore& store,
                                      const PrefillObservation& obs) {
  Layer& L = *layers_[layer];
  if (L.active || obs.weights == nullptr) return OkStatus();
  L.observer->Add(obs);
  return OkStatus();
}

Status GeodesiaPolicy::BeginCall(int layer, const LayerStore& store, const CacheCall& call,
                                 CachePlan* plan) {
  Layer& L = *layers_[layer];
  // The call's first read is its first query: it updates the mass and runs the allocator.
  L.first_query_pending = true;
  // No read of this call sees rows of blocks before its first row's block through the
  // LayerStore (they are graded blocks), so their pages can go.
  if (L.active) ReleasePages(layer, store, call.first / kBlockTokens, plan);
  return OkStatus();
}

Status GeodesiaPolicy::OnAppend(int layer, const LayerStore& store) {
  Layer& L = *layers_[layer];
  const int64_t n = store.n_rows();
  for (int h = 0; h < static_cast<int>(L.exact_keys.size()); ++h) {
    const uint16_t* k = store.key_row(h, n - 1);
    L.exact_keys[h].insert(L.exact_keys[h].end(), k, k + L.D);
  }
  if (L.graded->config().external_open) {
    // The LayerStore page is the open block's one copy; the graded layer takes the block when it
    // closes (its page is still resident: pages go only below the running call's first row).
    if (n % kBlockTokens != 0) {
      L.graded->AppendExternal(nullptr, nullptr);
      return OkStatus();
    }
    const int64_t per_head = static_cast<int64_t>(kBlockTokens) * L.D;
    L.kblock.resize(static_cast<size_t>(L.n_kv) * per_head);
    L.vblock.resize(L.kblock.size());
    for (int h = 0; h < L.n_kv; ++h) {
      for (int t = 0; t < kBlockTokens; ++t) {
        const int64_t row = n - kBlockTokens + t;
        std::copy_n(store.key_row(h, row), L.D, L.kblock.data() + h * per_head + t * L.D);
        std::copy_n(store.val_row(h, row), L.D, L.vblock.data() + h * per_head + t * L.D);
      }
    }
    L.graded->AppendExternal(L.kblock.data(), L.vblock.data());
    return OkStatus();
  }
  for (int h = 0; h < L.n_kv; ++h) {
    std::copy_n(store.key_row(h, n - 1), L.D, L.kbuf.data() + static_cast<int64_t>(h) * L.D);
    std::copy_n(store.val_row(h, n - 1), L.D, L.vbuf.data() + static_cast<int64_t>(h) * L.D);
  }
  L.graded->Append(L.kbuf.data(), L.vbuf.data());
  return OkStatus();
}

Status GeodesiaPolicy::OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                          ThreadPool* pool) {
  if (!layers_[layer]->active) return Activate(layer, store);
  return OkStatus();
}

Status GeodesiaPolicy::Activate(int layer, const LayerStore& store) {
  Layer& L = *layers_[layer];
  const int64_t prompt_len = store.n_rows();
  const int64_t nb = (prompt_len + kBlockTokens - 1) / kBlockTokens;
  for (int h = 0; h < L.n_kv; ++h) {
    L.ema[h].SetPrior(L.observer->BlockMass(h, nb));
    const bool have_score = c_.rd_value_score || L.observer->n_rows(h) > 0;
    if (c_.rd_frac > 0 && prompt_len > 0 && have_score) {
      // rd-score value: every token weighs 1, so the value residual alone ranks them.
      const std::vector<double> score =
          c_.rd_value_score ? std::vector<double>(prompt_len, 1.0)
                            : L.observer->TokenScore(h, prompt_len);
      const std::vector<double> vres = geodesia::ValueResiduals(
          [&](int64_t j) { return store.val_row(h, j); }, prompt_len, L.D);
      geodesia::ResidualSelectOptions o;
      o.frac = c_.rd_frac;
      L.res_pos[h] = geodesia::SelectResidualTokens(score, vres, prompt_len, o);
      for (int64_t pos : L.res_pos[h]) {
        RETURN_IF_ERROR(L.graded->AddResidual(h, pos, store.key_row(h, pos),
                                              store.val_row(h, pos))
                            .WithContext("RD residual of KV head " + std::to_string(h)));
      }
    }
  }
  L.observer.reset();
  L.active = true;
  L.first_query_pending = true;
  any_active_ = true;
  return OkStatus();
}

void GeodesiaPolicy::ReleasePages(int layer, const LayerStore& store, int64_t upto_block,
                                  CachePlan* plan) {
  Layer& L = *layers_[layer];
  for (int64_t p = L.released_upto; p < upto_block; ++p) {
    for (int h = 0; h < L.n_kv; ++h) {
      if (store.page_resident(h, p)) plan->release.push_back({h, p});
    }
  }
  L.released_upto = std::max(L.released_upto, upto_block);
}

void GeodesiaPolicy::FailNextDemotionForTesting(Status s) { fail_next_demotion_ = std::move(s); }

Status GeodesiaPolicy::RunAllocator(int layer, int64_t q_offset, std::vector<char>* changed,
                                    ThreadPool* pool) {
  Layer& L = *layers_[layer];
  GradedLayer& gl = *L.graded;
  const int64_t nb = gl.n_blocks();
  if (changed) changed->assign(static_cast<size_t>(L.n_kv) * nb, 0);
  if (!c_.allocate() || nb == 0) return OkStatus();
  stats_.calls++;
  std::vector<char> hot = geodesia::HotBlocks(nb, q_offset, c_.sinks, c_.window,
                                                   c_.predecessor_exact);
  for (int64_t b = 0; b < nb; ++b) {
    if (!gl.closed(b)) hot[b] = 1;
  }
  const bool cascade = c_.requant == geodesia::DemotionMode::kCascade;
  const bool ref_cand = c_.candidates == geodesia::Candidates::kReference;
  const auto beta = geodesia::LadderBits(L.D, c_.group);
  // Error proxies of the blocks that can move and have none for their current representation.
  std::vector<std::pair<int, int64_t>> todo;
  for (int h = 0; h < L.n_kv; ++h) {
    L.err[h].resize(nb);
    L.err_at[h].resize(nb, -1);
    for (int64_t b = 0; b < nb; ++b) {
      const int idx = geodesia::LevelIndex(gl.level(h, b));
      // Reference candidates also list the later steps of quantized blocks that can no longer
      // move (requant once): they need the proxies of their quantized data too.
      const bool listed = !hot[b] && idx < kNumLevels - 1 &&
                          (cascade || idx == 0 || ref_cand);
      if (listed && L.err_at[h][b] != idx) todo.push_back({h, b});
    }
  }
  const bool with_v = c_.value_weight > 0;
  ParallelForEach(pool, static_cast<int64_t>(todo.size()), [&](int64_t i, int) {
    const auto [h, b] = todo[i];
    std::vector<double> k(static_cast<size_t>(kBlockTokens) * L.D), v(k.size());
    gl.Reconstruct(h, b, k.data(), v.data());
    const geodesia::BlockErrors e =
        geodesia::ComputeBlockErrors(k.data(), v.data(), gl.n_valid(b), L.D, c_.group, with_v);
    for (int li = 1; li < kNumLevels; ++li) {
      L.err[h][b][li - 1] = static_cast<float>(e.ek[li] + c_.value_weight * e.ev[li]);
    }
    L.err_at[h][b] = static_cast<int8_t>(geodesia::LevelIndex(gl.level(h, b)));
  });
  geodesia::AllocatorOptions ao;
  ao.mass_power = c_.mass_power;
  ao.ratchet = c_.ratchet;
  ao.cascade = cascade;
  ao.candidates = c_.candidates;
  ao.max_index = geodesia::LevelIndex(c_.floor);
  std::vector<AllocBlock> blocks(nb);
  for (int h = 0; h < L.n_kv; ++h) {
    for (int64_t b = 0; b < nb; ++b) {
      AllocBlock& a = blocks[b];
      a.index = geodesia::LevelIndex(gl.level(h, b));
      a.hot = hot[b] != 0;
      a.mass = L.ema[h].mass(b) + c_.salience / static_cast<double>(nb);
      a.err = {};
      if (L.err_at[h][b] == a.index) {
        // Cascade: e(current) = 0, the marginal error of a re-encode is measured from what is
        // stored. Once (the reference): a quantized block's own level has its proxy on the
        // quantized data (§2.3 on the current reconstruction); its steps are candidates only.
        const int from = cascade ? a.index + 1 : std::max(a.index, 1);
        for (int li = from; li < kNumLevels; ++li) a.err[li] = L.err[h][b][li - 1];
      }
    }
    double target = c_.bits * 2.0 * static_cast<double>(nb) * kBlockTokens * L.D;
    if (c_.budget_all) {
      target -= 32.0 * L.D * static_cast<double>(gl.n_residual(h));   // residual rows
      if (gl.has_boxes()) target -= 32.0 * L.D * static_cast<double>(nb);  // boxes
    }
    const geodesia::AllocResult r = geodesia::Allocate(blocks, beta, target, ao);
    L.alloc_runs[h]++;
    for (int64_t b = 0; b < nb; ++b) {
      if (r.index[b] == blocks[b].index) continue;
      Status st = gl.Demote(h, b, kLevels[r.index[b]]);
      if (st.ok() && !fail_next_demotion_.ok()) st = std::exchange(fail_next_demotion_, Status());
      if (!st.ok()) {
        return st.WithContext("demotion of block " + std::to_string(b) + " (rows [" +
                              std::to_string(b * kBlockTokens) + ", " +
                              std::to_string((b + 1) * kBlockTokens) + ")) of KV head " +
                              std::to_string(h) + " to " + std::to_string(kLevels[r.index[b]]) +
                              " bits");
      }
      stats_.demotions++;
      L.err_at[h][b] = -1;
      if (changed) (*changed)[static_cast<size_t>(h) * nb + b] = 1;
    }
  }
  return OkStatus();
}

Status GeodesiaPolicy::Maintain(int layer, int64_t n_rows, ThreadPool* pool) {
  Layer& L = *layers_[layer];
  STRATA_CHECK_MSG(L.active, "Maintain before the first compression point (layer %d)", layer);
  STRATA_CHECK(n_rows == L.graded->n_tokens());
  if (n_rows == 0) return OkStatus();
  return RunAllocator(layer, n_rows - 1, nullptr, pool);
}

bool GeodesiaPolicy::ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit,
                                     int m, ReadStats* stats) {
  if (layers_[layer]->active) return false;  // Read's only dense branch
  CountDenseReads(store.geometry(), first_limit, m, stats);
  return true;
}

Status GeodesiaPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                            ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  Layer& L = *layers_[layer];
  if (!L.active) {
    ReadPrefix(store, q, limit, pool, st, stats);
    return OkStatus();
  }
  GradedLayer& gl = *L.graded;
  const int G = L.G, D = L.D, n_kv = L.n_kv;
  const float scale = L.g.scale;
  const bool first = L.first_query_pending;
  L.first_query_pending = false;
  if (first) L.q_offset = limit - 1;
  const int64_t q_offset = std::min(L.q_offset, limit - 1);
  const int64_t n_full = limit / kBlockTokens;  // graded blocks [0, n_full) lie below limit
  const int64_t tail_begin = n_full * kBlockTokens;
  const int64_t tail_n = limit - tail_begin;    // exact rows read from the LayerStore
  if (tail_n > 0 && !store.page_resident(0, n_full)) {
    return OutOfRange(name_ + ": a query at position " + std::to_string(limit - 1) +
                      " reads the exact rows [" + std::to_string(tail_begin) + ", " +
                      std::to_string(limit) + "), whose page was released when a later call " +
                      "began (queries sit at or after the running call's first row)");
  }
  const bool quest = c_.quest();
  const bool need_mass = first && c_.allocate();

  // Blocks each query head reads, and their union per KV head.
  ReadScratch& sc = *scratch_;
  std::vector<std::vector<int64_t>>& unions = sc.unions;
  unions.resize(n_kv);
  for (auto& u : unions) u.clear();
  std::vector<std::vector<char>> selected;  // quest: [n_q][n_full] per head membership
  if (quest) {
    const int64_t n_cand = std::min(q_offset / kBlockTokens, n_full);
    selected.assign(static_cast<size_t>(n_kv) * G, std::vector<char>(n_full, 0));
    // Per KV head (in parallel): every page's box read once for the group's heads.
    ParallelForEach(pool, n_kv, [&](int64_t hh, int) {
      const int h = static_cast<int>(hh);
      std::vector<std::vector<int64_t>> sels;
      geodesia::SelectPagesGroup(gl, h, q + static_cast<int64_t>(h) * G * D, G, scale, n_cand,
                                 c_.quest_keep, &sels);
      std::vector<char> any(n_full, 0);
      for (int r = 0; r < G; ++r) {
        const int qh = h * G + r;
        std::vector<int64_t>& sel = sels[r];
        for (int64_t b = n_cand; b < n_full; ++b) sel.push_back(b);  // current page(s)
        for (int64_t b : sel) selected[qh][b] = any[b] = 1;
        L.last_blocks[qh] = std::move(sel);
      }
      for (int64_t b = 0; b < n_full; ++b) {
        if (any[b]) unions[h].push_back(b);
      }
    });
  } else {
    for (int h = 0; h < n_kv; ++h) {
      unions[h].resize(n_full);
      for (int64_t b = 0; b < n_full; ++b) unions[h][b] = b;
    }
    for (int qh = 0; qh < n_kv * G; ++qh) L.last_blocks[qh] = unions[qh / G];
  }

  // Units of work: (KV head, chunk of its union list).
  struct Task {
    int h;
    int64_t begin, end;  // positions in unions[h]
  };
  std::vector<Task> tasks;
  for (int h = 0; h < n_kv; ++h) {
    const int64_t n = static_cast<int64_t>(unions[h].size());
    for (int64_t b = 0; b < n; b += kChunkBlocks) {
      tasks.push_back({h, b, std::min(n, b + kChunkBlocks)});
    }
  }
  StateArray& chunk = sc.chunk;
  chunk.Resize(static_cast<int64_t>(tasks.size()), G, D);
  StateArray& tail = sc.tail;
  tail.Resize(n_kv, G, D);
  const int64_t nb_all = gl.n_blocks();
  // Per-block partials of the first query (for the mass): [n_kv][nb_all * G].
  std::vector<std::vector<float>>& bm = sc.bm;
  std::vector<std::vector<float>>& bd = sc.bd;
  if (need_mass) {
    bm.resize(n_kv);
    bd.resize(n_kv);
    for (int h = 0; h < n_kv; ++h) {
      bm[h].assign(static_cast<size_t>(nb_all) * G, -INFINITY);
      bd[h].assign(static_cast<size_t>(nb_all) * G, 0.f);
    }
  }

  auto run_task = [&](int64_t ti, int /*worker*/, bool record) {
    const Task& t = tasks[ti];
    const geodesia::PackedHeadView view = gl.view(t.h);
    const float* qh = q + static_cast<int64_t>(t.h) * G * D;
    SoftmaxStates cs = chunk.at(ti);
    cs.Reset();
    const int64_t* list = unions[t.h].data();
    if (!quest && !record) {
      geodesia::PackedAttend(view, qh, G, scale, list + t.begin, t.end - t.begin, &cs, nullptr,
                             c_.math);
      return;
    }
    // One pass over the chunk: heads take only their selected blocks; the first query also
    // records every block's own state per head (for the mass).
    const int64_t n = t.end - t.begin;
    std::vector<uint8_t> sel;
    std::vector<float> blk_m, blk_d;
    geodesia::PackedBlockIO io;
    if (quest) {
      sel.resize(static_cast<size_t>(n) * G);
      for (int64_t i = 0; i < n; ++i) {
        for (int r = 0; r < G; ++r) sel[i * G + r] = selected[t.h * G + r][list[t.begin + i]];
      }
      io.head_sel = sel.data();
    }
    if (record) {
      blk_m.resize(static_cast<size_t>(n) * G);
      blk_d.resize(static_cast<size_t>(n) * G);
      io.block_m = blk_m.data();
      io.block_d = blk_d.data();
    }
    geodesia::PackedAttend(view, qh, G, scale, list + t.begin, n, &cs, &io, c_.math);
    if (record) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = list[t.begin + i];
        for (int r = 0; r < G; ++r) {
          bm[t.h][b * G + r] = blk_m[i * G + r];
          bd[t.h][b * G + r] = blk_d[i * G + r];
        }
      }
    }
  };
  // Compressed mass: the first query's own pass records every block's partials. Exact mass:
  // the partials come from the exact keys below, and the pass only attends.
  const bool exact_mass = need_mass && c_.mass == GeodesiaConfig::Mass::kExact;
  ParallelForEach(pool, static_cast<int64_t>(tasks.size()),
                  [&](int64_t ti, int w) { run_task(ti, w, need_mass && !exact_mass); });
  if (exact_mass) {
    // Per KV head and block: each query head's max score and sum of exp over the block's exact
    // keys (f32 scores, as the kernels), for BlockMassFromStates below.
    ParallelForEach(pool, static_cast<int64_t>(n_kv) * n_full, [&](int64_t i, int) {
      const int h = static_cast<int>(i / n_full);
      const int64_t b = i % n_full;
      const uint16_t* keys = L.exact_keys[h].data() + b * kBlockTokens * D;
      const int nv = gl.n_valid(b);
      std::vector<float> s(nv);
      for (int r = 0; r < G; ++r) {
        const float* qr = q + (static_cast<int64_t>(h) * G + r) * D;
        float mx = -INFINITY;
        for (int t = 0; t < nv; ++t) {
          float dot = 0;
          for (int c = 0; c < D; ++c) dot += qr[c] * Bf16ToF32(keys[t * D + c]);
          s[t] = dot * scale;
          mx = std::max(mx, s[t]);
        }
        double z = 0;
        for (int t = 0; t < nv; ++t) z += std::exp(static_cast<double>(s[t] - mx));
        bm[h][b * G + r] = mx;
        bd[h][b * G + r] = static_cast<float>(z);
      }
    });
  }
  for (int h = 0; h < n_kv; ++h) {
    SoftmaxStates ts = tail.at(h);
    ts.Reset();
    if (tail_n > 0) {
      AttendStream(q + static_cast<int64_t>(h) * G * D, G, scale, store.PageView(h, n_full),
                   nullptr, tail_n, &ts);
      if (need_mass) {
        for (int r = 0; r < G; ++r) {
          bm[h][n_full * G + r] = ts.m[r];
          bd[h][n_full * G + r] = ts.d[r];
        }
      }
    }
  }

  if (need_mass) {
    for (int h = 0; h < n_kv; ++h) {
      L.ema[h].Update(geodesia::BlockMassFromStates(bm[h].data(), bd[h].data(), nb_all, G),
                      c_.decay);
    }
    std::vector<char> changed;
    RETURN_IF_ERROR(RunAllocator(layer, L.q_offset, &changed, pool));
    std::vector<int64_t> redo;
    for (int64_t ti = 0; ti < static_cast<int64_t>(tasks.size()); ++ti) {
      const Task& t = tasks[ti];
      for (int64_t i = t.begin; i < t.end; ++i) {
        if (changed[static_cast<size_t>(t.h) * nb_all + unions[t.h][i]]) {
          redo.push_back(ti);
          break;
        }
      }
    }
    ParallelForEach(pool, static_cast<int64_t>(redo.size()),
                    [&](int64_t i, int w) { run_task(redo[i], w, false); });
  }

  // Merge in a fixed order: chunks of each head, then its exact tail.
  for (int64_t ti = 0; ti < static_cast<int64_t>(tasks.size()); ++ti) {
    SoftmaxStates dst = HeadSlice(*st, tasks[ti].h * G, G);
    MergeStates(&dst, chunk.at(ti));
  }
  for (int h = 0; h < n_kv; ++h) {
    SoftmaxStates dst = HeadSlice(*st, h * G, G);
    MergeStates(&dst, tail.at(h));
  }

  // Accounting: the engine's bytes, and the reference per-query-head bits (§1.5).
  const int64_t nb = gl.n_blocks();
  const int64_t box_bytes = quest ? nb * 2 * D * 2 : 0;
  const auto beta = geodesia::LadderBits(D, c_.group);
  const double values = 2.0 * static_cast<double>(limit) * D;
  for (int h = 0; h < n_kv; ++h) {
    const geodesia::PackedHeadView view = gl.view(h);
    const int64_t packed = geodesia::PackedReadBytes(view, unions[h].data(),
                                                     static_cast<int64_t>(unions[h].size()));
    const int64_t bytes = packed + tail_n * 2 * D * 2 + box_bytes;
    int64_t rows = tail_n;
    for (int64_t b : unions[h]) rows += gl.n_valid(b);
    if (stats) {
      stats->bytes_read += bytes;
      stats->rows_attended += rows;
    }
    const double resident = static_cast<double>(geodesia::ResidentBitsClosedForm(
        gl.level_histogram(h), gl.n_residual(h), D, c_.group, quest));
    stats_.values += G * values;
    stats_.resident_bits += G * resident;
    stats_.read_bits_union += G * 8.0 * static_cast<double>(bytes);
    for (int r = 0; r < G; ++r) {
      if (!quest) {
        stats_.read_bits += resident;
        continue;
      }
      double bits = static_cast<double>(nb) * 32 * D;
      for (int64_t b : L.last_blocks[h * G + r]) {
        bits += static_cast<double>(beta[geodesia::LevelIndex(gl.level(h, b))]);
        if (view.res_mask) bits += 32.0 * D * std::popcount(view.res_mask[b]);
      }
      if (tail_n > 0) bits += static_cast<double>(beta[0]);  // the current block, charged exact
      stats_.read_bits += bits;
    }
  }
  return OkStatus();
}

int64_t GeodesiaPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  const Layer& L = *layers_[layer];
  int64_t exact_keys = 0;
  for (const auto& k : L.exact_keys) exact_keys += static_cast<int64_t>(k.size()) * 2;
  return store.resident_bytes() + L.graded->resident_bytes().total() + exact_keys;
}

PolicySummary GeodesiaPolicy::Summary(int layer, const LayerStore& store) const {
  const Layer& L = *layers_[layer];
  const GradedLayer& gl = *L.graded;
  PolicySummary s = Policy::Summary(layer, store);
  s.blocks_closed = gl.n_closed_blocks() * L.n_kv;
  int64_t demoted = 0;
  for (int h = 0; h < L.n_kv; ++h) {
    const auto hist = gl.level_histogram(h);
    for (int i = 1; i < geodesia::kNumLevels; ++i) demoted += hist[i];
  }
  bool skipped = false;  // the Quest gate left out a closed block at the last read
  if (c_.quest()) {
    for (const auto& blocks : L.last_blocks) {
      skipped = skipped || static_cast<int64_t>(blocks.size()) < gl.n_closed_blocks();
    }
  }
  s.compressed = L.active && (demoted > 0 || skipped);
  // What the budget covers (the block levels, or with `budget all` residual rows and boxes too),
  // so a run that cannot meet it (short contexts: the exact hot blocks dominate) is reported.
  s.budget_bits = c_.bits;
  if (L.active) {
    const geodesia::ResidentBytes rb = gl.resident_bytes();
    int64_t bytes = c_.budget_all ? rb.total() : rb.payload + rb.scales;
    // The open block, held by the LayerStore, is charged exact like every level-16 block.
    if (gl.config().external_open && gl.has_open_block()) {
      bytes += static_cast<int64_t>(L.n_kv) * geodesia::LevelBlockBits(16, L.D, c_.group) / 8;
    }
    s.budget_values = gl.n_tokens() * L.n_kv * 2 * L.D;
    s.budget_bits_used = 8.0 * static_cast<double>(bytes);
  }
  if (!L.active) {
    s.note = "no compression point yet (the prefill is exact)";
  } else if (!s.compressed) {
    s.note = std::string("no block below 16 bits") +
             (c_.quest() ? " and the Quest gate read every block" : "");
  }
  return s;
}

bool GeodesiaPolicy::BlockLevels(int layer, std::vector<int>* levels,
                                 std::vector<std::vector<int>>* per_head) const {
  const GradedLayer& gl = *layers_[layer]->graded;
  levels->assign(kLevels.begin(), kLevels.end());
  per_head->assign(gl.n_kv_heads(), {});
  for (int h = 0; h < gl.n_kv_heads(); ++h) {
    (*per_head)[h].resize(gl.n_blocks());
    for (int64_t b = 0; b < gl.n_blocks(); ++b) (*per_head)[h][b] = gl.level(h, b);
  }
  return true;
}

bool GeodesiaPolicy::active(int layer) const { return layers_[layer]->active; }
const GradedLayer& GeodesiaPolicy::graded(int layer) const { return *layers_[layer]->graded; }
const std::vector<double>& GeodesiaPolicy::mass(int layer, int h) const {
  return layers_[layer]->ema[h].mass();
}
const std::vector<int64_t>& GeodesiaPolicy::residual_positions(int layer, int h) const {
  return layers_[layer]->res_pos[h];
}
int64_t GeodesiaPolicy::allocator_runs(int layer, int h) const {
  return layers_[layer]->alloc_runs[h];
}
const std::vector<int64_t>& GeodesiaPolicy::last_read_blocks(int layer, int r) const {
  return layers_[layer]->last_blocks[r];
}

StatusOr<std::unique_ptr<Policy>> MakeGeodesiaPolicy(const PolicySpec& spec, bool cquest) {
  ASSIGN_OR_RETURN(GeodesiaConfig c, GeodesiaConfig::FromSpec(spec, cquest));
  return std::unique_ptr<Policy>(new GeodesiaPolicy(std::move(c), cquest ? "cquest" : "geodesia"));
}

}  // namespace strata
