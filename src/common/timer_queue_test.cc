#include "common/timer_queue.h"

#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace holdfast {
namespace {

TEST(TimerQueueTest, RunsInDeadlineOrder) {
  TimerQueue q;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> all;
  auto now = TimerQueue::Clock::now();
  for (int i : {3, 1, 2}) {
    q.Schedule(now + std::chrono::milliseconds(10 * i), [&, i] {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(i);
      if (order.size() == 3) all.set_value();
    });
  }
  ASSERT_EQ(all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueueTest, CancelledTimerNeverRuns) {
  TimerQueue q;
  std::atomic<int> ran{0};
  std::promise<void> later;
  auto id = q.ScheduleAfter(std::chrono::milliseconds(20), [&] { ran++; });
  EXPECT_TRUE(q.Cancel(id));
  EXPECT_FALSE(q.Cancel(id));
  // A later timer runs, so the cancelled one (earlier) would have run by then.
  q.ScheduleAfter(std::chrono::milliseconds(60), [&] { later.set_value(); });
  ASSERT_EQ(later.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(ran.load(), 0);
}

TEST(TimerQueueTest, CallbackMayScheduleAnother) {
  TimerQueue q;
  std::promise<void> second;
  q.ScheduleAfter(std::chrono::milliseconds(1), [&] {
    q.ScheduleAfter(std::chrono::milliseconds(1), [&] { second.set_value(); });
  });
  EXPECT_EQ(second.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

// Stop drops what is pending (its captures go at once) and what comes after; a
// pending timer never runs, also once its time has come.
TEST(TimerQueueTest, StopDropsPendingTimersAndLaterOnes) {
  TimerQueue q;
  std::atomic<int> ran{0};
  auto held = std::make_shared<int>(0);
  q.ScheduleAfter(std::chrono::milliseconds(30), [&ran, held] { ran++; });
  EXPECT_EQ(held.use_count(), 2);
  q.Stop();
  EXPECT_EQ(held.use_count(), 1) << "the pending callback was not destroyed";
  EXPECT_EQ(q.ScheduleAfter(std::chrono::milliseconds(1), [&ran, held] { ran++; }), 0u);
  EXPECT_EQ(held.use_count(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(ran.load(), 0);
  q.Stop();  // again: nothing
}

}  // namespace
}  // namespace holdfast
