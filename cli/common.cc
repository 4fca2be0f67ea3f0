#include "cli/common.h"

#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "eval/runner.h"
#include "kv/registry.h"
#include "model/synth.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif
#ifndef STRATA_BINARY_DIR
#define STRATA_BINARY_DIR "."
#endif

namespace strata::cli {

namespace {
bool LooksNumeric(const std::string& s) {
  if (s.empty()) return false;
  const char c = s[0];
  return std::isdigit(static_cast<unsigned char>(c)) ||
         ((c == '-' || c == '.') && s.size() > 1 && std::isdigit(static_cast<unsigned char>(s[1])));
}
}  // namespace

namespace {
// `s` cut at spaces into lines of at most `width` characters (a longer word is a line alone).
std::vector<std::string> WrapText(const std::string& s, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::stringstream ss(s);
  std::string word;
  while (ss >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}
}  // namespace

void Table::Print(std::ostream& out) const {
  const size_t n_cols = header_.size();
  // Each row as physical lines: a wrapped column's cell may take several.
  std::vector<std::vector<std::vector<std::string>>> rows;  // row -> column -> lines
  for (const auto& r : rows_) {
    std::vector<std::vector<std::string>> cells(n_cols);
    for (size_t c = 0; c < n_cols; ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const auto w = wrap_.find(c);
      cells[c] = w != wrap_.end() && cell.size() > w->second ? WrapText(cell, w->second)
                                                             : std::vector<std::string>{cell};
    }
    rows.push_back(std::move(cells));
  }
  std::vector<size_t> width(n_cols, 0);
  for (size_t c = 0; c < n_cols; ++c) width[c] = header_[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < n_cols; ++c) {
      for (const auto& l : r[c]) width[c] = std::max(width[c], l.size());
    }
  }
  // `wrapped[c]`: column c's cell spans several lines, which are text and left-aligned under
  // the column, whatever a line starts with.
  auto print_row = [&](const std::vector<std::string>& r, bool is_header,
                       const std::vector<bool>& wrapped) {
    std::string line;
    for (size_t c = 0; c < n_cols; ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const std::string pad(width[c] - cell.size(), ' ');
      if (c) line += "  ";
      const bool right = !is_header && !wrapped[c] && LooksNumeric(cell);
      line += right ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  };
  print_row(header_, true, std::vector<bool>(n_cols, false));
  std::string rule;
  for (size_t c = 0; c < n_cols; ++c) rule += (c ? "  " : "") + std::string(width[c], '-');
  out << rule << "\n";
  for (const auto& r : rows) {
    size_t n_lines = 1;
    for (const auto& cell : r) n_lines = std::max(n_lines, cell.size());
    std::vector<bool> wrapped(n_cols);
    for (size_t c = 0; c < n_cols; ++c) wrapped[c] = r[c].size() > 1;
    for (size_t i = 0; i < n_lines; ++i) {
      std::vector<std::string> line(n_cols);
      for (size_t c = 0; c < n_cols; ++c) line[c] = i < r[c].size() ? r[c][i] : "";
      print_row(line, false, wrapped);
    }
  }
}

std::vector<std::string> ColumnNames(const std::vector<ColumnDoc>& cols) {
  std::vector<std::string> names;
  for (const ColumnDoc& c : cols) names.push_back(c.name);
  return names;
}

void PrintLegend(const std::vector<ColumnDoc>& cols, std::ostream& out) {
  size_t w = 0;
  for (const ColumnDoc& c : cols) w = std::max(w, c.name.size());
  out << "columns:\n";
  for (const ColumnDoc& c : cols) {
    out << "  " << c.name << std::string(w - c.name.size(), ' ') << "  " << c.meaning << "\n";
  }
}

std::string FormatFixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

double PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

int64_t PeakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {
std::string LayerKindHeader(const std::string& kind) {
  if (kind == "kda") return "KDA state KiB";
  std::string up = kind;
  for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return up + " layers KiB";
}
}  // namespace

void PrintLayerKindTable(const std::string& caption, const std::vector<std::string>& key_header,
                         const std::vector<LayerKindRow>& rows, std::ostream& out) {
  std::vector<std::string> kinds;
  bool split = false;
  for (const LayerKindRow& r : rows) {
    const auto& parts = r.achieved->resident_by_kind.parts;
    split = split || parts.size() > 1;
    for (const auto& [name, bytes] : parts) {
      if (std::find(kinds.begin(), kinds.end(), name) == kinds.end()) kinds.push_back(name);
    }
  }
  if (!split) return;
  std::vector<std::string> header = key_header;
  for (const std::string& k : kinds) header.push_back(LayerKindHeader(k));
  Table t(header);
  for (const LayerKindRow& r : rows) {
    std::vector<std::string> row = r.key;
    for (const std::string& k : kinds) {
      row.push_back(FormatFixed(eval::MeanLayerKindBytes(*r.achieved, k) / 1024.0, 1));
    }
    t.AddRow(std::move(row));
  }
  out << caption << "\n";
  t.Print(out);
}

void AddBlockLevelRows(const LevelHistograms& h, Table* t) {
  if (h.empty()) return;
  std::string names;
  for (int bits : h.levels) names += (names.empty() ? "" : "/") + std::to_string(bits);
  const auto per_layer = h.PerLayer();
  for (size_t l = 0; l < per_layer.size(); ++l) {
    std::string v;
    for (int64_t n : per_layer[l]) v += (v.empty() ? "" : " / ") + std::to_string(n);
    t->AddRow({"block levels, layer " + std::to_string(l) + " (" + names + " bits)", v});
  }
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return std::to_string(static_cast<int64_t>(bytes)) + " B";
  return FormatFixed(v, 2) + " " + kUnits[u];
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

StatusOr<std::vector<int64_t>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) {
      return InvalidArgument(flag + ": '" + item + "' in '" + text + "' is not an integer");
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument(flag + " needs at least one value, got '" + text + "'");
  return out;
}

Status CheckAtLeast(const std::string& flag, int64_t value, int64_t min) {
  if (value >= min) return OkStatus();
  return InvalidArgument(flag + " must be >= " + std::to_string(min) + ", got " +
                         std::to_string(value));
}

Status CheckNumberAtLeast(const std::string& flag, const std::string& text, double min,
                          const std::string& example, const std::string& why) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    return InvalidArgument(flag + " '" + text + "' is not a number (e.g. " + flag + " " + example +
                           ")");
  }
  if (!(v >= min) || !std::isfinite(v)) {
    char min_text[32];
    std::snprintf(min_text, sizeof(min_text), "%g", min);
    return InvalidArgument(flag + " " + text + " must be a finite number >= " + min_text + " (" +
                           why + ")");
  }
  return OkStatus();
}

int HardwareThreads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int CapThreads(const std::string& flag, int64_t requested, std::ostream& err) {
  const int cores = HardwareThreads();
  if (requested <= cores) return static_cast<int>(std::max<int64_t>(1, requested));
  err << "warning: " << flag << " " << requested << " is more than the " << cores
      << " hardware thread" << (cores == 1 ? "" : "s") << "; using " << cores << "\n";
  return cores;
}

Model::PrefillProgress PrefillProgressLines(std::ostream& err, const std::string& label) {
  auto next = std::make_shared<int64_t>(0);  // the next tenth to report
  return [&err, label, next](int64_t done, int64_t total) {
    if (total < kProgressMinTokens) return;
    const int64_t tenth = done * 10 / total;
    if (tenth < *next && done < total) return;
    *next = tenth + 1;
    err << label << ": prefill " << done << " / " << total << " tokens ("
        << done * 100 / total << "%)\n" << std::flush;
  };
}

StatusOr<int64_t> ResolveCtxSize(int64_t requested, const ModelConfig& config, std::ostream& err) {
  if (requested < 0) {
    return InvalidArgument("-c/--ctx-size must be >= 0 (0: the model's context length), got " +
                           std::to_string(requested));
  }
  const int64_t trained = config.n_ctx_train;
  if (requested == 0) return trained;
  if (trained > 0 && requested > trained) {
    err << "warning: -c " << requested << " is past the model's trained context of " << trained
        << " tokens; positions beyond it were never trained\n";
  }
  return requested;
}

std::string TestbedVocabularyMismatch(const Tokenizer& tok, const eval::KvTokenIds& kv) {
  const int32_t last_value = kv.slot1_first + kv.slot1_count - 1;  // <v31>: id 33
  const std::pair<int32_t, std::string> want[] = {
      {kv.key, "<KEY>"},
      {kv.slot0_first, "<v0>"},
      {last_value, "<v" + std::to_string(last_value - kv.slot0_first) + ">"}};
  for (const auto& [id, text] : want) {
    const int32_t got = tok.TokenId(text);
    if (got != id) {
      return "token " + text + " is " +
             (got < 0 ? std::string("missing") : "id " + std::to_string(got)) + ", expected id " +
             std::to_string(id);
    }
  }
  return "";
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const PolicyInfo& p : Policies()) names.push_back(p.name);
  return names;
}

std::vector<std::string> SharedSettingNames() {
  std::vector<std::string> names;
  for (const PolicyInfo& p : Policies()) {
    for (const SettingDecl& d : p.settings.settings) {
      if (d.shared && std::find(names.begin(), names.end(), d.name) == names.end()) {
        names.push_back(d.name);
      }
    }
  }
  return names;
}

std::string SharedSettingHelp(const std::string& key) {
  // The first declaring policy's help, then who takes it and each one's default and range, all
  // read from the declarations (kv/settings.h), so no default is restated here.
  std::string help;
  std::vector<std::pair<std::string, std::vector<std::string>>> defaults;  // text -> policies
  std::vector<std::pair<std::string, std::vector<std::string>>> ranges;
  auto add = [](auto* v, const std::string& text, const std::string& policy) {
    for (auto& [t, ps] : *v) {
      if (t == text) {
        ps.push_back(policy);
        return;
      }
    }
    v->push_back({text, {policy}});
  };
  for (const PolicyInfo& p : Policies()) {
    const SettingDecl* d = p.settings.Find(key);
    if (d == nullptr) continue;
    if (help.empty()) help = d->help;
    add(&defaults, d->DefaultText(), p.name);
    add(&ranges, d->RangeText(), p.name);
  }
  auto list = [](const std::vector<std::pair<std::string, std::vector<std::string>>>& v) {
    std::string s;
    for (const auto& [t, ps] : v) {
      s += (s.empty() ? "" : "; ") + t;
      if (v.size() > 1) {
        std::string names;
        for (const auto& p : ps) names += (names.empty() ? "" : ", ") + p;
        s += " (" + names + ")";
      }
    }
    return s;
  };
  std::string takers;
  for (const auto& n : PoliciesDeclaring(key)) takers += (takers.empty() ? "" : ", ") + n;
  if (!help.empty()) help[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(help[0])));
  return help + " [" + takers + "; default " + list(defaults) + "; range " + list(ranges) + "]";
}

std::string SharedSettingDefault(const std::string& key) {
  std::vector<std::pair<std::string, std::vector<std::string>>> defaults;  // text -> policies
  for (const PolicyInfo& p : Policies()) {
    const SettingDecl* d = p.settings.Find(key);
    if (d == nullptr) continue;
    // "auto: the largest power of two..." is said in the help; the default column says "auto".
    std::string text = d->DefaultText();
    if (const size_t colon = text.find(':'); colon != std::string::npos) text.resize(colon);
    auto it = std::find_if(defaults.begin(), defaults.end(),
                           [&](const auto& e) { return e.first == text; });
    if (it == defaults.end()) {
      defaults.push_back({text, {p.name}});
    } else {
      it->second.push_back(p.name);
    }
  }
  std::string out;
  for (const auto& [text, policies] : defaults) {
    std::string names;
    if (defaults.size() > 1) {
      for (const auto& n : policies) names += (names.empty() ? " (" : ", ") + n;
      names += ")";
    }
    out += (out.empty() ? "" : "; ") + text + names;
  }
  return out;
}

void AddPolicyFlags(CLI::App* cmd, PolicyFlags* f) {
  for (const std::string& key : SharedSettingNames()) {
    // The value stays empty unless given (the policy's own default applies); the help shows
    // that default like any other flag's.
    cmd->add_option("--" + key, f->values[key], SharedSettingHelp(key))
        ->default_str(SharedSettingDefault(key));
  }
}

StatusOr<PolicySpec> CliPolicySpec(const std::string& policy, const std::string& settings,
                                   const PolicyFlags* flags) {
  ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicySpec(policy));
  std::stringstream ss(settings);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--policy-set item '" + item + "' is not key=value");
    }
    RETURN_IF_ERROR(
        AddPolicySetting(&spec, item.substr(0, eq), item.substr(eq + 1), "--policy-set"));
  }
  if (flags) {
    for (const auto& [key, value] : flags->values) {
      if (value.empty()) continue;
      RETURN_IF_ERROR(AddPolicySetting(&spec, key, value, "--" + key));
    }
  }
  return spec;
}

StatusOr<std::unique_ptr<Policy>> MakeCliPolicy(const std::string& name,
                                                const std::string& settings,
                                                const PolicyFlags* flags) {
  auto spec = CliPolicySpec(name, settings, flags);
  if (!spec.ok()) return spec.status();
  return MakeCliPolicy(*spec);
}

StatusOr<std::unique_ptr<Policy>> MakeCliPolicy(const PolicySpec& spec) {
  auto p = MakePolicy(spec);
  if (!p.ok()) return p.status().WithContext("--policy " + spec.name);
  return p;
}

StatusOr<std::unique_ptr<Model>> LoadCommandModel(const std::string& model, bool no_mmap,
                                                  const std::string& models_dir,
                                                  const std::string& cache_dir, std::ostream& err,
                                                  std::string* path) {
  *path = model;
  if (path->empty()) {
    auto def = ResolveDefaultModel(models_dir.empty() ? DefaultModelsDir() : models_dir,
                                   cache_dir.empty() ? DefaultCacheDir() : cache_dir, err);
    if (!def.ok()) return Status(def.status().code(), def.status().ToString());
    *path = *def;
  } else {
    err << "model: " << *path << "\n";
  }
  auto loaded = Model::Load(*path, no_mmap ? GgufFile::Load::kMemory : GgufFile::Load::kMmap);
  if (!loaded.ok()) {
    return Status(loaded.status().code(),
                  "cannot load model '" + *path + "' (-m): " + loaded.status().ToString());
  }
  err << (*loaded)->config().Summary() << "\n";
  return std::move(loaded).value();
}

StatusOr<std::string> ResolveDefaultModel(const std::string& models_dir,
                                          const std::string& cache_dir, std::ostream& err) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!models_dir.empty() && fs::is_directory(models_dir, ec)) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(models_dir, ec)) {
      if (e.is_regular_file(ec) && e.path().extension() == ".gguf") found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    // The trained NoPE-MLA testbed (`strata demo`'s model) wins over the others.
    const auto nope = std::find_if(found.begin(), found.end(), [](const std::string& f) {
      return fs::path(f).filename() == "nope-mla.gguf";
    });
    if (nope != found.end()) std::rotate(found.begin(), nope, nope + 1);
    if (!found.empty()) {
      err << "model: " << found[0] << " (the repository's default model; pass -m to choose)\n";
      return found[0];
    }
  }
  const std::string path = (fs::path(cache_dir) / "default-model.gguf").string();
  if (!fs::exists(path, ec)) {
    fs::create_directories(cache_dir, ec);
    if (ec) return IoError("cannot create directory '" + cache_dir + "': " + ec.message());
    SynthOptions o;
    o.arch = Arch::kLlama;
    o.d_model = 128;
    o.n_layers = 4;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.head_dim = 32;
    o.d_ff = 384;
    o.vocab = 1024;
    o.seed = 20240601;
    o.dtype = DType::kF16;
    err << "model: generating the built-in random-weight model into " << path << " (once)\n";
    // Written under a per-process name and renamed, so concurrent first runs never see a
    // partial file.
    const std::string tmp = path + "." + std::to_string(getpid());
    RETURN_IF_ERROR(SynthGguf(o, tmp).WithContext("built-in default model"));
    fs::rename(tmp, path, ec);
    if (ec) return IoError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  }
  err << "model: " << path
      << " (built-in random-weight llama, d_model 128, 4 layers; pass -m to choose)\n";
  return path;
}

std::string DefaultModelsDir() { return std::string(STRATA_SOURCE_DIR) + "/models"; }

std::string DefaultCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/strata";
  return STRATA_BINARY_DIR;
}

void AddSamplerFlags(CLI::App* cmd, SamplerFlags* f) {
  cmd->add_option("--temp", f->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Top-k sampling: keep the K most likely tokens (0 = off)")
      ->capture_default_str();
  cmd->add_option("--top-p", f->top_p, "Nucleus sampling: keep the top tokens with mass >= P")
      ->capture_default_str();
  cmd->add_option("--min-p", f->min_p,
                  "Min-p sampling: keep tokens with probability >= P times the top token's "
                  "(0 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", f->repeat_penalty,
                  "Penalize tokens of the last --repeat-last-n tokens (positive logits divided, "
                  "negative multiplied by it; 1 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", f->repeat_last_n,
                  "Tokens the repetition penalty looks back over (0 = off, -1 = the whole "
                  "context)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", f->presence_penalty,
                  "Subtracted from the logit of every token in the --repeat-last-n window "
                  "(0 = off)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", f->frequency_penalty,
                  "Subtracted from a token's logit once per occurrence in the --repeat-last-n "
                  "window (0 = off)")
      ->capture_default_str();
  cmd->add_option("-l,--logit-bias", f->logit_bias,
                  "TOKEN_ID(+/-)BIAS added to that token's logit, e.g. 15043+1 or 2-inf (a ban); "
                  "repeatable");
  cmd->add_option("--seed", f->seed,
                  "Sampler seed, an integer in [0, 2^64-1]; -1: a random seed, printed on stderr "
                  "(\"seed: N\") so that --seed N repeats the run")
      ->capture_default_str();
  // The chain runs in llama.cpp's order: penalty, top-k, top-p, min-p, temperature.
}

StatusOr<uint64_t> ResolveSeed(const std::string& flag, const std::string& text, bool* random) {
  if (random) *random = false;
  if (text == "-1") {
    if (random) *random = true;
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd());
  }
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), &end, 10) : 0;
  if (!digits || errno == ERANGE || *end != '\0') {
    return InvalidArgument(flag + " must be an integer in [0, 18446744073709551615] or -1 (a "
                           "random seed), got '" + text + "'");
  }
  return static_cast<uint64_t>(v);
}

StatusOr<SamplerOptions> ResolveSamplerOptions(const SamplerFlags& f, std::ostream& err) {
  SamplerOptions so;
  so.temperature = f.temperature;
  so.top_k = f.top_k;
  so.top_p = f.top_p;
  so.min_p = f.min_p;
  so.repeat_penalty = f.repeat_penalty;
  so.repeat_last_n = f.repeat_last_n;
  so.presence_penalty = f.presence_penalty;
  so.frequency_penalty = f.frequency_penalty;
  for (const std::string& b : f.logit_bias) {
    // TOKEN_ID then a sign then the bias: "15043+1", "15043-0.5", "2-inf".
    const size_t sign = b.find_first_of("+-", 1);
    char* end = nullptr;
    errno = 0;
    const long long id = sign == std::string::npos ? -1 : std::strtoll(b.c_str(), &end, 10);
    if (sign == std::string::npos || !std::isdigit(static_cast<unsigned char>(b[0])) ||
        end != b.c_str() + sign || errno == ERANGE || id > INT32_MAX) {
      return InvalidArgument("--logit-bias '" + b +
                             "' is not TOKEN_ID(+/-)BIAS (e.g. 15043+1, 15043-0.5, 2-inf)");
    }
    const std::string rest = b.substr(sign);
    float bias = 0.f;
    if (rest == "-inf") {
      bias = -std::numeric_limits<float>::infinity();
    } else {
      char* e2 = nullptr;
      bias = std::strtof(rest.c_str(), &e2);
      if (e2 == rest.c_str() || *e2 != '\0' || !std::isfinite(bias)) {
        return InvalidArgument("--logit-bias '" + b + "': the bias '" + rest +
                               "' is not a finite number (or -inf)");
      }
    }
    so.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
  RETURN_IF_ERROR(so.Validate());
  bool random = false;
  ASSIGN_OR_RETURN(so.seed, ResolveSeed("--seed", f.seed, &random));
  err << "seed: " << so.seed << (random ? " (random; --seed " + std::to_string(so.seed) +
                                              " repeats this run)"
                                        : "")
      << "\n";
  return so;
}

StatusOr<std::string> ProcessEscapes(const std::string& flag, const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\\': out += '\\'; break;
      case '"': out += '"'; break;
      case '\'': out += '\''; break;
      case 'x': {
        const int hi = i + 1 < text.size() ? hex(text[i + 1]) : -1;
        const int lo = i + 2 < text.size() ? hex(text[i + 2]) : -1;
        if (hi < 0 || lo < 0) {
          return InvalidArgument(flag + ": malformed escape '" +
                                 text.substr(i - 1, std::min<size_t>(4, text.size() - i + 1)) +
                                 "' at byte " + std::to_string(i - 1) +
                                 ": \\x takes two hex digits (\\x0a); write \\\\ for a "
                                 "backslash, or pass --no-escape to take the text as it is");
        }
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        break;
      }
      default:  // not an escape: kept as written
        out += '\\';
        out += c;
    }
  }
  return out;
}

std::vector<std::string> NormalizeLlamaCppFlags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  for (const std::string& a : args) {
    if (a == "-ngl") {
      out.push_back("--n-gpu-layers");
    } else if (a == "-fa") {
      out.push_back("--flash-attn");
    } else if (a == "-cnv") {
      out.push_back("--conversation");
    } else {
      out.push_back(a);
    }
  }
  return out;
}

bool IsEndOfGeneration(const Tokenizer& tok, int32_t id) {
  // EOS, EOT, EOM and the end-of-turn markers the file names (llama.cpp's EOG set); a testbed
  // vocabulary without any never stops early.
  return tok.IsEog(id);
}

StatusOr<std::string> ReadPromptFile(const std::string& flag, const std::string& path,
                                     std::istream* in) {
  if (path == "-") {
    std::istream& is = in ? *in : std::cin;
    std::ostringstream ss;
    ss << is.rdbuf();
    if (is.bad()) return IoError(flag + " -: error reading standard input");
    return ss.str();
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument(flag + " '" + path + "' is a directory, not a prompt file");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return InvalidArgument(flag + ": cannot read '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return IoError(flag + ": error reading '" + path + "'");
  return ss.str();
}

double AvailableMemoryBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

double KvCacheBytesAt(const KvCache& cache, int64_t ctx) {
  const double per_token = static_cast<double>(cache.FullBytesPerToken());
  // The policy's bound in int64 while the full cache's bytes stay far from overflowing (a policy
  // holds at most a few times the full cache's rows beside them); past that, no machine has the
  // memory and the full cache's figure says so.
  if (per_token * static_cast<double>(ctx) < 0x1p58) {
    return static_cast<double>(cache.PeakResidentBytes(ctx));
  }
  return per_token * static_cast<double>(ctx) + static_cast<double>(cache.RecurrentBytes());
}

Status CheckKvFitsMemory(const std::string& flag, int64_t ctx, double need, double per_token,
                         double available) {
  if (available <= 0 || need <= available) return OkStatus();
  char need_text[64], avail_text[64];
  std::snprintf(need_text, sizeof need_text, "%.0f", need);
  std::snprintf(avail_text, sizeof avail_text, "%.0f", available);
  return InvalidArgument(flag + " " + std::to_string(ctx) +
                         ": one sequence's KV cache would need " + need_text + " bytes (" +
                         FormatBytes(need) + ") at " + std::to_string(ctx) + " tokens (" +
                         FormatBytes(per_token) + " per token), more than the " + avail_text +
                         " bytes (" + FormatBytes(available) +
                         ") of memory available (MemAvailable); lower " + flag);
}

Status CheckContextFitsMemory(const std::string& flag, int64_t ctx, const KvCache& cache) {
  if (ctx <= 0) return OkStatus();
  return CheckKvFitsMemory(flag, ctx, KvCacheBytesAt(cache, ctx),
                           static_cast<double>(cache.FullBytesPerToken()),
                           AvailableMemoryBytes());
}

Status CheckModelOutput(const std::string& out, const std::vector<std::string>& inputs,
                        bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path folder = fs::path(out).parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ec)) {
    return InvalidArgument("the output's folder '" + folder.string() + "' does not exist");
  }
  const bool exists = fs::exists(out, ec);
  if (exists) {
    for (const std::string& in : inputs) {
      std::error_code e2;
      if (fs::equivalent(in, out, e2)) {
        return InvalidArgument("the output '" + out + "' is the input '" + in +
                               "' (the same file); write to another file");
      }
    }
    if (fs::is_directory(out, ec)) {
      return InvalidArgument("the output '" + out + "' is a directory; name a file");
    }
    if (!overwrite) {
      return InvalidArgument("the output '" + out +
                             "' exists; pass --overwrite to replace it, or write to another file");
    }
  }
  return OkStatus();
}

std::string ModelOutputTemp(const std::string& out) {
  namespace fs = std::filesystem;
  const fs::path p(out);
  const std::string name = "." + p.filename().string() + ".strata-" + std::to_string(getpid()) +
                           ".tmp";
  return (p.parent_path() / name).string();
}

Status CommitModelOutput(const std::string& tmp, const std::string& out, bool overwrite) {
  // Checked again at the end: a file that appeared under the name while this run wrote is not
  // replaced without --overwrite either.
  if (Status st = CheckModelOutput(out, {}, overwrite); !st.ok()) {
    RemoveModelOutputTemp(tmp);
    return st;
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    const int e = errno;
    RemoveModelOutputTemp(tmp);
    return IoError("cannot rename '" + tmp + "' to '" + out + "': " + std::strerror(e));
  }
  return OkStatus();
}

void RemoveModelOutputTemp(const std::string& tmp) {
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  std::filesystem::remove(tmp + ".tmp", ec);  // GgufWriter::WriteFile's own, after a crash
}

Status StopStrings::Check(const std::vector<std::string>& stops) {
  for (const std::string& s : stops) {
    if (s.empty()) return InvalidArgument("--stop: a stop string must not be empty");
  }
  return OkStatus();
}

std::string StopStrings::Push(const std::string& piece) {
  if (stopped()) return "";
  const size_t old_size = text_.size();
  text_ += piece;
  // A match ends inside the new piece: start looking a stop string's length before it. The
  // earliest match wins.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
    const size_t at = text_.find(s, from);
    if (at != std::string::npos && (cut == std::string::npos || at < cut)) {
      cut = at;
      matched_ = s;
    }
  }
  if (cut != std::string::npos) {
    text_.resize(cut);
    std::string out = cut > printed_ ? text_.substr(printed_) : "";
    printed_ = text_.size();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n) {
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  const size_t safe = std::max(printed_, text_.size() - hold);
  std::string out = text_.substr(printed_, safe - printed_);
  printed_ = safe;
  return out;
}

std::string StopStrings::Flush() {
  std::string out = text_.substr(printed_);
  printed_ = text_.size();
  return out;
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return IoError("cannot open '" + path + "' for writing");
  f << text;
  f.close();
  if (!f) return IoError("cannot write '" + path + "'");
  return OkStatus();
}

}  // namespace strata::cli
