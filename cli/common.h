// Shared pieces of the `strata` commands: text tables, byte/number formatting, list parsing, the
// policy registry and the built-in default model.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "cli/commands.h"
#include "kv/achieved.h"
#include "kv/policy.h"
#include "eval/needle.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/sampler.h"

namespace strata::cli {

// Exit codes: 0 success, 2 a bad flag, input file or request (the message names it), 1 a run
// that failed or measured nothing (e.g. every needle trial was dropped).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// A plain text table: a header row, then rows; columns are padded to their widest cell, numbers
// (cells that start with a digit, '-' or '.') right-aligned, and the lines of a wrapped cell
// (WrapColumn) left-aligned, being text.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Wraps column `col`'s cells at spaces into lines of at most `width` characters (a longer
  // word stays whole), so one long description does not push every other column off screen.
  void WrapColumn(size_t col, size_t width) { wrap_[col] = width; }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::map<size_t, size_t> wrap_;  // column -> width
};

// A table's legend: one line per column, "  NAME  what it is", under "columns:". A report that
// prints a table prints the legend beside it, from the same list the header was built from, so
// no column goes undefined.
struct ColumnDoc {
  std::string name;
  std::string meaning;
};
std::vector<std::string> ColumnNames(const std::vector<ColumnDoc>& cols);
void PrintLegend(const std::vector<ColumnDoc>& cols, std::ostream& out);

// "1.50 MiB", "812 B".
std::string FormatBytes(double bytes);
// Rows "block levels, layer L (16/8/4/2/1 bits)" = "3 / 0 / 2 / 10 / 17" (blocks over the layer's
// KV heads at each level) for a graded policy (Geodesia-KV); nothing for other policies.
void AddBlockLevelRows(const LevelHistograms& h, Table* t);
// On a model whose layers are of more than one kind (kimi-linear: KDA + MLA), a table of the
// mean resident KiB per run by layer kind (AchievedCompression::resident_by_kind), one row per
// entry: its key cells (under key_header), then "MLA layers KiB" (the rows and the policy's
// tables), "KDA state KiB" (the kinds present, in order). Nothing on a model of one kind.
struct LayerKindRow {
  std::vector<std::string> key;
  const AchievedCompression* achieved = nullptr;
};
void PrintLayerKindTable(const std::string& caption, const std::vector<std::string>& key_header,
                         const std::vector<LayerKindRow>& rows, std::ostream& out);
// The machine's physical memory in bytes (sysconf), 0 when unknown.
double PhysicalMemoryBytes();
// The process's peak resident set size so far (getrusage ru_maxrss), in bytes.
int64_t PeakRssBytes();
// printf("%.*f").
std::string FormatFixed(double v, int digits);
// "[768, 32000]".
std::string FormatShape(const std::vector<int64_t>& shape);

// "0,4096,16384" -> {0, 4096, 16384}; errors name the flag and the bad item.
StatusOr<std::vector<int64_t>> ParseIntList(const std::string& flag, const std::string& text);

// Flag checks for the commands' "flags first" validation: InvalidArgument with the message the
// command prints after "error: ".
// An integer flag's lower bound: "--threads must be >= 1, got 0".
Status CheckAtLeast(const std::string& flag, int64_t value, int64_t min);
// A real-valued flag kept as text (so reports echo it as given): OK when the whole text parses
// (strtod) as a finite number >= min. Errors, for flag "--ratio", example "32", min 1 and why
// "keep 1/R of the rows": "--ratio 'abc' is not a number (e.g. --ratio 32)" and
// "--ratio 0.5 must be a finite number >= 1 (keep 1/R of the rows)".
Status CheckNumberAtLeast(const std::string& flag, const std::string& text, double min,
                          const std::string& example, const std::string& why);

// The --kv-type help, shared by the commands that take it.
inline constexpr const char* kKvTypeHelp =
    "KV cache storage: bf16 (every policy), or f32 / f16 for research and parity (the full "
    "policy only; others refuse)";

// The machine's hardware threads (std::thread::hardware_concurrency, at least 1).
int HardwareThreads();
// The worker threads to start for `flag` = `requested` (already checked >= 1): at most
// HardwareThreads(). More threads than cores only contend for them (10,000 threads started
// 10,001 OS threads and decoded nothing for a minute), so a larger request is capped, with
// "warning: --threads 10000 is more than the 2 hardware threads; using 2" on `err`.
int CapThreads(const std::string& flag, int64_t requested, std::ostream& err);

// Prefill progress for a long prompt: a Model::Prefill callback that prints "LABEL: prefill
// 4096 / 13000 tokens (31%)" on `err` about every tenth of the way, for prompts of at least
// kProgressMinTokens tokens (shorter ones finish in well under a second: no lines).
inline constexpr int64_t kProgressMinTokens = 4096;
Model::PrefillProgress PrefillProgressLines(std::ostream& err, const std::string& label);

// The context size of -c/--ctx-size: `requested` (0: the model's trained context length,
// ModelConfig::n_ctx_train; 0 there too: no limit, returned as 0). A request past the trained
// window is allowed with a warning on `err` (the model never saw those positions); a negative
// one is an error naming it.
StatusOr<int64_t> ResolveCtxSize(int64_t requested, const ModelConfig& config, std::ostream& err);

// Empty when `tok` is the char-level testbed vocabulary that kv-tokens needles use
// (tools/testbed/README.md, "Vocabulary and needle format"): <KEY>, <v0> and the last slot-1
// value at kv's ids. Else why not: "token <KEY> is missing, expected id 1".
std::string TestbedVocabularyMismatch(const Tokenizer& tok, const eval::KvTokenIds& kv);

// Names of the registered cache policies (kv/registry.h), for help texts.
std::vector<std::string> PolicyNames();
// The shared settings of every registered policy (SettingDecl::shared), in registry order: each
// has a `--NAME` shorthand flag (AddPolicyFlags) whose help is SharedSettingHelp(NAME), read
// from the declarations (which policies take it, their defaults and ranges).
std::vector<std::string> SharedSettingNames();
std::string SharedSettingHelp(const std::string& key);
// The defaults of a shared setting for its help's "=DEFAULT": "32", or "3.4 (geodesia); 16 (cquest)"
// when the declaring policies differ.
std::string SharedSettingDefault(const std::string& key);
// The spec of `--policy NAME[:key=value...]` (kv/registry.h ParsePolicySpec), with the
// deprecated `--policy-set key=value,...` and the shorthand flags (PolicyFlags) added; a key
// given twice, in any two of these ways, is an error naming both. Not validated yet.
StatusOr<PolicySpec> CliPolicySpec(const std::string& policy, const std::string& settings,
                                   const PolicyFlags* flags);
// A policy from the registry from the same three sources (CliPolicySpec), validated against its
// declaration (an unknown, misspelt or inapplicable key is an error naming it); errors carry
// the "--policy NAME" context.
StatusOr<std::unique_ptr<Policy>> MakeCliPolicy(const std::string& name,
                                                const std::string& settings,
                                                const PolicyFlags* flags = nullptr);
// The same from a parsed spec (registry errors get the "--policy NAME" context).
StatusOr<std::unique_ptr<Policy>> MakeCliPolicy(const PolicySpec& spec);

// The built-in model used when -m is omitted: `models_dir`/nope-mla.gguf if it exists, else the
// first *.gguf in `models_dir` (sorted by name) if there is one, else
// `cache_dir`/default-model.gguf, generated once with SynthGguf (a small llama: d_model 128,
// 4 layers) and reused. Says which model it uses on `err`.
StatusOr<std::string> ResolveDefaultModel(const std::string& models_dir,
                                          const std::string& cache_dir, std::ostream& err);
// -m's model for a command: `model`, or the built-in default (ResolveDefaultModel, in models_dir /
// cache_dir, each the binary's when empty) when it is empty; says which on `err`, loads it (mapped,
// or read into memory with no_mmap) and prints its summary line. *path gets the file used. The
// error is the command's message: "cannot load model 'PATH' (-m): ...".
StatusOr<std::unique_ptr<Model>> LoadCommandModel(const std::string& model, bool no_mmap,
                                                  const std::string& models_dir,
                                                  const std::string& cache_dir, std::ostream& err,
                                                  std::string* path);
// The directories ResolveDefaultModel uses in the binary: <source>/models, and
// $XDG_CACHE_HOME/strata when XDG_CACHE_HOME is set, else the build directory.
std::string DefaultModelsDir();
std::string DefaultCacheDir();

// The sampler options of the shared sampler flags, validated (SamplerOptions::Validate), with the
// seed resolved (ResolveSeed) and printed on `err` as "seed: N".
StatusOr<SamplerOptions> ResolveSamplerOptions(const SamplerFlags& f, std::ostream& err);
// A seed flag's text: an integer in [0, 2^64 - 1], or -1 for a random seed (from
// std::random_device), which *random is set for. Anything else (-2, 18446744073709551616, abc) is
// InvalidArgument naming `flag`.
StatusOr<uint64_t> ResolveSeed(const std::string& flag, const std::string& text,
                               bool* random = nullptr);

// The escapes llama.cpp's -e/--escape processes, in `text` given by `flag`: \n, \r, \t, \\, \",
// \' and \xNN (two hex digits: one byte). A backslash before any other character stays as it
// is (with that character), as does a trailing one; a malformed \x (\x4, \xZZ) is
// InvalidArgument naming the flag.
StatusOr<std::string> ProcessEscapes(const std::string& flag, const std::string& text);

// Flags llama.cpp's tools take that mean nothing on this engine: -ngl/--n-gpu-layers N,
// -fa/--flash-attn [on|off|auto], --mlock, -cnv/--conversation. Every command that runs a model
// accepts them (app.cc), and each one given prints a note that it has no effect.
// CLI11's short names are one character, so the llama.cpp spellings are rewritten to the long
// ones before parsing ("-ngl" read as -n with the value "gl"); NormalizeLlamaCppFlags does that.
std::vector<std::string> NormalizeLlamaCppFlags(const std::vector<std::string>& args);

// Whether `id` ends a generated reply (generate and chat stop there without printing it).
bool IsEndOfGeneration(const Tokenizer& tok, int32_t id);

// A prompt file's bytes (generate/tokenize -f); errors name the flag, the path and the reason.
// The path "-" reads `in` (std::cin when null) to its end, as llama.cpp's -f - does.
StatusOr<std::string> ReadPromptFile(const std::string& flag, const std::string& path,
                                     std::istream* in = nullptr);

// Memory present for a new allocation: /proc/meminfo's MemAvailable, else the free pages
// (sysconf), in bytes; 0 when unknown.
double AvailableMemoryBytes();
// The KV cache one sequence needs at `ctx` tokens in `cache`'s geometry and policy: the
// policy's bound (KvCache::PeakResidentBytes, what the server reserves by), or, for a context so
// large that the bound would overflow, the full cache's bytes per token times ctx.
double KvCacheBytesAt(const KvCache& cache, int64_t ctx);
// The up-front size check of a context flag: OK when `need` bytes of KV cache fit in `available`
// (unknown: 0, always OK). Else InvalidArgument naming the flag, the context, the bytes needed
// and the memory present, e.g. "-c 1000000000000: one sequence's KV cache would need
// 1024000000000000 bytes (931.32 TiB) at 1000000000000 tokens (1.00 KiB per token), more than
// the 33285996544 bytes (31.00 GiB) of memory available (MemAvailable); lower -c".
Status CheckKvFitsMemory(const std::string& flag, int64_t ctx, double need, double per_token,
                         double available);
// The same for `cache` at `ctx` against AvailableMemoryBytes() (ctx 0, no limit: OK).
Status CheckContextFitsMemory(const std::string& flag, int64_t ctx, const KvCache& cache);

// Commands that write a model file (quantize, convert). CheckModelOutput: `out` may not be any of
// `inputs` (compared as files: device and inode, so another spelling, a hard link or a symlink of
// an input is caught), and an existing `out` is refused unless `overwrite` (--overwrite); errors
// name the paths. ModelOutputTemp: a new file name in `out`'s folder to write to and then
// CommitModelOutput (rename over `out`), so that a failed run leaves neither a partial output nor
// the temporary file (RemoveModelOutputTemp).
Status CheckModelOutput(const std::string& out, const std::vector<std::string>& inputs,
                        bool overwrite);
std::string ModelOutputTemp(const std::string& out);
Status CommitModelOutput(const std::string& tmp, const std::string& out, bool overwrite);
void RemoveModelOutputTemp(const std::string& tmp);

// Streams generated text while watching for stop strings (--stop): Push() returns what may be
// printed now. A tail that could be the start of a stop string is held back until the next
// pieces decide it, so nothing printed ever has to be taken back; at a match, the text ends
// just before the stop string (which is not printed).
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Empty when no stop string is empty; else an error naming the flag.
  static Status Check(const std::vector<std::string>& stops);
  // Adds a decoded piece; returns the text now safe to print (empty once stopped()).
  std::string Push(const std::string& piece);
  // At the end of generation: the held-back tail (which matched no stop string).
  std::string Flush();
  bool stopped() const { return !matched_.empty(); }
  const std::string& matched() const { return matched_; }  // the stop string found, or ""
  // Everything generated, cut before the stop string.
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t printed_ = 0;
  std::string matched_;
};

// Pretty JSON (invalid UTF-8 in generated text is replaced, never thrown on).
std::string DumpJson(const nlohmann::json& j);
// Writes `text` to `path` (JSON reports); IoError naming the path on failure.
Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace strata::cli
