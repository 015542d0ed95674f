// ForcedHolds' bookkeeping, without a server: what was noted is answered per
// (namespace, session), oldest first, and the oldest go past kMaxEntries. The
// watch that fills it is tested end to end (tests/audit_test.cc ForceReleaseTest,
// tests/cli_test.cc CliLostHoldTest).
#include "lock/forced_holds.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace holdfast::lock {
namespace {

v1::EndedHold Ended(const std::string& key, int64_t token) {
  v1::EndedHold e;
  e.set_lock_key(key);
  e.set_token(token);
  e.set_reason("force-released (test)");
  return e;
}

class ForcedHoldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    timers_ = std::make_shared<TimerQueue>();
    etcd::ClientOptions o;
    o.endpoints = {"127.0.0.1:1"};  // nothing listens: the watch never gets going
    auto c = etcd::Client::Create(o, timers_);
    ASSERT_TRUE(c.ok()) << c.status();
    etcd_ = std::move(*c);
  }
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<etcd::Client> etcd_;
};

TEST_F(ForcedHoldsTest, AnswersEachSessionItsOwnOldestFirst) {
  ForcedHolds forced(etcd_.get());
  EXPECT_TRUE(forced.For("ns", 7).empty());
  forced.Note("ns", 7, Ended("a", 1));
  forced.Note("other", 7, Ended("b", 2));
  forced.Note("ns", 8, Ended("c", 3));
  forced.Note("ns", 7, Ended("d", 4));
  auto got = forced.For("ns", 7);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].lock_key(), "a");
  EXPECT_EQ(got[1].token(), 4);
  // Kept: every answer for the session repeats them.
  EXPECT_EQ(forced.For("ns", 7).size(), 2u);
  EXPECT_EQ(forced.For("other", 7).size(), 1u);
  EXPECT_TRUE(forced.For("ns", 9).empty());
}

TEST_F(ForcedHoldsTest, KeepsAtMostMaxEntriesDroppingTheOldest) {
  ForcedHolds forced(etcd_.get());
  forced.Note("ns", 1, Ended("first", 1));
  for (size_t i = 0; i < ForcedHolds::kMaxEntries; ++i) {
    forced.Note("ns", 2, Ended(absl::StrCat("k", i), static_cast<int64_t>(i) + 10));
  }
  EXPECT_TRUE(forced.For("ns", 1).empty()) << "the oldest entry went first";
  auto got = forced.For("ns", 2);
  ASSERT_EQ(got.size(), ForcedHolds::kMaxEntries);
  EXPECT_EQ(got.front().lock_key(), "k0");
}

}  // namespace
}  // namespace holdfast::lock
