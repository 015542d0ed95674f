#include "common/event_loop.h"

#include <atomic>
#include <future>

#include <grpcpp/alarm.h>
#include <gtest/gtest.h>

namespace holdfast {
namespace {

// A tag that records where and how it ran, then says so.
struct Probe final : EventLoop::Tag {
  void Proceed(bool ok) override {
    ran_on = EventLoop::Current();
    this->ok = ok;
    done.set_value();
  }
  EventLoop* ran_on = nullptr;
  bool ok = false;
  std::promise<void> done;
};

TEST(EventLoopTest, TagsRunOnTheLoopThreadAndCurrentNamesIt) {
  EventLoop loop("test-loop");
  EXPECT_EQ(EventLoop::Current(), nullptr);  // this thread is no loop's
  Probe probe;
  grpc::Alarm alarm;
  alarm.Set(loop.cq(), gpr_now(GPR_CLOCK_MONOTONIC), &probe);
  ASSERT_EQ(probe.done.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_EQ(probe.ran_on, &loop);
  EXPECT_TRUE(probe.ok);
  EXPECT_EQ(loop.server_cq(), nullptr);
}

TEST(EventLoopTest, ACancelledOperationRunsItsTagWithNotOk) {
  EventLoop loop("test-loop");
  Probe probe;
  grpc::Alarm alarm;
  alarm.Set(loop.cq(), gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(60, GPR_TIMESPAN)),
            &probe);
  alarm.Cancel();
  ASSERT_EQ(probe.done.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_FALSE(probe.ok);
}

TEST(EventLoopTest, ShutdownRunsWhatIsDueThenJoins) {
  auto loop = std::make_unique<EventLoop>("test-loop");
  std::atomic<int> ran{0};
  struct Count final : EventLoop::Tag {
    explicit Count(std::atomic<int>* n) : n(n) {}
    void Proceed(bool) override { n->fetch_add(1); }
    std::atomic<int>* n;
  };
  std::vector<std::unique_ptr<Count>> tags;
  std::vector<std::unique_ptr<grpc::Alarm>> alarms;
  for (int i = 0; i < 50; ++i) {
    tags.push_back(std::make_unique<Count>(&ran));
    alarms.push_back(std::make_unique<grpc::Alarm>());
    alarms.back()->Set(loop->cq(), gpr_now(GPR_CLOCK_MONOTONIC), tags.back().get());
  }
  loop->Shutdown();
  EXPECT_EQ(ran.load(), 50);
  loop->Shutdown();  // idempotent
}

TEST(EventLoopTest, MemberTagCallsTheMemberWithOk) {
  EventLoop loop("test-loop");
  struct Owner {
    void On(bool ok) {
      seen = ok;
      done.set_value();
    }
    bool seen = false;
    std::promise<void> done;
  } owner;
  EventLoop::MemberTag<Owner> tag(&owner, &Owner::On);
  grpc::Alarm alarm;
  alarm.Set(loop.cq(), gpr_now(GPR_CLOCK_MONOTONIC), &tag);
  ASSERT_EQ(owner.done.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_TRUE(owner.seen);
}

}  // namespace
}  // namespace holdfast
