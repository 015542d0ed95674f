// Limits a shared service needs against one greedy or hostile caller (ARCHITECTURE
// §9, §12): waiters per key, holds per session, message size and streams per
// connection. Each refused
// call must change nothing in etcd (checked by reading the key space before and
// after).
#include <atomic>
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "harness/cluster.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"
#include "lock/keyspace.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

class LimitsTest : public ::testing::Test {
 protected:
  // Small limits, so a test can reach them. libholdfast clients use a stream per
  // session for renewals: the streams test uses a raw channel of its own.
  virtual std::string Limits() const { return "limits:\n  max_waiters_per_key: 3\n"; }
  virtual int Replicas() const { return 1; }

  void SetUp() override {
    testing::TestCluster::Options o;
    o.extra_config = Limits();
    o.replicas = Replicas();
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
  }

  // Every key and value under /holdfast/ns/ (the audit mark and leader aside).
  std::map<std::string, std::string> Keys() {
    pb::RangeRequest r;
    r.set_key(keyspace::NamespacesBegin());
    r.set_range_end(keyspace::NamespacesEnd());
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    std::map<std::string, std::string> out;
    if (got.ok()) {
      for (const auto& kv : got->kvs()) out[kv.key()] = kv.value();
    }
    return out;
  }

  int64_t Waiters(const std::string& key) {
    pb::RangeRequest r;
    r.set_key(keyspace::WaitRangeBegin("default", key));
    r.set_range_end(keyspace::WaitRangeEnd("default", key));
    r.set_count_only(true);
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() ? got->count() : -1;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
};

TEST_F(LimitsTest, AFullQueueRefusesANewWaiterAndAddsNoKey) {
  auto client = std::move(*cluster_->NewClient());
  auto holder = std::move(*client->OpenSession("default"));
  auto hold = holder->Acquire("busy");
  ASSERT_TRUE(hold.ok());
  // Three waiters, each on its own client (its own connection: streams are
  // limited per connection too).
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(3);
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::move(*cluster_->NewClient()));
    sessions.push_back(std::move(*clients.back()->OpenSession("default")));
  }
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      AcquireOptions o;
      o.wait = seconds(30);
      results[i] = sessions[i]->Acquire("busy", o).status();
    });
  }
  for (int i = 0; i < 300 && Waiters("busy") < 3; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(Waiters("busy"), 3);

  auto before = Keys();
  auto late = std::move(*client->OpenSession("default"));
  before = Keys();  // with the late session's own key
  AcquireOptions wait5;
  wait5.wait = seconds(5);
  auto refused = late->Acquire("busy", wait5);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("max_waiters_per_key"), std::string::npos)
      << refused.status();
  EXPECT_EQ(Keys(), before);
  // Another key is not affected.
  EXPECT_TRUE(late->Acquire("elsewhere").ok());

  ASSERT_TRUE(hold->Release().ok());
  for (auto& t : threads) t.join();
  // The three waiters were served in turn (each releases when its Hold goes).
  for (const auto& r : results) EXPECT_TRUE(r.ok()) << r;
}

// Two replicas, each joining waiters behind the last one its view of the queue
// shows (lock/queue.h, JoinBehind) without reading the whole queue: the limit
// still holds for waits that come one after another, alternating between them.
// (A view misses the joins through the other replica since its last read; the
// commit of each join counts the queue it left.)
class TwoReplicaLimitsTest : public LimitsTest {
 protected:
  std::string Limits() const override { return "limits:\n  max_waiters_per_key: 5\n"; }
  int Replicas() const override { return 2; }
  // One holder of `key` (exclusive), then ten waits (shared or not) that come one
  // after another through the two replicas in turn: five are queued, five refused.
  void WaitThroughBothReplicas(const std::string& key, bool shared);
};

TEST_F(TwoReplicaLimitsTest, WaitsJoiningThroughBothReplicasStayWithinTheLimit) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared waits" : "exclusive waits");
    WaitThroughBothReplicas(shared ? "shared" : "busy", shared);
  }
}

void TwoReplicaLimitsTest::WaitThroughBothReplicas(const std::string& key, bool shared) {
  auto holder_client = std::move(*cluster_->NewClient(0));
  auto holder = std::move(*holder_client->OpenSession("default"));
  auto hold = holder->Acquire(key);
  ASSERT_TRUE(hold.ok()) << hold.status();
  constexpr int kCallers = 10;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < kCallers; ++i) {
    auto c = cluster_->NewClient(i % 2);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
    auto s = clients.back()->OpenSession("default");
    ASSERT_TRUE(s.ok()) << s.status();
    sessions.push_back(std::move(*s));
    // Known to its replica's views (a lock taken and given back).
    auto warm = sessions.back()->Acquire(absl::StrCat(key, "/warm/", i));
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE(warm->Release().ok());
  }
  std::vector<std::future<absl::StatusOr<Hold>>> waits;
  int refused = 0, most = 0;
  std::vector<int64_t> refused_sessions;
  for (int i = 0; i < kCallers; ++i) {
    const int64_t before = Waiters(key);
    waits.push_back(std::async(std::launch::async, [&, i] {
      AcquireOptions o;
      o.wait = seconds(30);
      o.shared = shared;
      return sessions[i]->Acquire(key, o);
    }));
    // Settled: answered (refused; a waiter put past the limit is taken out
    // before the answer), or queued (one more waiter, within the limit).
    for (int t = 0; t < 1000; ++t) {
      if (waits.back().wait_for(milliseconds(0)) == std::future_status::ready) break;
      const int64_t now = Waiters(key);
      if (now > before && now <= 5) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    most = std::max<int>(most, static_cast<int>(Waiters(key)));
    if (waits.back().wait_for(milliseconds(0)) == std::future_status::ready) {
      auto r = waits.back().get();
      waits.pop_back();
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << i << ": " << r.status();
      EXPECT_NE(r.status().message().find("max_waiters_per_key"), std::string::npos)
          << r.status();
      ++refused;
      refused_sessions.push_back(sessions[i]->id());
    }
  }
  EXPECT_LE(most, 5) << "the queue passed max_waiters_per_key";
  EXPECT_EQ(Waiters(key), 5);
  EXPECT_EQ(refused, kCallers - 5);
  // Nothing of a refused call stays: no waiter, no claim on the key.
  const auto keys = Keys();
  for (int64_t s : refused_sessions) {
    EXPECT_EQ(keys.count(keyspace::WaitKey("default", key, s)), 0u) << s;
    EXPECT_EQ(keys.count(keyspace::ClaimKey("default", key, s)), 0u) << s;
  }
  ASSERT_TRUE(hold->Release().ok());
  for (auto& w : waits) {
    auto r = w.get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
}

TEST_F(LimitsTest, AnOversizedMessageIsRefusedBeforeItReachesEtcd) {
  auto channel = grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials());
  auto sessions = v1::Session::NewStub(channel);
  auto before = Keys();
  v1::OpenSessionRequest req;
  req.set_namespace_("default");
  req.set_ttl_ms(5000);
  req.mutable_namespace_()->append(100 * 1024, 'x');  // far above max_message_bytes (64 KiB)
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  auto s = sessions->Open(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(Keys(), before);
}

class HoldsPerSessionTest : public LimitsTest {
 protected:
  std::string Limits() const override { return "limits:\n  max_holds_per_session: 3\n"; }

  // The session's claims (keys it holds or waits for) as etcd counts them.
  int64_t Claims(int64_t session) {
    pb::RangeRequest r;
    r.set_key(keyspace::ClaimPrefix("default", session));
    r.set_range_end(keyspace::PrefixEnd(keyspace::ClaimPrefix("default", session)));
    r.set_count_only(true);
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() ? got->count() : -1;
  }
};

TEST_F(HoldsPerSessionTest, AFourthLockIsRefusedAndChangesNothing) {
  auto client = std::move(*cluster_->NewClient());
  auto session = std::move(*client->OpenSession("default"));
  std::vector<Hold> holds;
  for (const char* key : {"a", "b", "c"}) {
    auto h = session->Acquire(key);
    ASSERT_TRUE(h.ok()) << h.status();
    holds.push_back(std::move(*h));
  }
  EXPECT_EQ(Claims(session->id()), 3);

  auto before = Keys();
  auto refused = session->Acquire("d");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("max_holds_per_session"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("already holds or waits for 3 locks"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(Keys(), before);

  // Asking again for a key it holds is not a new lock.
  auto again = session->Acquire("a");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->token(), holds[0].token());
  // Another session is not affected.
  auto other = std::move(*client->OpenSession("default"));
  EXPECT_TRUE(other->Acquire("d").ok());

  // One released, one more may be taken.
  ASSERT_TRUE(holds[1].Release().ok());
  EXPECT_EQ(Claims(session->id()), 2);
  auto e = session->Acquire("e");
  EXPECT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(Claims(session->id()), 3);
}

TEST_F(HoldsPerSessionTest, AQueuedWaitCountsAndLeavesNoClaimWhenItTimesOut) {
  auto client = std::move(*cluster_->NewClient());
  auto blocker = std::move(*client->OpenSession("default"));
  auto busy = blocker->Acquire("busy");
  ASSERT_TRUE(busy.ok());

  auto client2 = std::move(*cluster_->NewClient());
  auto session = std::move(*client2->OpenSession("default"));
  auto a = session->Acquire("a");
  auto b = session->Acquire("b");
  ASSERT_TRUE(a.ok() && b.ok());
  std::atomic<bool> waiting_done{false};
  absl::Status waited;
  std::thread waiter([&] {
    AcquireOptions o;
    o.wait = seconds(3);
    waited = session->Acquire("busy", o).status();
    waiting_done = true;
  });
  for (int i = 0; i < 300 && Waiters("busy") < 1; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(Waiters("busy"), 1);
  EXPECT_EQ(Claims(session->id()), 3);  // two holds and one wait

  auto before = Keys();
  auto refused = session->Acquire("c");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(Keys(), before);

  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_EQ(Claims(session->id()), 2);  // the wait that ended left no claim behind
  EXPECT_TRUE(session->Acquire("c").ok());
}

TEST_F(HoldsPerSessionTest, AHandOverKeepsTheClaimAndAReleaseDropsIt) {
  auto client = std::move(*cluster_->NewClient());
  auto first = std::move(*client->OpenSession("default"));
  auto held = first->Acquire("k");
  ASSERT_TRUE(held.ok());
  auto client2 = std::move(*cluster_->NewClient());
  auto second = std::move(*client2->OpenSession("default"));
  absl::StatusOr<Hold> handed = absl::UnknownError("not yet");
  std::thread waiter([&] {
    AcquireOptions o;
    o.wait = seconds(20);
    handed = second->Acquire("k", o);
  });
  for (int i = 0; i < 300 && Waiters("k") < 1; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(Waiters("k"), 1);
  ASSERT_TRUE(held->Release().ok());
  waiter.join();
  ASSERT_TRUE(handed.ok()) << handed.status();
  EXPECT_EQ(Claims(first->id()), 0);
  EXPECT_EQ(Claims(second->id()), 1);
  ASSERT_TRUE(handed->Release().ok());
  EXPECT_EQ(Claims(second->id()), 0);
}

TEST_F(HoldsPerSessionTest, ConcurrentAcquiresOnOneSessionPassTheLimitExactly) {
  auto client = std::move(*cluster_->NewClient());
  auto session = std::move(*client->OpenSession("default"));
  constexpr int kCalls = 12;
  std::vector<absl::StatusOr<Hold>> results;
  for (int i = 0; i < kCalls; ++i) results.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] { results[i] = session->Acquire(absl::StrCat("key-", i)); });
  }
  for (auto& t : threads) t.join();
  int granted = 0, exhausted = 0;
  for (const auto& r : results) {
    if (r.ok()) ++granted;
    if (r.status().code() == absl::StatusCode::kResourceExhausted) ++exhausted;
  }
  EXPECT_EQ(granted, 3);
  EXPECT_EQ(exhausted, kCalls - 3);
  EXPECT_EQ(Claims(session->id()), 3);
}

class StreamLimitTest : public LimitsTest {
 protected:
  std::string Limits() const override { return "limits:\n  max_concurrent_streams: 3\n"; }
};

TEST_F(StreamLimitTest, StreamsBeyondThePerConnectionLimitWaitOnTheClient) {
  // One connection, max_concurrent_streams 3: three parked Acquire calls take the
  // streams; a fourth call on that connection never reaches holdfastd until one
  // ends, so it cannot add a waiter.
  auto client = std::move(*cluster_->NewClient());
  auto holder = std::move(*client->OpenSession("default"));
  auto hold = holder->Acquire("streams");
  ASSERT_TRUE(hold.ok());

  auto channel = grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials());
  auto sessions = v1::Session::NewStub(channel);
  auto locks = v1::Lock::NewStub(channel);
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    v1::OpenSessionRequest req;
    req.set_namespace_("default");
    req.set_ttl_ms(30000);
    v1::OpenSessionResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(sessions->Open(&ctx, req, &resp).ok());
    ids.push_back(resp.session_id());
  }
  std::vector<std::thread> parked;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < 3; ++i) contexts.push_back(std::make_unique<grpc::ClientContext>());
  for (int i = 0; i < 3; ++i) {
    parked.emplace_back([&, i] {
      v1::AcquireRequest req;
      req.set_namespace_("default");
      req.set_session_id(ids[i]);
      req.set_lock_key("streams");
      req.set_wait_ms(60000);
      v1::AcquireResponse resp;
      (void)locks->Acquire(contexts[i].get(), req, &resp);
    });
  }
  for (int i = 0; i < 300 && Waiters("streams") < 3; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(Waiters("streams"), 3);

  // The fourth waits for a stream (the server's SETTINGS allow no more).
  v1::AcquireRequest req;
  req.set_namespace_("default");
  req.set_session_id(ids[3]);
  req.set_lock_key("other-key");
  req.set_wait_ms(0);
  v1::AcquireResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(2));
  auto s = locks->Acquire(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  pb::RangeRequest r;
  r.set_key(keyspace::HoldRangeBegin("default", "other-key"));
  r.set_range_end(keyspace::HoldRangeEnd("default", "other-key"));
  r.set_count_only(true);
  auto held = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->count(), 0);  // it never reached holdfastd

  for (auto& c : contexts) c->TryCancel();
  for (auto& t : parked) t.join();
  // With the streams free again the same connection serves the call.
  grpc::ClientContext again;
  again.set_deadline(std::chrono::system_clock::now() + seconds(10));
  EXPECT_TRUE(locks->Acquire(&again, req, &resp).ok());
}

}  // namespace
}  // namespace holdfast
