// `strata eval needle|ppl|kl|ruler`: flags -> eval/ harness -> a table on stdout, optional JSON
// and SVG reports; progress on stderr.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/corpus.h"
#include "eval/needle.h"
#include "eval/report.h"
#include "eval/ruler.h"
#include "eval/stats.h"
#include "eval/svg.h"
#include "eval/windows.h"
#include "model/model.h"

namespace strata::cli {

struct EvalCliOptions {
  CLI::App* needle_cmd = nullptr;
  CLI::App* ppl_cmd = nullptr;
  CLI::App* kl_cmd = nullptr;
  CLI::App* ruler_cmd = nullptr;
  // Shared.
  std::string model;
  std::string policies = "all";
  std::string ratios = "8,32";
  std::vector<std::string> set;  // key=value[,key=value] (deprecated: NAME:key=value in --policy)
  PolicyFlags flags;             // the shared settings' shorthands but ratio (--bits, --kappa, ...)
  int threads = 1;
  int chunk = 256;
  std::string json_path;
  std::string svg_dir;
  // needle
  std::string lengths = "512";
  int64_t trials = 8;
  uint64_t seed = 1;
  std::string haystack;
  std::string dump_trials;  // --dump-trials FILE: every trial's token ids (JSON Lines)
  std::string kv_type = "bf16";  // --kv-type f32 | f16 | bf16 (every eval command)
  std::string format = "auto";
  std::string needle_template = "The secret code is {key}.";
  std::string question_template = "What is the secret code? The secret code is";
  int key_digits = 5;
  std::string reference = "full";
  double intact_nats = 1.0;
  double baseline_gate = 1.0;
  std::string depth = "0.1:0.8";
  int32_t kv_bos = 0, kv_key = 1, kv_char_first = 50;
  std::string kv_slot0 = "2:16", kv_slot1 = "18:16", kv_charset;
  std::string kv_keynames = "34:16";
  int32_t kv_keys = 4;
  // ppl / kl
  std::string text;
  int64_t window_len = 512;
  int64_t eval_tokens = 32;
  std::string offsets;
  int64_t windows = 4;
  bool chunked = false;
  std::string policy2;
  std::string ratio2;
  int draws = 20000;
  uint64_t bootstrap_seed = 0;
  bool block_levels = false;  // --block-levels (needle, ppl): per-block levels in the JSON
  // ruler
  std::string ruler_tasks = "all";
  std::string ruler_lengths = "4096";
  int64_t ruler_samples = 10;
  int ruler_questions = 1;
  std::string chat_template = "auto";
  std::string words = "/usr/share/dict/words";
};

namespace {

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

void AddShared(CLI::App* cmd, EvalCliOptions* o, const std::string& policy_default,
               bool with_ratio) {
  cmd->add_option("-m,--model", o->model,
                  "Model (.gguf or HF directory); default: the built-in model");
  std::string names;
  for (const auto& n : PolicyNames()) names += (names.empty() ? "" : ", ") + n;
  o->policies = policy_default;
  cmd->add_option("--policy", o->policies,
                  "Policies, comma-separated, or 'all' (policies that cannot run on the model are "
                  "then skipped and listed); an item is NAME[:key=value...] (e.g. "
                  "vestige:recall=off; `strata policies` lists the settings); available: " +
                      names)
      ->capture_default_str();
  if (with_ratio) {
    cmd->add_option("--ratio", o->ratios,
                    "Budget ratios, comma-separated; each policy gets settings[\"ratio\"] = R. "
                    "'none': the policies' own defaults")
        ->capture_default_str();
  }
  cmd->add_option("--set", o->set,
                  "Deprecated (use NAME:key=value in --policy): settings key=value for every "
                  "listed policy that declares them (repeatable, or comma-separated)");
  // The shared settings' shorthands, from the declarations; each reaches every listed policy
  // that declares it (--ratio is the grid axis above).
  for (const std::string& key : SharedSettingNames()) {
    if (key == "ratio") continue;
    cmd->add_option("--" + key, o->flags.values[key], SharedSettingHelp(key))
        ->default_str(SharedSettingDefault(key));
  }
  cmd->add_option("-t,--threads", o->threads,
                  "Worker threads (default: the hardware threads; more are capped to them)")
      ->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->capture_default_str();
  cmd->add_option("--kv-type", o->kv_type, kKvTypeHelp)->capture_default_str();
  cmd->add_option("--json", o->json_path, "Write the report as JSON (docs/eval.md) to this file");
  cmd->add_option("--svg-dir", o->svg_dir, "Write the SVG charts into this directory");
}

void AddWindowFlags(CLI::App* cmd, EvalCliOptions* o) {
  cmd->add_option("--text", o->text, "Corpus text file; default: the built-in KJV excerpt");
  cmd->add_option("--len", o->window_len, "Window length T in tokens")->capture_default_str();
  cmd->add_option("--eval-tokens", o->eval_tokens,
                  "E: the prefix is T - E tokens, then E - 1 targets are scored")
      ->capture_default_str();
  cmd->add_option("--offsets", o->offsets, "Window starts (token offsets), comma-separated");
  cmd->add_option("--windows", o->windows, "Evenly spaced windows when --offsets is not given")
      ->capture_default_str();
  cmd->add_flag("--chunked", o->chunked,
                "Feed the targets as one chunk (SCREENING-ONLY: the chunk is exact context)");
}

std::vector<std::string> Ratios(const std::string& text) {
  if (text == "none" || text == "-" || text.empty()) return {};
  return SplitList(text);
}

// The settings given for the whole --policy list (--set and the shorthands; a key given twice is
// an error), checked to reach at least one listed policy, as is an explicit --ratio.
StatusOr<std::map<std::string, std::string>> Settings(const EvalCliOptions& o, CLI::App* cmd) {
  std::map<std::string, std::string> s;
  std::map<std::string, std::string> source;
  auto add = [&](const std::string& key, const std::string& value,
                 const std::string& from) -> Status {
    if (auto it = source.find(key); it != source.end()) {
      return InvalidArgument(from + ": '" + key + "' is given twice (" + it->second + " '" +
                             s[key] + "' and " + from + " '" + value + "')");
    }
    s[key] = value;
    source[key] = from;
    return OkStatus();
  };
  for (const std::string& group : o.set) {
    for (const std::string& item : SplitList(group)) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        return InvalidArgument("--set item '" + item + "' is not key=value");
      }
      RETURN_IF_ERROR(add(item.substr(0, eq), item.substr(eq + 1), "--set"));
    }
  }
  for (const auto& [key, value] : o.flags.values) {
    if (!value.empty()) RETURN_IF_ERROR(add(key, value, "--" + key));
  }
  if (s.count("ratio")) return InvalidArgument("give the budget with --ratio, not --set ratio=");
  std::map<std::string, std::string> check = s;
  if (cmd->count("--ratio") > 0 && !Ratios(o.ratios).empty()) check["ratio"] = o.ratios;
  RETURN_IF_ERROR(eval::CheckListSettings(SplitList(o.policies), check));
  // --reference and --policy2 name a policy the same way; their own settings are checked now too.
  for (const auto& [flag, item] : {std::pair<std::string, std::string>{"--reference", o.reference},
                                   {"--policy2", o.policy2}}) {
    if (item.empty()) continue;
    RETURN_IF_ERROR(eval::CheckListSettings({item}, {}).WithContext(flag));
  }
  return s;
}

StatusOr<std::pair<int32_t, int32_t>> ParseSlot(const std::string& flag, const std::string& v) {
  const size_t c = v.find(':');
  auto bad = [&] { return InvalidArgument(flag + " '" + v + "' must be FIRST:COUNT"); };
  if (c == std::string::npos) return bad();
  // Named strings: strtol's end pointer must point into storage that outlives the check.
  const std::string first = v.substr(0, c), count = v.substr(c + 1);
  char* end = nullptr;
  const long a = std::strtol(first.c_str(), &end, 10);
  if (*end != '\0' || first.empty()) return bad();
  const long b = std::strtol(count.c_str(), &end, 10);
  if (*end != '\0' || count.empty()) return bad();
  return std::make_pair(static_cast<int32_t>(a), static_cast<int32_t>(b));
}

StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(flag + " '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Fixed(double v, int d) { return eval::FormatNum(v, d); }

}  // namespace

std::shared_ptr<EvalCliOptions> AddEvalCommand(CLI::App* app) {
  auto o = std::make_shared<EvalCliOptions>();
  o->threads = HardwareThreads();
  CLI::App* eval = app->add_subcommand(
      "eval",
      "Evaluation harness: needle with compression before the query, causal Q=1 "
      "perplexity, KL to the full cache, RULER's synthetic tasks");
  eval->require_subcommand(1);

  CLI::App* n = eval->add_subcommand(
      "needle",
      "Needle in a haystack: compress at the end of the prefix, then ask; reports intact "
      "(answer NLL within --intact-nats of the reference) and answered (greedy answer exact)");
  o->needle_cmd = n;
  AddShared(n, o.get(), "all", true);
  n->add_option("--len", o->lengths, "Prefix lengths T (tokens), comma-separated")
      ->capture_default_str();
  n->add_option("--trials", o->trials, "Trials per length (trial i is the same for any count)")
      ->capture_default_str();
  n->add_option("--seed", o->seed, "Seed of the trial draws (key, depth, filler offset)")
      ->capture_default_str();
  n->add_option("--haystack", o->haystack, "Filler text file; default: the built-in KJV excerpt");
  n->add_flag("--block-levels", o->block_levels,
              "JSON: each trial's results also list the level of every graded block (Geodesia-KV) "
              "after the question, [layer][KV head][block]; the per-layer, per-head histograms "
              "are always there");
  n->add_option("--dump-trials", o->dump_trials,
                "Write every trial's token ids (filler, prefix, query, answer) to this file as "
                "JSON Lines, so another implementation can run the same trials (docs/eval.md)");
  n->add_option("--needle-format", o->format,
                "text | kv-tokens (the char-level testbed) | kv-multikey (the testbed "
                "vocabulary, --kv-keys needles with named keys, one asked: RULER's "
                "niah_multikey shape) | auto (kv-tokens when the model has no tokenizer or the "
                "testbed vocabulary, else text)")
      ->capture_default_str();
  n->add_option("--needle", o->needle_template, "Needle template ({key}; \\n = newline)")
      ->capture_default_str();
  n->add_option("--question", o->question_template, "Question template (\\n = newline)")
      ->capture_default_str();
  n->add_option("--key-digits", o->key_digits, "Digits of the random key (text format)")
      ->capture_default_str();
  n->add_option("--reference", o->reference, "The uncompressed baseline policy")
      ->capture_default_str();
  n->add_option("--intact-nats", o->intact_nats, "Intact iff NLL - NLL(reference) < this")
      ->capture_default_str();
  n->add_option("--baseline-gate", o->baseline_gate,
                "Drop (and count) trials whose reference answer NLL >= this")
      ->capture_default_str();
  n->add_option("--depth", o->depth,
                "Needle start depth range LO:HI as fractions of T (uniform in [LO, HI))")
      ->capture_default_str();
  n->add_option("--kv-bos", o->kv_bos, "kv-tokens: BOS id (-1: none)")->capture_default_str();
  n->add_option("--kv-key", o->kv_key, "kv-tokens: KEY id")->capture_default_str();
  n->add_option("--kv-slot0", o->kv_slot0, "kv-tokens: slot-0 values FIRST:COUNT")
      ->capture_default_str();
  n->add_option("--kv-slot1", o->kv_slot1, "kv-tokens: slot-1 values FIRST:COUNT")
      ->capture_default_str();
  n->add_option("--kv-keynames", o->kv_keynames, "kv-multikey: key-name ids FIRST:COUNT")
      ->capture_default_str();
  n->add_option("--kv-keys", o->kv_keys, "kv-multikey: needles per prefix (one is asked)")
      ->capture_default_str();
  n->add_option("--kv-char-first", o->kv_char_first, "kv-tokens: id of the first character")
      ->capture_default_str();
  n->add_option("--kv-charset", o->kv_charset,
                "kv-tokens: characters in id order from --kv-char-first; default: each "
                "character's own token in the model's tokenizer (space: U+2581 or ' '), or, "
                "without a tokenizer, the sorted distinct haystack characters");

  CLI::App* p = eval->add_subcommand(
      "ppl",
      "Perplexity by the causal Q=1 protocol: prefill T - E, then E - 1 scored targets "
      "one token at a time with the policy active");
  o->ppl_cmd = p;
  AddShared(p, o.get(), "all", true);
  AddWindowFlags(p, o.get());
  p->add_option("--policy2", o->policy2,
                "Compare every config with this policy (paired "
                "cluster bootstrap over windows)");
  p->add_option("--ratio2", o->ratio2, "Ratio for --policy2 (default: none)");
  p->add_option("--draws", o->draws, "Bootstrap draws")->capture_default_str();
  p->add_option("--bootstrap-seed", o->bootstrap_seed, "Bootstrap seed")->capture_default_str();
  p->add_flag("--block-levels", o->block_levels,
              "JSON: each window also lists the level of every graded block (Geodesia-KV) at its "
              "end, [layer][KV head][block]; the per-layer, per-head histograms are always there");

  CLI::App* k = eval->add_subcommand(
      "kl",
      "KL(full || policy) of next-token distributions over the scored positions (mean, median, "
      "p99, max), top-1 agreement and perplexity, as llama-perplexity --kl-divergence reports "
      "them (also: eval kld)");
  k->alias("kld");
  o->kl_cmd = k;
  AddShared(k, o.get(), "all", true);
  AddWindowFlags(k, o.get());
  k->add_option("--reference", o->reference, "The reference policy")->capture_default_str();

  CLI::App* r = eval->add_subcommand(
      "ruler",
      "RULER's synthetic tasks (niah, vt, cwe, fwe) as kvpress runs them: the context is "
      "prefilled and compressed before the question, the answer generated greedily and scored "
      "by RULER's string_match_all");
  o->ruler_cmd = r;
  AddShared(r, o.get(), "all", true);
  // The other subcommands default to every policy; a RULER run generates answers, so it
  // defaults to the uncompressed cache alone (RunRulerCli reads --policy only when given).
  r->get_option("--policy")->default_str("full");
  r->add_option("--task", o->ruler_tasks,
                "Tasks, comma-separated, or 'all': " + [] {
                  std::string names;
                  for (const auto& t : eval::RulerTaskNames()) {
                    names += (names.empty() ? "" : ", ") + t;
                  }
                  return names;
                }())
      ->capture_default_str();
  r->add_option("--len", o->ruler_lengths,
                "Sequence lengths T (tokens), comma-separated: each sample's prompt plus the "
                "tokens it may generate fit in T, as RULER's max_seq_length")
      ->capture_default_str();
  r->add_option("--samples", o->ruler_samples,
                "Samples per task and length (sample i is the same for any count)")
      ->capture_default_str();
  r->add_option("--questions", o->ruler_questions,
                "Questions per context: after the one prefill and compression of a sample's "
                "context, RULER's question and up to N - 1 others the context answers "
                "(niah_multikey_1's other keys, niah_multikey_2/3's other needle lines), each "
                "from its own fork of the compressed cache; each counts as a sample (other tasks "
                "have one question)")
      ->capture_default_str();
  r->add_option("--seed", o->seed, "Seed of the samples (keys, values, positions, words)")
      ->capture_default_str();
  r->add_option("--chat-template", o->chat_template,
                "auto (the model's chat template when it has one), none (plain text), or a "
                "built-in template name; the user message holds context and question")
      ->capture_default_str();
  r->add_option("--words", o->words,
                "Word list of the needle keys and cwe (one word a line; lowercase words of 3-8 "
                "letters are used; missing: the KJV text's vocabulary)")
      ->capture_default_str();

  eval->footer(
      "Examples:\n"
      "  strata eval needle -m m.gguf --policy vestige,h2o,snapkv --ratio 8,32 --len 512,1024\n"
      "  strata eval needle -m models/nope-mla.gguf --needle-format kv-tokens --len 1024 "
      "--trials 100 \\\n"
      "      --policy full,vestige:recall=off,vestige,streaming --block 1024 --kappa 4 "
      "--depth 0.1:0.9\n"
      "  strata eval ppl -m m.gguf --text corpus.txt --policy vestige --policy2 full --windows 6\n"
      "  strata eval kl -m m.gguf --policy all --ratio 8 --json kl.json\n"
      "  strata eval ruler -m m.gguf --task all --len 4096 --samples 10 --policy "
      "full,streaming,snapkv --ratio 4\n");
  return o;
}

namespace {

int Fail(std::ostream& err, const std::string& msg) {
  err << "error: " << msg << "\n";
  return kExitUsage;
}

struct Loaded {
  std::string path;
  std::unique_ptr<Model> model;
};

StatusOr<Loaded> LoadModel(const EvalCliOptions& o, std::ostream& err) {
  Loaded l;
  l.path = o.model;
  if (l.path.empty()) {
    ASSIGN_OR_RETURN(l.path, ResolveDefaultModel(DefaultModelsDir(), DefaultCacheDir(), err));
  } else {
    err << "model: " << l.path << "\n";
  }
  auto m = Model::Load(l.path);
  if (!m.ok()) return m.status().WithContext("cannot load model '" + l.path + "' (-m)");
  l.model = std::move(*m);
  return l;
}

Status WriteOutputs(const EvalCliOptions& o, const nlohmann::json& report,
                    const std::vector<std::pair<std::string, std::string>>& svgs,
                    std::ostream& out) {
  // Each configuration's resident bytes by part are in the JSON ("achieved"."resident_parts");
  // the process's peak RSS covers the whole run (the model and every configuration's caches).
  const int64_t peak_rss = PeakRssBytes();
  out << "process peak RSS: " << FormatBytes(static_cast<double>(peak_rss)) << "\n";
  if (!o.json_path.empty()) {
    nlohmann::json j = report;
    j["peak_rss_bytes"] = peak_rss;
    RETURN_IF_ERROR(WriteTextFile(o.json_path, DumpJson(j)));
    out << "json: " << o.json_path << "\n";
  }
  if (!o.svg_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.svg_dir, ec);
    if (ec) return IoError("--svg-dir '" + o.svg_dir + "': " + ec.message());
    for (const auto& [name, text] : svgs) {
      const std::string path = (std::filesystem::path(o.svg_dir) / name).string();
      RETURN_IF_ERROR(WriteTextFile(path, text));
      out << "svg: " << path << "\n";
    }
  }
  return OkStatus();
}

// The achieved-compression warnings (kv/achieved.h) under the table and on stderr, so a run whose
// stdout goes to a file still says on the terminal that a label promised more than it did.
void PrintWarnings(const std::vector<std::string>& warnings, std::ostream& out,
                   std::ostream& err) {
  for (const std::string& w : warnings) {
    out << "warning: " << w << "\n";
    err << "warning: " << w << "\n";
  }
}

// A prefix past the trained window is allowed (e.g. length generalisation studies) but said.
void WarnPastTrainedContext(const std::string& flag, const std::vector<int64_t>& lengths,
                            const ModelConfig& config, std::ostream& err) {
  for (const int64_t t : lengths) {
    if (config.n_ctx_train > 0 && t > config.n_ctx_train) {
      err << "warning: " << flag << " " << t << " is past the model's trained context of "
          << config.n_ctx_train << " tokens; positions beyond it were never trained\n";
    }
  }
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int RunNeedleCli(const EvalCliOptions& o, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  eval::NeedleOptions n;
  auto lengths = ParseIntList("--len", o.lengths);
  if (!lengths.ok()) return Fail(err, lengths.status().message());
  n.lengths = *lengths;
  n.ratios = Ratios(o.ratios);
  n.policies = SplitList(o.policies);
  if (n.policies.empty()) return Fail(err, "--policy needs at least one policy");
  n.skip_unsupported = o.policies == "all";
  auto settings = Settings(o, o.needle_cmd);
  if (!settings.ok()) return Fail(err, settings.status().message());
  n.settings = *settings;
  n.reference = o.reference;
  n.trials = o.trials;
  n.seed = o.seed;
  if (o.format != "auto") {
    auto fmt = eval::ParseNeedleFormat(o.format);
    if (!fmt.ok()) return Fail(err, fmt.status().message());
    n.format = *fmt;
  }
  if (!o.haystack.empty()) {
    auto text = ReadFile("--haystack", o.haystack);
    if (!text.ok()) return Fail(err, text.status().message());
    n.haystack = *text;
    n.haystack_name = o.haystack;
  }
  n.dump_trials = o.dump_trials;
  n.block_levels = o.block_levels;
  auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return Fail(err, kv_type.status().message());
  n.kv_type = *kv_type;
  n.needle_template = o.needle_template;
  n.question_template = o.question_template;
  n.key_digits = o.key_digits;
  n.intact_nats = o.intact_nats;
  n.baseline_gate_nats = o.baseline_gate;
  n.kv.bos = o.kv_bos;
  n.kv.key = o.kv_key;
  auto s0 = ParseSlot("--kv-slot0", o.kv_slot0);
  if (!s0.ok()) return Fail(err, s0.status().message());
  auto s1 = ParseSlot("--kv-slot1", o.kv_slot1);
  if (!s1.ok()) return Fail(err, s1.status().message());
  n.kv.slot0_first = s0->first;
  n.kv.slot0_count = s0->second;
  n.kv.slot1_first = s1->first;
  n.kv.slot1_count = s1->second;
  auto names = ParseSlot("--kv-keynames", o.kv_keynames);
  if (!names.ok()) return Fail(err, names.status().message());
  n.kv.keyname_first = names->first;
  n.kv.keyname_count = names->second;
  n.kv.n_keys = o.kv_keys;
  n.kv.char_first = o.kv_char_first;
  n.kv.charset = o.kv_charset;
  {
    const size_t colon = o.depth.find(':');
    char* end_lo = nullptr;
    char* end_hi = nullptr;
    const std::string lo = o.depth.substr(0, colon);
    const std::string hi = colon == std::string::npos ? "" : o.depth.substr(colon + 1);
    n.depth_lo = std::strtod(lo.c_str(), &end_lo);
    n.depth_hi = std::strtod(hi.c_str(), &end_hi);
    if (colon == std::string::npos || lo.empty() || hi.empty() || *end_lo != '\0' ||
        *end_hi != '\0' || !(n.depth_lo >= 0 && n.depth_lo < n.depth_hi && n.depth_hi <= 1)) {
      return Fail(err, "--depth '" + o.depth + "' must be LO:HI with 0 <= LO < HI <= 1");
    }
  }
  n.chunk = o.chunk;
  if (Status st = CheckAtLeast("--threads", o.threads, 1); !st.ok()) return Fail(err, st.message());
  n.threads = CapThreads("--threads", o.threads, err);
  auto loaded = LoadModel(o, err);
  if (!loaded.ok()) return Fail(err, loaded.status().message());
  WarnPastTrainedContext("--len", n.lengths, loaded->model->config(), err);
  if (o.format == "auto") {
    // The testbeds have a tokenizer too, but a text needle means nothing to a model trained on
    // kv-tokens needles (every trial dropped): their vocabulary decides, not the tokenizer.
    const Tokenizer* tok = loaded->model->tokenizer();
    const std::string mismatch = tok ? TestbedVocabularyMismatch(*tok, n.kv) : "";
    n.format = tok && !mismatch.empty() ? eval::NeedleFormat::kText
                                        : eval::NeedleFormat::kKvTokens;
    err << "needle format: " << eval::NeedleFormatName(n.format)
        << (!tok ? " (the model has no tokenizer)"
                 : mismatch.empty() ? " (the tokenizer is the char-level testbed vocabulary)"
                                    : " (the model has a tokenizer that is not the testbed "
                                      "vocabulary: " + mismatch + ")")
        << "\n";
  }
  auto rep = eval::RunNeedle(*loaded->model, n, &err);
  if (!rep.ok()) return Fail(err, rep.status().message());
  const eval::NeedleReport& r = *rep;

  out << "needle: " << n.trials << " trials per length, seed " << n.seed << ", format "
      << eval::NeedleFormatName(n.format) << ", haystack "
      << (n.haystack.empty() ? std::string(eval::kBuiltinHaystackName) : n.haystack_name)
      << ", depth [" << n.depth_lo << ", " << n.depth_hi << ")T; intact = NLL - NLL("
      << n.reference << ") < " << Fixed(n.intact_nats, 2)
      << " nat, answered = greedy answer exact, after compression before the query\n";
  // Only a non-default storage is said (the default bf16 reports are unchanged).
  if (n.kv_type != DType::kBF16) {
    out << "KV cache: " << KvTypeName(n.kv_type) << " rows (--kv-type)\n";
  }
  Table t({"policy", "ratio", "T", "kept", "intact", "rate", "95% CI (Wilson)", "mean dNLL",
           "answered", "rate", "95% CI (Wilson)", "token acc", "res b/v", "read b/v",
           "rows kept", "compressed"});
  for (const auto& c : r.cells) {
    const auto& pc = r.configs[c.config];
    t.AddRow({pc.Name(), pc.RatioText(), std::to_string(c.length), std::to_string(c.n),
              std::to_string(c.intact), c.n ? Fixed(c.rate.point, 2) : "-",
              "[" + Fixed(c.rate.lo, 2) + ", " + Fixed(c.rate.hi, 2) + "]",
              c.n ? Fixed(c.mean_delta, 3) : "-", std::to_string(c.answered),
              c.n ? Fixed(c.answer_rate.point, 2) : "-",
              "[" + Fixed(c.answer_rate.lo, 2) + ", " + Fixed(c.answer_rate.hi, 2) + "]",
              c.n ? Fixed(c.token_accuracy, 2) : "-", c.n ? Fixed(c.resident_bits, 2) : "-",
              c.n ? Fixed(c.read_bits, 2) : "-", c.n ? eval::KeptText(c.achieved) : "-",
              c.n ? eval::CompressedText(c.achieved, c.check) : "-"});
  }
  t.Print(out);
  PrintWarnings(r.warnings, out, err);
  {
    std::vector<LayerKindRow> kind_rows;
    for (const auto& c : r.cells) {
      if (c.n == 0) continue;
      const auto& pc = r.configs[c.config];
      kind_rows.push_back({{pc.Name(), pc.RatioText(), std::to_string(c.length)}, &c.achieved});
    }
    PrintLayerKindTable(
        "resident by layer kind (mean per trial, after the question; KDA state: "
        "fixed per sequence, no policy sees it):",
        {"policy", "ratio", "T"}, kind_rows, out);
  }
  for (const auto& l : r.lengths) {
    out << "T=" << l.length << ": " << l.dropped << " of " << l.trials
        << " trials dropped (uncompressed answer NLL >= " << n.baseline_gate_nats << " nat)\n";
  }
  for (const auto& s : r.skipped) out << "skipped " << s.config.Label() << ": " << s.reason << "\n";
  std::vector<std::string> notes;
  for (const auto& l : r.lengths) {
    if (l.dropped * 2 > l.trials) {
      notes.push_back("T=" + std::to_string(l.length) +
                      ": most trials dropped; the model cannot "
                      "answer uncompressed, so intact rates are not informative");
      out << "warning: " << notes.back() << "\n";
    }
  }
  // One comparison chart of every config, then one depth heat map per policy.
  std::vector<std::pair<std::string, std::string>> svgs = {
      {"needle_comparison.svg", eval::NeedleComparisonSvg(r)}};
  std::vector<std::string> seen;
  for (const auto& c : r.configs) {
    if (std::find(seen.begin(), seen.end(), c.Name()) != seen.end()) continue;
    seen.push_back(c.Name());
    std::string file = c.Name();
    for (char& ch : file) {
      if (ch == ':' || ch == '=' || ch == '/') ch = '_';
    }
    svgs.push_back({"needle_" + file + ".svg", eval::NeedleHeatmapSvg(r, c.Name())});
  }
  const nlohmann::json report =
      eval::MakeReport("needle", loaded->path, *loaded->model, Since(t0), notes,
                       eval::SkippedJson(r.skipped), eval::NeedleJson(r), r.warnings);
  if (Status st = WriteOutputs(o, report, svgs, out); !st.ok()) return Fail(err, st.message());
  // A run whose every trial was dropped measured nothing: a script must not read it as a pass.
  int64_t trials = 0, dropped = 0;
  for (const auto& l : r.lengths) {
    trials += l.trials;
    dropped += l.dropped;
  }
  if (trials > 0 && dropped == trials) {
    err << "error: all " << trials << " trials were dropped (the reference " << n.reference
        << " misses the answer by >= --baseline-gate " << n.baseline_gate_nats
        << " nat): nothing was measured; check --needle-format (now "
        << eval::NeedleFormatName(n.format) << ") and the model\n";
    return kExitFailed;
  }
  return kExitOk;
}

struct WindowSetup {
  eval::WindowOptions w;
  std::vector<int32_t> tokens;
  std::string text_name;
};

StatusOr<WindowSetup> SetupWindows(const EvalCliOptions& o, const Model& model,
                                   std::ostream& err) {
  WindowSetup s;
  s.w.length = o.window_len;
  s.w.eval_tokens = o.eval_tokens;
  s.w.windows = o.windows;
  s.w.chunked = o.chunked;
  s.w.chunk = o.chunk;
  ASSIGN_OR_RETURN(s.w.kv_type, ParseKvType(o.kv_type));
  RETURN_IF_ERROR(CheckAtLeast("--threads", o.threads, 1));
  s.w.threads = CapThreads("--threads", o.threads, err);
  RETURN_IF_ERROR(CheckAtLeast("--chunk", o.chunk, 1));
  if (!o.offsets.empty()) {
    ASSIGN_OR_RETURN(s.w.offsets, ParseIntList("--offsets", o.offsets));
  }
  std::string text;
  if (o.text.empty()) {
    text = std::string(eval::BuiltinHaystack());
    s.text_name = std::string(eval::kBuiltinHaystackName);
  } else {
    ASSIGN_OR_RETURN(text, ReadFile("--text", o.text));
    s.text_name = o.text;
  }
  ASSIGN_OR_RETURN(s.tokens, eval::TokenizeCorpus(model, text));
  return s;
}

int RunPplCli(const EvalCliOptions& o, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  auto settings = Settings(o, o.ppl_cmd);
  if (!settings.ok()) return Fail(err, settings.status().message());
  auto loaded = LoadModel(o, err);
  if (!loaded.ok()) return Fail(err, loaded.status().message());
  auto setup = SetupWindows(o, *loaded->model, err);
  if (!setup.ok()) return Fail(err, setup.status().message());
  WarnPastTrainedContext("--len", {o.window_len}, loaded->model->config(), err);
  eval::PplOptions p;
  p.w = setup->w;
  p.w.block_levels = o.block_levels;
  p.policies = SplitList(o.policies);
  if (p.policies.empty()) return Fail(err, "--policy needs at least one policy");
  p.skip_unsupported = o.policies == "all";
  p.ratios = Ratios(o.ratios);
  p.settings = *settings;
  p.policy2 = o.policy2;
  if (!o.ratio2.empty()) p.ratio2 = o.ratio2;
  p.draws = o.draws;
  p.bootstrap_seed = o.bootstrap_seed;
  p.text_name = setup->text_name;
  auto rep = eval::RunPpl(*loaded->model, setup->tokens, p, &err);
  if (!rep.ok()) return Fail(err, rep.status().message());
  const eval::PplReport& r = *rep;
  std::vector<std::string> notes;
  out << "ppl: " << r.offsets.size() << " windows of T=" << p.w.length << " over "
      << setup->text_name << " (" << r.corpus_tokens
      << " tokens), prefix T-E=" << p.w.length - p.w.eval_tokens << ", " << p.w.eval_tokens - 1
      << " scored targets per window, mode "
      << (p.w.chunked ? "chunked" : "causal Q=1 (one token at a time)") << "\n";
  if (p.w.chunked) {
    notes.push_back("chunked mode is SCREENING-ONLY: the scored chunk is exact current context");
    out << "NOTE: " << notes.back() << "\n";
  }
  // Only a non-default storage is said (the default bf16 reports are unchanged).
  if (p.w.kv_type != DType::kBF16) {
    out << "KV cache: " << KvTypeName(p.w.kv_type) << " rows (--kv-type)\n";
  }
  Table t({"policy", "ratio", "PPL", "mean NLL", "targets", "resident b/v", "read b/v",
           "rows kept", "compressed"});
  for (const auto& c : r.configs) {
    t.AddRow({c.config.Name(), c.config.RatioText(), Fixed(c.ppl, 4), Fixed(c.mean_nll, 4),
              std::to_string(c.n_targets), Fixed(c.resident_bits_per_value, 3),
              Fixed(c.read_bits_per_value, 3), eval::KeptText(c.achieved),
              eval::CompressedText(c.achieved, c.check)});
  }
  t.Print(out);
  PrintWarnings(r.warnings, out, err);
  if (!r.comparisons.empty()) {
    out << "paired cluster bootstrap (" << p.draws << " draws, seed " << p.bootstrap_seed
        << "); ratio = PPL(A) / PPL(B); wins = windows where that side has the lower NLL\n";
    Table c({"A", "B", "PPL ratio", "95% CI", "A wins", "B wins", "windows"});
    for (const auto& cmp : r.comparisons) {
      c.AddRow({r.configs[cmp.a].config.Label(), r.configs[cmp.b].config.Label(),
                Fixed(cmp.boot.ratio, 4),
                "[" + Fixed(cmp.boot.ratio_lo, 4) + ", " + Fixed(cmp.boot.ratio_hi, 4) + "]",
                std::to_string(cmp.boot.wins_a), std::to_string(cmp.boot.wins_b),
                std::to_string(cmp.boot.n_clusters)});
    }
    c.Print(out);
  }
  {
    std::vector<LayerKindRow> kind_rows;
    for (const auto& c : r.configs) {
      kind_rows.push_back({{c.config.Name(), c.config.RatioText()}, &c.achieved});
    }
    PrintLayerKindTable(
        "resident by layer kind (mean per window, at its end; KDA state: fixed "
        "per sequence, no policy sees it):",
        {"policy", "ratio"}, kind_rows, out);
  }
  for (const auto& s : r.skipped) out << "skipped " << s.config.Label() << ": " << s.reason << "\n";
  const nlohmann::json report =
      eval::MakeReport("ppl", loaded->path, *loaded->model, Since(t0), notes,
                       eval::SkippedJson(r.skipped), eval::PplJson(r), r.warnings);
  if (Status st = WriteOutputs(o, report, {{"ppl_pareto.svg", eval::PplParetoSvg(r)}}, out);
      !st.ok()) {
    return Fail(err, st.message());
  }
  return kExitOk;
}

int RunKlCli(const EvalCliOptions& o, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  auto settings = Settings(o, o.kl_cmd);
  if (!settings.ok()) return Fail(err, settings.status().message());
  auto loaded = LoadModel(o, err);
  if (!loaded.ok()) return Fail(err, loaded.status().message());
  auto setup = SetupWindows(o, *loaded->model, err);
  if (!setup.ok()) return Fail(err, setup.status().message());
  eval::KlOptions k;
  k.w = setup->w;
  k.policies = SplitList(o.policies);
  if (k.policies.empty()) return Fail(err, "--policy needs at least one policy");
  k.skip_unsupported = o.policies == "all";
  k.ratios = Ratios(o.ratios);
  k.settings = *settings;
  k.reference = o.reference;
  k.text_name = setup->text_name;
  auto rep = eval::RunKl(*loaded->model, setup->tokens, k, &err);
  if (!rep.ok()) return Fail(err, rep.status().message());
  const eval::KlReport& r = *rep;
  std::vector<std::string> notes;
  out << "kl: KL(" << k.reference << " || policy) in nats over " << r.offsets.size()
      << " windows x " << k.w.eval_tokens - 1 << " positions, mode "
      << (k.w.chunked ? "chunked" : "causal Q=1") << "\n";
  if (k.w.chunked) {
    notes.push_back("chunked mode is SCREENING-ONLY: the scored chunk is exact current context");
    out << "NOTE: " << notes.back() << "\n";
  }
  // Only a non-default storage is said (the default bf16 reports are unchanged).
  if (k.w.kv_type != DType::kBF16) {
    out << "KV cache: " << KvTypeName(k.w.kv_type) << " rows (--kv-type)\n";
  }
  out << "reference " << k.reference << ": PPL " << Fixed(r.reference_ppl, 4) << "\n";
  Table t({"policy", "ratio", "mean KL", "median KL", "p99 KL", "max KL", "same top-1", "PPL",
           "positions", "rows kept", "compressed"});
  for (const auto& c : r.configs) {
    const eval::Interval top1 = eval::WilsonInterval(c.same_top1, c.n_positions);
    t.AddRow({c.config.Name(), c.config.RatioText(), Fixed(c.mean_kl, 6), Fixed(c.median_kl, 6),
              Fixed(c.p99_kl, 6), Fixed(c.max_kl, 6),
              Fixed(100.0 * top1.point, 2) + " % [" + Fixed(100.0 * top1.lo, 1) + ", " +
                  Fixed(100.0 * top1.hi, 1) + "]",
              Fixed(c.ppl, 4), std::to_string(c.n_positions), eval::KeptText(c.achieved),
              eval::CompressedText(c.achieved, c.check)});
  }
  t.Print(out);
  out << "Legend: KL in nats, per scored position (the reference's next-token distribution "
         "against the policy's); p99 = the 99th percentile over all positions; same top-1 = "
         "positions whose most likely token is the reference's, with its 95% Wilson interval; "
         "PPL = exp(mean -log p(next token)) with the policy's cache.\n";
  PrintWarnings(r.warnings, out, err);
  for (const auto& s : r.skipped) out << "skipped " << s.config.Label() << ": " << s.reason << "\n";
  const nlohmann::json report =
      eval::MakeReport("kl", loaded->path, *loaded->model, Since(t0), notes,
                       eval::SkippedJson(r.skipped), eval::KlJson(r), r.warnings);
  if (Status st = WriteOutputs(o, report, {{"kl.svg", eval::KlSvg(r)}}, out); !st.ok()) {
    return Fail(err, st.message());
  }
  return kExitOk;
}

// Short column names of the tasks in the score table (the legend under it spells them out).
std::string RulerShort(const std::string& task) {
  static const std::map<std::string, std::string> m = {
      {"niah_single_1", "s1"},   {"niah_single_2", "s2"},   {"niah_single_3", "s3"},
      {"niah_multikey_1", "mk1"}, {"niah_multikey_2", "mk2"}, {"niah_multikey_3", "mk3"},
      {"niah_multivalue", "mv"}, {"niah_multiquery", "mq"}};
  auto it = m.find(task);
  return it == m.end() ? task : it->second;
}

int RunRulerCli(const EvalCliOptions& o, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  CLI::App* cmd = o.ruler_cmd;
  eval::RulerOptions ro;
  auto tasks = eval::ParseRulerTasks(o.ruler_tasks);
  if (!tasks.ok()) return Fail(err, tasks.status().message());
  ro.tasks = *tasks;
  auto lengths = ParseIntList("--len", o.ruler_lengths);
  if (!lengths.ok()) return Fail(err, lengths.status().message());
  ro.lengths = *lengths;
  const std::string policies = cmd->count("--policy") > 0 ? o.policies : "full";
  ro.policies = SplitList(policies);
  if (ro.policies.empty()) return Fail(err, "--policy needs at least one policy");
  ro.skip_unsupported = policies == "all";
  ro.ratios = Ratios(o.ratios);
  EvalCliOptions checked = o;
  checked.policies = policies;
  auto settings = Settings(checked, cmd);
  if (!settings.ok()) return Fail(err, settings.status().message());
  ro.settings = *settings;
  if (Status st = CheckAtLeast("--samples", o.ruler_samples, int64_t{1}); !st.ok()) {
    return Fail(err, st.message());
  }
  ro.samples = o.ruler_samples;
  if (Status st = CheckAtLeast("--questions", o.ruler_questions, 1); !st.ok()) {
    return Fail(err, st.message());
  }
  ro.questions = o.ruler_questions;
  ro.seed = o.seed;
  ro.chat_template = o.chat_template;
  ro.words_path = o.words;
  ro.chunk = o.chunk;
  if (Status st = CheckAtLeast("--chunk", o.chunk, 1); !st.ok()) return Fail(err, st.message());
  if (Status st = CheckAtLeast("--threads", o.threads, 1); !st.ok()) return Fail(err, st.message());
  ro.threads = CapThreads("--threads", o.threads, err);
  auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return Fail(err, kv_type.status().message());
  ro.kv_type = *kv_type;
  auto loaded = LoadModel(o, err);
  if (!loaded.ok()) return Fail(err, loaded.status().message());
  WarnPastTrainedContext("--len", ro.lengths, loaded->model->config(), err);
  auto rep = eval::RunRuler(*loaded->model, ro, &err);
  if (!rep.ok()) return Fail(err, rep.status().message());
  const eval::RulerReport& r = *rep;

  out << "ruler: " << ro.samples << " samples per task and length, seed " << ro.seed
      << ", chat template " << r.chat_template << ", haystack " << eval::kBuiltinHaystackName
      << ", words " << r.words_source
      << "; compressed at the end of the context, before the question; greedy answers scored by "
         "string_match_all (fraction of expected values found)\n";
  if (ro.kv_type != DType::kBF16) {
    out << "KV cache: " << KvTypeName(ro.kv_type) << " rows (--kv-type)\n";
  }
  for (int64_t len : ro.lengths) {
    const std::vector<std::string> strong = eval::RulerStrongTasks(r, len);
    out << "T=" << len << ":\n";
    std::vector<std::string> head = {"policy", "ratio"};
    for (const auto& t : ro.tasks) head.push_back(RulerShort(t));
    head.push_back("avg");
    if (!strong.empty()) head.push_back("avg full>=0.3");
    head.push_back("rows kept");
    head.push_back("decode tok/s");
    Table t(head);
    for (size_t c = 0; c < r.configs.size(); ++c) {
      std::vector<std::string> row = {r.configs[c].Name(), r.configs[c].RatioText()};
      for (const auto& cell : r.cells) {
        if (cell.config == c && cell.length == len) row.push_back(Fixed(cell.score, 2));
      }
      for (const auto& a : r.averages) {
        if (a.config != c || a.length != len) continue;
        row.push_back(Fixed(a.average, 3));
        if (!strong.empty()) row.push_back(Fixed(eval::RulerAverageOver(r, c, len, strong), 3));
        row.push_back(eval::KeptText(a.achieved));
        row.push_back(a.decode_s > 0 ? Fixed(static_cast<double>(a.decode_tokens) / a.decode_s, 1)
                                     : "-");
      }
      t.AddRow(row);
    }
    t.Print(out);
    bool any_full = false;
    for (const auto& c : r.configs) any_full |= c.policy == "full" && c.variant.empty();
    if (!any_full) {
      out << "(no full config in --policy: the tasks full answers are not known)\n";
    } else if (strong.empty()) {
      out << "full scores >= 0.3 on no task at T=" << len << "\n";
    } else {
      std::string names;
      for (const auto& s : strong) names += (names.empty() ? "" : ", ") + s;
      out << "full scores >= 0.3 on " << strong.size() << " of " << ro.tasks.size()
          << " tasks at T=" << len << " (" << names << "); average over them:";
      for (size_t c = 0; c < r.configs.size(); ++c) {
        out << (c ? ", " : " ") << r.configs[c].Label() << " "
            << Fixed(eval::RulerAverageOver(r, c, len, strong), 3);
      }
      out << "\n";
    }
  }
  std::string legend;
  for (const auto& task : ro.tasks) {
    if (RulerShort(task) == task) continue;
    legend += (legend.empty() ? "" : ", ") + RulerShort(task) + " = " + task;
  }
  out << "Legend: " << (legend.empty() ? "" : legend + "; ")
      << "score = mean string_match_all; decode tok/s = the answers' decode steps (one token "
         "each, through the compressed cache) per second of their wall time\n";
  out << "fully correct samples (every expected value in the answer), 95% Wilson interval:\n";
  Table d({"policy", "ratio", "T", "task", "score", "correct", "rate", "95% CI (Wilson)"});
  for (const auto& c : r.cells) {
    const auto& pc = r.configs[c.config];
    d.AddRow({pc.Name(), pc.RatioText(), std::to_string(c.length), c.task, Fixed(c.score, 2),
              std::to_string(c.correct) + "/" + std::to_string(c.n), Fixed(c.correct_rate.point, 2),
              "[" + Fixed(c.correct_rate.lo, 2) + ", " + Fixed(c.correct_rate.hi, 2) + "]"});
  }
  d.Print(out);
  PrintWarnings(r.warnings, out, err);
  for (const auto& s : r.skipped) out << "skipped " << s.config.Label() << ": " << s.reason << "\n";
  const nlohmann::json report =
      eval::MakeReport("ruler", loaded->path, *loaded->model, Since(t0), {},
                       eval::SkippedJson(r.skipped), eval::RulerJson(r), r.warnings);
  if (Status st = WriteOutputs(o, report, {}, out); !st.ok()) return Fail(err, st.message());
  return kExitOk;
}

}  // namespace

int RunEval(const EvalCliOptions& o, std::ostream& out, std::ostream& err) {
  if (o.needle_cmd->parsed()) return RunNeedleCli(o, out, err);
  if (o.ppl_cmd->parsed()) return RunPplCli(o, out, err);
  if (o.kl_cmd->parsed()) return RunKlCli(o, out, err);
  if (o.ruler_cmd->parsed()) return RunRulerCli(o, out, err);
  return Fail(err, "eval needs a subcommand: needle, ppl, kl or ruler");
}

}  // namespace strata::cli
