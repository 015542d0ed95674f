// op_rate_quota across replicas (ARCHITECTURE §9, issue 4 item 4): real etcd, two
// holdfastd replicas, clients hammering both through the raw gRPC API so that
// every call's outcome is counted. Upper bounds and "some were admitted" only:
// nothing here depends on how fast the machine is.
#include <atomic>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"
#include "harness/cluster.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"
#include "lock/keyspace.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
namespace pb = ::etcdserverpb;

constexpr char kNs[] = "rated";

// One RPC's outcome, with the retry-after-ms trailer if there was one.
struct Outcome {
  grpc::Status status;
  std::string retry_after;
  bool refused() const { return status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED; }
};

template <class Stub, class Req, class Resp>
Outcome Call(Stub* stub,
             grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
             const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(20));
  Outcome o;
  o.status = (stub->*method)(&ctx, req, resp);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    o.retry_after = std::string(it->second.data(), it->second.size());
  }
  return o;
}

// Raw stubs of one replica.
struct Replica {
  explicit Replica(const std::string& endpoint) {
    auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
    session = v1::Session::NewStub(channel);
    lock = v1::Lock::NewStub(channel);
  }
  Outcome Open(int64_t* id, int64_t ttl_ms = 30'000) {
    v1::OpenSessionRequest req;
    req.set_namespace_(kNs);
    req.set_ttl_ms(ttl_ms);
    v1::OpenSessionResponse resp;
    Outcome o = Call(session.get(), &v1::Session::Stub::Open, req, &resp);
    *id = resp.session_id();
    return o;
  }
  Outcome Acquire(int64_t session_id, const std::string& key, int64_t* token) {
    v1::AcquireRequest req;
    req.set_namespace_(kNs);
    req.set_session_id(session_id);
    req.set_lock_key(key);
    v1::AcquireResponse resp;
    Outcome o = Call(lock.get(), &v1::Lock::Stub::Acquire, req, &resp);
    *token = resp.hold().token();
    return o;
  }
  Outcome Release(int64_t session_id, const std::string& key, int64_t token) {
    v1::ReleaseRequest req;
    req.set_namespace_(kNs);
    req.set_session_id(session_id);
    req.set_lock_key(key);
    req.set_token(token);
    v1::ReleaseResponse resp;
    return Call(lock.get(), &v1::Lock::Stub::Release, req, &resp);
  }
  Outcome Close(int64_t session_id) {
    v1::CloseSessionRequest req;
    req.set_namespace_(kNs);
    req.set_session_id(session_id);
    v1::CloseSessionResponse resp;
    return Call(session.get(), &v1::Session::Stub::Close, req, &resp);
  }
  std::unique_ptr<v1::Session::Stub> session;
  std::unique_ptr<v1::Lock::Stub> lock;
};

// Calls counted by outcome.
struct Tally {
  std::atomic<int64_t> admitted{0};  // reached the engine, whatever it answered
  std::atomic<int64_t> refused{0};   // RESOURCE_EXHAUSTED
  std::atomic<int64_t> bad_refusals{0};  // refused without a usable retry hint
  // Counts `o`; false when it was refused.
  bool Count(const Outcome& o) {
    if (!o.refused()) {
      ++admitted;
      return true;
    }
    ++refused;
    int64_t ms = 0;
    if (!absl::SimpleAtoi(o.retry_after, &ms) || ms <= 0 ||
        o.status.error_message().find("op_rate_quota") == std::string::npos ||
        o.status.error_message().find(absl::StrCat("retry after ", ms, " ms")) ==
            std::string::npos) {
      ++bad_refusals;
    }
    return false;
  }
};

class QuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.replicas = 2;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok()) << client.status();
    admin_ = std::move(*client);
  }

  absl::Status CreateRated(int64_t quota) {
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name(kNs);
    req.mutable_namespace_()->set_op_rate_quota(quota);
    return admin_->CreateNamespace(req).status();
  }

  // `holdfast ns set rated --op-rate-quota N` through the CLI binary.
  void SetQuotaWithCli(int64_t quota) {
    dev::SpawnOptions so;
    so.argv = {testing::BinDir() + "/holdfast", "--endpoint", cluster_->endpoint(1), "ns",
               "set", kNs, "--op-rate-quota", absl::StrCat(quota)};
    so.env = {{"HOLDFAST_DEV_DIR", cluster_->dir() + "/no-dev-dir"}};
    so.log_file = cluster_->dir() + "/cli.log";
    auto p = dev::Subprocess::Spawn(std::move(so));
    ASSERT_TRUE(p.ok()) << p.status();
    auto code = (*p)->Wait(seconds(60));
    ASSERT_TRUE(code.has_value());
    ASSERT_EQ(*code, 0) << "see " << cluster_->dir() << "/cli.log";
  }

  // Every key under the namespace with its mod revision.
  std::map<std::string, int64_t> Subtree() {
    pb::RangeRequest r;
    r.set_key(keyspace::NamespacePrefix(kNs));
    r.set_range_end(keyspace::PrefixEnd(keyspace::NamespacePrefix(kNs)));
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(10)));
    EXPECT_TRUE(resp.ok()) << resp.status();
    std::map<std::string, int64_t> keys;
    if (resp.ok()) {
      for (const auto& kv : resp->kvs()) keys[kv.key()] = kv.mod_revision();
    }
    return keys;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> admin_;
};

// One client thread: open a session, then acquire and release its own key, over
// and over, counting every call. A refused call is asked again after 5 ms (more
// often than the hint says: the client hammers).
void Hammer(Replica* replica, int id, Clock::time_point until, Tally* tally) {
  int64_t session = 0, token = 0;
  const std::string key = absl::StrCat("hammer/", id);
  while (Clock::now() < until) {
    Outcome o;
    if (session == 0) {
      int64_t opened = 0;
      o = replica->Open(&opened);
      if (o.status.ok()) session = opened;
    } else if (token == 0) {
      int64_t got = 0;
      o = replica->Acquire(session, key, &got);
      if (o.status.ok()) token = got;
    } else {
      o = replica->Release(session, key, token);
      if (!o.refused()) token = 0;
    }
    if (!tally->Count(o)) std::this_thread::sleep_for(milliseconds(5));
  }
}

TEST_F(QuotaTest, TwoHammeredReplicasTogetherStayWithinTheQuota) {
  constexpr int64_t kQuota = 20;
  ASSERT_TRUE(CreateRated(kQuota).ok());
  Replica replicas[] = {Replica(cluster_->endpoint(0)), Replica(cluster_->endpoint(1))};
  Tally tallies[2];
  constexpr int kThreadsPerReplica = 3;
  const auto start = Clock::now();
  const auto until = start + seconds(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < kThreadsPerReplica; ++t) {
      threads.emplace_back(Hammer, &replicas[r], r * 10 + t, until, &tallies[r]);
    }
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  const int64_t admitted = tallies[0].admitted + tallies[1].admitted;
  const int64_t refused = tallies[0].refused + tallies[1].refused;
  // The limiter's promise (server/rate_limit.h): Q per second across replicas,
  // plus a burst of half a second of Q and one operation per replica. The 10%
  // covers how the replicas' shares move while their demands are published.
  const double bound = kQuota * elapsed * 1.1 + kQuota * 0.5 + 2;
  std::printf("admitted %lld + %lld (bound %.1f), refused %lld, in %.2f s\n",
              static_cast<long long>(tallies[0].admitted.load()),
              static_cast<long long>(tallies[1].admitted.load()), bound,
              static_cast<long long>(refused), elapsed);
  EXPECT_LE(admitted, bound) << "admitted " << tallies[0].admitted << " + "
                             << tallies[1].admitted << " in " << elapsed << " s";
  // Some were admitted on each replica (a fresh bucket starts full).
  EXPECT_GT(tallies[0].admitted, 0);
  EXPECT_GT(tallies[1].admitted, 0);
  // The clients asked for far more, and every refusal said when to come back.
  EXPECT_GT(refused, 0);
  EXPECT_EQ(tallies[0].bad_refusals + tallies[1].bad_refusals, 0);
}

TEST_F(QuotaTest, ARefusedCallChangesNothingAndQuotasChangeLive) {
  ASSERT_TRUE(CreateRated(1000).ok());
  Replica replica(cluster_->endpoint(0));
  Tally tally;
  int64_t session = 0;
  Outcome opened = replica.Open(&session);
  ASSERT_TRUE(opened.status.ok()) << opened.status.error_message();
  // Holds and a session to give back once the quota is used up.
  std::vector<std::pair<std::string, int64_t>> held;
  for (int i = 0; i < 3; ++i) {
    int64_t token = 0;
    const std::string key = absl::StrCat("held/", i);
    Outcome o = replica.Acquire(session, key, &token);
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    held.emplace_back(key, token);
  }
  int64_t spare = 0;
  ASSERT_TRUE(replica.Open(&spare).status.ok());

  // Lowered live: 1 operation per second across both replicas.
  SetQuotaWithCli(1);
  // Fresh keys until a call is refused (the watch brings the new quota within
  // moments; a bucket of one operation then refuses the second call).
  int refused_at = -1;
  std::vector<int> granted;
  for (int i = 0; i < 200 && refused_at < 0; ++i) {
    const std::string key = absl::StrCat("probe/", i);
    auto before = Subtree();
    int64_t token = 0;
    Outcome o = replica.Acquire(session, key, &token);
    if (!tally.Count(o)) {
      refused_at = i;
      // Nothing changed: not the key's holds or waiters, nor anything else in
      // the namespace.
      EXPECT_EQ(Subtree(), before);
      pb::RangeRequest r;
      r.set_key(keyspace::HoldRangeBegin(kNs, key));
      r.set_range_end(keyspace::HoldRangeEnd(kNs, key));
      r.set_count_only(true);
      auto holds = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(10)));
      ASSERT_TRUE(holds.ok()) << holds.status();
      EXPECT_EQ(holds->count(), 0);
    } else {
      EXPECT_TRUE(o.status.ok()) << o.status.error_message();
      granted.push_back(i);
    }
    if (refused_at < 0) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GE(refused_at, 0) << "quota 1/s never refused a call";
  EXPECT_EQ(tally.bad_refusals, 0);
  // Releases and closes are counted but never refused: with the bucket empty,
  // four of them in a row all go through (at 1/s, at most one would be admitted).
  for (const auto& [key, token] : held) {
    Outcome o = replica.Release(session, key, token);
    EXPECT_TRUE(o.status.ok()) << key << ": " << o.status.error_message();
  }
  Outcome closed = replica.Close(spare);
  EXPECT_TRUE(closed.status.ok()) << closed.status.error_message();
  const auto after_giving_back = Subtree();
  for (const auto& [key, token] : held) {
    auto hold = after_giving_back.lower_bound(keyspace::HoldRangeBegin(kNs, key));
    EXPECT_TRUE(hold == after_giving_back.end() ||
                hold->first >= keyspace::HoldRangeEnd(kNs, key))
        << key << " is still held";
  }
  EXPECT_EQ(after_giving_back.count(keyspace::SessionKey(kNs, spare)), 0u);
  // The acquire after them waits for what they took.
  int64_t after_token = 0;
  Outcome after = replica.Acquire(session, "after", &after_token);
  EXPECT_TRUE(after.refused()) << after.status.error_message();
  // A refused Open leaves no session (and no lease) behind either.
  for (int i = 0; i < 50; ++i) {
    auto before = Subtree();
    int64_t id = 0;
    Outcome o = replica.Open(&id, 10'000);
    if (o.refused()) {
      EXPECT_EQ(Subtree(), before);
      break;
    }
  }

  // libholdfast hands the hint on: RetryAfter() of the refusal.
  auto lib = cluster_->NewClient();
  ASSERT_TRUE(lib.ok()) << lib.status();
  bool lib_refused = false;
  for (int i = 0; i < 50 && !lib_refused; ++i) {
    auto s = (*lib)->OpenSession(kNs);
    if (s.status().code() != absl::StatusCode::kResourceExhausted) continue;
    lib_refused = true;
    auto hint = RetryAfter(s.status());
    ASSERT_TRUE(hint.has_value()) << s.status();
    EXPECT_GT(hint->count(), 0);
    // At a share of 1/s split between two replicas, a bucket of one token that
    // the releases and the close above may have put one token into debt: at
    // most (1 + 1) / 0.5 s.
    EXPECT_LE(hint->count(), 4000) << "a 1/s quota asks for at most a few seconds";
  }
  EXPECT_TRUE(lib_refused) << "quota 1/s never refused a libholdfast Open";
  EXPECT_FALSE(RetryAfter(absl::ResourceExhaustedError("no hint")).has_value());
  EXPECT_FALSE(RetryAfter(absl::OkStatus()).has_value());

  // Lifted live: every call goes through again.
  SetQuotaWithCli(0);
  int in_a_row = 0;
  const auto until = Clock::now() + seconds(60);
  while (in_a_row < 50 && Clock::now() < until) {
    int64_t token = 0;
    Outcome o = replica.Acquire(session, "probe/0", &token);
    in_a_row = o.refused() ? 0 : in_a_row + 1;
    if (o.refused()) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GE(in_a_row, 50) << "quota 0 (unlimited) still refused calls";
}

TEST_F(QuotaTest, TheReplicaSetIsInEtcdAndAReplicaThatLostItsLeaseRegistersAgain) {
  auto replicas = [&] {
    pb::RangeRequest r;
    r.set_key(keyspace::ReplicaPrefix());
    r.set_range_end(keyspace::PrefixEnd(keyspace::ReplicaPrefix()));
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(10)));
    EXPECT_TRUE(resp.ok()) << resp.status();
    std::map<int64_t, int64_t> leases;  // id -> the key's lease
    if (resp.ok()) {
      for (const auto& kv : resp->kvs()) {
        auto id = keyspace::ParseReplicaKey(kv.key());
        EXPECT_TRUE(id.has_value()) << kv.key();
        if (id) leases[*id] = kv.lease();
      }
    }
    return leases;
  };
  auto before = replicas();
  ASSERT_EQ(before.size(), 2u);
  for (const auto& [id, lease] : before) EXPECT_EQ(id, lease);  // named by its lease

  // Revoke one replica's lease behind its back: its key goes, and it comes back
  // under a new lease.
  const int64_t gone = before.begin()->first;
  pb::LeaseRevokeRequest revoke;
  revoke.set_id(gone);
  auto revoked = etcd::Await<pb::LeaseRevokeResponse>(
      [&](etcd::Callback<pb::LeaseRevokeResponse> cb) {
        cluster_->etcd_client().LeaseRevoke(revoke, etcd::DeadlineIn(seconds(10)), std::move(cb));
      });
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  std::map<int64_t, int64_t> after;
  const auto until = Clock::now() + seconds(60);
  do {
    std::this_thread::sleep_for(milliseconds(100));
    after = replicas();
  } while ((after.size() != 2 || after.count(gone) > 0) && Clock::now() < until);
  EXPECT_EQ(after.size(), 2u);
  EXPECT_EQ(after.count(gone), 0u);

  // A replica that stops leaves at once (it revokes its lease).
  cluster_->holdfastd(0).Stop();
  EXPECT_EQ(replicas().size(), 1u);
}

}  // namespace
}  // namespace holdfast
