// `strata bench prefill`: prompt-processing tokens/s of each listed cache policy against `full`,
// in one process and in alternation, so that each ratio compares runs made minutes apart on the
// same loaded model rather than separate `generate` runs on a host whose speed drifts.
//
// Each round prefills the same prompt once per policy, each time right beside a prefill with
// `full` (a fresh cache each time, the model's own chunked Model::Prefill, the compression point
// included: what `generate` times as its prefill); full runs first in each pair on odd rounds and
// second on even ones, and the policies go in the listed order on odd rounds and the reverse on
// even ones. A policy's ratio in a round is its tokens/s over the tokens/s of the full run beside
// it: on a host whose speed drifts by 10-20 % over minutes (a shared VM), that compares runs made
// seconds apart. The table gives the median and the smallest ratio over the rounds, and full's
// own spread over its runs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/rng.h"
#include "kernels/membw.h"
#include "kv/policy.h"
#include "kv/registry.h"
#include "model/model.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Joined(const std::vector<double>& v, int digits) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " / " : "") + FormatFixed(v[i], digits);
  return s;
}

}  // namespace

void AddBenchPrefillCommand(CLI::App* bench, BenchPrefillOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "prefill",
      "Prefill tokens/s of each cache policy against a full run beside it, over rounds in one "
      "process (ratios per round, median and smallest)");
  cmd->add_option("-m,--model", o->model,
                  "Model (.gguf or HF directory); default: the built-in model");
  cmd->add_option("-f,--file", o->prompt_file,
                  "Prompt text file (tokenized with the model's tokenizer, BOS first); without "
                  "it the prompt is --tokens random token ids");
  cmd->add_option("--tokens", o->tokens,
                  "Prompt length in tokens: the random prompt's length, or with -f at most this "
                  "many of the file's tokens (0: 4096 random tokens, fewer if the model's trained "
                  "context is shorter, or the whole file)")
      ->capture_default_str();
  cmd->add_option("--policy", o->policy,
                  "Policies (comma-separated NAME[@X][:key=value...] items; full is always "
                  "measured, once beside each other policy per round, as its ratio's reference)")
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "Rounds: every policy prefills the prompt once per round")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Worker threads (default: the hardware threads)");
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens (as generate --chunk)")
      ->capture_default_str();
  cmd->add_option("--kv-type", o->kv_type, kKvTypeHelp)->capture_default_str();
  cmd->add_flag("--no-mmap", o->no_mmap,
                "Read the model into memory instead of mapping the file");
  cmd->add_option("--seed", o->seed, "Seed of the random prompt")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchPrefill(const BenchPrefillOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  for (const Status& st : {CheckAtLeast("--rounds", o.rounds, 1),
                           CheckAtLeast("--tokens", o.tokens, 0),
                           CheckAtLeast("--chunk", o.chunk, 1),
                           CheckAtLeast("--threads", o.threads, 0)}) {
    if (!st.ok()) return fail(st.message());
  }
  const auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return fail(kv_type.status().message());
  // The policy list: full first (the reference), each item validated before the model loads.
  std::vector<std::string> items;
  {
    std::stringstream ss(o.policy);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) return fail("--policy '" + o.policy + "' has an empty item");
      if (item != "full" && std::find(items.begin(), items.end(), item) == items.end()) {
        items.push_back(item);
      }
    }
  }
  items.insert(items.begin(), "full");
  std::vector<PolicySpec> specs;
  for (const std::string& item : items) {
    auto spec = ParsePolicySpec(item);
    if (!spec.ok()) return fail("--policy " + item + ": " + spec.status().message());
    if (Status st = ValidatePolicySpec(*spec); !st.ok()) {
      return fail("--policy " + item + ": " + st.message());
    }
    specs.push_back(std::move(spec).value());
  }
  std::string prompt_text;
  if (!o.prompt_file.empty()) {
    auto text = ReadPromptFile("-f", o.prompt_file);
    if (!text.ok()) return fail(text.status().message());
    prompt_text = std::move(*text);
  }

  std::string path;
  auto loaded = LoadCommandModel(o.model, o.no_mmap, o.models_dir, o.cache_dir, err, &path);
  if (!loaded.ok()) return fail(loaded.status().message());
  Model& m = **loaded;
  const int64_t n_vocab = m.config().n_vocab;
  // The prompt's full cache must fit in memory (each policy holds at most about as much during
  // its prefill): refuse up front rather than fail an allocation mid-run.
  {
    auto probe = m.NewCache(std::make_unique<FullPolicy>(), *kv_type);
    if (!probe.ok()) return fail(probe.status().message());
    const int64_t want = o.tokens > 0 ? o.tokens : 4096;
    const double need = static_cast<double>((*probe)->FullBytesPerToken()) * want;
    const double phys = PhysicalMemoryBytes();
    if (phys > 0 && need > 0.75 * phys) {
      return fail("--tokens " + std::to_string(want) + " needs " + FormatBytes(need) +
                  " of KV cache, more than 3/4 of the " + FormatBytes(phys) +
                  " of memory: lower --tokens");
    }
  }
  std::vector<int32_t> prompt;
  if (!o.prompt_file.empty()) {
    const Tokenizer* tok = m.tokenizer();
    if (!tok) return fail("-f: model '" + path + "' has no tokenizer (tokenizer.ggml.* metadata)");
    prompt = tok->Encode(prompt_text, /*with_bos=*/true, /*special=*/false);
    if (prompt.empty()) return fail("-f " + o.prompt_file + ": the prompt is empty");
    if (o.tokens > 0 && static_cast<int64_t>(prompt.size()) > o.tokens) prompt.resize(o.tokens);
  } else {
    Rng rng(o.seed);
    const int64_t train = m.config().n_ctx_train;
    prompt.resize(o.tokens > 0 ? o.tokens : train > 0 ? std::min<int64_t>(4096, train) : 4096);
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng.Below(n_vocab));
  }
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (m.config().n_ctx_train > 0 && n > m.config().n_ctx_train) {
    err << "warning: the prompt (" << n << " tokens) is longer than the model's trained context ("
        << m.config().n_ctx_train << ")\n";
  }
  const int threads = o.threads > 0 ? CapThreads("--threads", o.threads, err) : HardwareThreads();
  ThreadPool pool(threads);
  {
    // Every page of the model read once before timing (a mapped file may not be in memory).
    const GgufFile& f = m.file();
    volatile float sink = StreamSum(reinterpret_cast<const float*>(f.data()), f.file_size() / 4);
    (void)sink;
  }

  {
    // One untimed prefill of the first chunk with full: the work arenas and the first pages of
    // every path are touched before round 1 (else round 1's full pays for them alone).
    auto cache_or = m.NewCache(std::make_unique<FullPolicy>(), *kv_type);
    if (!cache_or.ok()) return fail(cache_or.status().message());
    std::vector<float> warm(n_vocab);
    if (Status st = m.Prefill(prompt.data(), std::min<int64_t>(n, o.chunk), o.chunk,
                              cache_or->get(), &pool, warm.data());
        !st.ok()) {
      return fail("warm-up prefill: " + st.ToString());
    }
  }
  const size_t P = specs.size();
  std::vector<std::vector<double>> rate(P), ratio(P), paired_full(P);
  std::vector<int64_t> resident(P, 0);
  std::vector<std::string> describe(P);
  std::vector<float> logits(n_vocab);
  // One timed prefill of the prompt through policy i into a fresh cache: its tokens/s.
  auto run = [&](size_t i, int r, double* tok_s) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, MakePolicy(specs[i]));
    ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, m.NewCache(std::move(policy), *kv_type));
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(m.Prefill(prompt.data(), n, o.chunk, cache.get(), &pool, logits.data()));
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    *tok_s = secs > 0 ? static_cast<double>(n) / secs : 0;
    rate[i].push_back(*tok_s);
    resident[i] = cache->ResidentBytes();
    describe[i] = cache->policy().describe();
    err << "[round " << r + 1 << "/" << o.rounds << "] " << items[i] << ": " << n << " tokens in "
        << FormatFixed(secs, 2) << " s (" << FormatFixed(*tok_s, 1) << " tok/s)\n"
        << std::flush;
    return OkStatus();
  };
  for (int r = 0; r < o.rounds; ++r) {
    // Each policy beside its own run of full (full first on odd rounds, second on even ones),
    // the policies forwards on odd rounds and backwards on even ones: a ratio compares two runs
    // made seconds apart, not a policy with a full run made minutes earlier.
    std::vector<size_t> order;
    for (size_t i = 1; i < P; ++i) order.push_back(i);
    if (r % 2 == 1) std::reverse(order.begin(), order.end());
    double f = 0, x = 0;
    if (order.empty()) {
      if (Status st = run(0, r, &f); !st.ok()) return fail("--policy full: " + st.ToString());
      ratio[0].push_back(1.0);
    }
    for (size_t i : order) {
      for (int k = 0; k < 2; ++k) {
        const bool full_now = (k == 0) == (r % 2 == 0);
        const size_t at = full_now ? 0 : i;
        if (Status st = run(at, r, full_now ? &f : &x); !st.ok()) {
          return fail("--policy " + items[at] + ": " + st.ToString());
        }
      }
      ratio[0].push_back(1.0);
      ratio[i].push_back(f > 0 ? x / f : 0);
      paired_full[i].push_back(f);
    }
  }

  const auto [lo, hi] = std::minmax_element(rate[0].begin(), rate[0].end());
  const double spread = *lo > 0 ? *hi / *lo - 1 : 0;
  out << "prefill, model " << path << " (" << ArchName(m.config().arch) << "), " << n
      << (o.prompt_file.empty() ? " random tokens" : " tokens of " + o.prompt_file) << ", "
      << threads << " thread" << (threads == 1 ? "" : "s") << ", chunk " << o.chunk << ", "
      << o.rounds << " round" << (o.rounds == 1 ? "" : "s") << ", --attn-math "
      << AttnMathName(DefaultAttnMath()) << "\n";
  const std::vector<ColumnDoc> cols = {
      {"policy", "the --policy item (full: the reference)"},
      {"tok/s median", "prompt tokens / prefill wall seconds (compression point included), "
                       "median over the runs (full: one beside each other policy per round)"},
      {"x full median", "median over the rounds of tok/s / the tok/s of the full run beside it"},
      {"x full min", "the smallest of those ratios"},
      {"x full per round", "each round's ratio, in round order"},
      {"resident MB", "bytes the cache holds after the prefill"},
  };
  Table t(ColumnNames(cols));
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < P; ++i) {
    const double med = Median(ratio[i]);
    const double mn = *std::min_element(ratio[i].begin(), ratio[i].end());
    t.AddRow({items[i], FormatFixed(Median(rate[i]), 1), FormatFixed(med, 3), FormatFixed(mn, 3),
              i == 0 ? std::string("reference") : Joined(ratio[i], 2),
              FormatFixed(resident[i] / 1e6, 2)});
    rows.push_back({{"policy", items[i]},
                    {"describe", describe[i]},
                    {"tok_per_s", rate[i]},
                    {"ratio_to_full", ratio[i]},
                    {"paired_full_tok_per_s", paired_full[i]},
                    {"ratio_median", med},
                    {"ratio_min", mn},
                    {"resident_bytes", resident[i]}});
  }
  t.Print(out);
  PrintLegend(cols, out);
  if (o.rounds > 1) {
    out << "full's rate varied by " << FormatFixed(100 * spread, 1)
        << " % between its runs (slowest to fastest): this host's run-to-run noise, which the "
           "paired ratios reduce but do not remove\n";
  } else {
    out << "caveat: one round gives no measure of this host's run-to-run noise (--rounds 3 or "
           "more)\n";
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", path},
                        {"summary", m.config().Summary()},
                        {"prompt_tokens", n},
                        {"threads", threads},
                        {"chunk", o.chunk},
                        {"rounds", o.rounds},
                        {"full_spread", spread},
                        {"results", rows}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
