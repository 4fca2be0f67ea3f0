// `strata bench attention` / `strata bench capacity` (see bench_geodesia.h).
//
// attention: one GQA layer of `ctx` synthetic tokens per policy (the same rows for every policy),
// an explicit compression point (no prefill observation: the EMA starts from the first decode
// query), `warmup` untimed decode steps (the first one allocates the whole context), then `steps`
// timed decode steps: append one token and read it through the policy (KvCache::Attend, i.e. the
// EMA update, allocation and attention). Ratios are against `full` measured in the same process.
//
// capacity: a many-layer cache filled token by token with synthetic rows, the allocator run every
// `every` tokens (GeodesiaPolicy::Maintain), so the bf16 form of the whole context never exists at
// once; then one decode step (a random query per layer). Reports the engine's resident bytes and
// the process's peak RSS. Between two allocator runs the last `every` tokens exist twice in bf16
// (LayerStore pages and level-16 slots: 2 x every x 57,344 B = 112 MiB at the Qwen2.5-7B shape
// and every = 1024), which with the per-block index tables (~66 B per block and KV head, not
// resident bytes by the spec's accounting) is what peak RSS adds to the resident bytes; the
// graded slabs grow by segments (kv/geodesia/blocks.h), so their growth adds at most one segment
// each.
#include "cli/bench_geodesia.h"

#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/common.h"
#include "core/rng.h"
#include "eval/runner.h"
#include "kv/achieved.h"
#include "kv/cache.h"
#include "kv/geodesia/accounting.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

// "geodesia@2.5:rd-frac=0.03:ratchet=clean" -> spec.
StatusOr<PolicySpec> ParseBenchPolicy(const std::string& item) {
  PolicySpec spec;
  std::string rest = item;
  const size_t colon = rest.find(':');
  std::string head = rest.substr(0, colon);
  const size_t at = head.find('@');
  spec.name = head.substr(0, at);
  if (at != std::string::npos) spec.settings["bits"] = head.substr(at + 1);
  if (spec.name.empty()) return InvalidArgument("--policy item '" + item + "' has no name");
  if (colon != std::string::npos) {
    std::stringstream ss(rest.substr(colon + 1));
    std::string kv;
    while (std::getline(ss, kv, ':')) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return InvalidArgument("--policy item '" + item + "': '" + kv + "' is not key=value");
      }
      spec.settings[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return spec;
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

LayerGeometry GqaGeometry(int q, int kv, int d) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = q;
  g.n_kv_heads = kv;
  g.k_dim = g.v_dim = d;
  g.scale = 1.f / std::sqrt(static_cast<float>(d));
  return g;
}

// Synthetic rows: keys = a fixed per-(head, channel) offset + a per-block amplitude x noise, so
// blocks differ (as real caches do) and the allocator has something to rank. Values: noise.
class RowSource {
 public:
  RowSource(uint64_t seed, const LayerGeometry& g, int bank = 0) : rng_(seed), g_(g) {
    const int n = g.n_kv_heads * g.k_dim;
    offset_.resize(n);
    for (auto& x : offset_) x = static_cast<float>(rng_.Normal());
    if (bank > 0) {  // capacity: cycle through a bank of noise rows (fast)
      bank_k_.resize(static_cast<size_t>(bank) * n);
      bank_v_.resize(bank_k_.size());
      for (auto& x : bank_k_) x = static_cast<float>(rng_.Normal());
      for (auto& x : bank_v_) x = static_cast<float>(rng_.Normal());
    }
  }
  void Row(int64_t pos, float* k, float* v) {
    const int n = g_.n_kv_heads * g_.k_dim;
    const float amp = 0.25f + 1.5f * static_cast<float>(std::abs(std::sin(pos / 64 * 0.77)));
    if (!bank_k_.empty()) {
      const int64_t nb = static_cast<int64_t>(bank_k_.size()) / n;
      const float* bk = bank_k_.data() + (pos * 7919 % nb) * n;
      const float* bv = bank_v_.data() + (pos * 104729 % nb) * n;
      for (int i = 0; i < n; ++i) {
        k[i] = offset_[i] + amp * bk[i];
        v[i] = amp * bv[i];
      }
      return;
    }
    for (int i = 0; i < n; ++i) {
      k[i] = offset_[i] + amp * static_cast<float>(rng_.Normal());
      v[i] = amp * static_cast<float>(rng_.Normal());
    }
  }
  void Query(float* q, int n) {
    for (int i = 0; i < n; ++i) q[i] = 1.5f * static_cast<float>(rng_.Normal());
  }

 private:
  Rng rng_;
  LayerGeometry g_;
  std::vector<float> offset_, bank_k_, bank_v_;
};

int64_t PeakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
}

int ResolveThreads(int t) {
  return t > 0 ? t : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

void AddBenchGqaAttentionCommand(CLI::App* bench, BenchGqaAttentionOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "attention-gqa",
      "GQA per-step attention time and bytes read of cache policies vs full bf16 (also reached "
      "as `bench attention --kind gqa`)");
  cmd->add_option("--kind", o->kind, "Layer kind (gqa)")->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "Context length in tokens")->capture_default_str();
  cmd->add_option("--q-heads", o->q_heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim, "Head dim")->capture_default_str();
  cmd->add_option("--policy", o->policy,
                  "Policies, comma-separated: NAME[@BITS][:key=value...]; full is always measured")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Timed decode steps")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed decode steps first")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic rows")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchGqaAttention(const BenchGqaAttentionOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.kind != "gqa") return fail("--kind '" + o.kind + "': this benchmark supports gqa");
  if (o.ctx < 1) return fail("--ctx must be >= 1, got " + std::to_string(o.ctx));
  if (o.kv_heads < 1 || o.q_heads < o.kv_heads || o.q_heads % o.kv_heads != 0) {
    return fail("--q-heads " + std::to_string(o.q_heads) + " must be a multiple of --kv-heads " +
                std::to_string(o.kv_heads));
  }
  if (o.head_dim < 1) return fail("--head-dim must be >= 1");
  if (o.steps < 1 || o.warmup < 0) return fail("--steps must be >= 1 and --warmup >= 0");
  std::vector<std::string> items = SplitComma(o.policy);
  if (std::find(items.begin(), items.end(), "full") == items.end()) {
    items.insert(items.begin(), "full");
  }
  const LayerGeometry g = GqaGeometry(o.q_heads, o.kv_heads, o.head_dim);
  ThreadPool pool(ResolveThreads(o.threads));
  struct Row {
    std::string label;
    double ms = 0;
    double bytes = 0;
    int64_t resident = 0;
    double resident_bpv = 0, read_bpv = 0, read_bpv_union = 0;
    std::string levels = "-";  // share of blocks at 16/8/4/2/1
    AchievedCompression achieved;  // over the decode steps, beside the full cache (kv/achieved.h)
    CompressionCheck check;
  };
  std::vector<Row> rows;
  const int64_t n_kv = int64_t{g.n_kv_heads} * g.k_dim;
  std::vector<float> k(n_kv), v(n_kv), q(int64_t{g.n_q_heads} * g.k_dim),
      att(int64_t{g.n_q_heads} * g.v_dim);
  // All caches are built first and the timed steps run round-robin over them, so that load on
  // a shared machine hits every policy alike.
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<RowSource> sources;
  std::vector<CacheCounters> counters0;  // after the fill: the decode steps are measured
  for (const std::string& item : items) {
    auto spec = ParseBenchPolicy(item);
    if (!spec.ok()) return fail(spec.status().message());
    auto policy = MakePolicy(*spec);
    if (!policy.ok()) return fail("--policy " + item + ": " + policy.status().ToString());
    auto cache_or = KvCache::Create({g}, std::move(policy).value());
    if (!cache_or.ok()) return fail("--policy " + item + ": " + cache_or.status().ToString());
    KvCache& cache = **cache_or;
    err << "[" << item << "] filling " << o.ctx << " tokens...\n" << std::flush;
    sources.emplace_back(o.seed, g);
    Status st = cache.BeginCall(o.ctx, CallKind::kPrefill);
    for (int64_t t = 0; t < o.ctx && st.ok(); ++t) {
      sources.back().Row(t, k.data(), v.data());
      st = cache.Append(0, k.data(), v.data());
    }
    if (st.ok()) st = cache.EndCall();
    if (st.ok()) st = cache.Compress();
    if (!st.ok()) return fail("--policy " + item + ": filling the cache: " + st.ToString());
    counters0.push_back(cache.counters());
    caches.push_back(std::move(cache_or).value());
  }
  const size_t n_pol = items.size();
  std::vector<std::vector<double>> times(n_pol);
  std::vector<int64_t> bytes(n_pol, 0);
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    for (size_t i = 0; i < n_pol; ++i) {
      KvCache& cache = *caches[i];
      const int64_t pos = cache.n_tokens();
      sources[i].Row(pos, k.data(), v.data());
      Status st = cache.BeginCall(1, CallKind::kDecode);
      if (st.ok()) st = cache.Append(0, k.data(), v.data());
      sources[i].Query(q.data(), static_cast<int>(q.size()));
      const auto t0 = Clock::now();
      if (st.ok()) st = cache.Attend(0, q.data(), pos, &pool, att.data());
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (st.ok()) st = cache.EndCall();
      if (!st.ok()) return fail("--policy " + items[i] + ": decode step: " + st.ToString());
      if (s >= o.warmup) {
        times[i].push_back(ms);
        bytes[i] += cache.counters().last_step.bytes_read;
      }
    }
  }
  for (size_t i = 0; i < n_pol; ++i) {
    KvCache& cache = *caches[i];
    std::sort(times[i].begin(), times[i].end());
    Row r;
    r.label = items[i];
    r.ms = times[i][0];  // best step: robust to load from other processes on a shared machine
    r.bytes = static_cast<double>(bytes[i]) / o.steps;
    r.resident = cache.ResidentBytes();
    r.achieved = MeasureAchieved(cache, counters0[i]);
    r.check = CheckAchieved(r.label, r.achieved);
    if (auto* geo = dynamic_cast<GeodesiaPolicy*>(&cache.policy())) {
      r.resident_bpv = geo->stats().resident_bpv();
      r.read_bpv = geo->stats().read_bpv();
      r.read_bpv_union = geo->stats().read_bpv_union();
      std::array<int64_t, geodesia::kNumLevels> hist{};
      int64_t n = 0;
      for (int h = 0; h < g.n_kv_heads; ++h) {
        const auto hh = geo->graded(0).level_histogram(h);
        for (int j = 0; j < geodesia::kNumLevels; ++j) hist[j] += hh[j], n += hh[j];
      }
      r.levels.clear();
      for (int j = 0; j < geodesia::kNumLevels; ++j) {
        r.levels += (j ? "/" : "") + FormatFixed(100.0 * hist[j] / std::max<int64_t>(1, n), 0);
      }
    } else {
      r.resident_bpv = r.read_bpv = r.read_bpv_union = 16;
    }
    rows.push_back(r);
  }
  const Row& full = rows[0];
  Table t({"policy", "ms/step", "speedup", "KV bytes read/step", "read ratio", "resident",
           "resident ratio", "bpv resident (1.5)", "bpv read/q-head", "bpv read/kv-head", "% blocks 16/8/4/2/1",
           "compressed"});
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    t.AddRow({r.label, FormatFixed(r.ms, 3), FormatFixed(full.ms / r.ms, 2) + "x",
              FormatBytes(r.bytes), FormatFixed(r.bytes / full.bytes, 4),
              FormatBytes(static_cast<double>(r.resident)),
              FormatFixed(static_cast<double>(r.resident) / full.resident, 4),
              FormatFixed(r.resident_bpv, 3), FormatFixed(r.read_bpv, 3),
              FormatFixed(r.read_bpv_union, 3), r.levels,
              eval::CompressedText(r.achieved, r.check)});
    results.push_back({{"policy", r.label},
                       {"ms_per_step", r.ms},
                       {"speedup_vs_full", full.ms / r.ms},
                       {"kv_bytes_read_per_step", r.bytes},
                       {"read_ratio_vs_full", r.bytes / full.bytes},
                       {"resident_bytes", r.resident},
                       {"resident_bpv_spec", r.resident_bpv},
                       {"read_bpv_per_query_head", r.read_bpv},
                       {"read_bpv_union_per_kv_head", r.read_bpv_union},
                       {"level_shares_16_8_4_2_1", r.levels}});
    eval::AddAchievedFields(r.achieved, r.check, &results.back());
  }
  out << "attention, " << o.kind << " ctx " << o.ctx << ", " << o.q_heads << " q heads / "
      << o.kv_heads << " kv heads, head dim " << o.head_dim << ", " << pool.size()
      << " threads; best of " << o.steps << " decode steps; ratios vs full in this run\n";
  t.Print(out);
  std::vector<std::string> warnings;
  for (const Row& r : rows) {
    if (r.check.warning.empty()) continue;
    warnings.push_back(r.check.warning);
    out << "warning: " << r.check.warning << "\n";
    err << "warning: " << r.check.warning << "\n";
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"kind", o.kind},   {"ctx", o.ctx},         {"q_heads", o.q_heads},
                        {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                        {"threads", pool.size()}, {"results", results},
                        {"warnings", warnings}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

void AddBenchCapacityCommand(CLI::App* bench, BenchCapacityOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "capacity", "Fill a long Geodesia cache block by block, decode one step, report its size");
  cmd->add_option("--tokens", o->tokens, "Tokens to fill")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Layers")->capture_default_str();
  cmd->add_option("--q-heads", o->q_heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim, "Head dim")->capture_default_str();
  cmd->add_option("--policy", o->policy, "A geodesia or cquest policy: NAME[@BITS][:key=value...]")
      ->capture_default_str();
  cmd->add_option("--every", o->every, "Tokens between allocator runs during the fill")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic rows")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchCapacity(const BenchCapacityOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.tokens < 1) return fail("--tokens must be >= 1, got " + std::to_string(o.tokens));
  if (o.layers < 1) return fail("--layers must be >= 1");
  if (o.kv_heads < 1 || o.q_heads % o.kv_heads != 0) {
    return fail("--q-heads " + std::to_string(o.q_heads) + " must be a multiple of --kv-heads " +
                std::to_string(o.kv_heads));
  }
  if (o.every < 64) return fail("--every must be >= 64, got " + std::to_string(o.every));
  auto spec = ParseBenchPolicy(o.policy);
  if (!spec.ok()) return fail(spec.status().message());
  auto policy = MakePolicy(*spec);
  if (!policy.ok()) return fail("--policy " + o.policy + ": " + policy.status().ToString());
  const LayerGeometry g = GqaGeometry(o.q_heads, o.kv_heads, o.head_dim);
  auto cache_or = KvCache::Create(std::vector<LayerGeometry>(o.layers, g), std::move(policy).value());
  if (!cache_or.ok()) return fail("--policy " + o.policy + ": " + cache_or.status().ToString());
  KvCache& cache = **cache_or;
  auto* geo = dynamic_cast<GeodesiaPolicy*>(&cache.policy());
  if (geo == nullptr) return fail("--policy " + o.policy + ": capacity needs geodesia or cquest");
  ThreadPool pool(ResolveThreads(o.threads));
  const int64_t n_kv = int64_t{g.n_kv_heads} * g.k_dim;
  std::vector<RowSource> src;
  for (int l = 0; l < o.layers; ++l) src.emplace_back(o.seed + l, g, 509);
  std::vector<float> k(n_kv), v(n_kv);
  // The compression point: the policy is active from the first row.
  if (Status st = cache.Compress(); !st.ok()) return fail(st.ToString());
  const auto t0 = Clock::now();
  const int64_t report = std::max<int64_t>(o.every, o.tokens / 10 / o.every * o.every);
  // Calls of `every` tokens, each followed by the allocator (GeodesiaPolicy::Maintain).
  for (int64_t t = 0; t < o.tokens; ++t) {
    Status st;
    if (t % o.every == 0) st = cache.BeginCall(std::min(o.every, o.tokens - t), CallKind::kPrefill);
    for (int l = 0; l < o.layers && st.ok(); ++l) {
      src[l].Row(t, k.data(), v.data());
      st = cache.Append(l, k.data(), v.data());
    }
    if (st.ok() && ((t + 1) % o.every == 0 || t + 1 == o.tokens)) st = cache.EndCall();
    if (!st.ok()) return fail("filling the cache: " + st.ToString());
    if ((t + 1) % o.every == 0) {
      for (int l = 0; l < o.layers; ++l) {
        if (Status ms = geo->Maintain(l, t + 1, &pool); !ms.ok()) return fail(ms.ToString());
      }
      if ((t + 1) % report == 0) {
        err << "  filled " << (t + 1) << " / " << o.tokens << " tokens, resident "
            << FormatBytes(static_cast<double>(cache.ResidentBytes())) << ", peak RSS "
            << FormatBytes(static_cast<double>(PeakRssBytes())) << "\n"
            << std::flush;
      }
    }
  }
  const double fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // One decode step.
  const int64_t pos = cache.n_tokens();
  std::vector<float> q(int64_t{g.n_q_heads} * g.k_dim), att(int64_t{g.n_q_heads} * g.v_dim);
  const auto t1 = Clock::now();
  Status st = cache.BeginCall(1, CallKind::kDecode);
  for (int l = 0; l < o.layers && st.ok(); ++l) {
    src[l].Row(pos, k.data(), v.data());
    st = cache.Append(l, k.data(), v.data());
  }
  for (int l = 0; l < o.layers && st.ok(); ++l) {
    src[l].Query(q.data(), static_cast<int>(q.size()));
    st = cache.Attend(l, q.data(), pos, &pool, att.data());
  }
  if (st.ok()) st = cache.EndCall();
  if (!st.ok()) return fail("decode step: " + st.ToString());
  const double step_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const int64_t T = cache.n_tokens();
  const int64_t resident = cache.ResidentBytes();
  const int64_t full = T * cache.FullBytesPerToken();
  int64_t graded_total = 0, store_bytes = 0, graded_alloc = 0;
  std::array<int64_t, geodesia::kNumLevels> hist{};
  for (int l = 0; l < o.layers; ++l) {
    const auto& gl = geo->graded(l);
    graded_total += gl.resident_bytes().total();
    graded_alloc += gl.allocated_bytes();
    store_bytes += cache.store(l).resident_bytes();
    for (int h = 0; h < g.n_kv_heads; ++h) {
      const auto hh = gl.level_histogram(h);
      for (int i = 0; i < geodesia::kNumLevels; ++i) hist[i] += hh[i];
    }
  }
  const double values = 2.0 * T * g.k_dim * g.n_kv_heads * o.layers;
  const int64_t rss = PeakRssBytes();
  const double gib = 1024.0 * 1024 * 1024;
  Table t({"figure", "value"});
  t.AddRow({"tokens", std::to_string(T)});
  t.AddRow({"full bf16 KV", FormatBytes(static_cast<double>(full))});
  t.AddRow({"resident (engine: store pages + graded live bytes)",
            FormatBytes(static_cast<double>(resident)) + " = " +
                FormatFixed(resident / gib, 3) + " GiB"});
  t.AddRow({"graded resident (payload+scales+boxes+residual)",
            FormatBytes(static_cast<double>(graded_total))});
  t.AddRow({"LayerStore pages still held", FormatBytes(static_cast<double>(store_bytes))});
  t.AddRow({"graded slab capacity (live + free slots)",
            FormatBytes(static_cast<double>(graded_alloc))});
  t.AddRow({"resident / full", FormatFixed(static_cast<double>(resident) / full, 4)});
  t.AddRow({"resident bits/value (engine bytes)", FormatFixed(8.0 * resident / values, 3)});
  t.AddRow({"process peak RSS", FormatBytes(static_cast<double>(rss)) + " = " +
                                    FormatFixed(rss / gib, 3) + " GiB"});
  t.AddRow({"peak RSS / resident", FormatFixed(static_cast<double>(rss) / resident, 3)});
  std::string h;
  for (int i = 0; i < geodesia::kNumLevels; ++i) {
    h += (i ? ", " : "") + std::to_string(geodesia::kLevels[i]) + ":" + std::to_string(hist[i]);
  }
  t.AddRow({"blocks per level (all heads, layers)", h});
  t.AddRow({"fill time", FormatFixed(fill_s, 1) + " s"});
  t.AddRow({"decode step (all layers)", FormatFixed(step_s * 1e3, 1) + " ms"});
  out << "capacity, " << o.layers << " layers x " << o.kv_heads << " KV heads x head dim "
      << o.head_dim << " (" << cache.FullBytesPerToken() << " B/token at bf16), policy "
      << o.policy << " (" << geo->config().ToString() << ")\n";
  t.Print(out);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"tokens", T},
                        {"layers", o.layers},
                        {"kv_heads", o.kv_heads},
                        {"head_dim", o.head_dim},
                        {"policy", o.policy},
                        {"full_bytes", full},
                        {"resident_bytes", resident},
                        {"graded_resident_bytes", graded_total},
                        {"store_bytes", store_bytes},
                        {"graded_allocated_bytes", graded_alloc},
                        {"peak_rss_bytes", rss},
                        {"fill_seconds", fill_s},
                        {"decode_step_seconds", step_s}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
