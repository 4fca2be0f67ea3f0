// Test assertions on Status / StatusOr that print the error's message when they fail.
#pragma once

#include <gtest/gtest.h>

#include "core/status.h"

namespace strata::testing_internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace strata::testing_internal

#define ASSERT_OK(expr)                                                          \
  do {                                                                           \
    const ::strata::Status _assert_ok = ::strata::testing_internal::AsStatus(expr); \
    ASSERT_TRUE(_assert_ok.ok()) << #expr << ": " << _assert_ok.ToString();      \
  } while (0)
#define EXPECT_OK(expr)                                                          \
  do {                                                                           \
    const ::strata::Status _expect_ok = ::strata::testing_internal::AsStatus(expr); \
    EXPECT_TRUE(_expect_ok.ok()) << #expr << ": " << _expect_ok.ToString();      \
  } while (0)
