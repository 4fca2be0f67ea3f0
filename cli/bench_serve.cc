// `strata bench serve` (see bench_serve.h): the load generator's levels as a table, and the
// capacity of a KV budget per policy.
#include "cli/bench_serve.h"

#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/bench_capacity_mla.h"
#include "cli/bench_geodesia.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"
#include "serve/loadgen.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "serve/server.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  // Commas separate items, except inside a policy's settings ("geodesia:bits=2,window=64"
  // would be ambiguous): a comma followed by key=value continues the item.
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t eq = part.find('='), colon = part.find(':');
    if (!cur.empty() && eq != std::string::npos && (colon == std::string::npos || colon > eq)) {
      cur += "," + part;
      continue;
    }
    if (!cur.empty()) out.push_back(cur);
    cur = part;
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string Ms(double s) { return FormatFixed(s * 1e3, 1); }

// A temporary folder this command made (VestigeKV's file archive), removed at the end.
struct TempDir {
  std::string path;
  ~TempDir() {
    if (!path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

constexpr const char* kDefaultCapacityPolicies =
    "full,kivi2,kivi4,geodesia:profile=reference:bits=2,geodesia:profile=reference:bits=5,"
    "geodesia,vestige";
constexpr const char* kDefaultGeometries = "125m,qwen2.5-7b,150m,kimi-linear";

int RunCapacity(const BenchServeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (!o.url.empty()) return fail("--capacity fills caches in this process: --url does not apply");
  StatusOr<int64_t> budget =
      serve::ParseByteSize("--kv-budget", o.kv_budget.empty() ? "4GiB" : o.kv_budget);
  if (!budget.ok()) return fail(budget.status().message());
  if (*budget < 1) return fail("--kv-budget must be at least 1 byte");
  auto ctxs = ParseIntList("--ctx", o.ctx.empty() ? "16384" : o.ctx);
  if (!ctxs.ok()) return fail(ctxs.status().message());
  for (int64_t c : *ctxs) {
    if (c < 2 || c > (int64_t{1} << 24)) {
      return fail("--ctx values must be in [2, 16777216] for --capacity, got " + std::to_string(c));
    }
  }
  if (o.samples < 1 || o.samples > 64) {
    return fail("--samples must be in [1, 64], got " + std::to_string(o.samples));
  }
  if (o.threads < 0) return fail("--threads must be >= 0, got " + std::to_string(o.threads));
  const std::vector<std::string> policies =
      SplitList(o.policy.empty() ? kDefaultCapacityPolicies : o.policy);
  if (policies.empty()) return fail("--policy: no policy given");
  for (const std::string& p : policies) {
    auto spec = ParsePolicySpec(p);
    if (!spec.ok()) return fail("--policy " + p + ": " + spec.status().message());
    if (auto made = MakePolicy(*spec); !made.ok()) {
      return fail("--policy " + p + ": " + made.status().message());
    }
  }
  // The geometries: -m's model, or named shapes.
  std::vector<std::pair<std::string, std::vector<LayerGeometry>>> geometries;
  if (!o.model.empty()) {
    if (!o.geometry.empty()) return fail("give -m or --geometry, not both");
    auto m = Model::Load(o.model);
    if (!m.ok()) return fail("cannot load model '" + o.model + "' (-m): " + m.status().ToString());
    geometries.emplace_back(std::filesystem::path(o.model).stem().string(), (*m)->CacheLayers());
  } else {
    for (const std::string& g : SplitList(o.geometry.empty() ? kDefaultGeometries : o.geometry)) {
      auto layers = NamedCacheGeometry(g);
      if (!layers.ok()) return fail("--geometry: " + layers.status().message());
      geometries.emplace_back(g, *layers);
    }
  }
  ThreadPool pool(o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads());

  Table t({"geometry", "ctx", "policy", "resident / seq", "bits/value", "full / resident",
           "fit in budget", "x full", "admitted", "x full (admitted)", "fill peak / seq",
           "fill s"});
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> skipped, notes;
  for (const auto& [gname, layers] : geometries) {
    for (int64_t ctx : *ctxs) {
      int64_t full_fit = 0, full_admitted = 0, kivi4_fit = 0, full_resident = 0;
      std::vector<std::pair<std::string, int64_t>> fits;
      for (const std::string& p : policies) {
        int64_t max_b = 0, min_b = INT64_MAX, peak = 0, reserve = 0, full_per_token = 0;
        double fill_s = 0;
        Status why;
        for (int s = 0; s < o.samples && why.ok(); ++s) {
          TempDir dir;
          char tmpl[] = "/tmp/strata-bench-serve-XXXXXX";
          if (!mkdtemp(tmpl)) return fail("cannot create a temporary folder under /tmp");
          dir.path = tmpl;
          err << "[" << gname << ", ctx " << ctx << ", " << p << ", sample " << (s + 1) << "/"
              << o.samples << "] filling\n"
              << std::flush;
          auto f = FillSequence(layers, p, ctx, o.seed + static_cast<uint64_t>(s) * 7919u, &pool,
                                dir.path);
          if (!f.ok()) {
            why = f.status();
            break;
          }
          const int64_t b = f->cache->ResidentBytes();
          max_b = std::max(max_b, b);
          min_b = std::min(min_b, b);
          peak = std::max(peak, f->peak_bytes);
          fill_s += f->fill_s;
          reserve = serve::Scheduler::PromptReserve(*f->cache, ctx - 1);
          full_per_token = f->cache->FullBytesPerToken();
        }
        if (!why.ok()) {
          skipped.push_back(p + " on " + gname + ": " + why.message());
          continue;
        }
        const int64_t fit = FitCapacity(*budget, max_b);
        const int64_t admitted = AdmittedCapacity(*budget, reserve, max_b);
        const double bits = 16.0 * static_cast<double>(max_b) /
                            (static_cast<double>(ctx) * static_cast<double>(full_per_token));
        const std::string name = ParsePolicySpec(p)->name;
        if (name == "full" && full_fit == 0) {
          full_fit = fit;
          full_admitted = admitted;
          full_resident = max_b;
        }
        if (p == "kivi4") kivi4_fit = fit;
        fits.emplace_back(p, fit);
        auto ratio = [](int64_t a, int64_t b) {
          return b > 0 ? FormatFixed(static_cast<double>(a) / static_cast<double>(b), 2) : "-";
        };
        std::string res = FormatBytes(static_cast<double>(max_b));
        if (min_b != max_b) res += " (min " + FormatBytes(static_cast<double>(min_b)) + ")";
        t.AddRow({gname, std::to_string(ctx), p, res, FormatFixed(bits, 3),
                  full_resident > 0 ? ratio(full_resident, max_b) : "-", std::to_string(fit),
                  ratio(fit, full_fit), std::to_string(admitted), ratio(admitted, full_admitted),
                  FormatBytes(static_cast<double>(peak)), FormatFixed(fill_s / o.samples, 1)});
        rows.push_back(
            {{"geometry", gname},
             {"layers", static_cast<int64_t>(layers.size())},
             {"ctx", ctx},
             {"policy", p},
             {"resident_bytes_per_seq", max_b},
             {"resident_bytes_per_seq_min", min_b},
             {"samples", o.samples},
             {"full_bytes_per_token", full_per_token},
             {"bits_per_value", bits},
             {"prompt_reserve_bytes", reserve},
             {"fill_peak_bytes", peak},
             {"kv_budget_bytes", *budget},
             {"fit", fit},
             {"admitted", admitted},
             {"fit_ratio_to_full", full_fit > 0 ? static_cast<double>(fit) / full_fit : 0.0},
             {"fill_seconds", fill_s / o.samples}});
      }
      for (const auto& [p, fit] : fits) {
        if (ParsePolicySpec(p)->name != "geodesia" || full_fit == 0) continue;
        std::string line = gname + " ctx " + std::to_string(ctx) + ": " + p + " fits " +
                           std::to_string(fit) + " sequences, " +
                           FormatFixed(static_cast<double>(fit) / full_fit, 2) + "x full's " +
                           std::to_string(full_fit);
        if (kivi4_fit > 0) {
          line += " and " + FormatFixed(static_cast<double>(fit) / kivi4_fit, 2) + "x kivi4's " +
                  std::to_string(kivi4_fit);
        }
        notes.push_back(line);
      }
    }
  }
  out << "capacity: sequences of --ctx tokens in --kv-budget " << FormatBytes(*budget)
      << ", measured by the policies' ResidentBytes after prefill + one decode step (" << o.samples
      << " sample" << (o.samples > 1 ? "s" : "") << " each, the largest counted)\n";
  t.Print(out);
  for (const auto& n : notes) out << n << "\n";
  if (!notes.empty()) {
    out << "(the Geodesia-KV paper reports 8.8x full and 2.5x KIVI-4 for its 2-bit setting)\n";
  }
  for (const auto& s : skipped) out << "not run: " << s << "\n";
  out << "Legend: resident / seq = the cache's ResidentBytes (what the scheduler counts) after "
         "ctx - 1 prompt rows in 512-row prefill calls, the compression point and one decode "
         "step; bits/value = 16 x resident / the bf16 full cache's bytes; fit = floor(budget / "
         "resident); admitted = the most the scheduler runs at once (the N-th is admitted when "
         "N - 1 resident sequences and its prompt's full-rate reserve fit); fill peak = the "
         "largest ResidentBytes during the fill (before the compression point the policy holds "
         "the prompt uncompressed).\n";
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"mode", "capacity"}, {"kv_budget_bytes", *budget}, {"rows", rows}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

int RunLoadMode(const BenchServeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.model.empty() == o.url.empty()) {
    return fail(
        "give either -m MODEL (an in-process server) or --url http://127.0.0.1:PORT (a "
        "running one)");
  }
  if (!o.geometry.empty()) return fail("--geometry is for --capacity");
  auto streams = ParseIntList("--streams", o.streams);
  if (!streams.ok()) return fail(streams.status().message());
  for (int64_t k : *streams) {
    if (k < 1 || k > 1024)
      return fail("--streams values must be in [1, 1024], got " + std::to_string(k));
  }
  auto ctxs = ParseIntList("--ctx", o.ctx.empty() ? "128" : o.ctx);
  if (!ctxs.ok()) return fail(ctxs.status().message());
  if (o.max_tokens < 1)
    return fail("--max-tokens must be >= 1, got " + std::to_string(o.max_tokens));
  for (int64_t c : *ctxs) {
    if (c <= o.max_tokens) {
      return fail("--ctx " + std::to_string(c) + " leaves no prompt: each request is ctx - " +
                  "--max-tokens (" + std::to_string(o.max_tokens) + ") prompt tokens");
    }
  }
  if (o.requests_per_stream < 1) {
    return fail("--requests-per-stream must be >= 1, got " + std::to_string(o.requests_per_stream));
  }
  if (!(o.duration > 0)) return fail("--duration must be > 0 seconds");
  if (SplitList(o.policy).size() > 1) {
    return fail("--policy: the load generator takes one policy (a list is for --capacity)");
  }
  const int64_t max_k = *std::max_element(streams->begin(), streams->end());
  const int64_t max_ctx = *std::max_element(ctxs->begin(), ctxs->end());

  // --prefill-chunk: one in-process server per value, every level run against each, so the
  // rows compare step budgets in one run.
  std::vector<int64_t> chunks;
  if (!o.prefill_chunk.empty()) {
    if (!o.url.empty()) {
      return fail(
          "--prefill-chunk configures the in-process server (-m); with --url the running "
          "server's own setting applies");
    }
    auto c = ParseIntList("--prefill-chunk", o.prefill_chunk);
    if (!c.ok()) return fail(c.status().message());
    for (int64_t v : *c) {
      if (v < 1 || v > (int64_t{1} << 20)) {
        return fail("--prefill-chunk values must be in [1, 1048576], got " + std::to_string(v));
      }
    }
    chunks = *c;
  } else {
    chunks = {o.url.empty() ? int64_t{serve::kDefaultPrefillChunk} : 0};  // 0: the server's own
  }

  // The server: a running one, or one started here on a free loopback port.
  std::unique_ptr<Model> model;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string where;
  serve::ServerOptions so;
  if (!o.url.empty()) {
    if (o.parallel != 0 || !o.kv_budget.empty() || o.threads != 0) {
      return fail(
          "--parallel, --kv-budget and --threads configure the in-process server (-m); "
          "with --url the running server's own settings apply");
    }
    auto u = serve::ParseLoopbackUrl(o.url);
    if (!u.ok()) return fail(u.status().message());
    host = u->host;
    port = u->port;
    where = o.url;
  } else {
    StatusOr<int64_t> budget =
        serve::ParseByteSize("--kv-budget", o.kv_budget.empty() ? "8GiB" : o.kv_budget);
    if (!budget.ok()) return fail(budget.status().message());
    if (o.parallel < 0) return fail("--parallel must be >= 0 (0: the largest --streams)");
    if (o.threads < 0) return fail("--threads must be >= 0, got " + std::to_string(o.threads));
    if (o.queue < 0) return fail("--queue must be >= 0, got " + std::to_string(o.queue));
    auto m = Model::Load(o.model);
    if (!m.ok()) return fail("cannot load model '" + o.model + "' (-m): " + m.status().ToString());
    model = std::move(m).value();
    so.host = "127.0.0.1";
    so.port = 0;
    so.model_name = std::filesystem::path(o.model).stem().string();
    so.parallel = static_cast<int>(o.parallel > 0 ? o.parallel : max_k);
    so.kv_budget = *budget;
    so.queue = static_cast<int>(o.queue);
    so.threads = o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads();
    so.ctx = max_ctx;
    if (!o.policy.empty()) so.policy = o.policy;
    where = "in process: " + o.model + ", " + std::to_string(so.parallel) + " slots, " +
            std::to_string(so.threads) + " threads, KV budget " +
            FormatBytes(static_cast<double>(so.kv_budget));
  }
  err << "bench serve: " << where << "\n" << std::flush;

  Table t({"prefill chunk", "ctx", "streams", "ok / sent", "tokens", "aggregate tok/s",
           "decode tok/s", "x 1 stream", "TTFT p50/p90/p99 ms", "ITL p50/p90/p99 ms"});
  nlohmann::json levels = nlohmann::json::array();
  std::vector<std::string> problems;
  std::string model_name;
  for (int64_t chunk : chunks) {
    std::unique_ptr<serve::Server> server;
    if (model) {
      so.prefill_chunk = static_cast<int>(chunk);
      auto s = serve::Server::Create(model.get(), so);
      if (!s.ok()) return fail(s.status().message());
      server = std::move(s).value();
      auto p = server->Start();
      if (!p.ok()) return fail(p.status().message());
      port = *p;
      err << "bench serve: prefill chunk " << chunk << ", http://127.0.0.1:" << port << "\n"
          << std::flush;
    }
    const std::string chunk_label = chunk > 0 ? std::to_string(chunk) : "(server's)";
    for (int64_t ctx : *ctxs) {
      double single = 0;
      for (int64_t k : *streams) {
        serve::LoadOptions lo;
        lo.host = host;
        lo.port = port;
        lo.api_key = o.api_key;
        lo.streams = static_cast<int>(k);
        lo.requests_per_stream = static_cast<int>(o.requests_per_stream);
        lo.prompt_tokens = ctx - o.max_tokens;
        lo.max_tokens = o.max_tokens;
        lo.policy = o.policy;
        lo.duration_s = o.duration;
        lo.seed = o.seed;
        const std::string label = "[prefill chunk " + chunk_label + ", ctx " + std::to_string(ctx) +
                                  ", " + std::to_string(k) + " stream" + (k > 1 ? "s" : "") + "]";
        lo.progress = [&](const std::string& line) { err << label << line << "\n" << std::flush; };
        err << label << " " << k * o.requests_per_stream << " requests of " << lo.prompt_tokens
            << " prompt + " << o.max_tokens << " tokens\n"
            << std::flush;
        auto r = serve::RunLoad(lo);
        if (!r.ok()) {
          if (server) server->Stop();
          return fail(r.status().message());
        }
        model_name = r->model;
        // The decode rate: the client's window; with one stream whose chunks reached the client
        // in one read (a model faster than the client reads), the server's timings instead.
        double decode = r->decode_window_tokens > 0 ? r->decode_tok_s : 0;
        std::string source = r->decode_window_tokens > 0 ? "client" : "";
        if (decode == 0 && k == 1 && r->server_decode_s > 0) {
          decode = static_cast<double>(r->server_decode_tokens) / r->server_decode_s;
          source = "server timings";
        }
        if (k == 1) single = decode;
        const double ratio = single > 0 && decode > 0 ? decode / single : 0;
        auto pct = [](const serve::Percentiles& p) {
          return Ms(p.p50) + " / " + Ms(p.p90) + " / " + Ms(p.p99);
        };
        t.AddRow({chunk_label, std::to_string(ctx), std::to_string(k),
                  std::to_string(r->ok) + " / " + std::to_string(r->requests),
                  std::to_string(r->streamed_tokens), FormatFixed(r->aggregate_tok_s, 1),
                  decode > 0 ? FormatFixed(decode, 1) + (source == "client" ? "" : " (s)") : "-",
                  ratio > 0 ? FormatFixed(ratio, 2) : "-", pct(r->ttft_s), pct(r->itl_s)});
        for (const auto& e : r->errors) problems.push_back(label + " " + e);
        if (r->cut > 0) {
          problems.push_back(label + " " + std::to_string(r->cut) +
                             " requests hung up at --duration");
        }
        if (source == "server timings") {
          problems.push_back(label +
                             " decode tok/s (s) is the server's timings: the stream's chunks "
                             "reached the client in one read (the model generates faster than "
                             "they are read)");
        } else if (decode == 0) {
          // No decode rate: the window needs two chunks that arrived while every stream was
          // generating, and with one stream the server sent no timings either.
          problems.push_back(
              label + (k == 1 ? " no decode rate: the stream's chunks reached the client in one "
                                "read and the server sent no timings; raise --max-tokens"
                              : " no decode rate: no two chunks arrived while all " +
                                    std::to_string(k) +
                                    " streams were generating; raise --max-tokens"));
        }
        auto pj = [](const serve::Percentiles& p) {
          return nlohmann::json{{"n", p.n},     {"mean", p.mean}, {"p50", p.p50},
                                {"p90", p.p90}, {"p99", p.p99},   {"max", p.max}};
        };
        levels.push_back({{"prefill_chunk", chunk},
                          {"ctx", ctx},
                          {"streams", k},
                          {"prompt_tokens_per_request", lo.prompt_tokens},
                          {"max_tokens", o.max_tokens},
                          {"requests", r->requests},
                          {"ok", r->ok},
                          {"failed", r->failed},
                          {"cut", r->cut},
                          {"errors", r->errors},
                          {"prompt_tokens", r->prompt_tokens},
                          {"completion_tokens", r->completion_tokens},
                          {"streamed_tokens", r->streamed_tokens},
                          {"wall_seconds", r->wall_s},
                          {"aggregate_tok_s", r->aggregate_tok_s},
                          {"decode_tok_s", decode},
                          {"decode_source", source.empty() ? "none" : source},
                          {"server_decode_tokens", r->server_decode_tokens},
                          {"server_decode_seconds", r->server_decode_s},
                          {"decode_window_seconds", r->decode_window_s},
                          {"decode_window_tokens", r->decode_window_tokens},
                          {"decode_ratio_to_1_stream", ratio},
                          {"ttft_seconds", pj(r->ttft_s)},
                          {"itl_seconds", pj(r->itl_s)}});
      }
    }
    if (server) server->Stop();
  }
  out << "bench serve: " << where << ", model '" << model_name << "', policy "
      << (o.policy.empty() ? "(the server's default)" : o.policy) << ", " << o.max_tokens
      << " tokens per request (ignore_eos), " << o.requests_per_stream
      << " request(s) per stream\n";
  t.Print(out);
  for (const auto& p : problems) out << "note: " << p << "\n";
  out << "Legend: prefill chunk = the in-process server's --prefill-chunk (new-prompt tokens "
         "prefilled per step between decode steps); ctx = prompt + generated tokens of each "
         "request; aggregate tok/s = streamed tokens / the level's wall time (prefills and "
         "queueing included); decode tok/s = tokens that arrived while every stream was "
         "generating / that time (no prefill runs then), or, marked (s), the server's timings "
         "(one stream whose chunks the client read at once); x 1 stream = decode tok/s / the 1-stream row's at the same ctx; TTFT = send to first "
         "token; ITL = gap between chunks shared by the tokens a chunk carries.\n";
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"mode", "load"},
                        {"server", where},
                        {"model", model_name},
                        {"policy", o.policy},
                        {"levels", levels}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  for (const auto& l : levels) {
    if (l["failed"].get<int64_t>() > 0) return 1;  // requests failed: the figures are not clean
  }
  return kExitOk;
}

}  // namespace

StatusOr<std::vector<LayerGeometry>> NamedCacheGeometry(const std::string& name) {
  if (name == "qwen2.5-7b") return std::vector<LayerGeometry>(28, GqaGeometry(28, 4, 128));
  if (name == "kimi-linear") return std::vector<LayerGeometry>(7, MlaGeometry(32, 512, 64));
  SynthOptions s;
  Status st = s.ApplyPreset(name);
  if (!st.ok()) {
    return InvalidArgument("unknown geometry '" + name +
                           "' (tiny, 125m, 150m: the synth presets; qwen2.5-7b; kimi-linear)");
  }
  if (s.arch == Arch::kDeepseek2) {
    return std::vector<LayerGeometry>(s.n_layers,
                                      MlaGeometry(s.n_heads, s.kv_lora_rank, s.qk_rope_dim));
  }
  return std::vector<LayerGeometry>(s.n_layers, GqaGeometry(s.n_heads, s.n_kv_heads, s.head_dim));
}

StatusOr<FilledSequence> FillSequence(const std::vector<LayerGeometry>& layers,
                                      const std::string& policy, int64_t ctx, uint64_t seed,
                                      ThreadPool* pool, const std::string& archive_dir) {
  if (layers.empty()) return InvalidArgument("no cache layers");
  if (ctx < 2) return InvalidArgument("ctx must be >= 2, got " + std::to_string(ctx));
  StatusOr<PolicySpec> spec = ParsePolicySpec(policy);
  if (!spec.ok()) return spec.status();
  if ((spec->name == "vestige" || spec->name == "fullrow") && !spec->settings.count("archive")) {
    spec->settings["archive"] = "file:" + archive_dir;
  }
  auto made = MakePolicy(*spec);
  if (!made.ok()) return made.status();
  auto cache_or = KvCache::Create(layers, std::move(made).value());
  if (!cache_or.ok()) return cache_or.status();
  FilledSequence f;
  f.cache = std::move(cache_or).value();
  KvCache& cache = *f.cache;
  const int L = static_cast<int>(layers.size());
  // Row sources per layer: GQA rows as `bench capacity` fills them, MLA rows as its MLA mode.
  std::vector<std::unique_ptr<RowSource>> gqa(L);
  std::vector<std::unique_ptr<MlaRowSource>> mla(L);
  size_t kmax = 0, qmax = 0, omax = 0;
  for (int l = 0; l < L; ++l) {
    const LayerGeometry& g = layers[l];
    if (g.kind == AttnKind::kMla) {
      mla[l] = std::make_unique<MlaRowSource>(seed + 977u * l, g);
    } else {
      gqa[l] = std::make_unique<RowSource>(seed + l, g, 509);
    }
    kmax = std::max(kmax, static_cast<size_t>(g.n_kv_heads) * g.k_dim);
    qmax = std::max(qmax, static_cast<size_t>(g.n_q_heads) * g.k_dim);
    omax = std::max(omax, static_cast<size_t>(g.n_q_heads) * g.v_dim);
  }
  std::vector<float> k(kmax), v(kmax), q(qmax), att(omax);
  auto append = [&](int64_t pos) -> Status {
    for (int l = 0; l < L; ++l) {
      if (mla[l]) {
        mla[l]->Row(l, pos, k.data());
        RETURN_IF_ERROR(cache.Append(l, k.data(), nullptr));
      } else {
        gqa[l]->Row(pos, k.data(), v.data());
        RETURN_IF_ERROR(cache.Append(l, k.data(), v.data()));
      }
    }
    return OkStatus();
  };
  const auto t0 = Clock::now();
  const int64_t prompt = ctx - 1;
  constexpr int64_t kChunk = 512;  // the scheduler's prefill chunk
  for (int64_t t = 0; t < prompt; t += kChunk) {
    const int64_t n = std::min(kChunk, prompt - t);
    RETURN_IF_ERROR(cache.BeginCall(n, CallKind::kPrefill));
    for (int64_t i = 0; i < n; ++i) RETURN_IF_ERROR(append(t + i));
    f.peak_bytes = std::max(f.peak_bytes, cache.ResidentBytes());
    RETURN_IF_ERROR(cache.EndCall());
  }
  RETURN_IF_ERROR(cache.Compress());  // the end of the prompt: the compression point
  f.peak_bytes = std::max(f.peak_bytes, cache.ResidentBytes());
  const int64_t pos = prompt;
  RETURN_IF_ERROR(cache.BeginCall(1, CallKind::kDecode));
  RETURN_IF_ERROR(append(pos));
  for (int l = 0; l < L; ++l) {
    if (mla[l]) {
      mla[l]->Query(static_cast<uint64_t>(l) + 1, q.data());
    } else {
      gqa[l]->Query(q.data(), layers[l].n_q_heads * layers[l].k_dim);
    }
    RETURN_IF_ERROR(cache.Attend(l, q.data(), pos, pool, att.data()));
  }
  f.peak_bytes = std::max(f.peak_bytes, cache.ResidentBytes());
  RETURN_IF_ERROR(cache.EndCall());
  f.fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return f;
}

int64_t FitCapacity(int64_t budget, int64_t resident) {
  return resident > 0 ? budget / resident : 0;
}

int64_t AdmittedCapacity(int64_t budget, int64_t reserve, int64_t resident) {
  if (reserve > budget || resident <= 0) return 0;
  return 1 + (budget - reserve) / resident;
}

void AddBenchServeCommand(CLI::App* bench, BenchServeOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "serve",
      "Serving benchmark: K concurrent streaming clients against `strata serve` (in process with "
      "-m, or --url on loopback): tokens/s, TTFT and inter-token latency; --capacity: how many "
      "sequences of --ctx tokens fit --kv-budget per policy");
  cmd->add_option("-m,--model", o->model,
                  "Model for an in-process server on a free loopback port (--capacity: its cache "
                  "geometry)");
  cmd->add_option("--url", o->url, "A running server, http://127.0.0.1:PORT (loopback only)");
  cmd->add_option("--streams", o->streams, "Concurrent streaming clients per level, e.g. 1,4,16,64")
      ->capture_default_str();
  cmd->add_option("--ctx", o->ctx,
                  "Context per request, comma-separated (prompt = ctx - --max-tokens random token "
                  "ids; default 128); --capacity: sequence length (default 16384)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens generated per request (ignore_eos)")
      ->capture_default_str();
  cmd->add_option("--requests-per-stream", o->requests_per_stream,
                  "Requests each client sends, one after the other")
      ->capture_default_str();
  cmd->add_option("--duration", o->duration,
                  "Seconds a level may run: no request starts later, running streams are hung up")
      ->capture_default_str();
  cmd->add_option("--policy", o->policy,
                  "Cache policy of every request (default: the server's); --capacity: a list "
                  "(default " +
                      std::string(kDefaultCapacityPolicies) + ")");
  cmd->add_option("--parallel", o->parallel,
                  "In-process server: decode slots (default: the largest --streams)");
  cmd->add_option("--kv-budget", o->kv_budget,
                  "In-process server's KV budget (default 8GiB); --capacity: the budget (default "
                  "4GiB)");
  cmd->add_option("--queue", o->queue, "In-process server: requests that may wait for a slot")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "In-process server: prefill step budget(s) in tokens, comma-separated; every "
                  "level runs once per value (default " +
                      std::to_string(serve::kDefaultPrefillChunk) + ")");
  cmd->add_option("-t,--threads", o->threads,
                  "In-process server / --capacity fill: worker threads (default: all cores)");
  cmd->add_option("--api-key", o->api_key, "Sent as Authorization: Bearer KEY (--url)");
  cmd->add_option("--seed", o->seed, "Seed of the prompts and the synthetic rows")
      ->capture_default_str();
  cmd->add_flag("--capacity", o->capacity,
                "Capacity mode: sequences of --ctx tokens that fit --kv-budget, per policy");
  cmd->add_option("--geometry", o->geometry,
                  "--capacity: cache shapes (default " + std::string(kDefaultGeometries) +
                      "; also tiny), or -m for a model's own");
  cmd->add_option("--samples", o->samples,
                  "--capacity: sequences filled per policy (different rows; the largest counts)")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchServe(const BenchServeOptions& o, std::ostream& out, std::ostream& err) {
  if (o.capacity) return RunCapacity(o, out, err);
  return RunLoadMode(o, out, err);
}

}  // namespace strata::cli
