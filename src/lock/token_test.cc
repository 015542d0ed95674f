#include "lock/token.h"

#include <gtest/gtest.h>

namespace holdfast::token {
namespace {

TEST(TokenTest, EpochInTheTopBitsRevisionBelow) {
  auto t = Make(1, 42);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (int64_t{1} << 48) | 42);
  EXPECT_EQ(EpochOf(*t), 1);
  EXPECT_EQ(RevisionOf(*t), 42);
}

TEST(TokenTest, BoundsKeepTokensPositive) {
  auto max = Make(kMaxEpoch, kMaxRevision);
  ASSERT_TRUE(max.ok());
  EXPECT_GT(*max, 0);
  EXPECT_EQ(*max, INT64_MAX);
  EXPECT_EQ(Make(kMaxEpoch + 1, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Make(0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  auto over = Make(1, kMaxRevision + 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(over.status().message().find("2^48"), std::string::npos);
  EXPECT_EQ(Make(1, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TokenTest, LaterEpochBeatsAnyRevision) {
  // A restore rewinds revisions; the epoch advance keeps tokens increasing.
  EXPECT_GT(*Make(2, 1), *Make(1, kMaxRevision));
  EXPECT_GT(*Make(1, 11), *Make(1, 10));
}

}  // namespace
}  // namespace holdfast::token
