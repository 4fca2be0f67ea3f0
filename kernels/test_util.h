// Test helper: runs a test body once per SIMD target compiled in and supported by this CPU
// (AVX3, AVX2, SSE4, EMU128 on AVX-512 hosts), so the portable fallbacks are tested too.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "hwy/targets.h"

namespace strata {

template <class F>
void ForEachSimdTarget(F&& body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(testing::Message() << "SIMD target " << hwy::TargetName(target));
    body();
    if (testing::Test::HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace strata
