// Windowed language-model evaluation (reference §9): the causal Q = 1 protocol for
// perplexity (`strata eval ppl`) and KL(full || policy) of next-token distributions
// (`strata eval kl`), with engine-counter bits per value and paired cluster bootstrap intervals.
// (Reference: docs/reference/geodesia-kv.md.)
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/runner.h"
#include "eval/stats.h"
#include "model/model.h"

namespace strata::eval {

struct WindowOptions {
  int64_t length = 512;          // T: tokens per window
  int64_t eval_tokens = 32;      // E: the last E tokens of a window are targets; E - 1 are scored
  std::vector<int64_t> offsets;  // explicit window starts; empty: `windows` evenly spaced
  int64_t windows = 4;
  // Chunked mode feeds the E targets in one Prefill call after the compression point (the chunk
  // is exact current context): screening-only. Default: one token at a time (Q = 1).
  bool chunked = false;
  int chunk = 256;
  int threads = 1;
  DType kv_type = DType::kBF16;  // the caches' row storage (--kv-type)
  // ppl JSON: each window also lists the level of every graded block at its end (--block-levels).
  bool block_levels = false;
};

// Window starts over a token stream of n tokens: the explicit offsets (each must leave room for a
// whole window), or `windows` starts evenly spaced over [0, n - T] (rounded down).
StatusOr<std::vector<int64_t>> ResolveOffsets(int64_t n_tokens, const WindowOptions& w);

// The text tokenized once (BOS prepended when the tokenizer adds one), truncated to
// max(offset) + T tokens by the callers. Errors: no tokenizer.
StatusOr<std::vector<int32_t>> TokenizeCorpus(const Model& model, const std::string& text);

struct WindowResult {
  int64_t offset = 0;
  std::vector<double> nll;  // [E - 1] per scored target
  double mean_nll = 0;
  double resident_bits_per_value = 0;  // at the end of the window
  double read_bits_per_value = 0;      // over the scored steps (0 in chunked mode: not a decode)
  int64_t resident_bytes = 0;
  int64_t bytes_read = 0;
  AchievedCompression achieved;  // the same counters beside the full cache's (scored steps)
  // The level of every block at the end, [layer][KV head][block] (empty for a policy without
  // graded blocks); in the JSON only with WindowOptions::block_levels.
  std::vector<std::vector<std::vector<int>>> block_levels;
};

struct PplConfigResult {
  PolicyConfig config;
  std::vector<WindowResult> windows;
  double mean_nll = 0;  // pooled over all scored targets (= mean of window means: same sizes)
  double ppl = 0;       // exp(mean_nll)
  int64_t n_targets = 0;
  double resident_bits_per_value = 0;  // mean over windows
  double read_bits_per_value = 0;
  AchievedCompression achieved;  // summed over windows
  CompressionCheck check;        // of `achieved`, labelled with the config's label
};

struct PplComparison {
  size_t a = 0, b = 0;  // indexes into configs; delta = nll_a - nll_b
  BootstrapResult boot;
};

struct PplOptions {
  WindowOptions w;
  std::vector<std::string> policies = {"full"};
  std::vector<std::string> ratios;  // empty: no ratio setting
  std::map<std::string, std::string> settings;
  std::string policy2;  // when set, each config is compared with it (paired bootstrap)
  std::optional<std::string> ratio2;
  int draws = 20000;
  uint64_t bootstrap_seed = 0;
  std::string text_name;
  bool skip_unsupported = false;  // see NeedleOptions::skip_unsupported
  PolicyFactory factory;          // null: RegistryFactory()
};

struct PplReport {
  PplOptions options;  // factory cleared
  std::vector<int64_t> offsets;
  int64_t corpus_tokens = 0;
  std::vector<SkippedConfig> skipped;
  std::vector<PplConfigResult> configs;  // the policy2 config last when given
  std::vector<PplComparison> comparisons;
  std::vector<std::string> warnings;  // the configs' CompressionCheck warnings
};

// One window under one config: Prefill(T - E tokens) = compression point, then the E - 1 targets
// one token at a time (or one chunk), scoring each next token.
StatusOr<WindowResult> RunPplWindow(Model& model, const std::vector<int32_t>& tokens,
                                    int64_t offset, const WindowOptions& w,
                                    const PolicyFactory& factory, const PolicyConfig& config,
                                    ThreadPool* pool);

StatusOr<PplReport> RunPpl(Model& model, const std::vector<int32_t>& tokens, const PplOptions& o,
                           std::ostream* progress);
nlohmann::json PplJson(const PplReport& r);
// PPL against resident bits per value, one point per config, the Pareto front drawn.
std::string PplParetoSvg(const PplReport& r);

struct KlOptions {
  WindowOptions w;
  std::vector<std::string> policies = {"full"};
  std::vector<std::string> ratios;
  std::map<std::string, std::string> settings;
  std::string reference = "full";
  std::string text_name;
  bool skip_unsupported = false;
  PolicyFactory factory;  // null: RegistryFactory()
};

struct KlWindow {
  int64_t offset = 0;
  std::vector<double> kl;   // [E - 1]
  std::vector<double> nll;  // [E - 1]: the policy's -log p of the next token
  double mean_kl = 0;
  double max_kl = 0;
  int64_t same_top1 = 0;  // positions whose most likely token is the reference's
};

struct KlConfigResult {
  PolicyConfig config;
  std::vector<KlWindow> windows;
  double mean_kl = 0;
  double p99_kl = 0;     // the 99th percentile over every scored position (linear interpolation)
  double median_kl = 0;  // the 50th
  double max_kl = 0;
  int64_t n_positions = 0;
  int64_t same_top1 = 0;  // over every window
  double ppl = 0;         // exp(mean nll) of the policy's next-token predictions
  AchievedCompression achieved;  // summed over windows (reads: the scored steps)
  CompressionCheck check;        // of `achieved`, labelled with the config's label
};

struct KlReport {
  KlOptions options;
  std::vector<int64_t> offsets;
  int64_t corpus_tokens = 0;
  std::vector<SkippedConfig> skipped;
  std::vector<KlConfigResult> configs;
  std::vector<std::string> warnings;  // the configs' CompressionCheck warnings
  double reference_ppl = 0;           // the reference's perplexity over the same targets
};

// The q-th quantile (0 <= q <= 1) of `v` by linear interpolation between closest ranks (0 for an
// empty `v`).
double Quantile(std::vector<double> v, double q);

// As llama-perplexity --kl-divergence reports it: KL(p_reference || p_policy) at each scored
// position of each window (mean, median, p99, max), the share of positions whose most likely
// token is the reference's, and both perplexities; the reference and the policy caches are fed
// the same tokens.
StatusOr<KlReport> RunKl(Model& model, const std::vector<int32_t>& tokens, const KlOptions& o,
                         std::ostream* progress);
nlohmann::json KlJson(const KlReport& r);
// The KL chart: per config, the mean KL as a bar with its 95% interval and the max KL.
std::string KlSvg(const KlReport& r);

}  // namespace strata::eval
