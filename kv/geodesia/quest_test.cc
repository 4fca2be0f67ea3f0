// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/quest.h"

#include <gtest/gtest.h>

namespace strata::geodesia {
namespace {

TEST(GeodesiaQuestTest, KeepCount) {
  EXPECT_EQ(QuestKeepCount(0, 0.125), 0);
  EXPECT_EQ(QuestKeepCount(1, 0.125), 1);
  EXPECT_EQ(QuestKeepCount(8, 0.125), 1);
  EXPECT_EQ(QuestKeepCount(9, 0.125), 2);
  EXPECT_EQ(QuestKeepCount(255, 0.125), 32);  // 16,320-token prefix: 32 pages (§4)
  EXPECT_EQ(QuestKeepCount(10, 1.0), 10);
}

}  // namespace
}  // namespace strata::geodesia
