// Holders that know when they lost (ARCHITECTURE §5, issue "client robustness"):
// quorum loss with closed and open classes, a frozen holder fenced off, fail-over
// between holdfastd replicas, and a client cut off from every replica. Real etcd
// members and holdfastd processes are paused (SIGSTOP) and killed.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <future>
#include <optional>
#include <utility>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "etcd/watch_hub.h"
#include "harness/cluster.h"
#include "holdfast/fence.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/keyspace.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
namespace pb = ::etcdserverpb;

// Polls `pred` every 20 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& pred, milliseconds timeout) {
  auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

absl::Status MakeClass(Client& client, const std::string& id, const std::string& prefix,
                       v1::OnQuorumLoss on_loss) {
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id(id);
  cls.set_key_prefix(prefix);
  cls.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  cls.set_on_quorum_loss(on_loss);
  return client.CreateClass(cls).status();
}

TEST(RobustnessTest, QuorumLossClosedHoldersLoseOpenHoldersGoOnUnprotected) {
  testing::TestCluster::Options o;
  o.etcd_members = 3;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto client = std::move(*cluster.NewClient());
  ASSERT_TRUE(MakeClass(*client, "open", "open/", v1::ON_QUORUM_LOSS_OPEN).ok());
  SessionOptions so;
  so.ttl = seconds(3);
  auto session = std::move(*client->OpenSession("default", so));
  auto closed_hold = session->Acquire("closed/job");
  auto open_hold = session->Acquire("open/job");
  ASSERT_TRUE(closed_hold.ok() && open_hold.ok());
  EXPECT_EQ(open_hold->info().on_quorum_loss(), v1::ON_QUORUM_LOSS_OPEN);

  // Pause the two followers: the leader loses its quorum and steps down, and
  // holdfastd has no member that can answer. (A paused *leader* could revoke
  // expired leases when it wakes, before it learns it was deposed: etcd's known
  // hazard, which would rightly make the open hold lost too.)
  std::vector<int> followers;
  for (int m = 0; m < 3; ++m) {
    auto timers = std::make_shared<TimerQueue>();
    etcd::ClientOptions eo;
    eo.endpoints = {cluster.etcd(m).endpoint()};
    auto member = std::move(*etcd::Client::Create(eo, timers));
    auto st = member->StatusSync(etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(st.ok()) << st.status();
    if (st->leader() != st->header().member_id()) followers.push_back(m);
  }
  ASSERT_EQ(followers.size(), 2u);
  auto paused_at = Clock::now();
  for (int m : followers) cluster.etcd(m).process()->Signal(SIGSTOP);
  ASSERT_TRUE(Eventually([&] { return closed_hold->lost(); }, seconds(15)));
  auto lost_after = Clock::now() - paused_at;
  EXPECT_LT(lost_after, seconds(3) + seconds(5)) << "lost only after TTL plus slack";
  EXPECT_NE(closed_hold->lost_reason().message().find("etcd"), std::string::npos)
      << closed_hold->lost_reason();
  EXPECT_TRUE(closed_hold->lost_token().stop_requested());
  ASSERT_TRUE(Eventually([&] { return open_hold->unprotected(); }, seconds(10)));
  EXPECT_FALSE(open_hold->lost());
  // No new grants while etcd has no quorum: every try is refused, and with
  // UNAVAILABLE at once as soon as holdfastd's health probe has seen the loss (a
  // probe that met a silent member asks the next one first, etcd/client.h, so
  // that may come a probe later than the holders' notice).
  AcquireOptions try_once;
  absl::Status last;
  ASSERT_TRUE(Eventually(
      [&] {
        auto refused = session->Acquire("closed/other", try_once);
        EXPECT_FALSE(refused.ok());
        last = refused.status();
        return last.code() == absl::StatusCode::kUnavailable;
      },
      seconds(15)))
      << last;
  EXPECT_NE(last.message().find("etcd"), std::string::npos) << last;

  // Quorum back: the open hold's lease is alive (etcd renews leases on a new
  // leader), so it is protected again; the closed one stays lost.
  for (int m : followers) cluster.etcd(m).process()->Signal(SIGCONT);
  ASSERT_TRUE(Eventually([&] { return !open_hold->unprotected(); }, seconds(20)));
  EXPECT_FALSE(open_hold->lost());
  EXPECT_TRUE(closed_hold->lost());
  // The lost hold is final: nothing released it, so it is still in etcd, and
  // asking for its key again on the same session is a new grant, not the lost
  // hold back with its token (docs/safety.md, (e)).
  auto again = session->Acquire("closed/job");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->token(), closed_hold->token());
  EXPECT_FALSE(again->lost());
  EXPECT_TRUE(again->Release().ok());
  EXPECT_TRUE(open_hold->Release().ok());
}

// The classic GC pause: a holder frozen past its TTL. Another client gets the
// lock; the frozen one learns it lost when it wakes, and its late write is
// rejected by a fence.
TEST(RobustnessTest, FrozenHolderLosesAndItsLateWriteIsFenced) {
  auto c = testing::TestCluster::Start();
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto log = cluster.dir() + "/frozen.log";
  dev::SpawnOptions so;
  so.argv = {testing::BinDir() + "/hf_test_holder", cluster.endpoint(), "default", "store/row",
             "2000"};
  so.log_file = log;
  auto holder = dev::Subprocess::Spawn(so);
  ASSERT_TRUE(holder.ok());
  auto read_log = [&] {
    std::ifstream f(log);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  ASSERT_TRUE(Eventually([&] { return read_log().find("TOKEN ") != std::string::npos; }, seconds(20)));
  const std::string out = read_log();
  const int64_t frozen_token = std::stoll(out.substr(out.find("TOKEN ") + 6));

  FenceVerifier fence;  // the resource both holders write to
  ASSERT_TRUE(fence.Admit("store/row", frozen_token).ok());
  (*holder)->Signal(SIGSTOP);
  auto client = std::move(*cluster.NewClient());
  auto session = std::move(*client->OpenSession("default"));
  AcquireOptions wait;
  wait.wait = seconds(30);
  auto next = session->Acquire("store/row", wait);  // granted once the frozen lease expires
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(next->token(), frozen_token);
  ASSERT_TRUE(fence.Admit("store/row", next->token()).ok());

  (*holder)->Signal(SIGCONT);
  ASSERT_TRUE(Eventually([&] { return read_log().find("LOST") != std::string::npos; }, seconds(20)))
      << read_log();
  auto late = fence.Admit("store/row", frozen_token);  // its write after waking up
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(fence.Highest("store/row"), next->token());
  EXPECT_EQ((*holder)->Wait(seconds(10)), std::optional<int>(4));  // exits 4 on a lost hold
}

TEST(RobustnessTest, ClientMovesToAnotherReplicaAndKeepsItsHoldAndQueuePlace) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  // Both clients know both replicas, and start on replica 0 (the first listed).
  auto client = std::move(*cluster.NewClient(-1));
  auto other = std::move(*cluster.NewClient(-1));
  SessionOptions so;
  so.ttl = seconds(3);
  auto session = std::move(*client->OpenSession("default", so));
  auto hold = session->Acquire("leader");
  ASSERT_TRUE(hold.ok());
  auto waiter_session = std::move(*other->OpenSession("default", so));
  auto waiting = std::async(std::launch::async, [&] {
    AcquireOptions w;
    w.wait = seconds(30);
    return waiter_session->Acquire("leader", w);
  });
  ASSERT_TRUE(Eventually([&] {
    auto d = client->Describe("default", "leader");
    return d.ok() && d->waiters_size() == 1;
  }, seconds(10)));

  cluster.holdfastd(0).Kill();
  // Two TTLs later the hold is alive: renewals went through replica 1.
  int64_t renewals = session->renewals();
  std::this_thread::sleep_for(seconds(6));
  EXPECT_FALSE(hold->lost()) << hold->lost_reason();
  EXPECT_GT(session->renewals(), renewals);
  auto d = client->Describe("default", "leader");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), session->id());
  ASSERT_EQ(d->waiters_size(), 1);  // the waiting acquire kept its place
  EXPECT_EQ(d->waiters(0).session_id(), waiter_session->id());
  ASSERT_TRUE(hold->Release().ok());
  auto granted = waiting.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_GT(granted->token(), hold->token());
}

// Two replicas and a queue on "leader": a holder and, behind it, `waiter` (its
// Client on replica 0 first, then replica 1) and `behind` (on replica 1). The
// tests take replica 0 away under the waiter's wait and check that the waiter,
// asked again on replica 1, kept its place: it is served first.
class MovedWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.replicas = 2;
    // Longer than any test here waits: a stopped replica must not wait it out.
    o.extra_config = "shutdown_grace: 60s\n";
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace().ok());
    holder_client_ = std::move(*cluster_->NewClient(1));
    behind_client_ = std::move(*cluster_->NewClient(1));
    waiter_client_ = std::move(*cluster_->NewClient(-1));
    SessionOptions so;
    so.ttl = seconds(3);
    holder_ = std::move(*holder_client_->OpenSession("default", so));
    auto hold = holder_->Acquire("leader");
    ASSERT_TRUE(hold.ok()) << hold.status();
    hold_ = std::move(*hold);
    waiter_ = std::move(*waiter_client_->OpenSession("default", so));
    behind_ = std::move(*behind_client_->OpenSession("default", so));
    AcquireOptions w;
    w.wait = seconds(60);
    waiting_ = std::async(std::launch::async, [this, w] { return waiter_->Acquire("leader", w); });
    ASSERT_TRUE(Queued(1));
    behind_waiting_ =
        std::async(std::launch::async, [this, w] { return behind_->Acquire("leader", w); });
    ASSERT_TRUE(Queued(2));
    auto d = holder_client_->Describe("default", "leader");
    ASSERT_TRUE(d.ok()) << d.status();
    first_create_revision_ = d->waiters(0).create_revision();
  }

  bool Queued(int n) {
    return Eventually([&] {
      auto d = holder_client_->Describe("default", "leader");
      return d.ok() && d->waiters_size() == n;
    }, seconds(10));
  }

  // The waiter's key in etcd: its create and mod revisions.
  std::optional<std::pair<int64_t, int64_t>> ReadWaiter() {
    pb::RangeRequest r;
    r.set_key(keyspace::WaitKey("default", "leader", waiter_->id()));
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    if (!got.ok() || got->kvs_size() != 1) return std::nullopt;
    return std::make_pair(got->kvs(0).create_revision(), got->kvs(0).mod_revision());
  }

  // The waiter is still first, in its place, and is served first.
  void ExpectServedInOrder() {
    auto d = holder_client_->Describe("default", "leader");
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->waiters_size(), 2);
    EXPECT_EQ(d->waiters(0).session_id(), waiter_->id());
    EXPECT_EQ(d->waiters(0).create_revision(), first_create_revision_);
    EXPECT_EQ(d->waiters(1).session_id(), behind_->id());
    EXPECT_EQ(waiting_.wait_for(seconds(0)), std::future_status::timeout);

    ASSERT_TRUE(hold_->Release().ok());
    ASSERT_EQ(waiting_.wait_for(seconds(10)), std::future_status::ready);
    auto granted = waiting_.get();
    ASSERT_TRUE(granted.ok()) << granted.status();
    EXPECT_GT(granted->token(), hold_->token());
    EXPECT_EQ(behind_waiting_.wait_for(seconds(0)), std::future_status::timeout);
    ASSERT_TRUE(granted->Release().ok());
    auto last = behind_waiting_.get();
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_TRUE(last->Release().ok());
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> holder_client_, behind_client_, waiter_client_;
  std::unique_ptr<Session> holder_, waiter_, behind_;
  std::optional<Hold> hold_;
  std::future<absl::StatusOr<Hold>> waiting_, behind_waiting_;
  int64_t first_create_revision_ = 0;
};

// A waiting acquire whose replica stops answering (SIGSTOP: its connection stays
// up) moves to the other replica once the keepalive pump passes the silent one
// over, and is asked again there: the new attempt takes the queued waiter over
// in place. When the paused replica wakes and ends the first attempt, its
// guarded delete leaves the waiter alone.
TEST_F(MovedWaitTest, AWaitOnAReplicaThatGoesSilentMovesAndKeepsItsPlace) {
  const auto first = ReadWaiter();
  ASSERT_TRUE(first.has_value());
  cluster_->holdfastd(0).process()->Signal(SIGSTOP);
  // Asked again on replica 1, which puts the waiter again in place.
  EXPECT_TRUE(Eventually([&] {
    auto now = ReadWaiter();
    return now && now->first == first->first && now->second != first->second;
  }, seconds(15)));
  EXPECT_EQ(waiting_.wait_for(seconds(0)), std::future_status::timeout);
  cluster_->holdfastd(0).process()->Signal(SIGCONT);
  // Replica 0 answers again, and has ended the first attempt by now.
  auto replica0 = std::move(*cluster_->NewClient(0));
  ASSERT_TRUE(Eventually([&] { return replica0->Describe("default", "leader").ok(); },
                         seconds(10)));
  std::this_thread::sleep_for(seconds(2));
  ExpectServedInOrder();
}

// A replica stopped (SIGTERM, a rolling restart) answers the waits it serves at
// once, UNAVAILABLE with the holdfast-stopping trailer, and ends its renewal
// streams so; it does not wait out its shutdown_grace for them. The waiter's
// Client asks again on the other replica, whose attempt takes the waiter over in
// place before the stopped replica's end of the first one would take it out
// (AcquireOp::Move keeps a queued waiter for a moment), and the stopped replica
// exits.
TEST_F(MovedWaitTest, AWaitOnAReplicaThatIsStoppedMovesAndKeepsItsPlace) {
  const auto first = ReadWaiter();
  ASSERT_TRUE(first.has_value());
  const auto stopped_at = Clock::now();
  cluster_->holdfastd(0).process()->Signal(SIGTERM);
  // Put again in place by replica 1 while replica 0's 60 s grace still runs.
  EXPECT_TRUE(Eventually([&] {
    auto now = ReadWaiter();
    return now && now->first == first->first && now->second != first->second;
  }, seconds(20)));
  const auto exit_code = cluster_->holdfastd(0).process()->Wait(seconds(20));
  ASSERT_TRUE(exit_code.has_value()) << "the stopped replica waited for its shutdown_grace";
  EXPECT_EQ(*exit_code, 0);
  std::printf("the stopped replica exited %lld ms after SIGTERM\n",
              static_cast<long long>(
                  std::chrono::duration_cast<milliseconds>(Clock::now() - stopped_at).count()));
  std::this_thread::sleep_for(seconds(3));  // past the moved waiter's moment
  ExpectServedInOrder();
}

// A wait whose caller does not ask again (a raw gRPC call, no libholdfast) is
// answered UNAVAILABLE with the holdfast-stopping trailer when its replica
// stops; the replica keeps its waiter a moment for a call asked again, then,
// before it exits, takes it out: the queue goes on without it.
TEST_F(MovedWaitTest, AStoppedReplicaTakesOutTheWaiterOfACallNotAskedAgain) {
  SessionOptions so;
  so.ttl = seconds(3);
  auto raw_session = holder_client_->OpenSession("default", so);  // renewed on replica 1
  ASSERT_TRUE(raw_session.ok()) << raw_session.status();
  auto stub = v1::Lock::NewStub(
      grpc::CreateChannel(cluster_->endpoint(0), grpc::InsecureChannelCredentials()));
  v1::AcquireRequest req;
  req.set_namespace_("default");
  req.set_session_id((*raw_session)->id());
  req.set_lock_key("leader");
  req.set_wait_ms(60'000);
  grpc::ClientContext ctx;
  v1::AcquireResponse resp;
  std::promise<grpc::Status> done;
  auto result = done.get_future();
  stub->async()->Acquire(&ctx, &req, &resp, [&done](grpc::Status st) { done.set_value(st); });
  ASSERT_TRUE(Queued(3));

  cluster_->holdfastd(0).process()->Signal(SIGTERM);
  ASSERT_EQ(result.wait_for(seconds(20)), std::future_status::ready);
  const grpc::Status answer = result.get();
  EXPECT_EQ(answer.error_code(), grpc::StatusCode::UNAVAILABLE) << answer.error_message();
  EXPECT_NE(answer.error_message().find("this holdfastd is stopping"), std::string::npos)
      << answer.error_message();
  EXPECT_EQ(ctx.GetServerTrailingMetadata().count("holdfast-stopping"), 1u);
  const auto exit_code = cluster_->holdfastd(0).process()->Wait(seconds(20));
  ASSERT_TRUE(exit_code.has_value()) << "the stopped replica waited for its shutdown_grace";
  EXPECT_EQ(*exit_code, 0);
  // Gone before the replica exited; the other two, taken over or on replica 1, stay.
  ExpectServedInOrder();
}

// A release sent to a replica that has just stopped answering is moved to the
// other replica with the renewals, and the key goes to the next waiter while the
// silent replica is still paused.
TEST(RobustnessTest, AReleaseOnAReplicaThatGoesSilentMovesAndFreesTheKey) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto holder_client = std::move(*cluster.NewClient(-1));  // replica 0 first
  auto waiter_client = std::move(*cluster.NewClient(1));
  SessionOptions so;
  so.ttl = seconds(3);
  auto holder = std::move(*holder_client->OpenSession("default", so));
  auto hold = holder->Acquire("leader");
  ASSERT_TRUE(hold.ok()) << hold.status();
  auto waiter = std::move(*waiter_client->OpenSession("default", so));
  AcquireOptions w;
  w.wait = seconds(60);
  auto waiting = std::async(std::launch::async, [&] { return waiter->Acquire("leader", w); });
  ASSERT_TRUE(Eventually([&] {
    auto d = waiter_client->Describe("default", "leader");
    return d.ok() && d->waiters_size() == 1;
  }, seconds(10)));

  cluster.holdfastd(0).process()->Signal(SIGSTOP);
  const auto sent = Clock::now();
  auto released = hold->Release();  // sent to replica 0, which does not answer
  const auto took = Clock::now() - sent;
  const bool answered_before_resume = waiting.wait_for(seconds(10)) == std::future_status::ready;
  cluster.holdfastd(0).process()->Signal(SIGCONT);
  EXPECT_TRUE(released.ok()) << released << " after "
                             << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  ASSERT_TRUE(answered_before_resume);
  auto granted = waiting.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_GT(granted->token(), hold->token());
  EXPECT_FALSE(holder->lost()) << holder->lost_reason();
  EXPECT_TRUE(granted->Release().ok());
}

TEST(RobustnessTest, ClientCutOffFromEveryReplicaDeclaresLostBeforeTheLeaseExpires) {
  auto c = testing::TestCluster::Start();
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto client = std::move(*cluster.NewClient());
  std::atomic<int64_t> lost_at_ns{0};
  SessionOptions so;
  so.ttl = seconds(3);
  so.on_lost = [&](const absl::Status&) {
    lost_at_ns = Clock::now().time_since_epoch().count();
  };
  auto session = std::move(*client->OpenSession("default", so));
  auto hold = session->Acquire("cut");
  ASSERT_TRUE(hold.ok());
  // Record when etcd deletes the hold key (the lease expired).
  // Shared with the watch: a callback may still run after this test's locals end.
  auto deleted_at_ns = std::make_shared<std::atomic<int64_t>>(0);
  etcd::WatchSpec spec;
  spec.key = keyspace::HoldRangeBegin("default", "cut");
  spec.range_end = keyspace::HoldRangeEnd("default", "cut");
  spec.no_put = true;
  cluster.etcd_client().watches().Watch(spec, [deleted_at_ns](absl::StatusOr<etcd::WatchBatch> b) {
    if (b.ok() && !b->events.empty() && *deleted_at_ns == 0) {
      *deleted_at_ns = Clock::now().time_since_epoch().count();
    }
  });
  cluster.holdfastd(0).process()->Signal(SIGSTOP);  // no answers, no renewals
  ASSERT_TRUE(Eventually([&] { return *deleted_at_ns != 0; }, seconds(20)));
  cluster.holdfastd(0).process()->Signal(SIGCONT);
  ASSERT_NE(lost_at_ns.load(), 0);
  EXPECT_TRUE(hold->lost());
  EXPECT_LT(lost_at_ns.load(), deleted_at_ns->load())
      << "the client must stop before etcd can hand the lock to anyone else";
}

}  // namespace
}  // namespace holdfast
