#include "eval/runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace strata::eval {

PolicyFactory RegistryFactory() {
  return [](const PolicySpec& spec) { return MakePolicy(spec); };
}

PolicySpec PolicyConfig::Spec() const {
  PolicySpec s;
  s.name = policy;
  s.settings = settings;
  // The grid's ratio axis reaches only the policies that declare a ratio (full@8 runs full).
  if (ratio && !SettingsFor(policy, {{"ratio", *ratio}}).empty()) s.settings["ratio"] = *ratio;
  return s;
}

std::string PolicyConfig::Label() const { return ratio ? Name() + "@" + *ratio : Name(); }

StatusOr<std::vector<PolicyConfig>> ExpandGrid(const std::vector<std::string>& policies,
                                               const std::vector<std::string>& ratios,
                                               const std::map<std::string, std::string>& settings) {
  struct Item {
    std::string name;
    std::string variant;
    std::map<std::string, std::string> own;
  };
  std::vector<Item> items;
  for (const auto& p : policies) {
    if (p == "all") {
      for (const PolicyInfo& info : Policies()) items.push_back({info.name, "", {}});
      continue;
    }
    // One parser for every policy item (kv/registry.h): NAME[@X][:key=value...].
    ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicySpec(p));
    if (spec.settings.count("ratio")) {
      return InvalidArgument("--policy item '" + p +
                             "': the ratio is set by --ratio, not per policy");
    }
    Item it;
    it.name = spec.name;
    it.own = std::move(spec.settings);
    // The variant as written ("recall=off:block=1024"); NAME@X writes its budget setting.
    const size_t colon = p.find(':');
    if (colon != std::string::npos) it.variant = p.substr(colon + 1);
    const size_t at = p.substr(0, colon).find('@');
    if (at != std::string::npos) {
      const std::string budget = FindPolicy(spec.name)->settings.budget;
      const std::string kv = budget + "=" + it.own.at(budget);
      it.variant = it.variant.empty() ? kv : kv + ":" + it.variant;
    }
    items.push_back(std::move(it));
  }
  // A setting given for the whole list goes to the policies that declare it (CheckListSettings
  // is the CLI's check that each reaches at least one).
  std::map<std::string, std::string> shared = settings;
  shared.erase("ratio");
  std::vector<PolicyConfig> out;
  for (const auto& it : items) {
    std::map<std::string, std::string> s = SettingsFor(it.name, shared);
    const PolicyInfo* info = FindPolicy(it.name);
    for (const auto& [k, v] : it.own) {
      // The item's own value replaces the list's, also when one of them is an alias.
      const SettingDecl* d = info ? info->settings.Find(k) : nullptr;
      for (auto i = s.begin(); i != s.end();) {
        i = (d != nullptr && info->settings.Find(i->first) == d) ? s.erase(i) : std::next(i);
      }
      s[k] = v;
    }
    // A policy that takes no ratio (full, geodesia, kivi2...) is one config, labelled without
    // one: "geodesia@8" and "geodesia@32" would be the same run under two names.
    if (ratios.empty() || SettingsFor(it.name, {{"ratio", ratios.front()}}).empty()) {
      out.push_back({it.name, std::nullopt, s, it.variant});
    } else {
      for (const auto& r : ratios) out.push_back({it.name, r, s, it.variant});
    }
  }
  return out;
}

StatusOr<PolicyConfig> SingleConfig(const std::string& item, std::optional<std::string> ratio,
                                    const std::map<std::string, std::string>& settings) {
  std::vector<std::string> ratios;
  if (ratio) ratios.push_back(*ratio);
  ASSIGN_OR_RETURN(std::vector<PolicyConfig> one, ExpandGrid({item}, ratios, settings));
  if (one.size() != 1) return InvalidArgument("'" + item + "' must name one policy");
  return one[0];
}

Status CheckListSettings(const std::vector<std::string>& policies,
                         const std::map<std::string, std::string>& settings) {
  std::vector<std::string> names;
  for (const auto& p : policies) {
    if (p == "all") {
      for (const PolicyInfo& info : Policies()) names.push_back(info.name);
      continue;
    }
    ASSIGN_OR_RETURN(const PolicySpec spec, ParsePolicySpec(p));
    // The item's own settings, checked now (before any model is loaded); registered names only,
    // a test factory may add others.
    if (FindPolicy(spec.name) != nullptr) {
      RETURN_IF_ERROR(ValidatePolicySpec(spec).WithContext("--policy item '" + p + "'"));
    }
    if (std::find(names.begin(), names.end(), spec.name) == names.end()) {
      names.push_back(spec.name);
    }
  }
  for (const auto& [k, v] : settings) {
    bool taken = false;
    for (const std::string& n : names) taken = taken || SettingsFor(n, {{k, v}}).count(k) != 0;
    if (taken) continue;
    std::string listed, owners;
    for (const auto& n : names) listed += (listed.empty() ? "" : ", ") + n;
    for (const auto& o : PoliciesDeclaring(k)) owners += (owners.empty() ? "" : ", ") + o;
    return InvalidArgument("--" + k + " " + v + " applies to none of the policies (" + listed +
                           (owners.empty() ? "); no policy declares '" + k + "'"
                                           : "); it is a setting of " + owners));
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<KvCache>> NewConfigCache(const Model& model, const PolicyFactory& factory,
                                                  const PolicyConfig& config, DType kv_type) {
  auto policy = factory(config.Spec());
  if (!policy.ok()) return policy.status().WithContext("policy " + config.Label());
  auto cache = model.NewCache(std::move(*policy), kv_type);
  if (!cache.ok()) return cache.status().WithContext("policy " + config.Label());
  return cache;
}

StatusOr<std::vector<PolicyConfig>> BuildableConfigs(
    const Model& model, const PolicyFactory& factory, const std::vector<PolicyConfig>& configs,
    bool skip_unsupported, std::vector<SkippedConfig>* skipped, std::ostream* progress,
    DType kv_type) {
  std::vector<PolicyConfig> out;
  for (const PolicyConfig& c : configs) {
    // The factory and Bind errors already name the policy; the label adds the ratio.
    Status st;
    auto policy = factory(c.Spec());
    if (!policy.ok()) {
      st = policy.status();
    } else {
      st = model.NewCache(std::move(*policy), kv_type).status();
    }
    if (st.ok()) {
      out.push_back(c);
    } else if (skip_unsupported) {
      skipped->push_back({c, st.message()});
      Progress(progress).Line("skipping " + c.Label() + ": " + st.message());
    } else {
      return st.WithContext("policy " + c.Label());
    }
  }
  if (out.empty()) return InvalidArgument("no policy in --policy can run on this model");
  return out;
}

nlohmann::json ConfigJson(const PolicyConfig& c) {
  // The settings the policy received (Spec(): the list's settings it declares, the item's own and
  // the ratio when it takes one), never one it ignored.
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [k, v] : c.Spec().settings) s[k] = v;
  return {{"policy", c.policy},
          {"variant", c.variant},
          {"ratio", c.ratio ? nlohmann::json(*c.ratio) : nlohmann::json(nullptr)},
          {"label", c.Label()},
          {"settings", s}};
}

nlohmann::json SkippedJson(const std::vector<SkippedConfig>& skipped) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : skipped) {
    j.push_back(
        {{"policy", s.config.policy},
         {"variant", s.config.variant},
         {"ratio", s.config.ratio ? nlohmann::json(*s.config.ratio) : nlohmann::json(nullptr)},
         {"reason", s.reason}});
  }
  return j;
}

namespace {
double LogSumExp(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - mx);
  return mx + std::log(s);
}
}  // namespace

double TokenNll(const float* logits, int64_t n_vocab, int32_t target) {
  STRATA_CHECK(target >= 0 && target < n_vocab);
  return LogSumExp(logits, n_vocab) - static_cast<double>(logits[target]);
}

double KlDivergence(const float* p_logits, const float* q_logits, int64_t n_vocab) {
  const double lp = LogSumExp(p_logits, n_vocab);
  const double lq = LogSumExp(q_logits, n_vocab);
  double kl = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const double log_p = static_cast<double>(p_logits[i]) - lp;
    const double log_q = static_cast<double>(q_logits[i]) - lq;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(0.0, kl);  // tiny negative values are rounding
}

int64_t ValuesPerToken(const KvCache& cache) { return cache.FullBytesPerToken() / 2; }

double ResidentBitsPerValue(const KvCache& cache) {
  const int64_t n = cache.n_tokens();
  if (n == 0) return 0;
  // The cached values are the attention rows: a recurrent state (kimi-linear's KDA layers) is a
  // fixed per-sequence cost reported apart (resident_parts "recurrent state"), not in bits/value.
  return static_cast<double>(cache.ResidentBytes() - cache.RecurrentBytes()) * 8.0 /
         (static_cast<double>(n) * static_cast<double>(ValuesPerToken(cache)));
}

nlohmann::json AchievedJson(const AchievedCompression& a) {
  const PolicySummary& p = a.policy;
  auto or_null = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const double kept = a.kept_fraction();
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& [name, bytes] : a.resident_parts.parts) parts[name] = bytes;
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [name, bytes] : a.resident_by_kind.parts) kinds[name] = bytes;
  return {{"resident_bytes", a.resident_bytes},
          {"resident_parts", parts},
          {"resident_by_layer_kind", kinds},
          {"archive_file_bytes", a.resident_parts.file_bytes},
          {"full_resident_bytes", a.full_resident_bytes},
          {"resident_vs_full", a.resident_vs_full()},
          {"bytes_read", a.bytes_read},
          {"full_bytes_read", a.full_bytes_read},
          {"read_vs_full", a.read_vs_full()},
          {"reads", a.reads},
          {"fallbacks", a.fallbacks},
          {"recovered_error", a.recovered.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(a.recovered)},
          {"rows_read", a.rows_read},
          {"rows_visible_read", a.rows_visible_read},
          {"rows_visible", p.rows_visible},
          {"rows_kept", or_null(p.rows_kept)},
          {"kept_fraction", kept >= 0 ? nlohmann::json(kept) : nlohmann::json(nullptr)},
          {"blocks_closed", or_null(p.blocks_closed)},
          {"reference", p.reference},
          {"policy_compressed", p.compressed},
          {"note", p.note},
          {"block_levels", LevelHistogramsJson(a.levels)}};
}

nlohmann::json LevelHistogramsJson(const LevelHistograms& h) {
  if (h.empty()) return nullptr;
  return {{"levels", h.levels},
          {"per_layer_head", h.counts},
          {"per_layer", h.PerLayer()},
          {"total", h.Total()}};
}

void AddAchievedFields(const AchievedCompression& a, const CompressionCheck& check,
                       nlohmann::json* j) {
  (*j)["compressed"] = check.compressed;
  (*j)["warnings"] = check.warning.empty() ? nlohmann::json::array()
                                           : nlohmann::json::array({check.warning});
  (*j)["achieved"] = AchievedJson(a);
}

std::string KeptText(const AchievedCompression& a) {
  const double f = a.kept_fraction();
  if (f < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), f < 0.1 ? "%.1f%%" : "%.0f%%", 100 * f);
  return buf;
}

double MeanLayerKindBytes(const AchievedCompression& a, const std::string& kind) {
  if (a.runs <= 0) return 0;
  for (const auto& [name, bytes] : a.resident_by_kind.parts) {
    if (name == kind) return static_cast<double>(bytes) / static_cast<double>(a.runs);
  }
  return 0;
}

std::string VsFullText(double ratio) {
  if (!(ratio > 0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", ratio);
  return buf;
}

std::string CompressedText(const AchievedCompression& a, const CompressionCheck& check) {
  if (a.policy.reference) return "-";
  return check.compressed ? "yes" : "NO";
}

void Progress::Line(const std::string& text) const {
  if (err_) *err_ << text << "\n" << std::flush;
}

}  // namespace strata::eval
