#include "kv/store.h"

#include "core/check.h"
#include "core/dtype.h"

namespace strata {

LayerStore::LayerStore(const LayerGeometry& g) : g_(g), pages_(g.n_kv_heads) {
  STRATA_CHECK(g.n_kv_heads > 0 && g.k_dim > 0 && g.v_dim > 0);
  if (g.kind == AttnKind::kMla) STRATA_CHECK(g.n_kv_heads == 1 && g.v_dim <= g.k_dim);
  STRATA_CHECK(g.kv_type == DType::kBF16 || g.kv_type == DType::kF16 ||
               g.kv_type == DType::kF32);
}

LayerStore LayerStore::Clone() const {
  LayerStore c(g_);
  c.n_rows_ = n_rows_;
  for (size_t h = 0; h < pages_.size(); ++h) {
    c.pages_[h].reserve(pages_[h].size());
    for (const Page& p : pages_[h]) c.pages_[h].push_back(Page{p.k.Clone(), p.v.Clone()});
  }
  return c;
}

LayerStore::Page& LayerStore::NewPageIfNeeded(int h) {
  const int64_t p = n_rows_ / kPageRows;
  auto& pages = pages_[h];
  if (static_cast<int64_t>(pages.size()) <= p) {
    Page page;
    page.k.Resize(kPageRows * g_.k_dim * units());
    if (g_.kind == AttnKind::kGqa) page.v.Resize(kPageRows * g_.v_dim * units());
    pages.push_back(std::move(page));
  }
  return pages[p];
}

void LayerStore::Append(const float* k, const float* v) {
  const int64_t slot = n_rows_ % kPageRows;
  for (int h = 0; h < g_.n_kv_heads; ++h) {
    Page& page = NewPageIfNeeded(h);
    const int64_t u = units();
    FromF32(g_.kv_type, k + int64_t{h} * g_.k_dim, page.k.data() + slot * g_.k_dim * u,
            g_.k_dim);
    if (g_.kind == AttnKind::kGqa) {
      FromF32(g_.kv_type, v + int64_t{h} * g_.v_dim, page.v.data() + slot * g_.v_dim * u,
              g_.v_dim);
    }
  }
  ++n_rows_;
}

void LayerStore::AppendBf16(const uint16_t* k, const uint16_t* v) {
  STRATA_CHECK_MSG(g_.kv_type == DType::kBF16, "AppendBf16 to a %s store",
                   KvTypeName(g_.kv_type).c_str());
  const int64_t slot = n_rows_ % kPageRows;
  for (int h = 0; h < g_.n_kv_heads; ++h) {
    Page& page = NewPageIfNeeded(h);
    std::memcpy(page.k.data() + slot * g_.k_dim, k + int64_t{h} * g_.k_dim, 2 * g_.k_dim);
    if (g_.kind == AttnKind::kGqa) {
      std::memcpy(page.v.data() + slot * g_.v_dim, v + int64_t{h} * g_.v_dim, 2 * g_.v_dim);
    }
  }
  ++n_rows_;
}

const uint16_t* LayerStore::key_row(int h, int64_t u) const {
  STRATA_CHECK(u >= 0 && u < n_rows_);
  const Page& page = pages_[h][u / kPageRows];
  STRATA_CHECK_MSG(page.k.size() > 0, "row %lld of a released page", static_cast<long long>(u));
  return page.k.data() + (u % kPageRows) * g_.k_dim * units();
}

void LayerStore::KeyRowF32(int h, int64_t u, float* dst) const {
  ToF32(g_.kv_type, key_row(h, u), dst, g_.k_dim);
}

const uint16_t* LayerStore::val_row(int h, int64_t u) const {
  if (g_.kind == AttnKind::kMla) return key_row(h, u);
  STRATA_CHECK(u >= 0 && u < n_rows_);
  const Page& page = pages_[h][u / kPageRows];
  STRATA_CHECK_MSG(page.v.size() > 0, "row %lld of a released page", static_cast<long long>(u));
  return page.v.data() + (u % kPageRows) * g_.v_dim * units();
}

int64_t LayerStore::page_rows(int64_t p) const {
  const int64_t b = p * kPageRows;
  return std::min(kPageRows, n_rows_ - b);
}

KvStreamView LayerStore::PageView(int h, int64_t p) const {
  const Page& page = pages_[h][p];
  STRATA_CHECK_MSG(page.k.size() > 0, "page %lld was released", static_cast<long long>(p));
  KvStreamView v;
  v.keys = page.k.data();
  v.vals = g_.kind == AttnKind::kMla ? page.k.data() : page.v.data();
  v.k_stride = g_.k_dim * units();
  v.v_stride = (g_.kind == AttnKind::kMla ? g_.k_dim : g_.v_dim) * units();
  v.dk = g_.k_dim;
  v.dv = g_.v_dim;
  v.dtype = g_.kv_type;
  v.math = g_.attn_math;
  return v;
}

bool LayerStore::page_resident(int h, int64_t p) const { return pages_[h][p].k.size() > 0; }

void LayerStore::ReleasePage(int h, int64_t p) {
  STRATA_CHECK((p + 1) * kPageRows <= n_rows_);
  pages_[h][p].k = AlignedBuffer<uint16_t>();
  pages_[h][p].v = AlignedBuffer<uint16_t>();
}

int64_t LayerStore::resident_bytes() const {
  int64_t b = 0;
  for (const auto& head : pages_) {
    for (const auto& page : head) b += page.k.bytes() + page.v.bytes();
  }
  return b;
}

int64_t LayerStore::full_resident_bytes() const {
  const int64_t row_values = g_.k_dim + (g_.kind == AttnKind::kGqa ? g_.v_dim : 0);
  int64_t b = 0;
  for (const auto& head : pages_) {
    b += static_cast<int64_t>(head.size()) * kPageRows * row_values * g_.value_bytes();
  }
  return b;
}

}  // namespace strata
