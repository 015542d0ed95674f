// The audit trail and two-person force-release (ARCHITECTURE §7-8) against real
// etcd and holdfastd processes, with the SQLite store the test cluster configures
// (<cluster dir>/audit.db). Every check reads what was recorded: through the
// Admin API, and where the API shows less (force_release rows), straight from the
// store's file.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <fstream>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "audit/store.h"
#include "dev/subprocess.h"
#include "harness/cluster.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

// Polls the audit until `done(events)` holds or `limit` passes; returns the last
// answer. (A liveness bound, not a speed claim: generous on purpose.)
std::vector<v1::AuditEvent> WaitForAudit(
    Client& client, const v1::QueryAuditRequest& q,
    const std::function<bool(const std::vector<v1::AuditEvent>&)>& done,
    milliseconds limit = seconds(60)) {
  std::vector<v1::AuditEvent> last;
  auto until = std::chrono::steady_clock::now() + limit;
  do {
    auto r = client.QueryAudit(q);
    if (r.ok()) {
      last.assign(r->events().begin(), r->events().end());
      if (done(last)) return last;
    }
    std::this_thread::sleep_for(milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  return last;
}

v1::QueryAuditRequest InNamespace(const std::string& ns) {
  v1::QueryAuditRequest q;
  q.set_namespace_(ns);
  q.set_limit(10000);
  return q;
}

// (type, key, session) -> how many times recorded.
std::map<std::tuple<std::string, std::string, int64_t>, int> Count(
    const std::vector<v1::AuditEvent>& events) {
  std::map<std::tuple<std::string, std::string, int64_t>, int> out;
  for (const auto& e : events) ++out[{e.type(), e.lock_key(), e.session_id()}];
  return out;
}

const v1::AuditEvent* Find(const std::vector<v1::AuditEvent>& events, const std::string& type,
                           const std::string& key, int64_t session) {
  for (const auto& e : events) {
    if (e.type() == type && e.lock_key() == key && e.session_id() == session) return &e;
  }
  return nullptr;
}

absl::Status CreateAdvisoryClass(Client& client, const std::string& ns) {
  v1::LockClass cls;
  cls.set_namespace_(ns);
  cls.set_class_id("adv");
  cls.set_key_prefix("adv/");
  cls.set_enforcement(v1::ENFORCEMENT_ADVISORY);
  return client.CreateClass(cls).status();
}

TEST(AuditTest, EveryGrantReleaseAndExpiryIsRecordedExactlyOnce) {
  auto cluster = testing::TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto& c = **cluster;
  ASSERT_TRUE(c.CreateNamespace("default").ok());
  auto client = std::move(*c.NewClient());
  ASSERT_TRUE(CreateAdvisoryClass(*client, "default").ok());

  auto a = std::move(*client->OpenSession("default"));
  auto b = std::move(*client->OpenSession("default"));
  auto dying = std::move(*client->OpenSession("default"));
  auto closing = std::move(*client->OpenSession("default"));
  std::map<std::string, int64_t> token;  // "key/session" -> token seen by the client

  // A plain grant and release.
  {
    auto h = a->Acquire("k1");
    ASSERT_TRUE(h.ok()) << h.status();
    token[absl::StrCat("k1/", a->id())] = h->token();
    ASSERT_TRUE(h->Release().ok());
  }
  // A hand-over: A releases, B (waiting) is granted in the same commit.
  {
    auto h = a->Acquire("k2");
    ASSERT_TRUE(h.ok()) << h.status();
    token[absl::StrCat("k2/", a->id())] = h->token();
    absl::StatusOr<Hold> bh = absl::UnknownError("not run");
    std::thread waiter([&] { bh = b->Acquire("k2", testing::Waiting(seconds(30))); });
    // Release once B is queued.
    for (int i = 0; i < 300; ++i) {
      auto d = client->Describe("default", "k2");
      if (d.ok() && d->waiters_size() == 1) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    ASSERT_TRUE(h->Release().ok());
    waiter.join();
    ASSERT_TRUE(bh.ok()) << bh.status();
    token[absl::StrCat("k2/", b->id())] = bh->token();
    ASSERT_TRUE(bh->Release().ok());
  }
  // Two holds that expire with their session's lease (revoked behind holdfast's
  // back: to etcd and the auditor that is a lease expiry).
  {
    auto h3 = dying->Acquire("k3");
    auto h4 = dying->Acquire("adv/k4");
    ASSERT_TRUE(h3.ok() && h4.ok());
    token[absl::StrCat("k3/", dying->id())] = h3->token();
    token[absl::StrCat("adv/k4/", dying->id())] = h4->token();
    pb::LeaseRevokeRequest r;
    r.set_id(dying->id());
    ASSERT_TRUE(etcd::Await<pb::LeaseRevokeResponse>([&](auto cb) {
                  c.etcd_client().LeaseRevoke(r, etcd::DeadlineIn(seconds(5)), cb);
                }).ok());
  }
  // A hold ended by closing its session: a release.
  {
    auto h = closing->Acquire("k5");
    ASSERT_TRUE(h.ok());
    token[absl::StrCat("k5/", closing->id())] = h->token();
    ASSERT_TRUE(closing->Close().ok());
  }

  const int expected = 6 /*grants*/ + 4 /*releases*/ + 2 /*expiries*/;
  auto events = WaitForAudit(*client, InNamespace("default"), [&](const auto& ev) {
    return static_cast<int>(ev.size()) >= expected;
  });
  ASSERT_EQ(static_cast<int>(events.size()), expected);
  auto n = Count(events);
  auto once = [&](const std::string& type, const std::string& key, int64_t session) {
    EXPECT_EQ((n[{type, key, session}]), 1) << type << " " << key << " " << session;
  };
  once("grant", "k1", a->id());
  once("release", "k1", a->id());
  once("grant", "k2", a->id());
  once("release", "k2", a->id());
  once("grant", "k2", b->id());
  once("release", "k2", b->id());
  once("grant", "k3", dying->id());
  once("expire", "k3", dying->id());
  once("grant", "adv/k4", dying->id());
  once("expire", "adv/k4", dying->id());
  once("grant", "k5", closing->id());
  once("release", "k5", closing->id());

  for (const auto& e : events) {
    EXPECT_EQ(e.token(), token[absl::StrCat(e.lock_key(), "/", e.session_id())])
        << e.type() << " " << e.lock_key();
    EXPECT_EQ(e.unprotected(), e.lock_key().rfind("adv/", 0) == 0) << e.lock_key();
    EXPECT_EQ(e.spiffe_id(), "spiffe://holdfast.dev/dev");
    EXPECT_GT(e.time_unix_ms(), 0);
  }
  // The hand-over: B's grant is the revision of A's release.
  auto* released = Find(events, "release", "k2", a->id());
  auto* granted = Find(events, "grant", "k2", b->id());
  ASSERT_TRUE(released && granted);
  EXPECT_EQ(released->revision(), granted->revision());
  // Revision order.
  EXPECT_TRUE(std::is_sorted(events.begin(), events.end(), [](const auto& x, const auto& y) {
    return x.revision() < y.revision();
  }));

  // Filters.
  v1::QueryAuditRequest q = InNamespace("default");
  q.set_type("expire");
  auto expiries = client->QueryAudit(q);
  ASSERT_TRUE(expiries.ok());
  EXPECT_EQ(expiries->events_size(), 2);
  q.set_type("bogus");
  auto bad = client->QueryAudit(q);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown event type"), std::string::npos);
  q.set_type("");
  q.set_limit(20000);
  auto too_many = client->QueryAudit(q);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("out of range (1..10000)"), std::string::npos)
      << too_many.status();

  // Paging one event a page, each page after the last event of the one before,
  // visits every event once, in order, across the revisions that hold two (the
  // hand-over, the lease expiry).
  std::vector<std::string> all, paged;
  auto text = [](const v1::AuditEvent& e) {
    return absl::StrCat(e.revision(), " ", e.type(), " ", e.lock_key(), " ", e.session_id());
  };
  for (const auto& e : events) all.push_back(text(e));
  v1::QueryAuditRequest page = InNamespace("default");
  page.set_limit(1);
  for (int i = 0; i <= expected; ++i) {
    auto r = client->QueryAudit(page);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->events_size() == 0) break;
    ASSERT_EQ(r->events_size(), 1);
    paged.push_back(text(r->events(0)));
    *page.mutable_after() = r->events(0);
  }
  EXPECT_EQ(paged, all);

  // The cluster filter: every event is this cluster's, none another's.
  v1::QueryAuditRequest by_cluster = InNamespace("default");
  by_cluster.set_cluster_id(events[0].cluster_id());
  auto mine = client->QueryAudit(by_cluster);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->events_size(), expected);
  by_cluster.set_cluster_id("42");
  auto other = client->QueryAudit(by_cluster);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->events_size(), 0);
  auto status = client->GetAuditStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(std::vector<std::string>(status->audited_cluster_ids().begin(),
                                     status->audited_cluster_ids().end()),
            std::vector<std::string>{events[0].cluster_id()});
  EXPECT_EQ(status->store_durability(), "synchronous=FULL");  // the SQLite store
  EXPECT_EQ(status->store_durability_raised_from(), "");
  EXPECT_GT(status->etcd_revision(), 0);
  // What `holdfast audit --follow` asks on every poll: the clusters alone.
  v1::GetAuditStatusRequest just_clusters;
  just_clusters.set_clusters_only(true);
  auto clusters = client->GetAuditStatus(just_clusters);
  ASSERT_TRUE(clusters.ok()) << clusters.status();
  EXPECT_TRUE(clusters->enabled());
  EXPECT_EQ(clusters->store(), "sqlite");
  EXPECT_EQ(std::vector<std::string>(clusters->audited_cluster_ids().begin(),
                                     clusters->audited_cluster_ids().end()),
            std::vector<std::string>{events[0].cluster_id()});
  EXPECT_EQ(clusters->etcd_revision(), 0);  // no etcd call
  EXPECT_EQ(clusters->store_durability(), "");

  // Malformed cluster ids are refused, saying which field.
  by_cluster.set_cluster_id("x");
  auto bad_cluster = client->QueryAudit(by_cluster);
  EXPECT_EQ(bad_cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_cluster.status().message(), "cluster_id \"x\" is not a decimal etcd cluster id");
  v1::QueryAuditRequest bad_after = InNamespace("default");
  bad_after.mutable_after()->set_revision(1);
  bad_after.mutable_after()->set_cluster_id("-1");
  auto bad_page = client->QueryAudit(bad_after);
  EXPECT_EQ(bad_page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_page.status().message().find("after.cluster_id \"-1\" is not a decimal"),
            std::string::npos)
      << bad_page.status();
}

// A page of the largest size asked for, of events as large as they come (a
// 500-byte key, a long SPIFFE ID), would be several MiB: more than holdfastd sends
// in one message (4 MiB). It ends at 3 MiB saying `more`, and the next page goes
// on after its last event: every event once, in order; `holdfast audit` pages so.
TEST(AuditTest, APageOfLargeEventsEndsAtItsSizeBoundAndSaysThereIsMore) {
  testing::TestCluster::Options o;
  std::string dir = ::testing::TempDir() + "/hf-audit-large-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string db = dir + "/audit.db";
  o.holdfastd_args = {"--audit-store", "sqlite:" + db};
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = std::move(*(*cluster)->NewClient());

  // Another cluster's trail, written straight to the shared store.
  constexpr uint64_t kOtherCluster = 42;
  constexpr int kEvents = 6000;
  auto store = audit::OpenSqliteStore(db);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<audit::AuditEvent> events;
  for (int i = 0; i < kEvents; ++i) {
    audit::AuditEvent e;
    e.cluster_id = kOtherCluster;
    e.revision = 1000 + i;
    e.ns = "default";
    e.lock_key = absl::StrCat(std::string(494, 'k'), "/", i);
    e.session_id = 7000 + i;
    e.type = audit::EventType::kGrant;
    e.spiffe_id = absl::StrCat("spiffe://acme.org/", std::string(900, 's'));
    e.token = e.revision;
    e.time_unix_ms = 1'700'000'000'000;
    events.push_back(std::move(e));
  }
  ASSERT_TRUE((*store)->Record(kOtherCluster, 1000 + kEvents, events, {}).ok());

  v1::QueryAuditRequest q;
  q.set_cluster_id(absl::StrCat(kOtherCluster));
  q.set_limit(10000);
  std::vector<int64_t> revisions;
  int pages = 0;
  while (true) {
    auto page = client->QueryAudit(q);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    EXPECT_LE(page->ByteSizeLong(), 3u << 20);
    for (const auto& e : page->events()) revisions.push_back(e.revision());
    if (!page->more()) {
      EXPECT_LT(page->events_size(), q.limit());
      break;
    }
    ASSERT_GT(page->events_size(), 0);
    *q.mutable_after() = page->events(page->events_size() - 1);
  }
  EXPECT_GE(pages, 3);  // about 8.7 MB of events
  ASSERT_EQ(revisions.size(), static_cast<size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) ASSERT_EQ(revisions[i], 1000 + i) << i;

  // The CLI reads them all the same, a page at a time.
  const std::string out = dir + "/audit.out";
  dev::SpawnOptions cli;
  cli.argv = {testing::BinDir() + "/holdfast", "--endpoint", (*cluster)->endpoint(), "audit",
              "--cluster", absl::StrCat(kOtherCluster), "--limit", "10000", "-o", "json"};
  cli.log_file = out;
  cli.env = {{"HOLDFAST_DEV_DIR", dir + "/no-dev"}};  // plaintext, not a local dev's mTLS
  auto p = dev::Subprocess::Spawn(cli);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(std::chrono::seconds(60)), 0);
  std::ifstream in(out);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, kEvents);
  std::filesystem::remove_all(dir);
}

TEST(AuditTest, AnotherReplicaTakesOverFromTheCursorAndCompactionNeverPassesIt) {
  testing::TestCluster::Options o;
  o.replicas = 2;
  o.extra_config =
      "audit:\n  leader_ttl: 2s\n  compaction_interval: 1s\n  compaction_keep_revisions: 100\n";
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto& c = **cluster;
  ASSERT_TRUE(c.CreateNamespace("default").ok());

  // Which replica audits?
  int leader = -1;
  for (int attempt = 0; attempt < 100 && leader < 0; ++attempt) {
    for (int i = 0; i < 2; ++i) {
      auto st = (*c.NewClient(i))->GetAuditStatus();
      if (st.ok() && st->this_replica_leads()) leader = i;
    }
    if (leader < 0) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_GE(leader, 0) << "no replica leads the audit";
  const int survivor = 1 - leader;
  auto client = std::move(*c.NewClient(survivor));
  auto session = std::move(*client->OpenSession("default"));

  constexpr int kBefore = 20, kAfter = 150;
  for (int i = 0; i < kBefore; ++i) {
    auto h = session->Acquire(absl::StrCat("before/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
  // A hold whose grant the old leader recorded and whose release the new one
  // records: the new term never saw its put, so it reads the hold at the revision
  // before the release (audit/prev_values.h) for its token and holder.
  auto across = session->Acquire("across");
  ASSERT_TRUE(across.ok()) << across.status();
  const int64_t across_token = across->token();
  auto granted = WaitForAudit(*client, InNamespace("default"), [&](const auto& ev) {
    return Find(ev, "grant", "across", session->id()) != nullptr;
  });
  ASSERT_NE(Find(granted, "grant", "across", session->id()), nullptr);
  c.holdfastd(leader).Kill();  // SIGKILL: no resignation, its lease must expire
  for (int i = 0; i < kAfter; ++i) {
    auto h = session->Acquire(absl::StrCat("after/", i));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
  }
  ASSERT_TRUE(across->Release().ok());
  const size_t expected = 2 * (kBefore + kAfter + 1);
  auto events = WaitForAudit(*client, InNamespace("default"),
                             [&](const auto& ev) { return ev.size() >= expected; });
  EXPECT_EQ(events.size(), expected);
  for (const auto& [k, count] : Count(events)) {
    EXPECT_EQ(count, 1) << std::get<0>(k) << " " << std::get<1>(k);
  }
  const v1::AuditEvent* released = Find(events, "release", "across", session->id());
  ASSERT_NE(released, nullptr);
  EXPECT_EQ(released->token(), across_token);
  EXPECT_EQ(released->spiffe_id(), Find(events, "grant", "across", session->id())->spiffe_id());
  EXPECT_FALSE(released->spiffe_id().empty());
  auto st = client->GetAuditStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->this_replica_leads());

  // holdfastd compacts etcd, never closer than 100 revisions to the cursor.
  for (int i = 0; i < 100; ++i) {
    st = client->GetAuditStatus();
    if (st.ok() && st->compacted_revision() > 0) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(st.ok());
  ASSERT_GT(st->compacted_revision(), 0) << "no compaction happened";
  EXPECT_LE(st->compacted_revision(), st->cursor() - 100);
  // And etcd did compact: reading below it fails.
  pb::RangeRequest old;
  old.set_key(keyspace::EpochKey());
  old.set_revision(1);
  auto r = c.etcd_client().RangeSync(old, etcd::DeadlineIn(seconds(5)));
  EXPECT_FALSE(r.ok());
}

// audit.retention: a new auditor term prunes at once, then every minute, 2,000
// events per transaction, the next transaction on the next turn while one comes
// back full; the grant of a hold with no recorded end stays. Rows
// are planted straight in the store under another cluster id (as an etcd cluster
// the namespace lived on before a rehome would have left them), so the auditor's
// own cursor is not touched.
TEST(AuditTest, EventsOlderThanTheRetentionArePrunedAndTheRestKept) {
  testing::TestCluster::Options o;
  o.extra_config = "audit:\n  retention: 1h\n";
  auto cluster = testing::TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto& c = **cluster;
  ASSERT_TRUE(c.CreateNamespace("default").ok());
  {
    auto client = std::move(*c.NewClient());
    auto session = std::move(*client->OpenSession("default"));
    auto h = session->Acquire("recent");
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(h->Release().ok());
    auto events = WaitForAudit(*client, InNamespace("default"),
                               [](const auto& ev) { return ev.size() >= 2; });
    ASSERT_EQ(events.size(), 2u);
    auto st = client->GetAuditStatus();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->retention_ms(), 3'600'000);
  }

  constexpr uint64_t kEarlierCluster = 42;
  constexpr int kOld = 5'000;
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  auto planted = [&](int64_t revision, const std::string& key, int64_t age_ms,
                     audit::EventType type = audit::EventType::kGrant) {
    audit::AuditEvent e;
    e.cluster_id = kEarlierCluster;
    e.revision = revision;
    e.ns = "default";
    e.lock_key = key;
    e.session_id = 77;
    e.type = type;
    e.spiffe_id = "spiffe://holdfast.dev/dev";
    e.token = (int64_t{1} << 48) | revision;
    e.time_unix_ms = now_ms - age_ms;
    return e;
  };
  audit::ForceReleaseRow old_force;
  old_force.request_id = "req-old";
  old_force.cluster_id = kEarlierCluster;
  old_force.revision = 11;
  old_force.ns = "default";
  old_force.lock_key = "old/forced";
  old_force.session_id = 77;
  old_force.token = (int64_t{1} << 48) | 10;
  old_force.requester = "spiffe://holdfast.dev/ops/a";
  old_force.approver = "spiffe://holdfast.dev/ops/b";
  old_force.reason = "wedged";
  old_force.requested_at_unix_ms = now_ms - 3 * 3'600'000;
  old_force.approved_at_unix_ms = now_ms - 3 * 3'600'000;
  {
    auto store = audit::OpenSqliteStore(c.dir() + "/audit.db");
    ASSERT_TRUE(store.ok()) << store.status();
    // More old events than one pruning transaction takes (2,000): the auditor
    // must go on over several turns of its loop (the next pass would be a
    // minute later). Each old hold is a grant and its release.
    std::vector<audit::AuditEvent> rows;
    for (int i = 0; i < kOld / 2; ++i) {
      const std::string key = absl::StrCat("old/", i);
      rows.push_back(planted(100 + 2 * i, key, 2 * 3'600'000));
      rows.push_back(planted(101 + 2 * i, key, 2 * 3'600'000 - 1, audit::EventType::kRelease));
    }
    // Old, but with no end recorded: the hold may be live, its grant stays.
    rows.push_back(planted(11, "old/live", 3 * 3'600'000));
    rows.push_back(planted(100 + kOld, "kept/young", 30 * 60'000));
    ASSERT_TRUE((*store)->Record(kEarlierCluster, 100 + kOld, rows, {old_force}).ok());
  }
  // A clean stop resigns; the restarted replica leads a new term and prunes.
  c.holdfastd().Stop();
  ASSERT_TRUE(c.holdfastd().Restart().ok());
  auto client = std::move(*c.NewClient());
  auto store = audit::OpenSqliteStore(c.dir() + "/audit.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto what_is_left = [&] {
    audit::AuditQuery all;
    all.limit = 10000;
    auto rows = (*store)->Query(all);
    std::vector<std::string> keys;
    if (!rows.ok()) return std::vector<std::string>{rows.status().ToString()};
    for (const auto& e : *rows) {
      keys.push_back(absl::StrCat(e.lock_key, "/", audit::EventTypeName(e.type)));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  const std::vector<std::string> kKept = {"kept/young/grant", "old/live/grant", "recent/grant",
                                          "recent/release"};
  std::vector<std::string> left;
  for (int i = 0; i < 300; ++i) {  // a liveness bound, not a speed claim
    left = what_is_left();
    if (left == kKept) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(left, kKept);
  auto st = client->GetAuditStatus();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->pruned_events(), kOld) << st->last_error();
  auto forces = (*store)->ForceReleases(100);
  ASSERT_TRUE(forces.ok()) << forces.status();
  EXPECT_TRUE(forces->empty());
  // The epoch history is never pruned, and recording goes on.
  auto epochs = (*store)->Epochs();
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  EXPECT_FALSE(epochs->empty());
  auto session = std::move(*client->OpenSession("default"));
  auto h = session->Acquire("after");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->Release().ok());
  auto after = WaitForAudit(*client, InNamespace("default"), [&](const auto& ev) {
    return Find(ev, "release", "after", session->id()) != nullptr;
  });
  EXPECT_NE(Find(after, "release", "after", session->id()), nullptr);
}

class ForceReleaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.tls = true;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    ASSERT_TRUE(cluster_->MakeIdentity("admin2", "spiffe://test.holdfast/ops/bob").ok());
    ASSERT_TRUE(cluster_->MakeIdentity("alice", "spiffe://test.holdfast/team/alice").ok());
    admin_ = std::move(*cluster_->NewClientAs("admin"));
    admin2_ = std::move(*cluster_->NewClientAs("admin2"));
    alice_ = std::move(*cluster_->NewClientAs("alice"));
    ASSERT_TRUE(CreateAdvisoryClass(*admin_, "default").ok());
  }

  v1::ForceRequest Request(const std::string& key, int64_t session = 0) {
    v1::RequestForceReleaseRequest r;
    r.set_namespace_("default");
    r.set_lock_key(key);
    r.set_session_id(session);
    r.set_reason("job stuck since 03:00, ticket OPS-1");
    auto out = admin_->RequestForceRelease(r);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : v1::ForceRequest();
  }

  absl::StatusOr<v1::ApproveForceReleaseResponse> Approve(Client& who, const std::string& id,
                                                          bool ack = false) {
    v1::ApproveForceReleaseRequest r;
    r.set_request_id(id);
    r.set_ack_unfenced(ack);
    return who.ApproveForceRelease(r);
  }

  // Tokens of the current holders of `key`.
  std::vector<int64_t> Holders(const std::string& key) {
    std::vector<int64_t> out;
    auto d = admin_->Describe("default", key);
    if (d.ok()) {
      for (const auto& h : d->holders()) out.push_back(h.token());
    }
    return out;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<Client> admin_, admin2_, alice_;
};

TEST_F(ForceReleaseTest, NeedsASecondAdminAndIsAuditedWithItsReason) {
  auto session = std::move(*alice_->OpenSession("default"));
  auto hold = session->Acquire("db");
  ASSERT_TRUE(hold.ok()) << hold.status();
  v1::ForceRequest req = Request("db");
  ASSERT_EQ(req.request_id().size(), 16u);
  EXPECT_EQ(req.token(), hold->token());
  EXPECT_EQ(req.holder(), "spiffe://test.holdfast/team/alice");
  EXPECT_TRUE(req.class_is_fenced());

  auto listed = admin2_->ListForceRequests();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->requests_size(), 1);
  EXPECT_EQ(listed->requests(0).request_id(), req.request_id());

  // The requester cannot approve, nor can a non-admin: nothing changes.
  auto self = Approve(*admin_, req.request_id());
  EXPECT_EQ(self.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(self.status().message().find("two people"), std::string::npos) << self.status();
  EXPECT_EQ(Approve(*alice_, req.request_id()).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Holders("db"), std::vector<int64_t>{hold->token()});

  auto ok = Approve(*admin2_, req.request_id());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Holders("db").empty());
  // The old holder's token is stale now.
  EXPECT_EQ(hold->Release().code(), absl::StatusCode::kFailedPrecondition);
  // The request is used up.
  EXPECT_EQ(Approve(*admin2_, req.request_id()).status().code(), absl::StatusCode::kNotFound);

  v1::QueryAuditRequest q = InNamespace("default");
  q.set_type("force");
  auto forces = WaitForAudit(*admin_, q, [](const auto& ev) { return !ev.empty(); });
  ASSERT_EQ(forces.size(), 1u);
  EXPECT_EQ(forces[0].revision(), ok->revision());
  EXPECT_EQ(forces[0].token(), hold->token());
  EXPECT_EQ(forces[0].spiffe_id(), "spiffe://test.holdfast/team/alice");
  EXPECT_FALSE(forces[0].unprotected());
  // The two people and why, through the API (the force_release row).
  ASSERT_TRUE(forces[0].has_force()) << forces[0].DebugString();
  EXPECT_EQ(forces[0].force().request_id(), req.request_id());
  EXPECT_EQ(forces[0].force().requester(), "spiffe://test.holdfast/ops/admin");
  EXPECT_EQ(forces[0].force().approver(), "spiffe://test.holdfast/ops/bob");
  EXPECT_EQ(forces[0].force().reason(), "job stuck since 03:00, ticket OPS-1");
  EXPECT_TRUE(forces[0].force().class_was_fenced());
  // Other events carry none.
  q.clear_type();
  auto all = WaitForAudit(*admin_, q, [](const auto& ev) { return ev.size() >= 2; });
  for (const auto& e : all) EXPECT_EQ(e.has_force(), e.type() == "force") << e.DebugString();

  // The force_release row, joined by revision.
  auto store = audit::OpenSqliteStore(cluster_->dir() + "/audit.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto rows = (*store)->ForceReleases(10);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  const auto& row = (*rows)[0];
  EXPECT_EQ(row.request_id, req.request_id());
  EXPECT_EQ(row.revision, ok->revision());
  EXPECT_EQ(row.requester, "spiffe://test.holdfast/ops/admin");
  EXPECT_EQ(row.approver, "spiffe://test.holdfast/ops/bob");
  EXPECT_EQ(row.reason, "job stuck since 03:00, ticket OPS-1");
  EXPECT_TRUE(row.class_was_fenced);
  EXPECT_EQ(row.token, hold->token());
}

TEST_F(ForceReleaseTest, TheHolderIsToldOnItsNextRenewal) {
  std::atomic<int> on_lost_calls{0};
  SessionOptions so;
  so.ttl = std::chrono::seconds(3);  // renewed every second
  so.on_lost = [&](const absl::Status&) { on_lost_calls.fetch_add(1); };
  auto session = std::move(*alice_->OpenSession("default", so));
  auto forced = session->Acquire("db/primary");
  auto kept = session->Acquire("db/replica");
  ASSERT_TRUE(forced.ok() && kept.ok());
  v1::ForceRequest req = Request("db/primary");
  ASSERT_TRUE(Approve(*admin2_, req.request_id()).ok());

  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!forced->lost() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(forced->lost()) << "the holder was never told";
  EXPECT_EQ(forced->lost_reason().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(forced->lost_reason().message().find("force-released"), std::string::npos)
      << forced->lost_reason();
  EXPECT_NE(forced->lost_reason().message().find("ticket OPS-1"), std::string::npos)
      << forced->lost_reason();
  EXPECT_NE(forced->lost_reason().message().find(req.request_id()), std::string::npos);
  EXPECT_TRUE(forced->lost_token().stop_requested());
  EXPECT_EQ(on_lost_calls.load(), 1);
  // Only that hold: the session and its other hold go on.
  EXPECT_FALSE(session->lost());
  EXPECT_FALSE(kept->lost());
  const int64_t renewals = session->renewals();
  while (session->renewals() < renewals + 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(kept->lost());
  EXPECT_EQ(on_lost_calls.load(), 1) << "told again on later answers, but lost once";
  EXPECT_TRUE(kept->Release().ok());
}

// Fenced is judged at the approval: a class that makes the key advisory after
// the request (here a new class of a longer prefix) leaves the holder unfenced,
// and the approval needs the acknowledgement, which the audit then records.
TEST_F(ForceReleaseTest, AKeyMadeAdvisorySinceTheRequestNeedsTheAcknowledgement) {
  auto session = std::move(*alice_->OpenSession("default"));
  auto hold = session->Acquire("late-adv/report");
  ASSERT_TRUE(hold.ok()) << hold.status();
  v1::ForceRequest req = Request("late-adv/report");
  EXPECT_TRUE(req.class_is_fenced());
  v1::LockClass cls;
  cls.set_namespace_("default");
  cls.set_class_id("late-adv");
  cls.set_key_prefix("late-adv/");
  cls.set_enforcement(v1::ENFORCEMENT_ADVISORY);
  ASSERT_TRUE(admin_->CreateClass(cls).ok());
  auto refused = Approve(*admin2_, req.request_id());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("(made advisory since the request)"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(Holders("late-adv/report"), std::vector<int64_t>{hold->token()});
  auto ok = Approve(*admin2_, req.request_id(), /*ack=*/true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Holders("late-adv/report").empty());
}

TEST_F(ForceReleaseTest, AdvisoryHoldNeedsAnAcknowledgement) {
  auto session = std::move(*alice_->OpenSession("default"));
  auto hold = session->Acquire("adv/report");
  ASSERT_TRUE(hold.ok()) << hold.status();
  v1::ForceRequest req = Request("adv/report");
  EXPECT_FALSE(req.class_is_fenced());
  auto refused = Approve(*admin2_, req.request_id());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--ack-unfenced"), std::string::npos);
  EXPECT_EQ(Holders("adv/report"), std::vector<int64_t>{hold->token()});
  auto ok = Approve(*admin2_, req.request_id(), /*ack=*/true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Holders("adv/report").empty());

  v1::QueryAuditRequest q = InNamespace("default");
  q.set_type("force");
  auto forces = WaitForAudit(*admin_, q, [](const auto& ev) { return !ev.empty(); });
  ASSERT_EQ(forces.size(), 1u);
  EXPECT_TRUE(forces[0].unprotected());
  auto store = audit::OpenSqliteStore(cluster_->dir() + "/audit.db");
  ASSERT_TRUE(store.ok());
  auto rows = (*store)->ForceReleases(10);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_FALSE((*rows)[0].class_was_fenced);
}

TEST_F(ForceReleaseTest, AHoldGrantedSinceTheRequestIsNotTouched) {
  auto s1 = std::move(*alice_->OpenSession("default"));
  auto s2 = std::move(*alice_->OpenSession("default"));
  auto first = s1->Acquire("queue");
  ASSERT_TRUE(first.ok());
  v1::ForceRequest req = Request("queue");
  ASSERT_TRUE(first->Release().ok());
  auto second = s2->Acquire("queue");
  ASSERT_TRUE(second.ok());
  auto r = Approve(*admin2_, req.request_id());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("nothing released"), std::string::npos) << r.status();
  EXPECT_EQ(Holders("queue"), std::vector<int64_t>{second->token()});
}

// A request past the expiry it announced cannot be approved, even while its key
// lives on (etcd gives a lease its whole TTL again after a leader change): it is
// not listed, and the approval releases nothing.
TEST_F(ForceReleaseTest, ARequestPastItsExpiryIsNotApproved) {
  auto s = std::move(*alice_->OpenSession("default"));
  auto h = s->Acquire("late");
  ASSERT_TRUE(h.ok());
  v1::ForceRequest req = Request("late");
  ASSERT_FALSE(req.request_id().empty());
  // The record as a request made 16 minutes ago would be, on its live lease.
  const std::string key = keyspace::ForceRequestKey(req.request_id());
  pb::RangeRequest r;
  r.set_key(key);
  auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(got.ok() && got->kvs_size() == 1);
  records::ForceRequestRecord rec;
  ASSERT_TRUE(rec.ParseFromString(got->kvs(0).value()));
  rec.set_requested_at_unix_ms(rec.requested_at_unix_ms() - 16 * 60 * 1000);
  rec.set_expires_at_unix_ms(rec.requested_at_unix_ms() + 15 * 60 * 1000);
  pb::PutRequest put;
  put.set_key(key);
  put.set_value(rec.SerializeAsString());
  put.set_lease(got->kvs(0).lease());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());

  auto listed = admin2_->ListForceRequests();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->requests_size(), 0) << listed->DebugString();
  auto late = Approve(*admin2_, req.request_id());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("expired"), std::string::npos) << late.status();
  EXPECT_NE(late.status().message().find("nothing released"), std::string::npos)
      << late.status();
  EXPECT_EQ(Holders("late"), std::vector<int64_t>{h->token()});
  EXPECT_FALSE(h->lost());
}

TEST_F(ForceReleaseTest, BadRequestsAreRefusedAndChangeNothing) {
  auto count = [&] {
    pb::RangeRequest r;
    r.set_key(keyspace::ForceRequestPrefix());
    r.set_range_end(keyspace::PrefixEnd(keyspace::ForceRequestPrefix()));
    r.set_count_only(true);
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() ? got->count() : -1;
  };
  v1::RequestForceReleaseRequest r;
  r.set_namespace_("default");
  r.set_lock_key("nobody-holds-this");
  r.set_reason("x");
  auto none = admin_->RequestForceRelease(r);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("nobody holds"), std::string::npos);

  r.set_reason("  ");
  auto no_reason = admin_->RequestForceRelease(r);
  EXPECT_EQ(no_reason.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_reason.status().message().find("reason"), std::string::npos);

  r.set_reason("x");
  r.set_namespace_("nope");
  EXPECT_EQ(admin_->RequestForceRelease(r).status().code(), absl::StatusCode::kNotFound);

  // Only admins may ask.
  auto session = std::move(*alice_->OpenSession("default"));
  auto hold = session->Acquire("mine");
  ASSERT_TRUE(hold.ok());
  r.set_namespace_("default");
  r.set_lock_key("mine");
  EXPECT_EQ(alice_->RequestForceRelease(r).status().code(), absl::StatusCode::kPermissionDenied);
  // A reason with a control character (a NUL would cut it short in PostgreSQL).
  r.set_reason(std::string("hung\0 job", 9));
  auto nul = admin_->RequestForceRelease(r);
  EXPECT_EQ(nul.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nul.status().message(),
            "the reason contains control character U+0000 at byte 4: use plain text");
  r.set_reason("x");

  auto malformed = Approve(*admin2_, "../../epoch");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  auto upper = Approve(*admin2_, "00000000000000FF");
  EXPECT_EQ(upper.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(upper.status().message(),
            "\"00000000000000FF\" is not a request id (16 lower-case hex digits, from `force "
            "request`)");
  EXPECT_EQ(Approve(*admin2_, "00000000000000ff").status().code(), absl::StatusCode::kNotFound);

  // Two shared holders: the request must name one.
  auto s2 = std::move(*alice_->OpenSession("default"));
  auto r1 = session->Acquire("shared", testing::Waiting(milliseconds(0), true));
  auto r2 = s2->Acquire("shared", testing::Waiting(milliseconds(0), true));
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.status() << r2.status();
  r.set_lock_key("shared");
  auto ambiguous = admin_->RequestForceRelease(r);
  EXPECT_EQ(ambiguous.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ambiguous.status().message().find("--session"), std::string::npos);

  EXPECT_EQ(count(), 0);  // none of these left a pending request
  EXPECT_EQ(Holders("mine"), std::vector<int64_t>{hold->token()});
  EXPECT_EQ(Holders("shared").size(), 2u);
}

}  // namespace
}  // namespace holdfast
