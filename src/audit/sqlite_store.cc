// The SQLite audit store (store.h): the embedded default. One connection per
// store in WAL mode, so several stores on one file (several holdfastd replicas on
// one host, or a CLI reading while the auditor writes) work side by side; every
// write transaction is BEGIN IMMEDIATE, so writers queue on the file lock (up to
// StoreOptions::lock_wait) instead of failing half way.
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "audit/migrations.h"
#include "audit/store.h"
#include "audit/store_internal.h"
#include "common/status.h"

namespace holdfast::audit {
namespace {

using internal::ClusterFromSql;
using internal::ClusterToSql;

// How long opening (configuring, migrating) waits for another connection's lock.
constexpr int kOpenBusyTimeoutMs = 10000;

// The canonical code for a SQLite result code: BUSY / LOCKED (another writer kept
// the file past the busy timeout) is worth retrying; a file that cannot be opened
// or written is not; anything else is INTERNAL with SQLite's message.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  std::string msg = absl::StrCat("sqlite audit store: ", what, ": ",
                                 db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(msg);
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_NOTADB:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// One use of a cached prepared statement: binds parameters left to right, steps,
// reads columns; resets the statement and clears its bindings when destroyed.
class Statement {
 public:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~Statement() {
    if (stmt_ == nullptr) return;
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Statement(Statement&& o) noexcept
      : db_(o.db_),
        stmt_(std::exchange(o.stmt_, nullptr)),
        bound_(o.bound_),
        bind_rc_(o.bind_rc_) {}
  Statement& operator=(Statement&&) = delete;

  Statement& Int(int64_t v) { return Check(sqlite3_bind_int64(stmt_, ++bound_, v)); }
  Statement& Bool(bool v) { return Int(v ? 1 : 0); }
  Statement& Text(absl::string_view v) {
    return Check(
        sqlite3_bind_text64(stmt_, ++bound_, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  Statement& Param(const internal::SqlParam& p) {
    return p.is_text ? Text(p.text) : Int(p.integer);
  }

  // True when a row is ready, false when done.
  absl::StatusOr<bool> Step() {
    if (bind_rc_ != SQLITE_OK) return SqliteError(db_, bind_rc_, "bind");
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, sqlite3_sql(stmt_));
  }
  // Steps a statement that returns no rows.
  absl::Status Run() { return Step().status(); }

  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }
  bool ColumnBool(int i) { return sqlite3_column_int64(stmt_, i) != 0; }
  std::string ColumnText(int i) {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    int n = sqlite3_column_bytes(stmt_, i);
    return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
  }

 private:
  Statement& Check(int rc) {
    if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bound_ = 0;
  int bind_rc_ = SQLITE_OK;
};

// Thread-safe: one mutex serialises every use of the connection.
class SqliteStore final : public AuditStore {
 public:
  static absl::StatusOr<std::unique_ptr<AuditStore>> Open(const std::string& path,
                                                          const StoreOptions& options);
  ~SqliteStore() override;

  absl::Status Record(uint64_t cluster_id, int64_t cursor_revision,
                      const std::vector<AuditEvent>& events,
                      const std::vector<ForceReleaseRow>& forces) override;
  absl::StatusOr<std::optional<int64_t>> Cursor(uint64_t cluster_id) override;
  absl::StatusOr<std::vector<uint64_t>> Clusters() override;
  absl::Status RewindCursor(uint64_t cluster_id, int64_t revision) override;
  absl::StatusOr<Pruned> Prune(int64_t before_unix_ms, int max_events) override;
  absl::StatusOr<std::vector<AuditEvent>> Query(const AuditQuery& q) override;
  absl::StatusOr<std::vector<ForceReleaseRow>> ForceReleases(int limit) override;
  absl::Status AppendEpoch(const EpochRow& row) override;
  absl::StatusOr<int32_t> MaxEpoch() override;
  absl::StatusOr<std::vector<EpochRow>> Epochs() override;
  absl::StatusOr<int> SchemaVersion() override;
  absl::StatusOr<Durability> CommitDurability() override;

 private:
  explicit SqliteStore(sqlite3* db) : db_(db) {}

  absl::Status ConfigureLockHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MigrateLockHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PRAGMA journal_mode = WAL, retried while another connection holds the write
  // lock (up to kOpenBusyTimeoutMs); the journal mode it answers.
  absl::StatusOr<std::string> JournalModeWalLockHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs statements without parameters (sqlite3_exec: ';'-separated).
  absl::Status ExecLockHeld(const char* sql, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One use of the cached prepared statement for `sql` (prepared on first use);
  // values always travel as bound parameters.
  absl::StatusOr<Statement> PrepareLockHeld(const std::string& sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BEGIN IMMEDIATE; body; COMMIT, or ROLLBACK when anything failed.
  absl::Status InTransactionLockHeld(absl::FunctionRef<absl::Status()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<int64_t>> CursorLockHeld(uint64_t cluster_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  std::map<std::string, sqlite3_stmt*> statements_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<AuditStore>> SqliteStore::Open(const std::string& path,
                                                             const StoreOptions& options) {
  if (path.empty()) return absl::InvalidArgumentError("sqlite audit store: empty path");
  HF_RETURN_IF_ERROR(internal::ValidateStoreOptions(options));
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI,
      nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(db, rc, absl::StrCat("open ", path));
    sqlite3_close(db);
    return s;
  }
  // A path may be a SQLite "file:" URI (SQLITE_OPEN_URI, whatever the build's
  // default), e.g. file:/var/lib/holdfast/audit.db?mode=rwc. In-memory and
  // temporary databases have no file name, whichever way they were asked for
  // (":memory:", "", mode=memory, vfs=memdb): each connection would see a
  // database of its own, gone at exit.
  if (const char* file = sqlite3_db_filename(db, "main"); file == nullptr || *file == '\0') {
    sqlite3_close(db);
    return absl::InvalidArgumentError(absl::StrCat(
        "sqlite audit store: \"", path,
        "\" opens an in-memory database, which would lose the audit trail when holdfastd "
        "stops; name a file"));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  {
    absl::MutexLock l(&store->mu_);
    // Opening waits as long as it did always for another replica's migration;
    // every call after it, StoreOptions::lock_wait.
    sqlite3_busy_timeout(store->db_, kOpenBusyTimeoutMs);
    HF_RETURN_IF_ERROR(store->ConfigureLockHeld());
    HF_RETURN_IF_ERROR(store->MigrateLockHeld());
    sqlite3_busy_timeout(store->db_, static_cast<int>(options.lock_wait.count()));
  }
  return std::unique_ptr<AuditStore>(std::move(store));
}

SqliteStore::~SqliteStore() {
  absl::MutexLock l(&mu_);
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status SqliteStore::ConfigureLockHeld() {
  sqlite3_extended_result_codes(db_, 1);
  // WAL: readers never block the writer. synchronous=FULL: a committed cursor
  // survives power loss (holdfast compacts etcd up to it, so it must not roll back).
  HF_ASSIGN_OR_RETURN(std::string mode, JournalModeWalLockHeld());
  if (mode != "wal" && mode != "memory") {
    return absl::FailedPreconditionError(
        absl::StrCat("sqlite audit store: cannot use WAL journal mode (got \"", mode, "\")"));
  }
  return ExecLockHeld("PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL", "configure");
}

absl::StatusOr<std::string> SqliteStore::JournalModeWalLockHeld() {
  // Turning a fresh file to WAL writes its header from inside a read transaction,
  // and SQLite answers SQLITE_BUSY at once, without its busy handler (which could
  // deadlock there), when another connection holds the write lock: another
  // replica opening the same fresh file, half way through its migrations. So
  // this one statement waits here, as every other does in the busy handler.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(kOpenBusyTimeoutMs);
  for (;;) {
    HF_ASSIGN_OR_RETURN(Statement wal, PrepareLockHeld("PRAGMA journal_mode = WAL"));
    absl::StatusOr<bool> has_row = wal.Step();
    if (has_row.ok()) return *has_row ? wal.ColumnText(0) : std::string();
    if (!absl::IsUnavailable(has_row.status()) || absl::Now() >= deadline) {
      return has_row.status();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::Status SqliteStore::MigrateLockHeld() {
  HF_RETURN_IF_ERROR(InTransactionLockHeld([&] {
    return ExecLockHeld(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        "  version             INTEGER PRIMARY KEY,"
        "  name                TEXT    NOT NULL,"
        "  applied_at_unix_ms  INTEGER NOT NULL)",
        "create schema_migrations");
  }));
  for (const Migration& m : Migrations()) {
    // Each migration in its own transaction; BEGIN IMMEDIATE makes a second
    // store opening the same file wait here, then see the migration applied.
    HF_RETURN_IF_ERROR(InTransactionLockHeld([&]() -> absl::Status {
      {
        HF_ASSIGN_OR_RETURN(Statement applied,
                            PrepareLockHeld("SELECT 1 FROM schema_migrations WHERE version = ?1"));
        applied.Int(m.version);
        HF_ASSIGN_OR_RETURN(bool done, applied.Step());
        if (done) return absl::OkStatus();
      }
      HF_RETURN_IF_ERROR(
          ExecLockHeld(m.sqlite, absl::StrCat("migration ", m.version, " (", m.name, ")")));
      HF_ASSIGN_OR_RETURN(Statement insert,
                          PrepareLockHeld("INSERT INTO schema_migrations "
                                          "(version, name, applied_at_unix_ms) "
                                          "VALUES (?1, ?2, ?3)"));
      insert.Int(m.version).Text(m.name).Int(internal::NowUnixMs());
      return insert.Run();
    }));
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::ExecLockHeld(const char* sql, absl::string_view what) {
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, what);
  return absl::OkStatus();
}

absl::StatusOr<Statement> SqliteStore::PrepareLockHeld(const std::string& sql) {
  auto it = statements_.find(sql);
  if (it != statements_.end()) return Statement(db_, it->second);
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, absl::StrCat("prepare ", sql));
  statements_.emplace(sql, stmt);
  return Statement(db_, stmt);
}

absl::Status SqliteStore::InTransactionLockHeld(absl::FunctionRef<absl::Status()> body) {
  HF_RETURN_IF_ERROR(ExecLockHeld("BEGIN IMMEDIATE", "begin"));
  absl::Status s = body();
  if (s.ok()) s = ExecLockHeld("COMMIT", "commit");
  // Some errors end the transaction by themselves; roll back what is left.
  if (!s.ok() && !sqlite3_get_autocommit(db_)) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  return s;
}

absl::StatusOr<std::optional<int64_t>> SqliteStore::CursorLockHeld(uint64_t cluster_id) {
  HF_ASSIGN_OR_RETURN(Statement select,
                      PrepareLockHeld("SELECT revision FROM audit_cursor WHERE cluster_id = ?1"));
  select.Int(ClusterToSql(cluster_id));
  HF_ASSIGN_OR_RETURN(bool found, select.Step());
  if (!found) return std::optional<int64_t>();
  return std::optional<int64_t>(select.ColumnInt(0));
}

absl::Status SqliteStore::Record(uint64_t cluster_id, int64_t cursor_revision,
                                 const std::vector<AuditEvent>& events,
                                 const std::vector<ForceReleaseRow>& forces) {
  HF_RETURN_IF_ERROR(internal::ValidateBatch(cluster_id, events, forces));
  absl::MutexLock l(&mu_);
  return InTransactionLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(std::optional<int64_t> stored, CursorLockHeld(cluster_id));
    if (stored && *stored > cursor_revision) {
      return internal::CursorRegression(cluster_id, *stored, cursor_revision);
    }
    // ON CONFLICT DO NOTHING covers the primary key only: a CHECK that fails
    // still fails the statement, and the whole batch with it.
    const std::string insert_event =
        absl::StrCat("INSERT INTO audit_event (", internal::kEventColumns,
                     ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING");
    for (const AuditEvent& e : events) {
      HF_ASSIGN_OR_RETURN(Statement insert, PrepareLockHeld(insert_event));
      insert.Int(ClusterToSql(e.cluster_id))
          .Int(e.revision)
          .Text(e.ns)
          .Text(e.lock_key)
          .Int(e.session_id)
          .Text(EventTypeName(e.type))
          .Text(e.spiffe_id)
          .Int(e.token)
          .Bool(e.unprotected)
          .Int(e.time_unix_ms);
      HF_RETURN_IF_ERROR(insert.Run());
    }
    const std::string insert_force =
        absl::StrCat("INSERT INTO force_release (", internal::kForceColumns,
                     ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) "
                     "ON CONFLICT DO NOTHING");
    for (const ForceReleaseRow& f : forces) {
      HF_ASSIGN_OR_RETURN(Statement insert, PrepareLockHeld(insert_force));
      insert.Text(f.request_id)
          .Int(ClusterToSql(f.cluster_id))
          .Int(f.revision)
          .Text(f.ns)
          .Text(f.lock_key)
          .Int(f.session_id)
          .Int(f.token)
          .Text(f.requester)
          .Text(f.approver)
          .Text(f.reason)
          .Bool(f.class_was_fenced)
          .Int(f.requested_at_unix_ms)
          .Int(f.approved_at_unix_ms);
      HF_RETURN_IF_ERROR(insert.Run());
    }
    HF_ASSIGN_OR_RETURN(
        Statement cursor,
        PrepareLockHeld("INSERT INTO audit_cursor (cluster_id, revision, updated_at_unix_ms) "
                        "VALUES (?1, ?2, ?3) ON CONFLICT (cluster_id) DO UPDATE SET "
                        "revision = excluded.revision, "
                        "updated_at_unix_ms = excluded.updated_at_unix_ms "
                        "WHERE audit_cursor.revision <= excluded.revision"));
    cursor.Int(ClusterToSql(cluster_id)).Int(cursor_revision).Int(internal::NowUnixMs());
    HF_RETURN_IF_ERROR(cursor.Run());
    if (sqlite3_changes(db_) != 1) {
      // Unreachable under BEGIN IMMEDIATE; kept so the guard never depends on it.
      HF_ASSIGN_OR_RETURN(std::optional<int64_t> now, CursorLockHeld(cluster_id));
      return internal::CursorRegression(cluster_id, now.value_or(0), cursor_revision);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<int64_t>> SqliteStore::Cursor(uint64_t cluster_id) {
  absl::MutexLock l(&mu_);
  return CursorLockHeld(cluster_id);
}

absl::StatusOr<std::vector<uint64_t>> SqliteStore::Clusters() {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(Statement select, PrepareLockHeld("SELECT cluster_id FROM audit_cursor"));
  std::vector<uint64_t> out;
  while (true) {
    HF_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    out.push_back(ClusterFromSql(select.ColumnInt(0)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status SqliteStore::RewindCursor(uint64_t cluster_id, int64_t revision) {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(
      Statement update,
      PrepareLockHeld("UPDATE audit_cursor SET revision = ?2, updated_at_unix_ms = ?3 "
                      "WHERE cluster_id = ?1 AND revision > ?2"));
  update.Int(ClusterToSql(cluster_id)).Int(revision).Int(internal::NowUnixMs());
  return update.Run();
}

absl::StatusOr<AuditStore::Pruned> SqliteStore::Prune(int64_t before_unix_ms, int max_events) {
  HF_RETURN_IF_ERROR(internal::ValidatePrune(before_unix_ms, max_events));
  absl::MutexLock l(&mu_);
  Pruned out;
  HF_RETURN_IF_ERROR(InTransactionLockHeld([&]() -> absl::Status {
    // Prunable events oldest first through the time index (store.h), then the ends
    // whose grants that statement deleted; rowid names the rows to delete.
    HF_ASSIGN_OR_RETURN(Statement oldest,
                        PrepareLockHeld(internal::PruneStatement(true, "rowid", "?1", "?2")));
    oldest.Int(before_unix_ms).Int(max_events);
    HF_RETURN_IF_ERROR(oldest.Run());
    out.events = sqlite3_changes(db_);
    if (out.events < max_events) {
      HF_ASSIGN_OR_RETURN(Statement ends,
                          PrepareLockHeld(internal::PruneStatement(false, "rowid", "?1", "?2")));
      ends.Int(before_unix_ms).Int(max_events - out.events);
      HF_RETURN_IF_ERROR(ends.Run());
      out.events += sqlite3_changes(db_);
    }
    HF_ASSIGN_OR_RETURN(
        Statement forces, PrepareLockHeld(internal::PruneForceReleasesStatement("?1")));
    forces.Int(before_unix_ms);
    HF_RETURN_IF_ERROR(forces.Run());
    out.force_releases = sqlite3_changes(db_);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<AuditEvent>> SqliteStore::Query(const AuditQuery& q) {
  internal::BuiltQuery built = internal::BuildEventQuery(q, '?');
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(std::optional<std::chrono::milliseconds> left,
                      internal::QueryTimeLeft(q, "sqlite"));
  // With a deadline, SQLite interrupts the statement when it passes: its
  // progress handler looks at the clock every kProgressOps virtual-machine
  // steps (a few microseconds of work) and ends the statement with
  // SQLITE_INTERRUPT. Left running, a query would hold this connection after
  // its caller gave up.
  struct Progress {
    std::chrono::steady_clock::time_point deadline;
    bool passed = false;
  } progress;
  constexpr int kProgressOps = 1000;
  if (left) {
    progress.deadline = *q.deadline;
    sqlite3_progress_handler(
        db_, kProgressOps,
        [](void* arg) -> int {
          auto* p = static_cast<Progress*>(arg);
          if (std::chrono::steady_clock::now() >= p->deadline) p->passed = true;
          return p->passed ? 1 : 0;
        },
        &progress);
  }
  absl::Cleanup no_progress = [&] {
    if (left) sqlite3_progress_handler(db_, 0, nullptr, nullptr);
  };
  HF_ASSIGN_OR_RETURN(Statement select, PrepareLockHeld(built.sql));
  for (const internal::SqlParam& p : built.params) select.Param(p);
  std::vector<AuditEvent> out;
  while (true) {
    absl::StatusOr<bool> row = select.Step();
    if (progress.passed) return internal::QueryOutOfTime("sqlite");
    HF_RETURN_IF_ERROR(row.status());
    if (!*row) break;
    AuditEvent e;
    e.cluster_id = ClusterFromSql(select.ColumnInt(0));
    e.revision = select.ColumnInt(1);
    e.ns = select.ColumnText(2);
    e.lock_key = select.ColumnText(3);
    e.session_id = select.ColumnInt(4);
    std::string type = select.ColumnText(5);
    std::optional<EventType> parsed = ParseEventType(type);
    if (!parsed) {
      return absl::InternalError(
          absl::StrCat("sqlite audit store: unknown event type \"", type, "\" in audit_event"));
    }
    e.type = *parsed;
    e.spiffe_id = select.ColumnText(6);
    e.token = select.ColumnInt(7);
    e.unprotected = select.ColumnBool(8);
    e.time_unix_ms = select.ColumnInt(9);
    e.force_request_id = select.ColumnText(10);  // NULL (no row): empty
    e.force_requester = select.ColumnText(11);
    e.force_approver = select.ColumnText(12);
    e.force_reason = select.ColumnText(13);
    e.force_class_was_fenced = select.ColumnBool(14);
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::vector<ForceReleaseRow>> SqliteStore::ForceReleases(int limit) {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(
      Statement select,
      PrepareLockHeld(absl::StrCat("SELECT ", internal::kForceColumns, " FROM force_release",
                                   internal::kForceOrder, " LIMIT ?1")));
  select.Int(internal::ClampLimit(limit));
  std::vector<ForceReleaseRow> out;
  while (true) {
    HF_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    ForceReleaseRow f;
    f.request_id = select.ColumnText(0);
    f.cluster_id = ClusterFromSql(select.ColumnInt(1));
    f.revision = select.ColumnInt(2);
    f.ns = select.ColumnText(3);
    f.lock_key = select.ColumnText(4);
    f.session_id = select.ColumnInt(5);
    f.token = select.ColumnInt(6);
    f.requester = select.ColumnText(7);
    f.approver = select.ColumnText(8);
    f.reason = select.ColumnText(9);
    f.class_was_fenced = select.ColumnBool(10);
    f.requested_at_unix_ms = select.ColumnInt(11);
    f.approved_at_unix_ms = select.ColumnInt(12);
    out.push_back(std::move(f));
  }
  return out;
}

absl::Status SqliteStore::AppendEpoch(const EpochRow& row) {
  HF_RETURN_IF_ERROR(internal::ValidateEpochRow(row));
  absl::MutexLock l(&mu_);
  return InTransactionLockHeld([&]() -> absl::Status {
    {
      HF_ASSIGN_OR_RETURN(
          Statement insert,
          PrepareLockHeld(absl::StrCat("INSERT INTO epoch (", internal::kEpochColumns,
                                       ") VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING")));
      insert.Int(row.epoch)
          .Int(ClusterToSql(row.cluster_id))
          .Int(row.advanced_at_unix_ms)
          .Text(row.reason)
          .Text(row.actor);
      HF_RETURN_IF_ERROR(insert.Run());
      if (sqlite3_changes(db_) == 1) return absl::OkStatus();
    }
    // The key is taken: the same row again is a harmless retry, another is refused.
    HF_ASSIGN_OR_RETURN(Statement select, PrepareLockHeld(absl::StrCat(
                                              "SELECT ", internal::kEpochColumns,
                                              " FROM epoch WHERE epoch = ?1 AND cluster_id = ?2")));
    select.Int(row.epoch).Int(ClusterToSql(row.cluster_id));
    HF_ASSIGN_OR_RETURN(bool found, select.Step());
    if (!found) return absl::InternalError("sqlite audit store: epoch insert ignored, row absent");
    EpochRow stored{static_cast<int32_t>(select.ColumnInt(0)), ClusterFromSql(select.ColumnInt(1)),
                    select.ColumnInt(2), select.ColumnText(3), select.ColumnText(4)};
    if (internal::SameEpochRow(stored, row)) return absl::OkStatus();
    return internal::EpochConflict(stored);
  });
}

absl::StatusOr<int32_t> SqliteStore::MaxEpoch() {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(Statement select,
                      PrepareLockHeld("SELECT COALESCE(MAX(epoch), 0) FROM epoch"));
  HF_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::InternalError("sqlite audit store: MAX(epoch) returned no row");
  return static_cast<int32_t>(select.ColumnInt(0));
}

absl::StatusOr<std::vector<EpochRow>> SqliteStore::Epochs() {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(Statement select,
                      PrepareLockHeld(absl::StrCat("SELECT ", internal::kEpochColumns,
                                                   " FROM epoch ORDER BY epoch, cluster_id")));
  std::vector<EpochRow> out;
  while (true) {
    HF_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    out.push_back(EpochRow{static_cast<int32_t>(select.ColumnInt(0)),
                           ClusterFromSql(select.ColumnInt(1)), select.ColumnInt(2),
                           select.ColumnText(3), select.ColumnText(4)});
  }
  return out;
}

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(Statement select,
                      PrepareLockHeld("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
  HF_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::InternalError("sqlite audit store: MAX(version) returned no row");
  return static_cast<int>(select.ColumnInt(0));
}

absl::StatusOr<AuditStore::Durability> SqliteStore::CommitDurability() {
  absl::MutexLock l(&mu_);
  HF_ASSIGN_OR_RETURN(Statement pragma, PrepareLockHeld("PRAGMA synchronous"));
  HF_ASSIGN_OR_RETURN(bool row, pragma.Step());
  if (!row) return absl::InternalError("sqlite audit store: PRAGMA synchronous returned no row");
  static constexpr const char* kNames[] = {"OFF", "NORMAL", "FULL", "EXTRA"};
  const int64_t level = pragma.ColumnInt(0);
  Durability out;
  out.setting = absl::StrCat("synchronous=", level >= 0 && level < 4 ? kNames[level]
                                                                    : absl::StrCat(level));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AuditStore>> OpenSqliteStore(const std::string& path,
                                                            const StoreOptions& options) {
  return SqliteStore::Open(path, options);
}

}  // namespace holdfast::audit
