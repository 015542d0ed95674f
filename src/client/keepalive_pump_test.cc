// KeepAlivePump's deadline checks with no holdfastd reachable: nothing listens on
// the Client's endpoint, so every turn of the pump waits (up to 100 ms) for a
// connection that never comes. What is checked is the order of the pump's steps
// (TurnObserver), not how long they took: a slow machine cannot make it fail.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/internal.h"

namespace holdfast::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// One step of a turn, as the observer saw it.
struct Step {
  bool ticked;                    // false: a blocking step ended
  SteadyClock::time_point time;   // ticked: the time Tick was given; else when it ended
  bool lost_after = false;        // ticked: the session was lost once that Tick ran
};

// A session whose local deadline passes while the pump waits for a connection
// must be seen by the Tick that follows the wait: that Tick's time is read after
// the wait, not before it (which left the deadline unseen a whole turn longer).
TEST(KeepAlivePumpTest, DeadlinesAreCheckedWithATimeReadAfterWaitingForAConnection) {
  ClientOptions options;
  options.endpoints = {"127.0.0.1:1"};
  auto core = std::make_shared<ClientCore>(options);
  std::mutex mu;
  std::vector<Step> steps;  // guarded by mu
  std::shared_ptr<SessionState> session;
  core->pump().SetTurnObserverForTest({
      .blocking_step_ended =
          [&] {
            std::lock_guard l(mu);
            steps.push_back({.ticked = false, .time = SteadyClock::now()});
          },
      .ticked =
          [&](SteadyClock::time_point now) {
            std::lock_guard l(mu);
            steps.push_back({.ticked = true, .time = now});
          },
  });
  // TTL 1 s, margin 10%: its local deadline 300 ms from now, a few turns away.
  const auto opened_at = SteadyClock::now() - milliseconds(600);
  std::atomic<bool> lost_seen{false};
  session = std::make_shared<SessionState>(core, "ns", 42, seconds(1), SessionOptions(), opened_at);
  // The session's stop token is stopped inside the Tick that saw the deadline
  // pass (on_lost runs later, on the callback thread): the last step recorded.
  std::stop_callback on_stop(session->lost_token(), [&] {
    std::lock_guard l(mu);
    if (!steps.empty()) steps.back().lost_after = true;
    lost_seen = true;
  });
  core->pump().Add(session);
  // Another session, far from its deadline, keeps the pump waiting for a
  // connection after the first one is lost.
  auto other = std::make_shared<SessionState>(core, "ns", 43, seconds(30), SessionOptions(),
                                              SteadyClock::now());
  core->pump().Add(other);
  // A few turns after the loss too; bounded, so a pump that stopped turning fails.
  int ticks_after_wait = 0;
  for (int i = 0; i < 2000 && (ticks_after_wait < 5 || !lost_seen.load()); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    std::lock_guard l(mu);
    ticks_after_wait = 0;
    for (size_t k = 1; k < steps.size(); ++k) {
      if (steps[k].ticked && !steps[k - 1].ticked) ++ticks_after_wait;
    }
  }
  core->pump().Stop();

  std::lock_guard l(mu);
  ASSERT_GE(ticks_after_wait, 5) << "the pump did not turn";
  ASSERT_TRUE(lost_seen.load()) << "the session's deadline passed unseen";
  std::optional<SteadyClock::time_point> wait_ended;
  bool reported = false;
  for (const Step& s : steps) {
    if (!s.ticked) {
      wait_ended = s.time;
      continue;
    }
    if (wait_ended) {
      EXPECT_GE(s.time, *wait_ended) << "Tick was given a time read before the wait ended";
    }
    wait_ended.reset();
    // The deadline is reported by the first Tick given a time past it.
    EXPECT_EQ(s.lost_after, s.time >= session->deadline() && !reported)
        << "a Tick past the deadline did not report the session lost, or one before it did";
    reported = reported || s.lost_after;
  }
  EXPECT_TRUE(session->lost());
}

}  // namespace
}  // namespace holdfast::internal
