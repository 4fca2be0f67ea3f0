// Geodesia-KV packed attention over a whole GradedLayer (see packed_attention.h); the kernel
// itself is kernels/packed_attention.cc.
#include "kv/geodesia/packed_attention.h"

#include <vector>

#include "core/check.h"

namespace strata::geodesia {

void PackedAttendLayer(const GradedLayer& layer, const float* q, int n_q_heads, float scale,
                       int n_splits, ThreadPool* pool, SoftmaxStates* st) {
  const int H = layer.n_kv_heads(), D = layer.head_dim();
  STRATA_CHECK(n_q_heads % H == 0 && st->n_heads == n_q_heads && st->dv == D);
  STRATA_CHECK(n_splits >= 1);
  const int G = n_q_heads / H;
  const int64_t nb = layer.n_blocks();
  const int n_tasks = H * n_splits;
  std::vector<SoftmaxStateBuffer> parts;
  parts.reserve(n_tasks);
  for (int i = 0; i < n_tasks; ++i) parts.emplace_back(G, D);
  std::vector<PackedHeadView> views(H);
  for (int h = 0; h < H; ++h) views[h] = layer.view(h);
  auto run = [&](int task) {
    const int h = task / n_splits, s = task % n_splits;
    SoftmaxStates& ps = parts[task].states();
    ps.Reset();
    int64_t b0, b1;
    ChunkRange(nb, 1, s, n_splits, &b0, &b1);
    if (b1 <= b0) return;
    int64_t ids_small[256];
    std::vector<int64_t> ids_big;
    int64_t* ids = ids_small;
    if (b1 - b0 > 256) {
      ids_big.resize(b1 - b0);
      ids = ids_big.data();
    }
    for (int64_t i = b0; i < b1; ++i) ids[i - b0] = i;
    PackedAttend(views[h], q + static_cast<int64_t>(h) * G * D, G, scale, ids, b1 - b0, &ps);
  };
  ParallelForEach(pool, n_tasks, [&](int64_t t, int) { run(static_cast<int>(t)); });
  for (int h = 0; h < H; ++h) {
    SoftmaxStates dst = HeadSlice(*st, h * G, G);
    for (int s = 0; s < n_splits; ++s) MergeStates(&dst, parts[h * n_splits + s].states());
  }
}

}  // namespace strata::geodesia
