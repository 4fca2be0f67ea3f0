#include "kv/baselines/turboquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/baselines/dequant_read.h"
#include "kv/baselines/llamacpp_kv.h"

namespace strata::baselines {

namespace {

double Pdf(double x) { return std::isinf(x) ? 0.0 : std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double Cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

std::vector<double> ComputeLloydMax(int levels) {
  STRATA_CHECK(levels >= 2);
  std::vector<double> c(levels), t(levels + 1);
  for (int i = 0; i < levels; ++i) c[i] = -2.5 + 5.0 * (i + 0.5) / levels;
  const double inf = std::numeric_limits<double>::infinity();
  for (int it = 0; it < 1000000; ++it) {
    t[0] = -inf;
    t[levels] = inf;
    for (int i = 1; i < levels; ++i) t[i] = 0.5 * (c[i - 1] + c[i]);
    double moved = 0;
    for (int i = 0; i < levels; ++i) {
      // The centroid of the cell: E[Z | t_i < Z < t_(i+1)] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)).
      const double nc = (Pdf(t[i]) - Pdf(t[i + 1])) / (Cdf(t[i + 1]) - Cdf(t[i]));
      moved = std::max(moved, std::abs(nc - c[i]));
      c[i] = nc;
    }
    if (moved < 1e-10) break;
  }
  return c;
}

// Centroids as f32 and the f32 cell boundaries (midpoints) of bits 2, 3, 4.
struct Table {
  std::vector<float> c, t;
};
const Table& TableFor(int bits) {
  STRATA_CHECK(bits >= 2 && bits <= 4);
  static const std::vector<Table> tables = [] {
    std::vector<Table> out(3);
    for (int b = 2; b <= 4; ++b) {
      const std::vector<double>& c = LloydMaxGaussian(1 << b);
      Table& T = out[b - 2];
      for (double x : c) T.c.push_back(static_cast<float>(x));
      for (size_t i = 1; i < c.size(); ++i) {
        T.t.push_back(static_cast<float>(0.5 * (c[i - 1] + c[i])));
      }
    }
    return out;
  }();
  return tables[bits - 2];
}

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

const std::vector<double>& LloydMaxGaussian(int levels) {
  static std::mutex mu;
  static std::map<int, std::vector<double>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(levels);
  if (it == cache.end()) it = cache.emplace(levels, ComputeLloydMax(levels)).first;
  return it->second;
}

double LloydMaxDistortion(int levels) {
  const std::vector<double>& c = LloydMaxGaussian(levels);
  const double inf = std::numeric_limits<double>::infinity();
  double mse = 0;
  for (int i = 0; i < levels; ++i) {
    const double a = i == 0 ? -inf : 0.5 * (c[i - 1] + c[i]);
    const double b = i + 1 == levels ? inf : 0.5 * (c[i] + c[i + 1]);
    const double p = Cdf(b) - Cdf(a);
    const double m1 = Pdf(a) - Pdf(b);  // integral of z pdf
    const double apa = std::isinf(a) ? 0.0 : a * Pdf(a), bpb = std::isinf(b) ? 0.0 : b * Pdf(b);
    const double m2 = p + apa - bpb;  // integral of z^2 pdf
    mse += m2 - 2 * c[i] * m1 + c[i] * c[i] * p;
  }
  return mse;
}

SignedHadamard::SignedHadamard(int dim, int block) : sign_(dim), block_(block) {
  STRATA_CHECK(dim >= 1 && block >= 1 && dim % block == 0 && (block & (block - 1)) == 0);
  uint64_t s = 0x547572626f517561ull ^ static_cast<uint64_t>(dim);
  for (int i = 0; i < dim; ++i) sign_[i] = (SplitMix(&s) >> 63) ? -1.f : 1.f;
}

void SignedHadamard::Rotate(float* x) const {
  for (int i = 0; i < dim(); ++i) x[i] *= sign_[i];
  HadamardBlocks(x, dim(), block_);
}

void SignedHadamard::Unrotate(float* x) const { Unrotate(x, dim()); }

void SignedHadamard::Unrotate(float* x, int n) const {
  HadamardBlocks(x, n, block_);
  for (int i = 0; i < n; ++i) x[i] *= sign_[i];
}

void SignedHadamard::Rotate(double* x) const {
  for (int i = 0; i < dim(); ++i) x[i] *= sign_[i];
  HadamardBlocks(x, dim(), block_);
}

void SignedHadamard::Unrotate(double* x) const {
  HadamardBlocks(x, dim(), block_);
  for (int i = 0; i < dim(); ++i) x[i] *= sign_[i];
}

void PackBits(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>((n * bits + 7) / 8));
  int64_t bit = 0;
  for (int64_t i = 0; i < n; ++i, bit += bits) {
    const uint32_t c = codes[i];
    out[bit >> 3] |= static_cast<uint8_t>(c << (bit & 7));
    if ((bit & 7) + bits > 8) out[(bit >> 3) + 1] |= static_cast<uint8_t>(c >> (8 - (bit & 7)));
  }
}

void UnpackBits(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  const uint32_t mask = (1u << bits) - 1;
  int64_t bit = 0;
  for (int64_t i = 0; i < n; ++i, bit += bits) {
    uint32_t w = packed[bit >> 3];
    if ((bit & 7) + bits > 8) w |= static_cast<uint32_t>(packed[(bit >> 3) + 1]) << 8;
    codes[i] = static_cast<uint8_t>((w >> (bit & 7)) & mask);
  }
}

void TurboRowCodec::Encode(const float* y, float norm, uint8_t* out) const {
  thread_local std::vector<uint8_t> codes;
  codes.resize(dim);
  uint16_t head;
  if (bits == 8) {
    float amax = 0;
    for (int i = 0; i < dim; ++i) amax = std::max(amax, std::abs(y[i]));
    head = F32ToF16(std::min(amax / 127.f, 65504.f));
    const float d = F16ToF32(head);
    const float id = d > 0 ? 1.f / d : 0.f;
    for (int i = 0; i < dim; ++i) {
      const float c = std::clamp(std::nearbyint(y[i] * id), -127.f, 127.f);
      codes[i] = static_cast<uint8_t>(static_cast<int>(c) + 128);
    }
  } else {
    head = F32ToF16(std::min(norm, 65504.f));
    const Table& T = TableFor(bits);
    const float s = norm > 0 ? std::sqrt(static_cast<float>(dim)) / norm : 0.f;
    for (int i = 0; i < dim; ++i) {
      const float z = y[i] * s;
      // The nearest centroid: the number of cell boundaries below z.
      codes[i] = static_cast<uint8_t>(std::upper_bound(T.t.begin(), T.t.end(), z) - T.t.begin());
    }
  }
  std::memcpy(out, &head, 2);
  PackBits(codes.data(), dim, bits, out + 2);
}

void TurboRowCodec::Decode(const uint8_t* in, float* y) const {
  thread_local std::vector<uint8_t> codes;
  codes.resize(dim);
  uint16_t head;
  std::memcpy(&head, in, 2);
  const float h = F16ToF32(head);
  UnpackBits(in + 2, dim, bits, codes.data());
  if (bits == 8) {
    for (int i = 0; i < dim; ++i) y[i] = h * static_cast<float>(static_cast<int>(codes[i]) - 128);
    return;
  }
  const Table& T = TableFor(bits);
  float f = h / std::sqrt(static_cast<float>(dim));
  if (norm_correction) {
    float cc = 0;
    for (int i = 0; i < dim; ++i) cc += T.c[codes[i]] * T.c[codes[i]];
    f = cc > 0 ? h / std::sqrt(cc) : 0.f;
  }
  for (int i = 0; i < dim; ++i) y[i] = T.c[codes[i]] * f;
}

std::string TurboQuantPolicy::describe() const {
  std::string s = "turboquant (preset " + c_.preset + ": keys " + std::to_string(c_.key_bits) +
                  " bits, values " + std::to_string(c_.value_bits) + " bits" +
                  (c_.norm_correction ? ", norm correction" : "");
  if (!layers_.empty()) {
    const Layer& L = layers_[layers_.size() / 2];
    s += ", Hadamard blocks K " + std::to_string(L.rk.block());
    if (!L.mla) s += " / V " + std::to_string(L.rv.block());
  }
  s += ", recent " + std::to_string(c_.recent);
  if (c_.boundary_layers > 0) s += ", boundary layers " + std::to_string(c_.boundary_layers);
  return s + ")";
}

Status TurboQuantPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  const int n = static_cast<int>(layers.size());
  const int edge = std::min(c_.boundary_layers, n / 2);
  for (int l = 0; l < n; ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.mla = L.g.kind == AttnKind::kMla;
    if (L.g.k_dim < 1 || L.g.v_dim < 1 || (L.mla && L.g.v_dim > L.g.k_dim)) {
      return InvalidArgument("policy 'turboquant': layer " + std::to_string(l) +
                             " has head dims k " + std::to_string(L.g.k_dim) + ", v " +
                             std::to_string(L.g.v_dim));
    }
    L.exact = l < edge || l >= n - edge;
    if (L.mla) {
      L.rk = SignedHadamard(L.g.k_dim, LargestPow2Divisor(std::gcd(L.g.k_dim, L.g.v_dim)));
      L.rv = L.rk;
    } else {
      L.rk = SignedHadamard(L.g.k_dim, LargestPow2Divisor(L.g.k_dim));
      L.rv = SignedHadamard(L.g.v_dim, LargestPow2Divisor(L.g.v_dim));
    }
    L.ck = TurboRowCodec{L.g.k_dim, c_.key_bits, c_.norm_correction};
    L.cv = TurboRowCodec{L.g.v_dim, c_.value_bits, c_.norm_correction};
    L.n_rows = 0;
    L.exact_from = 0;
    L.k.clear();
    L.v.clear();
  }
  return OkStatus();
}

int64_t TurboQuantPolicy::RowBytes(int layer) const {
  const Layer& L = layers_[layer];
  return L.g.n_kv_heads * (L.ck.bytes() + (L.mla ? 0 : L.cv.bytes()));
}

Status TurboQuantPolicy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                                    CachePlan* plan, ThreadPool* pool) {
  Layer& L = layers_[layer];
  if (L.exact) return OkStatus();
  const int64_t r0 = L.n_rows, r1 = store.n_rows();
  const int n_h = L.g.n_kv_heads;
  const int D = L.g.k_dim, DV = L.g.v_dim;
  const int64_t kb = L.ck.bytes(), vb = L.cv.bytes();
  if (r1 > r0) {
    L.k.resize(static_cast<size_t>(r1 * n_h * kb));
    if (!L.mla) L.v.resize(static_cast<size_t>(r1 * n_h * vb));
    // Each row's task writes only its own bytes: the same bytes on any number of threads.
    ParallelForOrInline(pool, r1 - r0, 8, [&](int64_t b, int64_t e, int) {
      std::vector<float> x(std::max(D, DV));
      auto code = [&](const uint16_t* row, int dim, const SignedHadamard& R,
                      const TurboRowCodec& C, uint8_t* out) {
        double ss = 0;
        for (int c = 0; c < dim; ++c) {
          x[c] = Bf16ToF32(row[c]);
          ss += static_cast<double>(x[c]) * x[c];
        }
        R.Rotate(x.data());
        C.Encode(x.data(), static_cast<float>(std::sqrt(ss)), out);
      };
      for (int64_t u = r0 + b; u < r0 + e; ++u) {
        for (int h = 0; h < n_h; ++h) {
          code(store.key_row(h, u), D, L.rk, L.ck, L.k.data() + (u * n_h + h) * kb);
          if (!L.mla) code(store.val_row(h, u), DV, L.rv, L.cv, L.v.data() + (u * n_h + h) * vb);
        }
      }
    });
    L.n_rows = r1;
  }
  const int64_t b = call.kind == CallKind::kPrefill ? call.first : call.end;
  L.exact_from = std::min(r1, std::max<int64_t>(0, b - c_.recent));
  // Pages wholly before E and before the call's first row are read by no later query.
  const int64_t upto = std::min(L.exact_from, call.first);
  for (int64_t p = 0; (p + 1) * LayerStore::kPageRows <= upto; ++p) {
    for (int h = 0; h < n_h; ++h) {
      if (store.page_resident(h, p)) plan->release.push_back({h, p});
    }
  }
  return OkStatus();
}

void TurboQuantPolicy::DecodeRows(const Layer& L, int h, int64_t u0, int64_t n, float* kt,
                                  float* vt) const {
  const int n_h = L.g.n_kv_heads;
  const int D = L.g.k_dim, DV = L.g.v_dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t u = u0 + i;
    L.ck.Decode(L.k.data() + (u * n_h + h) * L.ck.bytes(), kt + i * D);
    if (vt == nullptr) continue;
    if (L.mla) {
      std::copy_n(kt + i * D, DV, vt + i * DV);
    } else {
      L.cv.Decode(L.v.data() + (u * n_h + h) * L.cv.bytes(), vt + i * DV);
    }
  }
}

Status TurboQuantPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                              ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  const Layer& L = layers_[layer];
  const LayerGeometry& g = L.g;
  if (L.exact) {
    ReadPrefix(store, q, limit, pool, st, stats);
    return OkStatus();
  }
  if (limit > L.n_rows) {
    return Internal("turboquant: a read of rows [0, " + std::to_string(limit) + ") of layer " +
                    std::to_string(layer) + " before they were coded (" +
                    std::to_string(L.n_rows) + " rows held)");
  }
  const int64_t qe = std::min(limit, L.exact_from);
  if (qe < limit) {
    if (!store.page_resident(0, qe / LayerStore::kPageRows)) {
      return OutOfRange("turboquant: a query at position " + std::to_string(limit - 1) +
                        " needs the exact rows [" + std::to_string(qe) + ", " +
                        std::to_string(limit) + "), whose page was released when a later call " +
                        "began");
    }
    std::vector<int64_t> rows(limit - qe);
    std::iota(rows.begin(), rows.end(), qe);
    ReadRows(store, q, rows.data(), static_cast<int64_t>(rows.size()), pool, st, stats);
  }
  if (qe == 0) return OkStatus();
  const int D = g.k_dim, DV = g.v_dim;
  // The query rotated once per head: q.k = (H S q).(H S k).
  std::vector<float> qr(q, q + static_cast<int64_t>(g.n_q_heads) * D);
  for (int hq = 0; hq < g.n_q_heads; ++hq) L.rk.Rotate(qr.data() + static_cast<int64_t>(hq) * D);
  SoftmaxStateBuffer part(g.n_q_heads, DV);
  part.states().Reset();
  AttendRowRange(g, qr.data(), 0, qe, pool, &part.states(),
                 [&](int h, int64_t u0, int64_t n, float* kt, float* vt) {
                   DecodeRows(L, h, u0, n, kt, vt);
                 });
  // The weighted sum of rotated values un-rotated once per head: S H^T.
  for (int hq = 0; hq < g.n_q_heads; ++hq) {
    float* o = part.states().o + static_cast<int64_t>(hq) * DV;
    if (L.mla) {
      L.rk.Unrotate(o, DV);
    } else {
      L.rv.Unrotate(o);
    }
  }
  MergeStates(st, part.states());
  if (stats) {
    stats->rows_attended += qe * g.n_kv_heads;
    stats->bytes_read += qe * RowBytes(layer);
  }
  return OkStatus();
}

bool TurboQuantPolicy::ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit,
                                        int m, ReadStats* stats, StagedPrefixPlan* plan) {
  const Layer& L = layers_[layer];
  if (L.exact || first_limit + m - 1 > L.n_rows) return false;
  plan->unit = 1;
  plan->cap = L.exact_from;
  const int64_t b0 = plan->Split(first_limit);
  if (b0 < first_limit && !store.page_resident(0, b0 / LayerStore::kPageRows)) return false;
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // as Read counts
    const int64_t b = plan->Split(limit);
    stats->rows_attended += limit * L.g.n_kv_heads;
    stats->bytes_read += b * RowBytes(layer) + (limit - b) * L.g.bytes_per_token();
  }
  return true;
}

void TurboQuantPolicy::StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                                       float* values) const {
  const Layer& L = layers_[layer];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  STRATA_CHECK(s0 >= 0 && s0 + sn <= L.n_rows);
  std::vector<float> vt(DV);
  for (int64_t i = 0; i < sn; ++i) {
    float* k = keys + i * D;
    DecodeRows(L, h, s0 + i, 1, k, L.mla ? nullptr : vt.data());
    // Un-rotated rows: q.(S H^T k^) = (H S q).k^, what Read computes, up to f32 rounding.
    L.rk.Unrotate(k);
    if (values == nullptr) continue;
    float* v = values + i * DV;
    if (L.mla) {
      std::copy_n(k, DV, v);  // the blocks divide v_dim: the same un-rotated columns
    } else {
      std::copy_n(vt.data(), DV, v);
      L.rv.Unrotate(v);
    }
  }
}

void TurboQuantPolicy::RowAsRead(int layer, const LayerStore& store, int h, int64_t u,
                                 float* key, float* value) const {
  const Layer& L = layers_[layer];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  if (L.exact || u >= L.exact_from) {
    const uint16_t* k = store.key_row(h, u);
    for (int c = 0; c < D; ++c) key[c] = Bf16ToF32(k[c]);
    if (value) {
      const uint16_t* v = store.val_row(h, u);
      for (int c = 0; c < DV; ++c) value[c] = Bf16ToF32(v[c]);
    }
    return;
  }
  StagePrefixRows(layer, h, u, 1, key, value);
}

int64_t TurboQuantPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  return store.resident_bytes() + layers_[layer].n_rows * RowBytes(layer);
}

int64_t TurboQuantPolicy::PeakResidentBytes(int layer, const LayerGeometry& g,
                                            int64_t n_rows) const {
  if (layer < static_cast<int>(layers_.size()) && layers_[layer].exact) {
    return FullPageBytes(g, n_rows);
  }
  const bool mla = g.kind == AttnKind::kMla;
  const TurboRowCodec ck{g.k_dim, c_.key_bits}, cv{g.v_dim, c_.value_bits};
  return FullPageBytes(g, n_rows) + n_rows * g.n_kv_heads * (ck.bytes() + (mla ? 0 : cv.bytes()));
}

PolicySummary TurboQuantPolicy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s = Policy::Summary(layer, store);
  const Layer& L = layers_[layer];
  s.compressed = L.n_rows > 0 && L.exact_from > 0;
  if (L.exact) {
    s.note = "boundary layer kept exact";
  } else if (!s.compressed) {
    s.note = "no row read coded yet";
  }
  return s;
}

PolicySettings TurboQuantSettings() {
  PolicySettings p;
  p.policy = "turboquant";
  p.settings = {
      SettingDecl::Enum("preset", "4bit", {"k8v4", "4bit", "k3v4", "3bit"},
                        "vLLM's presets (turboquant_k8v4, _4bit_nc, _k3v4_nc, _3bit_nc): key / "
                        "value bits 8/4, 4/4, 3/4, 3/3; norm correction on all but k8v4"),
      SettingDecl::Enum("key-bits", "", {"2", "3", "4", "8"},
                        "bits per key value: 2-4 a Lloyd-Max code of the rotated, normalised "
                        "row; 8 a uniform int8 code")
          .Auto("the preset's"),
      SettingDecl::Enum("value-bits", "", {"2", "3", "4", "8"},
                        "bits per value value, as key-bits (MLA: the latent row takes key-bits)")
          .Auto("the preset's"),
      SettingDecl::Bool("norm-correction", true,
                        "re-normalise the decoded code vector to the row's stored norm "
                        "(vLLM's _nc presets)")
          .Auto("the preset's"),
      SettingDecl::Int("recent", 0,
                       "rows before the running prefill chunk (or up to a decode step's own) "
                       "read exact; vLLM keeps none")
          .Min(0),
      SettingDecl::Int("boundary-layers", 0,
                       "the first and last N layers (at most half) kept exact; vLLM leaves 2 "
                       "on dense models")
          .Min(0),
  };
  return p;
}

StatusOr<TurboQuantConfig> TurboQuantConfigFrom(const PolicySpec& spec) {
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(TurboQuantSettings(), spec.settings));
  TurboQuantConfig c;
  c.preset = s.text("preset");
  if (c.preset == "k8v4") {
    c.key_bits = 8, c.value_bits = 4, c.norm_correction = false;
  } else if (c.preset == "4bit") {
    c.key_bits = 4, c.value_bits = 4, c.norm_correction = true;
  } else if (c.preset == "k3v4") {
    c.key_bits = 3, c.value_bits = 4, c.norm_correction = true;
  } else {
    c.key_bits = 3, c.value_bits = 3, c.norm_correction = true;
  }
  if (s.given("key-bits")) c.key_bits = std::stoi(s.text("key-bits"));
  if (s.given("value-bits")) c.value_bits = std::stoi(s.text("value-bits"));
  if (s.given("norm-correction")) c.norm_correction = s.Bool("norm-correction");
  c.recent = s.Int("recent");
  c.boundary_layers = static_cast<int>(std::min<int64_t>(s.Int("boundary-layers"), 1 << 20));
  return c;
}

StatusOr<std::unique_ptr<Policy>> MakeTurboQuantPolicy(const PolicySpec& spec) {
  ASSIGN_OR_RETURN(const TurboQuantConfig c, TurboQuantConfigFrom(spec));
  return std::unique_ptr<Policy>(new TurboQuantPolicy(c));
}

}  // namespace strata::baselines
