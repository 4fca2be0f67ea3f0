// `strata generate`: prompt -> chunked prefill into a KvCache -> sampled tokens streamed to stdout.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/runner.h"
#include "kv/achieved.h"
#include "model/model.h"
#include "model/sampler.h"

namespace strata::cli {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
std::string Rate(int64_t n, double s) { return s > 0 && n > 0 ? FormatFixed(n / s, 1) : "-"; }
}  // namespace

void AddGenerateCommand(CLI::App* app, GenerateOptions* o) {
  o->threads = HardwareThreads();
  CLI::App* cmd = app->add_subcommand(
      "generate", "Generate text from a prompt (decoded text on stdout, statistics on stderr)");
  cmd->add_option("-m,--model", o->model,
                  "Model (.gguf or HF directory); default: the built-in model");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (BOS is prepended)")
      ->capture_default_str()
      ->each([o](const std::string&) { o->prompt_given = true; });
  cmd->add_option("-f,--file", o->prompt_file,
                  "Read the prompt from this file (instead of -p); - reads standard input");
  cmd->add_option("-n,--n-predict", o->n_predict,
                  "Tokens to generate (stops early at an end-of-generation token)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "Never sample an end-of-generation token (their logits are set to -inf, as "
                "llama.cpp's --ignore-eos does): generate all -n tokens");
  cmd->add_flag("--special", o->special,
                "Parse control tokens written in the prompt (<|im_start|>, </s>, ...) as their "
                "ids");
  cmd->add_option("--stop", o->stop,
                  "Stop when the generated text contains STR (not printed; repeatable)");
  cmd->add_flag_callback(
      "-e,--escape", [o] { o->escape = true; },
      "Process escapes in -p and --stop: \\n, \\r, \\t, \\\\, \\\", \\' and \\xNN (the default, as in "
      "llama.cpp; -f files are never processed)");
  cmd->add_flag_callback("--no-escape", [o] { o->escape = false; },
                         "Take -p and --stop as written (no escapes)");
  AddSamplerFlags(cmd, &o->sampling);
  cmd->add_option("-t,--threads", o->threads,
                  "Worker threads (default: the hardware threads; more are capped to them)")
      ->capture_default_str();
  cmd->add_option("--chunk", o->chunk,
                  "Prefill chunk size in tokens (MLA models decompress the cached rows once per "
                  "chunk: longer chunks prefill long prompts faster)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Context size in tokens, prompt included; generation stops there (0: the "
                  "model's trained context length; more than that warns)")
      ->capture_default_str();
  cmd->add_flag("--no-mmap", o->no_mmap,
                "Read the model into memory (huge pages where the kernel grants them) instead of "
                "mapping the file: faster decode, the model's size in memory");
  std::string names;
  for (const auto& n : PolicyNames()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--policy", o->policy,
                  "KV cache policy NAME[:key=value...] (e.g. vestige:recall=off; `strata "
                  "policies` lists the settings; available: " + names + ")")
      ->capture_default_str();
  cmd->add_option("--policy-set", o->policy_settings,
                  "Deprecated (use NAME:key=value in --policy): policy settings key=value,...");
  AddPolicyFlags(cmd, &o->policy_flags);
  cmd->add_option("--kv-type", o->kv_type, kKvTypeHelp)->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write text and statistics as JSON to this file");
  cmd->add_flag("--verbose", o->verbose,
                "Also print per-layer block-level histograms (Geodesia-KV: blocks at 16/8/4/2/1 "
                "bits over the layer's KV heads) in the statistics");
}

int RunGenerate(const GenerateOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  // Flags first, so a bad flag is reported before any model is loaded or generated.
  for (const Status& st :
       {CheckAtLeast("-n", o.n_predict, 0), CheckAtLeast("--threads", o.threads, 1),
        CheckAtLeast("--chunk", o.chunk, 1), CheckAtLeast("-c", o.ctx_size, 0)}) {
    if (!st.ok()) return fail(st.message());
  }
  std::string prompt_text = o.prompt;
  std::vector<std::string> stop_strings = o.stop;
  if (o.escape) {
    auto p = ProcessEscapes("-p", o.prompt);
    if (!p.ok()) return fail(p.status().message());
    prompt_text = std::move(*p);
    for (std::string& s : stop_strings) {
      auto t = ProcessEscapes("--stop", s);
      if (!t.ok()) return fail(t.status().message());
      s = std::move(*t);
    }
  }
  if (Status st = StopStrings::Check(stop_strings); !st.ok()) return fail(st.message());
  if (o.prompt_given && !o.prompt_file.empty()) {
    return fail("-p and -f both give the prompt; use one");
  }
  const StatusOr<SamplerOptions> so_or = ResolveSamplerOptions(o.sampling, err);
  if (!so_or.ok()) return fail(so_or.status().message());
  SamplerOptions so = *so_or;
  if (!o.prompt_file.empty()) {
    auto text = ReadPromptFile("-f", o.prompt_file, o.in);
    if (!text.ok()) return fail(text.status().message());
    prompt_text = std::move(*text);
  }
  const std::string prompt_flag =
      o.prompt_file.empty() ? "-p" : o.prompt_file == "-" ? "-f - (stdin)" : "-f " + o.prompt_file;
  const auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return fail(kv_type.status().message());
  auto policy = MakeCliPolicy(o.policy, o.policy_settings, &o.policy_flags);
  if (!policy.ok()) return fail(policy.status().message());

  std::string path;
  auto loaded = LoadCommandModel(o.model, o.no_mmap, o.models_dir, o.cache_dir, err, &path);
  if (!loaded.ok()) return fail(loaded.status().message());
  Model& m = **loaded;
  const Tokenizer* tok = m.tokenizer();
  if (!tok) return fail("model '" + path + "' has no tokenizer (tokenizer.ggml.* metadata)");
  auto ctx_or = ResolveCtxSize(o.ctx_size, m.config(), err);
  if (!ctx_or.ok()) return fail(ctx_or.status().message());
  const int64_t ctx = *ctx_or;  // 0: no limit

  const std::vector<int32_t> prompt = tok->Encode(prompt_text, /*with_bos=*/true, o.special);
  if (prompt.empty()) {
    return fail(prompt_flag + ": the prompt is empty and the tokenizer adds no BOS");
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (ctx > 0 && n_prompt > ctx) {
    return fail(prompt_flag + ": the prompt is " + std::to_string(n_prompt) +
                " tokens, more than the context size " + std::to_string(ctx) +
                " (-c/--ctx-size; the model was trained to " +
                std::to_string(m.config().n_ctx_train) + ")");
  }
  auto cache_or = m.NewCache(std::move(policy).value(), *kv_type);
  if (!cache_or.ok()) return fail("--policy " + o.policy + ": " + cache_or.status().message());
  err << "KV cache: " << KvTypeName(*kv_type) << " rows (--kv-type)\n";
  KvCache& cache = **cache_or;
  // A -c the cache could never hold is refused now, not by std::bad_alloc mid-run (the trained
  // length taken by default is not: a short run of a long-context model needs little of it).
  if (o.ctx_size > 0) {
    if (Status st = CheckContextFitsMemory("-c", ctx, cache); !st.ok()) return fail(st.message());
  }
  const int threads = CapThreads("--threads", o.threads, err);
  ThreadPool pool(threads);
  const int64_t n_vocab = m.config().n_vocab;
  if (o.ignore_eos) {  // every end-of-generation token banned, as llama.cpp's --ignore-eos
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (IsEndOfGeneration(*tok, id)) {
        so.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
      }
    }
  }
  Sampler sampler(so);
  for (const int32_t id : prompt) sampler.Accept(id);  // the penalty window spans the prompt
  std::vector<float> logits(n_vocab);

  const auto t0 = Clock::now();
  if (Status st = m.Prefill(prompt.data(), n_prompt, o.chunk, &cache, &pool, logits.data(),
                            nullptr, PrefillProgressLines(err, "generate"));
      !st.ok()) {
    return fail("prefill: " + st.ToString());
  }
  const auto t1 = Clock::now();
  const CacheCounters counters0 = cache.counters();  // the decode steps are measured
  out << prompt_text << std::flush;

  StopStrings stops(stop_strings);
  int64_t generated = 0, decode_steps = 0;
  double decode_s = 0;
  bool hit_eos = false, hit_ctx = false;
  int32_t eog_id = -1;  // the end-of-generation token that stopped it
  for (int64_t i = 0; i < o.n_predict; ++i) {
    // Token i sits at position n_prompt + i: the context is full once that reaches -c.
    if (ctx > 0 && n_prompt + i >= ctx) {
      hit_ctx = true;
      break;
    }
    const StatusOr<int32_t> next = sampler.Next(logits.data(), n_vocab, n_prompt + i);
    if (!next.ok()) {
      out << stops.Flush() << "\n" << std::flush;
      err << "error: " << next.status().message() << "\n";
      return kExitFailed;
    }
    const int32_t id = *next;
    if (IsEndOfGeneration(*tok, id)) {
      hit_eos = true;
      eog_id = id;
      break;
    }
    sampler.Accept(id);
    out << stops.Push(tok->DecodeToken(id)) << std::flush;
    ++generated;
    if (stops.stopped()) break;
    if (i + 1 == o.n_predict) break;  // the last token's logits are never used
    const auto d0 = Clock::now();
    if (Status st = m.Decode(id, &cache, &pool, logits.data()); !st.ok()) {
      out << "\n";
      return fail("decode: " + st.ToString());
    }
    decode_s += Seconds(d0, Clock::now());
    ++decode_steps;
  }
  out << stops.Flush() << "\n" << std::flush;
  const std::string& text = stops.text();

  const double prefill_s = Seconds(t0, t1);
  const int64_t resident = cache.ResidentBytes();
  // The last decode step's reads; with no decode step (-n 0 or 1, or an EOS at once) the
  // counters hold the prefill's, which are not a per-step figure.
  const int64_t last_read = decode_steps > 0 ? cache.counters().last_step.bytes_read : 0;
  Table t({"statistic", "value"});
  t.AddRow({"prompt tokens", std::to_string(prompt.size())});
  t.AddRow({"generated tokens",
            std::to_string(generated) + (hit_eos ? " (stopped at end-of-generation token " + std::to_string(eog_id) + " '" +
                               tok->DecodeToken(eog_id, /*render_special=*/true) + "')"
                         : "") +
                (stops.stopped() ? " (stopped at --stop '" + stops.matched() + "')" : "") +
                (hit_ctx ? " (stopped at the context size " + std::to_string(ctx) + ", -c)" : "")});
  t.AddRow({"context size", ctx > 0 ? std::to_string(ctx) : "no limit"});
  t.AddRow({"prefill tokens/s", Rate(static_cast<int64_t>(prompt.size()), prefill_s)});
  t.AddRow({"decode tokens/s", Rate(decode_steps, decode_s)});
  t.AddRow({"policy", cache.policy().describe()});
  t.WrapColumn(1, 60);  // the policy's description would push the figures far right
  t.AddRow({"KV cache type", KvTypeName(*kv_type)});
  t.AddRow({"threads", std::to_string(threads)});
  t.AddRow({"KV bytes resident", std::to_string(resident) + " (" + FormatBytes(resident) + ")"});
  // Where those bytes are (tail, attended tier, index, ...) and the process's peak RSS beside.
  const ResidentParts parts = cache.ResidentBreakdown();
  if (parts.parts.size() > 1 || parts.file_bytes > 0) t.AddRow({"KV resident by part", parts.ToString()});
  const int64_t peak_rss = PeakRssBytes();
  t.AddRow({"process peak RSS", FormatBytes(static_cast<double>(peak_rss))});
  t.AddRow({"KV bytes read, last decode step",
            decode_steps > 0 ? std::to_string(last_read) + " (" + FormatBytes(last_read) + ")"
                             : "none (no decode step)"});
  // What the policy achieved, beside the full cache for the same rows and decode steps.
  const AchievedCompression achieved = MeasureAchieved(cache, counters0);
  const CompressionCheck check = CheckAchieved(cache.policy().name(), achieved);
  t.AddRow({"KV resident vs full", eval::VsFullText(achieved.resident_vs_full())});
  t.AddRow({"KV read vs full, decode steps", eval::VsFullText(achieved.read_vs_full())});
  t.AddRow({"rows kept (of visible)", eval::KeptText(achieved)});
  t.AddRow({"compressed", eval::CompressedText(achieved, check)});
  if (o.verbose) AddBlockLevelRows(achieved.levels, &t);
  err << "\n";
  t.Print(err);
  if (!check.warning.empty()) err << "warning: " << check.warning << "\n";

  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", path},
                        {"prompt", prompt_text},
                        {"text", text},
                        {"prompt_tokens", prompt.size()},
                        {"generated_tokens", generated},
                        {"stopped_at_eos", hit_eos},
                        {"stopped_at_ctx", hit_ctx},
                        // the --stop string that ended the text, or null
                        {"stopped_at_stop", stops.stopped() ? nlohmann::json(stops.matched())
                                                            : nlohmann::json()},
                        {"ctx_size", ctx},
                        {"prefill_seconds", prefill_s},
                        {"decode_steps", decode_steps},
                        {"decode_seconds", decode_s},
                        {"policy", cache.policy().describe()},
                        {"kv_type", KvTypeName(*kv_type)},
                        {"threads", threads},
                        {"kv_bytes_resident", resident},
                        {"peak_rss_bytes", peak_rss},
                        // null when there was no decode step
                        {"kv_bytes_read_last_step",
                         decode_steps > 0 ? nlohmann::json(last_read) : nlohmann::json()}};
    eval::AddAchievedFields(achieved, check, &j);
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
