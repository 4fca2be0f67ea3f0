#include "core/status.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd value " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  ASSIGN_OR_RETURN(*out, Half(x));
  return OkStatus();
}

TEST(StatusTest, MessagesNameTheValue) {
  StatusOr<int> r = Half(3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "INVALID_ARGUMENT: odd value 3");
  EXPECT_EQ(r.status().WithContext("reading x").message(), "reading x: odd value 3");
  EXPECT_EQ(*Half(8), 4);
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(UseHalf(10, &out).ok());
  EXPECT_EQ(out, 5);
  Status s = UseHalf(7, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 5);
}

TEST(StatusTest, OkStatusIntoStatusOrIsInternalError) {
  StatusOr<int> r = OkStatus();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace strata
