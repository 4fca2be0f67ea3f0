// Policy registry: every cache policy is built by name from one settings map, validated against the
// policy's declared settings (kv/settings.h), so the CLI, the benchmarks and the evaluation harness
// construct policies the same way and never special-case one.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"
#include "kv/settings.h"

namespace strata {

// A policy name and its settings as strings, e.g. {"vestige", {{"ratio","32"},{"kappa","2"}}}.
// Keys are the declared setting names (or aliases) of the policy (kv/settings.h); policies read
// them through ResolveSettings, which fills the declared defaults, so no default is restated.
struct PolicySpec {
  std::string name;
  std::map<std::string, std::string> settings;
};

struct PolicyInfo {
  std::string name;
  std::string help;         // one line: what it keeps and reads
  PolicySettings settings;  // its declared settings (the one place they are written down)
};

// All registered policies, in a stable order.
const std::vector<PolicyInfo>& Policies();
// The registered policy of that name; null when there is none.
const PolicyInfo* FindPolicy(const std::string& name);
// The registered policies that declare the setting `key` (by name or alias), in registry order.
std::vector<std::string> PoliciesDeclaring(const std::string& key);

// Checks a spec against its policy's declaration (kv/settings.h ResolveSettings): an unknown
// policy lists the known ones; an unknown or misspelt key names the closest declared one; a key
// the policy does not take names the policies that do and what this one takes; values are type-
// and range-checked.
Status ValidatePolicySpec(const PolicySpec& spec);
// Validates (ValidatePolicySpec), then builds the policy.
StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec);

// Tests only: every policy MakePolicy builds is passed through `wrap` (none when empty), so that
// a test can inject a fault into a real run of a command (e.g. a decorator that damages the
// archive file mid-run). Not thread-safe; reset it at the end of the test.
using PolicyWrapper = std::function<std::unique_ptr<Policy>(std::unique_ptr<Policy>)>;
void SetPolicyWrapperForTesting(PolicyWrapper wrap);

// The one syntax that names a policy: NAME[@X][:key=value...]. `@X` fills the policy's budget
// setting (ratio or bits; PolicySettings::budget), e.g. geodesia@2.5:rd-frac=0.03. A value may
// hold ':' (archive=file:/tmp/x: a segment without '=' continues the previous value). A key given
// twice, an empty key or value, or '@' on a policy without a budget setting is an error naming
// the item. Does not validate the keys (MakePolicy does).
StatusOr<PolicySpec> ParsePolicySpec(const std::string& text);
// Adds key=value to `spec`; a key already set (under its name or an alias of it) is an error
// naming `source` (e.g. "--bits") and both values.
Status AddPolicySetting(PolicySpec* spec, const std::string& key, const std::string& value,
                        const std::string& source);
// The settings of `settings` that the policy `name` declares (all of them when `name` is not
// registered: its factory decides). For option sets that apply to every policy of a list.
std::map<std::string, std::string> SettingsFor(const std::string& name,
                                               const std::map<std::string, std::string>& settings);

}  // namespace strata
