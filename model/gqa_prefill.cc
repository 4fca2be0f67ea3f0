#include "model/gqa_prefill.h"

#include <algorithm>
#include <atomic>
#include <cstring>
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

void GqaStagedAttention(const LayerStore& store, int64_t p0, int n, const float* q,
                        ThreadPool* pool, float* att, int64_t obs_a, int64_t obs_b,
                        double* col) {
  const LayerGeometry& g = store.geometry();
  const int64_t H = g.n_q_heads, KV = g.n_kv_heads, G = g.group_size(), dk = g.k_dim,
                dv = g.v_dim;
  const int64_t n_rows = p0 + n;
  const int64_t align = StagedValueAlign();
  const int64_t dvp = (dv + align - 1) / align * align;
  // Observed queries' column sums in the attention pass itself where every row fits one
  // segment of kGqaObservedRows (AttendStagedObserved); else a second pass over the keys.
  const bool fused = col != nullptr && obs_b > obs_a && n_rows <= kGqaObservedRows;
  const int64_t S = fused ? n_rows : std::min(n_rows, kGqaSegmentRows);
  const int64_t Sp = (S + 63) / 64 * 64;
  const int64_t P = LayerStore::kPageRows;
  ScratchScope ws;
  // Queries [n, H, dk], scaled as the scores need.
  std::span<float> qx = ws.FloatsUnset(n * H * dk);
  for (int64_t k = 0; k < n * H * dk; ++k) qx[k] = q[k] * g.scale;
  std::span<float> ms = ws.FloatsUnset(n * H), ds = ws.Floats(n * H), os = ws.Floats(n * H * dvp);
  std::fill(ms.begin(), ms.end(), -std::numeric_limits<float>::infinity());
  // One KV head's segment: keys transposed [dk, Sp], values [S, dvp] (zero past dv).
  std::span<float> kt = ws.FloatsUnset(dk * Sp), vs = ws.Floats(S * dvp);
  // Stages rows [s0, s0 + sn) of KV head h (values too when `values`), a task per page.
  auto stage = [&](int h, int64_t s0, int64_t sn, bool values) {
    ParallelForOrInline(pool, (sn + P - 1) / P, 1, [&](int64_t b, int64_t e, int) {
      ScratchScope ts;
      std::span<float> tile = ts.FloatsUnset(P * dk);
      for (int64_t t = b; t < e; ++t) {
        const int64_t i0 = t * P, rows = std::min(P, sn - i0);
        const KvStreamView page = store.PageView(h, (s0 + i0) / P);  // s0: a page boundary
        for (int64_t r = 0; r < rows; ++r) {
          ToF32(page.dtype, page.keys + r * page.k_stride, &tile[r * dk], dk);
          if (values) ToF32(page.dtype, page.vals + r * page.v_stride, &vs[(i0 + r) * dvp], dv);
        }
        for (int64_t c = 0; c < dk; ++c) {
          float* dst = &kt[c * Sp + i0];
          for (int64_t r = 0; r < rows; ++r) dst[r] = tile[r * dk + c];
        }
      }
    });
  };
  auto staged = [&](int64_t s0, int64_t sn) {
    StagedRows sr;
    sr.r0 = s0;
    sr.n = sn;
    sr.kt[0] = kt.data();
    sr.kd[0] = dk;
    sr.k_stride = Sp;
    sr.v = vs.data();
    sr.v_stride = dvp;
    return sr;
  };
  std::vector<StagedQuery> qs(static_cast<size_t>(n) * G);
  for (int64_t s0 = 0; s0 < n_rows; s0 += S) {
    const int64_t sn = std::min(S, n_rows - s0);
    const int64_t j0 = std::max<int64_t>(0, s0 - p0);  // queries before j0 see no row of it
    for (int h = 0; h < KV; ++h) {
      stage(h, s0, sn, true);
      for (int64_t j = j0; j < n; ++j) {
        for (int64_t r = 0; r < G; ++r) {
          const int64_t k = j * H + h * G + r;
          qs[(j - j0) * G + r] = StagedQuery{&qx[k * dk], p0 + j + 1, &ms[k], &ds[k], &os[k * dvp]};
        }
      }
      if (fused) {
        AttendStagedObserved(staged(s0, sn), dvp, qs.data(), n * G, obs_a * G, obs_b * G,
                             col + h * (p0 + obs_b), pool);
      } else {
        AttendStaged(staged(s0, sn), dvp, qs.data(), (n - j0) * G, pool);
      }
    }
  }
  // The observed queries' column sums with their heads' final states: the keys again.
  const int64_t n_keys = p0 + obs_b;
  for (int64_t s0 = 0; !fused && col != nullptr && obs_b > obs_a && s0 < n_keys; s0 += S) {
    const int64_t sn = std::min(S, n_keys - s0);
    const int64_t j0 = std::max<int64_t>(obs_a, s0 - p0);
    for (int h = 0; h < KV; ++h) {
      stage(h, s0, sn, false);
      for (int64_t j = j0; j < obs_b; ++j) {
        for (int64_t r = 0; r < G; ++r) {
          const int64_t k = j * H + h * G + r;
          qs[(j - j0) * G + r] = StagedQuery{&qx[k * dk], p0 + j + 1, &ms[k], &ds[k], nullptr};
        }
      }
      StagedColumnSums(staged(s0, sn), qs.data(), (obs_b - j0) * G, col + h * n_keys + s0, pool);
    }
  }
  for (int64_t k = 0; k < n * H; ++k) {
    const float inv = 1.f / ds[k];  // every query reads at least its own row
    for (int64_t c = 0; c < dv; ++c) att[k * dv + c] = os[k * dvp + c] * inv;
  }
}

namespace gqa_internal {
int64_t SetStagedMinRowsForTest(int64_t rows) { return g_staged_min_rows.exchange(rows); }
}  // namespace gqa_internal

}  // namespace strata
