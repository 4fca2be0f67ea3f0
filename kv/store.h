// LayerStore: the bf16 rows of one layer, per KV head, in 64-row pages that are written once.
//
// Pages let a policy release the RAM of rows it moved elsewhere (a file archive, a graded block)
// without copying the rest, and give kernels contiguous runs of rows. A released page is gone from
// this store; reading it is a programmer error (CHECK).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "kernels/attention.h"
#include "kv/geometry.h"

namespace strata {

class LayerStore {
 public:
  static constexpr int64_t kPageRows = 64;

  explicit LayerStore(const LayerGeometry& g);
  LayerStore(LayerStore&&) = default;
  LayerStore& operator=(LayerStore&&) = default;

  const LayerGeometry& geometry() const { return g_; }
  int64_t n_rows() const { return n_rows_; }
  int64_t n_pages() const { return (n_rows_ + kPageRows - 1) / kPageRows; }

  // Appends one token. k: [n_kv_heads, k_dim] f32 (MLA: the latent row [k_dim]); v: [n_kv_heads,
  // v_dim] f32, ignored (may be null) for MLA. Values are rounded to bf16 once, here.
  void Append(const float* k, const float* v);
  // Appends one token already in bf16 (same shapes as Append).
  void AppendBf16(const uint16_t* k, const uint16_t* v);

  // Row u of KV head h (MLA: h = 0; the value row is the key row's first v_dim values).
  const uint16_t* key_row(int h, int64_t u) const;
  const uint16_t* val_row(int h, int64_t u) const;
  // A kernel view of page p of head h: rows [p * 64, min(n_rows, (p + 1) * 64)).
  KvStreamView PageView(int h, int64_t p) const;
  int64_t page_begin(int64_t p) const { return p * kPageRows; }
  int64_t page_rows(int64_t p) const;

  bool page_resident(int h, int64_t p) const;
  // Frees page p of head h (all its rows must be closed, i.e. not the last page).
  void ReleasePage(int h, int64_t p);
  // Bytes of row storage currently allocated (pages x page bytes).
  int64_t resident_bytes() const;
  // What resident_bytes() would be had no page been released: the full cache's resident bytes
  // for these rows, the figure a policy's resident bytes are compared with.
  int64_t full_resident_bytes() const;

 private:
  struct Page {
    AlignedBuffer<uint16_t> k;  // [kPageRows, k_dim] bf16
    AlignedBuffer<uint16_t> v;  // [kPageRows, v_dim] bf16 (empty for MLA)
  };
  Page& NewPageIfNeeded(int h);

  LayerGeometry g_;
  int64_t n_rows_ = 0;
  std::vector<std::vector<Page>> pages_;  // [n_kv_heads][n_pages]
};

}  // namespace strata
