// Attention as mergeable online-softmax states.
//
// A state over a row set S for one query head is (m, d, o): m = max_{u in S} s_u,
// d = sum exp(s_u - m), o = sum exp(s_u - m) v_u (unnormalised). States over disjoint sets merge
// exactly (up to f32 rounding): that is how kept rows and recalled rows, graded pages and exact
// overlays, and thread chunks combine. The final output is o / d.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include "core/dtype.h"
#include "kernels/attn_math.h"
#include "core/thread_pool.h"

namespace strata {

// States for G query heads of width dv, stored contiguously: m[G], d[G], o[G * dv].
struct SoftmaxStates {
  int n_heads = 0;
  int dv = 0;
  float* m = nullptr;
  float* d = nullptr;
  float* o = nullptr;
  void Reset();  // m = -inf, d = 0, o = 0
};

// The states of heads [first, first + n) of st (a view into the same storage, no copy).
SoftmaxStates HeadSlice(const SoftmaxStates& st, int first, int n);

// Owns storage for SoftmaxStates.
class SoftmaxStateBuffer {
 public:
  SoftmaxStateBuffer() = default;
  SoftmaxStateBuffer(int n_heads, int dv);
  SoftmaxStates& states() { return st_; }
  const SoftmaxStates& states() const { return st_; }

 private:
  float* Alloc(size_t n);
  SoftmaxStates st_;
  struct Free { void operator()(float* p) const; };
  std::unique_ptr<float[], Free> mem_;
};

// dst = merge(dst, src); both over the same heads and dv.
void MergeStates(SoftmaxStates* dst, const SoftmaxStates& src);
// out[h * dv + j] = o / d; heads with an empty set (d == 0) produce zeros.
void FinalizeStates(const SoftmaxStates& st, float* out);

// One KV stream read by G query heads at once (all heads of a GQA group, or all heads of an MLA
// layer, which share the single latent stream).
//   q:     [G, dk] f32 (already scaled or not: `scale` multiplies q.k)
//   keys:  row u starts at keys + u * k_stride, dk values of type `dtype` (bf16 by default)
//   vals:  row u starts at vals + u * v_stride, dv values (for MLA: the same rows, first 512)
// Rows of f16 or f32 (--kv-type, read by the full policy) use the same uint16_t pointers: an f32
// row's pointer points at its floats, and strides always count 2-byte units (an f32 row of dk
// values is 2 dk units), so the addressing below is the same for every type.
// Rows read are [0, n) or, when `rows` is non-null, rows[0..n) (gather; indices into the stream).
// The result is merged into `st` (call st.Reset() first for a fresh read).
struct KvStreamView {
  const uint16_t* keys = nullptr;
  const uint16_t* vals = nullptr;
  int64_t k_stride = 0;  // elements
  int64_t v_stride = 0;  // elements
  int dk = 0;
  int dv = 0;
  DType dtype = DType::kBF16;  // kBF16, kF16 or kF32
  // Bytes of one value.
  int value_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  // Alternative addressing for rows scattered over pages: row u's key is key_ptrs[u] and its
  // value val_ptrs[u] (the same array for MLA). When set, keys/vals/strides are ignored.
  const uint16_t* const* key_ptrs = nullptr;
  const uint16_t* const* val_ptrs = nullptr;
  // Alternative addressing for rows in pages of 2^page_shift rows (used when key_pages is set
  // and key_ptrs is not): row u is row u & (2^page_shift - 1) of page u >> page_shift, whose
  // first row is key_pages[page] / val_pages[page] (strides as above).
  const uint16_t* const* key_pages = nullptr;
  const uint16_t* const* val_pages = nullptr;
  int page_shift = 0;
  // Dot-product arithmetic (--attn-math, resolved here by Bf16RowsMath): f32 (and auto) is the
  // exact path; bf16 (and int8) round the query to bf16 and sum bf16 products in f32 (bf16 rows
  // only; f16 and f32 rows always take the f32 path).
  AttnMath math = AttnMath::kF32;

  const uint16_t* key_row(int64_t u) const {
    if (key_ptrs) return key_ptrs[u];
    if (key_pages) return key_pages[u >> page_shift] + (u & ((int64_t{1} << page_shift) - 1)) * k_stride;
    return keys + u * k_stride;
  }
  const uint16_t* val_row(int64_t u) const {
    if (val_ptrs) return val_ptrs[u];
    if (val_pages) return val_pages[u >> page_shift] + (u & ((int64_t{1} << page_shift) - 1)) * v_stride;
    return vals + u * v_stride;
  }
  // MLA: values are the first dv columns of the key rows.
  bool values_in_keys() const {
    if (key_ptrs) return val_ptrs == key_ptrs && dv <= dk;
    if (key_pages) return val_pages == key_pages && v_stride == k_stride && dv <= dk;
    return vals == keys && v_stride == k_stride && dv <= dk;
  }
};
// next (optional): rows [0, next_n) of another stream the caller reads after this one; their
// cache lines are requested while this call computes (software prefetch, spread over the work).
void AttendStream(const float* q, int n_heads, float scale, const KvStreamView& kv,
                  const int64_t* rows, int64_t n, SoftmaxStates* st,
                  const KvStreamView* next = nullptr, int64_t next_n = 0);

// Scalar float64 reference of the same (returns final outputs o/d per head, [G, dv]).
void AttendStreamRef(const float* q, int n_heads, float scale, const KvStreamView& kv,
                     const int64_t* rows, int64_t n, double* out);

}  // namespace strata
