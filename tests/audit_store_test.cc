// The audit store's contract (src/audit/store.h), checked against both
// implementations: one set of tests, run on SQLite (a file in a temporary
// directory) and on a real PostgreSQL 15 (one server per test process, started by
// dev::PostgresProcess on first use; a fresh database per test). Expected query
// answers come from a reference filter over the rows the test wrote, never from
// hard-coded lists.
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "audit/migrations.h"
#include "audit/store.h"
#include "dev/postgres_process.h"
#include "dev/refusing_endpoint.h"
#include "dev/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace holdfast::audit {

// Comparison and printing for the assertions below.
auto Fields(const AuditEvent& e) {
  return std::tie(e.cluster_id, e.revision, e.ns, e.lock_key, e.session_id, e.type, e.spiffe_id,
                  e.token, e.unprotected, e.time_unix_ms);
}
bool operator==(const AuditEvent& a, const AuditEvent& b) { return Fields(a) == Fields(b); }
void PrintTo(const AuditEvent& e, std::ostream* os) {
  *os << "{cluster " << e.cluster_id << " rev " << e.revision << " " << e.ns << "/" << e.lock_key
      << " session " << e.session_id << " " << EventTypeName(e.type) << " " << e.spiffe_id
      << " token " << e.token << (e.unprotected ? " unprotected" : "") << " t " << e.time_unix_ms
      << "}";
}

auto Fields(const ForceReleaseRow& f) {
  return std::tie(f.request_id, f.cluster_id, f.revision, f.ns, f.lock_key, f.session_id, f.token,
                  f.requester, f.approver, f.reason, f.class_was_fenced, f.requested_at_unix_ms,
                  f.approved_at_unix_ms);
}
bool operator==(const ForceReleaseRow& a, const ForceReleaseRow& b) {
  return Fields(a) == Fields(b);
}
void PrintTo(const ForceReleaseRow& f, std::ostream* os) {
  *os << "{" << f.request_id << " cluster " << f.cluster_id << " rev " << f.revision << " " << f.ns
      << "/" << f.lock_key << " session " << f.session_id << " token " << f.token << " "
      << f.requester << " -> " << f.approver << " \"" << f.reason << "\" fenced "
      << f.class_was_fenced << " " << f.requested_at_unix_ms << ".." << f.approved_at_unix_ms
      << "}";
}

auto Fields(const EpochRow& r) {
  return std::tie(r.epoch, r.cluster_id, r.advanced_at_unix_ms, r.reason, r.actor);
}
bool operator==(const EpochRow& a, const EpochRow& b) { return Fields(a) == Fields(b); }
bool operator<(const EpochRow& a, const EpochRow& b) { return Fields(a) < Fields(b); }
void PrintTo(const EpochRow& r, std::ostream* os) {
  *os << "{epoch " << r.epoch << " cluster " << r.cluster_id << " at " << r.advanced_at_unix_ms
      << " " << r.reason << " by " << r.actor << "}";
}

namespace {

constexpr uint64_t kClusterA = 0x1234'5678'9abc'def0;
constexpr uint64_t kClusterHigh = 0xf1e2'd3c4'b5a6'9788;  // >= 2^63: negative as int64
static_assert(kClusterHigh >= (uint64_t{1} << 63));

// The largest token there can be (epoch 2^15 - 1, revision 2^48 - 1), and one near 2^62.
constexpr int64_t kMaxToken = (int64_t{0x7fff} << 48) | ((int64_t{1} << 48) - 1);
constexpr int64_t kTokenNear2To62 = (int64_t{1} << 62) + 12345;

AuditEvent Event(uint64_t cluster, int64_t revision, std::string ns, std::string key,
                 int64_t session, EventType type, std::string spiffe = "spiffe://t/alice",
                 int64_t time_ms = 1'700'000'000'000) {
  AuditEvent e;
  e.cluster_id = cluster;
  e.revision = revision;
  e.ns = std::move(ns);
  e.lock_key = std::move(key);
  e.session_id = session;
  e.type = type;
  e.spiffe_id = std::move(spiffe);
  e.token = (int64_t{1} << 48) | revision;
  e.time_unix_ms = time_ms;
  return e;
}

ForceReleaseRow Force(uint64_t cluster, int64_t revision, std::string request_id,
                      int64_t approved_at = 1'700'000'100'000) {
  ForceReleaseRow f;
  f.request_id = std::move(request_id);
  f.cluster_id = cluster;
  f.revision = revision;
  f.ns = "payments";
  f.lock_key = "db/primary";
  f.session_id = 7001;
  f.token = (int64_t{1} << 48) | (revision - 3);
  f.requester = "spiffe://t/admin-a";
  f.approver = "spiffe://t/admin-b";
  f.reason = "holder wedged";
  f.class_was_fenced = true;
  f.requested_at_unix_ms = approved_at - 60'000;
  f.approved_at_unix_ms = approved_at;
  return f;
}

// Where `e` stands in a query's order: what `after_event` takes.
AuditEventKey KeyOf(const AuditEvent& e) {
  return AuditEventKey{e.revision, e.ns, e.lock_key, e.session_id, e.cluster_id};
}

// Builds an AuditQuery one filter at a time: Q().ns("x").key("y").
struct Q {
  AuditQuery q;
  Q& cluster(uint64_t v) {
    q.cluster_id = v;
    return *this;
  }
  Q& ns(std::string v) {
    q.ns = std::move(v);
    return *this;
  }
  Q& key(std::string v) {
    q.lock_key = std::move(v);
    return *this;
  }
  Q& type(EventType v) {
    q.type = v;
    return *this;
  }
  Q& spiffe(std::string v) {
    q.spiffe_id = std::move(v);
    return *this;
  }
  Q& since(int64_t v) {
    q.since_unix_ms = v;
    return *this;
  }
  Q& after(int64_t v) {
    q.after_revision = v;
    return *this;
  }
  Q& after_event(const AuditEvent& e) {
    q.after_event = KeyOf(e);
    return *this;
  }
  Q& limit(int v) {
    q.limit = v;
    return *this;
  }
  Q& deadline(std::chrono::steady_clock::time_point v) {
    q.deadline = v;
    return *this;
  }
  operator AuditQuery() const { return q; }  // NOLINT: implicit on purpose
};

// The contract's order: (revision, namespace, lock_key, session_id); the cluster
// only breaks ties between clusters. Strings compare as bytes.
auto OrderKey(const AuditEvent& e) {
  return std::make_tuple(e.revision, e.ns, e.lock_key, e.session_id,
                         static_cast<int64_t>(e.cluster_id));
}

// What a store must answer to `q` when it holds exactly `all`.
std::vector<AuditEvent> Reference(std::vector<AuditEvent> all, const AuditQuery& q) {
  std::erase_if(all, [&](const AuditEvent& e) {
    return (q.cluster_id && e.cluster_id != *q.cluster_id) || (!q.ns.empty() && e.ns != q.ns) ||
           (!q.lock_key.empty() && e.lock_key != q.lock_key) || (q.type && e.type != *q.type) ||
           (!q.spiffe_id.empty() && e.spiffe_id != q.spiffe_id) ||
           (q.since_unix_ms != 0 && e.time_unix_ms < q.since_unix_ms) ||
           (q.after_revision != 0 && e.revision <= q.after_revision) ||
           (q.after_event &&
            OrderKey(e) <= std::make_tuple(q.after_event->revision, q.after_event->ns,
                                           q.after_event->lock_key, q.after_event->session_id,
                                           static_cast<int64_t>(q.after_event->cluster_id)));
  });
  std::sort(all.begin(), all.end(),
            [](const AuditEvent& a, const AuditEvent& b) { return OrderKey(a) < OrderKey(b); });
  size_t limit = static_cast<size_t>(std::clamp(q.limit, 1, 10000));
  if (all.size() > limit) all.resize(limit);
  return all;
}

std::vector<AuditEvent> Sorted(std::vector<AuditEvent> v) {
  return Reference(std::move(v), Q().limit(10000));
}

// ---------------------------------------------------------------------------------
// One PostgreSQL server per test process, started on first use.

class SharedPostgres {
 public:
  static dev::PostgresProcess* Get() {
    if (!tried_) {
      tried_ = true;
      auto pg = dev::PostgresProcess::Start();
      if (pg.ok()) {
        server_ = std::move(*pg);
      } else {
        error_ = pg.status().ToString();
      }
    }
    return server_.get();
  }
  static const std::string& error() { return error_; }
  // A new, empty database on the shared server; its name.
  static std::optional<std::string> FreshDatabaseName() {
    dev::PostgresProcess* pg = Get();
    if (pg == nullptr) return std::nullopt;
    std::string name = absl::StrCat("t", ++databases_);
    if (auto s = pg->CreateDatabase(name); !s.ok()) {
      error_ = s.ToString();
      return std::nullopt;
    }
    return name;
  }
  // The same; its connection string.
  static std::optional<std::string> FreshDatabase() {
    std::optional<std::string> name = FreshDatabaseName();
    if (!name) return std::nullopt;
    return Get()->conninfo(*name);
  }
  static void Shutdown() { server_.reset(); }

 private:
  static inline bool tried_ = false;
  static inline std::unique_ptr<dev::PostgresProcess> server_;
  static inline std::string error_;
  static inline int databases_ = 0;
};

class PostgresEnvironment : public testing::Environment {
 public:
  void TearDown() override { SharedPostgres::Shutdown(); }
};
[[maybe_unused]] testing::Environment* const kPostgresEnvironment =
    testing::AddGlobalTestEnvironment(new PostgresEnvironment);

// ---------------------------------------------------------------------------------
// Direct access to the database under a store, for what the interface cannot show.

absl::StatusOr<int64_t> SqliteScalar(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(db, sqlite3_close);
  if (rc != SQLITE_OK) return absl::InternalError(sqlite3_errmsg(db));
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(sqlite3_errmsg(db));
  }
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> finalizer(stmt, sqlite3_finalize);
  if (sqlite3_step(stmt) != SQLITE_ROW) return absl::InternalError(sqlite3_errmsg(db));
  return sqlite3_column_int64(stmt, 0);
}

absl::StatusOr<int64_t> PostgresScalar(const std::string& conninfo, const std::string& sql) {
  std::unique_ptr<PGconn, void (*)(PGconn*)> conn(PQconnectdb(conninfo.c_str()), PQfinish);
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    return absl::UnavailableError(PQerrorMessage(conn.get()));
  }
  std::unique_ptr<PGresult, void (*)(PGresult*)> r(PQexec(conn.get(), sql.c_str()), PQclear);
  if (PQresultStatus(r.get()) != PGRES_TUPLES_OK || PQntuples(r.get()) != 1) {
    return absl::InternalError(PQerrorMessage(conn.get()));
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(PQgetvalue(r.get(), 0, 0), &v)) {
    return absl::InternalError(absl::StrCat("not an integer: ", PQgetvalue(r.get(), 0, 0)));
  }
  return v;
}

// ---------------------------------------------------------------------------------

enum class Backend { kSqlite, kPostgres };

const char* BackendName(Backend b) { return b == Backend::kSqlite ? "Sqlite" : "Postgres"; }
std::string BackendTestName(const testing::TestParamInfo<Backend>& info) {
  return BackendName(info.param);
}
void PrintTo(Backend b, std::ostream* os) { *os << BackendName(b); }

class AuditStoreContract : public testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "audit_store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::optional<std::string> location = FreshLocation();
    ASSERT_TRUE(location.has_value()) << SharedPostgres::error();
    location_ = *location;
    store_ = Open(location_);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A location no store has opened yet: a new file, or a new database.
  std::optional<std::string> FreshLocation() {
    if (GetParam() == Backend::kSqlite) {
      return absl::StrCat(dir_, "/audit", ++files_, ".db");
    }
    return SharedPostgres::FreshDatabase();
  }

  // A second store on location_ whose calls wait 300 ms for another connection's
  // lock. On PostgreSQL its session also cancels any statement after 5 s, so that
  // a store that lost its bound fails these tests instead of hanging them.
  absl::StatusOr<std::unique_ptr<AuditStore>> OpenQuick() {
    StoreOptions quick;
    quick.lock_wait = std::chrono::milliseconds(300);
    if (GetParam() == Backend::kSqlite) return OpenSqliteStore(location_, quick);
    return OpenPostgresStore(location_ + " options='-c statement_timeout=5000'", quick);
  }

  // A second store on the same location, as another replica would open it.
  static std::unique_ptr<AuditStore> Open(const std::string& location, Backend backend) {
    auto s = backend == Backend::kSqlite ? OpenSqliteStore(location) : OpenPostgresStore(location);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<AuditStore> Open(const std::string& location) {
    return Open(location, GetParam());
  }

  // One integer read straight from the database (not through the store).
  int64_t Scalar(const std::string& sql, const std::string& location = "") {
    const std::string& where = location.empty() ? location_ : location;
    auto v = GetParam() == Backend::kSqlite ? SqliteScalar(where, sql) : PostgresScalar(where, sql);
    EXPECT_TRUE(v.ok()) << sql << ": " << v.status();
    return v.ok() ? *v : -1;
  }

  std::vector<AuditEvent> All(AuditStore& store) {
    auto v = store.Query(Q().limit(10000));
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<AuditEvent>{};
  }
  std::vector<AuditEvent> All() { return All(*store_); }
  std::vector<ForceReleaseRow> Forces() {
    auto v = store_->ForceReleases(10000);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<ForceReleaseRow>{};
  }
  std::optional<int64_t> CursorOf(uint64_t cluster, AuditStore* store = nullptr) {
    auto v = (store ? store : store_.get())->Cursor(cluster);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::nullopt;
  }

  std::string dir_;
  std::string location_;
  std::unique_ptr<AuditStore> store_;
  int files_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Backends, AuditStoreContract,
                         testing::Values(Backend::kSqlite, Backend::kPostgres), BackendTestName);

// Each backend says what its commits wait for, read from the database. SQLite runs
// with synchronous=FULL. PostgreSQL's `off` (this test server's own setting, for
// speed) is raised to `on` in each of the store's transactions; any other setting is
// left as configured.
TEST_P(AuditStoreContract, CommitsWaitForTheDiskWhateverTheServersDefault) {
  auto d = store_->CommitDurability();
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<AuditEvent> batch = {Event(kClusterA, 10, "ns", "k", 1, EventType::kGrant)};
  ASSERT_TRUE(store_->Record(kClusterA, 10, batch, {}).ok());
  EXPECT_EQ(All().size(), 1u);
  if (GetParam() == Backend::kSqlite) {
    EXPECT_EQ(d->setting, "synchronous=FULL");
    EXPECT_EQ(d->raised_from, "");
    return;
  }
  // What a connection of its own gets from this server.
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM pg_settings WHERE name = 'synchronous_commit' "
                   "AND setting = 'off'"),
            1);
  EXPECT_EQ(d->setting, "synchronous_commit=on");
  EXPECT_EQ(d->raised_from, "synchronous_commit=off");
  for (const std::string kept : {"on", "local", "remote_write", "remote_apply"}) {
    auto other = OpenPostgresStore(
        absl::StrCat(location_, " options='-c synchronous_commit=", kept, "'"));
    ASSERT_TRUE(other.ok()) << other.status();
    auto k = (*other)->CommitDurability();
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(k->setting, "synchronous_commit=" + kept);
    EXPECT_EQ(k->raised_from, "");
    batch = {Event(kClusterA, 10, "ns", kept, 1, EventType::kGrant)};
    ASSERT_TRUE((*other)->Record(kClusterA, 10, batch, {}).ok());
  }
  EXPECT_EQ(All().size(), 5u);
}

TEST_P(AuditStoreContract, MigrationsAppliedOnOpenAndReopeningIsANoOp) {
  auto version = store_->SchemaVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(*version, Migrations().back().version);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(Migrations().size()));
  for (const char* table : {"audit_event", "force_release", "epoch", "audit_cursor"}) {
    EXPECT_EQ(Scalar(absl::StrCat("SELECT COUNT(*) FROM ", table)), 0) << table;
  }
  const int64_t applied_at =
      Scalar("SELECT applied_at_unix_ms FROM schema_migrations WHERE version = 1");
  EXPECT_GT(applied_at, 0);

  std::vector<AuditEvent> batch = {Event(kClusterA, 10, "ns", "k", 1, EventType::kGrant)};
  ASSERT_TRUE(store_->Record(kClusterA, 10, batch, {}).ok());
  store_.reset();

  store_ = Open(location_);
  ASSERT_NE(store_, nullptr);
  version = store_->SchemaVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(Migrations().size()));
  EXPECT_EQ(Scalar("SELECT applied_at_unix_ms FROM schema_migrations WHERE version = 1"),
            applied_at);
  EXPECT_EQ(All(), batch);
  EXPECT_EQ(CursorOf(kClusterA), 10);
}

TEST_P(AuditStoreContract, RecordAndQueryRoundTripEveryField) {
  AuditEvent grant = Event(kClusterHigh, int64_t{1} << 40, "payments",
                           "jobs/nächtlich/日本/\x7f-end", 0x7fff'ffff'ffff'1234, EventType::kGrant,
                           "spiffe://holdfast.dev/ns/payments/sa/worker", 1'735'689'600'123);
  grant.token = kTokenNear2To62;
  grant.unprotected = true;
  AuditEvent release = grant;
  release.revision = grant.revision + 7;
  release.type = EventType::kRelease;
  release.token = kMaxToken;
  release.unprotected = false;
  release.time_unix_ms = grant.time_unix_ms + 5;
  AuditEvent expire =
      Event(kClusterHigh, grant.revision + 8, "default", "a", 1, EventType::kExpire);
  AuditEvent force = Event(kClusterHigh, grant.revision + 9, "default", "b", 2, EventType::kForce,
                           "spiffe://t/holder", 0);
  ForceReleaseRow row = Force(kClusterHigh, force.revision, "req-\u00e9-0001");
  row.ns = force.ns;
  row.lock_key = force.lock_key;
  row.session_id = force.session_id;
  row.token = kMaxToken - 1;
  row.class_was_fenced = false;
  row.reason = "it's \"stuck\"; see ticket #42 -- DROP TABLE epoch";
  const int64_t cursor = grant.revision + 100;

  std::vector<AuditEvent> batch = {force, release, grant, expire};
  ASSERT_TRUE(store_->Record(kClusterHigh, cursor, batch, {row}).ok());

  auto by_cluster = store_->Query(Q().cluster(kClusterHigh));
  ASSERT_TRUE(by_cluster.ok()) << by_cluster.status();
  EXPECT_EQ(*by_cluster, Sorted(batch));
  // The force event comes with its row's people and reason; the others with none.
  for (const AuditEvent& e : *by_cluster) {
    if (e.type != EventType::kForce) {
      EXPECT_EQ(e.force_request_id, "") << EventTypeName(e.type);
      EXPECT_EQ(e.force_requester, "");
      continue;
    }
    EXPECT_EQ(e.force_request_id, row.request_id);
    EXPECT_EQ(e.force_requester, row.requester);
    EXPECT_EQ(e.force_approver, row.approver);
    EXPECT_EQ(e.force_reason, row.reason);
    EXPECT_EQ(e.force_class_was_fenced, row.class_was_fenced);
  }
  EXPECT_EQ(All(), Sorted(batch));
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{row});
  EXPECT_EQ(CursorOf(kClusterHigh), cursor);
  // The cluster id is kept bit-for-bit in a signed column.
  EXPECT_EQ(Scalar("SELECT MIN(cluster_id) FROM audit_event"), static_cast<int64_t>(kClusterHigh));
  EXPECT_EQ(Scalar("SELECT cluster_id FROM audit_cursor"), static_cast<int64_t>(kClusterHigh));
}

TEST_P(AuditStoreContract, ReplayedBatchAddsNothing) {
  std::vector<AuditEvent> batch = {Event(kClusterA, 20, "ns", "a", 1, EventType::kGrant),
                                   Event(kClusterA, 21, "ns", "a", 1, EventType::kRelease),
                                   Event(kClusterA, 22, "ns", "f", 2, EventType::kForce)};
  std::vector<ForceReleaseRow> forces = {Force(kClusterA, 22, "req-1")};
  ASSERT_TRUE(store_->Record(kClusterA, 30, batch, forces).ok());
  ASSERT_TRUE(store_->Record(kClusterA, 30, batch, forces).ok());
  EXPECT_EQ(All(), Sorted(batch));
  EXPECT_EQ(Forces(), forces);
  EXPECT_EQ(CursorOf(kClusterA), 30);
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM audit_event"), 3);

  // Rows already present are left as they are, even when a replay differs.
  std::vector<AuditEvent> altered = batch;
  for (auto& e : altered) e.spiffe_id = "spiffe://t/someone-else";
  std::vector<ForceReleaseRow> altered_forces = forces;
  altered_forces[0].reason = "another reason";
  ASSERT_TRUE(store_->Record(kClusterA, 31, altered, altered_forces).ok());
  EXPECT_EQ(All(), Sorted(batch));
  EXPECT_EQ(Forces(), forces);
  EXPECT_EQ(CursorOf(kClusterA), 31);
}

TEST_P(AuditStoreContract, LowerCursorIsRefusedAndWritesNothing) {
  std::vector<AuditEvent> first = {Event(kClusterA, 40, "ns", "a", 1, EventType::kGrant),
                                   Event(kClusterA, 45, "ns", "f", 1, EventType::kForce)};
  std::vector<ForceReleaseRow> first_forces = {Force(kClusterA, 45, "req-a")};
  ASSERT_TRUE(store_->Record(kClusterA, 50, first, first_forces).ok());

  std::vector<AuditEvent> late = {Event(kClusterA, 46, "ns", "b", 2, EventType::kGrant),
                                  Event(kClusterA, 47, "ns", "g", 2, EventType::kForce)};
  absl::Status s = store_->Record(kClusterA, 49, late, {Force(kClusterA, 47, "req-b")});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(All(), Sorted(first));
  EXPECT_EQ(Forces(), first_forces);
  EXPECT_EQ(CursorOf(kClusterA), 50);

  // The same cursor again is not lower: accepted (an empty batch, or a replay).
  EXPECT_TRUE(store_->Record(kClusterA, 50, {}, {}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 50);
}

// Holds, on a connection of the test's own, what makes this store's calls wait:
// SQLite's write lock on the file (BEGIN IMMEDIATE), or PostgreSQL's ACCESS
// EXCLUSIVE lock on `tables` (what an operator's LOCK TABLE, VACUUM FULL or ALTER
// TABLE takes). Returns what lets it go.
std::function<void()> HoldLocks(Backend backend, const std::string& location,
                                const std::vector<std::string>& tables) {
  if (backend == Backend::kSqlite) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(location.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
    return [db] {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      sqlite3_close(db);
    };
  }
  PGconn* conn = PQconnectdb(location.c_str());
  EXPECT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  PQclear(PQexec(conn, "BEGIN"));
  for (const std::string& table : tables) {
    PGresult* r = PQexec(conn, absl::StrCat("LOCK TABLE ", table, " IN ACCESS EXCLUSIVE MODE").c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQerrorMessage(conn);
    PQclear(r);
  }
  return [conn] {
    PQclear(PQexec(conn, "ROLLBACK"));
    PQfinish(conn);
  };
}

// Another connection that holds the write lock (SQLite: the file's; PostgreSQL:
// the cursor table's) makes a record wait StoreOptions::lock_wait, then fail
// UNAVAILABLE with nothing written; once the lock is gone the same record goes in.
TEST_P(AuditStoreContract, ARecordBehindAnotherConnectionsLockGivesUpAndWritesNothing) {
  ASSERT_TRUE(store_->Record(kClusterA, 10, {Event(kClusterA, 5, "ns", "a", 1, EventType::kGrant)},
                             {})
                  .ok());
  auto waiting = OpenQuick();
  ASSERT_TRUE(waiting.ok()) << waiting.status();

  std::function<void()> release = HoldLocks(GetParam(), location_, {"audit_cursor"});
  const std::vector<AuditEvent> batch = {Event(kClusterA, 15, "ns", "b", 2, EventType::kGrant)};
  const auto started = std::chrono::steady_clock::now();
  absl::Status s = (*waiting)->Record(kClusterA, 20, batch, {});
  // 300 ms asked; the default is 10 s (SQLite) or no limit (PostgreSQL).
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()),
              GetParam() == Backend::kSqlite ? testing::HasSubstr("database is locked")
                                             : testing::HasSubstr("lock timeout"));
  release();
  EXPECT_EQ(CursorOf(kClusterA), 10);
  EXPECT_EQ(All().size(), 1u);
  EXPECT_TRUE((*waiting)->Record(kClusterA, 20, batch, {}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 20);
  EXPECT_EQ(All().size(), 2u);
}

// Every call, reads included, waits for another connection's lock at most
// StoreOptions::lock_wait. A read blocked without a bound would hold the store's
// connection (and every call queued on it) until an operator's lock goes. With
// every table locked: PostgreSQL fails each call UNAVAILABLE; SQLite's reads go on
// (WAL: a writer never blocks them) and its writes fail. Nothing changes.
TEST_P(AuditStoreContract, EveryCallBehindAnotherConnectionsLockAnswersWithinTheBound) {
  const AuditEvent grant = Event(kClusterA, 5, "ns", "a", 1, EventType::kGrant);
  ASSERT_TRUE(store_->Record(kClusterA, 10, {grant}, {Force(kClusterA, 8, "req-1")}).ok());
  const EpochRow init{1, kClusterA, 1'700'000'000'000, "init", "holdfastd"};
  ASSERT_TRUE(store_->AppendEpoch(init).ok());
  auto waiting = OpenQuick();
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  AuditStore& w = **waiting;

  std::function<void()> release =
      HoldLocks(GetParam(), location_,
                {"audit_event", "audit_cursor", "force_release", "epoch", "schema_migrations"});
  const bool sqlite = GetParam() == Backend::kSqlite;
  auto expect_bounded = [&](const char* call, bool is_read, auto&& run) {
    const auto started = std::chrono::steady_clock::now();
    absl::Status s = run();
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5)) << call;
    if (sqlite && is_read) {
      EXPECT_TRUE(s.ok()) << call << ": " << s;
      return;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << call << ": " << s;
    EXPECT_THAT(std::string(s.message()), sqlite ? testing::HasSubstr("database is locked")
                                                 : testing::HasSubstr("lock timeout"))
        << call;
  };
  expect_bounded("Cursor", true, [&] { return w.Cursor(kClusterA).status(); });
  expect_bounded("Query", true, [&] { return w.Query(Q().limit(100)).status(); });
  expect_bounded("ForceReleases", true, [&] { return w.ForceReleases(100).status(); });
  expect_bounded("Epochs", true, [&] { return w.Epochs().status(); });
  expect_bounded("MaxEpoch", true, [&] { return w.MaxEpoch().status(); });
  expect_bounded("SchemaVersion", true, [&] { return w.SchemaVersion().status(); });
  expect_bounded("Record", false, [&] {
    return w.Record(kClusterA, 20, {Event(kClusterA, 15, "ns", "b", 2, EventType::kGrant)}, {});
  });
  expect_bounded("RewindCursor", false, [&] { return w.RewindCursor(kClusterA, 3); });
  expect_bounded("AppendEpoch", false, [&] {
    return w.AppendEpoch({2, kClusterA, 1'700'000'100'000, "restore", "spiffe://t/admin"});
  });
  expect_bounded("Prune", false, [&] { return w.Prune(1'800'000'000'000, 100).status(); });
  release();

  EXPECT_EQ(CursorOf(kClusterA), 10);
  EXPECT_EQ(All(), std::vector<AuditEvent>{grant});
  EXPECT_EQ(Forces().size(), 1u);
  auto epochs = store_->Epochs();
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  EXPECT_EQ(*epochs, std::vector<EpochRow>{init});
}

// `n` events straight into the database (the store's Record is one statement a
// row), revisions first..first+n-1 over two clusters.
void BulkInsert(Backend backend, const std::string& location, int64_t first, int64_t n) {
  const std::string last = absl::StrCat(first + n - 1);
  const std::string values =
      "i % 2 + 1, i, 'ns', 'key-' || i, i, 'grant', 'spiffe://t/x', i, ";
  if (backend == Backend::kPostgres) {
    auto inserted = PostgresScalar(
        location, absl::StrCat("WITH ins AS (INSERT INTO audit_event SELECT ", values,
                               "false, 1000 FROM generate_series(", first, ", ", last,
                               ") i RETURNING 1) SELECT count(*) FROM ins"));
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    ASSERT_EQ(*inserted, n);
    return;
  }
  sqlite3* db = nullptr;
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(nullptr, sqlite3_close);
  ASSERT_EQ(sqlite3_open_v2(location.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  closer.reset(db);
  sqlite3_busy_timeout(db, 10'000);
  const std::string sql = absl::StrCat(
      "WITH RECURSIVE s(i) AS (SELECT ", first, " UNION ALL SELECT i + 1 FROM s WHERE i < ", last,
      ") INSERT INTO audit_event SELECT ", values, "0, 1000 FROM s");
  char* error = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK) << error;
}

// A query ends at its deadline: DEADLINE_EXCEEDED, no rows, and the store goes
// on. Left running, it would hold the store's connection after its caller gave
// up: PostgreSQL cancels it (statement_timeout), SQLite interrupts it.
TEST_P(AuditStoreContract, AQueryEndsAtItsDeadlineAndTheStoreGoesOn) {
  const std::string out_of_time =
      absl::StrCat(GetParam() == Backend::kSqlite ? "sqlite" : "postgres",
                   " audit store: the query did not finish before its deadline (a read of one "
                   "cluster, or narrower filters, reads less)");
  ASSERT_TRUE(store_->Record(kClusterA, 10, {Event(kClusterA, 5, "ns", "a", 1, EventType::kGrant)},
                             {})
                  .ok());
  // A deadline already passed: not read at all.
  auto r = store_->Query(Q().limit(10).deadline(std::chrono::steady_clock::now()));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_EQ(r.status().message(), out_of_time);
  // A read across clusters scans and sorts the whole trail. With 20 ms to do it,
  // it ends part way once the trail is large enough: grown (doubling) until it
  // is, so that neither a fast machine nor a slow one decides the outcome.
  int64_t events = 1;
  absl::Status timed_out;
  for (int64_t more = 100'000; more <= 3'200'000 && timed_out.ok(); more *= 2) {
    ASSERT_NO_FATAL_FAILURE(BulkInsert(GetParam(), location_, 1000 + events, more));
    events += more;
    timed_out = store_->Query(Q().limit(10).deadline(std::chrono::steady_clock::now() +
                                                     std::chrono::milliseconds(20)))
                    .status();
  }
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_EQ(timed_out.message(), out_of_time);
  // The bound is the query's alone: a short read that ends in time commits with
  // its bound, and the whole read after it, without one, still answers.
  auto one = store_->Query(Q().cluster(kClusterA).limit(10).deadline(
      std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), 1u);
  auto unbounded = store_->Query(Q().limit(10));
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  ASSERT_EQ(unbounded->size(), 10u);
  EXPECT_EQ((*unbounded)[0].revision, 5);
  auto all = store_->Query(Q().limit(10).deadline(std::chrono::steady_clock::now() +
                                                  std::chrono::minutes(5)));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*unbounded, *all);
  EXPECT_EQ(Scalar("SELECT count(*) FROM audit_event"), events);
  EXPECT_EQ(CursorOf(kClusterA), 10);
}

// A lock wait of zero is no bound to PostgreSQL and no wait to SQLite: refused
// before anything is opened or created.
TEST_P(AuditStoreContract, ALockWaitOutsideItsRangeIsRefusedBeforeOpening) {
  for (auto wait : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5),
                    std::chrono::milliseconds(3'600'001)}) {
    StoreOptions bad;
    bad.lock_wait = wait;
    std::optional<std::string> location = FreshLocation();
    ASSERT_TRUE(location.has_value());
    auto store = GetParam() == Backend::kSqlite ? OpenSqliteStore(*location, bad)
                                                : OpenPostgresStore(*location, bad);
    ASSERT_FALSE(store.ok()) << wait.count();
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(store.status().message()),
                testing::HasSubstr(absl::StrCat("audit store: lock_wait must be between 1ms and "
                                                "3600000ms, not ",
                                                wait.count(), "ms")));
    if (GetParam() == Backend::kSqlite) {
      EXPECT_FALSE(std::filesystem::exists(*location)) << "nothing is created";
    } else {
      // The database was not migrated: no schema_migrations table.
      auto tables = PostgresScalar(*location,
                             "SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'");
      ASSERT_TRUE(tables.ok()) << tables.status();
      EXPECT_EQ(*tables, 0);
    }
  }
}

TEST_P(AuditStoreContract, RewindMovesOnlyThatClusterBackAndKeepsRows) {
  std::vector<AuditEvent> rows = {Event(kClusterA, 40, "ns", "a", 1, EventType::kGrant)};
  ASSERT_TRUE(store_->Record(kClusterA, 50, rows, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterHigh, 70, {}, {}).ok());
  ASSERT_TRUE(store_->RewindCursor(kClusterA, 30).ok());
  EXPECT_EQ(CursorOf(kClusterA), 30);
  EXPECT_EQ(CursorOf(kClusterHigh), 70);
  EXPECT_EQ(All(), Sorted(rows));
  // Never forward, and a cluster without a cursor stays without.
  ASSERT_TRUE(store_->RewindCursor(kClusterA, 35).ok());
  EXPECT_EQ(CursorOf(kClusterA), 30);
  ASSERT_TRUE(store_->RewindCursor(0x1234, 5).ok());
  EXPECT_EQ(CursorOf(0x1234), std::nullopt);
  // Recording goes on from the rewound cursor.
  EXPECT_TRUE(store_->Record(kClusterA, 31, {}, {}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 31);
}

TEST_P(AuditStoreContract, CursorsArePerClusterAndMoveWithEmptyBatches) {
  EXPECT_EQ(CursorOf(kClusterA), std::nullopt);
  EXPECT_EQ(CursorOf(kClusterHigh), std::nullopt);
  ASSERT_TRUE(store_->Record(kClusterA, 100, {}, {}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 100);
  EXPECT_EQ(CursorOf(kClusterHigh), std::nullopt);
  // Another cluster's cursor is its own: a lower number is fine there.
  ASSERT_TRUE(store_->Record(kClusterHigh, 5, {}, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterA, 120, {}, {}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 120);
  EXPECT_EQ(CursorOf(kClusterHigh), 5);
}

TEST_P(AuditStoreContract, ClustersListsEveryAuditedClusterInIdOrder) {
  auto none = store_->Clusters();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  ASSERT_TRUE(store_->Record(kClusterHigh, 5, {}, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterA, 100, {}, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterA, 120, {}, {}).ok());
  auto both = store_->Clusters();
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(*both, (std::vector<uint64_t>{kClusterA, kClusterHigh}));
}

TEST_P(AuditStoreContract, PagingByTheLastEventVisitsEveryEventOnce) {
  // Revision 300 holds more events than a page (one lease's expiry ending many
  // holds); a reader paging by revision alone would skip the rest of it.
  std::vector<AuditEvent> of_a, of_high, all;
  for (int i = 0; i < 11; ++i) {
    of_a.push_back(Event(kClusterA, 300, "ns", "k" + std::to_string(i), 9, EventType::kExpire));
  }
  for (int i = 0; i < 4; ++i) {
    of_a.push_back(Event(kClusterA, 301 + i, "ns", "k", 10 + i, EventType::kGrant));
    of_high.push_back(
        Event(kClusterHigh, 300, "ns", "k" + std::to_string(i), 9, EventType::kExpire));
  }
  ASSERT_TRUE(store_->Record(kClusterA, 400, of_a, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterHigh, 400, of_high, {}).ok());
  all = of_a;
  all.insert(all.end(), of_high.begin(), of_high.end());

  for (std::optional<uint64_t> cluster : {std::optional<uint64_t>{}, std::optional(kClusterA)}) {
    std::vector<AuditEvent> seen;
    AuditQuery q = Q().limit(3);
    q.cluster_id = cluster;
    for (int page = 0; page < 100; ++page) {
      auto got = store_->Query(q);
      ASSERT_TRUE(got.ok()) << got.status();
      if (got->empty()) break;
      EXPECT_LE(got->size(), 3u);
      seen.insert(seen.end(), got->begin(), got->end());
      q.after_event = KeyOf(got->back());
    }
    EXPECT_EQ(seen, Sorted(cluster ? of_a : all)) << (cluster ? "cluster A" : "every cluster");
  }
}

TEST_P(AuditStoreContract, BatchIsAtomic) {
  std::vector<AuditEvent> first = {Event(kClusterA, 10, "ns", "a", 1, EventType::kGrant)};
  ASSERT_TRUE(store_->Record(kClusterA, 10, first, {}).ok());

  // The force row breaks approver <> requester; it is written after the events,
  // so only a rollback keeps them out.
  ForceReleaseRow self_approved = Force(kClusterA, 12, "req-self");
  self_approved.approver = self_approved.requester;
  std::vector<AuditEvent> bad = {Event(kClusterA, 11, "ns", "b", 2, EventType::kGrant),
                                 Event(kClusterA, 12, "ns", "a", 1, EventType::kForce)};
  absl::Status s =
      store_->Record(kClusterA, 20, bad, {Force(kClusterA, 12, "req-ok"), self_approved});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(All(), first);
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{});
  EXPECT_EQ(CursorOf(kClusterA), 10);

  // A cluster's first batch too: no cursor appears.
  self_approved.cluster_id = kClusterHigh;
  s = store_->Record(kClusterHigh, 5, {Event(kClusterHigh, 4, "ns", "c", 3, EventType::kForce)},
                     {self_approved});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(CursorOf(kClusterHigh), std::nullopt);
  EXPECT_EQ(All(), first);

  // The store is still usable afterwards.
  EXPECT_TRUE(store_->Record(kClusterA, 20, bad, {Force(kClusterA, 12, "req-ok")}).ok());
  EXPECT_EQ(CursorOf(kClusterA), 20);
  EXPECT_EQ(All().size(), 3u);
}

TEST_P(AuditStoreContract, RowsOfAnotherClusterAreRefused) {
  absl::Status s =
      store_->Record(kClusterA, 10, {Event(kClusterHigh, 9, "ns", "a", 1, EventType::kGrant)}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = store_->Record(kClusterA, 10, {}, {Force(kClusterHigh, 9, "req")});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(All(), std::vector<AuditEvent>{});
  EXPECT_EQ(CursorOf(kClusterA), std::nullopt);
}

TEST_P(AuditStoreContract, EveryQueryFilterAndTheLimit) {
  const std::vector<std::string> namespaces = {"payments", "default"};
  const std::vector<std::string> keys = {"db/a", "db/B", "jobs/x"};
  const std::vector<EventType> types = {EventType::kGrant, EventType::kRelease, EventType::kExpire,
                                        EventType::kForce};
  const std::vector<std::string> identities = {"spiffe://t/alice", "spiffe://t/bob"};
  std::vector<AuditEvent> all, of_a, of_high;
  for (int i = 0; i < 40; ++i) {
    uint64_t cluster = i % 5 == 0 ? kClusterHigh : kClusterA;
    // Two events per revision; their namespaces differ, so their primary keys do.
    AuditEvent e = Event(cluster, 100 + i / 2, namespaces[i % 2], keys[i % 3], 1000 + i % 4,
                         types[i % 4], identities[(i / 3) % 2], 1'700'000'000'000 + i * 1000);
    all.push_back(e);
    (cluster == kClusterA ? of_a : of_high).push_back(e);
  }
  ASSERT_TRUE(store_->Record(kClusterA, 200, of_a, {}).ok());
  ASSERT_TRUE(store_->Record(kClusterHigh, 200, of_high, {}).ok());

  struct Case {
    std::string name;
    AuditQuery q;
    bool narrows = true;  // the filter must leave out some rows (else it tests nothing)
  };
  std::vector<Case> cases = {
      {"default", {}, false},
      {"cluster A", Q().cluster(kClusterA)},
      {"cluster >= 2^63", Q().cluster(kClusterHigh)},
      {"namespace", Q().ns("payments")},
      {"namespace and key", Q().ns("default").key("db/a")},
      {"key", Q().key("db/B")},
      {"type grant", Q().type(EventType::kGrant)},
      {"type release", Q().type(EventType::kRelease)},
      {"type expire", Q().type(EventType::kExpire)},
      {"type force", Q().type(EventType::kForce)},
      {"identity", Q().spiffe("spiffe://t/bob")},
      {"since", Q().since(all[25].time_unix_ms)},
      {"after revision", Q().after(all[17].revision)},
      {"after an event", Q().after_event(Sorted(all)[17])},
      {"after an event of the high cluster", Q().after_event(Sorted(all)[2])},
      {"limit", Q().limit(3)},
      {"limit 0 means 1", Q().limit(0)},
      {"negative limit means 1", Q().limit(-7)},
      {"limit above 10000", Q().limit(20000), false},
      {"everything at once", Q().cluster(kClusterA)
                                 .ns("payments")
                                 .type(EventType::kGrant)
                                 .spiffe("spiffe://t/alice")
                                 .since(all[3].time_unix_ms)
                                 .after(all[3].revision)},
      {"after an event, with filters", Q().cluster(kClusterA)
                                           .ns("default")
                                           .after_event(Sorted(all)[9])
                                           .limit(4)},
  };
  for (const Case& c : cases) {
    std::vector<AuditEvent> expected = Reference(all, c.q);
    ASSERT_FALSE(expected.empty()) << c.name;
    if (c.narrows) {
      EXPECT_LT(expected.size(), all.size()) << c.name;
    } else {
      EXPECT_EQ(expected.size(), all.size()) << c.name;
    }
    auto got = store_->Query(c.q);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(*got, expected) << c.name;
  }
  // Filters that match nothing.
  for (const AuditQuery& q :
       std::vector<AuditQuery>{Q().ns("nope"), Q().key("nope"), Q().spiffe("spiffe://t/nobody"),
                               Q().cluster(42), Q().after(all.back().revision),
                               Q().after_event(Sorted(all).back())}) {
    auto got = store_->Query(q);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->empty());
  }
}

TEST_P(AuditStoreContract, QueryOrdersByRevisionNamespaceKeySession) {
  // Keys whose byte order differs from a dictionary's: "B" < "a", "a/b" < "a~",
  // and a non-ASCII key after every ASCII one.
  std::vector<AuditEvent> events = {
      Event(kClusterA, 7, "ns", "a", 2, EventType::kGrant),
      Event(kClusterA, 7, "ns", "a", 1, EventType::kGrant),
      Event(kClusterA, 7, "ns", "B", 9, EventType::kGrant),
      Event(kClusterA, 7, "ns", "\u00e9t\u00e9", 1, EventType::kGrant),
      Event(kClusterA, 7, "ns", "a~", 1, EventType::kGrant),
      Event(kClusterA, 7, "ns", "a/b", 1, EventType::kGrant),
      Event(kClusterA, 7, "Ns", "z", 1, EventType::kGrant),
      Event(kClusterA, 3, "zz", "z", 1, EventType::kGrant),
      Event(kClusterA, 12, "aa", "a", 1, EventType::kRelease),
  };
  ASSERT_TRUE(store_->Record(kClusterA, 20, events, {}).ok());
  std::vector<AuditEvent> got = All();
  ASSERT_EQ(got.size(), events.size());
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_LT(OrderKey(got[i - 1]), OrderKey(got[i])) << "at " << i;
  }
  EXPECT_EQ(got, Sorted(events));
}

TEST_P(AuditStoreContract, EventsSharingARevisionAreAllStored) {
  // One lease expiry ends every hold on the lease, in one revision.
  std::vector<AuditEvent> expiry = {Event(kClusterA, 500, "ns", "a", 77, EventType::kExpire),
                                    Event(kClusterA, 500, "ns", "a/b", 77, EventType::kExpire),
                                    Event(kClusterA, 500, "other", "a", 77, EventType::kExpire)};
  // Shared holds of one key: same revision, different sessions.
  std::vector<AuditEvent> shared = {Event(kClusterA, 600, "ns", "s", 1, EventType::kGrant),
                                    Event(kClusterA, 600, "ns", "s", 2, EventType::kGrant),
                                    Event(kClusterA, 600, "ns", "s", 3, EventType::kGrant)};
  std::vector<AuditEvent> batch = expiry;
  batch.insert(batch.end(), shared.begin(), shared.end());
  ASSERT_TRUE(store_->Record(kClusterA, 600, batch, {}).ok());
  EXPECT_EQ(All(), Sorted(batch));
  auto by_key = store_->Query(Q().ns("ns").key("s"));
  ASSERT_TRUE(by_key.ok()) << by_key.status();
  EXPECT_EQ(*by_key, Sorted(shared));
  auto expired = store_->Query(Q().type(EventType::kExpire));
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, Sorted(expiry));
}

TEST_P(AuditStoreContract, EpochHistory) {
  auto max = store_->MaxEpoch();
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(*max, 0);
  auto epochs = store_->Epochs();
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  EXPECT_TRUE(epochs->empty());

  std::vector<EpochRow> rows = {
      {2, kClusterA, 1'700'000'200'000, "restore", "spiffe://t/admin"},
      {1, kClusterA, 1'700'000'000'000, "init", "holdfastd"},
      {3, kClusterHigh, 1'700'000'300'000, "rehome", "spiffe://t/admin"},
      {2, kClusterHigh, 1'700'000'250'000, "restore", "spiffe://t/admin"},
      {32767, kClusterA, 1'700'000'400'000, "restore", "spiffe://t/admin"},
  };
  int32_t highest = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_TRUE(store_->AppendEpoch(rows[i]).ok()) << i;
    highest = std::max(highest, rows[i].epoch);
    max = store_->MaxEpoch();
    ASSERT_TRUE(max.ok()) << max.status();
    EXPECT_EQ(*max, highest);
  }
  auto expect_history = [&] {
    auto got = store_->Epochs();
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 1; i < got->size(); ++i) {
      EXPECT_LE((*got)[i - 1].epoch, (*got)[i].epoch) << "not in epoch order at " << i;
    }
    std::vector<EpochRow> a = *got, b = rows;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
  };
  expect_history();

  // The same (epoch, cluster) with other content is refused.
  EpochRow clash = rows[0];
  clash.actor = "spiffe://t/intruder";
  absl::Status s = store_->AppendEpoch(clash);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  clash = rows[0];
  clash.advanced_at_unix_ms += 1;
  EXPECT_EQ(store_->AppendEpoch(clash).code(), absl::StatusCode::kAlreadyExists);
  // The identical row again is a retry of a write that may have succeeded: fine.
  EXPECT_TRUE(store_->AppendEpoch(rows[0]).ok());
  // Out of range or an unknown reason.
  for (EpochRow bad :
       {EpochRow{0, kClusterA, 1, "init", "x"}, EpochRow{32768, kClusterA, 1, "init", "x"},
        EpochRow{9, kClusterA, 1, "whim", "x"}}) {
    EXPECT_EQ(store_->AppendEpoch(bad).code(), absl::StatusCode::kInvalidArgument) << bad.epoch;
  }
  expect_history();
  max = store_->MaxEpoch();
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(*max, highest);
}

TEST_P(AuditStoreContract, ForceReleasesNewestFirstUpToTheLimit) {
  EXPECT_TRUE(Forces().empty());
  std::vector<ForceReleaseRow> rows;
  for (int i = 0; i < 4; ++i) {
    int64_t revision = 300 + 10 * i;
    ForceReleaseRow row = Force(kClusterA, revision, absl::StrCat("req-", i),
                                1'700'000'000'000 + 1000 * ((i * 3) % 4));
    AuditEvent force =
        Event(kClusterA, revision, row.ns, row.lock_key, row.session_id, EventType::kForce);
    ASSERT_TRUE(store_->Record(kClusterA, revision, {force}, {row}).ok());
    rows.push_back(row);
  }
  std::vector<ForceReleaseRow> newest_first = rows;
  std::sort(newest_first.begin(), newest_first.end(),
            [](const ForceReleaseRow& a, const ForceReleaseRow& b) {
              return a.approved_at_unix_ms > b.approved_at_unix_ms;
            });
  EXPECT_EQ(Forces(), newest_first);
  auto two = store_->ForceReleases(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, std::vector<ForceReleaseRow>(newest_first.begin(), newest_first.begin() + 2));
  auto clamped = store_->ForceReleases(0);
  ASSERT_TRUE(clamped.ok()) << clamped.status();
  EXPECT_EQ(clamped->size(), 1u);

  // Each row joins its `force` event by (cluster, revision).
  auto events = store_->Query(Q().type(EventType::kForce));
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), rows.size());
  for (const ForceReleaseRow& row : rows) {
    EXPECT_EQ(std::count_if(events->begin(), events->end(),
                            [&](const AuditEvent& e) {
                              return e.cluster_id == row.cluster_id && e.revision == row.revision;
                            }),
              1)
        << row.request_id;
  }
}

// Retention (AuditStore::Prune): events older than the cutoff go, oldest first and
// at most max_events per call, with the force_release rows approved before it;
// younger events, epochs and every cluster's cursor stay, and so does the trail of
// a hold that may still be live: a grant without a recorded end, and an end whose
// grant is still there (its grant's server clock was behind the end's).
TEST_P(AuditStoreContract, PruneDeletesEndedHoldsOldestFirstAndKeepsLiveOnesEpochsAndCursors) {
  constexpr int64_t kBase = 1'700'000'000'000;
  auto at = [](AuditEvent e, int64_t time_ms) {
    e.time_unix_ms = time_ms;
    return e;
  };
  // Four holds of cluster A, each a grant and its release; the first three older
  // than the cutoff.
  std::vector<AuditEvent> grants, releases;
  for (int j = 0; j < 4; ++j) {
    const std::string key = absl::StrCat("k", j);
    grants.push_back(at(Event(kClusterA, 10 + 2 * j, "payments", key, 500 + j, EventType::kGrant),
                        kBase + 2000 * j));
    releases.push_back(at(Event(kClusterA, 11 + 2 * j, "payments", key, 500 + j,
                                EventType::kRelease),
                          kBase + 2000 * j + 500));
  }
  // Old and never ended: the hold may be live.
  AuditEvent live = at(Event(kClusterA, 30, "payments", "live", 600, EventType::kGrant), kBase - 2000);
  // The release's server clock was behind the grant's: old release, young grant.
  AuditEvent skew_grant =
      at(Event(kClusterA, 40, "payments", "skew", 700, EventType::kGrant), kBase + 9000);
  AuditEvent skew_release =
      at(Event(kClusterA, 41, "payments", "skew", 700, EventType::kRelease), kBase + 4900);
  // Another cluster's expiry whose grant is not in the store: the oldest row.
  AuditEvent other = Event(kClusterHigh, 3, "payments", "kx", 900, EventType::kExpire,
                           "spiffe://t/bob", kBase - 1000);
  std::vector<AuditEvent> a = {grants[0], releases[0], grants[1], releases[1],
                               grants[2], releases[2], grants[3], releases[3],
                               live,      skew_grant,  skew_release};
  ForceReleaseRow old_force = Force(kClusterA, 12, "req-old", kBase + 1500);
  ForceReleaseRow new_force = Force(kClusterA, 18, "req-new", kBase + 8500);
  ASSERT_TRUE(store_->Record(kClusterA, 41, a, {old_force, new_force}).ok());
  ASSERT_TRUE(store_->Record(kClusterHigh, 7, {other}, {}).ok());
  const EpochRow epoch{1, kClusterA, kBase - 50'000, "init", "holdfastd"};  // older than all
  ASSERT_TRUE(store_->AppendEpoch(epoch).ok());

  const int64_t cutoff = kBase + 5000;
  auto prune = [&](int64_t expect_events, int64_t expect_forces) {
    auto p = store_->Prune(cutoff, 3);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->events, expect_events);
    EXPECT_EQ(p->force_releases, expect_forces);
  };
  auto left = [&](std::vector<AuditEvent> rows) {
    EXPECT_EQ(All(), Reference(std::move(rows), Q().limit(10000).q));
  };
  // Oldest first, what may go: `other` (an end with no grant), g0, g1 (each has its
  // release). A full call: ask again. The releases wait for their grants to be gone.
  prune(3, 1);
  left({releases[0], releases[1], grants[2], releases[2], grants[3], releases[3], live,
        skew_grant, skew_release});
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{new_force});
  prune(3, 0);  // r0, r1 (their grants are gone), g2
  left({releases[2], grants[3], releases[3], live, skew_grant, skew_release});
  prune(1, 0);  // r2; fewer than asked: nothing prunable is left
  prune(0, 0);
  const std::vector<AuditEvent> kept = {grants[3], releases[3], live, skew_grant, skew_release};
  left(kept);

  // What is not an event stays.
  auto epochs = store_->Epochs();
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  EXPECT_EQ(*epochs, std::vector<EpochRow>{epoch});
  EXPECT_EQ(CursorOf(kClusterA), 41);
  EXPECT_EQ(CursorOf(kClusterHigh), 7);
  // The live hold ends: its grant and release go once they are old enough.
  AuditEvent live_end =
      at(Event(kClusterA, 50, "payments", "live", 600, EventType::kExpire), kBase + 3000);
  ASSERT_TRUE(store_->Record(kClusterA, 50, {live_end}, {}).ok());
  prune(2, 0);
  left({grants[3], releases[3], skew_grant, skew_release});
}

// A force_release row goes with its force event, not before: an old force whose
// grant is still young keeps its event (an end waits for its grant), and so its
// row, with the requester, approver and reason the event alone does not carry.
TEST_P(AuditStoreContract, PruneKeepsAForceReleaseRowWhileItsEventIsKept) {
  constexpr int64_t kBase = 1'700'000'000'000;
  ForceReleaseRow row = Force(kClusterA, 12, "req-kept", kBase + 1000);
  AuditEvent grant = Event(kClusterA, 9, row.ns, row.lock_key, row.session_id, EventType::kGrant,
                           "spiffe://t/alice", kBase + 9000);  // its server's clock was ahead
  AuditEvent forced = Event(kClusterA, 12, row.ns, row.lock_key, row.session_id,
                            EventType::kForce, "spiffe://t/alice", kBase + 1000);
  ASSERT_TRUE(store_->Record(kClusterA, 12, {grant, forced}, {row}).ok());
  auto p = store_->Prune(kBase + 5000, 100);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->events, 0);
  EXPECT_EQ(p->force_releases, 0);
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{row});
  // Once both are old, the event goes, and the row with it.
  p = store_->Prune(kBase + 10'000, 100);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->events, 2);
  EXPECT_EQ(p->force_releases, 1);
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{});
}

TEST_P(AuditStoreContract, PruneRefusesABadCutoffOrBatchAndDeletesNothing) {
  AuditEvent e = Event(kClusterA, 10, "payments", "k", 500, EventType::kGrant, "spiffe://t/alice",
                       1'000);
  ForceReleaseRow f = Force(kClusterA, 10, "req-1", 2'000);
  ASSERT_TRUE(store_->Record(kClusterA, 10, {e}, {f}).ok());
  struct Case {
    int64_t before;
    int max_events;
    const char* message;
  };
  for (const Case& c : {Case{0, 10, "prune: the cutoff must be a positive unix time in ms, not 0"},
                        Case{-5, 10, "prune: the cutoff must be a positive unix time in ms, not -5"},
                        Case{1'700'000'000'000, 0, "prune: max_events 0 is outside 1..100000"},
                        Case{1'700'000'000'000, 100'001,
                             "prune: max_events 100001 is outside 1..100000"}}) {
    auto r = store_->Prune(c.before, c.max_events);
    ASSERT_FALSE(r.ok()) << c.before << " " << c.max_events;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message);
  }
  EXPECT_EQ(All(), std::vector<AuditEvent>{e});
  EXPECT_EQ(Forces(), std::vector<ForceReleaseRow>{f});
  // A cutoff at an event's own time keeps it: only what is strictly older goes.
  auto none = store_->Prune(1'000, 10);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->events, 0);
  EXPECT_EQ(All(), std::vector<AuditEvent>{e});
}

TEST_P(AuditStoreContract, TwoStoresOnOneDatabaseAreBothUsable) {
  std::unique_ptr<AuditStore> other = Open(location_);
  ASSERT_NE(other, nullptr);
  std::vector<AuditEvent> first = {Event(kClusterA, 10, "ns", "a", 1, EventType::kGrant)};
  std::vector<AuditEvent> second = {Event(kClusterA, 20, "ns", "a", 1, EventType::kRelease)};
  ASSERT_TRUE(store_->Record(kClusterA, 10, first, {}).ok());
  EXPECT_EQ(All(*other), first);
  EXPECT_EQ(CursorOf(kClusterA, other.get()), 10);
  ASSERT_TRUE(other->Record(kClusterA, 20, second, {}).ok());
  std::vector<AuditEvent> both = first;
  both.insert(both.end(), second.begin(), second.end());
  EXPECT_EQ(All(), Sorted(both));
  EXPECT_EQ(CursorOf(kClusterA), 20);
  // The cursor another replica moved is the one that counts.
  EXPECT_EQ(store_->Record(kClusterA, 15, {}, {}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(other->AppendEpoch({1, kClusterA, 1, "init", "holdfastd"}).ok());
  auto max = store_->MaxEpoch();
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(*max, 1);
}

TEST_P(AuditStoreContract, ConcurrentOpensOfAFreshDatabaseMigrateOnce) {
  std::optional<std::string> fresh = FreshLocation();
  ASSERT_TRUE(fresh.has_value()) << SharedPostgres::error();
  constexpr int kReplicas = 4;
  std::vector<std::unique_ptr<AuditStore>> stores(kReplicas);
  std::vector<std::thread> threads;
  for (int i = 0; i < kReplicas; ++i) {
    threads.emplace_back([&, i] { stores[i] = Open(*fresh, GetParam()); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kReplicas; ++i) {
    ASSERT_NE(stores[i], nullptr) << i;
    auto version = stores[i]->SchemaVersion();
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, 1);
  }
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM schema_migrations", *fresh),
            static_cast<int64_t>(Migrations().size()));
}

TEST_P(AuditStoreContract, ConcurrentRecordsNeverMoveTheCursorBack) {
  std::unique_ptr<AuditStore> other = Open(location_);
  ASSERT_NE(other, nullptr);
  for (int round = 1; round <= 10; ++round) {
    const uint64_t cluster = kClusterHigh - round;  // a fresh cluster: no cursor row yet
    const int64_t low = 10 * round, high = 10 * round + 5;
    AuditEvent low_event = Event(cluster, low, "ns", "low", 1, EventType::kGrant);
    AuditEvent high_event = Event(cluster, high, "ns", "high", 2, EventType::kGrant);
    absl::Status low_status, high_status;
    std::thread a([&] { low_status = store_->Record(cluster, low, {low_event}, {}); });
    std::thread b([&] { high_status = other->Record(cluster, high, {high_event}, {}); });
    a.join();
    b.join();
    EXPECT_TRUE(high_status.ok()) << high_status;
    EXPECT_EQ(CursorOf(cluster), high);
    auto got = store_->Query(Q().cluster(cluster));
    ASSERT_TRUE(got.ok()) << got.status();
    // The lower batch either went first, or was refused and left no trace.
    if (low_status.ok()) {
      EXPECT_EQ(*got, Sorted({low_event, high_event}));
    } else {
      EXPECT_EQ(low_status.code(), absl::StatusCode::kFailedPrecondition) << low_status;
      EXPECT_EQ(*got, std::vector<AuditEvent>{high_event});
    }
  }
}

// ---------------------------------------------------------------------------------
// Opening by URL (no server needed).

class AuditStoreUrl : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "audit_store_url.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(AuditStoreUrl, RejectsUnknownAndMalformedUrls) {
  for (const std::string url :
       {"", "sqlite:", "sqlite://", "sqlite://relative.db", "mysql://u@h/db", "audit.db",
        "/abs/audit.db", "postgresq://u:secret@h/db", "host=h password=secret", "file:secret.db"}) {
    auto store = OpenStore(url);
    ASSERT_FALSE(store.ok()) << url;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_NE(store.status().message().find("sqlite:"), std::string::npos)
        << "the message should say what is accepted: " << store.status();
    EXPECT_EQ(store.status().message().find("secret"), std::string::npos)
        << "the message must not echo credentials: " << store.status();
  }
  auto mysql = OpenStore("mysql://u@h/db");
  EXPECT_NE(mysql.status().message().find("\"mysql\""), std::string::npos) << mysql.status();
}

TEST_F(AuditStoreUrl, RefusesAnInMemorySqliteDatabase) {
  const auto before = std::filesystem::current_path();
  auto store = OpenStore("sqlite::memory:");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("in-memory SQLite database would lose the audit trail"),
            std::string::npos)
      << store.status();
  EXPECT_NE(store.status().message().find("name a file"), std::string::npos) << store.status();
  EXPECT_FALSE(std::filesystem::exists(before / ":memory:")) << "nothing is created";
}

// However an in-memory database is asked for (SQLite takes "file:" URIs here),
// it has no file name, and is refused.
TEST_F(AuditStoreUrl, RefusesAnInMemorySqliteDatabaseHoweverNamed) {
  const auto cwd = std::filesystem::current_path();
  auto entries = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(cwd)) names.insert(e.path().string());
    return names;
  };
  const std::set<std::string> before = entries();
  for (const std::string url : {"sqlite:file::memory:", "sqlite:file:audit.db?mode=memory",
                                "sqlite:file:x?mode=memory&cache=shared"}) {
    auto store = OpenStore(url);
    ASSERT_FALSE(store.ok()) << url;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(std::string(store.status().message()),
                testing::HasSubstr("opens an in-memory database, which would lose the audit "
                                   "trail when holdfastd stops; name a file"))
        << url;
  }
  auto direct = OpenSqliteStore(":memory:");
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(entries(), before) << "nothing is created in the working directory";
}

TEST_F(AuditStoreUrl, OpensSqliteByAbsoluteAndRelativePath) {
  std::string absolute = dir_ + "/abs.db";
  auto store = OpenStore("sqlite://" + absolute);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(std::filesystem::exists(absolute));
  ASSERT_TRUE((*store)->Record(kClusterA, 3, {}, {}).ok());

  std::string target = dir_ + "/rel.db";
  std::string relative =
      std::filesystem::relative(target, std::filesystem::current_path()).string();
  ASSERT_FALSE(relative.empty());
  ASSERT_NE(relative[0], '/');
  auto rel_store = OpenStore("sqlite:" + relative);
  ASSERT_TRUE(rel_store.ok()) << rel_store.status();
  EXPECT_TRUE(std::filesystem::exists(target));
  auto version = (*rel_store)->SchemaVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
}

// A "file:" URI that names a file opens that file, whatever SQLite's build
// default for URIs.
TEST_F(AuditStoreUrl, OpensSqliteByFileUri) {
  const std::string target = dir_ + "/uri.db";
  auto store = OpenStore("sqlite:file:" + target + "?mode=rwc");
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(std::filesystem::exists(target));
  ASSERT_TRUE((*store)->Record(kClusterA, 3, {}, {}).ok());
  store->reset();
  auto again = OpenStore("sqlite:" + target);
  ASSERT_TRUE(again.ok()) << again.status();
  auto cursor = (*again)->Cursor(kClusterA);
  ASSERT_TRUE(cursor.ok()) << cursor.status();
  EXPECT_EQ(*cursor, std::optional<int64_t>(3)) << "the URI and the plain path are the same database";
}

TEST_F(AuditStoreUrl, HandsPostgresUrlsToLibpq) {
  // Nothing listens on a port held bound for the test: libpq's refusal proves
  // the URL reached it.
  dev::RefusingEndpoint nobody;
  ASSERT_NE(nobody.port(), 0);
  for (const char* scheme : {"postgresql", "postgres"}) {
    auto store = OpenStore(absl::StrCat(scheme, "://holdfast@", nobody.address(), "/audit"));
    ASSERT_FALSE(store.ok()) << scheme;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  }
  auto malformed = OpenStore("postgresql://[::1");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument) << malformed.status();
  auto bad_option = OpenPostgresStore("host=127.0.0.1 no_such_option=1");
  EXPECT_EQ(bad_option.status().code(), absl::StatusCode::kInvalidArgument) << bad_option.status();
}

TEST_F(AuditStoreUrl, UnopenableSqliteFileIsAnError) {
  auto store = OpenSqliteStore(dir_ + "/no/such/dir/audit.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
}

// SQLite answers BUSY to PRAGMA journal_mode = WAL at once, without its busy
// handler, while another connection holds a fresh file's write lock (as another
// replica does half way through its migrations). The open waits for the lock
// instead of failing.
using AuditStoreSqlite = AuditStoreUrl;

TEST_F(AuditStoreSqlite, OpeningAFreshFileWaitsForAnotherConnectionsWriteLock) {
  const std::string path = dir_ + "/fresh.db";
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &other, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                            nullptr),
            SQLITE_OK);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(other, sqlite3_close);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::atomic<bool> committing{false};
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(300));
    committing = true;
    EXPECT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(other);
  });
  auto store = OpenSqliteStore(path);
  const bool waited = committing.load();
  release.join();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(waited) << "the open returned before the other connection let go of its lock";
  auto version = (*store)->SchemaVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  auto mode = SqliteScalar(path, "SELECT journal_mode = 'wal' FROM pragma_journal_mode");
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, 1) << "the file is in WAL mode";
}

TEST(AuditStoreEventType, NamesRoundTrip) {
  for (EventType t :
       {EventType::kGrant, EventType::kRelease, EventType::kExpire, EventType::kForce}) {
    std::optional<EventType> parsed = ParseEventType(EventTypeName(t));
    ASSERT_TRUE(parsed.has_value()) << EventTypeName(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_STREQ(EventTypeName(EventType::kGrant), "grant");
  EXPECT_STREQ(EventTypeName(EventType::kForce), "force");
  EXPECT_FALSE(ParseEventType("GRANT").has_value());
  EXPECT_FALSE(ParseEventType("").has_value());
}

// ---------------------------------------------------------------------------------
// PostgreSQL only: the connection comes back after the server does.

TEST(AuditStorePostgres, ServerDowntimeIsUnavailableAndTheStoreReconnects) {
  std::optional<std::string> conninfo = SharedPostgres::FreshDatabase();
  ASSERT_TRUE(conninfo.has_value()) << SharedPostgres::error();
  dev::PostgresProcess* pg = SharedPostgres::Get();
  auto store = OpenPostgresStore(*conninfo);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<AuditEvent> first = {Event(kClusterA, 10, "ns", "a", 1, EventType::kGrant)};
  ASSERT_TRUE((*store)->Record(kClusterA, 10, first, {}).ok());

  // A restart between two calls: the next call reconnects on its own.
  ASSERT_TRUE(pg->Restart().ok());
  auto cursor = (*store)->Cursor(kClusterA);
  ASSERT_TRUE(cursor.ok()) << cursor.status();
  EXPECT_EQ(*cursor, 10);

  // While the server is down, calls are UNAVAILABLE (worth retrying) ...
  pg->Stop();
  absl::Status down = (*store)->Record(kClusterA, 20, {}, {});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_EQ((*store)->Query({}).status().code(), absl::StatusCode::kUnavailable);

  // ... and work again once it is back.
  ASSERT_TRUE(pg->Restart().ok());
  std::vector<AuditEvent> second = {Event(kClusterA, 20, "ns", "a", 1, EventType::kRelease)};
  ASSERT_TRUE((*store)->Record(kClusterA, 20, second, {}).ok());
  auto all = (*store)->Query({});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, Sorted({first[0], second[0]}));
}

TEST(AuditStorePostgres, UrlAndKeywordFormsOpenTheSameDatabase) {
  std::optional<std::string> name = SharedPostgres::FreshDatabaseName();
  ASSERT_TRUE(name.has_value()) << SharedPostgres::error();
  dev::PostgresProcess* pg = SharedPostgres::Get();
  auto by_keywords = OpenPostgresStore(pg->conninfo(*name));
  ASSERT_TRUE(by_keywords.ok()) << by_keywords.status();
  ASSERT_TRUE((*by_keywords)->Record(kClusterHigh, 77, {}, {}).ok());

  auto by_url = OpenStore(pg->url(*name));
  ASSERT_TRUE(by_url.ok()) << by_url.status();
  auto cursor = (*by_url)->Cursor(kClusterHigh);
  ASSERT_TRUE(cursor.ok()) << cursor.status();
  EXPECT_EQ(*cursor, 77);
}

}  // namespace
}  // namespace holdfast::audit
