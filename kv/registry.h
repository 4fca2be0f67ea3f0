// Policy registry: every cache policy is built by name from one settings map, so the CLI, the
// benchmarks and the evaluation harness construct policies the same way and never special-case one.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"

namespace strata {

// A policy name and its settings as strings, e.g. {"vestige", {{"ratio","32"},{"kappa","2"}}}.
// Keys are the long flag names without dashes ("ratio", "rd-frac", "quest-keep", ...).
struct PolicySpec {
  std::string name;
  std::map<std::string, std::string> settings;

  // Typed accessors: the default when absent; InvalidArgument naming "--key" and the value when
  // the text does not parse.
  StatusOr<double> GetDouble(const std::string& key, double def) const;
  StatusOr<int64_t> GetInt(const std::string& key, int64_t def) const;
  StatusOr<bool> GetBool(const std::string& key, bool def) const;  // on/off, true/false, 1/0
  std::string GetString(const std::string& key, const std::string& def) const;
};

struct PolicyInfo {
  std::string name;
  std::string help;  // one line: what it keeps/reads and which settings it takes
};

// All registered policies, in a stable order.
const std::vector<PolicyInfo>& Policies();
// Builds a policy; an unknown name is an error listing the known ones.
StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec);

}  // namespace strata
