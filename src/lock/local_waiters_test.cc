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
  EXPECT_EQ(w.HandedOver("h/k/S", 10, Hold(1), 7, w.Generation()), 0);
  EXPECT_TRUE(told.empty());
  EXPECT_EQ(w.HandedOver("h/k/S", 12, Hold(1), 7, w.Generation()), 0);  // at the read: the read saw it
  EXPECT_TRUE(told.empty());
  EXPECT_EQ(w.HandedOver("h/k/S", 13, Hold(1), 7, w.Generation()), 1);
  EXPECT_EQ(told, std::vector<int64_t>{13});
  w.Remove(id);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.HandedOver("h/k/S", 14, Hold(1), 7, w.Generation()), 0);
  EXPECT_EQ(told, std::vector<int64_t>{13});
}

TEST(LocalWaitersTest, EachWaiterIsToldOnlyOfItsOwnHoldKey) {
  LocalWaiters w;
  int a = 0, b = 0;
  w.Add("h/k/A", 5, [&](int64_t, const records::HoldRecord&, uint64_t) { ++a; });
  w.Add("h/k/B", 5, [&](int64_t, const records::HoldRecord&, uint64_t) { ++b; });
  EXPECT_EQ(w.HandedOver("h/k/A", 6, Hold(1), 7, w.Generation()), 1);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
}

TEST(LocalWaitersTest, RecentAnswersTheNewestHandOverAfterTheRevisionAsked) {
  LocalWaiters w;
  EXPECT_FALSE(w.Recent("h/k/S", 0, 7, 1));
  w.HandedOver("h/k/S", 10, Hold(1), 8, w.Generation());
  w.HandedOver("h/k/S", 20, Hold(2), 8, w.Generation());
  w.HandedOver("h/k/S", 15, Hold(3), 8, w.Generation());  // late and older: does not replace 20
  auto r = w.Recent("h/k/S", 9, 8, 2);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->revision, 20);
  EXPECT_EQ(r->rec.epoch(), 2);
  EXPECT_EQ(r->cluster_id, 8u) << "the committing cluster is kept with it";
  EXPECT_FALSE(w.Recent("h/k/S", 20, 8, 2));
  EXPECT_FALSE(w.Recent("h/k/other", 0, 8, 2));
}

// A waiter on a restored etcd is not answered with a hand-over of the history
// before: with a new cluster id (revisions started again below the ones kept),
// or with the id kept and the epoch advanced since. A restore that kept the id
// drops the kept hand-overs once detected.
TEST(LocalWaitersTest, RecentAnswersOnlyForTheClusterAndEpochReadAndNothingOnceForgotten) {
  LocalWaiters w;
  const uint64_t before = w.Generation();
  w.HandedOver("h/k/S", 100, Hold(1), 7, before);
  EXPECT_FALSE(w.Recent("h/k/S", 50, 9, 1)) << "another cluster's hand-over";
  EXPECT_FALSE(w.Recent("h/k/S", 50, 7, 2)) << "a hand-over of an epoch before";
  ASSERT_TRUE(w.Recent("h/k/S", 50, 7, 1));
  w.ForgetRecent();
  EXPECT_FALSE(w.Recent("h/k/S", 50, 7, 1));
  // A release sent before the restore was found, answered after: neither kept
  // nor told, though its cluster and epoch are those a waiter reads.
  int told = 0;
  w.Add("h/k/S", 40, [&](int64_t, const records::HoldRecord&, uint64_t) { ++told; });
  EXPECT_EQ(w.HandedOver("h/k/S", 110, Hold(1), 7, before), 0);
  EXPECT_EQ(told, 0);
  EXPECT_FALSE(w.Recent("h/k/S", 50, 7, 1));
  // Kept again after.
  w.HandedOver("h/k/S", 60, Hold(1), 7, w.Generation());
  EXPECT_EQ(told, 1);
  ASSERT_TRUE(w.Recent("h/k/S", 50, 7, 1));
  EXPECT_EQ(w.Recent("h/k/S", 50, 7, 1)->revision, 60);
  // A hand-over on a restored cluster (new id) at a lower revision replaces it.
  w.HandedOver("h/k/S", 30, Hold(2), 9, w.Generation());
  ASSERT_TRUE(w.Recent("h/k/S", 20, 9, 2));
  EXPECT_EQ(w.Recent("h/k/S", 20, 9, 2)->revision, 30);
}

}  // namespace
}  // namespace holdfast::lock
