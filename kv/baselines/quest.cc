#include "kv/baselines/quest.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/baselines/common.h"

namespace strata::baselines {

PolicySettings QuestSettings() {
  const QuestConfig c;
  PolicySettings p;
  p.policy = "quest";
  p.budget = "ratio";
  p.settings = {
      SettingDecl::Real("ratio", c.ratio, "page budget R: read round(candidates/R) pages")
          .Min(1)
          .Shared(),
      SettingDecl::Int("quest-pages", c.pages, "a fixed page count instead of the ratio (0: off)")
          .Min(0),
      SettingDecl::Real("quest-keep", c.keep,
                        "fraction of closed pages read per query instead of the ratio")
          .Min(0, /*open=*/true)
          .Max(1)
          .Auto("unset: the ratio sets the pages")
          .Shared(),
      SettingDecl::Enum("quest-heads", c.each ? "each" : "shared", {"shared", "each"},
                        "one page set per KV head (shared) or per query head (each)"),
  };
  return p;
}

StatusOr<QuestConfig> QuestConfig::FromSpec(const PolicySpec& spec) {
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(QuestSettings(), spec.settings));
  QuestConfig c;
  c.ratio = s.Real("ratio");  // declared >= 1 and finite
  c.pages = s.Int("quest-pages");
  if (s.given("quest-keep")) c.keep = s.Real("quest-keep");
  if (c.pages > 0 && c.keep > 0) {
    return InvalidArgument("--quest-pages = " + std::to_string(c.pages) + " and --quest-keep = " +
                           s.text("quest-keep") + ": give one budget, not both");
  }
  c.each = s.text("quest-heads") == "each";
  return c;
}

int64_t QuestConfig::KeepPages(int64_t n_cand) const {
  if (n_cand <= 0) return 0;
  if (pages > 0) return std::min(pages, n_cand);
  if (keep > 0) {
    return std::min(n_cand, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(keep * n_cand))));
  }
  return std::min(n_cand, BudgetRows(n_cand, ratio));
}

Status QuestPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.lo.resize(L.g.n_kv_heads);
    L.hi.resize(L.g.n_kv_heads);
    L.sel.resize(cfg_.each ? L.g.n_q_heads : L.g.n_kv_heads);
  }
  return OkStatus();
}

Status QuestPolicy::OnAppend(int layer, const LayerStore& store) {
  Layer& L = layers_[layer];
  const int64_t n = store.n_rows();
  if (n % LayerStore::kPageRows != 0) return OkStatus();
  const int64_t p = n / LayerStore::kPageRows - 1;
  STRATA_CHECK(p == L.n_boxes);
  const int D = L.g.k_dim;
  std::vector<float> mn(D), mx(D);
  for (int h = 0; h < L.g.n_kv_heads; ++h) {
    std::fill(mn.begin(), mn.end(), std::numeric_limits<float>::infinity());
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
    for (int64_t u = p * LayerStore::kPageRows; u < n; ++u) {
      const uint16_t* k = store.key_row(h, u);
      for (int c = 0; c < D; ++c) {
        const float x = Bf16ToF32(k[c]);
        mn[c] = std::min(mn[c], x);
        mx[c] = std::max(mx[c], x);
      }
    }
    for (int c = 0; c < D; ++c) {
      L.lo[h].push_back(F16RoundDown(mn[c]));
      L.hi[h].push_back(F16RoundUp(mx[c]));
    }
  }
  ++L.n_boxes;
  return OkStatus();
}

const uint16_t* QuestPolicy::box_min(int layer, int h, int64_t p) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(p >= 0 && p < L.n_boxes);
  return L.lo[h].data() + p * L.g.k_dim;
}

const uint16_t* QuestPolicy::box_max(int layer, int h, int64_t p) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(p >= 0 && p < L.n_boxes);
  return L.hi[h].data() + p * L.g.k_dim;
}

float QuestPolicy::Bound(int layer, int h, int64_t p, const float* qh) const {
  const Layer& L = layers_[layer];
  const uint16_t* lo = box_min(layer, h, p);
  const uint16_t* hi = box_max(layer, h, p);
  double s = 0;
  for (int c = 0; c < L.g.k_dim; ++c) {
    if (qh[c] == 0.f) continue;  // 0 * inf must not poison the bound
    s += std::max(static_cast<double>(qh[c]) * F16ToF32(lo[c]),
                  static_cast<double>(qh[c]) * F16ToF32(hi[c]));
  }
  return static_cast<float>(s * L.g.scale);
}

bool QuestPolicy::ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                                  ReadStats* stats) {
  const Layer& L = layers_[layer];
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // Read's dense branch
    const int64_t n_cand = (limit - 1) / LayerStore::kPageRows;
    if (L.active && cfg_.KeepPages(n_cand) < n_cand) return false;
  }
  CountDenseReads(store.geometry(), first_limit, m, stats);
  return true;
}

Status QuestPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                       ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  Layer& L = layers_[layer];
  const LayerGeometry& g = L.g;
  const int64_t P = LayerStore::kPageRows;
  const int64_t pos = limit - 1;
  const int64_t cur = pos / P;
  const int64_t n_cand = cur;  // pages b < cur lie entirely before the query's page
  const int64_t k = cfg_.KeepPages(n_cand);
  if (!L.active || k >= n_cand) {
    ReadPrefix(store, q, limit, pool, st, stats);
    return OkStatus();
  }
  const int G = g.group_size();
  const int64_t n_scan = std::min(L.n_boxes, cur + 1);  // boxes scanned (causal: <= own page)
  std::vector<double> u(n_cand);
  auto select = [&](int h, const float* qs, int nq) {
    for (int64_t b = 0; b < n_cand; ++b) {
      float best = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < nq; ++r) {
        best = std::max(best, Bound(layer, h, b, qs + static_cast<int64_t>(r) * g.k_dim));
      }
      u[b] = best;
    }
    return TopK(u.data(), n_cand, k);
  };
  auto rows_of = [&](const std::vector<int64_t>& pages, std::vector<int64_t>* rows) {
    rows->clear();
    for (int64_t b : pages) {
      for (int64_t r = b * P; r < (b + 1) * P; ++r) rows->push_back(r);
    }
    for (int64_t r = cur * P; r < limit; ++r) rows->push_back(r);
  };
  if (!cfg_.each) {
    L.sets.resize(g.n_kv_heads);
    for (int h = 0; h < g.n_kv_heads; ++h) {
      L.sel[h] = select(h, q + static_cast<int64_t>(h) * G * g.k_dim, G);
      rows_of(L.sel[h], &L.sets[h]);
    }
    ReadHeadSets(store, q, L.sets, pool, st, stats);
  } else {
    for (int hq = 0; hq < g.n_q_heads; ++hq) {
      L.sel[hq] = select(hq / G, q + static_cast<int64_t>(hq) * g.k_dim, 1);
    }
    auto run = [&](int64_t b, int64_t e, int) {
      for (int64_t hq = b; hq < e; ++hq) {
        const int h = static_cast<int>(hq / G);
        SoftmaxStates sub = HeadSlice(*st, static_cast<int>(hq), 1);
        const float* qh = q + hq * g.k_dim;
        for (int64_t p : L.sel[hq]) {
          AttendStream(qh, 1, g.scale, store.PageView(h, p), nullptr, P, &sub);
        }
        AttendStream(qh, 1, g.scale, store.PageView(h, cur), nullptr, limit - cur * P, &sub);
      }
    };
    ParallelForOrInline(pool, g.n_q_heads, 1, run);
    if (stats) {
      for (int h = 0; h < g.n_kv_heads; ++h) {
        std::vector<int64_t> pages;
        for (int r = 0; r < G; ++r) {
          const auto& s = L.sel[h * G + r];
          pages.insert(pages.end(), s.begin(), s.end());
        }
        std::sort(pages.begin(), pages.end());
        pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
        const int64_t rows = static_cast<int64_t>(pages.size()) * P + (limit - cur * P);
        stats->rows_attended += rows;
        stats->bytes_read += rows * RowBytesPerHead(g);
      }
    }
  }
  if (stats) stats->bytes_read += n_scan * g.n_kv_heads * 2 * g.k_dim * 2;
  return OkStatus();
}

int64_t QuestPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  return store.resident_bytes() + L.n_boxes * L.g.n_kv_heads * 2 * L.g.k_dim * 2;
}

PolicySummary QuestPolicy::Summary(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  PolicySummary s = Policy::Summary(layer, store);
  const int64_t n_cand = store.n_rows() > 0 ? (store.n_rows() - 1) / LayerStore::kPageRows : 0;
  const int64_t k = cfg_.KeepPages(n_cand);
  s.compressed = L.active && k < n_cand;
  if (!L.active) {
    s.note = "no compression point yet (the prefill is exact)";
  } else if (!s.compressed) {
    s.note = "every page read: " + std::to_string(n_cand) + " candidate pages, " +
             std::to_string(k) + " kept";
  }
  return s;
}

StatusOr<std::unique_ptr<Policy>> MakeQuestPolicy(const PolicySpec& spec) {
  ASSIGN_OR_RETURN(QuestConfig c, QuestConfig::FromSpec(spec));
  return std::unique_ptr<Policy>(new QuestPolicy(c));
}

}  // namespace strata::baselines
