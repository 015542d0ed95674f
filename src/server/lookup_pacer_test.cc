#include "server/lookup_pacer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace holdfast::server {
namespace {

using std::chrono::milliseconds;
using Tp = std::chrono::steady_clock::time_point;
using Admission = LookupPacer::Admission;
#define EXPECT_RAN(x) EXPECT_EQ((x), Admission::kRan)
#define EXPECT_WAITS(x) EXPECT_EQ((x), Admission::kWaits)

// A clock moved by hand, and timers fired by hand.
class LookupPacerTest : public ::testing::Test {
 protected:
  LookupPacer Make(double per_second, double burst, size_t max_waiting = 16384) {
    return LookupPacer(
        {.per_second = per_second, .burst = burst, .max_waiting = max_waiting},
        [this](std::chrono::steady_clock::duration d, std::function<void()> fn) {
          timers_.push_back({now_ + d, std::move(fn)});
        },
        [this] { return now_; });
  }
  // Moves the clock on and fires the timers due by then.
  void Advance(milliseconds d) {
    now_ += d;
    std::vector<std::function<void()>> due;
    for (auto it = timers_.begin(); it != timers_.end();) {
      if (it->first <= now_) {
        due.push_back(std::move(it->second));
        it = timers_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& fn : due) fn();
  }
  std::function<void()> Record(const std::string& what) {
    return [this, what] { ran_.push_back(what); };
  }

  Tp now_{};
  std::vector<std::pair<Tp, std::function<void()>>> timers_;
  std::vector<std::string> ran_;
};

// Lookups that find the caller's sessions give their tokens back: however many
// come, they run as fast as they are answered, `burst` at a time at most.
TEST_F(LookupPacerTest, LookupsThatFindTheSessionCostNothing) {
  LookupPacer p = Make(/*per_second=*/1, /*burst=*/3);
  for (int i = 0; i < 3; ++i) EXPECT_RAN(p.Run("alice", Record("a" + std::to_string(i))));
  EXPECT_WAITS(p.Run("alice", Record("a3")));  // three in flight
  EXPECT_EQ(ran_.size(), 3u);
  EXPECT_EQ(p.waiting(), 1u);
  p.GiveBack("alice");  // a0 found its session: a3 runs, no clock moved
  EXPECT_EQ(ran_.back(), "a3");
  EXPECT_EQ(p.waiting(), 0u);
  for (int i = 0; i < 100; ++i) {
    p.GiveBack("alice");
    EXPECT_RAN(p.Run("alice", Record("more")));
  }
  for (int i = 0; i < 3; ++i) p.GiveBack("alice");
  Advance(milliseconds(1000));  // the timer armed while a3 waited finds nothing to do
  EXPECT_EQ(ran_.size(), 104u);
  EXPECT_EQ(p.identities(), 0u);  // a full bucket is not kept
}

// Lookups that find nothing keep their tokens: past the burst, an identity's
// lookups wait and run in their order at `per_second`; another identity's run
// at once.
TEST_F(LookupPacerTest, LookupsThatFindNothingArePacedPerIdentity) {
  LookupPacer p = Make(/*per_second=*/10, /*burst=*/2);
  EXPECT_RAN(p.Run("mallory", Record("m0")));
  EXPECT_RAN(p.Run("mallory", Record("m1")));
  EXPECT_WAITS(p.Run("mallory", Record("m2")));
  EXPECT_WAITS(p.Run("mallory", Record("m3")));
  EXPECT_WAITS(p.Run("mallory", Record("m4")));
  EXPECT_EQ(p.waiting(), 3u);
  ASSERT_EQ(timers_.size(), 1u);  // one timer for the identity, not one per lookup
  EXPECT_RAN(p.Run("alice", Record("a0")));
  EXPECT_EQ(ran_, (std::vector<std::string>{"m0", "m1", "a0"}));

  Advance(milliseconds(50));  // half a token
  EXPECT_EQ(ran_.size(), 3u);
  Advance(milliseconds(50));
  EXPECT_EQ(ran_.back(), "m2");
  Advance(milliseconds(100));
  EXPECT_EQ(ran_.back(), "m3");
  // A lookup asked now waits behind m4, though it would find its session.
  EXPECT_WAITS(p.Run("mallory", Record("m5")));
  Advance(milliseconds(100));
  EXPECT_EQ(ran_.back(), "m4");
  Advance(milliseconds(100));
  EXPECT_EQ(ran_.back(), "m5");
  EXPECT_EQ(p.waiting(), 0u);
  EXPECT_TRUE(timers_.empty());
  // Refilled after a while: the burst again.
  Advance(milliseconds(1000));
  EXPECT_RAN(p.Run("mallory", Record("m6")));
  EXPECT_RAN(p.Run("mallory", Record("m7")));
  EXPECT_WAITS(p.Run("mallory", Record("m8")));
}

// Stopping runs what waits (the stream then answers or drops it), and every
// later lookup runs at once; so does every lookup with no bound set.
TEST_F(LookupPacerTest, StopRunsWhatWaitsAndNoBoundRunsEverything) {
  LookupPacer p = Make(/*per_second=*/1, /*burst=*/1);
  EXPECT_RAN(p.Run("m", Record("0")));
  EXPECT_WAITS(p.Run("m", Record("1")));
  EXPECT_WAITS(p.Run("m", Record("2")));
  p.Stop();
  EXPECT_EQ(ran_, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_RAN(p.Run("m", Record("3")));
  EXPECT_EQ(p.waiting(), 0u);
  Advance(milliseconds(5000));  // the timer armed before the stop runs nothing twice
  EXPECT_EQ(ran_.size(), 4u);

  LookupPacer unbounded = Make(/*per_second=*/0, /*burst=*/1);
  for (int i = 0; i < 50; ++i) EXPECT_RAN(unbounded.Run("m", Record("u")));
  EXPECT_EQ(unbounded.identities(), 0u);
}

// Identities seen once are not kept for ever: idle ones go when their bucket is
// full again, at the latest when the table has doubled.
TEST_F(LookupPacerTest, IdleIdentitiesAreForgotten) {
  LookupPacer p = Make(/*per_second=*/10, /*burst=*/5);
  for (int i = 0; i < 1000; ++i) {
    p.Run("spiffe://x/" + std::to_string(i), Record("x"));  // a miss each: a token kept
    Advance(milliseconds(1));
  }
  EXPECT_LT(p.identities(), 300u);
  Advance(milliseconds(1000));
  p.Run("spiffe://y", Record("y"));
  EXPECT_LE(p.identities(), 300u);
}

// Lookups that answer at once give their tokens back inside the drain that ran
// them: the drain loops on instead of running the next one nested in that call,
// so 100,000 waiting lookups run one after another, on a stack that does not
// grow with them (nested, they overflowed it).
TEST_F(LookupPacerTest, LookupsGivingTheirTokenBackAtOnceRunInALoopNotNested) {
  auto p = std::make_unique<LookupPacer>(Make(/*per_second=*/1, /*burst=*/1, 200'000));
  int depth = 0, deepest = 0, ran = 0;
  EXPECT_RAN(p->Run("m", [] {}));  // takes the only token, and keeps it
  constexpr int kWaiting = 100'000;
  for (int i = 0; i < kWaiting; ++i) {
    EXPECT_WAITS(p->Run("m", [&] {
      ++depth;
      deepest = std::max(deepest, depth);
      ++ran;
      p->GiveBack("m");  // answered without a read
      --depth;
    }));
  }
  EXPECT_EQ(p->waiting(), size_t{kWaiting});
  p->GiveBack("m");
  EXPECT_EQ(ran, kWaiting);
  EXPECT_EQ(deepest, 1);
  EXPECT_EQ(p->waiting(), 0u);
}

// Past max_waiting waiting lookups of an identity, more are refused and never
// run; another identity is not affected.
TEST_F(LookupPacerTest, PastTheWaitingBoundLookupsAreRefused) {
  LookupPacer p = Make(/*per_second=*/1, /*burst=*/1, /*max_waiting=*/3);
  EXPECT_RAN(p.Run("m", Record("0")));
  for (int i = 1; i <= 3; ++i) EXPECT_WAITS(p.Run("m", Record(std::to_string(i))));
  EXPECT_EQ(p.Run("m", Record("refused")), Admission::kFull);
  EXPECT_RAN(p.Run("a", Record("a")));
  for (int i = 0; i < 3; ++i) Advance(milliseconds(1000));
  EXPECT_EQ(ran_, (std::vector<std::string>{"0", "a", "1", "2", "3"}));
}

// A pacer gone before its timer fires: the timer does nothing.
TEST_F(LookupPacerTest, ATimerOutlivingThePacerDoesNothing) {
  {
    LookupPacer p = Make(1, 1);
    p.Run("m", Record("0"));
    p.Run("m", Record("1"));
    ASSERT_EQ(timers_.size(), 1u);
  }
  Advance(milliseconds(5000));
  EXPECT_EQ(ran_, (std::vector<std::string>{"0"}));
}

}  // namespace
}  // namespace holdfast::server
