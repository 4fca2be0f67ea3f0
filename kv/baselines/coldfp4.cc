#include "kv/baselines/coldfp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/baselines/dequant_read.h"

namespace strata::baselines {

namespace {
constexpr float kE2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
constexpr float kE2M1Mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
}  // namespace

uint8_t E4M3FromFloat(float x) {
  if (!(x > 0)) return 0;
  if (x >= 448.f) return 0x7E;
  int e2;
  std::frexp(x, &e2);
  int e = e2 - 1;  // x in [2^e, 2^(e + 1))
  if (e < -6) {    // subnormal: multiples of 2^-9
    const int m = static_cast<int>(std::nearbyint(std::ldexp(x, 9)));
    return static_cast<uint8_t>(m);  // m == 8 is 2^-6, the first normal's bits
  }
  int m = static_cast<int>(std::nearbyint((std::ldexp(x, -e) - 1.f) * 8.f));
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int bits = ((e + 7) << 3) | m;
  return static_cast<uint8_t>(std::min(bits, 0x7E));
}

float E4M3ToFloat(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 0) return std::ldexp(static_cast<float>(m), -9);
  return std::ldexp(1.f + m / 8.f, e - 7);
}

uint8_t E2M1FromFloat(float x) {
  const float a = std::abs(x);
  uint8_t code = 0;
  for (int k = 0; k < 7; ++k) {
    // Past the midpoint of codes k and k + 1, or on it when k + 1 is the even one.
    if (a > kE2M1Mid[k] || (a == kE2M1Mid[k] && (k & 1))) code = static_cast<uint8_t>(k + 1);
  }
  return static_cast<uint8_t>((std::signbit(x) ? 8 : 0) | code);
}

float E2M1ToFloat(uint8_t code) {
  const float v = kE2M1[code & 7];
  return (code & 8) ? -v : v;
}

void Fp4EncodeRow(const float* x, int n, float g, uint8_t* out) {
  uint8_t* codes = out;
  uint8_t* scales = out + (n + 1) / 2;
  std::memset(codes, 0, static_cast<size_t>((n + 1) / 2));
  for (int b0 = 0, j = 0; b0 < n; b0 += kFp4Block, ++j) {
    const int nb = std::min(kFp4Block, n - b0);
    float amax = 0;
    for (int i = 0; i < nb; ++i) amax = std::max(amax, std::abs(x[b0 + i]));
    scales[j] = E4M3FromFloat(amax / 6.f / g);
    const float sd = E4M3ToFloat(scales[j]) * g;
    for (int i = 0; i < nb; ++i) {
      const uint8_t c = sd > 0 ? E2M1FromFloat(x[b0 + i] / sd) : 0;
      const int at = b0 + i;
      codes[at / 2] |= static_cast<uint8_t>(c << ((at & 1) * 4));
    }
  }
}

void Fp4DecodeRow(const uint8_t* in, int n, float g, float* x) {
  const uint8_t* scales = in + (n + 1) / 2;
  for (int b0 = 0, j = 0; b0 < n; b0 += kFp4Block, ++j) {
    const int nb = std::min(kFp4Block, n - b0);
    const float sd = E4M3ToFloat(scales[j]) * g;
    for (int i = 0; i < nb; ++i) {
      const int at = b0 + i;
      x[at] = E2M1ToFloat((in[at / 2] >> ((at & 1) * 4)) & 15) * sd;
    }
  }
}

std::string ColdFp4Policy::describe() const {
  return "coldfp4 (64-row pages; page 0 and the filling page exact, full pages in NVFP4: E2M1 + "
         "E4M3 scale per 16 values + f32 page scale, 4.5 bits/value)";
}

Status ColdFp4Policy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.mla = L.g.kind == AttnKind::kMla;
    if (L.g.k_dim < 1 || L.g.v_dim < 1 || (L.mla && L.g.v_dim > L.g.k_dim)) {
      return InvalidArgument("policy 'coldfp4': layer " + std::to_string(l) +
                             " has head dims k " + std::to_string(L.g.k_dim) + ", v " +
                             std::to_string(L.g.v_dim));
    }
    L.heads.assign(L.g.n_kv_heads, {});
  }
  return OkStatus();
}

int64_t ColdFp4Policy::HeadPageBytes(const Layer& L) const {
  return kPage * (Fp4RowBytes(L.g.k_dim) + (L.mla ? 0 : Fp4RowBytes(L.g.v_dim))) +
         (L.mla ? 4 : 8);
}

int64_t ColdFp4Policy::PageBytes(const LayerGeometry& g) {
  const bool mla = g.kind == AttnKind::kMla;
  return g.n_kv_heads *
         (kPage * (Fp4RowBytes(g.k_dim) + (mla ? 0 : Fp4RowBytes(g.v_dim))) + (mla ? 4 : 8));
}

int64_t ColdFp4Policy::ReadBytes(const LayerGeometry& g, int64_t limit) {
  const int64_t fp4 = std::max<int64_t>(0, limit / kPage - 1);
  return (limit - fp4 * kPage) * g.bytes_per_token() + fp4 * PageBytes(g);
}

void ColdFp4Policy::Demote(const Layer& L, const LayerStore& store, int h, int64_t p,
                           uint8_t* out) const {
  const int D = L.g.k_dim, DV = L.g.v_dim;
  const int64_t rbk = Fp4RowBytes(D), rbv = Fp4RowBytes(DV);
  std::vector<float> x(static_cast<size_t>(kPage) * std::max(D, DV));
  auto code = [&](bool value, int dim, int64_t row_bytes, uint8_t* rows, uint8_t* gs) {
    float amax = 0;
    for (int64_t r = 0; r < kPage; ++r) {
      const uint16_t* src = value ? store.val_row(h, p * kPage + r) : store.key_row(h, p * kPage + r);
      for (int c = 0; c < dim; ++c) {
        x[r * dim + c] = Bf16ToF32(src[c]);
        amax = std::max(amax, std::abs(x[r * dim + c]));
      }
    }
    // NVFP4's second-level scale: the largest block scale amax / 6 maps to E4M3's 448.
    const float g = amax > 0 ? amax / (448.f * 6.f) : 1.f;
    for (int64_t r = 0; r < kPage; ++r) Fp4EncodeRow(x.data() + r * dim, dim, g, rows + r * row_bytes);
    std::memcpy(gs, &g, 4);
  };
  uint8_t* gs = out + kPage * (rbk + (L.mla ? 0 : rbv));
  code(false, D, rbk, out, gs);
  if (!L.mla) code(true, DV, rbv, out + kPage * rbk, gs + 4);
}

Status ColdFp4Policy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                                 CachePlan* plan, ThreadPool* pool) {
  Layer& L = layers_[layer];
  L.store = &store;
  const int64_t d0 = L.n_demoted, d1 = DemotedAfter(store.n_rows());
  const int n_h = L.g.n_kv_heads;
  const int64_t hb = HeadPageBytes(L);
  if (d1 > d0) {
    for (auto& H : L.heads) H.resize(static_cast<size_t>(d1 * hb));
    // Each (page, head) task writes only its own bytes.
    ParallelForOrInline(pool, (d1 - d0) * n_h, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        const int h = static_cast<int>(t % n_h);
        const int64_t p = 1 + d0 + t / n_h;
        Demote(L, store, h, p, L.heads[h].data() + (p - 1) * hb);
      }
    });
    L.n_demoted = d1;
  }
  // Demoted pages wholly before the call's first row are read by no later query from the store.
  if (call.first == 0 || call.n_rows() == 0) return OkStatus();
  for (int64_t p = 1; p <= L.n_demoted && (p + 1) * kPage <= call.first; ++p) {
    for (int h = 0; h < n_h; ++h) {
      if (store.page_resident(h, p)) plan->release.push_back({h, p});
    }
  }
  return OkStatus();
}

void ColdFp4Policy::DecodeRows(const Layer& L, int h, int64_t u0, int64_t n, float* kt,
                               float* vt) const {
  const int D = L.g.k_dim, DV = L.g.v_dim;
  const int64_t rbk = Fp4RowBytes(D), rbv = Fp4RowBytes(DV), hb = HeadPageBytes(L);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t u = u0 + i, p = u / kPage, r = u % kPage;
    STRATA_CHECK(p >= 1 && p <= L.n_demoted);
    const uint8_t* base = L.heads[h].data() + (p - 1) * hb;
    const uint8_t* gs = base + kPage * (rbk + (L.mla ? 0 : rbv));
    float gk, gv;
    std::memcpy(&gk, gs, 4);
    Fp4DecodeRow(base + r * rbk, D, gk, kt + i * D);
    if (vt == nullptr) continue;
    if (L.mla) {
      std::copy_n(kt + i * D, DV, vt + i * DV);
    } else {
      std::memcpy(&gv, gs + 4, 4);
      Fp4DecodeRow(base + kPage * rbk + r * rbv, DV, gv, vt + i * DV);
    }
  }
}

float ColdFp4Policy::page_scale(int layer, int h, int64_t p, bool value) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(p >= 1 && p <= L.n_demoted);
  const int64_t hb = HeadPageBytes(L);
  const uint8_t* gs = L.heads[h].data() + (p - 1) * hb +
                      kPage * (Fp4RowBytes(L.g.k_dim) + (L.mla ? 0 : Fp4RowBytes(L.g.v_dim)));
  float g;
  std::memcpy(&g, gs + (value ? 4 : 0), 4);
  return g;
}

Status ColdFp4Policy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                           ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  const Layer& L = layers_[layer];
  const LayerGeometry& g = L.g;
  const int64_t nq = limit / kPage;  // full pages below the query
  const int64_t fp4 = std::max<int64_t>(0, nq - 1);
  if (fp4 > L.n_demoted) {
    return Internal("coldfp4: a read of rows [0, " + std::to_string(limit) + ") of layer " +
                    std::to_string(layer) + " before pages [1, " + std::to_string(nq) +
                    ") were demoted");
  }
  const int64_t tail0 = std::max(kPage, nq * kPage);
  if (tail0 < limit && !store.page_resident(0, tail0 / kPage)) {
    return OutOfRange("coldfp4: a query at position " + std::to_string(limit - 1) +
                      " needs the exact rows [" + std::to_string(tail0) + ", " +
                      std::to_string(limit) + "), whose page was released when a later call " +
                      "began");
  }
  std::vector<int64_t> rows(static_cast<size_t>(std::min(kPage, limit)));
  std::iota(rows.begin(), rows.end(), 0);
  for (int64_t u = tail0; u < limit; ++u) rows.push_back(u);
  ReadRows(store, q, rows.data(), static_cast<int64_t>(rows.size()), pool, st, stats);
  if (fp4 == 0) return OkStatus();
  AttendRowRange(g, q, kPage, nq * kPage, pool, st,
                 [&](int h, int64_t u0, int64_t n, float* kt, float* vt) {
                   DecodeRows(L, h, u0, n, kt, vt);
                 });
  if (stats) {
    stats->rows_attended += fp4 * kPage * g.n_kv_heads;
    stats->bytes_read += fp4 * PageBytes(g);
  }
  return OkStatus();
}

bool ColdFp4Policy::ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit,
                                     int m, ReadStats* stats, StagedPrefixPlan* plan) {
  const Layer& L = layers_[layer];
  if (L.store != &store) return false;
  plan->unit = kPage;
  plan->cap = kPage * (1 + L.n_demoted);
  if (std::max<int64_t>(0, (first_limit + m - 1) / kPage - 1) > L.n_demoted) return false;
  const int64_t b0 = plan->Split(first_limit);
  if (b0 < first_limit && !store.page_resident(0, b0 / kPage)) return false;
  if (b0 > 0 && !store.page_resident(0, 0)) return false;
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // as Read counts
    stats->rows_attended += limit * L.g.n_kv_heads;
    stats->bytes_read += ReadBytes(L.g, limit);
  }
  return true;
}

void ColdFp4Policy::StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                                    float* values) const {
  const Layer& L = layers_[layer];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  STRATA_CHECK(s0 >= 0 && s0 + sn <= kPage * (1 + L.n_demoted) && L.store != nullptr);
  for (int64_t i = 0; i < sn; ++i) {
    const int64_t u = s0 + i;
    float* k = keys + i * D;
    float* v = values ? values + i * DV : nullptr;
    if (u < kPage) {
      const uint16_t* kr = L.store->key_row(h, u);
      for (int c = 0; c < D; ++c) k[c] = Bf16ToF32(kr[c]);
      if (v) {
        const uint16_t* vr = L.store->val_row(h, u);
        for (int c = 0; c < DV; ++c) v[c] = Bf16ToF32(vr[c]);
      }
    } else {
      DecodeRows(L, h, u, 1, k, v);
    }
  }
}

void ColdFp4Policy::RowAsRead(int layer, const LayerStore& store, int h, int64_t u,
                              int64_t limit, float* key, float* value) const {
  const Layer& L = layers_[layer];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  if (u < kPage || u >= limit / kPage * kPage) {
    const uint16_t* kr = store.key_row(h, u);
    for (int c = 0; c < D; ++c) key[c] = Bf16ToF32(kr[c]);
    if (value) {
      const uint16_t* vr = store.val_row(h, u);
      for (int c = 0; c < DV; ++c) value[c] = Bf16ToF32(vr[c]);
    }
    return;
  }
  DecodeRows(L, h, u, 1, key, value);
}

int64_t ColdFp4Policy::ResidentBytes(int layer, const LayerStore& store) const {
  return store.resident_bytes() + layers_[layer].n_demoted * PageBytes(layers_[layer].g);
}

int64_t ColdFp4Policy::PeakResidentBytes(int layer, const LayerGeometry& g,
                                         int64_t n_rows) const {
  return FullPageBytes(g, n_rows) + DemotedAfter(n_rows) * PageBytes(g);
}

PolicySummary ColdFp4Policy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s = Policy::Summary(layer, store);
  s.blocks_closed = layers_[layer].n_demoted;
  s.compressed = s.blocks_closed > 0;
  if (!s.compressed) {
    s.note = "no page demoted: " + std::to_string(store.n_rows()) +
             " rows < 128 (page 0 and the filling page stay exact)";
  }
  return s;
}

PolicySettings ColdFp4Settings() {
  PolicySettings p;
  p.policy = "coldfp4";
  return p;
}

StatusOr<std::unique_ptr<Policy>> MakeColdFp4Policy(const PolicySpec& spec) {
  RETURN_IF_ERROR(ResolveSettings(ColdFp4Settings(), spec.settings).status());
  return std::unique_ptr<Policy>(new ColdFp4Policy());
}

}  // namespace strata::baselines
