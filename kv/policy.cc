#include "kv/policy.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "core/check.h"

namespace strata {
namespace {

// A unit of read work: rows [0, n) of `view` (contiguous rows of one page, or a slice of a
// row-pointer list) for the query heads of KV head `head`.
struct Task {
  int head;
  KvStreamView view;
  int64_t n;
};

void RunTasks(const LayerStore& store, const float* q, const std::vector<Task>& tasks,
              ThreadPool* pool, SoftmaxStates* st) {
  const LayerGeometry& g = store.geometry();
  const int G = g.group_size();
  auto run = [&](int64_t b, int64_t e, SoftmaxStates* out) {
    for (int64_t t = b; t < e; ++t) {
      const Task& task = tasks[t];
      SoftmaxStates sub = HeadSlice(*out, task.head * G, G);
      // The next task's rows are prefetched while this one computes (pages are separate
      // allocations: the hardware prefetcher starts cold on each).
      const Task* next = t + 1 < e ? &tasks[t + 1] : nullptr;
      KvStreamView view = task.view;
      view.math = g.attn_math;  // the layer's arithmetic, whichever way the view was built
      AttendStream(q + static_cast<int64_t>(task.head) * G * g.k_dim, G, g.scale, view,
                   nullptr, task.n, &sub, next ? &next->view : nullptr, next ? next->n : 0);
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
                SoftmaxStates* st, ReadStats* stats, const uint16_t* const* page_keys) {
  const LayerGeometry& g = store.geometry();
  STRATA_CHECK(limit >= 0 && limit <= store.n_rows());
  STRATA_CHECK(page_keys == nullptr || g.kind == AttnKind::kMla);
  // One kernel call per run of up to kRunPages pages of a KV head (a paged view), not per page:
  // a call has a fixed cost (query setup, state merge) that 64-row calls paid 16k times per token
  // at 16k context.
  constexpr int64_t kRunPages = 16;
  static_assert((LayerStore::kPageRows & (LayerStore::kPageRows - 1)) == 0);
  constexpr int kShift = std::countr_zero(static_cast<uint64_t>(LayerStore::kPageRows));
  const int64_t n_pages = (limit + LayerStore::kPageRows - 1) / LayerStore::kPageRows;
  // Each page's view (MLA: over the policy's copy of the page when it has one, laid out as the
  // store's page); a run's view takes its strides from its first page.
  auto page_view = [&](int h, int64_t p) {
    if (page_keys == nullptr || page_keys[p] == nullptr) return store.PageView(h, p);
    // (A policy's own copy of a page is bf16: only bf16 stores reach policies with copies.)
    return KvStreamView{page_keys[p], page_keys[p], g.k_dim, g.k_dim, g.k_dim, g.v_dim};
  };
  std::vector<KvStreamView> first(g.n_kv_heads);
  std::vector<const uint16_t*> kp(static_cast<size_t>(n_pages) * g.n_kv_heads);
  std::vector<const uint16_t*> vp(kp.size());
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t p = 0; p < n_pages; ++p) {
      const KvStreamView pv = page_view(h, p);
      kp[h * n_pages + p] = pv.keys;
      vp[h * n_pages + p] = pv.vals;
      if (p == 0) first[h] = pv;
    }
  }
  std::vector<Task> tasks;
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t p0 = 0; p0 < n_pages; p0 += kRunPages) {
      KvStreamView v = first[h];
      const bool shared = v.values_in_keys();  // MLA: values are the key rows' first entries
      v.keys = v.vals = nullptr;
      v.key_pages = kp.data() + h * n_pages + p0;
      v.val_pages = shared ? v.key_pages : vp.data() + h * n_pages + p0;
      v.page_shift = kShift;
      const int64_t row0 = p0 * LayerStore::kPageRows;
      tasks.push_back({h, v, std::min(limit, row0 + kRunPages * LayerStore::kPageRows) - row0});
    }
  }
  RunTasks(store, q, tasks, pool, st);
  if (stats) CountDenseReads(g, limit, 1, stats);
}

void CountDenseReads(const LayerGeometry& g, int64_t first_limit, int m, ReadStats* stats) {
  // sum of the m limits
  const int64_t rows = int64_t{m} * first_limit + int64_t{m} * (m - 1) / 2;
  stats->rows_attended += rows * g.n_kv_heads;
  stats->bytes_read += rows * g.bytes_per_token();
}

void ReadRows(const LayerStore& store, const float* q, const int64_t* rows, int64_t n_rows,
              ThreadPool* pool, SoftmaxStates* st, ReadStats* stats,
              const uint16_t* const* key_rows) {
  const LayerGeometry& g = store.geometry();
  STRATA_CHECK(key_rows == nullptr || g.kind == AttnKind::kMla);
  // One row-pointer list per KV head, read in slices of kSlice rows: scattered rows (a kept set
  // of 1/32 of the context touches every page with one or two rows) then cost one kernel call
  // per slice, not one per page.
  constexpr int64_t kSlice = 256;
  const bool mla = g.kind == AttnKind::kMla;
  std::vector<const uint16_t*> kptr(static_cast<size_t>(n_rows) * g.n_kv_heads);
  std::vector<const uint16_t*> vptr(mla ? 0 : kptr.size());
  for (int64_t i = 0; i < n_rows; ++i) {
    STRATA_CHECK(rows[i] >= 0 && rows[i] < store.n_rows());
    STRATA_CHECK_MSG(i == 0 || rows[i] > rows[i - 1], "ReadRows needs ascending, distinct rows");
    if (key_rows != nullptr && key_rows[i] != nullptr) {  // MLA: one KV head
      kptr[i] = key_rows[i];
      continue;
    }
    for (int h = 0; h < g.n_kv_heads; ++h) {
      kptr[h * n_rows + i] = store.key_row(h, rows[i]);
      if (!mla) vptr[h * n_rows + i] = store.val_row(h, rows[i]);
    }
  }
  std::vector<Task> tasks;
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t b = 0; b < n_rows; b += kSlice) {
      KvStreamView v;
      v.dk = g.k_dim;
      v.dv = g.v_dim;
      v.dtype = store.kv_type();
      v.key_ptrs = kptr.data() + h * n_rows + b;
      v.val_ptrs = mla ? v.key_ptrs : vptr.data() + h * n_rows + b;
      tasks.push_back({h, v, std::min(kSlice, n_rows - b)});
    }
  }
  RunTasks(store, q, tasks, pool, st);
  if (stats) {
    stats->rows_attended += n_rows * g.n_kv_heads;
    stats->bytes_read += n_rows * g.bytes_per_token();
  }
}

PolicySummary PolicySummary::Identity() {
  PolicySummary s;
  s.compressed = false;
  s.reference = true;
  return s;
}

void PolicySummary::Add(const PolicySummary& o) {
  if (rows_kept >= 0 || o.rows_kept >= 0) {
    rows_kept = (rows_kept >= 0 ? rows_kept : rows_visible) +
                (o.rows_kept >= 0 ? o.rows_kept : o.rows_visible);
  }
  if (blocks_closed >= 0 || o.blocks_closed >= 0) {
    blocks_closed = std::max<int64_t>(0, blocks_closed) + std::max<int64_t>(0, o.blocks_closed);
  }
  rows_visible += o.rows_visible;
  budget_bits = std::max(budget_bits, o.budget_bits);
  budget_values += o.budget_values;
  budget_bits_used += o.budget_bits_used;
  compressed = compressed || o.compressed;
  reference = reference && o.reference;
  // Distinct notes only: the same reason from every layer (or trial) is said once.
  if (!o.note.empty() && ("; " + note + "; ").find("; " + o.note + "; ") == std::string::npos) {
    note = note.empty() ? o.note : note + "; " + o.note;
  }
  if (!o.remedy.empty() &&
      ("; " + remedy + "; ").find("; " + o.remedy + "; ") == std::string::npos) {
    remedy = remedy.empty() ? o.remedy : remedy + "; " + o.remedy;
  }
}

int64_t ResidentParts::total() const {
  int64_t t = 0;
  for (const auto& [name, bytes] : parts) t += bytes;
  return t;
}

void ResidentParts::Add(const ResidentParts& other) {
  for (const auto& part : other.parts) {
    // (A named element, not a structured binding: clang before 16 cannot capture those.)
    const std::string& name = part.first;
    auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& p) { return p.first == name; });
    if (it == parts.end()) {
      parts.push_back(part);
    } else {
      it->second += part.second;
    }
  }
  file_bytes += other.file_bytes;
}

namespace {
std::string Bytes(int64_t b) {
  char buf[32];
  if (b < 1024) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(b));
  } else if (b < (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  } else if (b < (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  }
  return buf;
}
}  // namespace

std::string ResidentParts::ToString() const {
  std::string s = Bytes(total());
  std::vector<std::pair<std::string, int64_t>> shown;  // the parts that hold bytes
  for (const auto& p : parts) {
    if (p.second != 0) shown.push_back(p);
  }
  if (shown.size() > 1) {
    s += " =";
    for (size_t i = 0; i < shown.size(); ++i) {
      s += (i ? " + " : " ") + shown[i].first + " " + Bytes(shown[i].second);
    }
  }
  if (file_bytes > 0) s += "; " + Bytes(file_bytes) + " in archive files (disk, not resident)";
  return s;
}

ResidentParts Policy::ResidentBreakdown(int layer, const LayerStore& store) const {
  ResidentParts r;
  const int64_t pages = store.resident_bytes();
  r.parts.push_back({"cache pages", pages});
  const int64_t rest = ResidentBytes(layer, store) - pages;
  if (rest != 0) r.parts.push_back({"policy state", rest});
  return r;
}

PolicySummary Policy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s;
  s.rows_visible = store.n_rows() * store.geometry().n_kv_heads;
  return s;
}

PolicySummary FullPolicy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s = Policy::Summary(layer, store);
  s.compressed = false;
  s.reference = true;
  return s;
}

Status FullPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                        ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  ReadPrefix(store, q, limit, pool, st, stats);
  return OkStatus();
}

bool FullPolicy::ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                                 ReadStats* stats) {
  CountDenseReads(store.geometry(), first_limit, m, stats);
  return true;
}

}  // namespace strata
