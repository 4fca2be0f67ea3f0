#include "kv/registry.h"

#include <cstdlib>
#include <functional>

#include "kv/geodesia/policy.h"
#include "kv/baselines/baselines.h"
#include "kv/vestige/policy.h"

namespace strata {

StatusOr<double> PolicySpec::GetDouble(const std::string& key, double def) const {
  auto it = settings.find(key);
  if (it == settings.end()) return def;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') {
    return InvalidArgument("--" + key + " = '" + it->second + "' is not a number");
  }
  return v;
}

StatusOr<int64_t> PolicySpec::GetInt(const std::string& key, int64_t def) const {
  auto it = settings.find(key);
  if (it == settings.end()) return def;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') {
    return InvalidArgument("--" + key + " = '" + it->second + "' is not an integer");
  }
  return static_cast<int64_t>(v);
}

StatusOr<bool> PolicySpec::GetBool(const std::string& key, bool def) const {
  auto it = settings.find(key);
  if (it == settings.end()) return def;
  const std::string& v = it->second;
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  return InvalidArgument("--" + key + " = '" + v + "' must be on or off");
}

std::string PolicySpec::GetString(const std::string& key, const std::string& def) const {
  auto it = settings.find(key);
  return it == settings.end() ? def : it->second;
}

namespace {

struct Entry {
  PolicyInfo info;
  std::function<StatusOr<std::unique_ptr<Policy>>(const PolicySpec&)> make;
};

// Policies are listed here explicitly (static self-registration is dropped by the linker from
// static libraries). Add one entry per policy.
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      {{"full", "every row, exact (the classic cache; the reference for every other policy)"},
       [](const PolicySpec&) -> StatusOr<std::unique_ptr<Policy>> {
         return std::unique_ptr<Policy>(new FullPolicy());
       }},
      {{"vestige",
        "VestigeKV: sinks + global top-m of the blockwise low-pass residual of the MLA branch "
        "+ the unclosed tail (ratio, kappa, block, sinks, archive ram|file:DIR, recall, rank, "
        "calibration, recall-capacity)"},
       [](const PolicySpec& s) { return MakeVestigePolicy(s, /*full_row=*/false); }},
      {{"fullrow",
        "VestigeKV tier-1 ablation: the same selector with the residual over the full latent row "
        "(same settings as vestige)"},
       [](const PolicySpec& s) { return MakeVestigePolicy(s, /*full_row=*/true); }},
      {{"geodesia",
        "Geodesia-KV: 64-token blocks graded 16/8/4/2/1 bits by observed attention mass under a "
        "per-layer budget, hot sink/recent blocks exact (bits, group, decay, window, rd-frac, "
        "quest-keep, ratchet reference|clean, requant once|cascade, budget levels|all)"},
       [](const PolicySpec& s) { return MakeGeodesiaPolicy(s, /*cquest=*/false); }},
      {{"cquest",
        "Compressed-Quest: per query head the top quest-keep (0.125) closed pages by an f16 key-box "
        "bound plus the current page, over an exact cache (bits 16; other bits: over Geodesia)"},
       [](const PolicySpec& s) { return MakeGeodesiaPolicy(s, /*cquest=*/true); }},
      // Baselines (kv/baselines/, docs/baselines.md).
      {{"streaming",
        "StreamingLLM: 4 sinks + a sliding window of m = prefix/ratio rows (ratio, sinks)"},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kStreaming);
       }},
      {{"h2o", "H2O: top m = prefix/ratio rows by attention accumulated over the prompt queries "
               "+ rows after the compression point (ratio, h2o-queries)"},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kH2o);
       }},
      {{"h2o-recent", "H2O with half of the m rows the most recent (ratio, h2o-queries)"},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kH2oRecent);
       }},
      {{"snapkv", "SnapKV: last 32 prompt rows + top m = prefix/ratio by pooled attention of "
                  "those 32 queries (ratio, snap-window, snap-kernel)"},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kSnapKv);
       }},
      {{"quest", "Quest: top pages by min/max key bound per query + the current page; exact "
                 "cache resident (ratio, quest-pages, quest-keep, quest-heads shared|each)"},
       [](const PolicySpec& s) { return baselines::MakeQuestPolicy(s); }},
      {{"kivi2", "KIVI 2-bit: keys per channel, values per token, group 32, 32+ exact recent"},
       [](const PolicySpec& s) { return baselines::MakeKiviPolicy(s, 2); }},
      {{"kivi4", "KIVI 4-bit: keys per channel, values per token, group 32, 32+ exact recent"},
       [](const PolicySpec& s) { return baselines::MakeKiviPolicy(s, 4); }},
      {{"random", "uniform random m = prefix/ratio rows + rows after the compression point "
                  "(ratio, seed)"},
       [](const PolicySpec& s) {
         return baselines::MakeEvictionPolicy(s, baselines::EvictionKind::kRandom);
       }},
  };
  return entries;
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

StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec) {
  for (const auto& e : Entries()) {
    if (e.info.name == spec.name) return e.make(spec);
  }
  std::string names;
  for (const auto& e : Entries()) names += (names.empty() ? "" : ", ") + e.info.name;
  return InvalidArgument("unknown policy '" + spec.name + "' (available: " + names + ")");
}

}  // namespace strata
