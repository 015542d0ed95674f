#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>
#include <sstream>

#include <gtest/gtest.h>

#include "dev/prometheus_text.h"

namespace holdfast::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The value of the sample `name` whose labels include every one of `labels`;
// -1 when there is none.
double Sample(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  return dev::PrometheusSample(text, name, labels);
}

class MetricsTest : public ::testing::Test {
 protected:
  MetricsTest() : metrics_([this] { return now_; }) {}
  std::chrono::steady_clock::time_point now_{};
  Metrics metrics_;
};

TEST_F(MetricsTest, AcquiresCountByCodeAndTimeOnlyGrants) {
  lock::AcquireEnd ok;
  ok.ns = "payments";
  ok.class_id = "db";
  ok.latency = milliseconds(30);
  ok.waited = milliseconds(20);
  metrics_.OnAcquireDone(ok);
  lock::AcquireEnd held = ok;
  held.code = absl::StatusCode::kAborted;
  held.waited.reset();
  metrics_.OnAcquireDone(held);
  lock::AcquireEnd unknown_ns;  // the namespace did not exist: no made-up label value
  unknown_ns.code = absl::StatusCode::kNotFound;
  metrics_.OnAcquireDone(unknown_ns);

  const std::string text = metrics_.Render();
  const std::map<std::string, std::string> db = {{"namespace", "payments"}, {"class", "db"}};
  EXPECT_EQ(Sample(text, "holdfast_acquires_total",
                   {{"namespace", "payments"}, {"class", "db"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_acquires_total",
                   {{"namespace", "payments"}, {"class", "db"}, {"code", "ABORTED"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_acquires_total",
                   {{"namespace", ""}, {"class", ""}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_acquire_duration_seconds_count", db), 1);
  EXPECT_DOUBLE_EQ(Sample(text, "holdfast_acquire_duration_seconds_sum", db), 0.03);
  EXPECT_EQ(Sample(text, "holdfast_acquire_duration_seconds_bucket",
                   {{"namespace", "payments"}, {"le", "0.025"}}), 0);
  EXPECT_EQ(Sample(text, "holdfast_acquire_duration_seconds_bucket",
                   {{"namespace", "payments"}, {"le", "0.05"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_acquire_wait_seconds_count", db), 1);
  EXPECT_DOUBLE_EQ(Sample(text, "holdfast_acquire_wait_seconds_sum", db), 0.02);
}

TEST_F(MetricsTest, GrantsReleasesAndHandOverBatches) {
  metrics_.OnGranted("ns", "default", lock::GrantPath::kAcquire, 1);
  metrics_.OnGranted("ns", "default", lock::GrantPath::kHandOver, 3);
  metrics_.OnReleased("ns", 3);
  metrics_.OnReleased("ns", 0);  // a plain release: no hand-over batch
  const std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_grants_total", {{"path", "acquire"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_grants_total", {{"path", "handover"}}), 3);
  EXPECT_EQ(Sample(text, "holdfast_releases_total", {{"namespace", "ns"}}), 2);
  EXPECT_EQ(Sample(text, "holdfast_handover_batch_size_count", {{"namespace", "ns"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_handover_batch_size_sum", {{"namespace", "ns"}}), 3);
  EXPECT_EQ(Sample(text, "holdfast_handover_batch_size_bucket", {{"le", "2"}}), 0);
  EXPECT_EQ(Sample(text, "holdfast_handover_batch_size_bucket", {{"le", "4"}}), 1);
}

TEST_F(MetricsTest, ParkedWaitersGoUpAndDown) {
  metrics_.OnParked("ns", "default", +1);
  metrics_.OnParked("ns", "default", +1);
  metrics_.OnParked("ns", "default", -1);
  EXPECT_EQ(Sample(metrics_.Render(), "holdfast_waiters_parked", {{"namespace", "ns"}}), 1);
}

TEST_F(MetricsTest, LiveSessionsAreThoseRenewedHereWithinTheirTtl) {
  metrics_.OnSessionOpened("a", 1, seconds(10));
  metrics_.OnSessionOpened("a", 2, seconds(10));
  metrics_.OnSessionOpened("b", 3, seconds(10));
  EXPECT_EQ(Sample(metrics_.Render(), "holdfast_sessions_live", {{"namespace", "a"}}), 2);

  now_ += seconds(5);
  lock::RenewEnd renew;
  renew.ns = "a";
  renew.session = 2;
  renew.ttl = seconds(10);
  renew.renewed = true;
  renew.round_trip = milliseconds(2);
  metrics_.OnRenewed(renew);
  now_ += seconds(6);  // session 1 and 3 ran out 1 s ago; session 2 has 4 s left
  std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_sessions_live", {{"namespace", "a"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_sessions_live", {{"namespace", "b"}}), 0);
  EXPECT_EQ(Sample(text, "holdfast_sessions_opened_total", {{"namespace", "a"}}), 2);
  // Renewed half-way through its TTL.
  EXPECT_EQ(Sample(text, "holdfast_keepalive_interval_ttl_ratio_count"), 1);
  EXPECT_DOUBLE_EQ(Sample(text, "holdfast_keepalive_interval_ttl_ratio_sum"), 0.5);
  EXPECT_EQ(Sample(text, "holdfast_keepalive_round_trip_seconds_count"), 1);
  EXPECT_EQ(Sample(text, "holdfast_keepalives_total",
                   {{"namespace", "a"}, {"result", "renewed"}}), 1);

  metrics_.OnSessionClosed("a", 2);
  text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_sessions_live", {{"namespace", "a"}}), 0);
  EXPECT_EQ(Sample(text, "holdfast_sessions_closed_total", {{"namespace", "a"}}), 1);
}

TEST_F(MetricsTest, ARenewalThatFindsTheLeaseGoneIsALostSession) {
  metrics_.OnSessionOpened("a", 7, seconds(10));
  lock::RenewEnd lost;
  lost.ns = "a";
  lost.session = 7;
  lost.lost = true;
  metrics_.OnRenewed(lost);
  lock::RenewEnd no_quorum;  // not confirmed, not lost: the session stays live
  no_quorum.ns = "a";
  no_quorum.session = 8;
  no_quorum.etcd_unavailable = true;
  metrics_.OnRenewed(no_quorum);
  const std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_sessions_lost_total", {{"namespace", "a"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_sessions_live", {{"namespace", "a"}}), 0);
  EXPECT_EQ(Sample(text, "holdfast_keepalives_total", {{"result", "lost"}}), 1);
  EXPECT_EQ(Sample(text, "holdfast_keepalives_total", {{"result", "etcd_unavailable"}}), 1);
  // Neither answer came from a renewal etcd confirmed in time.
  EXPECT_EQ(Sample(text, "holdfast_keepalive_round_trip_seconds_count"), 0);
}

TEST_F(MetricsTest, EtcdCallsByMethodAndErrorsByCode) {
  metrics_.OnEtcdCall("Txn", absl::OkStatus(), milliseconds(3));
  metrics_.OnEtcdCall("Txn", absl::UnavailableError("down"), milliseconds(5));
  metrics_.OnEtcdCall("Watch", absl::OkStatus(), milliseconds(1));  // not made up front
  const std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}), 2);
  EXPECT_EQ(Sample(text, "holdfast_etcd_request_duration_seconds_count", {{"method", "Range"}}),
            0);
  EXPECT_EQ(Sample(text, "holdfast_etcd_request_duration_seconds_count", {{"method", "Watch"}}),
            1);
  EXPECT_EQ(Sample(text, "holdfast_etcd_request_errors_total",
                   {{"method", "Txn"}, {"code", "UNAVAILABLE"}}), 1);
}

TEST_F(MetricsTest, TlsFileChangesAreCountedByResult) {
  EXPECT_EQ(Sample(metrics_.Render(), "holdfast_tls_files_changes_total",
                   {{"files", "api"}, {"result", "taken"}}),
            -1);  // none yet: absent
  metrics_.OnTlsFiles("api", true);
  metrics_.OnTlsFiles("api", false);
  metrics_.OnTlsFiles("api", false);
  metrics_.OnTlsFiles("etcd", false);
  const std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_tls_files_changes_total", {{"files", "api"}, {"result", "taken"}}),
            1);
  EXPECT_EQ(
      Sample(text, "holdfast_tls_files_changes_total", {{"files", "api"}, {"result", "refused"}}),
      2);
  EXPECT_EQ(
      Sample(text, "holdfast_tls_files_changes_total", {{"files", "etcd"}, {"result", "refused"}}),
      1);
}

TEST_F(MetricsTest, AuditorProgressIsReadAtScrapeTime) {
  EXPECT_EQ(Sample(metrics_.Render(), "holdfast_audit_leader"), -1);  // no auditor: absent
  audit::AuditorStatus st;
  st.leader = true;
  st.cursor = 90;
  st.last_seen_revision = 100;
  st.compacted_revision = 50;
  st.gaps = 1;
  st.recorded_events = 42;
  st.store_commits = 7;
  st.watch_responses = 9;
  st.buffered_events = 33;
  st.pruned_events = 12;
  metrics_.SetAuditSource([&st] { return st; });
  std::string text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_audit_leader"), 1);
  EXPECT_EQ(Sample(text, "holdfast_audit_cursor_revision"), 90);
  EXPECT_EQ(Sample(text, "holdfast_audit_last_seen_revision"), 100);
  EXPECT_EQ(Sample(text, "holdfast_audit_compacted_revision"), 50);
  EXPECT_EQ(Sample(text, "holdfast_audit_lag_revisions"), 10);
  EXPECT_EQ(Sample(text, "holdfast_audit_gaps"), 1);
  EXPECT_EQ(Sample(text, "holdfast_audit_recorded_events"), 42);
  EXPECT_EQ(Sample(text, "holdfast_audit_store_commits"), 7);
  EXPECT_EQ(Sample(text, "holdfast_audit_watch_responses"), 9);
  EXPECT_EQ(Sample(text, "holdfast_audit_buffered_events"), 33);
  EXPECT_EQ(Sample(text, "holdfast_audit_pruned_events"), 12);
  st.leader = false;  // a follower's numbers are its last term's: no lag claimed
  st.cursor = 95;
  text = metrics_.Render();
  EXPECT_EQ(Sample(text, "holdfast_audit_leader"), 0);
  EXPECT_EQ(Sample(text, "holdfast_audit_cursor_revision"), 95);
  EXPECT_EQ(Sample(text, "holdfast_audit_lag_revisions"), 0);
}

TEST_F(MetricsTest, ServeFailsOnAPortInUse) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  auto s = metrics_.Serve("127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("cannot listen on 127.0.0.1:"), std::string::npos) << s;
  EXPECT_EQ(metrics_.port(), 0);
  close(fd);
}

// Connections the endpoint refuses (one address past its 8 places, say) are
// counted each and logged at most once a minute, with how many since the last
// line: a client stuck or flooding the port shows in the log.
TEST_F(MetricsTest, RefusedConnectionsAreLoggedAtMostOnceAMinute) {
  ASSERT_TRUE(metrics_.Serve("127.0.0.1:0").ok());
  auto connect_from_another_address = [&] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    EXPECT_EQ(inet_pton(AF_INET, "127.0.0.2", &from.sin_addr), 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(metrics_.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  auto refused_until = [&](double n) {
    double got = 0;
    for (int i = 0; i < 500 && got < n; ++i) {
      got = Sample(metrics_.Render(), "holdfast_metrics_connections_total",
                   {{"outcome", "refused"}});
      if (got < n) std::this_thread::sleep_for(milliseconds(10));
    }
    return got;
  };
  ::testing::internal::CaptureStderr();
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) held.push_back(connect_from_another_address());
  EXPECT_EQ(refused_until(12), 12);  // 8 held, 12 refused: one line
  now_ += seconds(61);
  held.push_back(connect_from_another_address());
  EXPECT_EQ(refused_until(13), 13);  // a minute on: the next line, with the rest
  const std::string said = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines;
  std::istringstream in(said);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("holdfastd: metrics: WARNING: ", 0) == 0) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 2u) << said;
  EXPECT_EQ(lines[0].rfind("holdfastd: metrics: WARNING: 1 connection to the metrics endpoint "
                           "refused (its 64 places taken, or 8 from one address",
                           0),
            0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("holdfastd: metrics: WARNING: 12 connections to the metrics endpoint "
                           "refused in the last minute or more (",
                           0),
            0u)
      << lines[1];
  metrics_.StopServing();
  for (int fd : held) close(fd);
}

}  // namespace
}  // namespace holdfast::server
