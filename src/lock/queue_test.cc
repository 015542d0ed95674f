#include "lock/queue.h"

#include <gtest/gtest.h>

namespace holdfast::lock::queue {
namespace {

constexpr int64_t kNow = 1'000'000;

struct Builder {
  KeySnapshot s;
  Builder& Hold(int64_t lease, bool shared = false) {
    HoldEntry h;
    h.lease = lease;
    h.create_revision = 10 + lease;
    h.record.set_shared(shared);
    s.holds.push_back(h);
    return *this;
  }
  // Waiters are added in queue order.
  Builder& Wait(int64_t lease, bool shared = false, int64_t deadline = kNow + 10'000) {
    WaiterEntry w;
    w.lease = lease;
    w.create_revision = 100 + static_cast<int64_t>(s.waiters.size());
    w.record.set_shared(shared);
    w.record.set_deadline_unix_ms(deadline);
    s.waiters.push_back(w);
    return *this;
  }
};

using Kind = AcquireDecision::Kind;

TEST(QueueTest, UncontendedGrants) {
  Builder b;
  EXPECT_EQ(DecideAcquire(b.s, 1, false, kNow).kind, Kind::kGrant);
  EXPECT_EQ(DecideAcquire(b.s, 1, true, kNow).kind, Kind::kGrant);
}

TEST(QueueTest, OwnHoldIsReturned) {
  Builder b;
  b.Hold(7);
  auto d = DecideAcquire(b.s, 7, false, kNow);
  EXPECT_EQ(d.kind, Kind::kHeld);
  EXPECT_EQ(d.own_hold->lease, 7);
}

TEST(QueueTest, NewcomerQueuesBehindWaitersEvenWhenFree) {
  Builder b;
  b.Wait(2);  // e.g. the head is about to claim after an expiry
  auto d = DecideAcquire(b.s, 3, false, kNow);
  EXPECT_EQ(d.kind, Kind::kBlocked);
  EXPECT_EQ(d.own_waiter, nullptr);
  EXPECT_EQ(d.predecessor->lease, 2);
}

TEST(QueueTest, HeadClaimsWhenNoHold) {
  Builder b;
  b.Wait(2).Wait(3);
  auto head = DecideAcquire(b.s, 2, false, kNow);
  EXPECT_EQ(head.kind, Kind::kGrant);
  EXPECT_EQ(head.own_waiter->lease, 2);
  auto second = DecideAcquire(b.s, 3, false, kNow);
  EXPECT_EQ(second.kind, Kind::kBlocked);
  EXPECT_EQ(second.predecessor->lease, 2);  // watches only its predecessor
}

TEST(QueueTest, HeadWaitsForHoldsAndWatchesThem) {
  Builder b;
  b.Hold(1).Wait(2);
  auto d = DecideAcquire(b.s, 2, false, kNow);
  EXPECT_EQ(d.kind, Kind::kBlocked);
  EXPECT_EQ(d.predecessor, nullptr);  // at the head
  EXPECT_NE(d.blocked_by.find("session 1"), std::string::npos);
}

TEST(QueueTest, ReadersShareUntilAWriterQueues) {
  Builder b;
  b.Hold(1, true);
  EXPECT_EQ(DecideAcquire(b.s, 5, true, kNow).kind, Kind::kGrant);   // reader joins readers
  EXPECT_EQ(DecideAcquire(b.s, 5, false, kNow).kind, Kind::kBlocked); // writer waits
  b.Wait(2, false);                                                    // the writer queues
  auto late_reader = DecideAcquire(b.s, 6, true, kNow);
  EXPECT_EQ(late_reader.kind, Kind::kBlocked);  // behind the queued writer
  EXPECT_NE(late_reader.blocked_by.find("1 waiter(s) ahead"), std::string::npos);
}

TEST(QueueTest, DeadWaitersAheadAreSkippedAndRemoved) {
  Builder b;
  b.Wait(2, false, kNow - 1).Wait(3);
  auto d = DecideAcquire(b.s, 3, false, kNow);
  EXPECT_EQ(d.kind, Kind::kGrant);
  ASSERT_EQ(d.dead_ahead.size(), 1u);
  EXPECT_EQ(d.dead_ahead[0]->lease, 2);
}

TEST(QueueTest, WakesAtTheEarliestDeadlineAhead) {
  Builder b;
  b.Hold(1).Wait(2, false, kNow + 500).Wait(3, false, kNow + 200).Wait(4);
  auto d = DecideAcquire(b.s, 4, false, kNow);
  EXPECT_EQ(d.wake_at_ms, kNow + 200);
  EXPECT_EQ(d.predecessor->lease, 3);
}

TEST(QueueTest, HandOverToTheExclusiveHeadOnly) {
  Builder b;
  b.Hold(1).Wait(2).Wait(3);
  auto h = PlanHandOver(b.s, 1, kNow);
  ASSERT_EQ(h.grant.size(), 1u);
  EXPECT_EQ(h.grant[0]->lease, 2);
}

TEST(QueueTest, HandOverToTheRunOfSharedAtTheHead) {
  Builder b;
  b.Hold(1).Wait(2, true).Wait(3, true, kNow - 5).Wait(4, true).Wait(5).Wait(6, true);
  auto h = PlanHandOver(b.s, 1, kNow);
  ASSERT_EQ(h.grant.size(), 2u);
  EXPECT_EQ(h.grant[0]->lease, 2);
  EXPECT_EQ(h.grant[1]->lease, 4);  // the dead one is passed and removed
  ASSERT_EQ(h.dead.size(), 1u);
  EXPECT_EQ(h.dead[0]->lease, 3);
}

TEST(QueueTest, HandOverStaysUnderEtcdsTxnLimit) {
  Builder b;
  b.Hold(1);
  for (int i = 0; i < 100; ++i) b.Wait(100 + i, true);
  auto h = PlanHandOver(b.s, 1, kNow);
  EXPECT_EQ(h.grant.size(), kMaxHandOver);  // the rest claim on their own
  EXPECT_EQ(h.grant.front()->lease, 100);
}

TEST(QueueTest, NoHandOverWhileOthersHold) {
  Builder b;
  b.Hold(1, true).Hold(9, true).Wait(2);
  EXPECT_TRUE(PlanHandOver(b.s, 1, kNow).grant.empty());  // the writer waits for 9 too
  Builder c;
  c.Hold(1, true).Hold(9, true).Wait(2, true);
  EXPECT_EQ(PlanHandOver(c.s, 1, kNow).grant.size(), 1u);  // a reader may join 9
}

// A waiter of a session that holds the key (left behind by a call answered with its
// hold) is passed and removed, never handed the key its session holds.
TEST(QueueTest, AWaiterOfASessionThatHoldsTheKeyIsNeverHandedIt) {
  Builder own;
  own.Hold(1).Wait(1).Wait(3);
  auto h = PlanHandOver(own.s, 1, kNow);
  ASSERT_EQ(h.grant.size(), 1u);
  EXPECT_EQ(h.grant[0]->lease, 3);
  ASSERT_EQ(h.stray.size(), 1u);
  EXPECT_EQ(h.stray[0]->lease, 1);
  EXPECT_TRUE(h.dead.empty());

  Builder shared;
  shared.Hold(1, true).Hold(9, true).Wait(9, true).Wait(2, true).Wait(3);
  h = PlanHandOver(shared.s, 1, kNow);
  ASSERT_EQ(h.grant.size(), 1u);  // 9 still holds: the reader joins it, the writer waits
  EXPECT_EQ(h.grant[0]->lease, 2);
  ASSERT_EQ(h.stray.size(), 1u);
  EXPECT_EQ(h.stray[0]->lease, 9);
}

TEST(QueueTest, DeadHeadIsNeverHandedTheLock) {
  Builder b;
  b.Hold(1).Wait(2, false, kNow).Wait(3);
  auto h = PlanHandOver(b.s, 1, kNow);
  ASSERT_EQ(h.grant.size(), 1u);
  EXPECT_EQ(h.grant[0]->lease, 3);
  ASSERT_EQ(h.dead.size(), 1u);
}


// A newcomer joins behind the view's last waiter while the view lists enough live
// waiters it is complete through (the Builder's waiters are created at 100, 101...).
TEST(QueueTest, JoinBehindTheLastWaiterWhileTheViewKeepsAMargin) {
  Builder b;
  b.Wait(2).Wait(3).Wait(4);
  const auto& w = b.s.waiters;
  ASSERT_EQ(kJoinBehindMargin, 3);
  const WaiterEntry* last = JoinBehind(w, /*complete_through=*/102, false, kNow);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->lease, 4);
  // Waiters listed past the complete part do not count (they may not be the head
  // a release planned on the view needs)...
  EXPECT_EQ(JoinBehind(w, 101, false, kNow), nullptr);
  // ... and neither do dead ones.
  Builder d;
  d.Wait(2, false, kNow).Wait(3).Wait(4);
  EXPECT_EQ(JoinBehind(d.s.waiters, 102, false, kNow), nullptr);
  d.Wait(6);
  EXPECT_EQ(JoinBehind(d.s.waiters, 103, false, kNow)->lease, 6);
  // The last one may be listed past the complete part.
  b.Wait(5);
  EXPECT_EQ(JoinBehind(b.s.waiters, 102, false, kNow)->lease, 5);
  EXPECT_EQ(JoinBehind({}, 0, false, kNow), nullptr);
}

TEST(QueueTest, JoinBehindOnlyALastWaiterThatBlocksOnItsOwn) {
  Builder b;
  b.Wait(2).Wait(3).Wait(4, /*shared=*/true);
  EXPECT_EQ(JoinBehind(b.s.waiters, 102, /*shared=*/true, kNow), nullptr);  // might share with it
  EXPECT_EQ(JoinBehind(b.s.waiters, 102, /*shared=*/false, kNow)->lease, 4);
  Builder x;
  x.Wait(2, true).Wait(3, true).Wait(4);
  EXPECT_EQ(JoinBehind(x.s.waiters, 102, /*shared=*/true, kNow)->lease, 4);
  Builder dead;
  dead.Wait(2).Wait(3).Wait(4).Wait(5, false, kNow);
  EXPECT_EQ(JoinBehind(dead.s.waiters, 103, false, kNow), nullptr);  // it blocks nobody
}

// Who blocks a call: the holds it cannot share, then the waiters ahead it may not
// pass; the same words as a decision on the whole queue gives.
TEST(QueueTest, BlockedByNamesTheHoldsAndCountsTheWaitersAhead) {
  Builder b;
  b.Hold(1).Wait(2).Wait(3, true).Wait(4);
  EXPECT_EQ(DecideAcquire(b.s, 9, false, kNow).blocked_by, "session 1, 3 waiter(s) ahead");
  EXPECT_EQ(BlockedBy(b.s.holds, 3, false), "session 1, 3 waiter(s) ahead");
  Builder r;
  r.Hold(1, true).Hold(5).Wait(2, true).Wait(3);
  EXPECT_EQ(DecideAcquire(r.s, 9, true, kNow).blocked_by, "session 5, 1 waiter(s) ahead");
  EXPECT_EQ(BlockedBy(r.s.holds, 1, true), "session 5, 1 waiter(s) ahead");
  EXPECT_EQ(BlockedBy(r.s.holds, 0, false), "session 1 (shared), session 5");
}

}  // namespace
}  // namespace holdfast::lock::queue
