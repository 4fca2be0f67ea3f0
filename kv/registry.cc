#include "kv/registry.h"

#include <cstdlib>
#include <functional>

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
