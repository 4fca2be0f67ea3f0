// `strata bench capacity` (see bench_geodesia.h) and the synthetic rows `bench attention` shares.
//
// capacity: a many-layer cache filled token by token with synthetic rows, the allocator run every
// `every` tokens (GeodesiaPolicy::Maintain), so the bf16 form of the whole context never exists at
// once; then one decode step (a random query per layer). Reports the engine's resident bytes and
// the process's peak RSS. Between two allocator runs the last `every` tokens exist twice in bf16
// (LayerStore pages and level-16 slots: 2 x every x 57,344 B = 112 MiB at the Qwen2.5-7B shape
// and every = 1024), which with the per-block index tables (~66 B per block and KV head, not
// resident bytes by the reference accounting) is what peak RSS adds to the resident bytes; the
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

#include "cli/bench_capacity_mla.h"
#include "cli/common.h"
#include "core/rng.h"
#include "kv/cache.h"
#include "kv/geodesia/accounting.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

LayerGeometry GqaGeometry(int q, int kv, int d) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = q;
  g.n_kv_heads = kv;
  g.k_dim = g.v_dim = d;
  g.scale = 1.f / std::sqrt(static_cast<float>(d));
  return g;
}

RowSource::RowSource(uint64_t seed, const LayerGeometry& g, int bank) : rng_(seed), g_(g) {
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

void RowSource::Row(int64_t pos, float* k, float* v) {
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

void RowSource::Query(float* q, int n) {
  for (int i = 0; i < n; ++i) q[i] = 1.5f * static_cast<float>(rng_.Normal());
}

void AddBenchCapacityCommand(CLI::App* bench, BenchCapacityOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "capacity",
      "Fill a long cache block by block through a policy, decode one step, report where its "
      "bytes are (gqa: Geodesia at Qwen2.5-7B's shape; mla: VestigeKV at Kimi Linear's)");
  cmd->add_option("--kind", o->kind, "gqa (Geodesia-KV) or mla (VestigeKV, MLA rows)")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens to fill")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Layers (default: 28 gqa, 7 mla)");
  cmd->add_option("--q-heads", o->q_heads, "Query heads (default: 28 gqa, 32 mla)");
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads (gqa)")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim, "Head dim (gqa)")->capture_default_str();
  cmd->add_option("--d-c", o->d_c, "Latent width d_c (mla)")->capture_default_str();
  cmd->add_option("--d-r", o->d_r, "Branch width d_r (mla)")->capture_default_str();
  cmd->add_option("--policy", o->policy,
                  "NAME[@X][:key=value...]; gqa: geodesia or cquest (default geodesia@2:profile=reference, "
                  "the paper's method); mla: "
                  "any MLA policy (default vestige, with archive=file:DIR unless given)");
  cmd->add_option("--every", o->every,
                  "gqa: tokens between allocator runs during the fill (default 1024); mla: "
                  "tokens per prefill call (default 4096)");
  cmd->add_option("--archive-dir", o->archive_dir,
                  "mla: folder for VestigeKV's archive files (default: a temporary folder, "
                  "removed at the end)");
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic rows")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchCapacity(const BenchCapacityOptions& opts, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  // Positions are held in int32 by the synthetic sources and the selection's scratch; a fill
  // beyond that would run for days and need terabytes.
  constexpr int64_t kMaxTokens = int64_t{1} << 31;
  if (opts.tokens < 1 || opts.tokens > kMaxTokens) {
    return fail("--tokens must be in [1, " + std::to_string(kMaxTokens) + "], got " +
                std::to_string(opts.tokens));
  }
  if (opts.kind == "mla") return RunBenchCapacityMla(opts, out, err);
  if (opts.kind != "gqa") return fail("--kind must be gqa or mla, got '" + opts.kind + "'");
  BenchCapacityOptions o = opts;
  if (o.layers == 0) o.layers = 28;
  if (o.q_heads == 0) o.q_heads = 28;
  if (o.every == 0) o.every = 1024;
  if (o.policy.empty()) o.policy = "geodesia@2:profile=reference";
  if (o.layers < 1) return fail("--layers must be >= 1");
  if (o.kv_heads < 1 || o.q_heads % o.kv_heads != 0) {
    return fail("--q-heads " + std::to_string(o.q_heads) + " must be a multiple of --kv-heads " +
                std::to_string(o.kv_heads));
  }
  if (o.every < 64) return fail("--every must be >= 64, got " + std::to_string(o.every));
  auto spec = ParsePolicySpec(o.policy);
  if (!spec.ok()) return fail(spec.status().message());
  auto policy = MakePolicy(*spec);
  if (!policy.ok()) return fail("--policy " + o.policy + ": " + policy.status().ToString());
  const LayerGeometry g = GqaGeometry(o.q_heads, o.kv_heads, o.head_dim);
  auto cache_or = KvCache::Create(std::vector<LayerGeometry>(o.layers, g), std::move(policy).value());
  if (!cache_or.ok()) return fail("--policy " + o.policy + ": " + cache_or.status().ToString());
  KvCache& cache = **cache_or;
  auto* geo = dynamic_cast<GeodesiaPolicy*>(&cache.policy());
  if (geo == nullptr) return fail("--policy " + o.policy + ": capacity needs geodesia or cquest");
  if (o.threads < 0) return fail("--threads must be >= 0, got " + std::to_string(o.threads));
  ThreadPool pool(o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads());
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
    if (t % o.every == 0) {
      st = cache.BeginCall(std::min(o.every, o.tokens - t), CallKind::kPrefill, &pool);
    }
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
  Status st = cache.BeginCall(1, CallKind::kDecode, &pool);
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
