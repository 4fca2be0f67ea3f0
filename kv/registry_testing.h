// Test helpers for suites parameterised over every registered cache policy.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/registry.h"

namespace strata::policy_testing {

// The registry's policy names, in registry order.
inline std::vector<std::string> RegisteredPolicyNames() {
  std::vector<std::string> names;
  for (const PolicyInfo& p : Policies()) names.push_back(p.name);
  return names;
}

// A gtest parameter name for a policy name ('-' is not allowed there).
inline std::string PolicyParamName(const ::testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

}  // namespace strata::policy_testing
