// holdfastd's Prometheus endpoint against real etcd and holdfastd: the counters
// move by exactly what the test did through libholdfast. Every hook reports
// before the RPC answers, so once a call has returned its effect is visible; the
// only polls (bounded) are for things no call returns: a waiter parking, the
// auditor's election.
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dev/certs.h"
#include "dev/http_get.h"
#include "dev/postgres_process.h"
#include "dev/prometheus_text.h"
#include "dev/subprocess.h"
#include "harness/cluster.h"
#include "holdfast/v1/session.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast {
namespace {

namespace pb = ::etcdserverpb;

using std::chrono::milliseconds;
using std::chrono::seconds;

using dev::HttpGet;

// The value of the first sample `name` whose labels include all of `labels`
// (label values are compared exactly); -1 when there is none.
double Sample(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  return dev::PrometheusSample(text, name, labels);
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto port = dev::PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    testing::TestCluster::Options o;
    o.extra_config = absl::StrCat("metrics: {listen: 127.0.0.1:", port_, "}\n", extra_config_);
    o.holdfastd_args = extra_args_;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    cluster_.reset();
  }

  std::string Scrape() {
    auto a = HttpGet(port_, "/metrics");
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return "";
    EXPECT_NE(a->status_line.find(" 200"), std::string::npos) << a->status_line;
    return a->body;
  }

  // Scrapes until `pred` holds (bounded); returns the last scrape.
  std::string ScrapeUntil(const std::function<bool(const std::string&)>& pred,
                          const std::string& what) {
    auto until = std::chrono::steady_clock::now() + seconds(30);
    std::string text;
    while (std::chrono::steady_clock::now() < until) {
      text = Scrape();
      if (pred(text)) return text;
      std::this_thread::sleep_for(milliseconds(20));
    }
    ADD_FAILURE() << "not reached: " << what << "\n" << text;
    return text;
  }

  // Waits until this replica is the auditor, then takes and releases `key` and
  // waits until both are recorded; returns the last scrape.
  std::string RecordOneCycle(Session& s, const std::string& key) {
    std::string t = ScrapeUntil(
        [](const std::string& t) { return Sample(t, "holdfast_audit_leader") == 1; },
        "this replica is the auditor");
    const double recorded = Sample(t, "holdfast_audit_recorded_events");
    auto h = s.Acquire(key);
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return t;
    EXPECT_TRUE(h->Release().ok());
    return ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_recorded_events") >= recorded + 2;
        },
        "the first cycle is recorded");
  }

  std::unique_ptr<Session> Open(milliseconds ttl = seconds(10)) {
    SessionOptions o;
    o.ttl = ttl;
    auto s = client_->OpenSession("default", o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // How many terms this replica's auditor began ("leads the audit" in its log);
  // the log's text too, for a failure's message.
  size_t AuditTerms(std::string* log_text = nullptr) {
    std::ifstream log(cluster_->dir() + "/holdfastd-0.log");
    std::stringstream text;
    text << log.rdbuf();
    size_t terms = 0;
    for (std::string line; std::getline(text, line);) {
      if (line.find("leads the audit") != std::string::npos &&
          line.find("no longer") == std::string::npos) {
        ++terms;
      }
    }
    if (log_text != nullptr) *log_text = text.str();
    return terms;
  }

  std::string extra_config_;  // more of holdfastd's config, set before SetUp
  std::vector<std::string> extra_args_;  // more of holdfastd's flags, set before SetUp
  int port_ = 0;
  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

const std::map<std::string, std::string> kDefault = {{"namespace", "default"},
                                                     {"class", "default"}};

TEST_F(MetricsTest, CountersMoveByWhatTheClientsDid) {
  const std::string before = Scrape();
  EXPECT_EQ(Sample(before, "holdfast_grants_total"), -1);  // nothing granted yet
  // The start-up's etcd calls are already there.
  EXPECT_GT(Sample(before, "holdfast_etcd_request_duration_seconds_count", {{"method", "Status"}}),
            0);

  auto a = Open(), b = Open(), c = Open();
  ASSERT_TRUE(a && b && c);

  // 1. A free key: one grant of an acquire, one plain release.
  auto h1 = a->Acquire("metrics/one");
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_TRUE(h1->Release().ok());

  // 2. Contended: B queues behind A, C's try is refused, A's release hands over.
  auto h2 = a->Acquire("metrics/two");
  ASSERT_TRUE(h2.ok()) << h2.status();
  auto b2 = std::async(std::launch::async, [&] { return b->Acquire("metrics/two", testing::Waiting(seconds(30))); });
  ScrapeUntil([](const std::string& t) { return Sample(t, "holdfast_waiters_parked", kDefault) == 1; },
              "B parked");
  auto c2 = c->Acquire("metrics/two", testing::Waiting(milliseconds(0)));
  EXPECT_EQ(c2.status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(h2->Release().ok());
  auto hb2 = b2.get();
  ASSERT_TRUE(hb2.ok()) << hb2.status();
  ASSERT_TRUE(hb2->Release().ok());

  // 3. Shared: B and C queue as readers behind A's exclusive hold; one release
  //    hands the key to both in one commit.
  auto h3 = a->Acquire("metrics/three");
  ASSERT_TRUE(h3.ok()) << h3.status();
  auto b3 = std::async(std::launch::async,
                       [&] { return b->Acquire("metrics/three", testing::Waiting(seconds(30), true)); });
  ScrapeUntil([](const std::string& t) { return Sample(t, "holdfast_waiters_parked", kDefault) == 1; },
              "B parked on three");
  auto c3 = std::async(std::launch::async,
                       [&] { return c->Acquire("metrics/three", testing::Waiting(seconds(30), true)); });
  ScrapeUntil([](const std::string& t) { return Sample(t, "holdfast_waiters_parked", kDefault) == 2; },
              "B and C parked on three");
  ASSERT_TRUE(h3->Release().ok());
  auto hb3 = b3.get();
  auto hc3 = c3.get();
  ASSERT_TRUE(hb3.ok()) << hb3.status();
  ASSERT_TRUE(hc3.ok()) << hc3.status();
  EXPECT_EQ(hb3->info().grant_revision(), hc3->info().grant_revision());  // one commit
  ASSERT_TRUE(hb3->Release().ok());
  ASSERT_TRUE(hc3->Release().ok());

  const std::string t = Scrape();
  // Grants: three by acquires (one, two, three), three by hand-over (B; B and C).
  EXPECT_EQ(Sample(t, "holdfast_grants_total",
                   {{"namespace", "default"}, {"class", "default"}, {"path", "acquire"}}), 3);
  EXPECT_EQ(Sample(t, "holdfast_grants_total",
                   {{"namespace", "default"}, {"class", "default"}, {"path", "handover"}}), 3);
  EXPECT_EQ(Sample(t, "holdfast_releases_total", {{"namespace", "default"}}), 6);
  EXPECT_EQ(Sample(t, "holdfast_handover_batch_size_count", {{"namespace", "default"}}), 2);
  EXPECT_EQ(Sample(t, "holdfast_handover_batch_size_sum", {{"namespace", "default"}}), 3);
  EXPECT_EQ(Sample(t, "holdfast_handover_batch_size_bucket",
                   {{"namespace", "default"}, {"le", "1"}}), 1);
  EXPECT_EQ(Sample(t, "holdfast_handover_batch_size_bucket",
                   {{"namespace", "default"}, {"le", "2"}}), 2);
  // Answers: six grants, one refused try.
  EXPECT_EQ(Sample(t, "holdfast_acquires_total",
                   {{"namespace", "default"}, {"class", "default"}, {"code", "OK"}}), 6);
  EXPECT_EQ(Sample(t, "holdfast_acquires_total",
                   {{"namespace", "default"}, {"class", "default"}, {"code", "ABORTED"}}), 1);
  EXPECT_EQ(Sample(t, "holdfast_acquire_duration_seconds_count", kDefault), 6);
  EXPECT_EQ(Sample(t, "holdfast_acquire_duration_seconds_bucket",
                   {{"namespace", "default"}, {"le", "+Inf"}}), 6);
  EXPECT_GT(Sample(t, "holdfast_acquire_duration_seconds_sum", kDefault), 0);
  EXPECT_EQ(Sample(t, "holdfast_acquire_wait_seconds_count", kDefault), 3);  // the queued ones
  EXPECT_EQ(Sample(t, "holdfast_waiters_parked", kDefault), 0);
  // Sessions: three opened here, all live.
  EXPECT_EQ(Sample(t, "holdfast_sessions_opened_total", {{"namespace", "default"}}), 3);
  EXPECT_EQ(Sample(t, "holdfast_sessions_live", {{"namespace", "default"}}), 3);
  // etcd: every grant and release is a transaction; sessions are leases.
  EXPECT_GT(Sample(t, "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}), 12);
  EXPECT_GE(Sample(t, "holdfast_etcd_request_duration_seconds_count", {{"method", "LeaseGrant"}}),
            3);
  EXPECT_EQ(Sample(t, "holdfast_etcd_request_errors_total", {{"method", "Txn"}}), -1);
  // Lock keys never become labels.
  EXPECT_EQ(t.find("metrics/"), std::string::npos);
}

// issue 9: "no extra round trip on the grant path". Once the replica has read the
// namespace and the session, an acquire of a free key is one etcd transaction
// (the fast grant, lock/view_cache.h) and its release one more. Counted with
// the replica's own etcd request counter; background work (the auditor, the
// restore guard, the replica set) uses no Txn, and a slack covers a stray one.
TEST_F(MetricsTest, AnUncontendedCycleOnAWarmReplicaIsTwoTransactions) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  ASSERT_TRUE(session->Acquire("warm-up").ok());  // reads the namespace and session once
  constexpr int kCycles = 30;
  const double before =
      Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
  for (int i = 0; i < kCycles; ++i) {
    auto h = session->Acquire(absl::StrCat("free/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
  const double after =
      Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
  // With a read before each grant it would be 3 per cycle (90).
  EXPECT_GE(after - before, 2 * kCycles);
  EXPECT_LE(after - before, 2 * kCycles + 5);
}

// A hand-over is one etcd transaction: the release plans it on its replica's view
// of the queue (the waiter's read filled it) instead of failing a "no waiter"
// compare first, and the waiter answers from that commit (told by the releasing
// replica, or by its hold's watch event) without a read. Counted over several
// hand-overs, each from the release to the waiter's answer; background work (the
// auditor's lease check, the restore guard) may add a stray transaction, hence
// the slack.
TEST_F(MetricsTest, AHandOverIsOneTransaction) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  constexpr int kHandOvers = 10;
  double spent = 0;
  for (int i = 0; i < kHandOvers; ++i) {
    const std::string key = absl::StrCat("handed/", i);
    auto held = a->Acquire(key);
    ASSERT_TRUE(held.ok()) << held.status();
    auto waiting =
        std::async(std::launch::async, [&] { return b->Acquire(key, testing::Waiting(seconds(30))); });
    ScrapeUntil(
        [](const std::string& t) { return Sample(t, "holdfast_waiters_parked", kDefault) == 1; },
        "B parked");
    const double before =
        Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
    ASSERT_TRUE(held->Release().ok());
    auto got = waiting.get();
    ASSERT_TRUE(got.ok()) << got.status();
    spent += Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}) -
             before;
    EXPECT_GT(got->token(), held->token());
    ASSERT_TRUE(got->Release().ok());
  }
  // Without the view it would be 2 per hand-over (20), with a read by each waiter 3.
  EXPECT_GE(spent, kHandOvers);
  EXPECT_LE(spent, kHandOvers + 3);
}

// A waiting acquire joins the queue and reads it in one transaction: the enqueue's
// branches end with the snapshot's ranges, so no read follows it.
TEST_F(MetricsTest, AWaitingAcquireQueuesWithoutAReadAfterTheEnqueue) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  constexpr int kWaits = 10;
  double spent = 0;
  const std::string key = "queued";
  for (int i = 0; i < kWaits; ++i) {
    auto held = a->Acquire(key);
    ASSERT_TRUE(held.ok()) << held.status();
    const double before =
        Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
    auto waiting =
        std::async(std::launch::async, [&] { return b->Acquire(key, testing::Waiting(seconds(30))); });
    const std::string t = ScrapeUntil(
        [](const std::string& t) { return Sample(t, "holdfast_waiters_parked", kDefault) == 1; },
        "B parked");
    spent += Sample(t, "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}) - before;
    ASSERT_TRUE(held->Release().ok());
    auto got = waiting.get();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->Release().ok());
  }
  // Each: the read that finds the key held (a fast grant leaves no view of the key
  // behind), then the enqueue. With a read after the enqueue: 3 each (30).
  EXPECT_GE(spent, kWaits);
  EXPECT_LE(spent, 2 * kWaits + 3);
}

TEST_F(MetricsTest, WaitersOfOneKeyShareTheirEtcdWatches) {
  constexpr int kWaiters = 6;
  auto holder = Open();
  ASSERT_TRUE(holder);
  std::vector<std::unique_ptr<Session>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(Open());
    ASSERT_TRUE(waiters.back());
  }
  const std::string key = "metrics/shared-watch";
  auto held = holder->Acquire(key);
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string before = Scrape();
  const double watchers = Sample(before, "holdfast_watchers");
  const double etcd_watches = Sample(before, "holdfast_etcd_watches");
  ASSERT_GE(watchers, 0);
  ASSERT_GE(etcd_watches, 0);

  std::vector<std::future<absl::StatusOr<Hold>>> waits;
  for (int i = 0; i < kWaiters; ++i) {
    waits.push_back(std::async(std::launch::async, [&, i] {
      return waiters[static_cast<size_t>(i)]->Acquire(key, testing::Waiting(seconds(30)));
    }));
    // One at a time, so that each reads the queue its predecessor left.
    ScrapeUntil([&](const std::string& t) {
      return Sample(t, "holdfast_waiters_parked", kDefault) == i + 1;
    }, "the next waiter parked");
  }
  const std::string parked = Scrape();
  // Each waiter watches its predecessor, its own hold and its own queue entry...
  EXPECT_GE(Sample(parked, "holdfast_watchers") - watchers, 3 * kWaiters) << parked;
  // ... through one etcd watch of the key's holds and one of its queue, not 3 each.
  EXPECT_LE(Sample(parked, "holdfast_etcd_watches") - etcd_watches, 2) << parked;

  // The queue moves through all of them without a watch created per waiter, and
  // the shared watches end with the last waiter.
  ASSERT_TRUE(held->Release().ok());
  for (auto& w : waits) {
    auto h = w.get();
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
  ScrapeUntil([&](const std::string& t) {
    return Sample(t, "holdfast_etcd_watches") == etcd_watches &&
           Sample(t, "holdfast_watchers") == watchers;
  }, "the waiters' watches ended");
}

class RideTest : public MetricsTest {
 protected:
  void SetUp() override {
    extra_config_ = "acquire: {ride_with_release: 1s}\n";
    MetricsTest::SetUp();
  }
  void ExpectRide(bool c_seen);
  void ExpectJoinBehind(bool last_gone);
  void JoinBehindAHoldTheViewHadNotSeen(bool planted_shared);
};

// An acquire behind another waiter waits for the key's next release and joins
// the queue in that release's etcd commit (one transaction for both); the first
// waiter, with nobody ahead of it, joins at once. `c_seen` gives the rider's
// session a past acquire on this replica, so that it joins from the replica's
// views (acquire_op.cc, FastStart) and its commit reads only the key's holds and
// waiters; otherwise it joins after a read.
void RideTest::ExpectRide(bool c_seen) {
  auto a = Open(), b = Open(), c = Open();
  ASSERT_TRUE(a && b && c);
  const std::string key = c_seen ? "metrics/ride-seen" : "metrics/ride";
  if (c_seen) {
    auto warm = c->Acquire("metrics/ride-warm");
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE(warm->Release().ok());
  }
  const std::string start = Scrape();
  const double rode_before = Sample(start, "holdfast_enqueue_rides_total", {{"outcome", "rode"}});
  const double alone_before =
      Sample(start, "holdfast_enqueue_rides_total", {{"outcome", "alone"}});
  auto held = a->Acquire(key);
  ASSERT_TRUE(held.ok()) << held.status();
  auto wb = std::async(std::launch::async,
                       [&] { return b->Acquire(key, testing::Waiting(seconds(60))); });
  ScrapeUntil([&](const std::string& t) {
    return Sample(t, "holdfast_waiters_parked", kDefault) == 1;
  }, "b parked");
  std::string t = Scrape();
  EXPECT_EQ(Sample(t, "holdfast_enqueues_riding"), 0) << "b had nobody ahead: it did not wait";
  EXPECT_EQ(Sample(t, "holdfast_enqueue_rides_total", {{"outcome", "rode"}}), rode_before);

  // From the views, c goes straight to riding; otherwise it reads the key first.
  // (The auditor campaigns with a transaction once, at the start: wait it out.)
  ScrapeUntil([](const std::string& t) { return Sample(t, "holdfast_audit_leader") == 1; },
              "the auditor leads");
  const double txns_before =
      Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
  auto wc = std::async(std::launch::async,
                       [&] { return c->Acquire(key, testing::Waiting(seconds(60))); });
  t = ScrapeUntil(
      [&](const std::string& t) { return Sample(t, "holdfast_enqueues_riding") == 1; },
      "c waits for a release to ride with");
  EXPECT_EQ(Sample(t, "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}) -
                txns_before,
            c_seen ? 0 : 1)
      << (c_seen ? "c joined from the views, without a read" : "c read the key first");
  auto queue = client_->Describe("default", key);
  ASSERT_TRUE(queue.ok()) << queue.status();
  ASSERT_EQ(queue->waiters_size(), 1) << "c is not queued yet";
  EXPECT_EQ(queue->waiters(0).session_id(), b->id());

  ASSERT_TRUE(held->Release().ok());
  auto hb = wb.get();
  ASSERT_TRUE(hb.ok()) << hb.status();
  // The release handed the key to b and queued c in one commit; c, queued, waits
  // for b (it decided on the queue that commit left, and nothing refused it).
  ScrapeUntil([&](const std::string& t) {
    return Sample(t, "holdfast_waiters_parked", kDefault) == 1;
  }, "c parked behind b");
  queue = client_->Describe("default", key);
  ASSERT_TRUE(queue.ok()) << queue.status();
  ASSERT_EQ(queue->waiters_size(), 1) << queue->DebugString();
  EXPECT_EQ(queue->waiters(0).session_id(), c->id());
  EXPECT_EQ(queue->waiters(0).create_revision(), hb->info().grant_revision());
  t = Scrape();
  EXPECT_EQ(Sample(t, "holdfast_enqueues_riding"), 0);
  EXPECT_EQ(Sample(t, "holdfast_enqueue_rides_total", {{"outcome", "rode"}}), rode_before + 1);
  EXPECT_EQ(Sample(t, "holdfast_enqueue_rides_total", {{"outcome", "alone"}}), alone_before);

  ASSERT_TRUE(hb->Release().ok());
  auto hc = wc.get();
  ASSERT_TRUE(hc.ok()) << hc.status();
  EXPECT_GT(hc->token(), hb->token());
  EXPECT_EQ(hc->info().session_id(), c->id());
  EXPECT_EQ(hc->info().class_id(), "default");
  ASSERT_TRUE(hc->Release().ok());
}

TEST_F(RideTest, AnAcquireBehindAWaiterJoinsTheQueueInTheNextReleasesCommit) {
  ExpectRide(/*c_seen=*/false);
}

TEST_F(RideTest, AnAcquireFromTheViewsRidesAndDecidesOnTheKeysReadAlone) {
  ExpectRide(/*c_seen=*/true);
}

// A waiter queued on `session`'s lease with no call behind it (its replica gone),
// put straight into etcd: the replica under test learns of it only by reading.
void PutWaiter(testing::TestCluster& c, const std::string& key, int64_t session) {
  records::WaiterRecord rec;
  rec.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Minutes(5)));
  rec.set_identity("spiffe://test.holdfast/ops/elsewhere");
  etcdserverpb::TxnRequest put;
  auto* p = put.add_success()->mutable_request_put();
  p->set_key(keyspace::WaitKey("default", key, session));
  p->set_value(rec.SerializeAsString());
  p->set_lease(session);
  ASSERT_TRUE(c.etcd_client().TxnSync(put, etcd::DeadlineIn(seconds(5))).ok());
}

void DeleteWaiter(testing::TestCluster& c, const std::string& key, int64_t session) {
  etcdserverpb::TxnRequest del;
  del.add_success()->mutable_request_delete_range()->set_key(
      keyspace::WaitKey("default", key, session));
  ASSERT_TRUE(c.etcd_client().TxnSync(del, etcd::DeadlineIn(seconds(5))).ok());
}

// An acquire from the views behind a queue the replica's view shows complete
// joins behind the queue's last waiter and reads back that one alone in its
// commit (lock/queue.h, JoinBehind). Here a waiter `q` joined after the view's
// read, so the call waits behind the wrong one for a while: when that one goes,
// the call reads the queue, finds `q` and waits behind it; it is granted only
// once `q` is gone. With the whole queue read in its commit it would have
// watched `q` from the start and never read again.
// `last_gone`: the last waiter leaves before the commit, which then reads it back
// gone: the call reads the queue at once instead.
void RideTest::ExpectJoinBehind(bool last_gone) {
  auto a = Open(), d = Open(), x = Open();
  ASSERT_TRUE(a && d && x);
  std::vector<std::unique_ptr<Session>> w;  // the queue, with no calls behind it
  for (int i = 0; i < 4; ++i) {
    w.push_back(Open());
    ASSERT_TRUE(w.back());
  }
  const std::string key = last_gone ? "metrics/behind-gone" : "metrics/behind";
  auto warm = d->Acquire("metrics/behind-warm");
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(warm->Release().ok());
  auto held = a->Acquire(key);
  ASSERT_TRUE(held.ok()) << held.status();
  for (int i = 0; i < 3; ++i) PutWaiter(*cluster_, key, w[i]->id());
  // A try-acquire reads the key: the replica's view is complete with three waiters.
  auto tried = x->Acquire(key);
  ASSERT_EQ(tried.status().code(), absl::StatusCode::kAborted) << tried.status();
  ScrapeUntil([](const std::string& t) { return Sample(t, "holdfast_audit_leader") == 1; },
              "the auditor leads");
  const double txns_before =
      Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}});
  auto wd = std::async(std::launch::async,
                       [&] { return d->Acquire(key, testing::Waiting(seconds(60))); });
  ScrapeUntil([&](const std::string& t) { return Sample(t, "holdfast_enqueues_riding") == 1; },
              "d waits for a release to ride with");
  // Unseen by the replica: q joins between w[2] (the last waiter d saw) and d.
  PutWaiter(*cluster_, key, w[3]->id());
  if (last_gone) DeleteWaiter(*cluster_, key, w[2]->id());
  auto txns = [&] {
    return Sample(Scrape(), "holdfast_etcd_request_duration_seconds_count",
                  {{"method", "Txn"}}) -
           txns_before;
  };
  EXPECT_EQ(txns(), 0) << "d joined from the views, without a read";

  // The release hands the key to w[0] and queues d in one commit.
  ASSERT_TRUE(held->Release().ok());
  if (!last_gone) {
    // d read back w[2] and waits behind it; when it goes, d reads the queue.
    EXPECT_EQ(txns(), 1) << "d did not read the queue";
    DeleteWaiter(*cluster_, key, w[2]->id());
  }
  ScrapeUntil(
      [&](const std::string& t) {
        return Sample(t, "holdfast_etcd_request_duration_seconds_count", {{"method", "Txn"}}) -
                   txns_before >= 2;
      },
      "d read the queue once it missed the waiter it joined behind");
  // d now waits behind q: the key's holder and the waiter ahead go, q stays, and d
  // is not granted; when q goes, it is.
  etcdserverpb::TxnRequest free_key;
  free_key.add_success()->mutable_request_delete_range()->set_key(
      keyspace::HoldKey("default", key, w[0]->id()));
  free_key.add_success()->mutable_request_delete_range()->set_key(
      keyspace::WaitKey("default", key, w[1]->id()));
  ASSERT_TRUE(cluster_->etcd_client().TxnSync(free_key, etcd::DeadlineIn(seconds(5))).ok());
  EXPECT_EQ(wd.wait_for(milliseconds(300)), std::future_status::timeout)
      << "d was granted with q ahead of it";
  auto queue = client_->Describe("default", key);
  ASSERT_TRUE(queue.ok()) << queue.status();
  ASSERT_EQ(queue->holders_size(), 0) << queue->DebugString();
  ASSERT_EQ(queue->waiters_size(), 2) << queue->DebugString();
  EXPECT_EQ(queue->waiters(0).session_id(), w[3]->id());
  EXPECT_EQ(queue->waiters(1).session_id(), d->id());
  DeleteWaiter(*cluster_, key, w[3]->id());
  auto hd = wd.get();
  ASSERT_TRUE(hd.ok()) << hd.status();
  EXPECT_GT(hd->token(), held->token());
  EXPECT_EQ(hd->info().session_id(), d->id());
  ASSERT_TRUE(hd->Release().ok());
}

TEST_F(RideTest, AnAcquireJoinsBehindTheLastWaiterAndReadsWhenThatOneGoes) {
  ExpectJoinBehind(/*last_gone=*/false);
}

TEST_F(RideTest, AnAcquireThatFindsTheLastWaiterGoneReadsTheQueue) {
  ExpectJoinBehind(/*last_gone=*/true);
}

// A session that holds the key already (handed it on another replica, which this
// replica's view of the key has not seen) and asks again from the views joins
// behind the view's last waiter; its commit finds its own hold, and the call
// returns that hold instead of waiting for it.
// A waiting acquire of a key whose view shows it held by another session joins
// the queue from the views at once (FastStart); its commit reads back the
// session's own hold, put behind the replica's back: `planted_shared` says in
// which mode (the call asks exclusive). Either way the waiter the call put goes
// again and the claim stays with the hold; the call returns the hold, or, in the
// other mode, is refused.
void RideTest::JoinBehindAHoldTheViewHadNotSeen(bool planted_shared) {
  auto a = Open(), d = Open(), x = Open();
  ASSERT_TRUE(a && d && x);
  std::vector<std::unique_ptr<Session>> w;
  for (int i = 0; i < 3; ++i) {
    w.push_back(Open());
    ASSERT_TRUE(w.back());
  }
  const std::string key = "metrics/behind-held";
  auto warm = d->Acquire("metrics/behind-held-warm");
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(warm->Release().ok());
  auto held = a->Acquire(key, testing::Waiting(seconds(5), /*shared=*/true));
  ASSERT_TRUE(held.ok()) << held.status();
  for (int i = 0; i < 3; ++i) PutWaiter(*cluster_, key, w[i]->id());
  auto tried = x->Acquire(key);  // reads the key: the view shows a's hold and three waiters
  ASSERT_EQ(tried.status().code(), absl::StatusCode::kAborted) << tried.status();
  // d is handed a hold behind the replica's back.
  records::HoldRecord rec;
  rec.set_class_id("default");
  rec.set_shared(planted_shared);
  rec.set_epoch(held->info().epoch());
  rec.set_identity(held->info().identity());
  etcdserverpb::TxnRequest put;
  auto* p = put.add_success()->mutable_request_put();
  p->set_key(keyspace::HoldKey("default", key, d->id()));
  p->set_value(rec.SerializeAsString());
  p->set_lease(d->id());
  auto granted = cluster_->etcd_client().TxnSync(put, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(granted.ok()) << granted.status();

  auto again = d->Acquire(key, testing::Waiting(seconds(10)));
  if (planted_shared) {
    ASSERT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
    EXPECT_NE(again.status().message().find("shared, and this call asked for it exclusive"),
              std::string::npos)
        << again.status();
  } else {
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->info().session_id(), d->id());
    EXPECT_EQ(again->info().grant_revision(), granted->header().revision());
  }
  // The waiter key the enqueue put goes again (else d's own release would hand the
  // key back to d), and the claim stays with the hold.
  etcdserverpb::RangeRequest own_wait;
  own_wait.set_key(keyspace::WaitKey("default", key, d->id()));
  int64_t left = -1;
  for (auto until = std::chrono::steady_clock::now() + seconds(30);
       std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(milliseconds(20))) {
    auto r = cluster_->etcd_client().RangeSync(own_wait, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(r.ok()) << r.status();
    left = r->kvs_size();
    if (left == 0) break;
  }
  EXPECT_EQ(left, 0) << "d still waits for a key it holds";
  etcdserverpb::RangeRequest claim;
  claim.set_key(keyspace::ClaimKey("default", key, d->id()));
  auto c = cluster_->etcd_client().RangeSync(claim, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kvs_size(), 1);
}

TEST_F(RideTest, AnAcquireThatJoinedBehindReturnsAHoldTheViewHadNotSeen) {
  JoinBehindAHoldTheViewHadNotSeen(/*planted_shared=*/false);
}

TEST_F(RideTest, AnAcquireThatJoinedBehindAHoldOfTheOtherModeLeavesTheQueue) {
  JoinBehindAHoldTheViewHadNotSeen(/*planted_shared=*/true);
}

TEST_F(MetricsTest, SessionsRenewalsAndCloses) {
  auto keep = Open(seconds(10));
  auto fast = Open(seconds(2));  // renewed every 667 ms by libholdfast
  ASSERT_TRUE(keep && fast);
  auto until = std::chrono::steady_clock::now() + seconds(20);
  while (fast->renewals() < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GE(fast->renewals(), 2);
  std::string t = Scrape();
  EXPECT_GE(Sample(t, "holdfast_keepalives_total",
                   {{"namespace", "default"}, {"result", "renewed"}}), 2);
  EXPECT_GE(Sample(t, "holdfast_keepalive_round_trip_seconds_count"), 2);
  // Each renewal after the first is timed against the previous one (or the open).
  EXPECT_GE(Sample(t, "holdfast_keepalive_interval_ttl_ratio_count"), 2);
  EXPECT_EQ(Sample(t, "holdfast_keepalive_interval_ttl_ratio_bucket", {{"le", "+Inf"}}),
            Sample(t, "holdfast_keepalive_interval_ttl_ratio_count"));
  EXPECT_EQ(Sample(t, "holdfast_sessions_live", {{"namespace", "default"}}), 2);

  ASSERT_TRUE(fast->Close().ok());
  t = Scrape();
  EXPECT_EQ(Sample(t, "holdfast_sessions_closed_total", {{"namespace", "default"}}), 1);
  EXPECT_EQ(Sample(t, "holdfast_sessions_live", {{"namespace", "default"}}), 1);
  EXPECT_EQ(Sample(t, "holdfast_sessions_opened_total", {{"namespace", "default"}}), 2);
  EXPECT_EQ(Sample(t, "holdfast_sessions_lost_total", {{"namespace", "default"}}), -1);
}

// A client that sends renewals on a KeepAlive stream and never reads the answers:
// holdfastd stops reading that stream once 4096 of its requests are unanswered,
// so what it serves of it is bounded, and HTTP/2 flow control holds the client's
// sends. (It used to read and serve all of them, its answers piling up in
// memory.)
TEST_F(MetricsTest, AKeepAliveStreamWhoseAnswersAreNotReadIsNotReadEither) {
  auto s = Open(seconds(30));  // a real session: each request is a renewal
  ASSERT_TRUE(s);
  auto counted = [&] {
    return Sample(Scrape(), "holdfast_keepalives_total",
                  {{"namespace", "default"}, {"result", "renewed"}});
  };
  const double before = std::max(0.0, counted());
  constexpr int kSent = 40000;
  // A client that takes 64 KiB of answers and no more (no window grown by
  // gRPC's bandwidth probes), as one that does not read would.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  auto stub = v1::Session::NewStub(grpc::CreateCustomChannel(
      cluster_->endpoint(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto stream = stub->KeepAlive(&ctx);
  std::atomic<int> written{0};
  std::thread writer([&] {
    v1::KeepAliveRequest ka;
    ka.set_namespace_("default");
    ka.set_session_id(s->id());
    for (int i = 0; i < kSent; ++i) {
      ka.set_sequence(i + 1);
      if (!stream->Write(ka)) break;  // cancelled below
      written.fetch_add(1);
    }
  });
  // Served until holdfastd stops (the count holds still for a second), or all.
  double served = 0, last = -1;
  auto until = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(seconds(1));
    served = counted() - before;
    if (served == last || served >= kSent) break;
    last = served;
  }
  EXPECT_GT(served, 0);
  // 4096 unanswered, and what 64 KiB of answers hold (about 2,300): well under
  // three times the bound. (Before, 17,015 of 40,000 in one run, and counting.)
  EXPECT_LT(served, 3 * 4096) << "holdfastd served " << served << " of " << written.load()
                              << " requests whose answers nobody read";
  ctx.TryCancel();
  writer.join();
  // The replica serves others as before.
  auto other = Open(seconds(10));
  ASSERT_TRUE(other);
  auto hold = other->Acquire("after-the-flood");
  EXPECT_TRUE(hold.ok()) << hold.status();
}

// KeepAlive's reads of sessions new to the replica, paced per identity
// (limits.unknown_session_lookups_per_second: 10 here, so 100 at once). A
// stream that asks to renew 250 sessions that do not exist has each one
// answered "lost", but no faster than the pace: 100 at once, then 10 a second.
// The caller's own session, renewed on the same stream meanwhile, is answered
// at once, ahead of the lookups still waiting.
class LookupPaceTest : public MetricsTest {
 protected:
  void SetUp() override {
    extra_config_ = "limits: {unknown_session_lookups_per_second: 10}\n";
    MetricsTest::SetUp();
  }
};

TEST_F(LookupPaceTest, RenewalsOfSessionsThatDoNotExistArePaced) {
  auto s = Open(seconds(60));
  ASSERT_TRUE(s);
  constexpr int kUnknown = 250, kBurst = 100;
  constexpr double kPerSecond = 10;
  auto stub = v1::Session::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(120));
  auto stream = stub->KeepAlive(&ctx);
  // Sequences 1..250 name made-up sessions; 1001.. the real one, sent after
  // each 50th made-up one.
  const auto started = std::chrono::steady_clock::now();
  std::vector<uint64_t> order;  // sequences, in the order answered
  std::map<uint64_t, v1::KeepAliveResponse> answers;
  std::thread reader([&] {
    v1::KeepAliveResponse a;
    while (answers.size() < kUnknown + 5 && stream->Read(&a)) {
      order.push_back(a.sequence());
      answers[a.sequence()] = a;
    }
  });
  bool written = true;
  for (int i = 1; i <= kUnknown && written; ++i) {
    v1::KeepAliveRequest ka;
    ka.set_namespace_("default");
    ka.set_session_id(int64_t{0x7100000000000000} + i);
    ka.set_sequence(i);
    written = stream->Write(ka);
    if (written && i % 50 == 0) {
      ka.set_session_id(s->id());
      ka.set_sequence(1000 + i / 50);
      written = stream->Write(ka);
    }
  }
  const double writing =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!written) ctx.TryCancel();  // the reader's Read then ends
  reader.join();
  ASSERT_TRUE(written) << "the stream broke while the requests were written";
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  stream->WritesDone();
  ASSERT_EQ(answers.size(), size_t{kUnknown + 5}) << "answered in " << elapsed << " s";
  for (int i = 1; i <= kUnknown; ++i) {
    const auto& a = answers[i];
    EXPECT_TRUE(a.lost()) << i;
    EXPECT_NE(a.reason().find("not found in namespace \"default\""), std::string::npos)
        << a.reason();
  }
  for (int k = 1; k <= 5; ++k) {
    EXPECT_TRUE(!answers[1000 + k].lost() && answers[1000 + k].ttl_ms() > 0) << k;
  }
  // Paced: at most the burst, then the pace (a slower machine only widens this).
  EXPECT_GE(kBurst + kPerSecond * elapsed + 1, kUnknown)
      << "250 lookups that found nothing answered in " << elapsed << " s";
  // The real session's renewal sent after the 150th made-up one was answered
  // before the 200th made-up one, which waited some 10 s for its turn.
  auto pos = [&](uint64_t seq) { return std::find(order.begin(), order.end(), seq) - order.begin(); };
  EXPECT_LT(pos(1003), pos(200));
  const std::string t = Scrape();
  EXPECT_EQ(Sample(t, "holdfast_keepalive_lookups_total", {{"result", "missed"}}), kUnknown);
  EXPECT_GT(Sample(t, "holdfast_keepalive_lookups_waited_total"), 0)
      << "written in " << writing << " s";
}

TEST_F(MetricsTest, AuditorProgressIsExposed) {
  auto s = Open();
  ASSERT_TRUE(s);
  auto h = s->Acquire("metrics/audited");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->Release().ok());
  // The only replica becomes the auditor and records the grant and the release.
  const std::string t = ScrapeUntil(
      [](const std::string& t) {
        return Sample(t, "holdfast_audit_leader") == 1 &&
               Sample(t, "holdfast_audit_recorded_events") >= 2;
      },
      "the auditor leads and has recorded the grant and the release");
  EXPECT_GT(Sample(t, "holdfast_audit_cursor_revision"), 0);
  EXPECT_GE(Sample(t, "holdfast_audit_last_seen_revision"),
            Sample(t, "holdfast_audit_cursor_revision"));
  EXPECT_EQ(Sample(t, "holdfast_audit_lag_revisions"),
            Sample(t, "holdfast_audit_last_seen_revision") -
                Sample(t, "holdfast_audit_cursor_revision"));
  EXPECT_EQ(Sample(t, "holdfast_audit_gaps"), 0);
  EXPECT_GE(Sample(t, "holdfast_audit_compacted_revision"), 0);
}

class AuditFlushTest : public MetricsTest {
 protected:
  void SetUp() override {
    extra_config_ = "audit: {flush_interval: 1s}\n";
    MetricsTest::SetUp();
  }
};

// The auditor gathers what etcd sends for audit.flush_interval before it writes:
// a burst of grants and releases costs one audit store transaction per interval,
// not one per revision, and etcd sends it in about one watch response per
// transaction (a live watch sends each revision in a response of its own).
TEST_F(AuditFlushTest, ABurstIsRecordedInOneStoreTransactionPerInterval) {
  auto s = Open();
  ASSERT_TRUE(s);
  // One cycle recorded first: the auditor's watch has caught up with etcd (a
  // watch behind gets what it missed in one response anyway).
  std::string t = RecordOneCycle(*s, "metrics/burst/first");
  const double commits_before = Sample(t, "holdfast_audit_store_commits");
  const double wakeups_before = Sample(t, "holdfast_audit_wakeups");
  const double responses_before = Sample(t, "holdfast_audit_watch_responses");
  const double events_before = Sample(t, "holdfast_audit_recorded_events");
  ASSERT_GE(commits_before, 0);
  const auto start = std::chrono::steady_clock::now();
  constexpr int kCycles = 20;
  for (int i = 0; i < kCycles; ++i) {
    auto h = s->Acquire(absl::StrCat("metrics/burst/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
    // Spread over more than one of etcd's 100 ms catch-up ticks.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t = ScrapeUntil(
      [&](const std::string& t) {
        return Sample(t, "holdfast_audit_recorded_events") >= events_before + 2 * kCycles;
      },
      "the burst's grants and releases are recorded");
  const double seconds_taken =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double commits = Sample(t, "holdfast_audit_store_commits") - commits_before;
  EXPECT_GE(commits, 1);
  // One per started interval, and one already under way when the burst began.
  EXPECT_LE(commits, std::ceil(seconds_taken) + 1)
      << "the 40 revisions of the burst took " << seconds_taken << " s";
  // The auditor thread was woken about once per commit, not once per watch
  // response (each of the 40 revisions came in its own).
  const double wakeups = Sample(t, "holdfast_audit_wakeups") - wakeups_before;
  EXPECT_GE(wakeups, 1);
  EXPECT_LE(wakeups, commits + 2) << commits << " commits";
  // etcd sent them in about one watch response per commit, not one per revision:
  // the watch is paused until each record, and what came meanwhile arrives
  // together when it starts again.
  const double responses = Sample(t, "holdfast_audit_watch_responses") - responses_before;
  EXPECT_GE(responses, 1);
  EXPECT_LE(responses, commits + 2) << commits << " commits, " << 2 * kCycles << " revisions";
}

// While the audit store is down, the auditor's watch is not paused: the backlog
// shows in holdfast_audit_lag_revisions as it grows, and it is all recorded,
// once, when the store is back.
class PostgresStoreTest : public MetricsTest {
 protected:
  void SetUp() override {
    auto pg = dev::PostgresProcess::Start();
    ASSERT_TRUE(pg.ok()) << pg.status();
    pg_ = std::move(*pg);
    extra_args_ = {"--audit-store", pg_->url(pg_->options().database)};
    MetricsTest::SetUp();
  }
  void TearDown() override {
    MetricsTest::TearDown();
    pg_.reset();
  }

  // Stops the store, runs `cycles` lock cycles, and waits until the lag shows
  // them all with nothing recorded meanwhile; then `while_down` (given the
  // session and that scrape), and the store back: every cycle is recorded, once.
  void CyclesWhileTheStoreIsDown(
      int cycles, const std::function<void(Session&, const std::string&)>& while_down) {
    auto s = Open();
    ASSERT_TRUE(s);
    std::string t = RecordOneCycle(*s, "metrics/backlog/first");
    const double recorded = Sample(t, "holdfast_audit_recorded_events");
    pg_->Stop();
    // One cycle, which the auditor fails to record; the rest after that.
    for (int i = 0; i < cycles; ++i) {
      auto h = s->Acquire(absl::StrCat("metrics/backlog/", i));
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(h->Release().ok());
      if (i == 0) std::this_thread::sleep_for(seconds(1));
    }
    t = ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_lag_revisions") >= 2 * cycles;
        },
        "the backlog shows while the store is down");
    EXPECT_EQ(Sample(t, "holdfast_audit_recorded_events"), recorded);
    EXPECT_EQ(Sample(t, "holdfast_audit_leader"), 1);
    int more = 0;
    if (while_down) {
      while_down(*s, t);
      more = extra_cycles_;
    }
    ASSERT_TRUE(pg_->Restart().ok());
    t = ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_recorded_events") >=
                     recorded + 2 * (cycles + more) &&
                 Sample(t, "holdfast_audit_lag_revisions") == 0 &&
                 Sample(t, "holdfast_audit_buffered_events") == 0;
        },
        "the backlog is recorded once the store is back");
    EXPECT_EQ(Sample(t, "holdfast_audit_recorded_events"), recorded + 2 * (cycles + more));
    EXPECT_EQ(Sample(t, "holdfast_audit_buffered_events"), 0);
  }

  std::unique_ptr<dev::PostgresProcess> pg_;
  int extra_cycles_ = 0;  // lock cycles `while_down` ran
};

TEST_F(PostgresStoreTest, AStoreThatIsDownShowsItsBacklog) {
  CyclesWhileTheStoreIsDown(15, nullptr);
}

// The test server runs with synchronous_commit = off; holdfastd's own
// transactions run with on, and the status says so.
TEST_F(PostgresStoreTest, TheStatusSaysWhatTheTrailsCommitsWaitFor) {
  auto st = client_->GetAuditStatus();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->store(), "postgresql");
  EXPECT_EQ(st->store_durability(), "synchronous_commit=on");
  EXPECT_EQ(st->store_durability_raised_from(), "synchronous_commit=off");
}

// holdfastd does not hold an unbounded backlog in memory while the store is down:
// at audit.max_buffered_events its watch ends, the lag goes on growing from the
// revisions its etcd client sees, and all is recorded once the store is back.
class BoundedAuditBufferTest : public PostgresStoreTest {
 protected:
  static constexpr int kBound = 1000;
  void SetUp() override {
    extra_config_ = absl::StrCat("audit: {max_buffered_events: ", kBound, "}\n");
    PostgresStoreTest::SetUp();
  }
};

TEST_F(BoundedAuditBufferTest, AFullBufferEndsTheWatchAndTheLagStillGrows) {
  // Five etcd events a cycle (a hold and a claim put, then deleted, and the
  // release's audit mark): 1,600 cycles are eight times the bound.
  CyclesWhileTheStoreIsDown(1600, [&](Session& s, const std::string& t) {
    const double held = Sample(t, "holdfast_audit_buffered_events");
    // The bound, plus the rest of the watch response that reached it: at most
    // one catch-up response of etcd's (1,000 revisions, 2,500 events here);
    // unbounded, all 8,000.
    EXPECT_GE(held, kBound);
    EXPECT_LT(held, kBound + 2600);
    const double responses = Sample(t, "holdfast_audit_watch_responses");
    const double lag = Sample(t, "holdfast_audit_lag_revisions");
    extra_cycles_ = 50;
    for (int i = 0; i < extra_cycles_; ++i) {
      auto h = s.Acquire(absl::StrCat("metrics/backlog/more/", i));
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(h->Release().ok());
    }
    std::string after = ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_lag_revisions") >= lag + 2 * extra_cycles_;
        },
        "the lag grows with the watch ended");
    EXPECT_EQ(Sample(after, "holdfast_audit_watch_responses"), responses);
    EXPECT_EQ(Sample(after, "holdfast_audit_buffered_events"), held);
    // A write outside holdfast's keys counts in the lag while the buffer is
    // full (holdfastd's etcd client sees its revision pass by), but no record
    // reaches it: once the watch starts again the lag is back to 0 (below).
    const double before_put = Sample(after, "holdfast_audit_lag_revisions");
    pb::PutRequest put;
    put.set_key("not-holdfast/metrics-test");
    put.set_value("x");
    ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
    ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_lag_revisions") >= before_put + 1;
        },
        "the lag counts the write outside holdfast's keys");
  });
}

// etcd compacted past the auditor's cursor while the store was down and the
// auditor's watch had ended (its buffer full): what etcd compacted is reported
// as a gap, exactly, and everything from the compact revision on is recorded.
class CompactedAuditBacklogTest : public PostgresStoreTest {
 protected:
  static constexpr int kBound = 1000;  // the least audit.max_buffered_events
  void SetUp() override {
    extra_config_ = absl::StrCat("audit: {max_buffered_events: ", kBound, "}\n");
    PostgresStoreTest::SetUp();
  }
};

TEST_F(CompactedAuditBacklogTest, OnlyWhatEtcdCompactedIsLostAndTheGapSaysWhich) {
  auto s = Open();
  ASSERT_TRUE(s);
  std::string t = RecordOneCycle(*s, "metrics/compacted/first");
  pg_->Stop();
  constexpr int kCycles = 500;  // 2,500 events
  for (int i = 0; i < kCycles; ++i) {
    auto h = s->Acquire(absl::StrCat("metrics/compacted/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
    if (i == 0) std::this_thread::sleep_for(seconds(1));
  }
  // The buffer is full and the watch has ended short of the last cycles.
  t = ScrapeUntil(
      [&](const std::string& t) {
        return Sample(t, "holdfast_audit_buffered_events") >= kBound &&
               Sample(t, "holdfast_audit_lag_revisions") >= 2 * kCycles;
      },
      "the watch ends with the buffer full");
  EXPECT_EQ(Sample(t, "holdfast_audit_gaps"), 0);

  // etcd compacted by hand up to its current revision.
  auto now = cluster_->etcd_client().StatusSync(etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(now.ok()) << now.status();
  const int64_t compacted = now->header().revision();
  pb::CompactionRequest compact;
  compact.set_revision(compacted);
  compact.set_physical(true);
  std::promise<absl::Status> done;
  cluster_->etcd_client().Compact(compact, etcd::DeadlineIn(seconds(10)),
                                  [&](absl::StatusOr<pb::CompactionResponse> r) {
                                    done.set_value(r.status());
                                  });
  ASSERT_TRUE(done.get_future().get().ok());
  // Grants after the compaction, which etcd still has.
  std::vector<int64_t> after;
  for (int i = 0; i < 5; ++i) {
    auto h = s->Acquire(absl::StrCat("metrics/compacted/after/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    after.push_back(h->token());
    ASSERT_TRUE(h->Release().ok());
  }

  ASSERT_TRUE(pg_->Restart().ok());
  t = ScrapeUntil([&](const std::string& t) { return Sample(t, "holdfast_audit_gaps") == 1; },
                  "the auditor reports the gap");
  // Every grant after the compaction is recorded (looked for a while: the
  // auditor goes on after the gap).
  std::set<int64_t> recorded;
  for (int i = 0; i < 300; ++i) {
    v1::QueryAuditRequest q;
    q.set_type("grant");
    q.set_limit(10000);
    auto grants = client_->QueryAudit(q);
    ASSERT_TRUE(grants.ok()) << grants.status();
    recorded.clear();
    for (const auto& e : grants->events()) recorded.insert(e.token());
    if (recorded.count(after.back())) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  for (int64_t token : after) {
    EXPECT_TRUE(recorded.count(token))
        << "the grant of token " << token << ", after the compaction, was not recorded ("
        << recorded.size() << " grants recorded, the last "
        << (recorded.empty() ? 0 : *recorded.rbegin()) << ")";
  }
  std::string log;
  AuditTerms(&log);
  EXPECT_TRUE(absl::StrContains(
      log, absl::StrCat("..", compacted - 1, " before they were recorded")))
      << "the gap does not end where etcd's history begins (" << compacted << ")";
}

// A record that waits on another connection's lock on the SQLite file gives up
// within a quarter of the auditor lease's TTL and is retried, so the auditor keeps
// renewing its lease: it stays the auditor in one term, however long the file
// stays locked, and records everything once the lock is gone.
class LockedAuditFileTest : public MetricsTest {
 protected:
  void SetUp() override {
    extra_config_ = "audit: {leader_ttl: 5s}\n";
    MetricsTest::SetUp();
  }
};

TEST_F(LockedAuditFileTest, TheAuditorKeepsItsTermWhileTheFileIsLockedPastItsLease) {
  auto s = Open();
  ASSERT_TRUE(s);
  std::string t = RecordOneCycle(*s, "metrics/locked/first");
  const double recorded = Sample(t, "holdfast_audit_recorded_events");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((cluster_->dir() + "/audit.db").c_str(), &db, SQLITE_OPEN_READWRITE,
                            nullptr),
            SQLITE_OK);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(db, sqlite3_close);
  sqlite3_busy_timeout(db, 10'000);  // the auditor may be writing just now
  ASSERT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  constexpr int kCycles = 10;
  for (int i = 0; i < kCycles; ++i) {
    auto h = s->Acquire(absl::StrCat("metrics/locked/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
  // Held for longer than the lease's TTL (5 s).
  std::this_thread::sleep_for(seconds(8));
  t = Scrape();
  EXPECT_EQ(Sample(t, "holdfast_audit_leader"), 1);
  EXPECT_EQ(Sample(t, "holdfast_audit_recorded_events"), recorded);
  ASSERT_EQ(sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  t = ScrapeUntil(
      [&](const std::string& t) {
        return Sample(t, "holdfast_audit_recorded_events") >= recorded + 2 * kCycles &&
               Sample(t, "holdfast_audit_lag_revisions") == 0;
      },
      "the cycles are recorded once the file is free");
  EXPECT_EQ(Sample(t, "holdfast_audit_recorded_events"), recorded + 2 * kCycles);
  // One term: the auditor never lost its lease (a new term would say so again).
  std::string log;
  EXPECT_EQ(AuditTerms(&log), 1u) << log;
}

// Each cluster's auditor records on a connection of its own: calls that wait on
// the server's connection (here operators' epoch reads, each held up by a table
// lock for the lock wait, 1.25 s, one after another) do not hold up its records,
// so it records as it goes and keeps its lease in one term. On one shared
// connection each record would queue behind them, and the lease would lapse.
class OwnAuditConnectionTest : public PostgresStoreTest {
 protected:
  void SetUp() override {
    extra_config_ = "audit: {leader_ttl: 5s}\n";
    PostgresStoreTest::SetUp();
  }
};

TEST_F(OwnAuditConnectionTest, CallsQueuedOnTheServersConnectionDoNotHoldUpTheAuditor) {
  auto s = Open();
  ASSERT_TRUE(s);
  std::string t = RecordOneCycle(*s, "metrics/own/first");
  const double recorded = Sample(t, "holdfast_audit_recorded_events");

  // The epoch table locked, as an operator's LOCK TABLE or VACUUM FULL would.
  PGconn* conn = PQconnectdb(pg_->url(pg_->options().database).c_str());
  std::unique_ptr<PGconn, void (*)(PGconn*)> closer(conn, PQfinish);
  ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  PQclear(PQexec(conn, "BEGIN"));
  PGresult* locked = PQexec(conn, "LOCK TABLE epoch IN ACCESS EXCLUSIVE MODE");
  ASSERT_EQ(PQresultStatus(locked), PGRES_COMMAND_OK) << PQerrorMessage(conn);
  PQclear(locked);

  // Four operators read the epoch over and over; each read of its history waits
  // for the lock, then GetEpoch answers without the history.
  std::atomic<bool> stop{false};
  std::atomic<int> held_up{0}, whole{0};
  std::vector<std::thread> operators;
  // Joined however the test ends: a failed ASSERT below must not leave a joinable
  // thread behind (std::terminate) or the operators calling on.
  absl::Cleanup join_operators = [&] {
    stop = true;
    for (auto& o : operators) {
      if (o.joinable()) o.join();
    }
  };
  for (int i = 0; i < 4; ++i) {
    auto c = cluster_->NewClient();
    ASSERT_TRUE(c.ok()) << c.status();
    operators.emplace_back([&stop, &held_up, &whole, c = std::move(*c)] {
      while (!stop.load()) {
        auto e = c->GetEpoch();
        EXPECT_TRUE(e.ok()) << e.status();
        if (e.ok()) (e->history_size() == 0 ? held_up : whole).fetch_add(1);
      }
    });
  }
  // Cycles over twice the lease's TTL, each recorded before the next.
  constexpr int kCycles = 10;
  for (int i = 0; i < kCycles; ++i) {
    auto h = s->Acquire(absl::StrCat("metrics/own/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
    t = ScrapeUntil(
        [&](const std::string& t) {
          return Sample(t, "holdfast_audit_recorded_events") >= recorded + 2 * (i + 1);
        },
        "each cycle is recorded while the operators' reads wait");
    std::this_thread::sleep_for(seconds(1));
  }
  std::move(join_operators).Invoke();
  PQclear(PQexec(conn, "ROLLBACK"));

  // The reads really were held up: none got through the lock.
  EXPECT_GE(held_up.load(), 4) << "the operators' reads should have waited for the lock";
  EXPECT_EQ(whole.load(), 0);
  EXPECT_EQ(Sample(t, "holdfast_audit_recorded_events"), recorded + 2 * kCycles);
  EXPECT_EQ(Sample(t, "holdfast_audit_leader"), 1);
  std::string log;
  EXPECT_EQ(AuditTerms(&log), 1u) << log;
  // And the server's connection serves them again.
  auto epoch = client_->GetEpoch();
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_GE(epoch->history_size(), 1);
}

TEST(MetricsFlagTest, MetricsListenFlagServesTextFormat) {
  auto port = dev::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  testing::TestCluster::Options o;
  o.holdfastd_args = {"--metrics-listen", absl::StrCat("127.0.0.1:", *port)};
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto a = HttpGet(*port, "/metrics");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->status_line.find(" 200"), std::string::npos) << a->status_line;
  EXPECT_NE(a->headers.find("text/plain"), std::string::npos) << a->headers;
  EXPECT_NE(a->body.find("# TYPE holdfast_etcd_request_duration_seconds histogram"),
            std::string::npos)
      << a->body;
  // Families without a sample yet (grants, sessions) are left out until they have one.
  EXPECT_NE(a->body.find("# TYPE holdfast_keepalive_interval_ttl_ratio histogram"),
            std::string::npos);
  EXPECT_EQ(a->body.find("holdfast_grants_total"), std::string::npos);
}

// holdfastd serving mTLS serves its metrics over HTTPS: the scraper presents a
// client certificate of the CA the API trusts, and must be one of
// metrics.readers or an admin. Others get 403 and no metric; no certificate, or
// one of another CA, gets no answer at all.
TEST(MetricsTlsTest, OnlyReadersAndAdminsScrapeAndOthersLearnNothing) {
  auto port = dev::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  testing::TestCluster::Options o;
  o.tls = true;
  o.extra_config = absl::StrCat("metrics:\n  listen: 127.0.0.1:", *port,
                                "\n  readers: [spiffe://test.holdfast/monitoring/*]\n");
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  testing::TestCluster& c = **cluster;
  ASSERT_TRUE(c.MakeIdentity("prometheus", "spiffe://test.holdfast/monitoring/prometheus").ok());
  ASSERT_TRUE(c.MakeIdentity("app", "spiffe://test.holdfast/payments/api").ok());
  ASSERT_TRUE(c.MakeIdentity("forged", "spiffe://test.holdfast/monitoring/prometheus",
                             /*other_ca=*/true)
                  .ok());
  ASSERT_TRUE(c.MakeIdentity("elsewhere", "spiffe://other.domain/monitoring/prometheus").ok());
  ASSERT_TRUE(c.CreateNamespace("payments").ok());

  auto as = [&](const std::string& name) -> absl::StatusOr<dev::HttpAnswer> {
    dev::HttpsClient tls;
    auto ca = dev::ReadPem(c.certs_dir(), "ca");
    if (!ca.ok()) return ca.status();
    tls.ca_pem = ca->cert;
    if (!name.empty()) {
      auto id = dev::ReadPem(c.certs_dir(), name);
      if (!id.ok()) return id.status();
      tls.cert_pem = id->cert;
      tls.key_pem = id->key;
    }
    return HttpGet(*port, "/metrics", tls);
  };

  for (const std::string name : {"prometheus", "admin"}) {
    auto a = as(name);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status();
    EXPECT_EQ(a->code, 200) << name << ": " << a->status_line << "\n" << a->body;
    EXPECT_NE(a->body.find("# TYPE holdfast_etcd_request_duration_seconds histogram"),
              std::string::npos)
        << name;
  }

  // A caller of the API that is not a reader: the reason, and no metric.
  auto app = as("app");
  ASSERT_TRUE(app.ok()) << app.status();
  EXPECT_EQ(app->code, 403);
  EXPECT_EQ(app->body,
            "spiffe://test.holdfast/payments/api may not read metrics: it matches neither "
            "metrics.readers nor admin_ids\n");
  // A trust domain holdfastd does not accept: refused as the API refuses it.
  auto elsewhere = as("elsewhere");
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(elsewhere->code, 403);
  EXPECT_NE(elsewhere->body.find("other.domain"), std::string::npos) << elsewhere->body;
  EXPECT_EQ(elsewhere->body.find("holdfast_"), std::string::npos) << elsewhere->body;

  // No client certificate, one of another CA, or plain HTTP: no answer.
  auto none = as("");
  ASSERT_FALSE(none.ok()) << none->status_line;
  EXPECT_NE(none.status().message().find("certificate required"), std::string::npos)
      << none.status();
  auto forged = as("forged");
  ASSERT_FALSE(forged.ok()) << forged->status_line;
  EXPECT_NE(forged.status().message().find("unknown ca"), std::string::npos) << forged.status();
  auto plain = HttpGet(*port, "/metrics");
  EXPECT_FALSE(plain.ok() && plain->code == 200) << plain->body;

  // Each of those connections is counted by how it ended (each just after it
  // closed: scraped again until the last ones are in).
  std::string text;
  for (int i = 0; i < 50; ++i) {
    auto a = as("prometheus");
    ASSERT_TRUE(a.ok()) << a.status();
    text = a->body;
    if (Sample(text, "holdfast_metrics_connections_total", {{"outcome", "handshake_failed"}}) >=
        3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(Sample(text, "holdfast_metrics_connections_total", {{"outcome", "scraped"}}), 2);
  EXPECT_EQ(Sample(text, "holdfast_metrics_connections_total", {{"outcome", "forbidden"}}), 2);
  EXPECT_EQ(Sample(text, "holdfast_metrics_connections_total", {{"outcome", "handshake_failed"}}),
            3);
  EXPECT_EQ(Sample(text, "holdfast_metrics_connections_total", {{"outcome", "refused"}}), 0);
}

// metrics.plaintext: true serves plain HTTP to anyone though the API is mTLS
// (a scrape path protected otherwise), and says so at start.
TEST(MetricsTlsTest, PlaintextServesPlainHttpAndWarns) {
  auto port = dev::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  testing::TestCluster::Options o;
  o.tls = true;
  o.extra_config =
      absl::StrCat("metrics:\n  listen: 127.0.0.1:", *port, "\n  plaintext: true\n");
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto a = HttpGet(*port, "/metrics");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, 200) << a->status_line;
  std::ifstream log((*cluster)->dir() + "/holdfastd-0.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("metrics.plaintext: serving metrics on 127.0.0.1:"),
            std::string::npos)
      << text.str();
}

}  // namespace
}  // namespace holdfast
