#include "common/worker_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace holdfast {
namespace {

TEST(WorkerPoolTest, StopRunsEverythingQueuedFirst) {
  WorkerPool pool(2, "test-pool");
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(pool.Run([&] { ran.fetch_add(1); }));
  }
  pool.Stop();
  EXPECT_EQ(ran.load(), 100);
}

TEST(WorkerPoolTest, AtMostItsThreadsRunAtOnce) {
  WorkerPool pool(3, "test-pool");
  std::atomic<int> running{0}, most{0};
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  for (int i = 0; i < 12; ++i) {
    pool.Run([&] {
      int now = running.fetch_add(1) + 1;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      gate.wait();
      running.fetch_sub(1);
    });
  }
  // Three functions are blocked in the gate; the other nine wait their turn.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (running.load() < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  EXPECT_EQ(running.load(), 3);
  go.set_value();
  pool.Stop();
  EXPECT_EQ(most.load(), 3);
  EXPECT_EQ(running.load(), 0);
}

TEST(WorkerPoolTest, RunAfterStopIsRefusedAndNeverRuns) {
  WorkerPool pool(1, "test-pool");
  pool.Stop();
  std::atomic<bool> ran{false};
  EXPECT_FALSE(pool.Run([&] { ran = true; }));
  pool.Stop();  // idempotent
  EXPECT_FALSE(ran.load());
}

}  // namespace
}  // namespace holdfast
