// Epochs against real etcd processes (ARCHITECTURE §6): an etcd restored from a
// snapshot (`etcdctl snapshot save` / `snapshot restore`, the Debian binaries)
// refuses grants until the epoch is advanced, and every token minted after the
// advance is above every token the audit store recorded before the restore.
#include <algorithm>
#include <csignal>
#include <atomic>
#include <functional>
#include <utility>
#include <thread>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"
#include "audit/epochs.h"
#include "audit/store.h"
#include "harness/cluster.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/token.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

using testing::Etcdctl;

// Runs `a` and `b` on two threads released together, and waits for both.
void RunTogether(const std::function<void()>& a, const std::function<void()>& b) {
  std::atomic<int> ready{0};
  auto released = [&](const std::function<void()>& f) {
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    f();
  };
  std::thread ta([&] { released(a); });
  std::thread tb([&] { released(b); });
  ta.join();
  tb.join();
}

class EpochTest : public ::testing::Test {
 protected:
  void Start(const std::string& extra_config = "",
             std::vector<std::string> holdfastd_args = {}) {
    testing::TestCluster::Options o;
    o.extra_config = extra_config;
    o.holdfastd_args = std::move(holdfastd_args);
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    client_ = std::move(*cluster_->NewClient());
  }

  // Acquires and releases `n` keys; returns their tokens.
  std::vector<int64_t> Cycles(const std::string& prefix, int n) {
    std::vector<int64_t> tokens;
    auto session = client_->OpenSession("default");
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return tokens;
    for (int i = 0; i < n; ++i) {
      auto h = (*session)->Acquire(absl::StrCat(prefix, i));
      EXPECT_TRUE(h.ok()) << h.status();
      if (!h.ok()) continue;
      tokens.push_back(h->token());
      EXPECT_TRUE(h->Release().ok());
    }
    return tokens;
  }

  // Every token the audit store holds (after waiting for `grants` grants).
  std::vector<int64_t> AuditedTokens(size_t grants) {
    std::vector<int64_t> out;
    for (int i = 0; i < 300; ++i) {
      v1::QueryAuditRequest q;
      q.set_type("grant");
      q.set_limit(10000);
      auto r = client_->QueryAudit(q);
      if (r.ok() && static_cast<size_t>(r->events_size()) >= grants) {
        for (const auto& e : r->events()) out.push_back(e.token());
        return out;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    ADD_FAILURE() << "the audit did not record " << grants << " grants";
    return out;
  }

  // Saves a snapshot, runs `between`, then stops etcd and restores the snapshot
  // into a fresh data dir (with `cluster_token`) and starts etcd on it. With
  // `stop_holdfastd`, holdfastd is stopped around the restore, as the runbook
  // (docs/operations.md) says.
  void SnapshotAndRestore(const std::function<void()>& between, const std::string& cluster_token,
                          bool stop_holdfastd = false) {
    auto& etcd = cluster_->etcd();
    const std::string snap = cluster_->dir() + "/snap.db";
    ASSERT_TRUE(Etcdctl(cluster_->dir(), {"--endpoints", etcd.endpoint(), "snapshot", "save", snap})
                    .ok());
    between();
    const std::string restored = cluster_->dir() + "/restored";
    ASSERT_TRUE(Etcdctl(cluster_->dir(),
                        {"snapshot", "restore", snap, "--data-dir", restored, "--name",
                         etcd.options().name, "--initial-cluster",
                         absl::StrCat(etcd.options().name, "=", etcd.peer_url()),
                         "--initial-advertise-peer-urls", etcd.peer_url(),
                         "--initial-cluster-token", cluster_token})
                    .ok());
    if (stop_holdfastd) cluster_->holdfastd().Stop();
    ASSERT_TRUE(etcd.RestartOn(restored).ok());
    if (stop_holdfastd) {
      ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
    }
  }

  // Tries to acquire until the answer is not UNAVAILABLE (holdfastd reconnecting).
  absl::StatusOr<int64_t> TryAcquire(const std::string& key) {
    absl::Status last;
    for (int i = 0; i < 300; ++i) {
      auto session = client_->OpenSession("default");
      if (session.ok()) {
        auto h = (*session)->Acquire(key);
        if (h.ok()) {
          int64_t t = h->token();
          (void)h->Release();
          return t;
        }
        last = h.status();
      } else {
        last = session.status();
      }
      if (last.code() == absl::StatusCode::kFailedPrecondition) return last;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return last;
  }

  // Waits until acquires succeed again (the restore guard re-checks on its interval).
  absl::StatusOr<int64_t> AcquireOnceAllowed(const std::string& key) {
    absl::StatusOr<int64_t> t = absl::UnknownError("not tried");
    for (int i = 0; i < 100; ++i) {
      t = TryAcquire(key);
      if (t.ok()) return t;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return t;
  }

  // The record of `session`'s hold of `key` in "default", read from etcd.
  absl::StatusOr<records::HoldRecord> HoldRecordOf(const std::string& key, int64_t session) {
    pb::RangeRequest r;
    r.set_key(keyspace::HoldKey("default", key, session));
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    if (!got.ok()) return got.status();
    records::HoldRecord rec;
    if (got->kvs_size() != 1 || !rec.ParseFromString(got->kvs(0).value())) {
      return absl::NotFoundError(absl::StrCat("no hold record of session ", session, " on ", key));
    }
    return rec;
  }

  // Whether `key` of "default" shows one waiter within 30 s.
  bool OneWaiterQueued(const std::string& key) {
    for (int i = 0; i < 300; ++i) {
      auto d = client_->Describe("default", key);
      if (d.ok() && d->waiters_size() == 1) return true;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return false;
  }

  // Commits by hand what a release planned before a restore and committed after
  // it would: `holder`'s hold of `key` (in "default") goes, and `to` gets one with
  // the holder's record, minted (it says) under the epoch record of etcd cluster
  // `epoch_cluster`; `to`'s waiter, if any, goes.
  absl::Status CommitStaleHandOver(const std::string& key, int64_t holder, int64_t to,
                                   uint64_t epoch_cluster) {
    auto rec = HoldRecordOf(key, holder);
    if (!rec.ok()) return rec.status();
    rec->set_etcd_cluster_id(epoch_cluster);
    pb::TxnRequest stale;
    stale.add_success()->mutable_request_delete_range()->set_key(
        keyspace::HoldKey("default", key, holder));
    stale.add_success()->mutable_request_delete_range()->set_key(
        keyspace::ClaimKey("default", key, holder));
    stale.add_success()->mutable_request_delete_range()->set_key(
        keyspace::WaitKey("default", key, to));
    auto* put = stale.add_success()->mutable_request_put();
    put->set_key(keyspace::HoldKey("default", key, to));
    put->set_value(rec->SerializeAsString());
    put->set_lease(to);
    auto* claim = stale.add_success()->mutable_request_put();
    claim->set_key(keyspace::ClaimKey("default", key, to));
    claim->set_lease(to);
    auto committed = cluster_->etcd_client().TxnSync(stale, etcd::DeadlineIn(seconds(5)));
    if (!committed.ok()) return committed.status();
    if (!committed->succeeded()) return absl::InternalError("the hand-over did not commit");
    return absl::OkStatus();
  }

  // `key` held by a session of client_, and a session of `other` (a client of
  // replica 0 by default) waiting for it: its Acquire (waiting `wait`) runs on a
  // thread of its own until Answer().
  struct QueuedBehindAHolder {
    QueuedBehindAHolder(EpochTest* t, const std::string& key, std::chrono::milliseconds wait,
                        std::unique_ptr<Client> other_client = nullptr) {
      auto h = t->client_->OpenSession("default");
      EXPECT_TRUE(h.ok()) << h.status();
      if (!h.ok()) return;
      holder = std::move(*h);
      held = holder->Acquire(key);
      EXPECT_TRUE(held.ok()) << held.status();
      if (other_client == nullptr) {
        auto c = t->cluster_->NewClient();
        EXPECT_TRUE(c.ok()) << c.status();
        if (!c.ok()) return;
        other_client = std::move(*c);
      }
      other = std::move(other_client);
      auto w = other->OpenSession("default");
      EXPECT_TRUE(w.ok()) << w.status();
      if (!w.ok()) return;
      waiter = std::move(*w);
      waiting = std::thread([this, key, wait] {
        handed = waiter->Acquire(key, testing::Waiting(wait));
        answered = true;
      });
      queued = t->OneWaiterQueued(key);
    }
    ~QueuedBehindAHolder() {
      if (waiting.joinable()) waiting.join();
    }
    // The waiter's answer (once it has come).
    const absl::StatusOr<Hold>& Answer() {
      if (waiting.joinable()) waiting.join();
      return handed;
    }

    std::unique_ptr<Session> holder;
    absl::StatusOr<Hold> held = absl::UnknownError("not acquired");
    std::unique_ptr<Client> other;
    std::unique_ptr<Session> waiter;
    bool queued = false;
    std::atomic<bool> answered{false};
    absl::StatusOr<Hold> handed = absl::UnknownError("not yet");
    std::thread waiting;
  };

  // Commits q's stale hand-over of `key` while holdfastd is stopped, and raises
  // etcd's space alarm before holdfastd goes on: the waiter hears of the
  // hand-over only once etcd refuses writes, its hold's delete among them.
  bool StaleHandOverWhileEtcdRefusesWrites(const std::string& key, QueuedBehindAHolder& q) {
    const uint64_t here = ObservedClusterId();
    cluster_->holdfastd().process()->Signal(SIGSTOP);
    auto stale = CommitStaleHandOver(key, q.holder->id(), q.waiter->id(), here + 1);
    auto alarm = cluster_->SpaceAlarm(true);
    cluster_->holdfastd().process()->Signal(SIGCONT);
    EXPECT_TRUE(stale.ok()) << stale;
    EXPECT_TRUE(alarm.ok()) << alarm;
    return stale.ok() && alarm.ok();
  }

  // `session` is granted `key` (free now), with a token above `above`.
  void ExpectGrantedAbove(Session& session, const std::string& key, int64_t above) {
    auto again = session.Acquire(key);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_GT(again->token(), above);
    EXPECT_TRUE(again->Release().ok());
  }

  // Whether `key` of "default" has neither holds nor waiters within `within`.
  bool KeyFree(const std::string& key, std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (true) {
      auto d = client_->Describe("default", key);
      if (d.ok() && d->holders_size() == 0 && d->waiters_size() == 0) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  // etcd's cluster id as holdfastd reports it.
  uint64_t ObservedClusterId() {
    uint64_t id = 0;
    auto shown = client_->GetEpoch();
    EXPECT_TRUE(shown.ok()) << shown.status();
    if (shown.ok()) {
      EXPECT_TRUE(absl::SimpleAtoi(shown->observed_cluster_id(), &id));
    }
    return id;
  }

  // A connection of its own to the audit store holdfastd uses; null on failure.
  std::unique_ptr<audit::AuditStore> OpenAuditStore() {
    auto store = audit::OpenSqliteStore(cluster_->dir() + "/audit.db");
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  records::EpochRecord EtcdRecord() {
    pb::RangeRequest r;
    r.set_key(keyspace::EpochKey());
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    records::EpochRecord rec;
    if (got.ok() && got->kvs_size() == 1) rec.ParseFromString(got->kvs(0).value());
    return rec;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(EpochTest, RestoredClusterRefusesGrantsUntilAdvancedThenTokensAreAboveAllBefore) {
  Start();
  auto before = Cycles("before/", 5);
  // The grants after the snapshot are gone from etcd once it is restored: wait
  // until the auditor has recorded them, or the check below races the restore.
  SnapshotAndRestore(
      [&] {
        Cycles("after-snapshot/", 5);
        AuditedTokens(10);
      },
      "restored-1");
  auto audited = AuditedTokens(10);
  ASSERT_EQ(audited.size(), 10u);

  // The restored cluster has a new id: grants are refused, and say what to run.
  auto refused = TryAcquire("post-restore");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("holdfast epoch advance --reason restore"),
            std::string::npos)
      << refused.status();
  auto shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->epoch(), 1);

  v1::AdvanceEpochRequest bad;
  bad.set_reason("because");
  EXPECT_EQ(client_->AdvanceEpoch(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdRecord().epoch(), 1);

  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  auto advanced = client_->AdvanceEpoch(req);
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  EXPECT_EQ(advanced->epoch(), 2);
  EXPECT_EQ(EtcdRecord().epoch(), 2);

  auto t = AcquireOnceAllowed("post-advance");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 2);
  EXPECT_GT(*t, *std::max_element(audited.begin(), audited.end()));

  // The history: the first epoch, then the advance with who did it.
  shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  EXPECT_TRUE(shown->restore_detected().empty()) << shown->restore_detected();
  ASSERT_EQ(shown->history_size(), 2);
  EXPECT_EQ(shown->history(0).epoch(), 1);
  EXPECT_EQ(shown->history(0).reason(), "init");
  EXPECT_EQ(shown->history(1).epoch(), 2);
  EXPECT_EQ(shown->history(1).reason(), "restore");
  EXPECT_EQ(shown->history(1).actor(), "spiffe://holdfast.dev/dev");
  EXPECT_EQ(shown->history(1).etcd_cluster_id(), shown->observed_cluster_id());
}

// On a restored etcd, before the epoch is advanced, CheckToken confirms no hold,
// as no grant is made: the holds read are of the backup, and a key may have been
// released and granted to a higher token after it. After the advance it answers
// again.
TEST_F(EpochTest, CheckTokenConfirmsNoHoldOfARestoredClusterUntilTheAdvance) {
  Start();
  SessionOptions so;
  so.ttl = seconds(60);
  auto session = client_->OpenSession("default", so);
  ASSERT_TRUE(session.ok()) << session.status();
  auto kept = (*session)->Acquire("kept");
  ASSERT_TRUE(kept.ok()) << kept.status();
  const int64_t token = kept->token();
  auto current = client_->CheckToken("default", "kept", token);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_TRUE(current->current());

  SnapshotAndRestore([] {}, "restored-check");
  // (UNAVAILABLE while holdfastd reconnects to the restarted etcd.)
  auto check = [&] {
    absl::StatusOr<v1::CheckTokenResponse> r = absl::UnavailableError("not asked");
    for (int i = 0; i < 100; ++i) {
      r = client_->CheckToken("default", "kept", token);
      if (r.status().code() != absl::StatusCode::kUnavailable) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return r;
  };
  auto refused = check();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("holdfast epoch advance"), std::string::npos)
      << refused.status();

  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  ASSERT_TRUE(client_->AdvanceEpoch(req).ok());
  absl::StatusOr<v1::CheckTokenResponse> answered = check();
  for (int i = 0; i < 100 && !answered.ok(); ++i) {  // the guard lifts its block
    std::this_thread::sleep_for(milliseconds(100));
    answered = check();
  }
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_TRUE(answered->current()) << "the restored hold is in etcd";
}

// Without an audit store there is no epoch history: the restored record alone
// could name an epoch already used since the snapshot (restore one snapshot
// twice, and 1 + its epoch comes round twice, with the same revisions), so a
// restore's advance needs the highest epoch the operator knows of.
TEST_F(EpochTest, WithoutAnAuditStoreARestoresAdvanceNeedsTheHighestEpochKnown) {
  Start("", {"--audit-store", "none"});
  Cycles("before/", 3);
  SnapshotAndRestore([&] { Cycles("after-snapshot/", 3); }, "restored-no-store");
  auto refused = TryAcquire("post-restore");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();

  auto record_revision = [&] {
    pb::RangeRequest r;
    r.set_key(keyspace::EpochKey());
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() && got->kvs_size() == 1 ? got->kvs(0).mod_revision() : int64_t{-1};
  };
  const int64_t before = record_revision();
  ASSERT_GT(before, 0);
  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  auto r = client_->AdvanceEpoch(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find(
                "this holdfastd has no audit store (audit.store: none), so no epoch history"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("--min-epoch N"), std::string::npos) << r.status();
  req.set_min_epoch(-1);
  r = client_->AdvanceEpoch(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(record_revision(), before) << "a refused advance wrote the record";
  EXPECT_EQ(EtcdRecord().epoch(), 1);
  refused = TryAcquire("still-refused");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();

  // The operator knows epoch 4 was used (a token's high bits): the new one is above.
  req.set_min_epoch(4);
  auto advanced = client_->AdvanceEpoch(req);
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  EXPECT_EQ(advanced->epoch(), 5);
  auto t = AcquireOnceAllowed("post-advance");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 5);
}

TEST_F(EpochTest, RestoreThatKeepsTheClusterIdIsCaughtByTheAuditCursor) {
  Start("epochs:\n  check_interval: 200ms\n");
  Cycles("before/", 3);
  uint64_t id_before = 0;
  SnapshotAndRestore(
      [&] {
        Cycles("after-snapshot/", 10);
        AuditedTokens(13);  // the cursor is past the snapshot now
        auto e = client_->GetEpoch();
        if (e.ok()) (void)absl::SimpleAtoi(e->observed_cluster_id(), &id_before);
      },
      "holdfast",  // the harness's token: same member and cluster id as before
      /*stop_holdfastd=*/true);
  auto audited = AuditedTokens(13);

  auto refused = TryAcquire("post-restore");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("below the audit cursor"), std::string::npos)
      << refused.status();
  auto shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->observed_cluster_id(), absl::StrCat(id_before));  // same id indeed

  // The restored cluster's revision climbs past the cursor (here by writes beside
  // holdfast's keys; in production by renewals, expiries, new sessions): the
  // refusal stands, also across a restart of holdfastd, until an advance.
  auto store = OpenAuditStore();
  ASSERT_NE(store, nullptr);
  auto cursor = store->Cursor(id_before);
  ASSERT_TRUE(cursor.ok() && cursor->has_value()) << cursor.status();
  int64_t revision = 0;
  while (revision <= **cursor + 5) {
    pb::PutRequest put;
    put.set_key("/not-holdfast/filler");
    put.set_value("x");
    auto put_done = cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(put_done.ok()) << put_done.status();
    revision = put_done->header().revision();
  }
  std::this_thread::sleep_for(milliseconds(1000));  // five of the guard's looks
  refused = TryAcquire("past-the-cursor");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("below the audit cursor"), std::string::npos)
      << refused.status();
  cluster_->holdfastd().Stop();
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  refused = TryAcquire("after-a-restart");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("below the audit cursor"), std::string::npos)
      << refused.status();
  shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  EXPECT_NE(shown->restore_detected().find("below the audit cursor"), std::string::npos);

  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  ASSERT_TRUE(client_->AdvanceEpoch(req).ok());
  auto t = AcquireOnceAllowed("post-advance");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(*t, *std::max_element(audited.begin(), audited.end()));
  // The auditor resumed on the restored cluster: the new grant is recorded.
  auto after = AuditedTokens(14);
  EXPECT_NE(std::find(after.begin(), after.end(), *t), after.end());
}

// An advance leaves the holds it finds in place, each with its token. They are
// still released by that token, and a waiter queued behind one is handed the key
// at the new epoch, above the token it waited behind.
TEST_F(EpochTest, HoldsGrantedBeforeAnAdvanceAreReleasedAndHandedOverAtTheNewEpoch) {
  Start();
  auto holder = client_->OpenSession("default");
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto plain = (*holder)->Acquire("adv/plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto queued = (*holder)->Acquire("adv/queued");
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_EQ(token::EpochOf(queued->token()), 1);

  auto other = cluster_->NewClient();
  ASSERT_TRUE(other.ok()) << other.status();
  auto waiter = (*other)->OpenSession("default");
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  absl::StatusOr<Hold> handed = absl::UnknownError("not yet");
  std::thread waiting([&] { handed = (*waiter)->Acquire("adv/queued", testing::Waiting(seconds(60))); });
  absl::Cleanup join = [&] { waiting.join(); };  // also when an assertion returns early
  ASSERT_TRUE(OneWaiterQueued("adv/queued")) << "the waiter never queued";

  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  auto advanced = client_->AdvanceEpoch(req);
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  ASSERT_EQ(advanced->epoch(), 2);
  auto allowed = AcquireOnceAllowed("adv/other");  // holdfastd has seen the new epoch
  ASSERT_TRUE(allowed.ok()) << allowed.status();

  // A token that names the right revision but another epoch is not the hold's.
  // (Hold::Release sends the hold's own token; this one goes by hand.)
  auto stub = v1::Lock::NewStub(
      grpc::CreateChannel(cluster_->endpoint(), grpc::InsecureChannelCredentials()));
  v1::ReleaseRequest forged;
  forged.set_namespace_("default");
  forged.set_lock_key("adv/plain");
  forged.set_session_id((*holder)->id());
  forged.set_token(*token::Make(2, token::RevisionOf(plain->token())));
  grpc::ClientContext ctx;
  v1::ReleaseResponse resp;
  grpc::Status refused = stub->Release(&ctx, forged, &resp);
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_NE(refused.error_message().find(absl::StrCat("stale token ", forged.token())),
            std::string::npos)
      << refused.error_message();
  auto still = client_->Describe("default", "adv/plain");
  ASSERT_TRUE(still.ok()) << still.status();
  ASSERT_EQ(still->holders_size(), 1) << "a refused release changes nothing";
  EXPECT_EQ(still->holders(0).token(), plain->token());

  ASSERT_TRUE(plain->Release().ok());
  auto gone = client_->Describe("default", "adv/plain");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->holders_size(), 0);

  ASSERT_TRUE(queued->Release().ok());
  std::move(join).Invoke();
  ASSERT_TRUE(handed.ok()) << handed.status();
  EXPECT_EQ(token::EpochOf(handed->token()), 2);
  EXPECT_GT(handed->token(), queued->token());
  // The hand-over's hold records the cluster of the epoch record it was minted
  // under, which its waiter checks against the cluster that committed it.
  auto rec = HoldRecordOf("adv/queued", (*waiter)->id());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->epoch(), 2);
  EXPECT_EQ(rec->etcd_cluster_id(), ObservedClusterId());
  EXPECT_TRUE(handed->Release().ok());
}

// A hand-over planned before etcd was restored (or replaced) and committed after
// it lands on a cluster other than the one whose epoch record minted its token,
// and that token may repeat one issued before. The waiter is not answered as
// granted: its hold is deleted and its acquire fails, naming both clusters. The
// commit is made here by hand, as a replica whose plan went stale would make it:
// the holder's hold and the waiter's queue entry deleted, the waiter's hold put
// with the record of a cluster that is not this one.
TEST_F(EpochTest, AHandOverCommittedOnAnotherClusterThanItsEpochsIsNotGranted) {
  Start();
  QueuedBehindAHolder q(this, "stale/handover", seconds(60));
  ASSERT_TRUE(q.queued) << "the waiter never queued";
  const uint64_t here = ObservedClusterId();
  ASSERT_NE(here, 0u);
  const uint64_t elsewhere = here + 1;
  auto held_rec = HoldRecordOf("stale/handover", q.holder->id());
  ASSERT_TRUE(held_rec.ok()) << held_rec.status();
  EXPECT_EQ(held_rec->etcd_cluster_id(), here) << "a grant records its epoch record's cluster";
  ASSERT_TRUE(
      CommitStaleHandOver("stale/handover", q.holder->id(), q.waiter->id(), elsewhere).ok());

  const absl::StatusOr<Hold>& handed = q.Answer();
  ASSERT_FALSE(handed.ok()) << "granted token " << handed->token();
  EXPECT_EQ(handed.status().code(), absl::StatusCode::kFailedPrecondition) << handed.status();
  EXPECT_TRUE(absl::StrContains(
      handed.status().message(),
      absl::StrCat("\"stale/handover\" was handed over on etcd cluster ", here,
                   ", not on the cluster of the epoch record its token was minted under (",
                   elsewhere, ", epoch 1)")))
      << handed.status();
  EXPECT_FALSE(absl::StrContains(handed.status().message(), "not committed"))
      << handed.status();
  // The hold is deleted (after the answer, so looked for a while).
  EXPECT_TRUE(KeyFree("stale/handover", seconds(10)))
      << "the hold of the refused hand-over is still there";
  // The key is free for a grant of this cluster.
  ExpectGrantedAbove(*q.waiter, "stale/handover", q.held->token());
}

// Such a hold found by a read, not told of as a hand-over (its session's call
// had gone, and the session asks again): refused and deleted too, not answered
// with its token.
TEST_F(EpochTest, AHoldOfAnotherClustersEpochFoundByAReadIsNotGranted) {
  Start();
  auto holder = client_->OpenSession("default");
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto held = (*holder)->Acquire("stale/found");
  ASSERT_TRUE(held.ok()) << held.status();
  auto session = client_->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  const uint64_t here = ObservedClusterId();
  ASSERT_NE(here, 0u);
  ASSERT_TRUE(
      CommitStaleHandOver("stale/found", (*holder)->id(), (*session)->id(), here + 1).ok());
  auto d = client_->Describe("default", "stale/found");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), (*session)->id());

  auto found = (*session)->Acquire("stale/found");
  ASSERT_FALSE(found.ok()) << "granted token " << found->token() << " (the old hold's was "
                           << held->token() << ")";
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition) << found.status();
  EXPECT_TRUE(absl::StrContains(
      found.status().message(),
      absl::StrCat("\"stale/found\" is held by this session on etcd cluster ", here,
                   ", not on the cluster of the epoch record its token was minted under (",
                   here + 1, ", epoch 1): a hand-over committed after etcd was restored")))
      << found.status();
  EXPECT_TRUE(KeyFree("stale/found", seconds(10))) << "the refused hold is still there";
  ExpectGrantedAbove(**session, "stale/found", held->token());
}

// While etcd refuses the refused hand-over's delete (its space alarm: reads are
// served, writes refused), the delete is tried again, and the call is answered
// once it commits.
TEST_F(EpochTest, TheDeleteOfARefusedHandOverIsTriedAgainUntilEtcdTakesIt) {
  Start();
  QueuedBehindAHolder q(this, "stale/retried", seconds(60));
  ASSERT_TRUE(q.queued) << "the waiter never queued";
  ASSERT_TRUE(StaleHandOverWhileEtcdRefusesWrites("stale/retried", q));
  absl::Cleanup disarm = [&] { EXPECT_TRUE(cluster_->SpaceAlarm(false).ok()); };

  std::this_thread::sleep_for(seconds(2));
  EXPECT_FALSE(q.answered.load()) << "answered while the hold could not be deleted";
  auto d = client_->Describe("default", "stale/retried");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1) << "etcd took a write under its space alarm";
  EXPECT_EQ(d->holders(0).session_id(), q.waiter->id());

  std::move(disarm).Invoke();
  const absl::StatusOr<Hold>& handed = q.Answer();
  ASSERT_FALSE(handed.ok()) << "granted token " << handed->token();
  EXPECT_EQ(handed.status().code(), absl::StatusCode::kFailedPrecondition) << handed.status();
  EXPECT_TRUE(absl::StrContains(handed.status().message(), "was handed over on etcd cluster"))
      << handed.status();
  EXPECT_FALSE(absl::StrContains(handed.status().message(), "not committed"))
      << handed.status();
  EXPECT_TRUE(KeyFree("stale/retried", seconds(10)));
}

// A delete that etcd still refuses near the call's deadline: the call is
// answered in time, saying so, and the delete goes on after it until etcd takes
// it.
TEST_F(EpochTest, TheDeleteOfARefusedHandOverGoesOnAfterTheAnswer) {
  Start();
  ClientOptions o;
  o.endpoints = {cluster_->endpoint()};
  o.rpc_timeout = seconds(3);  // the call's deadline: its wait (2 s) + 3 s
  auto other = Client::Connect(o);
  ASSERT_TRUE(other.ok()) << other.status();
  QueuedBehindAHolder q(this, "stale/after", seconds(2), std::move(*other));
  ASSERT_TRUE(q.queued) << "the waiter never queued";
  ASSERT_TRUE(StaleHandOverWhileEtcdRefusesWrites("stale/after", q));
  absl::Cleanup disarm = [&] { EXPECT_TRUE(cluster_->SpaceAlarm(false).ok()); };

  const absl::StatusOr<Hold>& handed = q.Answer();
  ASSERT_FALSE(handed.ok()) << "granted token " << handed->token();
  EXPECT_EQ(handed.status().code(), absl::StatusCode::kFailedPrecondition) << handed.status();
  EXPECT_TRUE(absl::StrContains(
      handed.status().message(),
      "; but deleting the hold has not committed yet (etcd: mvcc: database space "
      "exceeded): it is tried again until it does, and until then the session holds the key"))
      << handed.status();
  auto d = client_->Describe("default", "stale/after");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), q.waiter->id());

  std::move(disarm).Invoke();
  EXPECT_TRUE(KeyFree("stale/after", seconds(15)))
      << "the delete did not go on after the answer";
  ExpectGrantedAbove(*q.waiter, "stale/after", q.held->token());
}

// An advance cut short between its history row and the record (holdfastd died)
// leaves the history above the record: grants are refused with a reason that
// names that case too, and the next advance goes past the row.
TEST_F(EpochTest, AnAdvanceCutShortIsNamedAndTheNextAdvanceGoesPastIt) {
  Start("epochs:\n  check_interval: 200ms\n");
  const uint64_t cluster_id = ObservedClusterId();
  auto store = OpenAuditStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendEpoch({2, cluster_id, 1'700'000'000'000, "restore", "crashed"}).ok());

  // holdfastd sees the history at its next check.
  auto refused = TryAcquire("cut-short");
  for (int i = 0; i < 300 && refused.ok(); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    refused = TryAcquire("cut-short");
  }
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("or an advance to it was cut short"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(EtcdRecord().epoch(), 1) << "a refusal changes nothing";

  v1::AdvanceEpochRequest req;
  req.set_reason("restore");
  auto advanced = client_->AdvanceEpoch(req);
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  EXPECT_EQ(advanced->epoch(), 3);
  auto t = AcquireOnceAllowed("after");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 3);
}

// A store that, right after an advance wrote its history row, lets another
// advance land its record (one that read the history before that row).
class RecordLandsAfterTheRow final : public audit::AuditStore {
 public:
  RecordLandsAfterTheRow(audit::AuditStore* inner, std::function<void()> land)
      : inner_(inner), land_(std::move(land)) {}
  absl::Status AppendEpoch(const audit::EpochRow& row) override {
    absl::Status s = inner_->AppendEpoch(row);
    if (s.ok() && land_) std::exchange(land_, nullptr)();
    return s;
  }
  absl::Status Record(uint64_t c, int64_t r, const std::vector<audit::AuditEvent>& e,
                      const std::vector<audit::ForceReleaseRow>& f) override {
    return inner_->Record(c, r, e, f);
  }
  absl::StatusOr<std::optional<int64_t>> Cursor(uint64_t c) override { return inner_->Cursor(c); }
  absl::StatusOr<std::vector<uint64_t>> Clusters() override { return inner_->Clusters(); }
  absl::Status RewindCursor(uint64_t c, int64_t r) override { return inner_->RewindCursor(c, r); }
  absl::StatusOr<Pruned> Prune(int64_t before, int max) override { return inner_->Prune(before, max); }
  absl::StatusOr<std::vector<audit::AuditEvent>> Query(const audit::AuditQuery& q) override {
    return inner_->Query(q);
  }
  absl::StatusOr<std::vector<audit::ForceReleaseRow>> ForceReleases(int limit) override {
    return inner_->ForceReleases(limit);
  }
  absl::StatusOr<int32_t> MaxEpoch() override { return inner_->MaxEpoch(); }
  absl::StatusOr<std::vector<audit::EpochRow>> Epochs() override { return inner_->Epochs(); }
  absl::StatusOr<int> SchemaVersion() override { return inner_->SchemaVersion(); }
  absl::StatusOr<Durability> CommitDurability() override { return inner_->CommitDurability(); }

 private:
  audit::AuditStore* const inner_;
  std::function<void()> land_;
};

// Advance A read epoch 1 and wrote history row 2; advance B read after that row,
// so it wrote row 3; A's record (2) lands before B's compare-and-swap. B swaps
// again, over A's: the record ends at 3, the history's highest, and grants go on.
// (Aborting instead would leave row 3 above record 2: every grant refused.)
TEST_F(EpochTest, AnAdvanceThatLosesItsSwapToALowerOneSwapsAgain) {
  Start("epochs:\n  check_interval: 200ms\n");
  const uint64_t cluster_id = ObservedClusterId();
  auto store = OpenAuditStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendEpoch({2, cluster_id, 1'700'000'000'000, "restore", "A"}).ok());
  RecordLandsAfterTheRow racing(store.get(), [&] {
    records::EpochRecord a;
    a.set_epoch(2);
    a.set_etcd_cluster_id(cluster_id);
    a.set_reason("restore");
    pb::PutRequest put;
    put.set_key(keyspace::EpochKey());
    put.set_value(a.SerializeAsString());
    EXPECT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  });
  audit::Epochs b(&cluster_->etcd_client(), &racing);
  auto advanced = b.Advance("restore", "B", etcd::DeadlineIn(seconds(10)));
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  EXPECT_EQ(advanced->epoch(), 3);
  EXPECT_EQ(EtcdRecord().epoch(), 3);
  auto state = b.Read(etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(audit::Epochs::RestoreReason(*state), "");
  auto t = AcquireOnceAllowed("after");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 3);
}

// Advances racing each other (two replicas, or two operators) leave the record at
// the highest epoch the history holds for the cluster, whichever swaps first:
// never a history row above the record, which would refuse every grant.
TEST_F(EpochTest, RacingAdvancesLeaveTheRecordAtTheHistorysHighest) {
  Start();
  auto store_a = OpenAuditStore();
  auto store_b = OpenAuditStore();
  ASSERT_TRUE(store_a != nullptr && store_b != nullptr);
  audit::Epochs a(&cluster_->etcd_client(), store_a.get());
  audit::Epochs b(&cluster_->etcd_client(), store_b.get());
  for (int round = 0; round < 20; ++round) {
    absl::StatusOr<records::EpochRecord> got_a = absl::UnknownError("not run");
    absl::StatusOr<records::EpochRecord> got_b = absl::UnknownError("not run");
    RunTogether([&] { got_a = a.Advance("restore", "racer", etcd::DeadlineIn(seconds(10))); },
                [&] { got_b = b.Advance("restore", "racer", etcd::DeadlineIn(seconds(10))); });
    for (const auto* got : {&got_a, &got_b}) {
      EXPECT_TRUE(got->ok() || got->status().code() == absl::StatusCode::kAborted)
          << got->status();
    }
    EXPECT_TRUE(got_a.ok() || got_b.ok()) << "one advance of two always lands";
    auto state = a.Read(etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(audit::Epochs::RestoreReason(*state), "") << "round " << round;
    EXPECT_EQ(state->record.epoch(), state->history_max) << "round " << round;
  }
  auto t = AcquireOnceAllowed("after-races");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), EtcdRecord().epoch());
}

// A hold is released even when the epoch record is gone (deleted by hand): the
// release needs none; grants do, and stay refused.
TEST_F(EpochTest, AHoldIsReleasedWithoutAnEpochRecord) {
  Start();
  auto session = client_->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  auto h = (*session)->Acquire("no-record");
  ASSERT_TRUE(h.ok()) << h.status();
  pb::DeleteRangeRequest del;
  del.set_key(keyspace::EpochKey());
  auto deleted = cluster_->etcd_client().DeleteRangeSync(del, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ASSERT_EQ(deleted->deleted(), 1);
  ASSERT_TRUE(h->Release().ok());
  auto d = client_->Describe("default", "no-record");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0);
  auto refused = (*session)->Acquire("no-record");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

// Two admins advance at once through two replicas: each advance lands or is
// refused with ABORTED, the record ends at the history's highest, and both
// replicas grant at it.
TEST(EpochReplicasTest, AdvancesThroughTwoReplicasAtOnceLeaveOneEpochBothGrantAt) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  o.extra_config = "epochs:\n  check_interval: 200ms\n";
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  auto first = (*cluster)->NewClient(0);
  auto second = (*cluster)->NewClient(1);
  ASSERT_TRUE(first.ok() && second.ok());
  for (int round = 0; round < 5; ++round) {
    absl::StatusOr<v1::Epoch> got[2] = {absl::UnknownError("not run"),
                                         absl::UnknownError("not run")};
    v1::AdvanceEpochRequest req;
    req.set_reason("restore");
    RunTogether([&] { got[0] = (*first)->AdvanceEpoch(req); },
                [&] { got[1] = (*second)->AdvanceEpoch(req); });
    for (const auto& g : got) {
      EXPECT_TRUE(g.ok() || g.status().code() == absl::StatusCode::kAborted) << g.status();
    }
    EXPECT_TRUE(got[0].ok() || got[1].ok()) << "round " << round;
  }
  auto shown = (*first)->GetEpoch();
  ASSERT_TRUE(shown.ok()) << shown.status();
  int32_t highest = 0;
  for (const auto& row : shown->history()) highest = std::max(highest, row.epoch());
  EXPECT_EQ(shown->epoch(), highest);
  EXPECT_GE(highest, 2 + 4) << "one advance of two lands in each of the five rounds";
  for (auto* c : {first->get(), second->get()}) {
    absl::StatusOr<int64_t> token = absl::UnknownError("not granted");
    for (int i = 0; i < 100; ++i) {
      auto session = c->OpenSession("default");
      if (session.ok()) {
        auto h = (*session)->Acquire("after-races");
        if (h.ok()) {
          token = h->token();
          break;
        }
        token = h.status();
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(token::EpochOf(*token), highest);
  }
}

TEST_F(EpochTest, AutoAdvanceOnRestoreAdvancesOnce) {
  Start("epochs:\n  auto_advance_on_restore: true\n  check_interval: 200ms\n");
  auto before = Cycles("before/", 3);
  SnapshotAndRestore([] {}, "restored-2");
  auto t = AcquireOnceAllowed("post-restore");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 2);
  EXPECT_GT(*t, *std::max_element(before.begin(), before.end()));
  auto shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  ASSERT_EQ(shown->history_size(), 2);
  EXPECT_EQ(shown->history(1).actor(), "holdfastd (auto_advance_on_restore)");
  // Once: later checks leave it alone.
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(EtcdRecord().epoch(), 2);
}

// holdfastd started on a cluster restored with a new cluster token advances before
// its auditor starts: the auditor begins on the new cluster id at the advance, and
// does not record the snapshot's history (recorded under the old id) a second time.
TEST_F(EpochTest, AutoAdvanceAtStartDoesNotAuditTheSnapshotsHistoryAgain) {
  // The restored leader key of the auditor outlives holdfastd's restart by its TTL.
  Start("epochs:\n  auto_advance_on_restore: true\n  check_interval: 200ms\n"
        "audit:\n  leader_ttl: 2s\n");
  auto before = Cycles("before/", 3);
  AuditedTokens(3);
  SnapshotAndRestore([] {}, "restored-3", /*stop_holdfastd=*/true);
  auto t = AcquireOnceAllowed("post-restore");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), 2);
  const uint64_t restored_id = ObservedClusterId();
  auto store = OpenAuditStore();
  ASSERT_NE(store, nullptr);
  // Once the new grant is recorded, the auditor has run on the new cluster id.
  std::vector<audit::AuditEvent> events;
  for (int i = 0; i < 300; ++i) {
    audit::AuditQuery q;
    q.cluster_id = restored_id;
    q.limit = 1000;
    auto got = store->Query(q);
    ASSERT_TRUE(got.ok()) << got.status();
    events = std::move(*got);
    if (std::any_of(events.begin(), events.end(),
                    [&](const audit::AuditEvent& e) { return e.token == *t; })) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(std::any_of(events.begin(), events.end(),
                          [&](const audit::AuditEvent& e) { return e.token == *t; }))
      << "the grant after the advance was not recorded under the new cluster id";
  for (const auto& e : events) {
    EXPECT_FALSE(absl::StartsWith(e.lock_key, "before/"))
        << e.lock_key << " at revision " << e.revision << " recorded again under the new id";
  }
}

TEST_F(EpochTest, AdvancePastTheLastEpochIsRefusedAndChangesNothing) {
  Start();
  records::EpochRecord rec = EtcdRecord();
  rec.set_epoch(token::kMaxEpoch);
  pb::PutRequest put;
  put.set_key(keyspace::EpochKey());
  put.set_value(rec.SerializeAsString());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  v1::AdvanceEpochRequest req;
  req.set_reason("rehome");
  auto r = client_->AdvanceEpoch(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("32767"), std::string::npos) << r.status();
  EXPECT_EQ(EtcdRecord().epoch(), token::kMaxEpoch);
  auto shown = client_->GetEpoch();
  ASSERT_TRUE(shown.ok());
  for (const auto& h : shown->history()) EXPECT_LE(h.epoch(), token::kMaxEpoch);
  EXPECT_EQ(shown->history_size(), 1);  // only the first epoch
  // Tokens of the last epoch still work.
  auto t = AcquireOnceAllowed("last-epoch");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(token::EpochOf(*t), token::kMaxEpoch);
  // An unknown cluster name.
  req.set_cluster("tier-2");
  EXPECT_EQ(client_->AdvanceEpoch(req).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace holdfast
