// The counters a cell's costs come from: etcd's /metrics page and /proc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "bench/etcd_metrics.h"
#include "bench/proc_stats.h"

namespace holdfast::bench {
namespace {

TEST(EtcdCountersTest, SumsRequestsPerMethodAndReadsTheCollections) {
  const std::string page =
      "# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection "
      "cycles.\n"
      "# TYPE go_gc_duration_seconds summary\n"
      "go_gc_duration_seconds{quantile=\"0.5\"} 0.000123\n"
      "go_gc_duration_seconds_sum 0.078170259\n"
      "go_gc_duration_seconds_count 503\n"
      "grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\","
      "grpc_type=\"unary\"} 5721\n"
      "grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\","
      "grpc_type=\"unary\"} 12\n"
      "grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"other\","
      "grpc_type=\"unary\"} 9\n";
  auto c = ParseEtcdCounters(page);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->requests.at("Txn"), 5730);
  EXPECT_DOUBLE_EQ(c->requests.at("Range"), 12);
  ASSERT_TRUE(c->gc_cycles.has_value());
  EXPECT_DOUBLE_EQ(*c->gc_cycles, 503);
}

TEST(EtcdCountersTest, APageWithoutCollectionsHasNoneAndOneWithoutRequestsIsRefused) {
  auto c = ParseEtcdCounters(
      "grpc_server_msg_received_total{grpc_method=\"Put\",grpc_type=\"unary\"} 3\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->gc_cycles.has_value());
  auto bad = ParseEtcdCounters("<html>not metrics</html>\ngo_gc_duration_seconds_count 5\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "no grpc_server_msg_received_total in /metrics");
}

TEST(ProcSampleTest, CountsTheContextSwitchesOfEveryThread) {
  auto before = SampleProcess(::getpid());
  ASSERT_TRUE(before.ok()) << before.status();
  // Each sleep gives up the CPU: a voluntary switch of a thread other than the
  // main one, which must be counted too. The thread stays alive (a thread that
  // has ended no longer counts) until the second sample is taken.
  std::promise<void> slept, sampled;
  std::thread t([&] {
    for (int i = 0; i < 20; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    slept.set_value();
    sampled.get_future().wait();
  });
  slept.get_future().wait();
  auto during = SampleProcess(::getpid());
  sampled.set_value();
  t.join();
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_GE(during->context_switches - before->context_switches, 20);
  EXPECT_GT(during->rss_bytes, 0);
}

TEST(ProcSampleTest, AProcessThatIsGoneIsNotFound) {
  auto s = SampleProcess(0x3fffffff);  // above any pid_max
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace holdfast::bench
