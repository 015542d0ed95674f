// The FIFO queue, shared mode and class policy against real etcd and holdfastd.
// Order and safety are checked from etcd's own history where it matters.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "etcd/watch_hub.h"
#include "harness/cluster.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/snapshot.h"
#include "lock/engine.h"
#include "lock/records.pb.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

class QueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = testing::TestCluster::Start();
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    cluster_.reset();
  }

  std::unique_ptr<Session> Open(milliseconds ttl = seconds(10)) {
    SessionOptions o;
    o.ttl = ttl;
    auto s = client_->OpenSession("default", o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // The release transaction `a`'s hold of `key` would send to hand it over to
  // `b`, waiting behind it, planned on a read made now (AddHandOver), as a
  // release planned on a read makes it; not sent.
  pb::TxnRequest PlanHandOver(const Session& a, const Session& b, const std::string& key) {
    pb::TxnRequest txn;
    pb::TxnRequest read;
    lock::AddSnapshotReads("default", a.id(), key, read.mutable_success());
    auto r = cluster_->etcd_client().TxnSync(read, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return txn;
    auto snap = lock::ParseSnapshot(r->header(), r->responses());
    EXPECT_TRUE(snap.ok()) << snap.status();
    if (!snap.ok()) return txn;
    // The release's own part (the hold's delete), then the hand-over.
    txn.add_success()->mutable_request_delete_range()->set_key(
        keyspace::HoldKey("default", key, a.id()));
    auto planned = lock::Engine::AddHandOver(*snap, "default", key, a.id(),
                                             /*grants_allowed=*/true, /*on_read=*/true,
                                             absl::ToUnixMillis(absl::Now()), &txn);
    EXPECT_EQ(planned.granted, std::vector<int64_t>{b.id()});
    return txn;
  }

  // Polls Describe (bounded) until `pred` holds; returns the last answer.
  v1::DescribeResponse DescribeUntil(const std::string& key,
                                     const std::function<bool(const v1::DescribeResponse&)>& pred,
                                     milliseconds timeout = seconds(20)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    v1::DescribeResponse last;
    while (std::chrono::steady_clock::now() < until) {
      auto d = client_->Describe("default", key);
      if (d.ok()) {
        last = *d;
        if (pred(last)) return last;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    ADD_FAILURE() << "condition not reached for " << key << ": " << last.DebugString();
    return last;
  }

  // A waiting Acquire of `key` by `session` (60 s) straight over gRPC, left for
  // the test to cancel: libholdfast would ask again. Ends the call, if it is
  // still out, before it goes.
  struct RawWait {
    ~RawWait() {
      ctx.TryCancel();
      if (result.valid()) result.wait();
    }
    std::unique_ptr<v1::Lock::Stub> stub;
    v1::AcquireRequest req;
    grpc::ClientContext ctx;
    v1::AcquireResponse resp;
    std::promise<grpc::Status> done;
    std::future<grpc::Status> result = done.get_future();
  };
  std::unique_ptr<RawWait> StartRawWait(int64_t session, const std::string& key) {
    auto w = std::make_unique<RawWait>();
    w->stub = v1::Lock::NewStub(
        grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
    w->req.set_namespace_("default");
    w->req.set_session_id(session);
    w->req.set_lock_key(key);
    w->req.set_wait_ms(60'000);
    RawWait* raw = w.get();
    w->stub->async()->Acquire(&w->ctx, &w->req, &w->resp,
                              [raw](grpc::Status st) { raw->done.set_value(st); });
    return w;
  }

  // Class "long" on "pol/": sessions of 20 s to 60 s only (those of Open()'s
  // default 10 s are refused).
  void CreateLongSessionsClass() {
    v1::LockClass cls;
    cls.set_namespace_("default");
    cls.set_class_id("long");
    cls.set_key_prefix("pol/");
    cls.set_ttl_min_ms(20'000);
    cls.set_ttl_max_ms(60'000);
    cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
    ASSERT_TRUE(client_->CreateClass(cls).ok());
  }

  int64_t Revision() {
    pb::RangeRequest r;
    r.set_key("/holdfast/epoch");
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return resp.ok() ? resp->header().revision() : -1;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

// A waiter of a session that holds the key, with nobody waiting on it (an acquire
// from a stale view queues, answers with the hold, and its delete of the waiter
// failed): the holder's release removes it and hands the key to the next waiter.
// Handed the key instead, it would fail the release (a put and a delete of one
// hold key in one etcd commit).
TEST_F(QueueTest, AWaiterLeftBesideItsSessionsHoldIsRemovedByTheRelease) {
  auto a = Open();
  auto hold = a->Acquire("stray");
  ASSERT_TRUE(hold.ok()) << hold.status();
  records::WaiterRecord stray;
  stray.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now()) + 60'000);
  stray.set_identity("spiffe://holdfast.dev/dev");
  pb::PutRequest put;
  put.set_key(keyspace::WaitKey("default", "stray", a->id()));
  put.set_value(stray.SerializeAsString());
  put.set_lease(a->id());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());

  auto b = Open();
  auto next = std::async(std::launch::async,
                         [&] { return b->Acquire("stray", testing::Waiting(seconds(30))); });
  DescribeUntil("stray", [](const v1::DescribeResponse& d) { return d.waiters_size() == 2; });

  ASSERT_TRUE(hold->Release().ok());
  auto got = next.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(got->token(), hold->token());
  auto after = DescribeUntil("stray", [&](const v1::DescribeResponse& d) {
    return d.holders_size() == 1 && d.waiters_size() == 0;
  });
  EXPECT_EQ(after.holders(0).session_id(), b->id());
  pb::RangeRequest r;
  r.set_key(keyspace::WaitKey("default", "stray", a->id()));
  auto left = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->kvs_size(), 0) << "the stray waiter is still queued";
}

// A waiter dead when a release read the queue, taken over in place with a later
// deadline (a retried acquire) before the release commits, is alive: the release
// must not remove it. The release's transaction, as the engine builds it from
// that read, is committed on real etcd after the take-over.
TEST_F(QueueTest, ADeadWaiterRevivedInPlaceIsNotRemovedByARelease) {
  auto a = Open();
  auto hold = a->Acquire("revived");
  ASSERT_TRUE(hold.ok()) << hold.status();
  auto b = Open();
  auto put_waiter = [&](int64_t deadline_ms) {
    records::WaiterRecord w;
    w.set_deadline_unix_ms(deadline_ms);
    w.set_identity("spiffe://holdfast.dev/dev");
    pb::PutRequest put;
    put.set_key(keyspace::WaitKey("default", "revived", b->id()));
    put.set_value(w.SerializeAsString());
    put.set_lease(b->id());
    return cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5)));
  };
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(put_waiter(now_ms - 1000).ok());  // dead

  auto build = [&] {
    pb::TxnRequest read;
    lock::AddSnapshotReads("default", a->id(), "revived", read.mutable_success());
    auto r = cluster_->etcd_client().TxnSync(read, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(r.ok()) << r.status();
    auto snap = lock::ParseSnapshot(r->header(), r->responses());
    EXPECT_TRUE(snap.ok()) << snap.status();
    EXPECT_EQ(snap->waiters.size(), 1u);
    pb::TxnRequest txn;
    auto result = lock::Engine::AddHandOver(*snap, "default", "revived", a->id(),
                                            /*grants_allowed=*/true, /*on_read=*/true,
                                            now_ms, &txn);
    EXPECT_EQ(result.gone, std::vector<int64_t>{b->id()});  // planned as dead
    EXPECT_TRUE(result.granted.empty());
    return txn;
  };
  auto waiter_left = [&] {
    pb::RangeRequest r;
    r.set_key(keyspace::WaitKey("default", "revived", b->id()));
    return cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)))->kvs_size();
  };

  pb::TxnRequest stale = build();
  ASSERT_TRUE(put_waiter(now_ms + 60'000).ok());  // taken over in place: alive
  auto t = cluster_->etcd_client().TxnSync(stale, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->succeeded()) << "a live waiter was removed as dead";
  EXPECT_EQ(waiter_left(), 1);

  // Dead as read and still dead at the commit: removed.
  ASSERT_TRUE(put_waiter(now_ms - 1000).ok());
  auto fresh = cluster_->etcd_client().TxnSync(build(), etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->succeeded());
  EXPECT_EQ(waiter_left(), 0);
}

// A class created between a release's read and its commit (one of a longer
// prefix, which now decides the key: its mode, TTL bounds, enforcement) fails the
// hand-over planned on that read; the release then decides again on a fresh one.
// The hand-over's transaction, as the engine builds it from the read, is
// committed on real etcd after the class is created.
TEST_F(QueueTest, AHandOverPlannedBeforeAClassWasCreatedDoesNotCommit) {
  auto a = Open(), b = Open();
  auto hold = a->Acquire("db/k");
  ASSERT_TRUE(hold.ok()) << hold.status();
  AcquireOptions o;
  o.wait = seconds(30);
  auto waiting = std::async(std::launch::async, [&] { return b->Acquire("db/k", o); });
  DescribeUntil("db/k", [](auto& d) { return d.waiters_size() == 1; });
  const pb::TxnRequest txn = PlanHandOver(*a, *b, "db/k");

  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("db");
  cls.set_key_prefix("db/");
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto t = cluster_->etcd_client().TxnSync(txn, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->succeeded()) << "a hand-over decided under the class before committed";

  // The release itself goes on and hands the key over under the new class.
  ASSERT_TRUE(hold->Release().ok());
  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info().class_id(), "db");
}

// The same for the namespace record (its members decide whom a hand-over may
// grant): a hand-over planned on a read, with the record changed before it
// commits, does not commit; the release then decides on a fresh read.
TEST_F(QueueTest, AHandOverPlannedBeforeTheNamespaceChangedDoesNotCommit) {
  auto a = Open(), b = Open();
  auto hold = a->Acquire("db/n");
  ASSERT_TRUE(hold.ok()) << hold.status();
  AcquireOptions o;
  o.wait = seconds(30);
  auto waiting = std::async(std::launch::async, [&] { return b->Acquire("db/n", o); });
  DescribeUntil("db/n", [](auto& d) { return d.waiters_size() == 1; });
  const pb::TxnRequest txn = PlanHandOver(*a, *b, "db/n");

  v1::UpdateNamespaceRequest update;
  update.set_name("default");
  update.set_op_rate_quota(100000);
  ASSERT_TRUE(client_->UpdateNamespace(update).ok());
  auto t = cluster_->etcd_client().TxnSync(txn, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->succeeded()) << "a hand-over planned on the namespace record before committed";

  ASSERT_TRUE(hold->Release().ok());
  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status();
}

// More dead waiters ahead than one transaction may remove (each costs two
// compares and two deletes; etcd's --max-txn-ops is 128) are taken out in
// batches before the grant, whether a newcomer finds them or a live waiter
// behind them is woken by a release. Such a queue is left by a replica that died
// with many waits on one key whose callers did not ask again.
TEST_F(QueueTest, MoreDeadWaitersThanOneTransactionRemovesAreClearedBeforeTheGrant) {
  constexpr int kDead = 100;
  std::vector<std::unique_ptr<Session>> dead_sessions;
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  auto put_dead = [&](const std::string& key) {
    for (const auto& s : dead_sessions) {
      records::WaiterRecord w;
      w.set_deadline_unix_ms(now_ms - 1000);
      w.set_identity("spiffe://holdfast.dev/dev");
      pb::PutRequest put;
      put.set_key(keyspace::WaitKey("default", key, s->id()));
      put.set_value(w.SerializeAsString());
      put.set_lease(s->id());
      ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
    }
  };
  auto waiters_left = [&](const std::string& key) {
    pb::RangeRequest r;
    r.set_key(keyspace::WaitRangeBegin("default", key));
    r.set_range_end(keyspace::WaitRangeEnd("default", key));
    r.set_count_only(true);
    return cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)))->count();
  };
  for (int i = 0; i < kDead; ++i) dead_sessions.push_back(Open());

  // A newcomer, trying once, finds the free key behind them.
  put_dead("crowd");
  ASSERT_EQ(waiters_left("crowd"), kDead);
  auto c = Open();
  auto tried = c->Acquire("crowd");
  ASSERT_TRUE(tried.ok()) << tried.status();
  EXPECT_EQ(waiters_left("crowd"), 0);
  EXPECT_EQ(DescribeUntil("crowd", [](auto& d) { return d.holders_size() == 1; })
                .holders(0)
                .session_id(),
            c->id());

  // A live waiter queued behind them while the key is held is granted at the release.
  auto h = Open();
  auto held = h->Acquire("behind");
  ASSERT_TRUE(held.ok()) << held.status();
  put_dead("behind");
  auto w = Open();
  AcquireOptions thirty_s;
  thirty_s.wait = seconds(30);
  auto waited = std::async(std::launch::async, [&] { return w->Acquire("behind", thirty_s); });
  for (auto until = std::chrono::steady_clock::now() + seconds(20);
       waiters_left("behind") < kDead + 1 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(waiters_left("behind"), kDead + 1);
  ASSERT_TRUE(held->Release().ok());
  auto got = waited.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(waiters_left("behind"), 0);
}
TEST_F(QueueTest, TwentyWaitersAreGrantedInQueueOrder) {
  constexpr int kWaiters = 20;
  auto holder = Open();
  auto first = holder->Acquire("fifo");
  ASSERT_TRUE(first.ok());
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < kWaiters; ++i) sessions.push_back(Open());
  std::mutex mu;
  std::vector<std::pair<int, int64_t>> granted;  // (waiter index, token) in grant order
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      auto h = sessions[i]->Acquire("fifo", testing::Waiting(seconds(60)));
      ASSERT_TRUE(h.ok()) << h.status();
      {
        std::lock_guard<std::mutex> l(mu);
        granted.emplace_back(i, h->token());
      }
      ASSERT_TRUE(h->Release().ok());
    });
    // Queue them in a known order: the next joins once this one is in the queue.
    DescribeUntil("fifo", [&](const v1::DescribeResponse& d) { return d.waiters_size() == i + 1; });
  }
  auto queued = DescribeUntil("fifo", [&](auto& d) { return d.waiters_size() == kWaiters; });
  for (int i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(queued.waiters(i).session_id(), sessions[i]->id()) << "queue position " << i;
  }
  ASSERT_TRUE(first->Release().ok());
  for (auto& t : threads) t.join();
  ASSERT_EQ(granted.size(), static_cast<size_t>(kWaiters));
  int64_t last = first->token();
  for (int i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(granted[i].first, i) << "grant " << i;
    EXPECT_GT(granted[i].second, last);
    last = granted[i].second;
  }
}

TEST_F(QueueTest, AWaiterPastItsDeadlineIsSkippedAndNeverGranted) {
  auto a = Open(), b = Open(), c = Open();
  auto held = a->Acquire("k");
  ASSERT_TRUE(held.ok());
  auto short_wait = std::async(std::launch::async, [&] { return b->Acquire("k", testing::Waiting(milliseconds(500))); });
  DescribeUntil("k", [](auto& d) { return d.waiters_size() == 1; });
  auto long_wait = std::async(std::launch::async, [&] { return c->Acquire("k", testing::Waiting(seconds(30))); });
  DescribeUntil("k", [](auto& d) { return d.waiters_size() == 2; });
  auto hb = short_wait.get();
  ASSERT_FALSE(hb.ok());
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(hb.status().message().find("was not granted within 500ms (blocked by session"),
            std::string::npos)
      << hb.status();
  auto d = DescribeUntil("k", [](auto& d) { return d.waiters_size() == 1; });
  EXPECT_EQ(d.waiters(0).session_id(), c->id());  // b left the queue
  ASSERT_TRUE(held->Release().ok());
  auto hc = long_wait.get();
  ASSERT_TRUE(hc.ok()) << hc.status();
  auto after = client_->Describe("default", "k");
  ASSERT_EQ(after->holders_size(), 1);
  EXPECT_EQ(after->holders(0).session_id(), c->id());
}

TEST_F(QueueTest, ReadersShareWhileAWriterWaitsAndLateReadersQueueBehindIt) {
  auto r1 = Open(), w = Open(), r2 = Open(), r3 = Open();
  auto h1 = r1->Acquire("doc", testing::Waiting(milliseconds(0), true));
  ASSERT_TRUE(h1.ok());
  auto h3 = r3->Acquire("doc", testing::Waiting(milliseconds(0), true));  // readers share
  ASSERT_TRUE(h3.ok());
  auto writer = std::async(std::launch::async, [&] { return w->Acquire("doc", testing::Waiting(seconds(30))); });
  DescribeUntil("doc", [](auto& d) { return d.waiters_size() == 1; });
  auto late = std::async(std::launch::async, [&] { return r2->Acquire("doc", testing::Waiting(seconds(30), true)); });
  auto q = DescribeUntil("doc", [](auto& d) { return d.waiters_size() == 2; });
  EXPECT_EQ(q.waiters(0).session_id(), w->id());
  EXPECT_FALSE(q.waiters(0).shared());
  EXPECT_EQ(q.waiters(1).session_id(), r2->id());
  EXPECT_TRUE(q.waiters(1).shared());
  ASSERT_TRUE(h1->Release().ok());
  EXPECT_EQ(writer.wait_for(milliseconds(300)), std::future_status::timeout);  // r3 still reads
  ASSERT_TRUE(h3->Release().ok());
  auto hw = writer.get();
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(late.wait_for(milliseconds(300)), std::future_status::timeout);  // behind the writer
  ASSERT_TRUE(hw->Release().ok());
  auto hr2 = late.get();
  ASSERT_TRUE(hr2.ok()) << hr2.status();
  EXPECT_TRUE(hr2->info().shared());
  EXPECT_GT(hr2->token(), hw->token());
}

TEST_F(QueueTest, ReleaseHandsOverInTheSameCommit) {
  auto a = Open(), b = Open(), c = Open();
  AcquireOptions shared = testing::Waiting(milliseconds(0));
  auto ha = a->Acquire("h");
  ASSERT_TRUE(ha.ok());
  auto wb = std::async(std::launch::async, [&] { return b->Acquire("h", testing::Waiting(seconds(30), true)); });
  DescribeUntil("h", [](auto& d) { return d.waiters_size() == 1; });
  auto wc = std::async(std::launch::async, [&] { return c->Acquire("h", testing::Waiting(seconds(30), true)); });
  DescribeUntil("h", [](auto& d) { return d.waiters_size() == 2; });
  // Watch the key's holds from now on, to see the release's revision. The state
  // the watch writes is shared with it: a callback may still run after Cancel.
  struct Seen {
    std::mutex mu;
    std::vector<mvccpb::Event> events;
  };
  auto seen = std::make_shared<Seen>();
  etcd::WatchSpec spec;
  spec.key = keyspace::HoldRangeBegin("default", "h");
  spec.range_end = keyspace::HoldRangeEnd("default", "h");
  spec.start_revision = Revision() + 1;
  const etcd::WatchId watch =
      cluster_->etcd_client().watches().Watch(spec, [seen](absl::StatusOr<etcd::WatchBatch> batch) {
        if (!batch.ok()) return;
        std::lock_guard<std::mutex> l(seen->mu);
        for (auto& e : batch->events) seen->events.push_back(e);
      });
  ASSERT_TRUE(ha->Release().ok());
  auto hb = wb.get();
  auto hc = wc.get();
  ASSERT_TRUE(hb.ok() && hc.ok());
  std::vector<mvccpb::Event> events;
  auto until = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard<std::mutex> l(seen->mu);
      events = seen->events;
    }
    if (events.size() >= 3) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  cluster_->etcd_client().watches().Cancel(watch);
  ASSERT_GE(events.size(), 3u);
  ASSERT_EQ(events[0].type(), mvccpb::Event::DELETE);  // a's hold
  const int64_t release_rev = events[0].kv().mod_revision();
  // Both shared waiters at the head were granted by the releasing commit.
  EXPECT_EQ(hb->info().grant_revision(), release_rev);
  EXPECT_EQ(hc->info().grant_revision(), release_rev);
  EXPECT_NE(hb->token(), 0);
}

TEST_F(QueueTest, KilledHolderWithFiveWaitersGoesToTheHeadOnly) {
  auto log = cluster_->dir() + "/holder.log";
  dev::SpawnOptions so;
  so.argv = {testing::BinDir() + "/hf_test_holder", cluster_->endpoint(), "default", "jobs/x",
             "2000"};
  so.log_file = log;
  auto holder = dev::Subprocess::Spawn(so);
  ASSERT_TRUE(holder.ok());
  DescribeUntil("jobs/x", [](auto& d) { return d.holders_size() == 1; });
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::future<absl::StatusOr<Hold>>> waits;
  for (int i = 0; i < 5; ++i) {
    sessions.push_back(Open());
    Session* s = sessions.back().get();
    waits.push_back(std::async(std::launch::async, [s] { return s->Acquire("jobs/x", testing::Waiting(seconds(60))); }));
    DescribeUntil("jobs/x", [&](auto& d) { return d.waiters_size() == i + 1; });
  }
  (*holder)->Signal(SIGKILL);
  (*holder)->Wait();
  auto head = waits[0].get();  // after the lease expires
  ASSERT_TRUE(head.ok()) << head.status();
  auto d = DescribeUntil("jobs/x", [](auto& d) { return d.holders_size() == 1 && d.waiters_size() == 4; });
  EXPECT_EQ(d.holders(0).session_id(), sessions[0]->id());
  for (int i = 1; i < 5; ++i) {
    EXPECT_EQ(d.waiters(i - 1).session_id(), sessions[i]->id());
    EXPECT_EQ(waits[i].wait_for(milliseconds(0)), std::future_status::timeout);
  }
  ASSERT_TRUE(head->Release().ok());
  for (int i = 1; i < 5; ++i) {
    auto h = waits[i].get();
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
}

TEST_F(QueueTest, RetriedAcquireKeepsItsPlaceAndNeverQueuesTwice) {
  auto a = Open(), b = Open(), c = Open();
  auto held = a->Acquire("r");
  ASSERT_TRUE(held.ok());
  auto first = std::async(std::launch::async, [&] { return b->Acquire("r", testing::Waiting(seconds(30))); });
  DescribeUntil("r", [](auto& d) { return d.waiters_size() == 1; });
  auto behind = std::async(std::launch::async, [&] { return c->Acquire("r", testing::Waiting(seconds(30))); });
  auto q1 = DescribeUntil("r", [](auto& d) { return d.waiters_size() == 2; });
  // The same session asks again (a retry): same place, still two waiters.
  // The retry asks for a later deadline, which the waiter record takes in place.
  auto retry = std::async(std::launch::async, [&] { return b->Acquire("r", testing::Waiting(seconds(40))); });
  auto q2 = DescribeUntil("r", [&](auto& d) {
    return d.waiters_size() > 0 &&
           d.waiters(0).deadline_unix_ms() > q1.waiters(0).deadline_unix_ms();
  });
  ASSERT_EQ(q2.waiters_size(), 2);
  EXPECT_EQ(q2.waiters(0).session_id(), b->id());
  EXPECT_EQ(q2.waiters(0).create_revision(), q1.waiters(0).create_revision());
  ASSERT_TRUE(held->Release().ok());
  auto h1 = first.get();
  auto h2 = retry.get();
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_EQ(h1->token(), h2->token());  // one hold, seen by both calls
  ASSERT_TRUE(h1->Release().ok());
  (void)h2->Release();
  auto hc = behind.get();
  ASSERT_TRUE(hc.ok()) << hc.status();
}

TEST_F(QueueTest, ACancelledWaiterLeavesNoWaiterBehind) {
  auto a = Open(), b = Open();
  auto held = a->Acquire("c");
  ASSERT_TRUE(held.ok());
  auto wait = StartRawWait(b->id(), "c");
  DescribeUntil("c", [](auto& d) { return d.waiters_size() == 1; });
  wait->ctx.TryCancel();
  ASSERT_EQ(wait->result.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(wait->result.get().error_code(), grpc::StatusCode::CANCELLED);
  DescribeUntil("c", [](auto& d) { return d.waiters_size() == 0; });
  EXPECT_EQ(client_->Describe("default", "c")->holders(0).session_id(), a->id());
}

// Two waits of one session on one key: the second, refused for its own request
// (shared asked in a class of mode X), leaves the first one's place in the
// queue, which is then granted first, ahead of a session that queued after it.
TEST_F(QueueTest, ARefusedSecondWaitOfASessionLeavesTheFirstOnesPlace) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("excl");
  cls.set_key_prefix("x/");
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto a = Open(), b = Open(), c = Open();
  auto held = a->Acquire("x/k");
  ASSERT_TRUE(held.ok()) << held.status();
  AcquireOptions long_wait;
  long_wait.wait = seconds(60);
  auto first = std::async(std::launch::async, [&] { return b->Acquire("x/k", long_wait); });
  auto queued = DescribeUntil("x/k", [](auto& d) { return d.waiters_size() == 1; });
  ASSERT_EQ(queued.waiters_size(), 1);
  const int64_t place = queued.waiters(0).create_revision();

  AcquireOptions shared = long_wait;
  shared.shared = true;
  auto refused = b->Acquire("x/k", shared);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();

  auto behind = std::async(std::launch::async, [&] { return c->Acquire("x/k", long_wait); });
  auto d = DescribeUntil("x/k", [](auto& d) { return d.waiters_size() == 2; });
  ASSERT_EQ(d.waiters_size(), 2);
  EXPECT_EQ(d.waiters(0).session_id(), b->id());
  EXPECT_EQ(d.waiters(0).create_revision(), place);
  EXPECT_EQ(d.waiters(1).session_id(), c->id());

  ASSERT_TRUE(held->Release().ok());
  auto granted = first.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(behind.wait_for(seconds(0)), std::future_status::timeout);
  ASSERT_TRUE(granted->Release().ok());
  auto last = behind.get();
  ASSERT_TRUE(last.ok()) << last.status();
}

// A class of mode X created over a key while shared waiters queue under the
// catch-all class of mode S: the release does not hand them the key together
// (two holders of a class that promises one). Each decides on its own read, is
// refused as a shared ask of an exclusive class, and leaves; an exclusive waiter
// behind them is granted.
TEST_F(QueueTest, SharedWaitersAreNotHandedAKeyThatAnExclusiveClassNowCovers) {
  auto h = Open(), a = Open(), b = Open(), c = Open();
  auto held = h->Acquire("db/k");
  ASSERT_TRUE(held.ok()) << held.status();
  AcquireOptions shared;
  shared.wait = seconds(30);
  shared.shared = true;
  AcquireOptions exclusive;
  exclusive.wait = seconds(30);
  auto first = std::async(std::launch::async, [&] { return a->Acquire("db/k", shared); });
  DescribeUntil("db/k", [](auto& d) { return d.waiters_size() == 1; });
  auto second = std::async(std::launch::async, [&] { return b->Acquire("db/k", shared); });
  DescribeUntil("db/k", [](auto& d) { return d.waiters_size() == 2; });
  auto last = std::async(std::launch::async, [&] { return c->Acquire("db/k", exclusive); });
  DescribeUntil("db/k", [](auto& d) { return d.waiters_size() == 3; });

  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("dbx");
  cls.set_key_prefix("db/");
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  ASSERT_TRUE(held->Release().ok());

  for (auto* f : {&first, &second}) {
    auto got = f->get();
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_NE(got.status().message().find("is exclusive (mode X)"), std::string::npos)
        << got.status();
  }
  auto granted = last.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  auto d = client_->Describe("default", "db/k");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), c->id());
  EXPECT_EQ(d->waiters_size(), 0);
}

// The same for a class's TTL bounds: a class created while sessions waited under
// the catch-all class bounds their TTL to 20 s - 60 s. The waiter at the head,
// of a 10 s session, is not handed the key; its call is refused as a new ask
// would be, and it leaves the queue; the one behind it, of a 30 s session, gets
// the key.
TEST_F(QueueTest, AWaiterIsNotHandedAKeyWhoseNewClassBoundsItsSessionsTtl) {
  auto h = Open(), a = Open(), c = Open(seconds(30));
  auto held = h->Acquire("pol/k");
  ASSERT_TRUE(held.ok()) << held.status();
  AcquireOptions wait;
  wait.wait = seconds(30);
  auto first = std::async(std::launch::async, [&] { return a->Acquire("pol/k", wait); });
  DescribeUntil("pol/k", [](auto& d) { return d.waiters_size() == 1; });
  auto second = std::async(std::launch::async, [&] { return c->Acquire("pol/k", wait); });
  DescribeUntil("pol/k", [](auto& d) { return d.waiters_size() == 2; });

  CreateLongSessionsClass();
  ASSERT_TRUE(held->Release().ok());

  auto refused = first.get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "session ttl 10000ms is outside the bounds of class \"long\": [20000ms, 60000ms]"),
            std::string::npos)
      << refused.status();
  auto granted = second.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  auto d = client_->Describe("default", "pol/k");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), c->id());
  EXPECT_EQ(d->holders(0).class_id(), "long");
  EXPECT_EQ(d->waiters_size(), 0);
}

// A raw caller whose deadline comes before its wait_ms (here 2 s against 60 s):
// the wait ends before the deadline, so the caller hears holdfastd's
// DEADLINE_EXCEEDED, and the waiter has left the queue by then; it is not left
// queued for a caller that gave up, to be handed the key later.
TEST_F(QueueTest, AWaitLongerThanItsCallsDeadlineEndsBeforeItAndLeavesNoWaiter) {
  auto a = Open(), b = Open();
  auto held = a->Acquire("c");
  ASSERT_TRUE(held.ok());
  auto stub = v1::Lock::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(2));
  v1::AcquireRequest req;
  req.set_namespace_("default");
  req.set_session_id(b->id());
  req.set_lock_key("c");
  req.set_wait_ms(60'000);
  v1::AcquireResponse resp;
  grpc::Status st = stub->Acquire(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(st.error_message().find("\"c\" was not granted within "), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("cut to end before the call's deadline"), std::string::npos)
      << st.error_message();
  auto d = client_->Describe("default", "c");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->waiters_size(), 0);
  ASSERT_TRUE(held->Release().ok());
  d = client_->Describe("default", "c");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0);
}

// The same acquire asked twice on one session (a first attempt whose answer was
// lost, asked again): the second takes the waiter over in place (same create
// revision, a new mod revision), and the first one's cancel, 2 s later, leaves
// it: the session keeps its place ahead of the waiter that came after it.
TEST_F(QueueTest, AWaitAskedAgainTakesItsWaiterOverAndTheFirstOnesCancelLeavesIt) {
  auto a = Open(), b = Open(), c = Open();
  auto held = a->Acquire("c");
  ASSERT_TRUE(held.ok());
  auto first = StartRawWait(b->id(), "c");
  auto queued = DescribeUntil("c", [](auto& d) { return d.waiters_size() == 1; });
  ASSERT_EQ(queued.waiters_size(), 1);
  const int64_t place = queued.waiters(0).create_revision();
  const std::string wait_key = keyspace::WaitKey("default", "c", b->id());
  auto mod_of_waiter = [&]() -> int64_t {
    pb::RangeRequest r;
    r.set_key(wait_key);
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() && got->kvs_size() == 1 ? got->kvs(0).mod_revision() : 0;
  };
  const int64_t first_mod = mod_of_waiter();
  ASSERT_GT(first_mod, 0);

  // Asked again (through libholdfast: the same session, key and wait).
  AcquireOptions w;
  w.wait = seconds(60);
  auto again = std::async(std::launch::async, [&] { return b->Acquire("c", w); });
  for (int i = 0; i < 1000 && mod_of_waiter() == first_mod; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_NE(mod_of_waiter(), first_mod);  // put again in place
  auto behind = std::async(std::launch::async, [&] { return c->Acquire("c", w); });
  DescribeUntil("c", [](auto& d) { return d.waiters_size() == 2; });

  first->ctx.TryCancel();
  ASSERT_EQ(first->result.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(first->result.get().error_code(), grpc::StatusCode::CANCELLED);
  std::this_thread::sleep_for(seconds(3));  // past the cancel's 2 s
  auto d = client_->Describe("default", "c");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->waiters_size(), 2);
  EXPECT_EQ(d->waiters(0).session_id(), b->id());
  EXPECT_EQ(d->waiters(0).create_revision(), place);
  EXPECT_EQ(d->waiters(1).session_id(), c->id());

  ASSERT_TRUE(held->Release().ok());
  auto granted = again.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(behind.wait_for(seconds(0)), std::future_status::timeout);
  ASSERT_TRUE(granted->Release().ok());
  auto last = behind.get();
  ASSERT_TRUE(last.ok()) << last.status();
}

// A wait out of range is refused, whatever its size, and nothing is written.
TEST_F(QueueTest, AWaitOutOfRangeIsRefusedAndChangesNothing) {
  auto a = Open();
  const int64_t rev = Revision();
  for (auto wait : {std::chrono::milliseconds::max(), milliseconds(-1),
                    milliseconds(3600 * 1000 + 1)}) {
    auto h = a->Acquire("w", testing::Waiting(wait));
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << wait.count() << ": "
                                                                      << h.status();
    EXPECT_NE(h.status().message().find("ms is outside [0, 3600000ms]"), std::string::npos)
        << h.status();
  }
  // Straight through gRPC too (libholdfast passes the wait on as asked).
  auto channel = grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials());
  auto stub = v1::Lock::NewStub(channel);
  for (int64_t wait : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    v1::AcquireRequest req;
    req.set_namespace_("default");
    req.set_session_id(a->id());
    req.set_lock_key("w");
    req.set_wait_ms(wait);
    v1::AcquireResponse resp;
    auto s = stub->Acquire(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << wait << ": "
                                                                  << s.error_message();
  }
  EXPECT_EQ(Revision(), rev);
}

TEST_F(QueueTest, SessionCloseLeavesNoWaiter) {
  auto a = Open(), b = Open();
  auto held = a->Acquire("s");
  ASSERT_TRUE(held.ok());
  auto w = std::async(std::launch::async, [&] { return b->Acquire("s", testing::Waiting(seconds(30))); });
  DescribeUntil("s", [](auto& d) { return d.waiters_size() == 1; });
  ASSERT_TRUE(b->Close().ok());
  DescribeUntil("s", [](auto& d) { return d.waiters_size() == 0; });
  auto r = w.get();
  EXPECT_FALSE(r.ok());
}

TEST_F(QueueTest, ClassPolicyIsShownAndAClassWithHoldsCannotBeDeleted) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("adv");
  cls.set_key_prefix("adv/");
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  cls.set_enforcement(v1::ENFORCEMENT_ADVISORY);
  cls.set_on_quorum_loss(v1::ON_QUORUM_LOSS_OPEN);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto a = Open();
  auto h = a->Acquire("adv/job");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->info().class_id(), "adv");
  EXPECT_EQ(h->info().enforcement(), v1::ENFORCEMENT_ADVISORY);
  EXPECT_EQ(h->info().on_quorum_loss(), v1::ON_QUORUM_LOSS_OPEN);
  EXPECT_GT(h->info().granted_at_unix_ms(), 0);
  int64_t rev = Revision();
  auto del = client_->DeleteClass("default", "adv");
  EXPECT_EQ(del.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(del.message().find("has 1 hold(s)"), std::string::npos) << del;
  EXPECT_EQ(Revision(), rev);
  ASSERT_TRUE(h->Release().ok());
  EXPECT_TRUE(client_->DeleteClass("default", "adv").ok());
}

// A waiter that wakes to a refusal (here a class created meanwhile whose TTL
// bounds exclude its session) leaves the queue before it answers. Left there, it
// would stand at the head of a free key: the next caller would queue behind it
// until its wait ran out, and a release would hand the lock to a call that had
// already answered.
TEST_F(QueueTest, AWaiterRefusedWhenItWakesLeavesTheQueue) {
  auto a = Open(seconds(10));
  auto b = Open(seconds(10));
  auto h = a->Acquire("pol/job");
  ASSERT_TRUE(h.ok()) << h.status();
  auto w = std::async(std::launch::async,
                      [&] { return b->Acquire("pol/job", testing::Waiting(seconds(30))); });
  DescribeUntil("pol/job", [](auto& d) { return d.waiters_size() == 1; });
  CreateLongSessionsClass();
  // The hold ends without a hand-over (its lease revoked straight on etcd), so the
  // waiter wakes, reads, and meets the new class.
  pb::LeaseRevokeRequest revoke;
  revoke.set_id(a->id());
  ASSERT_TRUE(etcd::Await<pb::LeaseRevokeResponse>([&](auto cb) {
                cluster_->etcd_client().LeaseRevoke(revoke, etcd::DeadlineIn(seconds(5)), cb);
              }).ok());
  auto r = w.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("outside the bounds of class \"long\""),
            std::string::npos)
      << r.status();
  auto d = client_->Describe("default", "pol/job");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->waiters_size(), 0) << d->DebugString();
  EXPECT_EQ(d->holders_size(), 0) << d->DebugString();
  // The key is free for a session the class admits, at once.
  auto c = Open(seconds(30));
  auto got = c->Acquire("pol/job");
  EXPECT_TRUE(got.ok()) << got.status();
}

// A hold the session has is returned by a second Acquire of the key even when the
// policy would refuse a new grant now: the caller can still see and release it.
// A new grant to that session is refused.
TEST_F(QueueTest, AHeldKeyIsReturnedWhateverThePolicySaysNow) {
  auto a = Open(seconds(10));
  auto h = a->Acquire("pol/held");
  ASSERT_TRUE(h.ok()) << h.status();
  CreateLongSessionsClass();
  auto again = a->Acquire("pol/held");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->token(), h->token());
  auto fresh = a->Acquire("pol/other");
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kInvalidArgument) << fresh.status();
  EXPECT_TRUE(h->Release().ok());
}

// Two replicas, 50 sessions, 5 keys, random exclusive and shared acquires and
// releases for a while: from etcd's own history, no exclusive hold ever overlaps
// another hold of its key, and each key's grants come in increasing token order.
TEST(QueueReplicasTest, RandomWorkloadNeverOverlapsExclusiveHolds) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto& c = **cluster;
  ASSERT_TRUE(c.CreateNamespace("default").ok());
  pb::RangeRequest probe;
  probe.set_key("/");
  auto start = c.etcd_client().RangeSync(probe, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(start.ok());

  // Shared with the watch: a callback may still run after this test's locals end.
  struct Seen {
    std::mutex mu;
    std::vector<mvccpb::Event> events;
  };
  auto seen = std::make_shared<Seen>();
  etcd::WatchSpec spec;
  spec.key = "/holdfast/ns/default/hold/";
  spec.range_end = keyspace::PrefixEnd(spec.key);
  spec.start_revision = start->header().revision() + 1;
  const etcd::WatchId watch =
      c.etcd_client().watches().Watch(spec, [seen](absl::StatusOr<etcd::WatchBatch> b) {
        if (!b.ok()) return;
        std::lock_guard<std::mutex> l(seen->mu);
        for (auto& e : b->events) seen->events.push_back(e);
      });

  constexpr int kSessions = 50;
  constexpr int kKeys = 5;
  const auto run_for = seconds(30);
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) clients.push_back(std::move(*c.NewClient(r)));
  std::atomic<int> grants{0}, errors{0};
  auto stop_at = std::chrono::steady_clock::now() + run_for;
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(1000 + i);
      SessionOptions so;
      so.ttl = seconds(10);
      auto s = clients[i % 2]->OpenSession("default", so);
      if (!s.ok()) {
        errors++;
        return;
      }
      for (int n = 0; n < 10'000 && std::chrono::steady_clock::now() < stop_at; ++n) {
        std::string key = absl::StrCat("k", rng() % kKeys);
        AcquireOptions ao;
        ao.shared = rng() % 3 == 0;
        ao.wait = milliseconds(rng() % 2 == 0 ? 0 : 200 + rng() % 2000);
        auto h = (*s)->Acquire(key, ao);
        if (h.ok()) {
          grants++;
          std::this_thread::sleep_for(milliseconds(rng() % 20));
          if (!h->Release().ok()) errors++;
        } else if (h.status().code() != absl::StatusCode::kAborted &&
                   h.status().code() != absl::StatusCode::kDeadlineExceeded) {
          ADD_FAILURE() << h.status();
          errors++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(grants.load(), 100);
  auto end = c.etcd_client().RangeSync(probe, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(end.ok());
  const int64_t last = end->header().revision();
  std::vector<mvccpb::Event> events;
  auto until = std::chrono::steady_clock::now() + seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard<std::mutex> l(seen->mu);
      events = seen->events;
    }
    if (!events.empty() && events.back().kv().mod_revision() >= last) break;
    if (events.size() >= static_cast<size_t>(2 * grants.load())) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  c.etcd_client().watches().Cancel(watch);
  // Replay: per key, the live holds and whether each is shared.
  std::map<std::string, std::map<std::string, bool>> live;
  std::map<std::string, int64_t> last_grant;
  int puts = 0;
  for (const auto& e : events) {
    auto parsed = keyspace::ParseHoldKey(e.kv().key());
    ASSERT_TRUE(parsed.has_value());
    auto& holds = live[parsed->lock_key];
    if (e.type() == mvccpb::Event::PUT) {
      ++puts;
      records::HoldRecord rec;
      ASSERT_TRUE(rec.ParseFromString(e.kv().value()));
      holds[e.kv().key()] = rec.shared();
      EXPECT_GE(e.kv().create_revision(), last_grant[parsed->lock_key]);
      last_grant[parsed->lock_key] = e.kv().create_revision();
      if (holds.size() > 1) {
        for (const auto& [k, shared] : holds) {
          EXPECT_TRUE(shared) << "exclusive hold overlaps another at revision "
                              << e.kv().mod_revision() << " on " << parsed->lock_key;
        }
      }
    } else {
      holds.erase(e.kv().key());
    }
  }
  EXPECT_GE(puts, grants.load());
}


// A release plans its hand-over on its replica's view of the queue, without a
// read (engine.cc, ReleaseAttempt). Here that view is stale: its head waiter was
// removed behind the replica's back (as another replica removes a dead waiter).
// The release's compares fail and it decides on a fresh read: the key goes to
// the real head, and the removed waiter's session never holds it.
TEST(QueueReplicasTest, AReleasePlannedOnAStaleViewHandsTheKeyToTheRealHead) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  auto started = testing::TestCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  auto& c = **started;
  ASSERT_TRUE(c.CreateNamespace("default").ok());
  auto client = c.NewClient(0);
  ASSERT_TRUE(client.ok());
  SessionOptions so;
  so.ttl = seconds(10);
  auto a = (*client)->OpenSession("default", so);
  auto b = (*client)->OpenSession("default", so);
  auto d = (*client)->OpenSession("default", so);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  auto held = (*a)->Acquire("stale");
  ASSERT_TRUE(held.ok()) << held.status();

  // B waits with no call behind it (its replica gone): a waiter key on B's lease.
  const std::string b_wait = keyspace::WaitKey("default", "stale", (*b)->id());
  records::WaiterRecord rec;
  rec.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Minutes(5)));
  rec.set_identity("spiffe://test.holdfast/ops/someone");
  pb::TxnRequest put;
  auto* p = put.add_success()->mutable_request_put();
  p->set_key(b_wait);
  p->set_value(rec.SerializeAsString());
  p->set_lease((*b)->id());
  ASSERT_TRUE(c.etcd_client().TxnSync(put, etcd::DeadlineIn(seconds(5))).ok());

  // D queues behind B through replica 0, whose read shows [B, D].
  auto waiting =
      std::async(std::launch::async, [&] { return (*d)->Acquire("stale", testing::Waiting(seconds(30))); });
  auto until = std::chrono::steady_clock::now() + seconds(20);
  int waiters = 0;
  while (std::chrono::steady_clock::now() < until && waiters < 2) {
    auto desc = (*client)->Describe("default", "stale");
    waiters = desc.ok() ? desc->waiters_size() : 0;
    if (waiters < 2) std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(waiters, 2);
  std::this_thread::sleep_for(milliseconds(200));  // D's read is done: it watches B

  // B's waiter goes; at once, A releases through replica 0 (D looks again only
  // 50 ms after B's deletion, so replica 0's view still shows B at the head).
  pb::TxnRequest del;
  del.add_success()->mutable_request_delete_range()->set_key(b_wait);
  auto gone = c.etcd_client().TxnSync(del, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(gone.ok());
  ASSERT_TRUE(held->Release().ok());

  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(got->token(), held->token());
  auto desc = (*client)->Describe("default", "stale");
  ASSERT_TRUE(desc.ok());
  ASSERT_EQ(desc->holders_size(), 1);
  EXPECT_EQ(desc->holders(0).session_id(), (*d)->id());
  // B's session never held the key: no hold key of its lease in etcd's history.
  pb::RangeRequest hist;
  hist.set_key(keyspace::HoldKey("default", "stale", (*b)->id()));
  auto now_b = c.etcd_client().RangeSync(hist, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(now_b.ok());
  EXPECT_EQ(now_b->kvs_size(), 0);
  // Nor earlier: watch from B's removal over a range that ends with a marker key
  // written afterwards; once the marker's event arrives, every earlier one has.
  const std::string b_hold = keyspace::HoldKey("default", "stale", (*b)->id());
  const std::string marker = "/test/marker";
  // Shared with the watch: a callback may still run after this test's locals end.
  struct Seen {
    std::mutex mu;
    std::vector<std::string> b_events;
    bool marker_seen = false;
  };
  auto seen = std::make_shared<Seen>();
  etcd::WatchSpec spec;
  spec.key = b_hold;
  spec.range_end = marker + std::string(1, '\0');
  spec.start_revision = gone->header().revision();
  auto id = c.etcd_client().watches().Watch(
      spec, [seen, b_hold, marker](absl::StatusOr<etcd::WatchBatch> batch) {
        if (!batch.ok()) return;
        std::lock_guard<std::mutex> l(seen->mu);
        for (auto& e : batch->events) {
          if (e.kv().key() == b_hold) seen->b_events.push_back(e.DebugString());
          if (e.kv().key() == marker) seen->marker_seen = true;
        }
      });
  pb::PutRequest mark;
  mark.set_key(marker);
  ASSERT_TRUE(c.etcd_client().PutSync(mark, etcd::DeadlineIn(seconds(5))).ok());
  auto wait_until = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < wait_until) {
    {
      std::lock_guard<std::mutex> l(seen->mu);
      if (seen->marker_seen) break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  c.etcd_client().watches().Cancel(id);
  {
    std::lock_guard<std::mutex> l(seen->mu);
    ASSERT_TRUE(seen->marker_seen);
    EXPECT_TRUE(seen->b_events.empty())
        << "session B was handed the key: " << seen->b_events.front();
  }
  ASSERT_TRUE(got->Release().ok());
}

}  // namespace
}  // namespace holdfast
