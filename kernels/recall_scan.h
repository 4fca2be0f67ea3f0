// VestigeKV's recall-index scan kernels on plain views (kv/vestige/recall.cc adapts its tier).
//
// The index of an MLA layer's closed rows (see kv/vestige/recall.h): per row u a sketch csk_u
// (r f16 values, kept in tiles of 16 rows, channel-major within a tile: RecallCskAt) and the
// branch r_u (the last d_r bf16 values of the row [d_c + d_r]). For every (head, row):
//   dot_h(u) = [bf16(q_r) ; f16(qsk)]_h . [r_u ; csk_u]    one f32 FMA chain in channel order
// and the scan fires row u for head h iff lam * dot_h(u) + z * (cq_h * eta_u) > thr_h (f32, the
// sum not fused with the products). On one SIMD target a row's dot does not depend on its tile,
// its lane or the call, so the scan's fires and RecallIndexDots agree bit for bit; targets
// without FMA round the chain differently (RecallIndexDotsRef is the float64 reference).
#pragma once

#include <cstdint>

namespace strata {

// Rows per csk tile, and the multiple the scan pads its heads to (zero queries).
constexpr int kRecallTileRows = 16;
constexpr int kRecallHeadPad = 16;

// Index of channel k of row u in a tiled csk [n_tiles, r, 16].
inline int64_t RecallCskAt(int64_t u, int k, int r) {
  return (u / kRecallTileRows) * r * kRecallTileRows + static_cast<int64_t>(k) * kRecallTileRows +
         u % kRecallTileRows;
}

// Writes head h's [dd] operand into the scan's query layout [heads / 16, dd, 16] (channel-major
// per group of 16 heads).
inline void RecallPutQuery(const float* qh, int64_t dd, int h, float* q) {
  float* g = q + h / kRecallHeadPad * dd * kRecallHeadPad + h % kRecallHeadPad;
  for (int64_t c = 0; c < dd; ++c) g[c * kRecallHeadPad] = qh[c];
}

// Where the kernels read rows: bf16 [k_dim] rows, the branch at [k_dim - d_r, k_dim).
struct RecallRowSource {
  // Row u: a pointer into the caller's memory, or into `scratch` ([k_dim] entries), valid until
  // the next call with the same scratch. Called from several threads at once.
  const uint16_t* (*row)(const void* ctx, int64_t u, uint16_t* scratch) = nullptr;
  const void* ctx = nullptr;
  int k_dim = 0;
  // > 0: rows of one 16-row tile lie this many elements apart and row() returns stable pointers
  // (a paged store whose pages hold whole tiles), so the scan takes one row() per tile and
  // prefetches a tile ahead (checked against row() of the tile's last row). 0: row by row.
  int64_t tile_row_stride = 0;
  // Optional [n_rows, d_r] bf16 copy of every row's branch: the scan then never calls row().
  const uint16_t* branch_sidecar = nullptr;
};

// One scan's operands.
struct RecallScanView {
  // [n_heads_pad / 16, d_r + r, 16] [bf16(q_r) ; f16(qsk)] as f32 (RecallPutQuery); padding heads
  // are zero.
  const float* q = nullptr;
  int n_heads = 0;             // active heads
  int n_heads_pad = 0;         // multiple of kRecallHeadPad
  const float* cq = nullptr;   // [n_heads] lam * qres / sqrt(d_c - r)
  const float* thr = nullptr;  // [n_heads] max1 - margin
  float lam = 1.f, z = 0.f;
  RecallRowSource src;
  int d_c = 0, d_r = 0, r = 0;
  const uint16_t* csk = nullptr;        // tiled, see RecallCskAt
  const float* eta = nullptr;           // [n_tiles * 16], zero padded
  const uint16_t* arch_mask = nullptr;  // [n_tiles] bit i: row 16 t + i archived (scan only)
};

// Scan of tiles [t_begin, t_end): fire[t - t_begin] has bit i set iff archived row 16 t + i fires
// for some head; *fired += the (head, row) pairs that fired.
void RecallScanTiles(const RecallScanView& a, int64_t t_begin, int64_t t_end, uint16_t* fire,
                     int64_t* fired);

// out[h * out_stride + i] = lam * dot_h(rows[i]) for a.n_heads heads (any rows, any order; the
// scan's arithmetic bit for bit). q, csk, eta, src, lam, d_c, d_r, r of `a` are used.
void RecallIndexDots(const RecallScanView& a, const int64_t* rows, int64_t n, float* out,
                     int64_t out_stride);
// Float64 reference of RecallIndexDots (same operands, f64 products and sums).
void RecallIndexDotsRef(const RecallScanView& a, const int64_t* rows, int64_t n, double* out,
                        int64_t out_stride);

// out[h * out_stride + i] = lam * q_h . row_i over whole rows (f32 products and sums, bf16 rows),
// G heads with q: [G, k_dim]; row_i = rows[i], or begin + i when rows is null.
void RecallScoreRows(const float* q, int G, const RecallRowSource& src, const int64_t* rows,
                     int64_t begin, int64_t n, float lam, float* out, int64_t out_stride);

}  // namespace strata
