#include "io/json_input.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

TEST(JsonInputTest, DepthScanCountsBracketsOutsideStrings) {
  EXPECT_EQ(JsonDepthExceededAt("{}", 1), -1);
  EXPECT_EQ(JsonDepthExceededAt("[[]]", 1), 1);
  EXPECT_EQ(JsonDepthExceededAt("[{}, [], {\"a\": []}]", 3), -1);
  EXPECT_EQ(JsonDepthExceededAt("[{\"a\": [[]]}]", 3), 8);
  // Brackets in strings, escaped quotes and escaped backslashes.
  EXPECT_EQ(JsonDepthExceededAt(R"(["[[[[", "\"[[[", "\\", "{{"])", 1), -1);
  EXPECT_EQ(JsonDepthExceededAt(R"(["\\"[])", 1), 5);
  // Unbalanced closers never make the depth negative.
  EXPECT_EQ(JsonDepthExceededAt("]]]][[", 1), 5);
}

TEST(JsonInputTest, ParsesValidTextAndNamesTheSourceOfErrors) {
  auto j = ParseUntrustedJson(R"({"a": [1, 2, {"b": null}]})", "x.json");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["a"][1], 2);
  auto bad = ParseUntrustedJson(R"({"a": )", "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().message().rfind("x.json: not valid JSON (", 0), 0u)
      << bad.status().message();
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  auto too_deep = ParseUntrustedJson(deep, "x.json");
  ASSERT_FALSE(too_deep.ok());
  EXPECT_EQ(too_deep.status().message(),
            "x.json: JSON nests deeper than 64 levels (at byte 64)");
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseUntrustedJson(ok, "x.json").ok());
}

TEST(JsonInputTest, BriefJsonCutsLongValues) {
  EXPECT_EQ(BriefJson(nlohmann::json::parse("[1,2]")), "[1,2]");
  const std::string s = BriefJson(nlohmann::json(std::string(500, 'x')), 10);
  EXPECT_EQ(s, "\"xxxxxxxxx...");
  // Invalid UTF-8 in a string is replaced, not thrown.
  EXPECT_NO_THROW(BriefJson(nlohmann::json(std::string("\xff\xfe"))));
}

}  // namespace
}  // namespace strata
