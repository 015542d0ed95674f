#include "common/duration.h"

#include <gtest/gtest.h>

namespace holdfast {
namespace {

using std::chrono::milliseconds;

TEST(DurationTest, ParsesUnitsAndSums) {
  EXPECT_EQ(*ParseDuration("0"), milliseconds(0));
  EXPECT_EQ(*ParseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(*ParseDuration("10s"), milliseconds(10'000));
  EXPECT_EQ(*ParseDuration("5m"), milliseconds(300'000));
  EXPECT_EQ(*ParseDuration("1h30m"), milliseconds(5'400'000));
  EXPECT_EQ(*ParseDuration("90d"), milliseconds(int64_t{90} * 86'400'000));
  EXPECT_EQ(*ParseDuration("1d12h"), milliseconds(int64_t{36} * 3'600'000));
}

TEST(DurationTest, RejectsWithTheReason) {
  for (const char* bad : {"", "10", "s", "10x", "-1s", "1.5s", "99999999999h", "20000000d", "1w"}) {
    auto d = ParseDuration(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("invalid duration"), std::string::npos);
  }
  EXPECT_NE(ParseDuration("10x").status().message().find("unknown unit \"x\""), std::string::npos);
  EXPECT_EQ(ParseDuration("-1s").status().message(),
            "invalid duration \"-1s\": a duration cannot be negative "
            "(examples: 500ms, 10s, 5m, 1h30m, 90d)");
  for (const char* fraction : {"0.5s", "1,5h", "1m0.5s"}) {
    EXPECT_NE(ParseDuration(fraction).status().message().find(
                  "no fractions: use a smaller unit (1500ms, not 1.5s; 90m, not 1.5h)"),
              std::string::npos)
        << fraction << ": " << ParseDuration(fraction).status();
  }
  EXPECT_NE(ParseDuration("10").status().message().find("missing unit"), std::string::npos);
}

}  // namespace
}  // namespace holdfast
