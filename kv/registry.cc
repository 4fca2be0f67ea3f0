#include "kv/registry.h"

#include <functional>

#include "kv/geodesia/policy.h"
#include "kv/baselines/baselines.h"
#include "kv/vestige/policy.h"

namespace strata {

namespace {

// One registered policy: its name, help and declared settings, and its maker.
struct Entry {
  PolicyInfo info;
  std::function<StatusOr<std::unique_ptr<Policy>>(const PolicySpec&)> make;
};

PolicySettings NoSettings(const std::string& policy) {
  PolicySettings p;
  p.policy = policy;
  return p;
}

// Policies are listed here explicitly (static self-registration is dropped by the linker from
// static libraries). Add one entry per policy; its settings are declared beside its parser.
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      {{"full", "every row, exact (the classic cache; the reference for every other policy)",
        NoSettings("full")},
       [](const PolicySpec&) -> StatusOr<std::unique_ptr<Policy>> {
         return std::unique_ptr<Policy>(new FullPolicy());
       }},
      {{"vestige",
        "VestigeKV: sinks + global top-m of the blockwise low-pass residual of the MLA branch "
        "+ the unclosed tail, and a recall tier that fetches archived rows per query",
        VestigeSettings(/*full_row=*/false)},
       [](const PolicySpec& s) { return MakeVestigePolicy(s, /*full_row=*/false); }},
      {{"fullrow",
        "VestigeKV tier-1 ablation: the same selector with the residual over the full latent row",
        VestigeSettings(/*full_row=*/true)},
       [](const PolicySpec& s) { return MakeVestigePolicy(s, /*full_row=*/true); }},
      {{"geodesia",
        "Geodesia-KV: 64-token blocks graded 16/8/4/2/1 bits by observed attention mass under a "
        "per-layer budget; default profile=retrieval (no block below 2 bits, only the query's "
        "block exact), profile=reference the paper's (centroids, hot sink/recent blocks)",
        GeodesiaSettings(/*cquest=*/false)},
       [](const PolicySpec& s) { return MakeGeodesiaPolicy(s, /*cquest=*/false); }},
      {{"cquest",
        "Compressed-Quest: per query head the top quest-keep closed pages by an f16 key-box "
        "bound plus the current page, over an exact cache (bits below 16: over Geodesia)",
        GeodesiaSettings(/*cquest=*/true)},
       [](const PolicySpec& s) { return MakeGeodesiaPolicy(s, /*cquest=*/true); }},
      // Baselines (kv/baselines/, docs/baselines.md).
      {{"streaming", "StreamingLLM: sinks + a sliding window of m = prefix/ratio rows",
        baselines::EvictionSettings(baselines::EvictionKind::kStreaming)},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kStreaming);
       }},
      {{"h2o", "H2O: top m = prefix/ratio rows by attention accumulated over the prompt queries "
               "+ rows after the compression point",
        baselines::EvictionSettings(baselines::EvictionKind::kH2o)},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kH2o);
       }},
      {{"h2o-recent", "H2O with half of the m rows the most recent",
        baselines::EvictionSettings(baselines::EvictionKind::kH2oRecent)},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kH2oRecent);
       }},
      {{"snapkv", "SnapKV: the last snap-window prompt rows + top m = prefix/ratio by pooled "
                  "attention of those queries",
        baselines::EvictionSettings(baselines::EvictionKind::kSnapKv)},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kSnapKv);
       }},
      {{"quest", "Quest: top pages by min/max key bound per query + the current page; exact "
                 "cache resident",
        baselines::QuestSettings()},
       [](const PolicySpec& s) { return baselines::MakeQuestPolicy(s); }},
      {{"kivi2", "KIVI 2-bit: keys per channel, values per token, group 32, 32+ exact recent",
        baselines::KiviSettings(2)},
       [](const PolicySpec& s) { return baselines::MakeKiviPolicy(s, 2); }},
      {{"kivi4", "KIVI 4-bit: keys per channel, values per token, group 32, 32+ exact recent",
        baselines::KiviSettings(4)},
       [](const PolicySpec& s) { return baselines::MakeKiviPolicy(s, 4); }},
      {{"q8_0", "llama.cpp's q8_0 KV cache (-ctk/-ctv q8_0): every K and V row quantized "
                "(no exact recent rows) in 32-value blocks, int8 + f16 scale (8.5 bits/value), "
                "Walsh-Hadamard-rotated unless rotate=0",
        baselines::LlamaCppKvSettings(DType::kQ8_0)},
       [](const PolicySpec& s) { return baselines::MakeLlamaCppKvPolicy(s, DType::kQ8_0); }},
      {{"q4_0", "llama.cpp's q4_0 KV cache (-ctk/-ctv q4_0): every K and V row quantized "
                "(no exact recent rows) in 32-value blocks, 4-bit + f16 scale (4.5 bits/value), "
                "Walsh-Hadamard-rotated unless rotate=0",
        baselines::LlamaCppKvSettings(DType::kQ4_0)},
       [](const PolicySpec& s) { return baselines::MakeLlamaCppKvPolicy(s, DType::kQ4_0); }},
      {{"turboquant", "TurboQuant as vLLM ships it: per KV head a random-sign Walsh-Hadamard "
                      "rotation, then Lloyd-Max codes of the unit Gaussian per coordinate + an f16 "
                      "row norm (preset 4bit default: 4.25 bits/value at head dim 64; k8v4, k3v4, "
                      "3bit); the running prefill chunk exact",
        baselines::TurboQuantSettings()},
       [](const PolicySpec& s) { return baselines::MakeTurboQuantPolicy(s); }},
      {{"coldfp4", "TensorRT-LLM's cold pages: 64-row pages demoted once full to NVFP4 (E2M1 + "
                   "an E4M3 scale per 16 values, 4.5 bits/value); page 0 and the filling page "
                   "exact",
        baselines::ColdFp4Settings()},
       [](const PolicySpec& s) { return baselines::MakeColdFp4Policy(s); }},
      {{"random", "uniform random m = prefix/ratio rows + rows after the compression point",
        baselines::EvictionSettings(baselines::EvictionKind::kRandom)},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kRandom);
       }},
  };
  return entries;
}

const Entry* FindEntry(const std::string& name) {
  for (const auto& e : Entries()) {
    if (e.info.name == name) return &e;
  }
  return nullptr;
}

Status UnknownPolicy(const std::string& name) {
  std::string names;
  for (const auto& e : Entries()) names += (names.empty() ? "" : ", ") + e.info.name;
  return InvalidArgument("unknown policy '" + name + "' (available: " + names + ")");
}

}  // namespace

const std::vector<PolicyInfo>& Policies() {
  static const std::vector<PolicyInfo> infos = [] {
    std::vector<PolicyInfo> v;
    for (const auto& e : Entries()) v.push_back(e.info);
    return v;
  }();
  return infos;
}

const PolicyInfo* FindPolicy(const std::string& name) {
  const Entry* e = FindEntry(name);
  return e ? &e->info : nullptr;
}

std::vector<std::string> PoliciesDeclaring(const std::string& key) {
  std::vector<std::string> out;
  for (const auto& e : Entries()) {
    if (e.info.settings.Takes(key)) out.push_back(e.info.name);
  }
  return out;
}

Status ValidatePolicySpec(const PolicySpec& spec) {
  const Entry* e = FindEntry(spec.name);
  if (e == nullptr) return UnknownPolicy(spec.name);
  return ResolveSettings(e->info.settings, spec.settings, PoliciesDeclaring).status();
}

namespace {
PolicyWrapper& TestWrapper() {
  static PolicyWrapper w;
  return w;
}
}  // namespace

void SetPolicyWrapperForTesting(PolicyWrapper wrap) { TestWrapper() = std::move(wrap); }

StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec) {
  const Entry* e = FindEntry(spec.name);
  if (e == nullptr) return UnknownPolicy(spec.name);
  // Before the maker: no policy ever sees a key it does not declare.
  RETURN_IF_ERROR(ResolveSettings(e->info.settings, spec.settings, PoliciesDeclaring).status());
  ASSIGN_OR_RETURN(std::unique_ptr<Policy> p, e->make(spec));
  if (TestWrapper()) return TestWrapper()(std::move(p));
  return p;
}

Status AddPolicySetting(PolicySpec* spec, const std::string& key, const std::string& value,
                        const std::string& source) {
  const PolicyInfo* info = FindPolicy(spec->name);
  const SettingDecl* d = info ? info->settings.Find(key) : nullptr;
  for (const auto& [k, v] : spec->settings) {
    const bool same = k == key || (d != nullptr && info->settings.Find(k) == d);
    if (same) {
      return InvalidArgument(source + ": '" + key + "' is given twice for " + spec->name + " ('" +
                             k + "=" + v + "' and '" + key + "=" + value + "')");
    }
  }
  spec->settings[key] = value;
  return OkStatus();
}

StatusOr<PolicySpec> ParsePolicySpec(const std::string& text) {
  PolicySpec spec;
  const size_t colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const size_t at = head.find('@');
  spec.name = head.substr(0, at);
  if (spec.name.empty()) return InvalidArgument("--policy item '" + text + "' has no policy name");
  const std::string where = "--policy item '" + text + "'";
  if (at != std::string::npos) {
    const std::string x = head.substr(at + 1);
    const PolicyInfo* info = FindPolicy(spec.name);
    if (info == nullptr) return UnknownPolicy(spec.name);
    if (info->settings.budget.empty()) {
      return InvalidArgument(where + ": " + spec.name +
                             " has no budget setting for '@' (it takes: " +
                             info->settings.NamesText() + ")");
    }
    if (x.empty()) return InvalidArgument(where + ": '@' needs a value");
    RETURN_IF_ERROR(AddPolicySetting(&spec, info->settings.budget, x, where));
  }
  if (colon == std::string::npos) return spec;
  // Segments between ':' are key=value; one without '=' belongs to the previous value.
  std::vector<std::string> items;
  size_t start = colon + 1;
  while (true) {
    const size_t end = std::min(text.find(':', start), text.size());
    const std::string seg = text.substr(start, end - start);
    if (seg.empty()) {
      return InvalidArgument(where + ": an empty setting (items are NAME:key=value:key=value)");
    }
    if (seg.find('=') == std::string::npos && !items.empty()) {
      items.back() += ":" + seg;
    } else {
      items.push_back(seg);
    }
    if (end == text.size()) break;
    start = end + 1;
  }
  for (const std::string& kv : items) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size()) {
      return InvalidArgument(where + ": setting '" + kv +
                             "' must be key=value (items are NAME:key=value:key=value)");
    }
    RETURN_IF_ERROR(AddPolicySetting(&spec, kv.substr(0, eq), kv.substr(eq + 1), where));
  }
  return spec;
}

std::map<std::string, std::string> SettingsFor(const std::string& name,
                                               const std::map<std::string, std::string>& settings) {
  const PolicyInfo* info = FindPolicy(name);
  if (info == nullptr) return settings;
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : settings) {
    if (info->settings.Takes(k)) out[k] = v;
  }
  return out;
}

}  // namespace strata
