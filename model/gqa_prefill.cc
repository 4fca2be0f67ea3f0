#include "model/gqa_prefill.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/scratch.h"
#include "kernels/attention_many.h"

namespace strata {
namespace {

std::atomic<int64_t> g_staged_min_rows{0};

// Below this many queries a chunk reads through AttendStream: staging converts each row once
// per chunk instead of once per query, which pays from a few queries on, but a decode step and
// the server's small batches keep the kernel the decode path is tuned for.
constexpr int64_t kStagedMinRows = 32;

}  // namespace

bool GqaStagedPays(int64_t n) {
  const int64_t min_rows = g_staged_min_rows.load(std::memory_order_relaxed);
  if (min_rows < 0) return false;
  return n >= (min_rows > 0 ? min_rows : kStagedMinRows);
}

namespace {

// The chunk's queries and their online-softmax states, and the staging of a KV head's rows.
class StagedChunk {
 public:
  StagedChunk(const LayerStore& store, int n, const float* q, ThreadPool* pool, ScratchScope& ws)
      : store_(store), g_(store.geometry()), n_(n), pool_(pool) {
    const int64_t H = g_.n_q_heads, dk = g_.k_dim;
    const int64_t align = StagedValueAlign();
    dvp_ = (g_.v_dim + align - 1) / align * align;
    // Queries [n, H, dk], scaled as the scores need.
    qx_ = ws.FloatsUnset(n * H * dk);
    for (int64_t k = 0; k < n * H * dk; ++k) qx_[k] = q[k] * g_.scale;
    ms_ = ws.FloatsUnset(n * H);
    ds_ = ws.Floats(n * H);
    os_ = ws.Floats(n * H * dvp_);
    std::fill(ms_.begin(), ms_.end(), -std::numeric_limits<float>::infinity());
  }
  int64_t dvp() const { return dvp_; }
  // Query head r of KV head h of chunk query j, reading to `limit`.
  StagedQuery Query(int64_t j, int h, int64_t r, int64_t limit, bool output = true) {
    const int64_t k = j * g_.n_q_heads + h * g_.group_size() + r;
    return StagedQuery{&qx_[k * g_.k_dim], limit, &ms_[k], &ds_[k],
                       output ? &os_[k * dvp_] : nullptr};
  }
  // Rows [s0, s0 + sn) of KV head h (s0 a page boundary) from the store: keys transposed into
  // kt [dk, ld], values (when vs is not null) into vs [sn, dvp]. A task per page.
  void StageFromStore(int h, int64_t s0, int64_t sn, float* kt, int64_t ld, float* vs) const {
    const int64_t P = LayerStore::kPageRows, dk = g_.k_dim, dv = g_.v_dim;
    ParallelForOrInline(pool_, (sn + P - 1) / P, 1, [&](int64_t b, int64_t e, int) {
      ScratchScope ts;
      std::span<float> tile = ts.FloatsUnset(P * dk);
      for (int64_t t = b; t < e; ++t) {
        const int64_t i0 = t * P, rows = std::min(P, sn - i0);
        const KvStreamView page = store_.PageView(h, (s0 + i0) / P);
        for (int64_t r = 0; r < rows; ++r) {
          ToF32(page.dtype, page.keys + r * page.k_stride, &tile[r * dk], dk);
          if (vs != nullptr) ToF32(page.dtype, page.vals + r * page.v_stride, &vs[(i0 + r) * dvp_], dv);
        }
        Transpose(tile.data(), rows, kt + i0, ld);
      }
    });
  }
  // The same from a policy's staged prefix (any s0).
  void StageFromPrefix(const StagedPrefix& prefix, int h, int64_t s0, int64_t sn, float* kt,
                       int64_t ld, float* vs) const {
    const int64_t P = LayerStore::kPageRows, dk = g_.k_dim, dv = g_.v_dim;
    ParallelForOrInline(pool_, (sn + P - 1) / P, 1, [&](int64_t b, int64_t e, int) {
      ScratchScope ts;
      std::span<float> tile = ts.FloatsUnset(P * dk), vals = ts.FloatsUnset(P * dv);
      for (int64_t t = b; t < e; ++t) {
        const int64_t i0 = t * P, rows = std::min(P, sn - i0);
        prefix.stage(h, s0 + i0, rows, tile.data(), vals.data());
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(&vs[(i0 + r) * dvp_], &vals[r * dv], sizeof(float) * dv);
        }
        Transpose(tile.data(), rows, kt + i0, ld);
      }
    });
  }
  // att [n, H, dv]: the normalised outputs.
  void Finish(float* att) const {
    const int64_t dv = g_.v_dim;
    for (int64_t k = 0; k < int64_t{n_} * g_.n_q_heads; ++k) {
      const float inv = 1.f / ds_[k];  // every query reads at least its own row
      for (int64_t c = 0; c < dv; ++c) att[k * dv + c] = os_[k * dvp_ + c] * inv;
    }
  }

 private:
  // rows x dk keys (row-major) into columns of kt (stride ld).
  void Transpose(const float* tile, int64_t rows, float* kt, int64_t ld) const {
    for (int64_t c = 0; c < g_.k_dim; ++c) {
      float* dst = kt + c * ld;
      for (int64_t r = 0; r < rows; ++r) dst[r] = tile[r * g_.k_dim + c];
    }
  }

  const LayerStore& store_;
  const LayerGeometry& g_;
  int n_;
  ThreadPool* pool_;
  int64_t dvp_ = 0;
  std::span<float> qx_, ms_, ds_, os_;
};

StagedRows Rows(int64_t r0, int64_t n, const float* kt, int64_t dk, int64_t ld, const float* vs,
                int64_t dvp) {
  StagedRows sr;
  sr.r0 = r0;
  sr.n = n;
  sr.kt[0] = kt;
  sr.kd[0] = dk;
  sr.k_stride = ld;
  sr.v = vs;
  sr.v_stride = dvp;
  return sr;
}

}  // namespace

void GqaStagedAttention(const LayerStore& store, int64_t p0, int n, const float* q,
                        ThreadPool* pool, float* att, int64_t obs_a, int64_t obs_b,
                        double* col) {
  const LayerGeometry& g = store.geometry();
  const int64_t KV = g.n_kv_heads, G = g.group_size(), dk = g.k_dim;
  const int64_t n_rows = p0 + n;
  // Observed queries' column sums in the attention pass itself where every row fits one
  // segment of kGqaObservedRows (AttendStagedObserved); else a second pass over the keys.
  const bool fused = col != nullptr && obs_b > obs_a && n_rows <= kGqaObservedRows;
  const int64_t S = fused ? n_rows : std::min(n_rows, kGqaSegmentRows);
  const int64_t Sp = StagedKeyStride(S);
  ScratchScope ws;
  StagedChunk chunk(store, n, q, pool, ws);
  const int64_t dvp = chunk.dvp();
  // One KV head's segment: keys transposed [dk, Sp], values [S, dvp] (zero past dv).
  std::span<float> kt = ws.FloatsUnset(dk * Sp), vs = ws.Floats(S * dvp);
  std::vector<StagedQuery> qs(static_cast<size_t>(n) * G);
  for (int64_t s0 = 0; s0 < n_rows; s0 += S) {
    const int64_t sn = std::min(S, n_rows - s0);
    const int64_t j0 = std::max<int64_t>(0, s0 - p0);  // queries before j0 see no row of it
    for (int h = 0; h < KV; ++h) {
      chunk.StageFromStore(h, s0, sn, kt.data(), Sp, vs.data());
      for (int64_t j = j0; j < n; ++j) {
        for (int64_t r = 0; r < G; ++r) qs[(j - j0) * G + r] = chunk.Query(j, h, r, p0 + j + 1);
      }
      const StagedRows rows = Rows(s0, sn, kt.data(), dk, Sp, vs.data(), dvp);
      if (fused) {
        AttendStagedObserved(rows, dvp, qs.data(), n * G, obs_a * G, obs_b * G,
                             col + h * (p0 + obs_b), pool);
      } else {
        AttendStaged(rows, dvp, qs.data(), (n - j0) * G, pool);
      }
    }
  }
  // The observed queries' column sums with their heads' final states: the keys again.
  const int64_t n_keys = p0 + obs_b;
  for (int64_t s0 = 0; !fused && col != nullptr && obs_b > obs_a && s0 < n_keys; s0 += S) {
    const int64_t sn = std::min(S, n_keys - s0);
    const int64_t j0 = std::max<int64_t>(obs_a, s0 - p0);
    for (int h = 0; h < KV; ++h) {
      chunk.StageFromStore(h, s0, sn, kt.data(), Sp, nullptr);
      for (int64_t j = j0; j < obs_b; ++j) {
        for (int64_t r = 0; r < G; ++r) {
          qs[(j - j0) * G + r] = chunk.Query(j, h, r, p0 + j + 1, /*output=*/false);
        }
      }
      StagedColumnSums(Rows(s0, sn, kt.data(), dk, Sp, nullptr, dvp), qs.data(),
                       (obs_b - j0) * G, col + h * n_keys + s0, pool);
    }
  }
  chunk.Finish(att);
}

void GqaStagedPrefixAttention(const LayerStore& store, const StagedPrefix& prefix, int64_t p0,
                              int n, const float* q, ThreadPool* pool, float* att) {
  const LayerGeometry& g = store.geometry();
  const int64_t KV = g.n_kv_heads, G = g.group_size(), dk = g.k_dim;
  const int64_t n_rows = p0 + n, P = LayerStore::kPageRows;
  const StagedPrefixPlan& plan = prefix.plan;
  auto split = [&](int64_t j) { return plan.Split(p0 + j + 1); };  // chunk query j's split
  ScratchScope ws;
  StagedChunk chunk(store, n, q, pool, ws);
  const int64_t dvp = chunk.dvp();
  // The prefix: rows [0, split(n - 1)) in segments.
  const int64_t b_max = split(n - 1);
  const int64_t S = std::min(b_max, kGqaSegmentRows), Sp = StagedKeyStride(S);
  std::span<float> kt = ws.FloatsUnset(dk * Sp), vs = ws.Floats(S * dvp);
  std::vector<StagedQuery> qs(static_cast<size_t>(n) * G);
  for (int64_t s0 = 0; s0 < b_max; s0 += S) {
    const int64_t sn = std::min(S, b_max - s0);
    int64_t j0 = 0;  // queries before j0 read no prefix row of the segment (splits ascend)
    while (j0 < n && split(j0) <= s0) ++j0;
    for (int h = 0; h < KV; ++h) {
      chunk.StageFromPrefix(prefix, h, s0, sn, kt.data(), Sp, vs.data());
      for (int64_t j = j0; j < n; ++j) {
        for (int64_t r = 0; r < G; ++r) qs[(j - j0) * G + r] = chunk.Query(j, h, r, split(j));
      }
      AttendStaged(Rows(s0, sn, kt.data(), dk, Sp, vs.data(), dvp), dvp, qs.data(),
                   (n - j0) * G, pool);
    }
  }
  // The exact rows: [e0, n_rows) from the page holding the smallest split, staged once per KV
  // head; each run of queries with the same split b reads [b, limit) from there (64 floats of
  // padding: a run's key columns start inside the staged ones).
  const int64_t e0 = split(0) / P * P, ne = n_rows - e0, Ep = StagedKeyStride(ne);
  std::span<float> ke = ws.FloatsUnset(dk * Ep + 64), ve = ws.Floats(ne * dvp);
  for (int h = 0; h < KV; ++h) {
    chunk.StageFromStore(h, e0, ne, ke.data(), Ep, ve.data());
    for (int64_t j = 0; j < n;) {
      const int64_t b = split(j);
      int64_t je = j;
      while (je < n && split(je) == b) ++je;
      for (int64_t i = j; i < je; ++i) {
        for (int64_t r = 0; r < G; ++r) qs[(i - j) * G + r] = chunk.Query(i, h, r, p0 + i + 1);
      }
      AttendStaged(Rows(b, n_rows - b, ke.data() + (b - e0), dk, Ep, ve.data() + (b - e0) * dvp,
                        dvp),
                   dvp, qs.data(), (je - j) * G, pool);
      j = je;
    }
  }
  chunk.Finish(att);
}

namespace gqa_internal {
int64_t SetStagedMinRowsForTest(int64_t rows) { return g_staged_min_rows.exchange(rows); }
}  // namespace gqa_internal

}  // namespace strata
