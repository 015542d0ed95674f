// SessionState and HoldState, libholdfast's view of a session and its holds,
// stepped directly: no holdfastd is called (the Client's channel is never used).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "client/internal.h"

namespace holdfast::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class SessionStateTest : public ::testing::Test {
 protected:
  std::shared_ptr<SessionState> NewSession(SessionOptions o = {}) {
    return std::make_shared<SessionState>(core_, "ns", 42, seconds(10), o, SteadyClock::now());
  }
  // Nothing listens here; nothing is sent.
  std::shared_ptr<ClientCore> core_ =
      std::make_shared<ClientCore>(ClientOptions{.endpoints = {"127.0.0.1:1"}});
};

// Waits for `f` up to 20 s; a call that never returns is a deadlock, and the
// test process ends at once instead of hanging the suite.
void ReturnsOrDie(std::future<void>& f, const char* what) {
  if (f.wait_for(seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "%s did not return: deadlock\n", what);
    std::_Exit(1);
  }
}

// Two sessions whose callbacks each close the other, lost at the same time on
// two threads (the reader: a lease gone; the pump: a deadline passed): both
// losses are told at once, and neither Close waits for the other's callback.
// (Run on the threads that found the losses, each callback waited for the other
// one: neither returned, and every other session of the Client went unrenewed.)
TEST_F(SessionStateTest, TwoSessionsWhoseCallbacksCloseEachOtherBothReturn) {
  std::shared_ptr<SessionState> a, b;
  std::atomic<int> entered{0};
  // Each callback waits (a second at most) for the other to be running too.
  auto both_inside = [&] {
    ++entered;
    const auto until = SteadyClock::now() + seconds(1);
    while (entered.load() < 2 && SteadyClock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
  };
  std::atomic<bool> a_closed_b{false}, b_closed_a{false};
  SessionOptions oa, ob;
  oa.on_lost = [&](const absl::Status&) {
    both_inside();
    a_closed_b = b->MarkClosed();
  };
  ob.on_lost = [&](const absl::Status&) {
    both_inside();
    b_closed_a = a->MarkClosed();
  };
  a = NewSession(oa);
  b = NewSession(ob);
  auto reader = std::async(std::launch::async,
                           [&] { a->MarkLost(absl::NotFoundError("session lost: lease gone")); });
  auto pump = std::async(std::launch::async,
                         [&] { b->MarkLost(absl::UnavailableError("deadline passed")); });
  ReturnsOrDie(reader, "the reader's loss");
  ReturnsOrDie(pump, "the pump's loss");
  EXPECT_TRUE(a->lost());
  EXPECT_TRUE(b->lost());
  // One callback ran and closed the other session, whose callback then did not run.
  for (int i = 0; i < 20'000 && !a_closed_b && !b_closed_a; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_NE(a_closed_b.load(), b_closed_a.load());
  EXPECT_EQ(entered.load(), 1);
  // The callback thread goes on.
  std::promise<void> ran;
  SessionOptions oc;
  oc.on_lost = [&](const absl::Status&) { ran.set_value(); };
  auto c = NewSession(oc);
  c->MarkLost(absl::UnavailableError("deadline passed"));
  EXPECT_EQ(ran.get_future().wait_for(seconds(20)), std::future_status::ready);
}

// A callback that blocks (an Acquire to take the lock again) holds up neither
// the thread that found the loss nor the losses of other sessions: their holds
// are lost, and their stop tokens stopped, at once; their callbacks run after it.
TEST_F(SessionStateTest, AnOnLostThatBlocksHoldsUpNoOtherSessionsLoss) {
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> a_inside{false}, b_ran{false};
  SessionOptions oa, ob;
  oa.on_lost = [&](const absl::Status&) {
    a_inside = true;
    go_f.wait();
  };
  ob.on_lost = [&](const absl::Status&) { b_ran = true; };
  auto a = NewSession(oa);
  auto b = NewSession(ob);
  auto a_hold = a->HoldFor("k", /*open_class=*/false, 7);
  auto b_hold = b->HoldFor("j", /*open_class=*/false, 8);
  auto lose_a = std::async(std::launch::async,
                           [&] { a->MarkLost(absl::UnavailableError("deadline passed")); });
  const bool a_told = lose_a.wait_for(seconds(5)) == std::future_status::ready;
  EXPECT_TRUE(a_told) << "the loss waited for its callback";
  EXPECT_TRUE(a_hold->lost());
  EXPECT_TRUE(a_hold->lost_token().stop_requested());
  for (int i = 0; i < 20'000 && !a_inside; ++i) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_TRUE(a_inside);
  google::protobuf::RepeatedPtrField<v1::EndedHold> ended;
  ended.Add()->set_lock_key("j");
  ended.Mutable(0)->set_token(8);
  ended.Mutable(0)->set_reason("forced open");
  auto lose_b = std::async(std::launch::async, [&] { b->HoldsEnded(ended); });
  const bool b_told = lose_b.wait_for(seconds(5)) == std::future_status::ready;
  EXPECT_TRUE(b_told) << "another session's loss waited for a blocked callback";
  EXPECT_TRUE(b_hold->lost());
  EXPECT_TRUE(b_hold->lost_token().stop_requested());
  EXPECT_FALSE(b_ran) << "callbacks run one at a time, in order";
  go.set_value();
  lose_a.get();
  lose_b.get();
  for (int i = 0; i < 20'000 && !b_ran; ++i) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(b_ran);
}

// The pump saw the deadline pass, then a renewal answer moved it on before the
// pump got to the session: the session is not lost.
TEST_F(SessionStateTest, ADeadlineMovedOnSinceThePumpLookedLosesNothing) {
  auto session = NewSession();  // opened now, TTL 10 s: its deadline 9 s away
  auto hold = session->HoldFor("k", /*open_class=*/false, 7);
  session->Suspect(absl::UnavailableError("no renewal was confirmed"), /*deadline_passed=*/true);
  EXPECT_FALSE(session->lost());
  EXPECT_FALSE(hold->lost());
  // etcd unreachable, with the deadline not passed: the closed hold is lost.
  session->Suspect(absl::UnavailableError("etcd unreachable"), /*deadline_passed=*/false);
  EXPECT_TRUE(hold->lost());
  EXPECT_FALSE(session->lost());
}

// An Acquire answered with a hold whose dropped Hold's release is owed takes the
// release back (the caller holds the key again); one being sent is not taken.
TEST_F(SessionStateTest, AnOwedReleaseIsTakenBackByAnAcquireAnsweredWithItsHold) {
  auto session = NewSession();
  EXPECT_EQ(session->TakeBackRelease("k", 7), SessionState::TakeBack::kNotOwed);
  session->OweRelease("k", 7);
  session->OweRelease("k", 9);
  EXPECT_EQ(session->owed_releases(), 2u);
  EXPECT_EQ(session->TakeBackRelease("k", 7), SessionState::TakeBack::kTakenBack);
  EXPECT_EQ(session->owed_releases(), 1u);
  EXPECT_TRUE(session->owes_releases());
  EXPECT_EQ(session->TakeBackRelease("k", 7), SessionState::TakeBack::kNotOwed);
  EXPECT_EQ(session->TakeBackRelease("k", 9), SessionState::TakeBack::kTakenBack);
  EXPECT_FALSE(session->owes_releases());
}

// Close from another thread still waits for a callback that is running.
TEST_F(SessionStateTest, CloseWaitsForARunningOnLost) {
  std::atomic<bool> inside{false}, finished{false};
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  SessionOptions o;
  o.on_lost = [&](const absl::Status&) {
    inside = true;
    go_f.wait();
    finished = true;
  };
  auto session = NewSession(o);
  auto lose = std::async(std::launch::async,
                         [&] { session->MarkLost(absl::UnavailableError("deadline passed")); });
  while (!inside) std::this_thread::sleep_for(milliseconds(1));
  auto close = std::async(std::launch::async, [&] { return session->MarkClosed(); });
  EXPECT_EQ(close.wait_for(milliseconds(100)), std::future_status::timeout)
      << "Close returned while on_lost was running";
  go.set_value();
  EXPECT_TRUE(close.get());
  EXPECT_TRUE(finished);
  lose.get();
}

// An on_lost that closed the session itself is still waited for by a Close (or
// ~Session) on another thread: what the callback uses after its own Close may
// go once the other returns.
TEST_F(SessionStateTest, ACloseElsewhereWaitsForAnOnLostThatClosedTheSessionItself) {
  std::atomic<bool> closed_inside{false}, finished{false};
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  std::shared_ptr<SessionState> session;
  SessionOptions o;
  o.on_lost = [&](const absl::Status&) {
    closed_inside = session->MarkClosed();
    go_f.wait();
    finished = true;
  };
  session = NewSession(o);
  auto lose = std::async(std::launch::async,
                         [&] { session->MarkLost(absl::UnavailableError("deadline passed")); });
  while (!closed_inside) std::this_thread::sleep_for(milliseconds(1));
  auto close = std::async(std::launch::async, [&] { return session->MarkClosed(); });
  EXPECT_EQ(close.wait_for(milliseconds(100)), std::future_status::timeout)
      << "Close returned while on_lost was still running";
  go.set_value();
  EXPECT_FALSE(close.get()) << "closed already, by the callback";
  EXPECT_TRUE(finished);
  lose.get();
}

// Holds of a closed class lost here only (etcd could not confirm renewals) are
// remembered until a release of theirs goes through: an Acquire answered with one
// of them releases it and asks anew. An open-class hold is not lost.
TEST_F(SessionStateTest, AClosedHoldLostHereIsRememberedUntilItIsReleased) {
  auto session = NewSession();
  auto closed = session->HoldFor("k", /*open_class=*/false, 7);
  auto open = session->HoldFor("o", /*open_class=*/true, 8);
  EXPECT_FALSE(session->LostHere("k", 7));
  session->Suspect(absl::UnavailableError("etcd unreachable"), /*deadline_passed=*/false);
  EXPECT_TRUE(closed->lost());
  EXPECT_TRUE(session->LostHere("k", 7));
  EXPECT_FALSE(session->LostHere("k", 9)) << "a hold is its key and its token";
  EXPECT_FALSE(session->LostHere("o", 8));
  session->EndHold("k", 7, absl::FailedPreconditionError("released"));
  EXPECT_FALSE(session->LostHere("k", 7));
}

// A hold lost here only (etcd was unreachable) is not shared with a later
// Acquire of the same key and token: the two handles have states of their own.
// The release of either ends both.
TEST_F(SessionStateTest, AReleaseEndsEveryStateOfTheHold) {
  auto session = NewSession();
  auto first = session->HoldFor("k", false, 7);
  ASSERT_TRUE(first->MarkLost(absl::UnavailableError("etcd unreachable")));
  auto again = session->HoldFor("k", false, 7);
  ASSERT_NE(again, first);
  EXPECT_FALSE(again->lost());
  auto other_key = session->HoldFor("other", false, 7);  // one commit granted both keys
  session->EndHold("k", 7, absl::FailedPreconditionError("hold on \"k\" (token 7) was released"));
  EXPECT_TRUE(again->lost());
  EXPECT_EQ(again->lost_reason().message(), "hold on \"k\" (token 7) was released");
  EXPECT_FALSE(other_key->lost()) << "a hold is its key and its token";
}

}  // namespace
}  // namespace holdfast::internal
