#include "kv/policy.h"

#include <algorithm>

#include "core/check.h"

namespace strata {
namespace {

SoftmaxStates HeadSlice(const SoftmaxStates& st, int first_head, int n_heads) {
  SoftmaxStates s;
  s.n_heads = n_heads;
  s.dv = st.dv;
  s.m = st.m + first_head;
  s.d = st.d + first_head;
  s.o = st.o + static_cast<int64_t>(first_head) * st.dv;
  return s;
}

// A unit of read work: rows of one page of one KV head, either a contiguous prefix of the page
// (rows == nullptr) or a gather list of page-local indices.
struct Task {
  int head;
  int64_t page;
  int64_t n;
  const int64_t* local_rows;  // page-local, or null for [0, n)
};

void RunTasks(const LayerStore& store, const float* q, const std::vector<Task>& tasks,
              ThreadPool* pool, SoftmaxStates* st) {
  const LayerGeometry& g = store.geometry();
  const int G = g.group_size();
  auto run = [&](int64_t b, int64_t e, SoftmaxStates* out) {
    for (int64_t t = b; t < e; ++t) {
      const Task& task = tasks[t];
      SoftmaxStates sub = HeadSlice(*out, task.head * G, G);
      AttendStream(q + static_cast<int64_t>(task.head) * G * g.k_dim, G, g.scale,
                   store.PageView(task.head, task.page), task.local_rows, task.n, &sub);
    }
  };
  const int T = pool ? pool->size() : 1;
  if (T == 1 || tasks.size() < 2) {
    run(0, static_cast<int64_t>(tasks.size()), st);
    return;
  }
  std::vector<SoftmaxStateBuffer> partial;
  partial.reserve(T);
  for (int i = 0; i < T; ++i) {
    partial.emplace_back(st->n_heads, st->dv);
    partial.back().states().Reset();
  }
  pool->ParallelFor(static_cast<int64_t>(tasks.size()),
                    [&](int64_t b, int64_t e, int k) { run(b, e, &partial[k].states()); });
  for (int i = 0; i < T; ++i) MergeStates(st, partial[i].states());
}

}  // namespace

void ReadPrefix(const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
                SoftmaxStates* st, ReadStats* stats) {
  const LayerGeometry& g = store.geometry();
  STRATA_CHECK(limit >= 0 && limit <= store.n_rows());
  std::vector<Task> tasks;
  const int64_t n_pages = (limit + LayerStore::kPageRows - 1) / LayerStore::kPageRows;
  tasks.reserve(n_pages * g.n_kv_heads);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t p = 0; p < n_pages; ++p) {
      const int64_t n = std::min(store.page_rows(p), limit - store.page_begin(p));
      tasks.push_back({h, p, n, nullptr});
    }
  }
  RunTasks(store, q, tasks, pool, st);
  if (stats) {
    stats->rows_attended += limit * g.n_kv_heads;
    stats->bytes_read += limit * g.bytes_per_token();
  }
}

void ReadRows(const LayerStore& store, const float* q, const int64_t* rows, int64_t n_rows,
              ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  const LayerGeometry& g = store.geometry();
  // Page-local indices, grouped by page (rows are ascending).
  std::vector<int64_t> local(n_rows);
  std::vector<std::pair<int64_t, int64_t>> spans;  // (first index into local, count) per page
  std::vector<int64_t> span_page;
  for (int64_t i = 0; i < n_rows; ++i) {
    STRATA_CHECK(rows[i] >= 0 && rows[i] < store.n_rows());
    STRATA_CHECK_MSG(i == 0 || rows[i] > rows[i - 1], "ReadRows needs ascending, distinct rows");
    const int64_t p = rows[i] / LayerStore::kPageRows;
    local[i] = rows[i] - p * LayerStore::kPageRows;
    if (span_page.empty() || span_page.back() != p) {
      span_page.push_back(p);
      spans.push_back({i, 0});
    }
    ++spans.back().second;
  }
  std::vector<Task> tasks;
  tasks.reserve(spans.size() * g.n_kv_heads);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (size_t s = 0; s < spans.size(); ++s) {
      tasks.push_back({h, span_page[s], spans[s].second, local.data() + spans[s].first});
    }
  }
  RunTasks(store, q, tasks, pool, st);
  if (stats) {
    stats->rows_attended += n_rows * g.n_kv_heads;
    stats->bytes_read += n_rows * g.bytes_per_token();
  }
}

void FullPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                      ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  ReadPrefix(store, q, limit, pool, st, stats);
}

}  // namespace strata
