// Pieces every evaluation command shares: how a policy is built (always through a factory that
// defaults to the registry), the policy/ratio grid, teacher-forced NLL and KL from logits, and the
// engine-counter accounting of bits per value.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/achieved.h"
#include "kv/cache.h"
#include "kv/registry.h"
#include "model/model.h"

namespace strata::eval {

// Builds a policy from a spec. The default is kv/registry.h's MakePolicy; tests inject local
// policies (e.g. the cache-destroying leakage-floor policy) by wrapping it.
using PolicyFactory = std::function<StatusOr<std::unique_ptr<Policy>>(const PolicySpec&)>;
PolicyFactory RegistryFactory();

// One evaluated configuration: a policy name, its budget ratio (settings["ratio"]; absent when
// the run gives no --ratio) and the pass-through settings. A variant ("recall=off") is a set of
// settings that belongs to this config only, so one run can compare a policy with itself.
struct PolicyConfig {
  std::string policy;
  std::optional<std::string> ratio;
  // Without "ratio": the list's settings this policy declares, then the item's own (all of
  // them: a key the policy does not declare is the registry's error).
  std::map<std::string, std::string> settings;
  std::string variant;  // "k=v:k=v" as written in the policy list; empty: none

  PolicySpec Spec() const;
  // "vestige", or "vestige:recall=off" with a variant.
  std::string Name() const { return variant.empty() ? policy : policy + ":" + variant; }
  // "vestige@32", "vestige:recall=off@32", or "full" without a ratio.
  std::string Label() const;
  std::string RatioText() const { return ratio ? *ratio : "-"; }
};

// The grid policies x ratios (policy-major). An empty `ratios` gives one config per policy with
// no ratio setting. "all" in `policies` expands to every registered policy. Items are parsed by
// kv/registry.h ParsePolicySpec: an item may carry its own settings after colons,
// "vestige:recall=off:block=1024", which override `settings` for that item only ("ratio" cannot
// be set this way: it is the grid's other axis). `settings` (the list's) reach each policy that
// declares them; a policy that declares no ratio gives one config without one ("full", not
// "full@8" and "full@32"); the registry validates every config's spec when it is built.
StatusOr<std::vector<PolicyConfig>> ExpandGrid(const std::vector<std::string>& policies,
                                               const std::vector<std::string>& ratios,
                                               const std::map<std::string, std::string>& settings);

// One config outside the grid (--reference, --policy2): the item NAME[@X][:key=value...] with
// the list's settings it declares and, when given, the ratio (where it declares one).
StatusOr<PolicyConfig> SingleConfig(const std::string& item, std::optional<std::string> ratio,
                                    const std::map<std::string, std::string>& settings);

// The CLI's check of settings given for a whole policy list (--bits, --set k=v, an explicit
// --ratio): each must be declared by at least one listed policy, else InvalidArgument naming the
// setting, the listed policies and the ones that do declare it. Each item's own settings are
// validated too (ValidatePolicySpec), so a typo fails before any model is loaded.
Status CheckListSettings(const std::vector<std::string>& policies,
                         const std::map<std::string, std::string>& settings);

// A fresh cache for the config; errors name the config (e.g. a row policy on a GQA model).
// kv_type: the cache's row storage (--kv-type); a policy that reads bf16 rows only is refused.
StatusOr<std::unique_ptr<KvCache>> NewConfigCache(const Model& model, const PolicyFactory& factory,
                                                  const PolicyConfig& config,
                                                  DType kv_type = DType::kBF16);

// A config that cannot run on the model (its factory or Bind failed), and why.
struct SkippedConfig {
  PolicyConfig config;
  std::string reason;
};

// Keeps the configs whose cache builds for this model. A failing one is an error, or, when
// `skip_unsupported`, is recorded in `skipped` (with a progress line) and left out.
StatusOr<std::vector<PolicyConfig>> BuildableConfigs(
    const Model& model, const PolicyFactory& factory, const std::vector<PolicyConfig>& configs,
    bool skip_unsupported, std::vector<SkippedConfig>* skipped, std::ostream* progress,
    DType kv_type = DType::kBF16);
// [{"policy", "ratio", "reason"}] for the report envelope.
nlohmann::json SkippedJson(const std::vector<SkippedConfig>& skipped);
// {"policy", "ratio", "label", "settings"} (settings include "ratio" when set).
nlohmann::json ConfigJson(const PolicyConfig& c);

// -log softmax(logits)[target] in float64. logits: [n_vocab].
double TokenNll(const float* logits, int64_t n_vocab, int32_t target);
// KL(softmax(p_logits) || softmax(q_logits)) in float64 nats. Both: [n_vocab].
double KlDivergence(const float* p_logits, const float* q_logits, int64_t n_vocab);

// Values one token occupies in the full cache, summed over layers (bf16: bytes / 2). The unit of
// every bits-per-value figure: bits/value = bytes * 8 / (tokens * ValuesPerToken).
int64_t ValuesPerToken(const KvCache& cache);
// Resident bits per cached value: ResidentBytes() * 8 / (n_tokens * ValuesPerToken).
double ResidentBitsPerValue(const KvCache& cache);

// The achieved-compression block of a report (docs/eval.md, "achieved"): the measured bytes beside
// the full cache's, the policy's rows kept / visible and blocks closed (null where it does not
// select rows or has no blocks) and its note.
nlohmann::json AchievedJson(const AchievedCompression& a);
// The "block_levels" field of "achieved": null for a policy without graded blocks, else
// {levels: [16, 8, 4, 2, 1], per_layer_head: [layer][KV head][level] blocks, per_layer:
// [layer][level], total: [level]} (summed over the run's windows or trials, at their ends).
nlohmann::json LevelHistogramsJson(const LevelHistograms& h);
// Sets (*j)["achieved"] = AchievedJson(a), (*j)["compressed"] = check.compressed and
// (*j)["warnings"] = [check.warning] ([] when none): every report's per-config fields.
void AddAchievedFields(const AchievedCompression& a, const CompressionCheck& check,
                       nlohmann::json* j);
// Table cells: rows kept as a percentage of the visible rows ("3.3%", "-" when the policy does
// not select rows); a ratio to full ("1.07x", "-" when the full figure is 0); the verdict ("yes",
// "NO" with a warning, "-" for the reference).
std::string KeptText(const AchievedCompression& a);
std::string VsFullText(double ratio);
// The mean resident bytes per run of one layer kind (AchievedCompression::resident_by_kind:
// "mla", "gqa", "kda"); 0 when the run has none of that kind.
double MeanLayerKindBytes(const AchievedCompression& a, const std::string& kind);
std::string CompressedText(const AchievedCompression& a, const CompressionCheck& check);

// Writes "label: i/n ..." progress lines to a stream (may be null: silent).
class Progress {
 public:
  explicit Progress(std::ostream* err) : err_(err) {}
  void Line(const std::string& text) const;

 private:
  std::ostream* err_;
};

}  // namespace strata::eval
