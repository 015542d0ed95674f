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

// The reader thread (a hold ended on the server) and the pump (the session's
// deadline passed) can each be running on_lost when each callback closes the
// session: neither Close may wait for the other callback.
TEST_F(SessionStateTest, TwoOnLostCallsThatEachCloseTheSessionBothReturn) {
  std::shared_ptr<SessionState> session;
  std::atomic<int> entered{0}, closed_first{0};
  SessionOptions o;
  o.on_lost = [&](const absl::Status&) {
    ++entered;
    while (entered.load() < 2) std::this_thread::sleep_for(milliseconds(1));  // both inside
    if (session->MarkClosed()) ++closed_first;
  };
  session = NewSession(o);
  auto hold = session->HoldFor("k", /*open_class=*/false, 7);
  google::protobuf::RepeatedPtrField<v1::EndedHold> ended;
  ended.Add()->set_lock_key("k");
  ended.Mutable(0)->set_token(7);
  ended.Mutable(0)->set_reason("forced open");
  auto reader = std::async(std::launch::async, [&] { session->HoldsEnded(ended); });
  while (entered.load() < 1) std::this_thread::sleep_for(milliseconds(1));  // the hold first
  auto pump = std::async(std::launch::async,
                         [&] { session->MarkLost(absl::UnavailableError("deadline passed")); });
  ReturnsOrDie(reader, "the reader's on_lost");
  ReturnsOrDie(pump, "the pump's on_lost");
  EXPECT_EQ(entered.load(), 2);
  EXPECT_EQ(closed_first.load(), 1) << "one Close closes, the other finds it closed";
  EXPECT_TRUE(session->closed());
  EXPECT_TRUE(hold->lost());
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
