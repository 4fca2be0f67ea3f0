#include "core/huge_region.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace strata {
namespace {

TEST(HugeRegionTest, AlignedZeroedWritableAndMovable) {
  auto empty = HugeRegion::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(empty->data(), nullptr);
  for (size_t bytes : {size_t{2}, size_t{4096}, (size_t{3} << 20) + 17}) {
    auto r = HugeRegion::Allocate(bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->data()) % HugeRegion::kHugePage, 0u);
    for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(r->data()[i], 0) << i;
    ASSERT_EQ(r->data()[bytes - 1], 0);
    r->data()[0] = 1;
    r->data()[bytes - 1] = 2;
    HugeRegion moved = std::move(r).value();
    EXPECT_EQ(moved.data()[0], 1);
    EXPECT_EQ(moved.data()[bytes - 1], 2);
    HugeRegion other;
    other = std::move(moved);
    EXPECT_EQ(moved.data(), nullptr);
    EXPECT_EQ(other.size(), bytes);
  }
}

TEST(HugeRegionTest, AbsurdSizeIsAnErrorNotACrash) {
  auto r = HugeRegion::Allocate(~size_t{0} - 100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bytes"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace strata
