// `strata demo`: the end-to-end job on the NoPE-MLA testbed model. One needle trial (kv-tokens
// format, built by eval::NeedleBuilder over the built-in KJV haystack) is prefilled once per
// cache policy (the end of the prefill is the compression point), then answered by greedy decode
// through the compressed cache; the table shows what each cache answered and what it cost.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/corpus.h"
#include "eval/needle.h"
#include "eval/runner.h"
#include "kv/achieved.h"
#include "model/model.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The default model's file name in models/ and how to make it from the shipped HF export
// (models/README.md).
constexpr const char* kDemoModelFile = "nope-mla.gguf";
constexpr const char* kDemoModelRecipe =
    "strata convert models/hf/nope-mla -o models/nope-mla.gguf --dtype f32";
// VestigeKV settings of the demo: 1024-row blocks (two closed blocks at the default 2048-token
// prefix; the default 4096 would close none) and kappa 4 low-pass bins per block. A policy item's
// own settings override them.
constexpr std::pair<const char*, const char*> kVestigeSettings[] = {{"block", "1024"},
                                                                    {"kappa", "4"}};
constexpr int kPrefillChunk = 256;

// The 72 filler characters of the char-level testbed (tb_data.ALPHABET: the distinct characters
// of the whitespace-collapsed KJV, sorted by code point; no 'X'), ids 50..121 in that order. Used
// only for a model without a tokenizer; with one, eval::NeedleBuilder maps each character to its
// one-character token (space: "\u2581").
constexpr const char* kTestbedAlphabet =
    " !'(),-.0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWYZabcdefghijklmnopqrstuvwxyz";

// How a token id is shown: the tokenizer's text, else the testbed names (<s>, <KEY>, <vN>).
std::string TokenName(const Tokenizer* tok, const eval::KvTokenIds& kv, int32_t id) {
  if (tok && tok->CheckId(id).ok()) {
    const std::string& t = tok->token_text(id);
    if (!t.empty()) return t;
  }
  if (id == kv.bos) return "<s>";
  if (id == kv.key) return "<KEY>";
  if (id >= kv.slot0_first && id < kv.char_first) {
    return "<v" + std::to_string(id - kv.slot0_first) + ">";
  }
  return "#" + std::to_string(id);
}

std::string TokenNames(const Tokenizer* tok, const eval::KvTokenIds& kv,
                       const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + TokenName(tok, kv, id);
  return s;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find_first_not_of(' ');
    const size_t b = item.find_last_not_of(' ');
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

struct DemoRow {
  eval::PolicyConfig config;
  std::string describe;
  std::vector<int32_t> answer;
  bool correct = false;
  int64_t resident_after_prefill = 0;
  int64_t resident = 0;  // after the answer
  int64_t decode_steps = 0;
  double read_bytes_per_step = 0;
  bool read_derived = false;  // the policy reported no bytes: rows attended x row bytes
  double prefill_s = 0;
  double decode_s = 0;
  // What the policy achieved over the decode steps (kv/achieved.h) and the verdict on its label.
  AchievedCompression achieved;
  CompressionCheck check;
  ResidentParts parts;  // where the resident bytes are after the answer
};

double KiB(double bytes) { return bytes / 1024.0; }

}  // namespace

void AddDemoCommand(CLI::App* app, DemoOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "demo",
      "The main job: a needle in a haystack answered by the NoPE-MLA testbed model with the full "
      "cache and with compressed caches at one budget (table on stdout, progress on stderr)");
  cmd->add_option("-m,--model", o->model,
                  std::string("Model (.gguf or HF directory) using the char-level testbed "
                              "vocabulary; default: models/") +
                      kDemoModelFile + " (make it with `" + kDemoModelRecipe + "`)");
  cmd->add_option("--len", o->len,
                  "Prefix length in tokens (BOS, filler from the built-in KJV haystack, and the "
                  "needle <KEY> v1 v2 at a depth in [0.1, 0.8) of it)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Picks the needle's two values and its depth")
      ->capture_default_str();
  cmd->add_option("--ratio", o->ratio,
                  "Compression ratio R, given to every policy that declares a ratio (the "
                  "row-budget policies keep 1/R of the prefix rows)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Worker threads (more than the hardware threads are "
                  "capped to them)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Context size in tokens: --len must fit in it (0: the model's trained context "
                  "length; more than that warns)")
      ->capture_default_str();
  cmd->add_option("--gen", o->gen,
                  "Greedy tokens decoded after the answer; the read and speed columns average "
                  "over every decode step (question, answer, these)")
      ->capture_default_str();
  std::string names;
  for (const auto& n : PolicyNames()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--policy", o->policy,
                  "Cache policies, comma-separated, one table row each; an item is "
                  "NAME[:key=value...] (`strata policies` lists the settings; available: " + names +
                      "); vestige runs with block 1024 and kappa 4 (cutoff period 256 rows, the "
                      "paper's 4096/16)")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the table as JSON to this file");
}

int RunDemo(const DemoOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  // Flags first, so a bad flag is reported before any model is loaded.
  for (const Status& st : {CheckAtLeast("--len", o.len, 8), CheckAtLeast("--threads", o.threads, 1),
                           CheckAtLeast("-c", o.ctx_size, 0),
                           CheckNumberAtLeast("--ratio", o.ratio, 1, "32", "keep 1/R of the rows"),
                           CheckAtLeast("--gen", o.gen, 0)}) {
    if (!st.ok()) return fail(st.message());
  }
  // An item may carry its own settings, NAME:key=value:key=value (eval::ExpandGrid). Every policy
  // that declares a ratio gets the --ratio budget (the labels read "vestige@32", "full"); vestige
  // and fullrow the demo's block and kappa unless the item sets them.
  auto grid = eval::ExpandGrid(SplitList(o.policy), {}, {});
  if (!grid.ok()) return fail(grid.status().message());
  std::vector<eval::PolicyConfig> configs = std::move(grid).value();
  for (eval::PolicyConfig& c : configs) {
    const PolicyInfo* info = FindPolicy(c.policy);
    if (info == nullptr || !info->settings.Takes("ratio")) continue;
    c.ratio = o.ratio;
    if (c.policy == "vestige" || c.policy == "fullrow") {
      for (const auto& [key, value] : kVestigeSettings) c.settings.emplace(key, value);
    }
  }
  // `archive=file` without a folder: a temporary one, removed at the end (the demo shows the
  // file archive's saving beside the RAM archive without asking for a path).
  struct TempArchiveDir {
    std::string path;
    ~TempArchiveDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } archive_dir;
  auto spec_of = [&](const eval::PolicyConfig& c) -> StatusOr<PolicySpec> {
    PolicySpec spec = c.Spec();
    auto it = spec.settings.find("archive");
    if (it != spec.settings.end() && it->second == "file") {
      if (archive_dir.path.empty()) {
        char tmpl[] = "/tmp/strata-demo-XXXXXX";
        if (!mkdtemp(tmpl)) return IoError("cannot create a temporary folder under /tmp");
        archive_dir.path = tmpl;
      }
      it->second = "file:" + archive_dir.path;
    }
    return spec;
  };
  for (const eval::PolicyConfig& c : configs) {
    auto spec = spec_of(c);
    if (!spec.ok()) return fail(spec.status().message());
    auto p = MakeCliPolicy(*spec);
    if (!p.ok()) return fail(p.status().message());
  }
  if (configs.empty()) return fail("--policy '" + o.policy + "' names no policy");

  namespace fs = std::filesystem;
  std::string path = o.model;
  if (path.empty()) {
    const std::string dir = o.models_dir.empty() ? DefaultModelsDir() : o.models_dir;
    path = (fs::path(dir) / kDemoModelFile).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return fail("the demo model " + path +
                  " does not exist; make it from the trained NoPE-MLA testbed with `" +
                  kDemoModelRecipe + "` (tools/testbed/README.md), or pass -m FILE");
    }
  }
  err << "model: " << path << "\n";
  auto loaded = Model::Load(path);
  if (!loaded.ok()) {
    return fail("cannot load model '" + path + "' (-m): " + loaded.status().ToString());
  }
  Model& m = **loaded;
  const ModelConfig& mc = m.config();
  err << mc.Summary() << "\n";
  if (!mc.is_mla() || !mc.mla_nope) {
    err << "demo: note: the model is not a NoPE-MLA model; policies that need MLA rows fail\n";
  }
  auto ctx = ResolveCtxSize(o.ctx_size, mc, err);
  if (!ctx.ok()) return fail(ctx.status().message());
  if (*ctx > 0 && o.len > *ctx) {
    return fail("--len " + std::to_string(o.len) + " is more than the context size " +
                std::to_string(*ctx) + " (-c/--ctx-size; the model was trained to " +
                std::to_string(mc.n_ctx_train) + " tokens): pass -c " + std::to_string(o.len) +
                " to run past the trained window anyway");
  }
  const int threads = CapThreads("--threads", o.threads, err);

  eval::NeedleOptions no;
  no.format = eval::NeedleFormat::kKvTokens;
  no.seed = o.seed;
  no.trials = 1;
  no.lengths = {o.len};
  no.threads = threads;
  if (const Tokenizer* t = m.tokenizer()) {
    // The needle's own ids must be the testbed's <KEY> and value tokens (characters are mapped
    // through the tokenizer by NeedleBuilder).
    if (const std::string why = TestbedVocabularyMismatch(*t, no.kv); !why.empty()) {
      return fail("model '" + path +
                  "' does not use the char-level testbed vocabulary (tools/testbed/README.md, "
                  "\"Vocabulary and needle format\"): " + why);
    }
  } else {
    err << "demo: the model has no tokenizer; assuming the testbed vocabulary (characters from id "
        << no.kv.char_first << ")\n";
    no.kv.charset = kTestbedAlphabet;
  }
  auto builder = eval::NeedleBuilder::Create(m, no);
  if (!builder.ok()) {
    return fail("model '" + path + "': " + builder.status().message() +
                " (the demo needs the char-level testbed vocabulary: tools/testbed/README.md, "
                "\"Vocabulary and needle format\")");
  }
  auto trial_or = builder->Build(o.len, 0);
  if (!trial_or.ok()) return fail(trial_or.status().message());
  const eval::NeedleTrial& trial = *trial_or;
  const Tokenizer* tok = m.tokenizer();
  const std::string expected = TokenNames(tok, no.kv, trial.answer);
  const double depth_pct = 100.0 * static_cast<double>(trial.depth) / static_cast<double>(o.len);
  err << "demo: prefix " << o.len << " tokens, needle " << TokenNames(tok, no.kv, trial.needle)
      << " at depth " << trial.depth << " (" << FormatFixed(depth_pct, 0) << "%)\n";

  // Every policy must fit the model (e.g. geodesia needs GQA layers) before any of them runs;
  // with `all` in the list, as in eval, the ones that cannot run are skipped and listed.
  const std::vector<std::string> items = SplitList(o.policy);
  const bool skip_unsupported = std::find(items.begin(), items.end(), "all") != items.end();
  std::vector<std::pair<std::string, std::string>> skipped;  // label, reason
  for (auto c = configs.begin(); c != configs.end();) {
    auto spec = spec_of(*c);
    if (!spec.ok()) return fail(spec.status().message());
    auto policy = MakeCliPolicy(*spec);
    if (!policy.ok()) return fail(policy.status().message());
    auto cache = m.NewCache(std::move(policy).value());
    if (cache.ok()) {
      ++c;
      continue;
    }
    if (!skip_unsupported) {
      return fail("--policy " + c->policy + ": " + cache.status().message());
    }
    err << "demo: skipping " << c->Label() << ": " << cache.status().message() << "\n";
    skipped.push_back({c->Label(), cache.status().message()});
    c = configs.erase(c);
  }
  if (configs.empty()) return fail("--policy '" + o.policy + "': no policy can run on this model");

  ThreadPool pool(threads);
  const int64_t n_vocab = mc.n_vocab;
  std::vector<DemoRow> rows;
  for (const eval::PolicyConfig& c : configs) {
    DemoRow row;
    row.config = c;
    const std::string label = c.Label();
    auto spec = spec_of(c);
    if (!spec.ok()) return fail(spec.status().message());
    auto policy = MakeCliPolicy(*spec);
    if (!policy.ok()) return fail(policy.status().message());
    auto cache_or = m.NewCache(std::move(policy).value());
    if (!cache_or.ok()) return fail("--policy " + c.policy + ": " + cache_or.status().message());
    KvCache& cache = **cache_or;
    std::vector<float> logits(n_vocab);
    // The compression point: the end of this Prefill call.
    const auto t0 = Clock::now();
    if (Status st = m.Prefill(trial.prefix.data(), static_cast<int64_t>(trial.prefix.size()),
                              kPrefillChunk, &cache, &pool, nullptr, nullptr,
                              PrefillProgressLines(err, "demo: " + label));
        !st.ok()) {
      return fail(label + ": prefill: " + st.ToString());
    }
    row.prefill_s = Seconds(t0, Clock::now());
    row.resident_after_prefill = cache.ResidentBytes();
    row.describe = cache.policy().describe();
    const CacheCounters counters0 = cache.counters();  // the decode steps are measured

    // Greedy decode through the compressed cache: the question token(s), then the answer.
    int64_t row_bytes = 0;  // per layer per KV head, averaged over layers (the fallback only)
    for (int l = 0; l < cache.n_layers(); ++l) {
      row_bytes += cache.geometry(l).bytes_per_token() / cache.geometry(l).n_kv_heads;
    }
    if (cache.n_layers() > 0) row_bytes /= cache.n_layers();
    double read_bytes = 0;
    auto step = [&](int32_t token) -> Status {
      const auto d0 = Clock::now();
      RETURN_IF_ERROR(m.Decode(token, &cache, &pool, logits.data()));
      row.decode_s += Seconds(d0, Clock::now());
      ++row.decode_steps;
      const ReadStats& s = cache.counters().last_step;
      if (s.bytes_read == 0 && s.rows_attended > 0) {
        row.read_derived = true;
        read_bytes += static_cast<double>(s.rows_attended) * static_cast<double>(row_bytes);
      } else {
        read_bytes += static_cast<double>(s.bytes_read);
      }
      return OkStatus();
    };
    for (int32_t q : trial.query) {
      if (Status st = step(q); !st.ok()) return fail(label + ": decode: " + st.ToString());
    }
    for (size_t j = 0; j < trial.answer.size(); ++j) {
      const int32_t id = Argmax(logits);
      row.answer.push_back(id);
      if (Status st = step(id); !st.ok()) return fail(label + ": decode: " + st.ToString());
    }
    // Keep decoding greedily, so the speed and read figures cover more than a couple of steps.
    for (int64_t g = 0; g < o.gen; ++g) {
      if (Status st = step(Argmax(logits)); !st.ok()) {
        return fail(label + ": decode: " + st.ToString());
      }
    }
    row.correct = row.answer == trial.answer;
    row.resident = cache.ResidentBytes();
    row.parts = cache.ResidentBreakdown();
    row.read_bytes_per_step = row.decode_steps ? read_bytes / row.decode_steps : 0;
    row.achieved = MeasureAchieved(cache, counters0);
    row.check = CheckAchieved(label, row.achieved);
    err << "demo: " << label << ": prefill " << trial.prefix.size() << " tokens in "
        << FormatFixed(row.prefill_s, 2) << " s; answer " << TokenNames(tok, no.kv, row.answer)
        << (row.correct ? " (right)" : " (wrong)") << "\n";
    if (!row.check.warning.empty()) err << "warning: " << row.check.warning << "\n";
    rows.push_back(std::move(row));
  }

  // The report: a header, the table, what the columns mean.
  out << "strata demo: needle in a haystack, compressed at the end of the prefix, then answered "
         "by greedy decode\n";
  out << "model:    " << path << " (" << mc.Summary() << ")\n";
  out << "prefix:   " << o.len << " tokens of " << eval::kBuiltinHaystackName
      << " (kv-tokens), needle " << TokenNames(tok, no.kv, trial.needle) << " at depth "
      << trial.depth << " (" << FormatFixed(depth_pct, 0) << "%), seed " << o.seed << "\n";
  out << "question: " << TokenNames(tok, no.kv, trial.query) << "  expected answer: " << expected
      << "\n";
  out << "budget:   --ratio " << o.ratio << ": the policies with a row budget keep 1/" << o.ratio
      << " of the prefix rows\n\n";
  // In plain words first: what each policy saved and whether it answered, then any policy that
  // holds or reads more than the full cache, with the setting that would fix it.
  out << "in short:\n";
  for (const DemoRow& r : rows) {
    const std::string answered = r.correct ? "answered right" : "answered wrong";
    if (r.achieved.policy.reference) {
      out << "  " << r.config.Label() << ": the uncompressed reference, " << answered << "\n";
      continue;
    }
    auto saved = [](double x, const std::string& what) {
      const std::string f = FormatFixed(x, 2);
      if (f == "1.00") return what + " as much as full";
      return x < 1 ? what + " " + f + "x of full's" : what + " " + f + "x (more than full)";
    };
    out << "  " << r.config.Label() << ": " << answered << ", "
        << saved(r.achieved.read_vs_full(), "reading") << " bytes per decode step, "
        << saved(r.achieved.resident_vs_full(), "holding") << " in RAM\n";
  }
  std::vector<std::string> warnings;
  for (const DemoRow& r : rows) {
    if (!r.check.warning.empty()) warnings.push_back(r.check.warning);
  }
  for (const std::string& w : warnings) out << "warning: " << w << "\n";
  out << "\n";
  Table t({"policy", "answer", "correct?", "resident KiB", "x full", "read KiB/step", "x full",
           "rows kept", "decode tok/s"});
  std::vector<std::string> derived;
  for (const DemoRow& r : rows) {
    t.AddRow({r.config.Label(), TokenNames(tok, no.kv, r.answer), r.correct ? "yes" : "no",
              FormatFixed(KiB(static_cast<double>(r.resident)), 1),
              eval::VsFullText(r.achieved.resident_vs_full()),
              FormatFixed(KiB(r.read_bytes_per_step), 1) + (r.read_derived ? " *" : ""),
              eval::VsFullText(r.achieved.read_vs_full()), eval::KeptText(r.achieved),
              r.decode_s > 0 ? FormatFixed(r.decode_steps / r.decode_s, 1) : "-"});
    if (r.read_derived) derived.push_back(r.config.Label());
  }
  t.Print(out);
  for (const auto& [label, why] : skipped) out << "skipped " << label << ": " << why << "\n";
  const int64_t n_steps = rows.empty() ? 0 : rows[0].decode_steps;
  out << "\nresident KiB: KV cache bytes held in RAM after the answer, all layers, as the policy "
         "accounts them\n  (rows a policy no longer reads but keeps, such as vestige's RAM archive "
         "and the\n  evicted rows of streaming and h2o, count; so do indexes and score tables)\n"
         "read KiB/step: KV bytes the attention read per decode step (rows, plus vestige's recall "
         "index scan),\n  mean of "
      << n_steps << " steps; decode tok/s: over those steps, " << threads << " thread"
      << (threads == 1 ? "" : "s") << "\n"
      << "x full: the same figure over what the full cache holds / reads for the same rows and "
         "steps;\n  rows kept: rows the policy still reads without a recall, of the rows visible "
         "(all layers)\n";
  for (const DemoRow& r : rows) {
    if (r.describe != r.config.policy) out << r.config.Label() << ": " << r.describe << "\n";
  }
  // Where the bytes are, for the policies that hold more than cache pages (an index, an
  // attended tier, an archive file), and what the process took at its peak.
  out << "\nresident by part (after the answer):\n";
  for (const DemoRow& r : rows) {
    if (r.parts.parts.size() > 1 || r.parts.file_bytes > 0) {
      out << "  " << r.config.Label() << ": " << r.parts.ToString() << "\n";
    }
  }
  out << "  process peak RSS: " << FormatBytes(static_cast<double>(PeakRssBytes()))
      << " (the model, every policy's cache in turn, the code)\n";
  {
    std::vector<LayerKindRow> kind_rows;
    for (const DemoRow& r : rows) kind_rows.push_back({{r.config.Label()}, &r.achieved});
    std::ostringstream kinds;
    PrintLayerKindTable(
        "resident by layer kind (after the answer; KDA state: fixed per "
        "sequence, no policy sees it):",
        {"policy"}, kind_rows, kinds);
    if (!kinds.str().empty()) out << "\n" << kinds.str();
  }
  if (!derived.empty()) {
    std::string list;
    for (const auto& d : derived) list += (list.empty() ? "" : ", ") + d;
    out << "* read bytes derived as rows attended x row bytes (the policy reports no byte count): "
        << list << "\n";
  }

  if (!o.json_path.empty()) {
    nlohmann::json results = nlohmann::json::array();
    for (const DemoRow& r : rows) {
      results.push_back({{"policy", r.config.policy},
                         {"label", r.config.Label()},
                         {"describe", r.describe},
                         {"answer", r.answer},
                         {"answer_text", TokenNames(tok, no.kv, r.answer)},
                         {"correct", r.correct},
                         {"resident_bytes", r.resident},
                         {"resident_bytes_after_prefill", r.resident_after_prefill},
                         {"read_bytes_per_step", r.read_bytes_per_step},
                         {"read_bytes_derived", r.read_derived},
                         {"decode_steps", r.decode_steps},
                         {"decode_seconds", r.decode_s},
                         {"prefill_seconds", r.prefill_s}});
      eval::AddAchievedFields(r.achieved, r.check, &results.back());
    }
    nlohmann::json j = {{"model", path},
                        {"len", o.len},
                        {"seed", o.seed},
                        {"ratio", o.ratio},
                        {"threads", threads},
                        {"haystack", eval::kBuiltinHaystackName},
                        {"depth", trial.depth},
                        {"needle", trial.needle},
                        {"query", trial.query},
                        {"expected", trial.answer},
                        {"expected_text", expected},
                        {"results", results},
                        {"warnings", warnings},
                        {"skipped", nlohmann::json::array()}};
    for (const auto& [label, why] : skipped) {
      j["skipped"].push_back({{"label", label}, {"reason", why}});
    }
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
