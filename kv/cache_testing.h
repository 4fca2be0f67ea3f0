// Test helpers for driving a KvCache through its call protocol (kv/policy.h) by hand.
#pragma once

#include <gtest/gtest.h>

#include "core/status_testing.h"
#include "kv/cache.h"

namespace strata {

// Ends the open call, if any, and opens the next one for n rows: test drivers that append and
// read step by step call it before each step's appends (the call stays open for the step's
// queries; a KvCache may be destroyed with a call open).
inline void NextCall(KvCache* c, int64_t n, CallKind kind = CallKind::kDecode) {
  if (c->in_call()) EXPECT_OK(c->EndCall());
  EXPECT_OK(c->BeginCall(n, kind));
}

// Ends the open call, if any.
inline void EndOpenCall(KvCache* c) {
  if (c->in_call()) EXPECT_OK(c->EndCall());
}

}  // namespace strata
