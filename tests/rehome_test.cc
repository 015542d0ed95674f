// Several etcd clusters and `ns rehome`, against real etcd processes: holdfastd
// serves clusters "a" (control, tier a) and "b" (tier b). Routing by tier puts a
// namespace's keys in its home cluster only; a rehome between the clusters while
// clients hold and wait keeps every token after the flip above every token
// before and never has two holders; a rehome past its deadline fails and leaves
// both key spaces as they were; a rehome never forces a hold open (two admins
// force-release it, then the rehome goes on); a rehome interrupted after a step
// is finished by running it again.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"
#include "harness/cluster.h"
#include "holdfast/v1/admin.grpc.pb.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/token.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

// Every key under /holdfast/ns/ and /holdfast/placement/ with its value.
std::map<std::string, std::string> KeySpace(etcd::Client& etcd) {
  std::map<std::string, std::string> out;
  for (const std::string& prefix : {keyspace::NamespacesBegin(), keyspace::PlacementPrefix()}) {
    pb::RangeRequest r;
    r.set_key(prefix);
    r.set_range_end(keyspace::PrefixEnd(prefix));
    auto got = etcd.RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) continue;
    for (const auto& kv : got->kvs()) out[kv.key()] = kv.value();
  }
  return out;
}

bool HasKeysOf(const std::map<std::string, std::string>& space, const std::string& ns) {
  return space.count(keyspace::NamespaceKey(ns)) > 0 ||
         std::any_of(space.begin(), space.end(), [&](const auto& kv) {
           return kv.first.rfind(keyspace::NamespacePrefix(ns), 0) == 0;
         });
}

class RehomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.extra_etcd_clusters = 1;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    auto client = cluster_->NewClient();
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }

  void CreateNamespace(const std::string& ns, const std::string& tier) {
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name(ns);
    req.mutable_namespace_()->set_cluster_tier(tier);
    req.mutable_default_class()->set_mode(v1::LOCK_MODE_SHARED);
    auto r = client_->CreateNamespace(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  absl::StatusOr<v1::RehomeNamespaceResponse> Rehome(const std::string& ns, const std::string& to,
                                                     milliseconds deadline = seconds(20),
                                                     bool force = false, bool abort = false) {
    v1::RehomeNamespaceRequest req;
    req.set_name(ns);
    req.set_to(to);
    req.set_deadline_ms(deadline.count());
    req.set_force(force);
    req.set_abort(abort);
    return client_->RehomeNamespace(req);
  }

  // RehomeNamespace of `ns` to "b" straight through a stub, on `ctx` (its
  // deadline, its cancel), as a caller other than libholdfast would ask.
  grpc::Status RawRehome(grpc::ClientContext* ctx, const std::string& ns, int64_t deadline_ms) {
    auto stub = v1::Admin::NewStub(
        grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
    v1::RehomeNamespaceRequest req;
    req.set_name(ns);
    req.set_to("b");
    req.set_deadline_ms(deadline_ms);
    v1::RehomeNamespaceResponse resp;
    return stub->RehomeNamespace(ctx, req, &resp);
  }

  etcd::Client& a() { return cluster_->etcd_client(); }
  etcd::Client& b() { return cluster_->extra_etcd_client(0); }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

// A page of namespaces from two clusters: each lists one more than the page
// after the token, and the page ends at the first name a cluster's list was cut
// at, so that a name the cut list did not reach is never passed over. Pages of
// 1, 2 and 3 (and libholdfast's, which follows them) list every name once, in
// order, wherever each is homed.
TEST_F(RehomeTest, PagesOfNamespacesFromTwoClustersListEachOnceInOrder) {
  std::vector<std::string> names;
  for (int i = 0; i < 9; ++i) {
    const std::string ns = absl::StrCat("p", i);
    // Homed on a, a, b, a, b, b, a, b, b: runs of either length on each.
    CreateNamespace(ns, (0b110110100 >> i) & 1 ? "b" : "");
    names.push_back(ns);
  }
  auto stub = v1::Admin::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  for (const int size : {1, 2, 3}) {
    SCOPED_TRACE(size);
    std::vector<std::string> listed;
    std::string token;
    for (int pages = 0; pages < 30; ++pages) {
      grpc::ClientContext ctx;
      v1::ListNamespacesRequest req;
      req.set_page_size(size);
      req.set_page_token(token);
      v1::ListNamespacesResponse resp;
      ASSERT_TRUE(stub->ListNamespaces(&ctx, req, &resp).ok());
      EXPECT_LE(resp.namespaces_size(), size);
      for (const auto& n : resp.namespaces()) listed.push_back(n.name());
      token = resp.next_page_token();
      if (token.empty()) break;
    }
    EXPECT_EQ(listed, names);
  }
  auto all = client_->ListNamespaces();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ((*all)[i].name(), names[i]);
    EXPECT_EQ((*all)[i].home_cluster(), (0b110110100 >> i) & 1 ? "b" : "a") << names[i];
  }
}

TEST_F(RehomeTest, NamespacesAreHomedOnTheClusterOfTheirTier) {
  CreateNamespace("on-a", "");
  CreateNamespace("on-b", "b");
  for (const std::string ns : {"on-a", "on-b"}) {
    auto s = client_->OpenSession(ns);
    ASSERT_TRUE(s.ok()) << ns << ": " << s.status();
    auto h = (*s)->Acquire("jobs/x");
    ASSERT_TRUE(h.ok()) << ns << ": " << h.status();
    // Keep the hold and the session while the key spaces are read.
    auto in_a = KeySpace(a()), in_b = KeySpace(b());
    const bool home_is_a = ns == "on-a";
    EXPECT_EQ(HasKeysOf(in_a, ns), home_is_a) << ns;
    EXPECT_EQ(HasKeysOf(in_b, ns), !home_is_a) << ns;
    auto& home = home_is_a ? in_a : in_b;
    EXPECT_EQ(home.count(keyspace::HoldKey(ns, "jobs/x", (*s)->id())), 1u) << ns;
    EXPECT_TRUE(h->Release().ok());
  }
  // The control cluster keeps where "on-b" lives, and nothing else about it.
  auto in_a = KeySpace(a());
  ASSERT_EQ(in_a.count(keyspace::PlacementKey("on-b")), 1u);
  records::PlacementRecord p;
  ASSERT_TRUE(p.ParseFromString(in_a[keyspace::PlacementKey("on-b")]));
  EXPECT_EQ(p.home(), "b");
  EXPECT_EQ(in_a.count(keyspace::PlacementKey("on-a")), 0u);

  auto got = client_->GetNamespace("on-b");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->home_cluster(), "b");
  auto list = client_->ListNamespaces();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].home_cluster(), "a");
  EXPECT_EQ((*list)[1].home_cluster(), "b");

  // A tier no cluster has: refused, nothing written anywhere.
  auto before_a = KeySpace(a()), before_b = KeySpace(b());
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("nowhere");
  req.mutable_namespace_()->set_cluster_tier("gold");
  auto r = client_->CreateNamespace(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no etcd cluster of tier \"gold\""), std::string::npos)
      << r.status();
  EXPECT_EQ(KeySpace(a()), before_a);
  EXPECT_EQ(KeySpace(b()), before_b);
  // A name taken on the other cluster is taken.
  req.mutable_namespace_()->set_name("on-a");
  req.mutable_namespace_()->set_cluster_tier("b");
  EXPECT_EQ(client_->CreateNamespace(req).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(KeySpace(b()), before_b);
}

TEST_F(RehomeTest, BadRequestsAreRefusedAndChangeNothing) {
  CreateNamespace("pay", "");
  auto before_a = KeySpace(a()), before_b = KeySpace(b());
  struct Case {
    std::string ns, to;
    absl::StatusCode code;
    std::string text;
  };
  for (const Case& c : std::vector<Case>{
           {"pay", "zz", absl::StatusCode::kNotFound, "no etcd cluster named \"zz\" (clusters: a, b)"},
           {"pay", "a", absl::StatusCode::kInvalidArgument, "already homed on cluster \"a\""},
           {"ghost", "b", absl::StatusCode::kNotFound, "namespace \"ghost\" does not exist"},
       }) {
    auto r = Rehome(c.ns, c.to);
    EXPECT_EQ(r.status().code(), c.code) << c.ns << " -> " << c.to << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.text), std::string::npos) << r.status();
  }
  auto abort = Rehome("pay", "b", seconds(1), false, /*abort=*/true);
  EXPECT_EQ(abort.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(abort.status().message().find("no rehome"), std::string::npos) << abort.status();
  EXPECT_EQ(KeySpace(a()), before_a);
  EXPECT_EQ(KeySpace(b()), before_b);
}

TEST_F(RehomeTest, RehomeWhileClientsHoldAndWaitKeepsTokensIncreasingAndOneHolder) {
  CreateNamespace("pay", "");
  std::vector<int64_t> before;
  auto holder = client_->OpenSession("pay");
  ASSERT_TRUE(holder.ok());
  auto held = (*holder)->Acquire("db/primary");
  ASSERT_TRUE(held.ok());
  before.push_back(held->token());
  for (int i = 0; i < 5; ++i) {
    auto h = (*holder)->Acquire(absl::StrCat("cycle/", i));
    ASSERT_TRUE(h.ok());
    before.push_back(h->token());
    ASSERT_TRUE(h->Release().ok());
  }
  // A waiter queued behind the holder.
  auto waiter = client_->OpenSession("pay");
  ASSERT_TRUE(waiter.ok());
  absl::Status waited = absl::UnknownError("not done");
  std::thread wait_thread([&] {
    auto h = (*waiter)->Acquire("db/primary", testing::Waiting(seconds(30)));
    waited = h.ok() ? absl::InternalError("granted during the rehome") : h.status();
  });
  std::this_thread::sleep_for(milliseconds(300));  // queued (nothing else waits on it)

  absl::StatusOr<v1::RehomeNamespaceResponse> result = absl::UnknownError("not done");
  std::thread rehome([&] { result = Rehome("pay", "b", seconds(20)); });
  // Draining: new sessions are refused with UNAVAILABLE and a retry hint.
  absl::Status refused;
  for (int i = 0; i < 100; ++i) {
    auto s = client_->OpenSession("pay");
    if (!s.ok()) {
      refused = s.status();
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("retry after"), std::string::npos) << refused;
  // The holder finishes; the rehome goes on, the waiter is told to come back.
  ASSERT_TRUE(held->Release().ok());
  rehome.join();
  wait_thread.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->from(), "a");
  EXPECT_EQ(result->to(), "b");
  // b's epoch is above every epoch a's tokens carry (advanced only if needed).
  EXPECT_GE(result->epoch(), 2);
  EXPECT_TRUE(waited.code() == absl::StatusCode::kUnavailable ||
              waited.code() == absl::StatusCode::kNotFound)
      << waited;

  // Moved: keys on b only; the old sessions are gone, new ones work on b.
  EXPECT_FALSE(HasKeysOf(KeySpace(a()), "pay"));
  EXPECT_TRUE(HasKeysOf(KeySpace(b()), "pay"));
  auto again = client_->OpenSession("pay");
  ASSERT_TRUE(again.ok()) << again.status();
  auto h = (*again)->Acquire("db/primary");
  ASSERT_TRUE(h.ok()) << h.status();
  for (int64_t t : before) EXPECT_GT(h->token(), t);
  auto who = client_->Describe("pay", "db/primary");
  ASSERT_TRUE(who.ok());
  ASSERT_EQ(who->holders_size(), 1);
  EXPECT_EQ(who->holders(0).session_id(), (*again)->id());
  // The old holder's session is lost (its lease was on cluster a).
  for (int i = 0; i < 100 && !(*holder)->lost(); ++i) std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE((*holder)->lost());
  auto got = client_->GetNamespace("pay");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->home_cluster(), "b");
  EXPECT_EQ(got->rehoming_to(), "");
  // And back to the control cluster: its placement record goes away again.
  ASSERT_TRUE(h->Release().ok());
  ASSERT_TRUE((*again)->Close().ok());
  auto back = Rehome("pay", "a", seconds(5));
  ASSERT_TRUE(back.ok()) << back.status();
  auto in_a = KeySpace(a());
  EXPECT_TRUE(HasKeysOf(in_a, "pay"));
  EXPECT_EQ(in_a.count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
  auto last = client_->OpenSession("pay");
  ASSERT_TRUE(last.ok()) << last.status();
  auto t = (*last)->Acquire("db/primary");
  ASSERT_TRUE(t.ok()) << t.status();
  for (int64_t x : before) EXPECT_GT(t->token(), x);
  EXPECT_GT(t->token(), h->token()) << "above the tokens granted on b too";
}

int64_t RevisionOf(etcd::Client& etcd) {
  pb::RangeRequest r;
  r.set_key(keyspace::EpochKey());
  auto got = etcd.RangeSync(r, etcd::DeadlineIn(seconds(5)));
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? got->header().revision() : 0;
}

// Without an audit store there is no epoch history, so only the rehome knows which
// epochs the namespace's tokens carry. Back on a cluster whose revisions are below
// the ones it had on the other, it must still get an epoch above them all.
TEST(RehomeWithoutAuditStoreTest, MovingBackGetsAnEpochAboveTheTokensOfTheOtherCluster) {
  testing::TestCluster::Options o;
  o.extra_etcd_clusters = 1;
  o.holdfastd_args = {"--audit-store", "none"};
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto client = (*c)->NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  v1::CreateNamespaceRequest create;
  create.mutable_namespace_()->set_name("pay");
  create.mutable_default_class()->set_mode(v1::LOCK_MODE_SHARED);
  ASSERT_TRUE((*client)->CreateNamespace(create).ok());
  v1::RehomeNamespaceRequest to_b;
  to_b.set_name("pay");
  to_b.set_to("b");
  to_b.set_deadline_ms(20000);
  auto moved = (*client)->RehomeNamespace(to_b);
  ASSERT_TRUE(moved.ok()) << moved.status();

  // Lock cycles on b until b's revisions are well past a's.
  int64_t highest_on_b = 0;
  {
    auto s = (*client)->OpenSession("pay");
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 2000 && RevisionOf((*c)->extra_etcd_client(0)) <=
                                    RevisionOf((*c)->etcd_client()) + 50;
         ++i) {
      auto h = (*s)->Acquire("db/primary");
      ASSERT_TRUE(h.ok()) << h.status();
      highest_on_b = std::max(highest_on_b, h->token());
      ASSERT_TRUE(h->Release().ok());
    }
    ASSERT_TRUE((*s)->Close().ok());
  }
  ASSERT_GT(RevisionOf((*c)->extra_etcd_client(0)), RevisionOf((*c)->etcd_client()) + 50);

  v1::RehomeNamespaceRequest to_a = to_b;
  to_a.set_to("a");
  auto back = (*client)->RehomeNamespace(to_a);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_GT(back->epoch(), token::EpochOf(highest_on_b));
  auto s = (*client)->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_GT(h->token(), highest_on_b);
}

// Clients take turns on one key through a rehome, reopening their sessions when
// they lose them. Each records when it knew it held (after the grant, before the
// release), so two records that overlap would be two holders at once; and a
// hold that began after another ended must have the higher token.
TEST_F(RehomeTest, ClientsTakingTurnsThroughARehomeNeverOverlapAndTokensOnlyGrow) {
  CreateNamespace("pay", "");
  struct Held {
    int64_t token;
    std::chrono::steady_clock::time_point from, to;
  };
  absl::Mutex mu;
  std::vector<Held> held;
  std::atomic<bool> stop{false};
  std::atomic<int> after_flip{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&] {
      auto client = cluster_->NewClient();
      if (!client.ok()) return;
      std::unique_ptr<Session> session;
      while (!stop) {
        if (session == nullptr || session->lost()) {
          SessionOptions so;
          so.ttl = seconds(5);
          auto s = (*client)->OpenSession("pay", so);
          if (!s.ok()) {
            std::this_thread::sleep_for(milliseconds(50));
            continue;
          }
          session = std::move(*s);
        }
        auto h = session->Acquire("k", testing::Waiting(seconds(2)));
        if (!h.ok()) {
          if (h.status().code() != absl::StatusCode::kDeadlineExceeded) session.reset();
          continue;
        }
        Held one{h->token(), std::chrono::steady_clock::now(), {}};
        std::this_thread::sleep_for(milliseconds(20));
        one.to = std::chrono::steady_clock::now();
        if (!h->Release().ok()) session.reset();
        absl::MutexLock l(&mu);
        held.push_back(one);
        if (token::EpochOf(one.token) > 1) ++after_flip;
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(800));
  auto r = Rehome("pay", "b", seconds(20));
  ASSERT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 100 && after_flip < 5; ++i) std::this_thread::sleep_for(milliseconds(100));
  stop = true;
  for (auto& t : workers) t.join();
  absl::MutexLock l(&mu);
  ASSERT_GE(after_flip.load(), 5);
  std::sort(held.begin(), held.end(), [](const Held& x, const Held& y) { return x.from < y.from; });
  int before_flip = 0;
  for (size_t i = 0; i < held.size(); ++i) {
    if (token::EpochOf(held[i].token) == 1) ++before_flip;
    if (i == 0) continue;
    EXPECT_LE(held[i - 1].to, held[i].from) << "two holders at once: tokens "
                                            << held[i - 1].token << " and " << held[i].token;
    EXPECT_LT(held[i - 1].token, held[i].token) << "a token went backwards";
  }
  EXPECT_GT(before_flip, 0);
  // Every grant the audit recorded for the namespace on cluster a is below every
  // token granted on b.
  int64_t max_before = 0, min_after = INT64_MAX;
  for (const auto& h : held) {
    if (token::EpochOf(h.token) > 1) min_after = std::min(min_after, h.token);
  }
  v1::QueryAuditRequest q;
  q.set_namespace_("pay");
  q.set_type("grant");
  q.set_limit(10000);
  int audited_before = 0;
  for (int i = 0; i < 100 && audited_before < before_flip; ++i) {
    auto events = client_->QueryAudit(q);
    ASSERT_TRUE(events.ok());
    audited_before = 0;
    for (const auto& e : events->events()) {
      if (token::EpochOf(e.token()) != 1) continue;
      ++audited_before;
      max_before = std::max(max_before, e.token());
    }
    if (audited_before < before_flip) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_GE(audited_before, before_flip);
  EXPECT_LT(max_before, min_after);
}

TEST_F(RehomeTest, HoldsPastTheDeadlineFailTheRehomeAndChangeNothing) {
  CreateNamespace("pay", "");
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok());
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok());
  auto before_a = KeySpace(a()), before_b = KeySpace(b());
  auto r = Rehome("pay", "b", milliseconds(700));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("1 hold(s)"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("nothing changed"), std::string::npos) << r.status();
  EXPECT_EQ(KeySpace(a()), before_a);
  EXPECT_EQ(KeySpace(b()), before_b);
  // Still served on a: the hold is current, new sessions open.
  auto check = client_->CheckToken("pay", "db/primary", h->token());
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->current());
  EXPECT_TRUE(client_->OpenSession("pay").ok());
  EXPECT_EQ(client_->GetNamespace("pay")->home_cluster(), "a");
}

// A waiter woken while its namespace drains for a rehome is refused and leaves
// the queue: when the rehome is then rolled back, no waiter whose call has
// answered stands at the head of the queue (it would be handed the key, or keep
// everyone behind it waiting until its deadline).
TEST_F(RehomeTest, AWaiterRefusedDuringADrainLeavesTheQueue) {
  CreateNamespace("pay", "");
  auto holder = client_->OpenSession("pay");
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto stays = (*holder)->Acquire("db/stays");  // keeps the rehome from finishing
  ASSERT_TRUE(stays.ok()) << stays.status();
  std::optional<Hold> k;
  {
    auto got = (*holder)->Acquire("db/k");
    ASSERT_TRUE(got.ok()) << got.status();
    k.emplace(std::move(*got));
  }
  auto waiter = client_->OpenSession("pay");
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  // One call by hand: libholdfast would ask again after UNAVAILABLE.
  auto stub = v1::Lock::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  v1::AcquireRequest ask;
  ask.set_namespace_("pay");
  ask.set_session_id((*waiter)->id());
  ask.set_lock_key("db/k");
  ask.set_wait_ms(20000);
  grpc::Status answered;
  std::thread call([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    v1::AcquireResponse resp;
    answered = stub->Acquire(&ctx, ask, &resp);
  });
  auto waiters = [&] {
    auto d = client_->Describe("pay", "db/k");
    return d.ok() ? d->waiters_size() : -1;
  };
  for (int i = 0; i < 500 && waiters() != 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(waiters(), 1) << "the waiter never queued";

  absl::StatusOr<v1::RehomeNamespaceResponse> rehomed;
  std::thread rehome([&] { rehomed = Rehome("pay", "b", seconds(5)); });
  auto draining = [&] {
    pb::RangeRequest r;
    r.set_key(keyspace::NamespaceKey("pay"));
    auto got = a().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    records::NamespaceRecord rec;
    return got.ok() && got->kvs_size() == 1 && rec.ParseFromString(got->kvs(0).value()) &&
           !rec.draining_to().empty();
  };
  for (int i = 0; i < 500 && !draining(); ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(draining()) << "the rehome never started draining";
  ASSERT_TRUE(k->Release().ok());  // wakes the waiter; no hand-over while draining
  call.join();
  EXPECT_EQ(answered.error_code(), grpc::StatusCode::UNAVAILABLE) << answered.error_message();
  EXPECT_NE(answered.error_message().find("is being moved to etcd cluster \"b\""),
            std::string::npos)
      << answered.error_message();
  rehome.join();
  ASSERT_EQ(rehomed.status().code(), absl::StatusCode::kFailedPrecondition) << rehomed.status();

  // Rolled back, served on a again: the key is free and nobody waits for it.
  auto after = client_->Describe("pay", "db/k");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->holders_size(), 0);
  EXPECT_EQ(after->waiters_size(), 0) << "the refused waiter stayed in the queue";
  auto other = client_->OpenSession("pay");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE((*other)->Acquire("db/k").ok()) << "the key is taken at once";
}

// Force needs two admins: a rehome, asked by one, refuses to force holds open
// and changes nothing. Two admins force-release the hold that will not end, and
// the rehome then goes on; the trail names both.
TEST_F(RehomeTest, ARehomeRefusesToForceHoldsOpen) {
  CreateNamespace("pay", "");
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok());
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok());
  auto in_a = KeySpace(a()), in_b = KeySpace(b());
  auto r = Rehome("pay", "b", milliseconds(500), /*force=*/true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("a rehome does not force holds open: force-release "
                                      "needs two admins"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("holdfast force request pay/KEY"), std::string::npos)
      << r.status();
  EXPECT_EQ(KeySpace(a()), in_a);
  EXPECT_EQ(KeySpace(b()), in_b);
  auto check = client_->CheckToken("pay", "db/primary", h->token());
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->current());
}

// Clusters "a" and "b" over mTLS, with two admins: force-release needs both.
class TwoAdminsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.tls = true;
    o.extra_etcd_clusters = 1;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->MakeIdentity("admin2", "spiffe://test.holdfast/ops/bob").ok());
    auto admin = cluster_->NewClientAs("admin");
    auto admin2 = cluster_->NewClientAs("admin2");
    ASSERT_TRUE(admin.ok() && admin2.ok());
    admin_ = std::move(*admin);
    admin2_ = std::move(*admin2);
  }

  // Creates `ns` on the cluster of `tier`, opens a session and takes `key`.
  void HoldIn(const std::string& ns, const std::string& tier, const std::string& key) {
    v1::CreateNamespaceRequest create;
    create.mutable_namespace_()->set_name(ns);
    create.mutable_namespace_()->set_cluster_tier(tier);
    ASSERT_TRUE(admin_->CreateNamespace(create).ok());
    auto s = admin_->OpenSession(ns);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    auto h = session_->Acquire(key);
    ASSERT_TRUE(h.ok()) << h.status();
    hold_.emplace(std::move(*h));
  }

  // The first admin asks for the hold of `key` to be forced open.
  std::string RequestForce(const std::string& ns, const std::string& key) {
    v1::RequestForceReleaseRequest ask;
    ask.set_namespace_(ns);
    ask.set_lock_key(key);
    ask.set_reason("wedged, OPS-456");
    auto req = admin_->RequestForceRelease(ask);
    EXPECT_TRUE(req.ok()) << req.status();
    return req.ok() ? req->request_id() : "";
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> admin_, admin2_;
  std::unique_ptr<Session> session_;
  std::optional<Hold> hold_;
};

TEST_F(TwoAdminsTest, AHoldThatWillNotEndIsForceReleasedByTwoAdminsThenTheRehomeGoesOn) {
  HoldIn("pay", "", "db/primary");
  v1::RehomeNamespaceRequest rehome;
  rehome.set_name("pay");
  rehome.set_to("b");
  rehome.set_deadline_ms(300);
  auto left = admin_->RehomeNamespace(rehome);
  EXPECT_EQ(left.status().code(), absl::StatusCode::kFailedPrecondition) << left.status();
  EXPECT_NE(left.status().message().find("1 hold(s) of namespace \"pay\" remain"),
            std::string::npos)
      << left.status();
  EXPECT_NE(left.status().message().find("holdfast force request"), std::string::npos)
      << left.status();

  v1::ApproveForceReleaseRequest approve;
  approve.set_request_id(RequestForce("pay", "db/primary"));
  auto self = admin_->ApproveForceRelease(approve);
  EXPECT_EQ(self.status().code(), absl::StatusCode::kPermissionDenied) << self.status();
  auto ok = admin2_->ApproveForceRelease(approve);
  ASSERT_TRUE(ok.ok()) << ok.status();

  auto moved = admin_->RehomeNamespace(rehome);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(admin_->GetNamespace("pay")->home_cluster(), "b");
}

// A force-release request lives on the cluster of its hold. With the control
// cluster's etcd down, an approval is still served by the cluster that has it.
TEST_F(TwoAdminsTest, AnApprovalIsServedWhileAnotherClusterIsDown) {
  HoldIn("far", "b", "job");
  v1::ApproveForceReleaseRequest approve;
  approve.set_request_id(RequestForce("far", "job"));
  cluster_->etcd().Stop();  // cluster "a", asked first
  auto ok = admin2_->ApproveForceRelease(approve);
  ASSERT_TRUE(ok.ok()) << ok.status();
  pb::RangeRequest r;
  r.set_key(keyspace::HoldRangeBegin("far", "job"));
  r.set_range_end(keyspace::HoldRangeEnd("far", "job"));
  auto left = cluster_->extra_etcd_client(0).RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->kvs_size(), 0);

  // A request no cluster that answered has: the one that could not be asked is
  // named, since the request may be there.
  approve.set_request_id("0123456789abcdef");
  auto unknown = admin2_->ApproveForceRelease(approve);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable) << unknown.status();
  EXPECT_NE(unknown.status().message().find("etcd cluster \"a\" could not be asked"),
            std::string::npos)
      << unknown.status();
}

// holdfastd exits right after each step in turn (HOLDFAST_TEST_REHOME_EXIT_AFTER,
// a crash); running the command again finishes the move.
TEST_F(RehomeTest, ARehomeInterruptedAfterAnyStepIsFinishedByRunningItAgain) {
  for (int phase = 1; phase <= 5; ++phase) {
    SCOPED_TRACE(absl::StrCat("exit after phase ", phase));
    const std::string ns = absl::StrCat("pay", phase);
    CreateNamespace(ns, "");
    auto s = client_->OpenSession(ns);
    ASSERT_TRUE(s.ok());
    auto h = (*s)->Acquire("x");
    ASSERT_TRUE(h.ok());
    const int64_t token = h->token();
    ASSERT_TRUE(h->Release().ok());
    ::setenv("HOLDFAST_TEST_REHOME_EXIT_AFTER", absl::StrCat(phase).c_str(), 1);
    ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
    ::unsetenv("HOLDFAST_TEST_REHOME_EXIT_AFTER");
    auto crashed = Rehome(ns, "b", seconds(5));
    EXPECT_FALSE(crashed.ok());
    // Half-way: the placement record names the rehome in progress.
    auto in_a = KeySpace(a());
    records::PlacementRecord p;
    ASSERT_TRUE(p.ParseFromString(in_a[keyspace::PlacementKey(ns)]));
    EXPECT_EQ(p.rehome().to(), "b");
    EXPECT_EQ(p.rehome().phase(), phase);
    EXPECT_EQ(p.home(), phase >= 5 ? "b" : "a");
    ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
    client_ = std::move(*cluster_->NewClient());
    // Another target is refused while this one is unfinished.
    auto other = Rehome(ns, "a");
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(other.status().message().find("in progress"), std::string::npos) << other.status();
    // Running it again finishes it.
    auto resumed = Rehome(ns, "b", seconds(5));
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_TRUE(resumed->resumed());
    EXPECT_FALSE(HasKeysOf(KeySpace(a()), ns));
    EXPECT_TRUE(HasKeysOf(KeySpace(b()), ns));
    auto again = client_->OpenSession(ns);
    ASSERT_TRUE(again.ok()) << again.status();
    auto next = (*again)->Acquire("x");
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_GT(next->token(), token);
  }
}

TEST_F(RehomeTest, AnInterruptedRehomeCanBeRolledBack) {
  CreateNamespace("pay", "");
  auto before_b = KeySpace(b());
  ::setenv("HOLDFAST_TEST_REHOME_EXIT_AFTER", "2", 1);  // right after the seal
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  ::unsetenv("HOLDFAST_TEST_REHOME_EXIT_AFTER");
  EXPECT_FALSE(Rehome("pay", "b", seconds(5)).ok());
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  client_ = std::move(*cluster_->NewClient());
  // Sealed: the namespace refuses new sessions until the rehome is finished or undone.
  EXPECT_EQ(client_->OpenSession("pay").status().code(), absl::StatusCode::kUnavailable);
  // Its records are not changed meanwhile (a copy could miss the change).
  v1::UpdateNamespaceRequest update;
  update.set_name("pay");
  update.set_held_lease_quota(3);
  auto changed = client_->UpdateNamespace(update);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition) << changed.status();
  EXPECT_NE(changed.status().message().find("finish or abort the rehome"), std::string::npos);
  auto undone = Rehome("pay", "b", seconds(5), false, /*abort=*/true);
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_TRUE(undone->aborted());
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_EQ(KeySpace(b()), before_b);
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->Acquire("x").ok());
}

// An abort marks the placement record before it undoes anything, so no step of
// a rehome command still running can follow it (flip the home after the old one
// took sessions again, remove the old one after the abort removed the copy). An
// abort cut short after marking leaves the rehome to the abort: the forward
// command refuses to resume it and changes nothing; the abort asked again
// finishes it.
TEST_F(RehomeTest, AnAbortMarksTheRehomeFirstAndOnlyAnAbortFinishesIt) {
  CreateNamespace("pay", "");
  auto before_b = KeySpace(b());
  ::setenv("HOLDFAST_TEST_REHOME_EXIT_AFTER", "2", 1);  // right after the seal
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  EXPECT_FALSE(Rehome("pay", "b", seconds(5)).ok());
  ::setenv("HOLDFAST_TEST_REHOME_EXIT_AFTER", "100", 1);  // right after the abort's mark
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  ::unsetenv("HOLDFAST_TEST_REHOME_EXIT_AFTER");
  client_ = std::move(*cluster_->NewClient());
  EXPECT_FALSE(Rehome("pay", "b", seconds(5), false, /*abort=*/true).ok());
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  client_ = std::move(*cluster_->NewClient());
  records::PlacementRecord p;
  ASSERT_TRUE(p.ParseFromString(KeySpace(a())[keyspace::PlacementKey("pay")]));
  EXPECT_TRUE(p.rehome().aborting());
  EXPECT_EQ(p.rehome().phase(), 2);

  auto a_before = KeySpace(a());
  auto resumed = Rehome("pay", "b", seconds(5));
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kFailedPrecondition) << resumed.status();
  EXPECT_NE(resumed.status().message().find(
                "is being rolled back (an abort began and did not finish): finish the roll-back "
                "with `holdfast ns rehome pay --to b --abort`"),
            std::string::npos)
      << resumed.status();
  EXPECT_EQ(KeySpace(a()), a_before) << "a refused resume wrote on the home cluster";
  EXPECT_EQ(KeySpace(b()), before_b) << "a refused resume wrote on the target";

  auto undone = Rehome("pay", "b", seconds(5), false, /*abort=*/true);
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_TRUE(undone->aborted());
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_EQ(KeySpace(b()), before_b);
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->Acquire("x").ok());
}

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs the holdfast binary against `endpoint` (plaintext, no dev credentials).
CliResult RunCli(const std::string& dir, const std::string& endpoint,
                 const std::vector<std::string>& args) {
  static int counter = 0;
  const std::string out = absl::StrCat(dir, "/cli-", ++counter, ".out");
  const std::string err = absl::StrCat(dir, "/cli-", counter, ".err");
  dev::SpawnOptions so;
  so.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >\"$HF_TEST_OUT\" 2>\"$HF_TEST_ERR\"",
             testing::BinDir() + "/holdfast", "--endpoint", endpoint};
  for (const auto& a : args) so.argv.push_back(a);
  so.env = {{"HF_TEST_OUT", out}, {"HF_TEST_ERR", err}, {"HOLDFAST_DEV_DIR", dir + "/none"}};
  CliResult r;
  auto p = dev::Subprocess::Spawn(std::move(so));
  if (!p.ok()) return r;
  auto code = (*p)->Wait(seconds(60));
  r.exit_code = code ? *code : -1;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = read(out);
  r.err = read(err);
  return r;
}

// The runbook's commands (docs/operations.md, "Rehome"), as an operator types them.
TEST_F(RehomeTest, TheRunbookCommandsWork) {
  const std::string dir = cluster_->dir(), ep = cluster_->endpoint();
  auto r = RunCli(dir, ep, {"ns", "create", "payments"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli(dir, ep, {"ns", "rehome", "payments", "--to", "fast"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no etcd cluster named \"fast\" (clusters: a, b)"), std::string::npos)
      << r.err;
  r = RunCli(dir, ep, {"ns", "rehome", "payments", "--to", "b", "--deadline", "5m"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("namespace payments moved from a to b"), std::string::npos) << r.out;
  r = RunCli(dir, ep, {"ns", "get", "payments"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("home cluster"), std::string::npos) << r.out;
  r = RunCli(dir, ep, {"epoch", "show", "--cluster", "b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("grants"), std::string::npos) << r.out;
  r = RunCli(dir, ep, {"epoch", "show"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("clusters:"), std::string::npos) << r.out;
  auto shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->cluster(), "a");
  ASSERT_EQ(shown->clusters_size(), 2);
  EXPECT_EQ(shown->clusters(1).cluster(), "b");
  EXPECT_GE(shown->clusters(1).epoch(), 2);
  r = RunCli(dir, ep, {"ns", "list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("HOME"), std::string::npos) << r.out;
  r = RunCli(dir, ep, {"ns", "rehome", "payments", "--to", "a", "--abort"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no rehome of namespace \"payments\" is in progress"), std::string::npos)
      << r.err;
  r = RunCli(dir, ep, {"ns", "rehome", "payments", "--to", "a", "--deadline", "2m"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(client_->GetNamespace("payments")->home_cluster(), "a");
}

// The default config (one etcd cluster, "default"): there is nowhere to go.
// Two cluster names for one etcd (its endpoint spelled two ways, which the
// config check cannot see): a rehome between them would clear the "target" and
// remove the "old home", both the namespace itself. It is refused first.
TEST_F(RehomeTest, ARehomeBetweenTwoNamesOfOneEtcdIsRefusedAndChangesNothing) {
  CreateNamespace("pay", "a");
  const std::string config_path = cluster_->dir() + "/holdfastd.yaml";
  std::string config;
  {
    std::ifstream in(config_path);
    std::stringstream text;
    text << in.rdbuf();
    config = text.str();
  }
  const std::string b_endpoint = cluster_->extra_etcd(0).endpoint();
  const size_t at = config.find(b_endpoint);
  ASSERT_NE(at, std::string::npos) << config;
  const std::string a_port = cluster_->etcd().endpoint().substr(
      cluster_->etcd().endpoint().rfind(':') + 1);
  config.replace(at, b_endpoint.size(), absl::StrCat("localhost:", a_port));
  cluster_->holdfastd().Stop();
  {
    std::ofstream out(config_path);
    out << config;
  }
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());

  const auto before = KeySpace(a());
  auto r = Rehome("pay", "b");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("clusters \"a\" and \"b\" are one etcd cluster"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("nothing changed"), std::string::npos) << r.status();
  EXPECT_EQ(KeySpace(a()), before);
  auto got = client_->GetNamespace("pay");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->home_cluster(), "a");
}

// A delete that stopped between the namespace's home and its placement record
// (here: the home's keys deleted by hand) left a name that could be neither
// created nor deleted; deleting it again finishes the job.
TEST_F(RehomeTest, ADeleteThatStoppedHalfWayIsFinishedByDeletingAgain) {
  CreateNamespace("pay", "b");
  pb::DeleteRangeRequest home;
  home.set_key(keyspace::NamespaceKey("pay"));
  ASSERT_TRUE(b().DeleteRangeSync(home, etcd::DeadlineIn(seconds(5))).ok());
  home.set_key(keyspace::NamespacePrefix("pay"));
  home.set_range_end(keyspace::PrefixEnd(keyspace::NamespacePrefix("pay")));
  ASSERT_TRUE(b().DeleteRangeSync(home, etcd::DeadlineIn(seconds(5))).ok());
  ASSERT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 1u);

  auto deleted = client_->DeleteNamespace("pay");
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
  // The name is free: created again, on the control cluster this time.
  CreateNamespace("pay", "");
  auto got = client_->GetNamespace("pay");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->home_cluster(), "a");
}

// A create that finds its own claim on the name with no namespace on the home
// (a create that stopped half way, or a delete that has just deleted the home's
// copy) rewrites the claim before it goes on: a delete that read the record
// before compares it when it deletes it, and so leaves the new namespace its
// placement record.
TEST_F(RehomeTest, ACreateTakingAHalfDoneClaimOverRewritesIt) {
  CreateNamespace("pay", "b");
  pb::DeleteRangeRequest home;
  home.set_key(keyspace::NamespaceKey("pay"));
  ASSERT_TRUE(b().DeleteRangeSync(home, etcd::DeadlineIn(seconds(5))).ok());
  pb::RangeRequest read;
  read.set_key(keyspace::PlacementKey("pay"));
  auto before = a().RangeSync(read, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(before.ok() && before->kvs_size() == 1);

  CreateNamespace("pay", "b");
  auto after = a().RangeSync(read, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(after.ok() && after->kvs_size() == 1);
  EXPECT_GT(after->kvs(0).mod_revision(), before->kvs(0).mod_revision());
  records::PlacementRecord p;
  ASSERT_TRUE(p.ParseFromString(after->kvs(0).value()));
  EXPECT_EQ(p.home(), "b");
  EXPECT_FALSE(p.has_rehome());
  auto got = client_->GetNamespace("pay");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->home_cluster(), "b");

  // The delete that read the record before this create: its guarded delete of
  // the placement record fails (the name stays routed to "b").
  pb::TxnRequest late;
  auto* c = late.add_compare();
  c->set_key(keyspace::PlacementKey("pay"));
  c->set_target(pb::Compare::MOD);
  c->set_result(pb::Compare::EQUAL);
  c->set_mod_revision(before->kvs(0).mod_revision());
  late.add_success()->mutable_request_delete_range()->set_key(keyspace::PlacementKey("pay"));
  auto t = a().TxnSync(std::move(late), etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->succeeded());

  // And a delete now deletes both.
  auto deleted = client_->DeleteNamespace("pay");
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
}

// A delete reads the placement record from etcd (a replica's view of it may
// be behind another replica's write): one that shows a rehome in progress,
// written here by hand just before, refuses the delete and nothing changes.
TEST_F(RehomeTest, ADeleteRefusesANamespaceBeingRehomedByItsPlacementRecord) {
  CreateNamespace("pay", "b");
  pb::RangeRequest read;
  read.set_key(keyspace::PlacementKey("pay"));
  auto got = a().RangeSync(read, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(got.ok() && got->kvs_size() == 1);
  records::PlacementRecord p;
  ASSERT_TRUE(p.ParseFromString(got->kvs(0).value()));
  p.mutable_rehome()->set_from("b");
  p.mutable_rehome()->set_to("a");
  pb::PutRequest put;
  put.set_key(keyspace::PlacementKey("pay"));
  put.set_value(p.SerializeAsString());
  ASSERT_TRUE(a().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  const auto a_before = KeySpace(a());
  const auto b_before = KeySpace(b());
  auto deleted = client_->DeleteNamespace("pay");
  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition) << deleted;
  EXPECT_NE(deleted.message().find("namespace \"pay\" is being rehomed to \"a\""),
            std::string::npos)
      << deleted;
  EXPECT_EQ(KeySpace(a()), a_before);
  EXPECT_EQ(KeySpace(b()), b_before);
}

// The control cluster restored from a snapshot taken before a namespace was
// created on "b": the restored records have no placement for it, so its name is
// the control cluster's again. The replica's view of the placements, whose
// watch resumed past the restored revisions, is read again once the restore is
// found, and the name is routed by the restored records.
TEST_F(RehomeTest, AfterTheControlClusterIsRestoredNamesAreRoutedByItsRecords) {
  auto& etcd = cluster_->etcd();
  const std::string snap = cluster_->dir() + "/control.db";
  ASSERT_TRUE(testing::Etcdctl(cluster_->dir(),
                               {"--endpoints", etcd.endpoint(), "snapshot", "save", snap})
                  .ok());
  CreateNamespace("pay", "b");
  auto before = client_->GetNamespace("pay");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->home_cluster(), "b");

  ASSERT_TRUE(testing::RestoreEtcd(etcd, cluster_->dir(), snap, "control-restored").ok());
  absl::StatusOr<v1::Namespace> after = before;
  for (int i = 0; i < 300; ++i) {
    after = client_->GetNamespace("pay");
    if (after.status().code() == absl::StatusCode::kNotFound) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound)
      << "the name is still routed to " << (after.ok() ? after->home_cluster() : "?");
  // The name is free on the control cluster.
  CreateNamespace("pay", "");
  auto again = client_->GetNamespace("pay");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->home_cluster(), "a");
}

// A placement record naming a cluster the config does not list is warned of,
// and a delete does not take it for a half-done one (the namespace may live on
// that cluster): NOT_FOUND, the record kept.
TEST_F(RehomeTest, APlacementOnAClusterTheConfigDoesNotListIsWarnedOfAndKept) {
  records::PlacementRecord rec;
  rec.set_home("gone");
  pb::PutRequest put;
  put.set_key(keyspace::PlacementKey("ghost"));
  put.set_value(rec.SerializeAsString());
  ASSERT_TRUE(a().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  const std::string warning =
      "WARNING: namespace \"ghost\" is homed on cluster \"gone\", which this holdfastd's "
      "config does not list";
  std::string log;
  for (int i = 0; i < 100 && log.find(warning) == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    std::ifstream in(cluster_->dir() + "/holdfastd-0.log");
    std::stringstream text;
    text << in.rdbuf();
    log = text.str();
  }
  EXPECT_NE(log.find(warning), std::string::npos) << log;
  auto deleted = client_->DeleteNamespace("ghost");
  EXPECT_EQ(deleted.code(), absl::StatusCode::kNotFound) << deleted;
  EXPECT_NE(deleted.message().find("is homed on cluster \"gone\", which this holdfastd's config "
                                   "does not list; nothing changed"),
            std::string::npos)
      << deleted;
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("ghost")), 1u);
}

// The namespace record of `ns` on the cluster `etcd` reaches.
records::NamespaceRecord RecordOn(etcd::Client& etcd, const std::string& ns) {
  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey(ns));
  auto got = etcd.RangeSync(r, etcd::DeadlineIn(seconds(5)));
  records::NamespaceRecord rec;
  EXPECT_TRUE(got.ok() && got->kvs_size() == 1) << got.status();
  if (got.ok() && got->kvs_size() == 1) EXPECT_TRUE(rec.ParseFromString(got->kvs(0).value()));
  return rec;
}

// A rehome rolled back (--abort) while its first command still waits for holds:
// that command stops, and the namespace is not sealed when the holds end (its
// queues kept, not marked moved).
TEST_F(RehomeTest, ARehomeRolledBackWhileItWaitsForHoldsStopsAndSealsNothing) {
  CreateNamespace("pay", "");
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<v1::RehomeNamespaceResponse> first;
  std::thread waiting([&] { first = Rehome("pay", "b", seconds(60)); });
  for (int i = 0; i < 500 && RecordOn(a(), "pay").draining_to().empty(); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(RecordOn(a(), "pay").draining_to(), "b") << "the rehome never started draining";
  auto aborted = Rehome("pay", "b", seconds(20), false, /*abort=*/true);
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_TRUE(aborted->aborted());
  ASSERT_TRUE(h->Release().ok());
  waiting.join();
  ASSERT_EQ(first.status().code(), absl::StatusCode::kAborted) << first.status();
  EXPECT_NE(first.status().message().find("was rolled back or taken over by another command"),
            std::string::npos)
      << first.status();
  const auto rec = RecordOn(a(), "pay");
  EXPECT_FALSE(rec.moved()) << "the namespace was sealed after the rollback";
  EXPECT_TRUE(rec.draining_to().empty());
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  auto again = (*s)->Acquire("db/primary");
  EXPECT_TRUE(again.ok()) << again.status();
}

// A rehome whose caller has gone (its call cancelled: Ctrl-C on the command)
// stops waiting for holds and leaves the rehome where it is, as any
// interruption: it does not go on to move the namespace behind the operator's
// back once the holds end. (A call's deadline ends the wait before it passes:
// ARehomeWhoseCallEndsFirstRollsBackInTimeToSaySo.)
TEST_F(RehomeTest, ARehomeWhoseCallerHasGoneStopsWaitingForHolds) {
  CreateNamespace("pay", "");
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok()) << h.status();
  grpc::ClientContext ctx;  // cancelled after a second (Ctrl-C on the command)
  std::thread cancel([&] {
    std::this_thread::sleep_for(seconds(1));
    ctx.TryCancel();
  });
  grpc::Status gone = RawRehome(&ctx, "pay", 60'000);
  cancel.join();
  ASSERT_EQ(gone.error_code(), grpc::StatusCode::CANCELLED) << gone.error_message();
  // The server notices within a poll; the holds end after that.
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(h->Release().ok());
  std::this_thread::sleep_for(seconds(2));
  const auto rec = RecordOn(a(), "pay");
  EXPECT_FALSE(rec.moved()) << "the rehome went on after its caller had gone";
  EXPECT_EQ(rec.draining_to(), "b") << "an interrupted rehome stays where it was";
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
  // Rolled back as any interrupted one.
  auto aborted = Rehome("pay", "b", seconds(20), false, /*abort=*/true);
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_TRUE(RecordOn(a(), "pay").draining_to().empty());
}

// A create refused for its fields writes nothing, also when its tier homes the
// namespace on another cluster: no claim is left on the control cluster to
// route the name to a cluster that never gets it (ALREADY_EXISTS to the
// corrected request, NOT_FOUND to every read).
TEST_F(RehomeTest, ACreateRefusedForItsFieldsClaimsNoName) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("pay");
  req.mutable_namespace_()->set_cluster_tier("b");
  req.mutable_namespace_()->set_held_lease_quota(-1);
  auto refused = client_->CreateNamespace(req);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(refused.status().message(), "quotas must be >= 0 (0 = unlimited)");
  req.mutable_namespace_()->set_held_lease_quota(0);
  req.mutable_namespace_()->add_members("not a pattern");
  refused = client_->CreateNamespace(req);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(KeySpace(a()).count(keyspace::PlacementKey("pay")), 0u);
  EXPECT_FALSE(HasKeysOf(KeySpace(a()), "pay"));
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
  // Corrected, on the control cluster's tier this time: created there.
  req.mutable_namespace_()->clear_members();
  req.mutable_namespace_()->set_cluster_tier("");
  auto created = client_->CreateNamespace(req);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->home_cluster(), "a");
}

// A call with less time than its deadline_ms (one that waited for a thread, or
// a caller's shorter deadline) ends its wait for holds in time to roll back and
// say so, instead of being cut off with its namespace left draining.
TEST_F(RehomeTest, ARehomeWhoseCallEndsFirstRollsBackInTimeToSaySo) {
  CreateNamespace("pay", "");
  auto s = client_->OpenSession("pay");
  ASSERT_TRUE(s.ok()) << s.status();
  auto h = (*s)->Acquire("db/primary");
  ASSERT_TRUE(h.ok()) << h.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(20));
  grpc::Status s2 = RawRehome(&ctx, "pay", 600'000);
  ASSERT_EQ(s2.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s2.error_message();
  EXPECT_NE(s2.error_message().find("1 hold(s) of namespace \"pay\" remain on cluster \"a\" "
                                    "after "),
            std::string::npos)
      << s2.error_message();
  EXPECT_NE(s2.error_message().find("all the time the call's own deadline left for the wait"),
            std::string::npos)
      << s2.error_message();
  const auto rec = RecordOn(a(), "pay");
  EXPECT_TRUE(rec.draining_to().empty()) << "the drain was not rolled back";
  EXPECT_FALSE(rec.moved());
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), "pay"));
  auto again = (*s)->Acquire("db/other");
  EXPECT_TRUE(again.ok()) << again.status();
}

// A cluster move rehomes namespaces side by side, each waiting for its holds.
// Those waits have threads of their own: the other admin calls (and a rehome's
// abort) are answered meanwhile, not queued behind them. A rehome queued for a
// thread past its caller's deadline is not run once one is free: its caller was
// told DEADLINE_EXCEEDED, and a drain started then would come behind its back.
TEST_F(RehomeTest, RehomesWaitingForHoldsHoldBackNoOtherAdminCallAndOneQueuedPastItsCallIsNotRun) {
  constexpr int kWaiting = 8;  // holdfastd's threads for waiting admin calls
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Hold> holds;
  for (int i = 0; i <= kWaiting; ++i) {
    const std::string ns = absl::StrCat("move", i);
    ASSERT_NO_FATAL_FAILURE(CreateNamespace(ns, ""));
    auto s = client_->OpenSession(ns);
    ASSERT_TRUE(s.ok()) << s.status();
    auto h = (*s)->Acquire("db/primary");
    ASSERT_TRUE(h.ok()) << h.status();
    holds.push_back(std::move(*h));
    sessions.push_back(std::move(*s));
  }
  std::vector<absl::StatusOr<v1::RehomeNamespaceResponse>> moved(kWaiting);
  std::vector<std::thread> waiting;
  // A failed assertion below returns with the rehomes still waiting: their holds
  // end, then they are joined.
  absl::Cleanup join = [&] {
    for (Hold& h : holds) (void)h.Release();
    for (std::thread& t : waiting) {
      if (t.joinable()) t.join();
    }
  };
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back([&, i] { moved[i] = Rehome(absl::StrCat("move", i), "b", seconds(120)); });
  }
  auto all_draining = [&] {
    for (int i = 0; i < kWaiting; ++i) {
      if (RecordOn(a(), absl::StrCat("move", i)).draining_to() != "b") return false;
    }
    return true;
  };
  for (int i = 0; i < 3000 && !all_draining(); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(all_draining()) << "the rehomes never all started draining";

  // Every waiting thread is taken: a ninth rehome queues, and its caller leaves.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(1));
  grpc::Status gone = RawRehome(&ctx, absl::StrCat("move", kWaiting), 60'000);
  ASSERT_EQ(gone.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << gone.error_message();
  std::this_thread::sleep_for(seconds(1));  // the server sees the call end

  // Brief admin calls are answered while the rehomes wait; so is an abort,
  // which frees a waiting thread for the queued call.
  auto ns = client_->GetNamespace("move1");
  ASSERT_TRUE(ns.ok()) << ns.status();
  v1::GetAuditStatusRequest status_req;
  auto status = client_->GetAuditStatus(status_req);
  ASSERT_TRUE(status.ok()) << status.status();
  auto aborted = Rehome("move0", "b", seconds(20), false, /*abort=*/true);
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_TRUE(aborted->aborted());

  for (Hold& h : holds) ASSERT_TRUE(h.Release().ok());
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(moved[0].status().code(), absl::StatusCode::kAborted) << moved[0].status();
  const auto in_a = KeySpace(a());
  const auto in_b = KeySpace(b());
  for (int i = 1; i < kWaiting; ++i) {
    ASSERT_TRUE(moved[i].ok()) << i << ": " << moved[i].status();
    auto got = client_->GetNamespace(absl::StrCat("move", i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->home_cluster(), "b") << i;
    EXPECT_FALSE(HasKeysOf(in_a, absl::StrCat("move", i))) << i;
    EXPECT_TRUE(HasKeysOf(in_b, absl::StrCat("move", i))) << i;
  }
  EXPECT_TRUE(RecordOn(a(), "move0").draining_to().empty());
  // The queued rehome never ran: nothing drains, nothing moved.
  std::this_thread::sleep_for(seconds(1));
  const auto queued = RecordOn(a(), absl::StrCat("move", kWaiting));
  EXPECT_TRUE(queued.draining_to().empty()) << "a rehome ran after its caller had gone";
  EXPECT_FALSE(queued.moved());
  EXPECT_FALSE(HasKeysOf(KeySpace(b()), absl::StrCat("move", kWaiting)));
}

TEST(RehomeOneClusterTest, WithOneClusterRehomeSaysSoAndChangesNothing) {
  auto c = testing::TestCluster::Start();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->CreateNamespace("default").ok());
  auto client = (*c)->NewClient();
  ASSERT_TRUE(client.ok());
  auto before = KeySpace((*c)->etcd_client());
  v1::RehomeNamespaceRequest req;
  req.set_name("default");
  req.set_to("b");
  auto r = (*client)->RehomeNamespace(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no etcd cluster named \"b\" (this holdfastd has one: "
                                      "\"default\")"),
            std::string::npos)
      << r.status();
  req.set_to("default");
  EXPECT_EQ((*client)->RehomeNamespace(req).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeySpace((*c)->etcd_client()), before);
  EXPECT_EQ((*client)->GetNamespace("default")->home_cluster(), "default");
}

TEST(RehomeAdminTest, OnlyAdminsMayRehome) {
  testing::TestCluster::Options o;
  o.extra_etcd_clusters = 1;
  o.tls = true;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace("pay").ok());
  ASSERT_TRUE(cluster.MakeIdentity("app", "spiffe://test.holdfast/team/app").ok());
  auto app = cluster.NewClientAs("app");
  ASSERT_TRUE(app.ok());
  auto before_a = KeySpace(cluster.etcd_client());
  auto before_b = KeySpace(cluster.extra_etcd_client(0));
  v1::RehomeNamespaceRequest req;
  req.set_name("pay");
  req.set_to("b");
  auto r = (*app)->RehomeNamespace(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_EQ(KeySpace(cluster.etcd_client()), before_a);
  EXPECT_EQ(KeySpace(cluster.extra_etcd_client(0)), before_b);
  // An admin may.
  auto admin = cluster.NewClient();
  ASSERT_TRUE(admin.ok());
  auto done = (*admin)->RehomeNamespace(req);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*admin)->GetNamespace("pay")->home_cluster(), "b");
}

}  // namespace
}  // namespace holdfast
