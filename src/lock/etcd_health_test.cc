// EtcdHealth against a real etcd-server process, with one endpoint of the client
// silent (an etcd member cut off from the network, as holdfastd sees it).
#include "lock/etcd_health.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "dev/scratch_etcd.h"
#include "dev/silent_endpoint.h"

namespace holdfast::lock {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class EtcdHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = dev::ScratchEtcd::Start("health");
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    etcd_ = &scratch_->etcd();
    timers_ = std::make_shared<TimerQueue>();
  }
  void TearDown() override {
    etcd_ = nullptr;
    scratch_.reset();
  }

  std::unique_ptr<etcd::Client> Connect(std::vector<std::string> endpoints) {
    etcd::ClientOptions co;
    co.endpoints = std::move(endpoints);
    auto c = etcd::Client::Create(co, timers_);
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<dev::ScratchEtcd> scratch_;
  dev::EtcdProcess* etcd_ = nullptr;  // scratch_'s
  std::shared_ptr<TimerQueue> timers_;
};

// The client starts on the silent endpoint. The first probe gets no answer, the
// client moves, and the probe is asked again on the member that answers: etcd is
// never reported unhealthy.
TEST_F(EtcdHealthTest, OneSilentMemberDoesNotMakeEtcdUnhealthy) {
  dev::SilentEndpoint silent;
  ASSERT_FALSE(silent.address().empty());
  auto client = Connect({silent.address(), etcd_->endpoint()});
  ASSERT_NE(client, nullptr);
  std::atomic<int> unhealthy{0};
  EtcdHealth health(client.get(), {.period = milliseconds(100), .probe_timeout = milliseconds(600)},
                    [&](bool healthy, const std::string&) {
                      if (!healthy) unhealthy++;
                    });
  health.Start();
  std::this_thread::sleep_for(seconds(2));
  EXPECT_TRUE(health.status().ok()) << health.status();
  EXPECT_EQ(unhealthy.load(), 0);
  EXPECT_EQ(client->PickEndpoint().second, 1u);
  health.Stop();
}

// With every endpoint silent the second ask fails too: unhealthy, as before.
TEST_F(EtcdHealthTest, EverySilentMemberMakesEtcdUnhealthy) {
  dev::SilentEndpoint a, b;
  ASSERT_FALSE(a.address().empty() || b.address().empty());
  auto client = Connect({a.address(), b.address()});
  ASSERT_NE(client, nullptr);
  EtcdHealth health(client.get(), {.period = milliseconds(100), .probe_timeout = milliseconds(600)});
  health.Start();
  auto until = std::chrono::steady_clock::now() + seconds(10);
  while (health.status().ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(health.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(health.status().message().find("etcd is unreachable or has no quorum"),
            std::string::npos)
      << health.status();
  health.Stop();
}

}  // namespace
}  // namespace holdfast::lock
