// `strata bench attention`: per-step decode attention time, bytes read and resident bytes of the
// registered cache policies over one attention layer (MLA or GQA), with the ratios against `full`
// measured in the same process. The layer's rows and decode queries are a model's own (captured
// from its prefill and decode, cli/bench_capture.h) or, with --rows random, synthetic.
//
// Every policy is built by the registry (kv/registry.h) from its `--policy` item
// (NAME[:key=value...], the shorthand flags filling the shared settings) and runs through
// KvCache exactly as in decoding: `ctx` rows (the same rows for every policy), an
// explicit compression point (Compress(): no prefill observation, so policies that learn from
// prompt queries start from the first decode query), `warmup` untimed decode steps, then `steps`
// timed ones: append one token and read it through the policy (KvCache::Attend). The caches are
// built first and the timed steps run round-robin over them, so load on a shared machine hits
// every policy alike; the best step is reported.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/bench_capacity_mla.h"
#include "cli/bench_capture.h"
#include "cli/bench_geodesia.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "eval/runner.h"
#include "kv/achieved.h"
#include "kv/cache.h"
#include "kv/geodesia/accounting.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"
#include "kv/vestige/selector.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds of the calling thread: with one thread the read runs on it, and on a shared machine
// this does not count the time slices other processes took (wall time does).
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
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

struct Row {
  std::string label;
  bool is_full = false;
  int math_index = 0;  // which --attn-math value
  AttnMath math = AttnMath::kF32;
  int64_t ctx = 0;
  double ms = 0;
  double cpu_ms = 0;  // best step's calling-thread CPU time (1 thread: the whole read)
  double bytes = 0;          // KV bytes read per step (the engine's counters)
  double rows = 0;           // rows attended per step (per KV head summed)
  double fetched = 0;        // rows recalled from an archive per step
  int64_t fallbacks = -1;    // VestigeKV: timed steps its recall tier read densely (-1: n/a)
  int64_t resident = 0;
  // Geodesia: the reference rate accounting (GeodesiaStats) and the share of blocks at 16/8/4/2/1.
  bool geodesia = false;
  double resident_bpv = 0, read_bpv = 0, read_bpv_union = 0;
  std::string levels = "-";
  // VestigeKV: the selector's cost per block close (sigma of the closing block), wall ms.
  double ms_per_close = -1;
  // Over the timed steps, beside the full cache (kv/achieved.h).
  AchievedCompression achieved;
  CompressionCheck check;
};

}  // namespace

void AddBenchAttentionCommand(CLI::App* bench, BenchAttentionOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "attention",
      "Per-step decode attention time, bytes read and resident bytes of registered policies "
      "over one MLA or GQA layer (a model's own rows and decode queries, or random rows), "
      "against full in the same run");
  cmd->add_option("--kind", o->kind, "Layer kind: mla or gqa")->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "Context lengths in tokens (comma-separated)")
      ->capture_default_str();
  cmd->add_option("--rows", o->rows,
                  "Where rows and queries come from: model (the model's own prefill of a needle "
                  "trial over the built-in KJV haystack, then its decode queries) or random "
                  "(synthetic rows and queries: no attention structure, the worst case for a "
                  "certified recall)")
      ->capture_default_str();
  cmd->add_option("-m,--model", o->model,
                  std::string("--rows model: the GGUF (default: models/") +
                      kBenchAttentionMlaModel + " for mla, models/" + kBenchAttentionGqaModel +
                      " for gqa)");
  cmd->add_option("--layer", o->layer,
                  "--rows model: the model's cache layer to capture (-1: its last of --kind)")
      ->capture_default_str();
  cmd->add_option("--heads", o->heads, "--rows random, mla: query heads (default 16)");
  cmd->add_option("--d-c", o->d_c, "--rows random, mla: latent width d_c (default 512)");
  cmd->add_option("--d-r", o->d_r, "--rows random, mla: branch width d_r (default 64)");
  cmd->add_option("--q-heads", o->q_heads, "--rows random, gqa: query heads (default 32)");
  cmd->add_option("--kv-heads", o->kv_heads, "--rows random, gqa: KV heads (default 8)");
  cmd->add_option("--head-dim", o->head_dim, "--rows random, gqa: head dim (default 128)");
  cmd->add_option("--policy", o->policy,
                  "Policies, comma-separated, each NAME[@X][:key=value...] (`strata policies`); "
                  "full is always measured. Default: " +
                      std::string(kBenchAttentionMlaPolicies) + " (mla), " +
                      kBenchAttentionGqaPolicies + " (gqa)");
  AddPolicyFlags(cmd, &o->policy_flags);
  cmd->add_option("--steps", o->steps, "Timed decode steps")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed decode steps first")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic rows and queries, or of the model's "
                                     "needle trial")
      ->capture_default_str();
  cmd->add_option("--attn-math", o->attn_math,
                  "Attention arithmetic(s), comma-separated (f32, bf16, int8, auto): every policy "
                  "is measured under each, in the same run; speedup is against full under the "
                  "first, 'vs full same math' against full under the row's own")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchAttention(const BenchAttentionOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.kind != "mla" && o.kind != "gqa") {
    return fail("--kind must be mla or gqa, got '" + o.kind + "'");
  }
  const bool mla = o.kind == "mla";
  auto ctxs = ParseIntList("--ctx", o.ctx.empty() ? (mla ? "8192,32768" : "16384") : o.ctx);
  if (!ctxs.ok()) return fail(ctxs.status().message());
  for (int64_t c : *ctxs) {
    if (c < 1) return fail("--ctx values must be >= 1, got " + std::to_string(c));
  }
  if (o.steps < 1 || o.warmup < 0) return fail("--steps must be >= 1 and --warmup >= 0");
  if (o.threads < 0) return fail("--threads must be >= 0, got " + std::to_string(o.threads));
  if (o.rows != "model" && o.rows != "random") {
    return fail("--rows must be model or random, got '" + o.rows + "'");
  }
  const bool model_rows = o.rows == "model";
  const bool shape_given = o.heads || o.d_c || o.d_r || o.q_heads || o.kv_heads || o.head_dim;
  if (model_rows && shape_given) {
    return fail("--heads, --d-c, --d-r, --q-heads, --kv-heads and --head-dim shape random rows; "
                "with --rows model the layer's geometry is the model's (add --rows random)");
  }
  if (!model_rows && (!o.model.empty() || o.layer != -1)) {
    return fail("-m and --layer choose the model whose rows are read; they need --rows model");
  }
  const int threads = o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads();
  ThreadPool pool(threads);
  LayerGeometry g;
  std::unique_ptr<Model> model;
  std::string model_path;
  if (model_rows) {
    model_path = !o.model.empty() ? o.model
                                  : DefaultModelsDir() + "/" +
                                        (mla ? kBenchAttentionMlaModel : kBenchAttentionGqaModel);
    auto m = Model::Load(model_path);
    if (!m.ok()) {
      return fail(m.status().WithContext("cannot load model '" + model_path + "' (-m)").message());
    }
    model = std::move(*m);
    auto li = ResolveAttentionLayer(*model, mla, o.layer);
    if (!li.ok()) return fail("model '" + model_path + "': " + li.status().message());
    // The layer's geometry sizes the row and query buffers; the capture per --ctx fills them.
    g = model->CacheLayers()[*li];
    g.model_layer = -1;
  } else if (mla) {
    const int heads = o.heads ? o.heads : 16, d_c = o.d_c ? o.d_c : 512, d_r = o.d_r ? o.d_r : 64;
    if (heads < 1) return fail("--heads must be >= 1, got " + std::to_string(heads));
    if (d_c < 1 || d_r < 0) return fail("--d-c must be >= 1 and --d-r >= 0");
    g = MlaGeometry(heads, d_c, d_r);
  } else {
    const int qh = o.q_heads ? o.q_heads : 32, kvh = o.kv_heads ? o.kv_heads : 8;
    const int hd = o.head_dim ? o.head_dim : 128;
    if (kvh < 1 || qh < kvh || qh % kvh != 0) {
      return fail("--q-heads " + std::to_string(qh) + " must be a multiple of --kv-heads " +
                  std::to_string(kvh));
    }
    if (hd < 1) return fail("--head-dim must be >= 1");
    g = GqaGeometry(qh, kvh, hd);
  }
  std::vector<std::string> items = SplitComma(
      o.policy.empty() ? (mla ? kBenchAttentionMlaPolicies : kBenchAttentionGqaPolicies)
                       : o.policy);
  // full is always measured, first (the ratios' reference).
  items.erase(std::remove(items.begin(), items.end(), "full"), items.end());
  items.insert(items.begin(), "full");
  // The shorthand flags reach every listed policy that declares them; one that none declares is
  // an error, and every spec is validated against its policy's declaration before anything runs.
  std::map<std::string, std::string> shared;
  for (const auto& [k, v] : o.policy_flags.values) {
    if (!v.empty()) shared[k] = v;
  }
  if (Status st = eval::CheckListSettings(items, shared); !st.ok()) return fail(st.message());
  std::vector<PolicySpec> specs;
  for (const std::string& item : items) {
    auto spec = ParsePolicySpec(item);
    if (!spec.ok()) return fail(spec.status().message());
    for (const auto& [k, v] : SettingsFor(spec->name, shared)) {
      if (Status st = AddPolicySetting(&*spec, k, v, "--" + k); !st.ok()) return fail(st.message());
    }
    if (Status st = ValidatePolicySpec(*spec); !st.ok()) {
      return fail("--policy " + item + ": " + st.message());
    }
    specs.push_back(std::move(spec).value());
  }
  // Each policy under each arithmetic (a value given twice is measured once), in groups: the
  // first arithmetic's policies, then the next's.
  std::vector<AttnMath> maths;
  for (const std::string& m : SplitComma(o.attn_math)) {
    auto pm = ParseAttnMath(m);
    if (!pm.ok()) return fail(pm.status().message());
    const AttnMath r = *pm;
    if (std::find(maths.begin(), maths.end(), r) == maths.end()) maths.push_back(r);
  }
  if (maths.empty()) return fail("--attn-math needs at least one of f32, bf16, int8, auto");
  std::vector<AttnMath> math_of;
  std::vector<int> math_index;
  {
    std::vector<std::string> labels;
    std::vector<PolicySpec> all_specs;
    for (size_t mi = 0; mi < maths.size(); ++mi) {
      for (size_t i = 0; i < items.size(); ++i) {
        labels.push_back(maths.size() > 1
                             ? items[i] + " [" + AttnMathName(maths[mi]) + "]"
                             : items[i]);
        all_specs.push_back(specs[i]);
        math_of.push_back(maths[mi]);
        math_index.push_back(static_cast<int>(mi));
      }
    }
    items = std::move(labels);
    specs = std::move(all_specs);
  }
  const int64_t n_kv = int64_t{g.n_kv_heads} * g.k_dim;
  std::vector<float> k(n_kv), v(n_kv), q(int64_t{g.n_q_heads} * g.k_dim),
      att(int64_t{g.n_q_heads} * g.v_dim);
  std::vector<Row> rows;
  std::vector<std::string> describe(items.size());
  std::string source = "random rows and queries (seed " + std::to_string(o.seed) +
                       "): no attention structure, the worst case for a certified recall";
  for (int64_t ctx : *ctxs) {
    std::optional<CapturedLayer> captured;
    std::vector<RowSource> sources;
    if (model_rows) {
      auto c = CaptureLayer(*model, mla, o.layer, ctx, o.warmup + o.steps, o.seed, &pool, err);
      if (!c.ok()) return fail(c.status().message());
      captured = std::move(*c);
      source = "model rows: " + model_path + ", cache layer " + std::to_string(captured->layer) +
               " (model layer " + std::to_string(captured->geometry.model_layer) +
               "), its prefill of a " + captured->format + " needle trial (seed " +
               std::to_string(o.seed) + ", needle at " + std::to_string(captured->needle_depth) +
               ") over the built-in KJV haystack, then its own decode queries";
    }
    // Row t and decode query s of this ctx: the model's, or the synthetic source's.
    auto row = [&](size_t i, int64_t t, float* k, float* v) {
      if (!captured) return sources[i].Row(t, k, v);
      std::memcpy(k, captured->key_row(t), sizeof(float) * captured->k_stride());
      if (captured->v_stride()) {
        std::memcpy(v, captured->val_row(t), sizeof(float) * captured->v_stride());
      }
    };
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<CacheCounters> counters0(items.size());  // before the timed steps
    std::vector<int64_t> fallbacks0(items.size(), 0);
    for (size_t i = 0; i < items.size(); ++i) {
      auto policy = MakePolicy(specs[i]);
      if (!policy.ok()) return fail("--policy " + items[i] + ": " + policy.status().message());
      LayerGeometry gi = g;
      gi.attn_math = math_of[i];
      auto cache_or = KvCache::Create({gi}, std::move(policy).value());
      if (!cache_or.ok()) return fail("--policy " + items[i] + ": " + cache_or.status().message());
      KvCache& cache = **cache_or;
      describe[i] = cache.policy().describe();
      err << "[" << items[i] << "] ctx " << ctx << ": filling " << ctx << " tokens...\n"
          << std::flush;
      sources.emplace_back(o.seed + static_cast<uint64_t>(ctx), g);
      Status st = cache.BeginCall(ctx, CallKind::kPrefill, &pool);
      for (int64_t t = 0; t < ctx && st.ok(); ++t) {
        row(i, t, k.data(), v.data());
        st = cache.Append(0, k.data(), v.data());
      }
      if (st.ok()) st = cache.EndCall();
      if (st.ok()) st = cache.Compress();
      if (!st.ok()) return fail("--policy " + items[i] + ": filling the cache: " + st.ToString());
      caches.push_back(std::move(cache_or).value());
    }
    const size_t n_pol = items.size();
    std::vector<std::vector<double>> times(n_pol), cpu_times(n_pol);
    std::vector<ReadStats> sums(n_pol);
    for (int s = 0; s < o.warmup + o.steps; ++s) {
      for (size_t i = 0; i < n_pol; ++i) {
        KvCache& cache = *caches[i];
        const int64_t pos = cache.n_tokens();
        row(i, pos, k.data(), v.data());
        Status st = cache.BeginCall(1, CallKind::kDecode, &pool);
        if (st.ok()) st = cache.Append(0, k.data(), v.data());
        if (captured) {
          std::memcpy(q.data(), captured->query(s), sizeof(float) * q.size());
        } else {
          sources[i].Query(q.data(), static_cast<int>(q.size()));
        }
        const auto t0 = Clock::now();
        const double c0 = ThreadCpuSeconds();
        if (st.ok()) st = cache.Attend(0, q.data(), pos, &pool, att.data());
        const double cpu_ms = 1e3 * (ThreadCpuSeconds() - c0);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (st.ok()) st = cache.EndCall();
        if (!st.ok()) return fail("--policy " + items[i] + ": decode step: " + st.ToString());
        if (s + 1 == o.warmup) {
          counters0[i] = cache.counters();
          if (auto* vp = dynamic_cast<VestigePolicy*>(&cache.policy())) {
            fallbacks0[i] = vp->fallbacks();
          }
        }
        if (s >= o.warmup) {
          times[i].push_back(ms);
          cpu_times[i].push_back(cpu_ms);
          const ReadStats& st = cache.counters().last_step;
          sums[i].bytes_read += st.bytes_read;
          sums[i].rows_attended += st.rows_attended;
          sums[i].rows_fetched += st.rows_fetched;
        }
      }
    }
    for (size_t i = 0; i < n_pol; ++i) {
      KvCache& cache = *caches[i];
      std::sort(times[i].begin(), times[i].end());
      std::sort(cpu_times[i].begin(), cpu_times[i].end());
      Row r;
      r.label = items[i];
      r.is_full = specs[i].name == "full";
      r.math_index = math_index[i];
      r.math = math_of[i];
      r.ctx = ctx;
      r.ms = times[i][0];  // best step: robust to load from other processes on a shared machine
      r.cpu_ms = cpu_times[i][0];
      r.bytes = static_cast<double>(sums[i].bytes_read) / o.steps;
      r.rows = static_cast<double>(sums[i].rows_attended) / o.steps;
      r.fetched = static_cast<double>(sums[i].rows_fetched) / o.steps;
      r.resident = cache.ResidentBytes();
      r.achieved = MeasureAchieved(cache, counters0[i]);
      r.check = CheckAchieved(items[i] + " ctx " + std::to_string(ctx), r.achieved);
      if (auto* vp = dynamic_cast<VestigePolicy*>(&cache.policy())) {
        if (vp->closes() > 0) {
          r.ms_per_close = 1e3 * vp->close_seconds() / static_cast<double>(vp->closes());
        }
        if (vp->config().recall) r.fallbacks = vp->fallbacks() - fallbacks0[i];
      }
      if (auto* geo = dynamic_cast<GeodesiaPolicy*>(&cache.policy())) {
        r.geodesia = true;
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
      }
      rows.push_back(r);
    }
  }
  out << "bench attention: " << o.kind << " " << g.ToString() << ", " << pool.size()
      << " threads; best of " << o.steps << " decode steps after " << o.warmup
      << " untimed; ratios vs full in this run\n"
      << "rows: " << source << "\n"
      << CpuDotSummary() << "\n";
  for (size_t i = 0; i < items.size(); ++i) out << "  " << items[i] << ": " << describe[i] << "\n";
  // Every column, defined once: the header is built from this list and the legend printed
  // under the table is the same list.
  const std::vector<ColumnDoc> columns = {
      {"ctx", "context length: rows in the cache before the timed decode steps"},
      {"policy", "the --policy item (NAME[@X][:key=value...]); its settings are listed above"},
      {"ms/step", "wall time of the best timed decode step (one query through the policy)"},
      {"speedup", "full's ms/step (first --attn-math) / this row's ms/step, same ctx, same run"},
      {"vs full same math", "full's ms/step under this row's --attn-math / this row's ms/step"},
      {"cpu ms/step", "CPU time of the calling thread in the best-CPU step (with --threads 1: the "
                      "whole read, without the time slices a shared machine gave others)"},
      {"cpu speedup", "full's cpu ms/step (first --attn-math) / this row's cpu ms/step"},
      {"KV bytes read/step", "bytes the read touched per step: rows, indexes, scales, summaries"},
      {"read ratio", "KV bytes read/step / full's at the same ctx"},
      {"rows read/step", "rows whose full K/V were read per step, summed over KV heads"},
      {"fetched/step", "rows recalled from an archive file per step (VestigeKV; 0 for others)"},
      {"fallbacks", "VestigeKV with recall: timed steps whose recall tier read every row densely "
                    "('-': no recall tier)"},
      {"resident", "bytes the policy holds in RAM after the timed steps"},
      {"resident ratio", "resident / full's resident at the same ctx"},
      {"rows kept", "rows the policy reads without a recall / rows visible ('-': no selection)"},
      {"compressed", "yes: the policy changed what it holds or reads; NO: it did not; - full"},
      {"ms/close", "VestigeKV: selector wall ms per closed block ('-': no block closed)"},
      {"bpv resident (1.5)",
       "Geodesia: resident bits per cached value (docs/reference/geodesia-kv.md §1.5)"},
      {"bpv read/q-head", "Geodesia: bits read per value for one query head"},
      {"bpv read/kv-head", "Geodesia: bits read per value for the union over a KV head's queries"},
      {"% blocks 16/8/4/2/1", "Geodesia: share of 64-row blocks stored at 16/8/4/2/1 bits"},
  };
  Table t(ColumnNames(columns));
  nlohmann::json results = nlohmann::json::array();
  const Row* full = nullptr;       // full under the first arithmetic: first for each ctx
  const Row* full_same = nullptr;  // full under the row's arithmetic: first of its group
  for (const Row& r : rows) {
    if (r.is_full && r.math_index == 0) full = &r;
    if (r.is_full) full_same = &r;
    t.AddRow({std::to_string(r.ctx), r.label, FormatFixed(r.ms, 3),
              FormatFixed(full->ms / r.ms, 2) + "x", FormatFixed(full_same->ms / r.ms, 2) + "x",
              FormatFixed(r.cpu_ms, 3), FormatFixed(full->cpu_ms / r.cpu_ms, 2) + "x",
              FormatBytes(r.bytes),
              FormatFixed(r.bytes / full->bytes, 4), FormatFixed(r.rows, 1),
              FormatFixed(r.fetched, 1),
              r.fallbacks >= 0 ? std::to_string(r.fallbacks) + "/" + std::to_string(o.steps) : "-",
              FormatBytes(static_cast<double>(r.resident)),
              FormatFixed(static_cast<double>(r.resident) / full->resident, 4),
              eval::KeptText(r.achieved), eval::CompressedText(r.achieved, r.check),
              r.ms_per_close >= 0 ? FormatFixed(r.ms_per_close, 3) : "-",
              r.geodesia ? FormatFixed(r.resident_bpv, 3) : "-",
              r.geodesia ? FormatFixed(r.read_bpv, 3) : "-",
              r.geodesia ? FormatFixed(r.read_bpv_union, 3) : "-", r.levels});
    results.push_back({{"ctx", r.ctx},
                       {"policy", r.label},
                       {"ms_per_step", r.ms},
                       {"speedup_vs_full", full->ms / r.ms},
                       {"speedup_vs_full_same_math", full_same->ms / r.ms},
                       {"cpu_ms_per_step", r.cpu_ms},
                       {"cpu_speedup_vs_full", full->cpu_ms / r.cpu_ms},
                       {"attn_math", AttnMathName(r.math)},
                       {"kv_bytes_read_per_step", r.bytes},
                       {"read_ratio_vs_full", r.bytes / full->bytes},
                       {"rows_read_per_step", r.rows},
                       {"rows_fetched_per_step", r.fetched},
                       {"recall_fallbacks", r.fallbacks >= 0 ? nlohmann::json(r.fallbacks)
                                                             : nlohmann::json(nullptr)},
                       {"resident_bytes", r.resident},
                       {"resident_ratio_vs_full", static_cast<double>(r.resident) / full->resident},
                       {"level_shares_16_8_4_2_1", r.levels}});
    if (r.ms_per_close >= 0) results.back()["ms_per_block_close"] = r.ms_per_close;
    eval::AddAchievedFields(r.achieved, r.check, &results.back());
    if (r.geodesia) {
      results.back()["resident_bpv_spec"] = r.resident_bpv;
      results.back()["read_bpv_per_query_head"] = r.read_bpv;
      results.back()["read_bpv_union_per_kv_head"] = r.read_bpv_union;
    }
  }
  t.Print(out);
  PrintLegend(columns, out);
  if (mla && g.rope_dim > 0) {
    // The selector's sigma on one random 4096-row block of this geometry (branch channels,
    // kappa 16), both back-ends in this run on this thread: best of 5 each.
    const int64_t n = 4096;
    const int width = g.k_dim;
    Rng rng(o.seed);
    std::vector<uint16_t> block(static_cast<size_t>(n) * width);
    for (auto& v : block) v = F32ToBf16(static_cast<float>(rng.Normal()));
    std::vector<float> sigma(n);
    auto best_ms = [&](BlockSigma::Path path) {
      BlockSigma bs;
      bs.set_path(path);
      double best = 1e30;
      for (int rep = 0; rep < 6; ++rep) {  // the first call builds the tables: untimed
        const auto t0 = Clock::now();
        bs.Compute(block.data(), width, n, width, g.v_dim, 16, sigma.data());
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (rep > 0) best = std::min(best, ms);
      }
      return best;
    };
    const double direct = best_ms(BlockSigma::Path::kDirect);
    const double fft = best_ms(BlockSigma::Path::kFft);
    out << "selector sigma per " << n << "-row close (" << g.rope_dim
        << " branch channels, kappa 16, 1 thread, best of 5): direct partial DFT "
        << FormatFixed(direct, 3) << " ms (used), KissFFT " << FormatFixed(fft, 3) << " ms; "
        << FormatFixed(fft / direct, 2) << "x\n";
  }
  // Where the resident bytes are, for the policies that hold more than cache pages.
  bool header = false;
  for (const Row& r : rows) {
    const ResidentParts& p = r.achieved.resident_parts;
    if (p.parts.size() < 2 && p.file_bytes == 0) continue;
    if (!header) out << "resident by part:\n";
    header = true;
    out << "  ctx " << r.ctx << ", " << r.label << ": " << p.ToString() << "\n";
  }
  const int64_t peak_rss = PeakRssBytes();
  out << "process peak RSS: " << FormatBytes(static_cast<double>(peak_rss)) << "\n";
  nlohmann::json warnings = nlohmann::json::array();
  for (const Row& r : rows) {
    if (r.check.warning.empty()) continue;
    out << "warning: " << r.check.warning << "\n";
    err << "warning: " << r.check.warning << "\n";
    warnings.push_back(r.check.warning);
  }
  if (!o.json_path.empty()) {
    nlohmann::json pol = nlohmann::json::object();
    for (size_t i = 0; i < items.size(); ++i) pol[items[i]] = describe[i];
    nlohmann::json j = {{"bench", "attention"}, {"kind", o.kind}, {"rows", source},
                        {"geometry", g.ToString()}, {"threads", pool.size()},
                        {"steps", o.steps},     {"warmup", o.warmup},
                        {"policies", pol},      {"results", results},
                        {"warnings", warnings}, {"peak_rss_bytes", peak_rss}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
