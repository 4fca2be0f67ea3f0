// LayerStore: the bf16 rows of one layer, per KV head, in 64-row pages that are written once.
//
// Rows are bf16 unless the geometry's kv_type says f16 or f32 (--kv-type, for research and
// parity; only the full policy reads those stores): an f32 row takes two 2-byte units per value,
// and every pointer below is then a pointer to its floats (KvStreamView's convention).
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
  // A deep copy (every resident page copied; released pages stay released): shares nothing.
  LayerStore Clone() const;

  const LayerGeometry& geometry() const { return g_; }
  int64_t n_rows() const { return n_rows_; }
  int64_t n_pages() const { return (n_rows_ + kPageRows - 1) / kPageRows; }

  // Appends one token. k: [n_kv_heads, k_dim] f32 (MLA: the latent row [k_dim]); v: [n_kv_heads,
  // v_dim] f32, ignored (may be null) for MLA. Values are rounded to kv_type once, here.
  void Append(const float* k, const float* v);
  // Appends one token already in bf16 (same shapes as Append); a bf16 store only (CHECK).
  void AppendBf16(const uint16_t* k, const uint16_t* v);
  DType kv_type() const { return g_.kv_type; }
  // Row u of KV head h's key as f32 (any kv_type): dst[0..k_dim).
  void KeyRowF32(int h, int64_t u, float* dst) const;

  // Row u of KV head h (MLA: h = 0; the value row is the key row's first v_dim values), in the
  // store's kv_type (bf16 values unless kv_type() says otherwise).
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
    AlignedBuffer<uint16_t> k;  // [kPageRows, k_dim] values (f32: 2 units per value)
    AlignedBuffer<uint16_t> v;  // [kPageRows, v_dim] values (empty for MLA)
  };
  Page& NewPageIfNeeded(int h);
  // 2-byte units per value: 1 (bf16, f16) or 2 (f32).
  int64_t units() const { return g_.kv_type == DType::kF32 ? 2 : 1; }

  LayerGeometry g_;
  int64_t n_rows_ = 0;
  std::vector<std::vector<Page>> pages_;  // [n_kv_heads][n_pages]
};

}  // namespace strata
