#include "core/scratch.h"

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace strata {
namespace {

bool AllZero(std::span<const float> s) {
  for (float x : s) {
    if (x != 0.f) return false;
  }
  return true;
}

TEST(ScratchTest, ArraysAreZeroedAlignedAndDisjoint) {
  ScratchScope s;
  auto a = s.Floats(1000);
  auto b = s.Floats(3);
  auto c = s.Ints(77);
  ASSERT_EQ(a.size(), 1000u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 77u);
  EXPECT_TRUE(AllZero(a));
  EXPECT_TRUE(AllZero(b));
  for (int32_t x : c) EXPECT_EQ(x, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);
  // Writing one array leaves the others alone.
  for (float& x : a) x = 1.f;
  for (float& x : b) x = 2.f;
  for (int32_t& x : c) x = 3;
  for (float x : a) EXPECT_EQ(x, 1.f);
  for (float x : b) EXPECT_EQ(x, 2.f);
  EXPECT_TRUE(s.Floats(0).empty());
}

TEST(ScratchTest, ReusedMemoryIsZeroedAgainAndNestedScopesGiveBackInStackOrder) {
  float* first = nullptr;
  {
    ScratchScope s;
    auto a = s.Floats(4096);
    first = a.data();
    for (float& x : a) x = 7.f;
    {
      ScratchScope inner;
      auto b = inner.Floats(100);
      EXPECT_NE(b.data(), first);
      for (float& x : b) x = 8.f;
    }
    // The inner scope's memory is handed out again, zeroed, while a stays intact.
    auto c = s.Floats(100);
    EXPECT_TRUE(AllZero(c));
    for (float x : a) EXPECT_EQ(x, 7.f);
  }
  ScratchScope again;
  auto a = again.Floats(4096);
  EXPECT_EQ(a.data(), first);  // the same memory, not a new mapping
  EXPECT_TRUE(AllZero(a));
}

TEST(ScratchTest, GrowsToTheLargestWorkingSetThenAllocatesNothing) {
  // Run on a fresh thread so the arena starts empty.
  std::thread([] {
    EXPECT_EQ(ScratchBytesHeld(), 0u);
    auto pass = [] {
      ScratchScope s;
      for (int i = 0; i < 8; ++i) {
        ScratchScope inner;
        auto a = inner.Floats(size_t{1} << 18);  // 1 MiB
        auto b = inner.Floats(size_t{3} << 18);  // 3 MiB: does not fit the first block
        a[0] = b[0] = 1.f;
      }
      auto c = s.Floats(size_t{1} << 20);
      c.back() = 1.f;
    };
    pass();
    const size_t held = ScratchBytesHeld();
    EXPECT_GE(held, size_t{4} << 20);
    EXPECT_LE(held, size_t{16} << 20);
    for (int i = 0; i < 5; ++i) pass();
    EXPECT_EQ(ScratchBytesHeld(), held);  // one consolidated block serves every later pass
  }).join();
}

TEST(ScratchTest, ArraysAreUsableFromOtherThreads) {
  ScratchScope s;
  auto a = s.Floats(1 << 16);
  std::thread t([a] {
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  });
  t.join();
  for (size_t i = 0; i < a.size(); i += 997) EXPECT_EQ(a[i], static_cast<float>(i));
}

}  // namespace
}  // namespace strata
