// Locks end to end: libholdfast -> holdfastd -> a real etcd, all as processes.
// Safety is checked from etcd directly, never from what holdfast says of itself.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dev/refusing_endpoint.h"
#include "etcd/watch_hub.h"
#include "harness/cluster.h"
#include "harness/stall_proxy.h"
#include "holdfast/v1/admin.grpc.pb.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

// `hold` says it has ended: lost, its token stopped, `why` in the reason.
void ExpectEnded(const Hold& hold, const std::string& why) {
  EXPECT_TRUE(hold.lost());
  EXPECT_TRUE(hold.lost_token().stop_requested());
  EXPECT_NE(hold.lost_reason().message().find(why), std::string::npos) << hold.lost_reason();
}

class LockTest : public ::testing::Test {
 protected:
  void StartCluster(int replicas = 1) {
    testing::TestCluster::Options o;
    o.replicas = replicas;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void SetUp() override { StartCluster(); }
  void TearDown() override {
    client_.reset();
    cluster_.reset();
  }

  // A client of replica 0 whose calls wait at most `rpc_timeout`.
  std::unique_ptr<Client> ClientWithRpcTimeout(milliseconds rpc_timeout) {
    ClientOptions o;
    o.endpoints = {cluster_->endpoint()};
    o.rpc_timeout = rpc_timeout;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<Session> Open(milliseconds ttl = seconds(10), Client* c = nullptr) {
    SessionOptions o;
    o.ttl = ttl;
    auto s = (c ? c : client_.get())->OpenSession("default", o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // `n` sessions of `ns` opened at once, each on a thread of its own: those that
  // opened, and the messages of those refused (over the quota, or ABORTED).
  std::pair<std::vector<std::unique_ptr<Session>>, std::vector<std::string>> OpenConcurrently(
      const std::string& ns, int n) {
    std::mutex mu;
    std::vector<std::unique_ptr<Session>> opened;
    std::vector<std::string> refusals;
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&] {
        auto s = client_->OpenSession(ns);
        std::lock_guard<std::mutex> l(mu);
        if (s.ok()) {
          opened.push_back(std::move(*s));
        } else {
          EXPECT_TRUE(s.status().code() == absl::StatusCode::kResourceExhausted ||
                      s.status().code() == absl::StatusCode::kAborted)
              << s.status();
          refusals.push_back(std::string(s.status().message()));
        }
      });
    }
    for (auto& t : threads) t.join();
    return {std::move(opened), std::move(refusals)};
  }

  // Every hold key of `key` in etcd, read directly.
  std::vector<mvccpb::KeyValue> HoldsInEtcd(const std::string& key, const std::string& ns = "default") {
    pb::RangeRequest r;
    r.set_key(keyspace::HoldRangeBegin(ns, key));
    r.set_range_end(keyspace::HoldRangeEnd(ns, key));
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return {};
    return {resp->kvs().begin(), resp->kvs().end()};
  }

  // etcd's current revision: unchanged means nothing was written.
  int64_t Revision() {
    pb::RangeRequest r;
    r.set_key("/holdfast/epoch");
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(resp.ok());
    return resp.ok() ? resp->header().revision() : -1;
  }

  int64_t KeysUnder(const std::string& prefix) {
    pb::RangeRequest r;
    r.set_key(prefix);
    r.set_range_end(keyspace::PrefixEnd(prefix));
    r.set_count_only(true);
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(resp.ok());
    return resp.ok() ? resp->count() : -1;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(LockTest, TwoSessionsContendExactlyOneHolds) {
  auto a = Open(), b = Open();
  auto ha = a->Acquire("db/primary");
  ASSERT_TRUE(ha.ok()) << ha.status();
  auto hb = b->Acquire("db/primary");
  ASSERT_FALSE(hb.ok());
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(hb.status().message().find("is held by session"), std::string::npos);
  auto holds = HoldsInEtcd("db/primary");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].lease(), a->id());
  EXPECT_GT(ha->token(), 0);
  EXPECT_EQ(ha->token() >> 48, 1);  // epoch 1
  EXPECT_EQ(ha->token() & ((int64_t{1} << 48) - 1), holds[0].create_revision());
}

TEST_F(LockTest, KeysAAndABAreIndependentLocks) {
  auto a = Open(), b = Open();
  auto ha = a->Acquire("a");
  auto hb = b->Acquire("a/b");
  ASSERT_TRUE(ha.ok()) << ha.status();
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(HoldsInEtcd("a").size(), 1u);
  EXPECT_EQ(HoldsInEtcd("a/b").size(), 1u);
}

TEST_F(LockTest, TokensStrictlyIncreaseAcross50Rounds) {
  auto a = Open(), b = Open();
  int64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    Session* s = (i % 2 == 0) ? a.get() : b.get();
    auto h = s->Acquire("jobs/nightly");
    ASSERT_TRUE(h.ok()) << "round " << i << ": " << h.status();
    EXPECT_GT(h->token(), last) << "round " << i;
    last = h->token();
    ASSERT_TRUE(h->Release().ok());
  }
  EXPECT_TRUE(HoldsInEtcd("jobs/nightly").empty());
}

TEST_F(LockTest, AcquireIsIdempotentPerSession) {
  auto a = Open();
  auto h1 = a->Acquire("k");
  ASSERT_TRUE(h1.ok());
  int64_t rev = Revision();
  auto h2 = a->Acquire("k");
  ASSERT_TRUE(h2.ok()) << h2.status();
  EXPECT_EQ(h1->token(), h2->token());
  EXPECT_EQ(Revision(), rev);  // no write
}

TEST_F(LockTest, StaleTokenReleaseFailsAndChangesNothing) {
  auto a = Open();
  int64_t old_token;
  {
    auto h = a->Acquire("k");
    ASSERT_TRUE(h.ok());
    old_token = h->token();
  }  // released
  auto h = a->Acquire("k");
  ASSERT_TRUE(h.ok());
  ASSERT_GT(h->token(), old_token);

  // Release with the old token through the raw API.
  ClientOptions co;
  co.endpoints = {cluster_->endpoint()};
  auto raw = Client::Connect(co);
  ASSERT_TRUE(raw.ok());
  int64_t rev = Revision();
  // Hold::Release uses the hold's own token; send the stale one by hand.
  grpc::ClientContext ctx;
  auto channel = grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials());
  auto stub = v1::Lock::NewStub(channel);
  v1::ReleaseRequest req;
  req.set_namespace_("default");
  req.set_session_id(a->id());
  req.set_lock_key("k");
  req.set_token(old_token);
  v1::ReleaseResponse resp;
  auto st = stub->Release(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find(absl::StrCat("stale token ", old_token)), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("nothing released"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
  auto holds = HoldsInEtcd("k");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].create_revision(), h->token() & ((int64_t{1} << 48) - 1));
  // Another session cannot release it with the right token either.
  auto b = Open();
  grpc::ClientContext ctx2;
  req.set_session_id(b->id());
  req.set_token(h->token());
  EXPECT_EQ(stub->Release(&ctx2, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(HoldsInEtcd("k").size(), 1u);
}

TEST_F(LockTest, WaitingAcquireIsGrantedOnRelease) {
  auto a = Open(), b = Open();
  auto ha = a->Acquire("q");
  ASSERT_TRUE(ha.ok());
  auto waiter = std::async(std::launch::async, [&] {
    AcquireOptions o;
    o.wait = seconds(30);
    return b->Acquire("q", o);
  });
  // The waiter is parked on the server (no hold yet).
  EXPECT_EQ(waiter.wait_for(milliseconds(300)), std::future_status::timeout);
  int64_t first = ha->token();
  ASSERT_TRUE(ha->Release().ok());
  ASSERT_EQ(waiter.wait_for(seconds(20)), std::future_status::ready);
  auto hb = waiter.get();
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_GT(hb->token(), first);
  auto holds = HoldsInEtcd("q");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].lease(), b->id());
}

TEST_F(LockTest, WaitDeadlinePassesAndLeavesNothingBehind) {
  auto a = Open(), b = Open();
  auto ha = a->Acquire("q");
  ASSERT_TRUE(ha.ok());
  AcquireOptions o;
  o.wait = milliseconds(400);
  auto hb = b->Acquire("q", o);
  ASSERT_FALSE(hb.ok());
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(hb.status().message().find("was not granted within 400ms"), std::string::npos)
      << hb.status();
  auto holds = HoldsInEtcd("q");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].lease(), a->id());
}

TEST_F(LockTest, CheckTokenAndDescribe) {
  auto a = Open();
  AcquireOptions o;
  o.holder_meta = "host-7";
  auto h = a->Acquire("svc/leader", o);
  ASSERT_TRUE(h.ok());
  auto check = client_->CheckToken("default", "svc/leader", h->token());
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->current());
  EXPECT_EQ(check->current_token(), h->token());
  auto d = client_->Describe("default", "svc/leader");
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).token(), h->token());
  EXPECT_EQ(d->holders(0).session_id(), a->id());
  EXPECT_EQ(d->holders(0).holder_meta(), "host-7");
  EXPECT_EQ(d->holders(0).identity(), "spiffe://holdfast.dev/dev");
  EXPECT_EQ(d->epoch(), 1);
  int64_t tok = h->token();
  ASSERT_TRUE(h->Release().ok());
  check = client_->CheckToken("default", "svc/leader", tok);
  ASSERT_TRUE(check.ok());
  EXPECT_FALSE(check->current());
  EXPECT_EQ(check->current_token(), 0);
  // What is not a token at all is refused as such.
  for (int64_t bad : {int64_t{0}, int64_t{-1}}) {
    auto refused = client_->CheckToken("default", "svc/leader", bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_NE(refused.status().message().find("is invalid"), std::string::npos)
        << refused.status();
  }
}

TEST_F(LockTest, SessionCloseReleasesEverything) {
  auto a = Open();
  auto h1 = a->Acquire("x");
  auto h2 = a->Acquire("y");
  ASSERT_TRUE(h1.ok() && h2.ok());
  ASSERT_TRUE(a->Close().ok());
  EXPECT_TRUE(HoldsInEtcd("x").empty());
  EXPECT_TRUE(HoldsInEtcd("y").empty());
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("default")), 0);
  auto again = a->Acquire("x");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
}

// etcd past its space quota refuses every put, the close's mark for the audit
// trail among them, but not a lease revoke (which frees space): the close still
// ends the session and its holds, instead of leaving them for the session's TTL
// while operators recover etcd.
TEST_F(LockTest, ACloseEndsTheSessionWhileEtcdRefusesWrites) {
  auto a = Open(seconds(60));
  auto h = a->Acquire("x");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(cluster_->SpaceAlarm(true).ok());
  absl::Cleanup disarm = [&] { EXPECT_TRUE(cluster_->SpaceAlarm(false).ok()); };
  // etcd refuses writes now (the mark alone would fail).
  pb::PutRequest probe;
  probe.set_key("/probe");
  EXPECT_EQ(cluster_->etcd_client().PutSync(probe, etcd::DeadlineIn(seconds(5))).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto closed = a->Close();
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_TRUE(HoldsInEtcd("x").empty());
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("default")), 0);
}

// A namespace whose record is marked for a move to another etcd cluster (a
// rehome copying it, or one done) takes no change of its members, quotas or
// classes on the old home: it would not reach the new one (a member removed
// would stay a member there), and it is not deleted there. The admin service
// refuses by its view of the placements, which a replica may see late; the
// record itself is the last word.
TEST_F(LockTest, NamespaceAndClassChangesAreRefusedOnARecordMarkedForAMove) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("kept");
  cls.set_key_prefix("kept/");
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto mark = [&](bool moved) {
    pb::RangeRequest r;
    r.set_key(keyspace::NamespaceKey("default"));
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(got.ok() && got->kvs_size() == 1);
    records::NamespaceRecord rec;
    ASSERT_TRUE(rec.ParseFromString(got->kvs(0).value()));
    rec.set_draining_to("b");
    rec.set_moved(moved);
    pb::PutRequest put;
    put.set_key(keyspace::NamespaceKey("default"));
    put.set_value(rec.SerializeAsString());
    ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  };
  for (const bool moved : {false, true}) {
    SCOPED_TRACE(moved ? "moved" : "being rehomed");
    mark(moved);
    const std::string why = moved ? "has moved to etcd cluster \"b\"" : "is being rehomed to \"b\"";
    const int64_t rev = Revision();
    v1::UpdateNamespaceRequest update;
    update.set_name("default");
    update.set_op_rate_quota(5);
    auto updated = client_->UpdateNamespace(update);
    EXPECT_EQ(updated.status().code(), absl::StatusCode::kFailedPrecondition) << updated.status();
    EXPECT_NE(updated.status().message().find(why), std::string::npos) << updated.status();
    v1::LockClass another = cls;
    another.set_class_id("another");
    another.set_key_prefix("another/");
    auto created = client_->CreateClass(another);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition) << created.status();
    EXPECT_NE(created.status().message().find(why), std::string::npos) << created.status();
    auto deleted = client_->DeleteClass("default", "kept");
    EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition) << deleted;
    EXPECT_NE(deleted.message().find(why), std::string::npos) << deleted;
    // Deleting the namespace would delete the copy being moved, or the old home's
    // record, after which its placement record (naming the new home) would go too.
    auto gone = client_->DeleteNamespace("default");
    EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition) << gone;
    EXPECT_NE(gone.message().find(why), std::string::npos) << gone;
    EXPECT_EQ(Revision(), rev) << "a refused change wrote to etcd";
  }
}

// A class is deleted only while it has no hold, which the delete counts by
// reading every hold under the class's prefix. It reads them a page at a time:
// holds whose records pass the client's 64 MiB receive limit together (here
// 1,100 records of 64 KiB, written straight into etcd; holdfast's own are
// smaller, but a prefix may have millions) are counted all the same. Holds of a
// class with a longer prefix, under the same prefix, are not the class's.
TEST_F(LockTest, AClassWithMoreHoldsThanOneReadCarriesIsNotDeleted) {
  for (const auto& [id, prefix] : {std::pair{"big", "big/"}, std::pair{"sub", "big/sub/"}}) {
    v1::LockClass cls;
    cls.set_namespace_("default");
    cls.set_class_id(id);
    cls.set_key_prefix(prefix);
    ASSERT_TRUE(client_->CreateClass(cls).ok());
  }
  auto put_holds = [&](const std::string& class_id, const std::string& key_prefix, int n,
                       size_t meta_bytes) {
    records::HoldRecord rec;
    rec.set_class_id(class_id);
    rec.set_holder_meta(std::string(meta_bytes, 'm'));
    const std::string value = rec.SerializeAsString();
    for (int i = 0; i < n;) {
      pb::TxnRequest txn;
      for (int j = 0; j < 16 && i < n; ++j, ++i) {
        auto* put = txn.add_success()->mutable_request_put();
        put->set_key(keyspace::HoldKey("default", absl::StrCat(key_prefix, i), 1000 + i));
        put->set_value(value);
      }
      ASSERT_TRUE(cluster_->etcd_client().TxnSync(txn, etcd::DeadlineIn(seconds(30))).ok());
    }
  };
  put_holds("big", "big/k", 1100, 64 * 1024);
  put_holds("sub", "big/sub/", 3, 10);

  const int64_t rev = Revision();
  auto refused = client_->DeleteClass("default", "big");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(std::string(refused.message()),
            "class \"big\" has 1100 hold(s); it can be deleted once they are released");
  EXPECT_EQ(Revision(), rev) << "a refused delete wrote to etcd";
  EXPECT_TRUE(client_->GetClass("default", "big").ok());

  pb::DeleteRangeRequest del;
  del.set_key(keyspace::HoldPrefix("default", "big/k"));
  del.set_range_end(keyspace::PrefixEnd(del.key()));
  ASSERT_TRUE(cluster_->etcd_client().DeleteRangeSync(del, etcd::DeadlineIn(seconds(30))).ok());
  auto deleted = client_->DeleteClass("default", "big");
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(client_->GetClass("default", "big").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(KeysUnder(keyspace::HoldPrefix("default", "big/sub/")), 3);
}

// A namespace record etcd holds corrupt cannot say whether it is being moved;
// deleting the namespace is the way out of it, so the delete is not refused.
TEST_F(LockTest, ANamespaceWithACorruptRecordCanBeDeleted) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("broken");
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
  pb::PutRequest put;
  put.set_key(keyspace::NamespaceKey("broken"));
  put.set_value(std::string("\xff\xff\xff", 3));
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  auto got = client_->GetNamespace("broken");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  auto deleted = client_->DeleteNamespace("broken");
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(KeysUnder(keyspace::NamespacePrefix("broken")), 0);
  EXPECT_EQ(client_->GetNamespace("broken").status().code(), absl::StatusCode::kNotFound);
}

// --- bad input: a clear error, and nothing changes --------------------------

TEST_F(LockTest, BadSessionTtlIsRefused) {
  int64_t rev = Revision();
  for (auto ttl : {milliseconds(0), milliseconds(500), milliseconds(25LL * 3600 * 1000)}) {
    SessionOptions o;
    o.ttl = ttl;
    auto s = client_->OpenSession("default", o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("is outside [1s, 24h]"), std::string::npos)
        << s.status();
  }
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("default")), 0);
}

// An acquire granted while its answer could not reach the client (a hand-over
// during a stalled link), whose call then ran out: the session holds the key
// but the caller got DEADLINE_EXCEEDED and has no Hold to release it. The
// Client looks the key up once the link answers again and releases the grant,
// so the key is free again while the session lives on. Without that, the key
// stayed held for as long as the session did.
TEST_F(LockTest, AGrantWhoseAnswerWasLostIsReleasedWhileTheSessionLivesOn) {
  auto proxy = testing::StallProxy::Start(cluster_->endpoint());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  ClientOptions o;
  o.endpoints = {(*proxy)->endpoint()};
  o.rpc_timeout = seconds(1);
  auto via = Client::Connect(o);
  ASSERT_TRUE(via.ok()) << via.status();
  auto waiting = Open(seconds(30), via->get());
  ASSERT_NE(waiting, nullptr);
  auto holding = Open();
  ASSERT_NE(holding, nullptr);
  auto held = holding->Acquire("doubt/k");
  ASSERT_TRUE(held.ok()) << held.status();

  auto acquired = std::async(std::launch::async, [&] {
    return waiting->Acquire("doubt/k", {.wait = seconds(5)});
  });
  // Queued (the waiter is in etcd), then its link stalls and the key is
  // handed to it: granted, with the answer held back in the relay.
  bool queued = false;
  for (int i = 0; i < 150 && !queued; ++i) {
    auto d = client_->Describe("default", "doubt/k");
    queued = d.ok() && d->waiters_size() == 1;
    if (!queued) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(queued);
  (*proxy)->StallAnswers(true);
  std::this_thread::sleep_for(milliseconds(100));  // past the relay's poll already under way
  ASSERT_TRUE(held->Release().ok());
  auto d = client_->Describe("default", "doubt/k");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), waiting->id());
  const int64_t unanswered = d->holders(0).token();
  auto answer = acquired.get();
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded) << answer.status();
  (*proxy)->StallAnswers(false);

  const auto until = std::chrono::steady_clock::now() + seconds(20);
  for (;;) {
    d = client_->Describe("default", "doubt/k");
    ASSERT_TRUE(d.ok()) << d.status();
    if (d->holders_size() == 0 || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(d->holders_size(), 0) << "the grant whose answer was lost is still held";
  // Released by the lookup, not by the session's end.
  EXPECT_FALSE(waiting->lost());
  auto again = waiting->Acquire("doubt/k");  // a grant of its own, not the lost one
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->token(), unanswered);
}

// etcd raises a lease TTL below its minimum (1.5 election timeouts, in whole
// seconds; 2 s for the test etcd's defaults): a session asked for 1 s lives as
// long as its lease, and says so, in its answer and its record, against which
// the classes' bounds are checked.
TEST_F(LockTest, ASessionsTtlIsTheOneEtcdGranted) {
  auto stub = v1::Session::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::OpenSessionRequest req;
  req.set_namespace_("default");
  req.set_ttl_ms(1000);
  v1::OpenSessionResponse opened;
  ASSERT_TRUE(stub->Open(&ctx, req, &opened).ok());
  std::promise<absl::StatusOr<pb::LeaseTimeToLiveResponse>> p;
  pb::LeaseTimeToLiveRequest ttl;
  ttl.set_id(opened.session_id());
  cluster_->etcd_client().LeaseTimeToLive(ttl, etcd::DeadlineIn(seconds(5)),
                                          [&](auto r) { p.set_value(std::move(r)); });
  auto lease = p.get_future().get();
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_GE(lease->grantedttl(), 1);
  EXPECT_EQ(opened.ttl_ms(), lease->grantedttl() * 1000);
  EXPECT_GT(lease->grantedttl(), 1) << "the test etcd's minimum TTL is 2 s";
  pb::RangeRequest r;
  r.set_key(keyspace::SessionKey("default", opened.session_id()));
  auto kv = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(kv.ok() && kv->kvs_size() == 1) << kv.status();
  records::SessionRecord rec;
  ASSERT_TRUE(rec.ParseFromString(kv->kvs(0).value()));
  EXPECT_EQ(rec.ttl_ms(), opened.ttl_ms());
}

TEST_F(LockTest, SessionTtlOutsideTheClassBoundsIsRefused) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("slow");
  cls.set_key_prefix("slow/");
  cls.set_ttl_min_ms(5000);
  cls.set_ttl_max_ms(60000);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto a = Open(seconds(2));
  int64_t rev = Revision();
  auto h = a->Acquire("slow/job");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("outside the bounds of class \"slow\": [5000ms, 60000ms]"),
            std::string::npos)
      << h.status();
  EXPECT_EQ(Revision(), rev);
  EXPECT_TRUE(a->Acquire("fast/job").ok());  // the catch-all class allows 2 s
}

TEST_F(LockTest, MalformedKeysAreRefused) {
  auto a = Open();
  int64_t rev = Revision();
  struct Case {
    std::string key;
    const char* reason;
  } cases[] = {
      {"", "lock key is empty"},
      {std::string(513, 'k'), "at most 512"},
      {std::string("a\0b", 3), "control character"},
      {"bad\xff", "not valid UTF-8"},
  };
  for (const auto& c : cases) {
    auto h = a->Acquire(c.key);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(h.status().message().find(c.reason), std::string::npos) << h.status();
  }
  AcquireOptions big;
  big.holder_meta = std::string(2000, 'm');
  auto h = a->Acquire("k", big);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("holder_meta is 2000 bytes"), std::string::npos);
  AcquireOptions too_long;
  too_long.wait = milliseconds(2LL * 3600 * 1000);
  h = a->Acquire("k", too_long);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("wait 7200000ms is outside"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ(KeysUnder("/holdfast/ns/default/hold/"), 0);
}

TEST_F(LockTest, UnknownNamespaceIsNotFound) {
  int64_t rev = Revision();
  auto s = client_->OpenSession("nope");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("namespace \"nope\" does not exist"), std::string::npos);
  auto bad = client_->OpenSession("Not Valid");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ(KeysUnder("/holdfast/ns/nope"), 0);
  auto d = client_->Describe("nope", "k");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

// One etcd cluster (the `etcd:` section) has no tier: a namespace asked for on
// a tier is refused, naming the tiers there are, and nothing is written (a
// record naming a tier would be homed nowhere once `clusters:` lists tiers).
TEST_F(LockTest, ATierTheOneClusterDoesNotHaveIsRefused) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("tiered");
  req.mutable_namespace_()->set_cluster_tier("gold");
  int64_t rev = Revision();
  auto created = client_->CreateNamespace(req);
  ASSERT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
  EXPECT_EQ(created.status().message(),
            "no etcd cluster of tier \"gold\" is configured (tiers: none)");
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ(KeysUnder("/holdfast/ns/tiered"), 0);
  req.mutable_namespace_()->clear_cluster_tier();
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
}

// Namespace names may hold '-' and '.', which sort before the '/' of a
// namespace's own keys: "a-b" and "a.b" come between "a" and "a/...". Every one
// is listed, each once, with sessions and holds under each.
TEST_F(LockTest, ListNamespacesShowsNamesThatSortInsideAnother) {
  const std::vector<std::string> names = {"a", "a-b", "a.b", "a0", "a-b-c"};
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Hold> holds;
  for (const auto& ns : names) {
    ASSERT_TRUE(cluster_->CreateNamespace(ns).ok()) << ns;
    auto s = client_->OpenSession(ns);
    ASSERT_TRUE(s.ok()) << ns << ": " << s.status();
    auto h = (*s)->Acquire("job");
    ASSERT_TRUE(h.ok()) << ns << ": " << h.status();
    holds.push_back(std::move(*h));
    sessions.push_back(std::move(*s));
  }
  // Keys under /holdfast/ns/ that are no namespace's (written by hand), sorting
  // before the others: the list steps over them.
  for (const std::string junk : {"BAD NAME/x", "BAD NAME/y", " stray"}) {
    pb::PutRequest put;
    put.set_key(keyspace::NamespacesBegin() + junk);
    put.set_value("?");
    ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  }
  auto list = client_->ListNamespaces();
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> listed;
  for (const auto& ns : *list) listed.push_back(ns.name());
  std::vector<std::string> want = names;
  want.push_back("default");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);
}

// Lists come in pages that fit a client's 4 MiB receive limit: 80 namespaces
// of 1,000 members each (some 55 KB a record, 4.4 MB in all) came back in one
// answer before, and no client could list the namespaces any more. Now a page
// stops near 1 MiB (or at page_size), libholdfast follows the pages, and the
// pages followed by hand list every name once, in order. A negative page_size
// is refused; classes page the same way.
TEST_F(LockTest, ListsComeInPagesThatFitAClient) {
  std::vector<std::string> names{"default"};
  for (int i = 0; i < 80; ++i) {
    v1::CreateNamespaceRequest req;
    const std::string ns = absl::StrFormat("big-%02d", i);
    req.mutable_namespace_()->set_name(ns);
    for (int m = 0; m < 1000; ++m) {
      req.mutable_namespace_()->add_members(
          absl::StrFormat("spiffe://test.holdfast/team/t%02d/member-%04d-xxxxxxxxxx", i, m));
    }
    ASSERT_TRUE(client_->CreateNamespace(req).ok()) << ns;
    names.push_back(ns);
  }
  std::sort(names.begin(), names.end());
  auto all = client_->ListNamespaces();
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> listed;
  for (const auto& ns : *all) listed.push_back(ns.name());
  EXPECT_EQ(listed, names);
  EXPECT_EQ((*all)[1].members_size(), 1000);

  auto admin = v1::Admin::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  auto page = [&](int32_t size, const std::string& token, v1::ListNamespacesResponse* out) {
    grpc::ClientContext ctx;
    v1::ListNamespacesRequest req;
    req.set_page_size(size);
    req.set_page_token(token);
    return admin->ListNamespaces(&ctx, req, out);
  };
  v1::ListNamespacesResponse big;
  ASSERT_TRUE(page(1000, "", &big).ok());
  EXPECT_GT(big.namespaces_size(), 1);
  EXPECT_LT(big.namespaces_size(), 30) << "a page stops near 1 MiB";
  EXPECT_LT(big.ByteSizeLong(), size_t{1200 * 1024});
  EXPECT_EQ(big.next_page_token(), big.namespaces(big.namespaces_size() - 1).name());
  std::vector<std::string> by_hand;
  std::string token;
  int pages = 0;
  do {
    v1::ListNamespacesResponse r;
    ASSERT_TRUE(page(7, token, &r).ok());
    EXPECT_LE(r.namespaces_size(), 7);
    for (const auto& ns : r.namespaces()) by_hand.push_back(ns.name());
    token = r.next_page_token();
    ASSERT_LT(++pages, 100);
  } while (!token.empty());
  EXPECT_EQ(by_hand, names);
  EXPECT_EQ(pages, 12);  // 81 names, 7 a page

  const int64_t rev = Revision();
  v1::ListNamespacesResponse refused;
  auto bad = page(-1, "", &refused);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad.error_message(), "page_size must be >= 0 (0: 100), not -1");
  EXPECT_EQ(refused.namespaces_size(), 0);
  EXPECT_EQ(Revision(), rev);

  for (const std::string id : {"c1", "c2", "c3", "c4", "c5"}) {
    v1::LockClass cls;
    cls.set_namespace_("default");
    cls.set_class_id(id);
    cls.set_key_prefix(id + "/");
    ASSERT_TRUE(client_->CreateClass(cls).ok()) << id;
  }
  std::vector<std::string> ids;
  token.clear();
  do {
    grpc::ClientContext ctx;
    v1::ListClassesRequest req;
    req.set_namespace_("default");
    req.set_page_size(2);
    req.set_page_token(token);
    v1::ListClassesResponse r;
    ASSERT_TRUE(admin->ListClasses(&ctx, req, &r).ok());
    EXPECT_LE(r.classes_size(), 2);
    for (const auto& c : r.classes()) ids.push_back(c.class_id());
    token = r.next_page_token();
  } while (!token.empty());
  {
    grpc::ClientContext ctx;
    v1::ListClassesRequest req;
    req.set_namespace_("default");
    req.set_page_size(-5);
    v1::ListClassesResponse r;
    const int64_t before = Revision();
    auto bad_classes = admin->ListClasses(&ctx, req, &r);
    EXPECT_EQ(bad_classes.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(bad_classes.error_message(), "page_size must be >= 0 (0: 100), not -5");
    EXPECT_EQ(r.classes_size(), 0);
    EXPECT_EQ(Revision(), before);
  }
  auto classes = client_->ListClasses("default");
  ASSERT_TRUE(classes.ok()) << classes.status();
  ASSERT_EQ(ids.size(), 6u);  // and the catch-all class
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  ASSERT_EQ(classes->size(), 6u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ((*classes)[i].class_id(), ids[i]);
}

// A Hold in the caller's hands says when it has ended: closing its session ends
// it (the lease is revoked and the next caller gets the key), and so does
// destroying the Client that renewed its session (nothing renews it any more).
TEST_F(LockTest, AHoldSaysItEndedWhenItsSessionIsClosedOrItsClientIsGone) {
  auto s = Open();
  auto h = s->Acquire("ends/closed");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(s->Close().ok());
  ExpectEnded(*h, "was closed");
  auto next = Open();
  EXPECT_TRUE(next->Acquire("ends/closed").ok());
  EXPECT_TRUE(h->Release().ok());  // nothing left to release

  auto other = cluster_->NewClient();
  ASSERT_TRUE(other.ok()) << other.status();
  auto kept = Open(seconds(10), other->get());
  auto k = kept->Acquire("ends/client");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_FALSE(k->lost());
  other->reset();
  EXPECT_TRUE(kept->lost());
  ExpectEnded(*k, "its Client was destroyed");
}

// on_lost may capture what its owner frees right after closing the session:
// once ~Session (Close) returns, no on_lost call is still running.
TEST_F(LockTest, NoLostCallbackRunsAfterTheSessionIsGone) {
  struct Seen {
    std::atomic<bool> started{false}, finished{false};
  };
  auto seen = std::make_shared<Seen>();
  SessionOptions o;
  o.ttl = seconds(2);
  o.on_lost = [seen](const absl::Status&) {
    seen->started = true;
    std::this_thread::sleep_for(seconds(3));
    seen->finished = true;
  };
  auto s = client_->OpenSession("default", o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto h = (*s)->Acquire("cb");
  ASSERT_TRUE(h.ok()) << h.status();
  cluster_->holdfastd().Kill();  // no renewal is confirmed: lost at the local deadline
  auto until = std::chrono::steady_clock::now() + seconds(20);
  while (!seen->started && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_TRUE(seen->started) << "the session was never lost";
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());  // so that Close is answered at once
  h->Release().IgnoreError();
  s->reset();  // ~Session: Close
  EXPECT_TRUE(seen->finished) << "on_lost still ran after ~Session returned";
}

// An on_lost that closes its session while no holdfastd answers does not hold
// up the keepalive thread for the Client's other sessions: the next session's
// loss is told at its own deadline, not after the close's RPC timeout (10 s).
TEST_F(LockTest, ACloseFromOnLostDoesNotDelayTheNextSessionsLoss) {
  std::unique_ptr<Session> first;
  std::atomic<bool> first_closed{false};
  SessionOptions o1;
  o1.ttl = seconds(2);
  o1.on_lost = [&](const absl::Status&) {
    first->Close().IgnoreError();
    first_closed = true;
  };
  auto s1 = client_->OpenSession("default", o1);
  ASSERT_TRUE(s1.ok()) << s1.status();
  first = std::move(*s1);
  std::atomic<int64_t> second_lost_at_ms{0};
  const auto t0 = std::chrono::steady_clock::now();
  SessionOptions o2;
  o2.ttl = seconds(4);
  o2.on_lost = [&](const absl::Status&) {
    second_lost_at_ms = std::chrono::duration_cast<milliseconds>(
                            std::chrono::steady_clock::now() - t0).count();
  };
  auto s2 = client_->OpenSession("default", o2);
  ASSERT_TRUE(s2.ok()) << s2.status();
  cluster_->holdfastd().Kill();  // no renewal is confirmed: each is lost at its deadline
  auto until = std::chrono::steady_clock::now() + seconds(30);
  while (second_lost_at_ms == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_NE(second_lost_at_ms.load(), 0) << "the second session was never lost";
  EXPECT_TRUE(first_closed) << "the first session's loss comes first";
  const auto second_deadline_ms =
      std::chrono::duration_cast<milliseconds>((*s2)->deadline() - t0).count();
  // Told within a few seconds of its deadline, where the old close held the
  // thread for its whole 10 s RPC timeout.
  EXPECT_LT(second_lost_at_ms.load(), second_deadline_ms + 5000)
      << "lost at " << second_lost_at_ms << " ms, its deadline at " << second_deadline_ms << " ms";
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());  // so that the second Close is answered
}

// An on_lost that blocks (here for three TTLs) holds up none of the Client's
// other sessions: they are renewed, and their holds stay theirs. (Run on the
// keepalive thread that saw the loss, it stopped every renewal answer of the
// Client: the other session was declared lost while its lease was fine, or its
// lease ran out while its Hold said held.)
TEST_F(LockTest, AnOnLostThatBlocksKeepsTheClientsOtherSessionsRenewed) {
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> inside{false};
  SessionOptions o1;
  o1.ttl = seconds(2);
  o1.on_lost = [&](const absl::Status&) {
    inside = true;
    go_f.wait_for(seconds(30));
  };
  auto s1 = client_->OpenSession("default", o1);
  ASSERT_TRUE(s1.ok()) << s1.status();
  auto s2 = Open(seconds(2));
  ASSERT_NE(s2, nullptr);
  auto h2 = s2->Acquire("blocked-callback");
  ASSERT_TRUE(h2.ok()) << h2.status();
  // The first session's lease revoked straight on etcd: its next renewal answer
  // says it is gone, and its on_lost runs, and blocks.
  pb::LeaseRevokeRequest revoke;
  revoke.set_id((*s1)->id());
  std::promise<absl::StatusOr<pb::LeaseRevokeResponse>> revoked;
  cluster_->etcd_client().LeaseRevoke(revoke, etcd::DeadlineIn(seconds(5)),
                                      [&](auto r) { revoked.set_value(std::move(r)); });
  ASSERT_TRUE(revoked.get_future().get().ok());
  auto until = std::chrono::steady_clock::now() + seconds(20);
  while (!inside && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(inside) << "the first session's loss was never told";
  std::this_thread::sleep_for(seconds(6));  // three of the second session's TTLs
  EXPECT_FALSE(s2->lost()) << s2->lost_reason();
  EXPECT_FALSE(h2->lost()) << h2->lost_reason();
  auto d = client_->Describe("default", "blocked-callback");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), s2->id());
  go.set_value();
}

// A waiting Acquire whose holdfastd goes away asks again on a new connection,
// but within the bound it started with (the wait plus the rpc timeout, from the
// call): it does not wait anew from the retry. Close(timeout) then returns
// within its own bound, not the rpc timeout.
TEST_F(LockTest, AWaitWhoseHoldfastdWentAwayEndsByTheCallsFirstBound) {
  auto holder = Open();
  auto held = holder->Acquire("gone-wait");
  ASSERT_TRUE(held.ok()) << held.status();
  auto waiter_client = ClientWithRpcTimeout(seconds(2));
  ASSERT_NE(waiter_client, nullptr);
  auto waiter = Open(seconds(60), waiter_client.get());
  ASSERT_NE(waiter, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  auto acquired = std::async(std::launch::async, [&] {
    AcquireOptions a;
    a.wait = seconds(6);
    return waiter->Acquire("gone-wait", a);
  });
  bool queued = false;
  while (!queued && std::chrono::steady_clock::now() < t0 + seconds(3)) {
    auto d = client_->Describe("default", "gone-wait");
    queued = d.ok() && d->waiters_size() == 1;
    if (!queued) std::this_thread::sleep_for(milliseconds(20));
  }
  if (!queued && acquired.wait_for(seconds(0)) == std::future_status::ready) {
    FAIL() << "the waiter's Acquire ended: " << acquired.get().status();
  }
  ASSERT_TRUE(queued) << "the waiter never queued";
  // Gone 4 s into the wait: the call's bound is 8 s from its start; asked again
  // with a fresh bound, it would end at 4 + 2 + 6 = 12 s.
  std::this_thread::sleep_until(t0 + seconds(4));
  cluster_->holdfastd().Kill();
  auto r = acquired.get();
  const auto took_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Unreachable(r.status())) << r.status();
  EXPECT_LT(took_ms, 10'000) << r.status();
  const auto close_from = std::chrono::steady_clock::now();
  EXPECT_FALSE(waiter->Close(milliseconds(500)).ok());  // nobody answers
  const auto close_ms = std::chrono::duration_cast<milliseconds>(
                            std::chrono::steady_clock::now() - close_from).count();
  EXPECT_LT(close_ms, 1'900) << "Close(500ms) waited for the rpc timeout (2 s)";
  // A Close after a failed one sends CloseSession again: still nobody to answer
  // (within 500 ms), then answered once holdfastd is back.
  EXPECT_FALSE(waiter->Close(milliseconds(500)).ok());
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  EXPECT_TRUE(waiter->Close().ok()) << "a Close after a failed one is not sent again";
  auto gone = client_->Describe("default", "gone-wait");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->waiters_size(), 0) << "the waiter's session was not closed";
}

// A Release with no holdfastd to answer ends within one rpc timeout, its
// retries included (it waited five), keeps the hold's handle, and released again
// once holdfastd is back, it goes.
TEST_F(LockTest, AReleaseNobodyAnswersEndsWithinTheCallTimeoutAndCanBeAskedAgain) {
  auto c = ClientWithRpcTimeout(seconds(1));
  ASSERT_NE(c, nullptr);
  auto s = Open(seconds(60), c.get());
  ASSERT_NE(s, nullptr);
  auto h = s->Acquire("release-gone");
  ASSERT_TRUE(h.ok()) << h.status();
  cluster_->holdfastd().Kill();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status r = h->Release();
  const auto took_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(Unreachable(r)) << r;
  EXPECT_LT(took_ms, 3'000) << "five attempts of 1 s each would take 5 s";
  EXPECT_FALSE(h->lost()) << "not released: the handle still says it holds";
  EXPECT_EQ(HoldsInEtcd("release-gone").size(), 1u);
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  absl::Status again;
  for (int i = 0; i < 20; ++i) {  // the channel reconnects to the new holdfastd
    again = h->Release();
    if (again.ok()) break;
  }
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_TRUE(HoldsInEtcd("release-gone").empty());
  EXPECT_TRUE(h->lost());
}

// Acquire of a held key returns the same hold: its handles share what they say.
// Released through one, the others say it ended, as the next holder has it.
TEST_F(LockTest, HandlesOfOneHoldSayItEndedWhenOneReleasesIt) {
  auto s = Open();
  auto h1 = s->Acquire("two-handles");
  auto h2 = s->Acquire("two-handles");
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_EQ(h1->token(), h2->token());
  ASSERT_TRUE(h1->Release().ok());
  ExpectEnded(*h2, "was released");
  auto other = Open();
  EXPECT_TRUE(other->Acquire("two-handles").ok());
  // A new hold of the key on the first session is a hold of its own.
  auto again = Open();
  auto h3 = again->Acquire("three", {});
  ASSERT_TRUE(h3.ok());
  ASSERT_TRUE(h3->Release().ok());
  auto h4 = again->Acquire("three", {});
  ASSERT_TRUE(h4.ok());
  EXPECT_FALSE(h4->lost());
}

TEST_F(LockTest, SharedInAnExclusiveClassIsRefused) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("x-only");
  cls.set_key_prefix("x/");
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  ASSERT_TRUE(client_->CreateClass(cls).ok());
  auto a = Open();
  int64_t rev = Revision();
  AcquireOptions o;
  o.shared = true;
  auto h = a->Acquire("x/1", o);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("is exclusive (mode X)"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
}

TEST_F(LockTest, SharedHoldsCoexistButNotWithExclusive) {
  auto a = Open(), b = Open(), c = Open();
  AcquireOptions shared;
  shared.shared = true;
  auto ra = a->Acquire("cfg", shared);
  auto rb = b->Acquire("cfg", shared);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NE(ra->token(), rb->token());  // each shared holder has its own token
  auto w = c->Acquire("cfg");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(HoldsInEtcd("cfg").size(), 2u);
}

// A hold never changes mode: a session holding a key shared that asks for it
// exclusive (waiting or not) is refused, not answered with its shared hold, which
// would tell it the key is its alone while another session shares it; and the
// other way round. Nothing changes.
TEST_F(LockTest, AHoldIsNotAnsweredToACallAskingTheOtherMode) {
  auto a = Open(), b = Open(), c = Open();
  AcquireOptions shared;
  shared.shared = true;
  auto ra = a->Acquire("cfg", shared);
  auto rb = b->Acquire("cfg", shared);
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto rc = c->Acquire("solo");
  ASSERT_TRUE(rc.ok());
  const int64_t rev = Revision();
  AcquireOptions exclusive_wait;
  exclusive_wait.wait = seconds(5);
  for (const AcquireOptions& o : {AcquireOptions{}, exclusive_wait}) {
    auto up = a->Acquire("cfg", o);
    ASSERT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition) << up.status();
    EXPECT_EQ(up.status().message(),
              absl::StrCat("session ", a->id(), " holds \"cfg\" shared, and this call asked for "
                           "it exclusive: a hold does not change mode (release it, then acquire "
                           "the key exclusive)"));
  }
  auto down = c->Acquire("solo", shared);
  ASSERT_EQ(down.status().code(), absl::StatusCode::kFailedPrecondition) << down.status();
  EXPECT_NE(down.status().message().find("holds \"solo\" exclusive, and this call asked for it "
                                         "shared"),
            std::string::npos)
      << down.status();
  EXPECT_EQ(Revision(), rev);
  auto d = client_->Describe("default", "cfg");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 2);
  EXPECT_EQ(d->waiters_size(), 0);
  EXPECT_FALSE(ra->lost());
  // The same mode is answered with the hold, as ever.
  auto again = a->Acquire("cfg", shared);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->token(), ra->token());
}

// Two calls of one session waiting for one key in different modes: the later
// takes the session's place in the queue over in its own mode, so a hand-over
// gives the session a hold in that mode. The call that asked for the other mode
// is refused, not answered with it; the hold stays the other call's.
TEST_F(LockTest, TwoWaitsOfASessionInDifferentModesGetOneHoldInTheLatersMode) {
  auto a = Open(), b = Open();
  auto held = a->Acquire("cfg");
  ASSERT_TRUE(held.ok()) << held.status();
  AcquireOptions exclusive;
  exclusive.wait = seconds(30);
  AcquireOptions shared = exclusive;
  shared.shared = true;
  auto waiter_of_b = [&]() -> std::optional<v1::WaiterInfo> {
    auto d = client_->Describe("default", "cfg");
    if (!d.ok() || d->waiters_size() != 1) return std::nullopt;
    return d->waiters(0);
  };
  auto first = std::async(std::launch::async, [&] { return b->Acquire("cfg", exclusive); });
  for (int i = 0; i < 1000 && !waiter_of_b(); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(waiter_of_b());
  ASSERT_FALSE(waiter_of_b()->shared());
  auto second = std::async(std::launch::async, [&] { return b->Acquire("cfg", shared); });
  for (int i = 0; i < 1000 && !(waiter_of_b() && waiter_of_b()->shared()); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(waiter_of_b() && waiter_of_b()->shared());
  ASSERT_TRUE(held->Release().ok());
  auto got = second.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->info().shared());
  auto refused = first.get();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("holds \"cfg\" shared, and this call asked for it "
                                            "exclusive"),
            std::string::npos)
      << refused.status();
  auto d = client_->Describe("default", "cfg");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), b->id());
  EXPECT_TRUE(d->holders(0).shared());
  EXPECT_EQ(d->waiters_size(), 0);
}

// Sessions opened while a namespace had no quota count against one set later:
// with three live and a quota of two, a fourth is refused and nothing is written.
TEST_F(LockTest, SessionsOpenedBeforeAQuotaCountAgainstIt) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("late-quota");
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
  std::vector<std::unique_ptr<Session>> open;
  for (int i = 0; i < 3; ++i) {
    auto s = client_->OpenSession("late-quota");
    ASSERT_TRUE(s.ok()) << s.status();
    open.push_back(std::move(*s));
  }
  v1::UpdateNamespaceRequest set;
  set.set_name("late-quota");
  set.set_held_lease_quota(2);
  ASSERT_TRUE(client_->UpdateNamespace(set).ok());
  const int64_t rev = Revision();
  auto fourth = client_->OpenSession("late-quota");
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  EXPECT_NE(fourth.status().message().find("held_lease_quota"), std::string::npos)
      << fourth.status();
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("late-quota")), 3);
  // Down to one below the quota, one opens again.
  ASSERT_TRUE(open[0]->Close().ok());
  ASSERT_TRUE(open[1]->Close().ok());
  EXPECT_TRUE(client_->OpenSession("late-quota").ok());
}

// Opens racing right after a quota was set, while sessions opened before it
// live (they hold no slot), each count the same sessions: only one may pass.
// And one lowered under the sessions holding slots above it: none may.
TEST_F(LockTest, HeldLeaseQuotaIsExactForOpensRacingAQuotaChange) {
  auto race = [&](const std::string& ns, int n) { return OpenConcurrently(ns, n).first; };
  auto set_quota = [&](const std::string& ns, int64_t quota) {
    v1::UpdateNamespaceRequest set;
    set.set_name(ns);
    set.set_held_lease_quota(quota);
    ASSERT_TRUE(client_->UpdateNamespace(set).ok());
  };
  for (int round = 0; round < 5; ++round) {
    const std::string ns = absl::StrCat("late-race-", round);
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name(ns);
    ASSERT_TRUE(client_->CreateNamespace(req).ok());
    std::vector<std::unique_ptr<Session>> before;
    for (int i = 0; i < 2; ++i) {
      auto s = client_->OpenSession(ns);
      ASSERT_TRUE(s.ok()) << s.status();
      before.push_back(std::move(*s));
    }
    set_quota(ns, 3);
    auto opened = race(ns, 12);
    EXPECT_EQ(opened.size(), 1u) << "round " << round;
    EXPECT_EQ(KeysUnder(keyspace::SessionPrefix(ns)), 3) << "round " << round;
  }
  // Quota 5, five sessions; lowered to 3, and the sessions on slots 0 – 2
  // closed: two live, on slots above the quota, and one more may open, not three.
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("lowered");
  req.mutable_namespace_()->set_held_lease_quota(5);
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
  std::vector<std::unique_ptr<Session>> five = race("lowered", 5);
  ASSERT_EQ(five.size(), 5u);
  set_quota("lowered", 3);
  std::map<int64_t, int64_t> slot_of;  // session id -> slot
  {
    pb::RangeRequest r;
    r.set_key(keyspace::SlotPrefix("lowered"));
    r.set_range_end(keyspace::PrefixEnd(keyspace::SlotPrefix("lowered")));
    auto slots = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(slots.ok()) << slots.status();
    for (const auto& kv : slots->kvs()) {
      int64_t session = 0;
      ASSERT_TRUE(absl::SimpleAtoi(kv.value(), &session));
      slot_of[session] = keyspace::ParseSlotKey(kv.key(), "lowered").value_or(-1);
    }
  }
  ASSERT_EQ(slot_of.size(), 5u);
  for (auto& s : five) {
    if (slot_of[s->id()] < 3) {
      ASSERT_TRUE(s->Close().ok());
    }
  }
  ASSERT_EQ(KeysUnder(keyspace::SessionPrefix("lowered")), 2);
  auto opened = race("lowered", 12);
  EXPECT_EQ(opened.size(), 1u);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("lowered")), 3);
}

// An open with a quota reads a window of the taken slots from a random index,
// not all of them; when the window shows none free (a quota nearly used up), it
// pages on through the rest, round from 0. Here 1,999 of 2,000 slots are taken
// (slot keys written straight into etcd, as sessions gone without a trace would
// leave them), the free one at each end in turn: the open finds it, and the next
// one is refused without a write.
TEST_F(LockTest, AnOpenFindsTheLastFreeSlotOfANearlyFullQuota) {
  constexpr int64_t kQuota = 2000;
  for (const int64_t free_slot : {int64_t{0}, kQuota - 1, int64_t{1234}}) {
    SCOPED_TRACE(free_slot);
    const std::string ns = absl::StrCat("slots-", free_slot);
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name(ns);
    req.mutable_namespace_()->set_held_lease_quota(kQuota);
    ASSERT_TRUE(client_->CreateNamespace(req).ok());
    for (int64_t i = 0; i < kQuota;) {
      pb::TxnRequest txn;
      for (int j = 0; j < 100 && i < kQuota; ++i) {
        if (i == free_slot) continue;
        auto* put = txn.add_success()->mutable_request_put();
        put->set_key(keyspace::SlotKey(ns, i));
        put->set_value("1");
        ++j;
      }
      ASSERT_TRUE(cluster_->etcd_client().TxnSync(txn, etcd::DeadlineIn(seconds(30))).ok());
    }
    SessionOptions o;
    auto s = client_->OpenSession(ns, o);
    ASSERT_TRUE(s.ok()) << s.status();
    pb::RangeRequest r;
    r.set_key(keyspace::SlotKey(ns, free_slot));
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(got.ok() && got->kvs_size() == 1);
    EXPECT_EQ(got->kvs(0).value(), absl::StrCat((*s)->id()));
    const int64_t rev = Revision();
    auto refused = client_->OpenSession(ns, o);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_NE(refused.status().message().find("held_lease_quota"), std::string::npos)
        << refused.status();
    EXPECT_EQ(Revision(), rev) << "a refused open wrote to etcd";
    EXPECT_EQ(KeysUnder(keyspace::SessionPrefix(ns)), 1);
  }
}

TEST_F(LockTest, HeldLeaseQuotaIsExactUnderConcurrency) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("q");
  req.mutable_namespace_()->set_held_lease_quota(10);
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
  auto open_many = [&](int n) { return OpenConcurrently("q", n); };
  auto [first, refused] = open_many(50);
  EXPECT_EQ(first.size(), 10u);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("q")), 10);
  ASSERT_FALSE(refused.empty());
  EXPECT_NE(refused[0].find("held_lease_quota"), std::string::npos) << refused[0];
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(first[i]->Close().ok());
  auto [second, refused_again] = open_many(50);
  EXPECT_EQ(second.size(), 3u);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("q")), 10);
  // A refused open leaves nothing behind.
  int64_t rev = Revision();
  auto one_more = client_->OpenSession("q");
  EXPECT_EQ(one_more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Revision(), rev);
  // An admin raises the quota live: one more fits, then no more.
  v1::UpdateNamespaceRequest raise;
  raise.set_name("q");
  raise.set_held_lease_quota(11);
  auto updated = client_->UpdateNamespace(raise);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->held_lease_quota(), 11);
  auto eleventh = client_->OpenSession("q");
  EXPECT_TRUE(eleventh.ok()) << eleventh.status();
  EXPECT_EQ(client_->OpenSession("q").status().code(), absl::StatusCode::kResourceExhausted);
  raise.set_held_lease_quota(-1);
  EXPECT_EQ(client_->UpdateNamespace(raise).status().code(), absl::StatusCode::kInvalidArgument);
}

// Admin requests that could not mean what they say are refused, naming the
// field, and write nothing: members without set_members (they would be
// dropped), an update of nothing (it would rewrite the record all the same), an
// enum value this holdfastd does not know (proto3 lets any integer through).
TEST_F(LockTest, AdminRequestsThatCannotMeanWhatTheySayAreRefusedAndWriteNothing) {
  v1::CreateNamespaceRequest create;
  create.mutable_namespace_()->set_name("members");
  create.mutable_namespace_()->add_members("spiffe://t/app/*");
  ASSERT_TRUE(client_->CreateNamespace(create).ok());
  const int64_t rev = Revision();

  v1::UpdateNamespaceRequest dropped;
  dropped.set_name("members");
  dropped.add_members("spiffe://t/other/*");
  auto r = client_->UpdateNamespace(dropped);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "members given without set_members: set it to replace the member list");
  v1::UpdateNamespaceRequest nothing;
  nothing.set_name("members");
  r = client_->UpdateNamespace(nothing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "nothing to change: give held_lease_quota, op_rate_quota, or set_members with the "
            "new list");

  v1::LockClass cls;
  cls.set_namespace_("members");
  cls.set_class_id("odd");
  cls.set_key_prefix("odd/");
  cls.set_enforcement(static_cast<v1::Enforcement>(7));
  auto c = client_->CreateClass(cls);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "class enforcement 7 is not one this holdfastd knows");
  v1::CreateNamespaceRequest tenant;
  tenant.mutable_namespace_()->set_name("tenant");
  tenant.mutable_namespace_()->set_tenant_id("acme\x1b[2J");
  auto t = client_->CreateNamespace(tenant);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "tenant_id contains control character U+001B at byte 4: use plain text");
  tenant.mutable_namespace_()->set_tenant_id("acme\xc2\x9b" "2J");  // C1: an 8-bit CSI
  t = client_->CreateNamespace(tenant);
  EXPECT_EQ(t.status().message(),
            "tenant_id contains control character U+009B at byte 4: use plain text");

  EXPECT_EQ(Revision(), rev);
  auto got = client_->GetNamespace("members");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->members_size(), 1);
  EXPECT_EQ(got->members(0), "spiffe://t/app/*");
}

// A refusal that echoes what the caller sent (a 50 KB cluster name here) is
// still a refusal the client can read: the message is cut to 2 KiB, saying how
// much was left out, not lost to the client's limit on trailers.
// A second holdfastd started on the port of a running one (another etcd, say)
// must not share it: gRPC's SO_REUSEPORT would have the kernel spread
// connections between the two, and each would grant the same key. It exits
// naming the address and why; the first goes on serving.
TEST_F(LockTest, ASecondHoldfastdOnAPortInUseExitsAndTheFirstServesOn) {
  const std::string log = cluster_->dir() + "/second_holdfastd.log";
  dev::SpawnOptions so;
  so.argv = {testing::BinDir() + "/holdfastd", "--listen", cluster_->endpoint(), "--etcd",
             cluster_->etcd().endpoint(), "--insecure", "--audit-store",
             "sqlite:" + cluster_->dir() + "/second_audit.db"};
  so.log_file = log;
  auto second = dev::Subprocess::Spawn(std::move(so));
  ASSERT_TRUE(second.ok()) << second.status();
  auto code = (*second)->Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << "the second holdfastd is still running";
  EXPECT_EQ(*code, 1);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(absl::StrCat("holdfastd: UNAVAILABLE: cannot listen on ",
                                         cluster_->endpoint(), ": Address already in use (on 127.0.0.1)")),
            std::string::npos)
      << text.str();
  auto s = Open();
  auto hold = s->Acquire("still-serving");
  EXPECT_TRUE(hold.ok()) << hold.status();
}

// The test harness sees a holdfastd that exits at start as such (it does not
// wait out its 20 s for an answer): on a port it picked, that is how it knows to
// start again elsewhere when a test running beside took the port. A port the
// caller chose (held here) is not changed: the start fails, naming the log.
TEST_F(LockTest, AHarnessHoldfastdOnATakenPortIsSeenToExit) {
  dev::RefusingEndpoint taken;
  ASSERT_NE(taken.port(), 0);
  const std::string log = cluster_->dir() + "/taken_port_holdfastd.log";
  auto p = testing::HoldfastdProcess::Start({cluster_->etcd().endpoint()}, log, taken.port());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
  EXPECT_NE(p.status().message().find("holdfastd exited at start; see " + log), std::string::npos)
      << p.status();
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(absl::StrCat("cannot listen on ", taken.address(),
                                         ": Address already in use")),
            std::string::npos)
      << text.str();
}

TEST_F(LockTest, ARefusalEchoingALongRequestIsCutToFitTheAnswer) {
  const std::string name(50'000, 'c');
  auto e = client_->GetEpoch(name);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kNotFound) << e.status().message().substr(0, 200);
  const std::string m(e.status().message());
  EXPECT_LE(m.size(), 2048u);
  EXPECT_EQ(m.rfind("no etcd cluster named \"ccc", 0), 0u) << m.substr(0, 100);
  EXPECT_NE(m.find(" more bytes)"), std::string::npos) << m.substr(m.size() - 100);
}

// A quota beyond the most a namespace may be allowed (held_lease_quota,
// op_rate_quota) is refused and changes nothing; one stored before that bound (written by hand here) costs an open no
// more than a small one: the work is the live sessions', not the quota's.
TEST_F(LockTest, AQuotaTooLargeIsRefusedAndAStoredOneCostsOnlyTheLiveSessions) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("huge");
  req.mutable_namespace_()->set_held_lease_quota(1'000'000'000'000);
  int64_t rev = Revision();
  auto created = client_->CreateNamespace(req);
  ASSERT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
  EXPECT_EQ(created.status().message(),
            "held_lease_quota 1000000000000 is above 1000000, the most live sessions a "
            "namespace may be allowed (0 = unlimited)");
  EXPECT_EQ(Revision(), rev);

  req.mutable_namespace_()->set_held_lease_quota(1'000'000);  // the most
  ASSERT_TRUE(client_->CreateNamespace(req).ok());
  v1::UpdateNamespaceRequest raise;
  raise.set_name("huge");
  raise.set_held_lease_quota(1'000'001);
  rev = Revision();
  auto raised = client_->UpdateNamespace(raise);
  ASSERT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument) << raised.status();
  EXPECT_NE(raised.status().message().find("held_lease_quota 1000001 is above 1000000"),
            std::string::npos)
      << raised.status();
  EXPECT_EQ(Revision(), rev);
  auto got = client_->GetNamespace("huge");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->held_lease_quota(), 1'000'000);
  // So is an op_rate_quota beyond a million a second, at create and update.
  v1::CreateNamespaceRequest fast;
  fast.mutable_namespace_()->set_name("fast");
  fast.mutable_namespace_()->set_op_rate_quota(1'000'001);
  auto fast_created = client_->CreateNamespace(fast);
  ASSERT_EQ(fast_created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fast_created.status().message(),
            "op_rate_quota 1000001 is above 1000000, the most operations per second a "
            "namespace may be allowed (0 = unlimited)");
  EXPECT_EQ(client_->GetNamespace("fast").status().code(), absl::StatusCode::kNotFound);
  v1::UpdateNamespaceRequest faster;
  faster.set_name("huge");
  faster.set_op_rate_quota(int64_t{1} << 62);
  auto fast_set = client_->UpdateNamespace(faster);
  ASSERT_EQ(fast_set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fast_set.status().message().find("op_rate_quota 4611686018427387904 is above 1000000"),
            std::string::npos)
      << fast_set.status();
  EXPECT_EQ(Revision(), rev);
  got = client_->GetNamespace("huge");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->op_rate_quota(), 0);

  // A record with a quota of 10^12 (as no holdfastd writes now).
  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey("huge"));
  auto kv = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(kv.ok() && kv->kvs_size() == 1) << kv.status();
  records::NamespaceRecord rec;
  ASSERT_TRUE(rec.ParseFromString(kv->kvs(0).value()));
  rec.set_held_lease_quota(1'000'000'000'000);
  pb::PutRequest put;
  put.set_key(keyspace::NamespaceKey("huge"));
  put.set_value(rec.SerializeAsString());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  std::vector<std::unique_ptr<Session>> open;
  for (int i = 0; i < 5; ++i) {
    auto s = client_->OpenSession("huge");
    ASSERT_TRUE(s.ok()) << s.status();
    open.push_back(std::move(*s));
  }
  EXPECT_EQ(KeysUnder(keyspace::SlotPrefix("huge")), 5);
  EXPECT_EQ(KeysUnder(keyspace::SessionPrefix("huge")), 5);
}

// --- failures ----------------------------------------------------------------

TEST_F(LockTest, KilledHolderLosesItsHoldWithinTtlAndAWaiterGetsIt) {
  const auto ttl = seconds(2);
  auto log = cluster_->dir() + "/holder.log";
  dev::SpawnOptions so;
  so.argv = {testing::BinDir() + "/hf_test_holder", cluster_->endpoint(), "default", "victim",
             std::to_string(std::chrono::duration_cast<milliseconds>(ttl).count())};
  so.log_file = log;
  auto holder = dev::Subprocess::Spawn(so);
  ASSERT_TRUE(holder.ok()) << holder.status();
  // Wait (bounded) until the holder has the lock.
  std::string out;
  for (int i = 0; i < 400 && out.find("TOKEN") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(25));
    std::ifstream f(log);
    out.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_NE(out.find("TOKEN"), std::string::npos) << out;
  ASSERT_EQ(HoldsInEtcd("victim").size(), 1u);

  auto b = Open();
  auto waiter = std::async(std::launch::async, [&] {
    AcquireOptions o;
    o.wait = seconds(30);
    return b->Acquire("victim", o);
  });
  auto killed_at = std::chrono::steady_clock::now();
  (*holder)->Signal(SIGKILL);
  (*holder)->Wait();
  ASSERT_EQ(waiter.wait_for(seconds(30)), std::future_status::ready);
  auto hb = waiter.get();
  ASSERT_TRUE(hb.ok()) << hb.status();
  auto took = std::chrono::steady_clock::now() - killed_at;
  // Within TTL (etcd may grant a lease up to one TTL more after a leader change;
  // a single member has none) plus a generous slack for a slow machine.
  EXPECT_LT(took, ttl + seconds(10));
  EXPECT_EQ(HoldsInEtcd("victim").size(), 1u);
  EXPECT_EQ(HoldsInEtcd("victim")[0].lease(), b->id());
}

TEST_F(LockTest, HoldfastdRestartKeepsSessionAndHold) {
  auto a = Open(seconds(3));
  auto h = a->Acquire("survivor");
  ASSERT_TRUE(h.ok());
  cluster_->holdfastd().Stop();
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  // Longer than the TTL: only renewals through the new process keep the lease.
  int64_t before = a->renewals();
  auto until = std::chrono::steady_clock::now() + seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_FALSE(a->lost()) << a->lost_reason();
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_GT(a->renewals(), before);
  EXPECT_FALSE(h->lost());
  auto holds = HoldsInEtcd("survivor");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].lease(), a->id());
  EXPECT_TRUE(h->Release().ok());
}

TEST_F(LockTest, ServerRefusesGrantsWhenTheEpochRecordNamesAnotherCluster) {
  // Make the epoch record name another cluster, as after a restore.
  pb::RangeRequest get;
  get.set_key(keyspace::EpochKey());
  auto cur = cluster_->etcd_client().RangeSync(get, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(cur.ok());
  ASSERT_EQ(cur->kvs_size(), 1);
  records::EpochRecord rec;
  ASSERT_TRUE(rec.ParseFromString(cur->kvs(0).value()));
  rec.set_etcd_cluster_id(rec.etcd_cluster_id() ^ 0x5a5a);
  pb::PutRequest put;
  put.set_key(keyspace::EpochKey());
  put.set_value(rec.SerializeAsString());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());

  auto a = Open();
  int64_t rev = Revision();
  auto h = a->Acquire("k");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(h.status().message().find("holdfast epoch advance"), std::string::npos) << h.status();
  EXPECT_EQ(Revision(), rev);
  EXPECT_TRUE(HoldsInEtcd("k").empty());
}

TEST_F(LockTest, WaitersHoldNoServerThread) {
  auto a = Open();
  auto held = a->Acquire("busy");
  ASSERT_TRUE(held.ok());
  auto threads_of = [](pid_t pid) {
    std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    }
    return -1;
  };
  pid_t pid = cluster_->holdfastd().process()->pid();
  const int before = threads_of(pid);
  constexpr int kWaiters = 200;
  // One session per waiter, all waiting at once through async gRPC calls.
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < kWaiters; ++i) sessions.push_back(Open());
  auto channel = grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials());
  auto stub = v1::Lock::NewStub(channel);
  struct Call {
    grpc::ClientContext ctx;
    v1::AcquireRequest req;
    v1::AcquireResponse resp;
    std::promise<grpc::Status> done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kWaiters; ++i) {
    auto c = std::make_unique<Call>();
    c->req.set_namespace_("default");
    c->req.set_session_id(sessions[i]->id());
    c->req.set_lock_key("busy");
    c->req.set_wait_ms(60'000);
    Call* raw = c.get();
    stub->async()->Acquire(&c->ctx, &c->req, &c->resp,
                           [raw](grpc::Status s) { raw->done.set_value(s); });
    calls.push_back(std::move(c));
  }
  std::this_thread::sleep_for(seconds(1));  // let them all park
  const int during = threads_of(pid);
  EXPECT_LT(during - before, kWaiters / 4) << "before " << before << ", during " << during;
  EXPECT_EQ(HoldsInEtcd("busy").size(), 1u);
  for (auto& c : calls) c->ctx.TryCancel();
  for (auto& c : calls) {
    auto f = c->done.get_future();
    ASSERT_EQ(f.wait_for(seconds(20)), std::future_status::ready);
  }
}

// Invariant 1 under two replicas: never two holders, checked from etcd's own
// history of the key's hold range.
// holdfastd reaches etcd through a relay that can hold etcd's answers back or
// cut the link (testing::StallProxy): writes whose outcome holdfastd
// cannot know, as in a partition or a leader election.
class UnansweredWriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.etcd_via_proxy = true;
    o.extra_config = "etcd:\n  timeout: 1s\n";
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  // The holds and waiters of `key` as etcd has them (not through holdfastd).
  std::pair<int64_t, int64_t> HoldsAndWaiters(const std::string& key) {
    auto count = [&](const std::string& begin, const std::string& end) -> int64_t {
      pb::RangeRequest r;
      r.set_key(begin);
      r.set_range_end(end);
      r.set_count_only(true);
      auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
      return got.ok() ? got->count() : -1;
    };
    return {count(keyspace::HoldRangeBegin("default", key), keyspace::HoldRangeEnd("default", key)),
            count(keyspace::WaitRangeBegin("default", key), keyspace::WaitRangeEnd("default", key))};
  }

  bool Eventually(const std::function<bool()>& f, milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (!f()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return true;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

// A grant etcd commits but whose answer does not come back before the call's
// wait ends: the call used to answer "not granted within" at once, and the
// session kept the key, which its caller did not know it held, for as long as
// the session lived. The call now reads what it has once etcd answers again,
// and undoes the grant before it answers.
TEST_F(UnansweredWriteTest, AGrantUnansweredAsTheWaitEndsIsUndoneNotLeftHeld) {
  SessionOptions so;
  so.ttl = seconds(30);
  auto s = client_->OpenSession("default", so);
  ASSERT_TRUE(s.ok()) << s.status();
  {
    // Once, so that the next grant goes from the views, with no read first.
    auto warm = (*s)->Acquire("unanswered");
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE(warm->Release().ok());
  }
  cluster_->etcd_proxy().StallAnswers(true);
  auto got = std::async(std::launch::async,
                        [&] { return (*s)->Acquire("unanswered", testing::Waiting(milliseconds(300))); });
  // The grant reaches etcd and commits; its answer waits in the relay.
  ASSERT_TRUE(Eventually([&] { return HoldsAndWaiters("unanswered").first == 1; }, seconds(10)))
      << "the grant never reached etcd";
  std::this_thread::sleep_for(milliseconds(2000));  // past the wait and etcd.timeout
  cluster_->etcd_proxy().StallAnswers(false);
  auto answer = got.get();
  ASSERT_FALSE(answer.ok()) << "token " << answer->token();
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded) << answer.status();
  EXPECT_TRUE(Eventually([&] { return HoldsAndWaiters("unanswered").first == 0; }, seconds(5)))
      << "the session holds a key its caller was told it did not get";
  // The key is free for anyone.
  auto other = client_->OpenSession("default");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE((*other)->Acquire("unanswered").ok());
}

// A cancelled call's waiter leaves the queue at the end of its grace by a
// guarded delete. When that delete is lost (etcd never got it), it is asked
// again once etcd answers: the waiter used to stay until its own deadline (here
// a minute), and the next release handed its session a hold nobody waited for.
TEST_F(UnansweredWriteTest, AWaiterWhoseLeavingIsLostLeavesOnceEtcdAnswers) {
  auto holder = client_->OpenSession("default");
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto held = (*holder)->Acquire("lost-leave");
  ASSERT_TRUE(held.ok()) << held.status();
  SessionOptions so;
  so.ttl = seconds(30);
  auto waiter = client_->OpenSession("default", so);
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  auto stub = v1::Lock::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::AcquireRequest req;
  req.set_namespace_("default");
  req.set_session_id((*waiter)->id());
  req.set_lock_key("lost-leave");
  req.set_wait_ms(60'000);
  v1::AcquireResponse resp;
  auto call = std::async(std::launch::async, [&] { return stub->Acquire(&ctx, req, &resp); });
  ASSERT_TRUE(Eventually([&] { return HoldsAndWaiters("lost-leave").second == 1; }, seconds(10)));
  cluster_->etcd_proxy().Cut(true);
  ctx.TryCancel();  // the waiter stays for the grace (2 s), then its delete is lost
  EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
  std::this_thread::sleep_for(milliseconds(4000));
  cluster_->etcd_proxy().Cut(false);
  EXPECT_TRUE(Eventually([&] { return HoldsAndWaiters("lost-leave").second == 0; }, seconds(15)))
      << "the waiter of a call that ended stayed in the queue";
  // The release hands the key to nobody.
  ASSERT_TRUE(held->Release().ok());
  EXPECT_EQ(HoldsAndWaiters("lost-leave").first, 0);
}

// An open whose caller went away (cancelled, or its connection closed) while
// etcd was slow to answer, and which committed after: nobody knows the
// session's id, so nobody would renew or close it, and it would keep its quota
// slot for its whole TTL. It is closed again.
TEST(AbandonedOpenTest, AnOpenCommittedAfterItsCallerWentAwayIsClosedAgain) {
  testing::TestCluster::Options o;
  o.etcd_via_proxy = true;
  o.extra_config = "etcd:\n  timeout: 10s\n";
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  auto client = cluster.NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  v1::CreateNamespaceRequest create;
  create.mutable_namespace_()->set_name("one");
  create.mutable_namespace_()->set_held_lease_quota(1);
  ASSERT_TRUE((*client)->CreateNamespace(create).ok());
  auto sessions = [&](std::optional<int64_t> at = std::nullopt) -> int64_t {
    pb::RangeRequest r;
    r.set_key(keyspace::SessionPrefix("one"));
    r.set_range_end(keyspace::PrefixEnd(keyspace::SessionPrefix("one")));
    r.set_count_only(true);
    if (at) r.set_revision(*at);
    auto got = cluster.etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->count() : -1;
  };
  auto revision = [&] {
    pb::RangeRequest r;
    r.set_key("/");
    r.set_count_only(true);
    auto got = cluster.etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->header().revision() : 0;
  };
  {
    // Once, so that the open below starts at once (the namespace's op quota
    // is read on its first call), and is still in etcd's hands when cancelled.
    auto first = (*client)->OpenSession("one");
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->Close().ok());
  }
  auto stub = v1::Session::NewStub(
      grpc::CreateChannel(cluster.endpoint(), grpc::InsecureChannelCredentials()));
  // The cancel must come while the open is in etcd's hands: a cancel that came
  // first (a loaded machine) means the open is never begun, which is tried again.
  bool committed = false;
  for (int attempt = 0; attempt < 3 && !committed; ++attempt) {
    const int64_t from = revision();
    cluster.etcd_proxy().StallAnswers(true);
    grpc::ClientContext ctx;
    v1::OpenSessionRequest req;
    req.set_namespace_("one");
    req.set_ttl_ms(60'000);
    v1::OpenSessionResponse resp;
    auto call = std::async(std::launch::async, [&] { return stub->Open(&ctx, req, &resp); });
    std::this_thread::sleep_for(milliseconds(300 * (attempt + 1)));
    ctx.TryCancel();
    EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
    std::this_thread::sleep_for(milliseconds(300));
    cluster.etcd_proxy().StallAnswers(false);
    // The open went on once etcd answered, and committed its session...
    for (int i = 0; i < 30 && !committed; ++i) {
      const int64_t now = revision();
      for (int64_t r = from + 1; r <= now && !committed; ++r) committed = sessions(r) > 0;
      if (!committed) std::this_thread::sleep_for(milliseconds(100));
    }
  }
  ASSERT_TRUE(committed) << "the open never committed";
  // ...which was then closed again, freeing the namespace's one slot.
  for (int i = 0; i < 100 && sessions() != 0; ++i) std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(sessions(), 0) << "the session nobody knows of stays for its TTL";
  auto next = (*client)->OpenSession("one");
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(LockReplicasTest, TwoReplicas200ConcurrentAcquiresNeverTwoHolders) {
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
  const int64_t from = start->header().revision() + 1;

  constexpr int kAcquires = 200;
  constexpr int kWorkers = 20;
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) {
    auto cl = c.NewClient(r);
    ASSERT_TRUE(cl.ok());
    clients.push_back(std::move(*cl));
  }
  std::atomic<int> next{0}, granted{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      SessionOptions so;
      so.ttl = seconds(10);
      auto s = clients[w % 2]->OpenSession("default", so);
      if (!s.ok()) {
        failures++;
        return;
      }
      while (next.fetch_add(1) < kAcquires) {
        AcquireOptions ao;
        ao.wait = seconds(60);
        auto h = (*s)->Acquire("contended", ao);
        if (!h.ok()) {
          failures++;
          continue;
        }
        granted++;
        if (!h->Release().ok()) failures++;
      }
    });
  }
  for (auto& t : workers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(granted.load(), kAcquires);

  // Replay etcd's history of the hold range: at no revision two hold keys.
  pb::RangeRequest end_probe;
  end_probe.set_key("/");
  auto end = c.etcd_client().RangeSync(end_probe, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(end.ok());
  const int64_t to = end->header().revision();
  // Shared with the watch: a callback may still run after this test's locals end.
  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<mvccpb::Event> events;
  };
  auto seen = std::make_shared<Seen>();
  etcd::WatchSpec spec;
  spec.key = keyspace::HoldRangeBegin("default", "contended");
  spec.range_end = keyspace::HoldRangeEnd("default", "contended");
  spec.start_revision = from;
  const etcd::WatchId watch =
      c.etcd_client().watches().Watch(spec, [seen](absl::StatusOr<etcd::WatchBatch> b) {
        if (!b.ok()) return;
        std::lock_guard<std::mutex> l(seen->mu);
        for (auto& e : b->events) seen->events.push_back(e);
        seen->cv.notify_all();
      });
  std::vector<mvccpb::Event> events;
  {
    std::unique_lock<std::mutex> l(seen->mu);
    const bool all = seen->cv.wait_for(l, seconds(30), [&] {
      return static_cast<int>(seen->events.size()) >= 2 * kAcquires;
    });
    events = seen->events;
    l.unlock();
    c.etcd_client().watches().Cancel(watch);
    ASSERT_TRUE(all);
  }
  std::set<std::string> live;
  int max_live = 0, puts = 0;
  int64_t last_create = 0;
  for (const auto& e : events) {
    ASSERT_LE(e.kv().mod_revision(), to);
    if (e.type() == mvccpb::Event::PUT) {
      live.insert(e.kv().key());
      ++puts;
      EXPECT_GT(e.kv().create_revision(), last_create);  // tokens strictly increase
      last_create = e.kv().create_revision();
    } else {
      live.erase(e.kv().key());
    }
    max_live = std::max<int>(max_live, live.size());
  }
  EXPECT_EQ(puts, kAcquires);
  EXPECT_EQ(max_live, 1);
}

}  // namespace
}  // namespace holdfast
