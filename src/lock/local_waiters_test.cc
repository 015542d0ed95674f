// LocalWaiters' rules, without a server: a waiter is told of a hand-over of its
// hold key only when it came after the revision the waiter read at, and Recent()
// answers only a hand-over after the revision asked about. The hand-over itself is
// tested end to end (tests/queue_integration_test.cc, tests/metrics_test.cc).
#include "lock/local_waiters.h"

#include <gtest/gtest.h>

#include <vector>

namespace holdfast::lock {
namespace {

records::HoldRecord Hold(int32_t epoch) {
  records::HoldRecord r;
  r.set_epoch(epoch);
  r.set_class_id("default");
  return r;
}

// The race this guards against: session S is handed the key at revision 10 and
// learns it from its watch; it releases (11) and queues again on the same key,
// reading at 12, before the call that released to it at 10 gets to HandedOver.
// That late notice must not answer the new wait: its hold is gone.
TEST(LocalWaitersTest, ALateNoticeOfAnOlderHandOverDoesNotAnswerANewerWait) {
  LocalWaiters w;
  std::vector<int64_t> told;
  const uint64_t id =
      w.Add("h/k/S", 12,
            [&](int64_t rev, const records::HoldRecord&, uint64_t) { told.push_back(rev); });
  EXPECT_EQ(w.HandedOver("h/k/S", 10, Hold(1), 7), 0);
  EXPECT_TRUE(told.empty());
  EXPECT_EQ(w.HandedOver("h/k/S", 12, Hold(1), 7), 0);  // at the read: the read saw it
  EXPECT_TRUE(told.empty());
  EXPECT_EQ(w.HandedOver("h/k/S", 13, Hold(1), 7), 1);
  EXPECT_EQ(told, std::vector<int64_t>{13});
  w.Remove(id);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.HandedOver("h/k/S", 14, Hold(1), 7), 0);
  EXPECT_EQ(told, std::vector<int64_t>{13});
}

TEST(LocalWaitersTest, EachWaiterIsToldOnlyOfItsOwnHoldKey) {
  LocalWaiters w;
  int a = 0, b = 0;
  w.Add("h/k/A", 5, [&](int64_t, const records::HoldRecord&, uint64_t) { ++a; });
  w.Add("h/k/B", 5, [&](int64_t, const records::HoldRecord&, uint64_t) { ++b; });
  EXPECT_EQ(w.HandedOver("h/k/A", 6, Hold(1), 7), 1);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
}

TEST(LocalWaitersTest, RecentAnswersTheNewestHandOverAfterTheRevisionAsked) {
  LocalWaiters w;
  EXPECT_FALSE(w.Recent("h/k/S", 0, 7));
  w.HandedOver("h/k/S", 10, Hold(1), 7);
  w.HandedOver("h/k/S", 20, Hold(2), 8);
  w.HandedOver("h/k/S", 15, Hold(3), 7);  // late and older: does not replace 20
  auto r = w.Recent("h/k/S", 9, 8);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->revision, 20);
  EXPECT_EQ(r->rec.epoch(), 2);
  EXPECT_EQ(r->cluster_id, 8u) << "the committing cluster is kept with it";
  EXPECT_FALSE(w.Recent("h/k/S", 20, 8));
  EXPECT_FALSE(w.Recent("h/k/other", 0, 8));
}

// A waiter on a restored etcd (a new cluster id, revisions started again below
// the ones kept) is not answered with a hand-over of the cluster before: that
// hold is not in etcd. One restored with its id kept is detected later; the kept
// hand-overs are then dropped.
TEST(LocalWaitersTest, RecentAnswersOnlyForTheClusterReadAndNothingOnceForgotten) {
  LocalWaiters w;
  w.HandedOver("h/k/S", 100, Hold(1), 7);
  EXPECT_FALSE(w.Recent("h/k/S", 50, 9)) << "another cluster's hand-over";
  ASSERT_TRUE(w.Recent("h/k/S", 50, 7));
  w.ForgetRecent();
  EXPECT_FALSE(w.Recent("h/k/S", 50, 7));
  // Kept again after.
  w.HandedOver("h/k/S", 60, Hold(2), 7);
  ASSERT_TRUE(w.Recent("h/k/S", 50, 7));
  EXPECT_EQ(w.Recent("h/k/S", 50, 7)->revision, 60);
}

}  // namespace
}  // namespace holdfast::lock
