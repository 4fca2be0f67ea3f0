#include "cli/bench_capacity_mla.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numbers>
#include <thread>

#include "cli/bench_geodesia.h"
#include "cli/common.h"
#include "core/rng.h"
#include "kv/cache.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser: a position hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Removes a temporary archive folder the bench made itself.
struct TempDir {
  std::string path;
  ~TempDir() {
    if (!path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

}  // namespace

LayerGeometry MlaGeometry(int q_heads, int d_c, int d_r) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = q_heads;
  g.n_kv_heads = 1;
  g.k_dim = d_c + d_r;
  g.v_dim = d_c;
  g.rope_dim = d_r;
  g.rope = false;  // Kimi Linear's MLA layers are NoPE
  g.scale = 1.f / std::sqrt(192.f);  // qk_nope 128 + qk_rope 64
  return g;
}

MlaRowSource::MlaRowSource(uint64_t seed, const LayerGeometry& g) : g_(g), seed_(seed) {
  bank_rows_ = 1021;  // prime: the bank's cycle does not align with blocks or pages
  Rng rng(seed);
  bank_.resize(static_cast<size_t>(bank_rows_) * g.k_dim);
  for (float& x : bank_) x = static_cast<float>(rng.Normal());
  const int d_c = g.k_dim - g.rope_dim;
  scale_.resize(d_c);
  for (int k = 0; k < d_c; ++k) scale_[k] = 2.f * std::exp(-k / 40.f) + 0.02f;
}

void MlaRowSource::Row(int layer, int64_t pos, float* row) const {
  const int d_c = g_.k_dim - g_.rope_dim, d_r = g_.rope_dim;
  const uint64_t h = Mix(seed_ ^ Mix(static_cast<uint64_t>(layer) << 40 ^ static_cast<uint64_t>(pos)));
  const float* b = bank_.data() + (h % bank_rows_) * g_.k_dim;
  for (int k = 0; k < d_c; ++k) row[k] = scale_[k] * b[k];
  // Branch: a smooth drift (periods of 2,048+ rows, passed by the low-pass) + small noise, and
  // one row in 16 with a spike (high salience).
  const bool spike = (h >> 20) % 16 == 0;
  const float* b2 = bank_.data() + ((h >> 32) % bank_rows_) * g_.k_dim;
  for (int j = 0; j < d_r; ++j) {
    const double w = 2.0 * std::numbers::pi / (2048.0 * (1 + j % 8));
    const float drift = static_cast<float>(std::sin(w * pos + 0.37 * j + layer));
    row[d_c + j] = drift + 0.05f * b[d_c + j] + (spike ? 1.5f * b2[d_c + j] : 0.f);
  }
}

void MlaRowSource::Query(uint64_t salt, float* q) const {
  Rng rng(Mix(seed_ ^ salt));
  for (int i = 0; i < g_.n_q_heads * g_.k_dim; ++i) q[i] = 0.5f * static_cast<float>(rng.Normal());
}

int RunBenchCapacityMla(const BenchCapacityOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  const int layers = o.layers > 0 ? o.layers : 7;
  const int q_heads = o.q_heads > 0 ? o.q_heads : 32;
  const int64_t every = o.every > 0 ? o.every : 4096;
  const std::string policy_text = o.policy.empty() ? "vestige" : o.policy;
  if (o.layers < 0 || o.q_heads < 0) {
    return fail("--layers and --q-heads must be >= 1, got " + std::to_string(o.layers) + " and " +
                std::to_string(o.q_heads));
  }
  if (o.d_c < 8 || o.d_r < 2 || o.d_r % 2 != 0) {
    return fail("--d-c must be >= 8 and --d-r even and >= 2, got " + std::to_string(o.d_c) +
                " and " + std::to_string(o.d_r));
  }
  if (every < 64 || every % 64 != 0) {
    return fail("--every must be a multiple of 64, got " + std::to_string(every));
  }
  auto spec = ParsePolicySpec(policy_text);
  if (!spec.ok()) return fail(spec.status().message());
  // VestigeKV's file archive is what this bench is about: it is the default placement here.
  TempDir own_dir;
  std::string archive_dir;
  const bool vestige = spec->name == "vestige" || spec->name == "fullrow";
  if (vestige && !spec->settings.count("archive")) {
    if (!o.archive_dir.empty()) {
      archive_dir = o.archive_dir;
    } else {
      char tmpl[] = "/tmp/strata-capacity-XXXXXX";
      if (!mkdtemp(tmpl)) return fail("cannot create a temporary folder under /tmp");
      own_dir.path = archive_dir = tmpl;
    }
    spec->settings["archive"] = "file:" + archive_dir;
  }
  auto policy = MakePolicy(*spec);
  if (!policy.ok()) return fail("--policy " + policy_text + ": " + policy.status().ToString());
  const LayerGeometry g = MlaGeometry(q_heads, o.d_c, o.d_r);
  auto cache_or = KvCache::Create(std::vector<LayerGeometry>(layers, g), std::move(policy).value());
  if (!cache_or.ok()) return fail("--policy " + policy_text + ": " + cache_or.status().ToString());
  KvCache& cache = **cache_or;
  auto* vp = dynamic_cast<VestigePolicy*>(&cache.policy());
  if (o.threads < 0) return fail("--threads must be >= 0, got " + std::to_string(o.threads));
  ThreadPool pool(o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads());
  const MlaRowSource src(o.seed, g);
  std::vector<float> row(g.k_dim);

  err << "capacity: " << layers << " MLA layers, rows [" << o.d_c << " ; " << o.d_r << "] bf16 ("
      << cache.FullBytesPerToken() << " B/token), " << o.tokens << " tokens in calls of " << every
      << ", policy " << cache.policy().describe()
      << (archive_dir.empty() ? "" : ", archive in " + archive_dir) << "\n";
  if (Status st = cache.Compress(); !st.ok()) return fail(st.ToString());  // active from row 0
  const auto t0 = Clock::now();
  const int64_t report = std::max<int64_t>(every, o.tokens / 10 / every * every);
  int64_t peak_resident = 0;
  for (int64_t t = 0; t < o.tokens; t += every) {
    const int64_t n = std::min(every, o.tokens - t);
    Status st = cache.BeginCall(n, CallKind::kPrefill, &pool);
    for (int64_t i = 0; i < n && st.ok(); ++i) {
      for (int l = 0; l < layers && st.ok(); ++l) {
        src.Row(l, t + i, row.data());
        st = cache.Append(l, row.data(), nullptr);
      }
    }
    // The largest resident moment: the call's rows are in, its closed pages not yet released.
    if (st.ok()) peak_resident = std::max(peak_resident, cache.ResidentBytes());
    if (st.ok()) st = cache.EndCall();
    if (!st.ok()) return fail("filling the cache: " + st.ToString());
    if ((t + n) % report == 0 || t + n == o.tokens) {
      err << "  filled " << (t + n) << " / " << o.tokens << " tokens, resident "
          << FormatBytes(static_cast<double>(cache.ResidentBytes())) << ", peak RSS "
          << FormatBytes(static_cast<double>(PeakRssBytes())) << ", "
          << FormatFixed(std::chrono::duration<double>(Clock::now() - t0).count(), 1) << " s\n"
          << std::flush;
    }
  }
  if (vp && !vp->recovered_error().ok()) {
    err << "warning: " << vp->recovered_error().ToString() << "\n";
  }
  const double fill_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // One decode step: a new row and a query per layer.
  const int64_t pos = cache.n_tokens();
  std::vector<float> q(int64_t{g.n_q_heads} * g.k_dim), att(int64_t{g.n_q_heads} * g.v_dim);
  const auto t1 = Clock::now();
  Status st = cache.BeginCall(1, CallKind::kDecode, &pool);
  for (int l = 0; l < layers && st.ok(); ++l) {
    src.Row(l, pos, row.data());
    st = cache.Append(l, row.data(), nullptr);
  }
  for (int l = 0; l < layers && st.ok(); ++l) {
    src.Query(static_cast<uint64_t>(l) + 1, q.data());
    st = cache.Attend(l, q.data(), pos, &pool, att.data());
  }
  if (st.ok()) st = cache.EndCall();
  if (!st.ok()) return fail("decode step: " + st.ToString());
  const double step_s = std::chrono::duration<double>(Clock::now() - t1).count();

  // Where the bytes are.
  const int64_t T = cache.n_tokens();
  const int64_t row_bytes = 2 * int64_t{g.k_dim};
  const int64_t full = T * cache.FullBytesPerToken();
  const int64_t resident = cache.ResidentBytes();
  VestigeResidency sum;
  int64_t kept = 0, archived = 0, tail = 0, fetched = 0, fallbacks = 0;
  for (int l = 0; l < layers; ++l) {
    if (!vp) {
      sum.store_bytes += cache.store(l).resident_bytes();
      tail += T;
      continue;
    }
    const VestigeResidency r = vp->Residency(l, cache.store(l));
    sum.store_bytes += r.store_bytes;
    sum.restored_bytes += r.restored_bytes;
    sum.staged_bytes += r.staged_bytes;
    sum.metadata_bytes += r.metadata_bytes;
    sum.index_bytes += r.index_bytes;
    sum.file_bytes += r.file_bytes;
    sum.released_bytes += r.released_bytes;
    kept += static_cast<int64_t>(vp->selector(l).kept().size());
    archived += static_cast<int64_t>(vp->selector(l).archived().size());
    tail += T - vp->n_closed(l);
    fetched += vp->last_read(l).rows_fetched;
    fallbacks += vp->last_read(l).fallback ? 1 : 0;
  }
  const bool recall = vp && vp->recall_hook() != nullptr;
  const bool file = vp && vp->config().archive == VestigeArchivePlacement::kFile;
  // What the method needs resident: kept rows, the tail, the index (recall on: 2r + 4 + 2 d_r per
  // archived row, docs/reference/vestigekv.md §1.3) and the selection metadata (4 B sigma + 8 B
  // tables per closed row); in the RAM placement the archived rows too.
  int64_t need = (kept + tail) * row_bytes + sum.metadata_bytes;
  if (recall) need += archived * vp->recall_hook()->ScanBytesPerArchivedRow(0);
  if (vp && !file) need += archived * row_bytes;
  const int64_t rss = PeakRssBytes();
  const double gib = 1024.0 * 1024 * 1024;
  auto bytes = [&](int64_t b) {
    return FormatBytes(static_cast<double>(b)) + " (" + FormatFixed(double(b) / T, 1) + " B/token)";
  };
  Table t({"figure", "value"});
  t.AddRow({"tokens", std::to_string(T)});
  t.AddRow({"full bf16 cache", bytes(full)});
  t.AddRow({"resident (engine)", bytes(resident) + " = " + FormatFixed(resident / gib, 3) + " GiB"});
  t.AddRow({"  tail + unreleased pages (store)", bytes(sum.store_bytes)});
  if (vp) {
    t.AddRow({"  attended tier (kept rows of released pages)", bytes(sum.restored_bytes)});
    t.AddRow({"  recall index", bytes(sum.index_bytes)});
    t.AddRow({"  selection metadata", bytes(sum.metadata_bytes)});
    t.AddRow({"  buffers (staged pages)", bytes(sum.staged_bytes)});
    t.AddRow({"archive file (disk)", bytes(sum.file_bytes)});
    t.AddRow({"rows kept / archived / tail (all layers)", std::to_string(kept) + " / " +
                                                            std::to_string(archived) + " / " +
                                                            std::to_string(tail)});
    t.AddRow({"method's need (kept + tail + index + metadata)", bytes(need)});
    t.AddRow({"resident / need", FormatFixed(static_cast<double>(resident) / need, 3)});
  }
  t.AddRow({"resident / full", FormatFixed(static_cast<double>(resident) / full, 4)});
  t.AddRow({"process peak RSS", FormatBytes(static_cast<double>(rss)) + " = " +
                                    FormatFixed(rss / gib, 3) + " GiB"});
  t.AddRow({"peak resident (fill)", bytes(peak_resident)});
  t.AddRow({"peak RSS / resident", FormatFixed(static_cast<double>(rss) / resident, 3)});
  t.AddRow({"peak RSS / peak resident", FormatFixed(static_cast<double>(rss) / peak_resident, 3)});
  t.AddRow({"fill time", FormatFixed(fill_s, 1) + " s"});
  t.AddRow({"decode step (all layers)", FormatFixed(step_s * 1e3, 1) + " ms"});
  if (recall) {
    t.AddRow({"decode step: fetched rows / dense fallbacks",
              std::to_string(fetched) + " / " + std::to_string(fallbacks) + " of " +
                  std::to_string(layers) + " layers"});
  }
  out << "capacity (MLA), " << layers << " layers x rows [" << o.d_c << " ; " << o.d_r << "], "
      << q_heads << " query heads (" << cache.FullBytesPerToken() << " B/token at bf16), policy "
      << cache.policy().describe() << "\n";
  t.Print(out);
  out << "Legend: store = LayerStore pages still allocated (the unclosed tail, and every page the "
         "policy has not released); attended tier = kept rows of released pages, held once in a "
         "dense buffer; need = what the method must hold (in the RAM placement, the archived rows "
         "too); peak resident (fill) = the largest resident bytes of the fill, sampled when a "
         "call's rows are in and its closed pages not yet released. Peak RSS includes the "
         "process's own code, libraries and buffers.\n";
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"kind", "mla"},
                        {"tokens", T},
                        {"layers", layers},
                        {"d_c", o.d_c},
                        {"d_r", o.d_r},
                        {"policy", policy_text},
                        {"full_bytes", full},
                        {"resident_bytes", resident},
                        {"store_bytes", sum.store_bytes},
                        {"attended_tier_bytes", sum.restored_bytes},
                        {"index_bytes", sum.index_bytes},
                        {"metadata_bytes", sum.metadata_bytes},
                        {"buffer_bytes", sum.staged_bytes},
                        {"archive_file_bytes", sum.file_bytes},
                        {"need_bytes", vp ? need : full},
                        {"rows_kept", kept},
                        {"rows_archived", archived},
                        {"rows_tail", tail},
                        {"peak_rss_bytes", rss},
                        {"peak_resident_bytes", peak_resident},
                        {"fill_seconds", fill_s},
                        {"decode_step_seconds", step_s},
                        {"fetched_rows", fetched},
                        {"fallback_layers", fallbacks}};
    if (Status ws = WriteTextFile(o.json_path, DumpJson(j)); !ws.ok()) {
      return fail("--json: " + ws.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
