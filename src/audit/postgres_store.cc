// The PostgreSQL audit store (store.h): the production store, shared by every
// holdfastd replica. One libpq connection per store; values always travel as
// PQexecParams parameters (text format), never inside the SQL text.
//
// Errors: a broken connection (or a server that is shutting down) is UNAVAILABLE;
// a lost serialisation race is ABORTED; any other server error (constraint, SQL)
// is INTERNAL with the server's message.
#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "audit/migrations.h"
#include "audit/store.h"
#include "audit/store_internal.h"
#include "common/status.h"

namespace holdfast::audit {
namespace {

using internal::ClusterFromSql;
using internal::ClusterToSql;

// The advisory lock that serialises migrations across replicas: "holdfast" in
// ASCII as a bigint. DO NOT CHANGE: replicas of different versions must agree.
constexpr const char* kMigrationLock = "SELECT pg_advisory_xact_lock(7525352680829580148)";

// Seconds libpq waits for a connection unless the connection string says otherwise.
constexpr const char* kDefaultConnectTimeout = "10";

std::string Trimmed(const char* s) {
  return std::string(absl::StripTrailingAsciiWhitespace(s ? s : ""));
}

// Owns a PGresult.
class Result {
 public:
  explicit Result(PGresult* r) : r_(r) {}
  ~Result() { PQclear(r_); }
  Result(Result&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Result& operator=(Result&&) = delete;

  PGresult* get() const { return r_; }
  int rows() const { return PQntuples(r_); }
  bool IsNull(int row, int col) const { return PQgetisnull(r_, row, col); }
  std::string Text(int row, int col) const {
    return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
  }
  absl::StatusOr<int64_t> Int(int row, int col) const {
    int64_t v;
    if (!absl::SimpleAtoi(absl::string_view(PQgetvalue(r_, row, col)), &v)) {
      return absl::InternalError(absl::StrCat("postgres audit store: column ", PQfname(r_, col),
                                              " is not an integer: \"", PQgetvalue(r_, row, col),
                                              "\""));
    }
    return v;
  }
  bool Bool(int row, int col) const { return PQgetvalue(r_, row, col)[0] == 't'; }
  // Rows a command changed (INSERT / UPDATE).
  int64_t Affected() const {
    int64_t n = 0;
    return absl::SimpleAtoi(PQcmdTuples(r_), &n) ? n : 0;
  }

 private:
  PGresult* r_;
};

// Thread-safe: one mutex serialises every use of the connection.
class PostgresStore final : public AuditStore {
 public:
  static absl::StatusOr<std::unique_ptr<AuditStore>> Open(const std::string& conninfo,
                                                          const StoreOptions& options);
  ~PostgresStore() override;

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
  // Each bounded transaction also raises synchronous_commit from off (its
  // default for this session: the server's, database's or role's) to on, for
  // itself only (set_config's is_local), in the same round trip as the BEGIN.
  PostgresStore(PGconn* conn, const StoreOptions& options)
      : begin_bounded_(absl::StrCat(
            "BEGIN; SET LOCAL lock_timeout = ", options.lock_wait.count(),
            "; SELECT set_config('synchronous_commit', 'on', true) "
            "WHERE current_setting('synchronous_commit') = 'off'")),
        conn_(conn) {}

  // The canonical code for a failed call (see the file comment).
  absl::Status ErrorLockHeld(const PGresult* r, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One statement with parameters; `sql` refers to them as $1, $2, ...
  absl::StatusOr<Result> ExecLockHeld(const std::string& sql,
                                      const std::vector<std::string>& params = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ';'-separated statements without parameters (the migrations).
  absl::Status ExecScriptLockHeld(const char* sql, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BEGIN; body; COMMIT, or ROLLBACK when anything failed. Each lock the body
  // waits for is waited for up to StoreOptions::lock_wait (SET LOCAL
  // lock_timeout, sent with the BEGIN), unless `bounded` is false (the
  // migrations, which wait for another replica's as long as it takes).
  // With `statement_timeout`, each statement of the body is cancelled after it
  // (SET LOCAL statement_timeout, sent with the BEGIN too).
  absl::Status InTransactionLockHeld(
      absl::FunctionRef<absl::Status()> body, bool bounded = true,
      std::optional<std::chrono::milliseconds> statement_timeout = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `op`; if it failed because the connection broke, reconnects (PQreset)
  // once and runs it again. Every operation of this store may run twice: reads
  // trivially, Record and AppendEpoch because they are idempotent.
  absl::Status RunLockHeld(absl::FunctionRef<absl::Status()> op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RunLockHeld of `op` as one bounded transaction (InTransactionLockHeld). Every
  // call of this store but the migrations runs so, reads included: a read waits
  // for a table lock too (an operator's LOCK TABLE, VACUUM FULL or ALTER TABLE),
  // and without a bound it would hold this connection until that lock goes.
  absl::Status RunBoundedLockHeld(absl::FunctionRef<absl::Status()> op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return RunLockHeld([&] { return InTransactionLockHeld(op); });
  }
  absl::Status MigrateLockHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // BEGIN, the transaction's lock_timeout and synchronous_commit
  const std::string begin_bounded_;
  PGconn* const conn_ ABSL_PT_GUARDED_BY(mu_);
};

std::string IntParam(int64_t v) { return absl::StrCat(v); }
std::string BoolParam(bool v) { return v ? "true" : "false"; }

absl::StatusOr<std::unique_ptr<AuditStore>> PostgresStore::Open(const std::string& conninfo,
                                                               const StoreOptions& options) {
  HF_RETURN_IF_ERROR(internal::ValidateStoreOptions(options));
  // A malformed connection string is the caller's mistake, not worth a retry.
  char* parse_error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (parsed == nullptr) {
    std::string msg = parse_error ? Trimmed(parse_error) : "out of memory";
    PQfreemem(parse_error);
    return absl::InvalidArgumentError(
        absl::StrCat("postgres audit store: bad connection string: ", msg));
  }
  PQconninfoFree(parsed);
  // Defaults first: the connection string (expanded from "dbname") overrides them.
  // The keepalives and tcp_user_timeout end a connection to a server that is gone
  // without closing it (a host down, a network cut) in about 10 s; without them
  // the auditor's thread could wait for hours while its lease lapses.
  const char* keys[] = {"connect_timeout", "keepalives", "keepalives_idle",
                        "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                        "application_name", "dbname", nullptr};
  const char* values[] = {kDefaultConnectTimeout, "1", "5", "2", "3", "10000",
                          "holdfast-audit", conninfo.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn == nullptr) return absl::ResourceExhaustedError("postgres audit store: out of memory");
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = Trimmed(PQerrorMessage(conn));
    PQfinish(conn);
    return absl::UnavailableError(absl::StrCat("postgres audit store: cannot connect: ", msg));
  }
  // NOTICEs ("relation ... already exists, skipping") are not for stderr.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  std::unique_ptr<PostgresStore> store(new PostgresStore(conn, options));
  {
    absl::MutexLock l(&store->mu_);
    HF_RETURN_IF_ERROR(store->RunLockHeld([&] { return store->MigrateLockHeld(); }));
  }
  return std::unique_ptr<AuditStore>(std::move(store));
}

PostgresStore::~PostgresStore() {
  absl::MutexLock l(&mu_);
  PQfinish(conn_);
}

absl::Status PostgresStore::ErrorLockHeld(const PGresult* r, absl::string_view what) {
  if (r == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat("postgres audit store: ", what, ": ", Trimmed(PQerrorMessage(conn_))));
  }
  std::string msg =
      absl::StrCat("postgres audit store: ", what, ": ", Trimmed(PQresultErrorMessage(r)));
  const char* state_c = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  absl::string_view state = state_c ? state_c : "";
  // 08: connection exception; 57P01..03: the server is shutting down or starting;
  // 53300: too many connections.
  if (absl::StartsWith(state, "08") || absl::StartsWith(state, "57P") || state == "53300") {
    return absl::UnavailableError(msg);
  }
  // lock_not_available: lock_timeout ran out behind another connection; retry.
  if (state == "55P03") return absl::UnavailableError(msg);
  // query_canceled: statement_timeout ran out (or an operator cancelled it).
  if (state == "57014") return absl::DeadlineExceededError(msg);
  // Serialisation failure, deadlock: the transaction lost a race; retry it.
  if (state == "40001" || state == "40P01") return absl::AbortedError(msg);
  return absl::InternalError(msg);
}

absl::StatusOr<Result> PostgresStore::ExecLockHeld(const std::string& sql,
                                                   const std::vector<std::string>& params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const std::string& p : params) values.push_back(p.c_str());
  Result r(PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                        nullptr, nullptr, /*resultFormat=*/0));
  ExecStatusType st = r.get() ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return ErrorLockHeld(r.get(), sql);
  return r;
}

absl::Status PostgresStore::ExecScriptLockHeld(const char* sql, absl::string_view what) {
  Result r(PQexec(conn_, sql));
  ExecStatusType st = r.get() ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return ErrorLockHeld(r.get(), what);
  return absl::OkStatus();
}

absl::Status PostgresStore::InTransactionLockHeld(
    absl::FunctionRef<absl::Status()> body, bool bounded,
    std::optional<std::chrono::milliseconds> statement_timeout) {
  // A BEGIN whose SET LOCAL failed leaves an aborted transaction open: the
  // ROLLBACK below ends it, or the connection's next call would fail too.
  absl::Status s;
  if (statement_timeout) {
    const std::string begin = absl::StrCat(begin_bounded_, "; SET LOCAL statement_timeout = ",
                                           statement_timeout->count());
    s = ExecScriptLockHeld(begin.c_str(), "BEGIN");
  } else {
    s = bounded ? ExecScriptLockHeld(begin_bounded_.c_str(), "BEGIN")
                : ExecLockHeld("BEGIN").status();
  }
  if (s.ok()) s = body();
  if (s.ok()) s = ExecLockHeld("COMMIT").status();
  if (!s.ok() && PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) != PQTRANS_IDLE) {
    PQclear(PQexec(conn_, "ROLLBACK"));
  }
  return s;
}

absl::Status PostgresStore::RunLockHeld(absl::FunctionRef<absl::Status()> op) {
  if (PQstatus(conn_) != CONNECTION_OK) PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat("postgres audit store: cannot reconnect: ", Trimmed(PQerrorMessage(conn_))));
  }
  absl::Status s = op();
  if (s.ok() || PQstatus(conn_) == CONNECTION_OK) return s;
  PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat(s.message(), "; reconnecting failed: ", Trimmed(PQerrorMessage(conn_))));
  }
  return op();
}

absl::Status PostgresStore::MigrateLockHeld() {
  // Under the advisory lock, a second replica opening at the same moment waits
  // for the first one's transaction and then finds the work done.
  HF_RETURN_IF_ERROR(InTransactionLockHeld([&]() -> absl::Status {
    HF_RETURN_IF_ERROR(ExecLockHeld(kMigrationLock).status());
    return ExecLockHeld(
               "CREATE TABLE IF NOT EXISTS schema_migrations ("
               "  version             INTEGER PRIMARY KEY,"
               "  name                TEXT    NOT NULL,"
               "  applied_at_unix_ms  BIGINT  NOT NULL)")
        .status();
  }, /*bounded=*/false));
  for (const Migration& m : Migrations()) {
    HF_RETURN_IF_ERROR(InTransactionLockHeld([&]() -> absl::Status {
      HF_RETURN_IF_ERROR(ExecLockHeld(kMigrationLock).status());
      HF_ASSIGN_OR_RETURN(Result applied,
                          ExecLockHeld("SELECT 1 FROM schema_migrations WHERE version = $1",
                                       {IntParam(m.version)}));
      if (applied.rows() > 0) return absl::OkStatus();
      HF_RETURN_IF_ERROR(
          ExecScriptLockHeld(m.postgres, absl::StrCat("migration ", m.version, " (", m.name, ")")));
      return ExecLockHeld(
                 "INSERT INTO schema_migrations (version, name, applied_at_unix_ms) "
                 "VALUES ($1, $2, $3)",
                 {IntParam(m.version), m.name, IntParam(internal::NowUnixMs())})
          .status();
    }, /*bounded=*/false));
  }
  return absl::OkStatus();
}

absl::Status PostgresStore::Record(uint64_t cluster_id, int64_t cursor_revision,
                                   const std::vector<AuditEvent>& events,
                                   const std::vector<ForceReleaseRow>& forces) {
  HF_RETURN_IF_ERROR(internal::ValidateBatch(cluster_id, events, forces));
  const std::string cluster = IntParam(ClusterToSql(cluster_id));
  const std::string insert_event =
      absl::StrCat("INSERT INTO audit_event (", internal::kEventColumns,
                   ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING");
  const std::string insert_force =
      absl::StrCat("INSERT INTO force_release (", internal::kForceColumns,
                   ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) "
                   "ON CONFLICT DO NOTHING");
  absl::MutexLock l(&mu_);
  return RunBoundedLockHeld([&]() -> absl::Status {
    // FOR UPDATE: a concurrent Record of the same cluster waits here, then
    // reads the cursor this one leaves.
    HF_ASSIGN_OR_RETURN(
        Result stored,
        ExecLockHeld("SELECT revision FROM audit_cursor WHERE cluster_id = $1 FOR UPDATE",
                     {cluster}));
    if (stored.rows() > 0) {
      HF_ASSIGN_OR_RETURN(int64_t at, stored.Int(0, 0));
      if (at > cursor_revision)
        return internal::CursorRegression(cluster_id, at, cursor_revision);
    }
    // ON CONFLICT DO NOTHING covers unique keys only: a CHECK that fails still
    // fails the statement, and the whole batch with it.
    for (const AuditEvent& e : events) {
      HF_RETURN_IF_ERROR(
          ExecLockHeld(insert_event,
                       {cluster, IntParam(e.revision), e.ns, e.lock_key, IntParam(e.session_id),
                        EventTypeName(e.type), e.spiffe_id, IntParam(e.token),
                        BoolParam(e.unprotected), IntParam(e.time_unix_ms)})
              .status());
    }
    for (const ForceReleaseRow& f : forces) {
      HF_RETURN_IF_ERROR(
          ExecLockHeld(insert_force,
                       {f.request_id, cluster, IntParam(f.revision), f.ns, f.lock_key,
                        IntParam(f.session_id), IntParam(f.token), f.requester, f.approver,
                        f.reason, BoolParam(f.class_was_fenced), IntParam(f.requested_at_unix_ms),
                        IntParam(f.approved_at_unix_ms)})
              .status());
    }
    // The WHERE keeps the cursor from moving back even when two first Records
    // of a cluster race (FOR UPDATE locks no row that does not exist yet).
    HF_ASSIGN_OR_RETURN(
        Result upsert,
        ExecLockHeld("INSERT INTO audit_cursor (cluster_id, revision, updated_at_unix_ms) "
                     "VALUES ($1, $2, $3) ON CONFLICT (cluster_id) DO UPDATE SET "
                     "revision = EXCLUDED.revision, "
                     "updated_at_unix_ms = EXCLUDED.updated_at_unix_ms "
                     "WHERE audit_cursor.revision <= EXCLUDED.revision",
                     {cluster, IntParam(cursor_revision), IntParam(internal::NowUnixMs())}));
    if (upsert.Affected() != 1) {
      HF_ASSIGN_OR_RETURN(
          Result now,
          ExecLockHeld("SELECT revision FROM audit_cursor WHERE cluster_id = $1", {cluster}));
      int64_t at = 0;
      if (now.rows() > 0) {
        HF_ASSIGN_OR_RETURN(at, now.Int(0, 0));
      }
      return internal::CursorRegression(cluster_id, at, cursor_revision);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<int64_t>> PostgresStore::Cursor(uint64_t cluster_id) {
  absl::MutexLock l(&mu_);
  std::optional<int64_t> out;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r,
                        ExecLockHeld("SELECT revision FROM audit_cursor WHERE cluster_id = $1",
                                     {IntParam(ClusterToSql(cluster_id))}));
    out.reset();
    if (r.rows() > 0) {
      HF_ASSIGN_OR_RETURN(out, r.Int(0, 0));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> PostgresStore::Clusters() {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> out;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r, ExecLockHeld("SELECT cluster_id FROM audit_cursor"));
    out.clear();
    for (int i = 0; i < r.rows(); ++i) {
      HF_ASSIGN_OR_RETURN(int64_t id, r.Int(i, 0));
      out.push_back(ClusterFromSql(id));
    }
    return absl::OkStatus();
  }));
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status PostgresStore::RewindCursor(uint64_t cluster_id, int64_t revision) {
  absl::MutexLock l(&mu_);
  return RunBoundedLockHeld([&]() -> absl::Status {
    return ExecLockHeld(
               "UPDATE audit_cursor SET revision = $2, updated_at_unix_ms = $3 "
               "WHERE cluster_id = $1 AND revision > $2",
               {IntParam(ClusterToSql(cluster_id)), IntParam(revision),
                IntParam(internal::NowUnixMs())})
        .status();
  });
}

absl::StatusOr<AuditStore::Pruned> PostgresStore::Prune(int64_t before_unix_ms, int max_events) {
  HF_RETURN_IF_ERROR(internal::ValidatePrune(before_unix_ms, max_events));
  const std::string before = IntParam(before_unix_ms);
  absl::MutexLock l(&mu_);
  Pruned out;
  // Run twice after a broken connection: deleting what is older again is harmless.
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    // Prunable events oldest first through the time index (store.h), then the
    // ends whose grants that statement deleted; ctid names the rows to delete.
    HF_ASSIGN_OR_RETURN(Result oldest,
                        ExecLockHeld(internal::PruneStatement(true, "ctid", "$1", "$2"),
                                     {before, IntParam(max_events)}));
    out.events = oldest.Affected();
    if (out.events < max_events) {
      HF_ASSIGN_OR_RETURN(Result ends,
                          ExecLockHeld(internal::PruneStatement(false, "ctid", "$1", "$2"),
                                       {before, IntParam(max_events - out.events)}));
      out.events += ends.Affected();
    }
    HF_ASSIGN_OR_RETURN(
        Result forces,
        ExecLockHeld(internal::PruneForceReleasesStatement("$1"), {before}));
    out.force_releases = forces.Affected();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<AuditEvent>> PostgresStore::Query(const AuditQuery& q) {
  internal::BuiltQuery built = internal::BuildEventQuery(q, '$');
  std::vector<std::string> params;
  for (const internal::SqlParam& p : built.params) {
    params.push_back(p.is_text ? p.text : IntParam(p.integer));
  }
  absl::MutexLock l(&mu_);
  std::vector<AuditEvent> out;
  auto read = [&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r, ExecLockHeld(built.sql, params));
    out.clear();
    out.reserve(r.rows());
    for (int i = 0; i < r.rows(); ++i) {
      AuditEvent e;
      HF_ASSIGN_OR_RETURN(int64_t cluster, r.Int(i, 0));
      e.cluster_id = ClusterFromSql(cluster);
      HF_ASSIGN_OR_RETURN(e.revision, r.Int(i, 1));
      e.ns = r.Text(i, 2);
      e.lock_key = r.Text(i, 3);
      HF_ASSIGN_OR_RETURN(e.session_id, r.Int(i, 4));
      std::string type = r.Text(i, 5);
      std::optional<EventType> parsed = ParseEventType(type);
      if (!parsed) {
        return absl::InternalError(
            absl::StrCat("postgres audit store: unknown event type \"", type, "\" in audit_event"));
      }
      e.type = *parsed;
      e.spiffe_id = r.Text(i, 6);
      HF_ASSIGN_OR_RETURN(e.token, r.Int(i, 7));
      e.unprotected = r.Bool(i, 8);
      HF_ASSIGN_OR_RETURN(e.time_unix_ms, r.Int(i, 9));
      e.force_request_id = r.Text(i, 10);  // NULL (no row): empty
      e.force_requester = r.Text(i, 11);
      e.force_approver = r.Text(i, 12);
      e.force_reason = r.Text(i, 13);
      e.force_class_was_fenced = r.Bool(i, 14);
      out.push_back(std::move(e));
    }
    return absl::OkStatus();
  };
  // With a deadline, PostgreSQL cancels the statement when it passes
  // (statement_timeout): left running, it would hold this connection, and the
  // database's work, after its caller gave up. A retry after a reconnect gets
  // only what is left.
  bool timed = false;
  absl::Status s = RunLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(std::optional<std::chrono::milliseconds> left,
                        internal::QueryTimeLeft(q, "postgres"));
    timed = left.has_value();
    return InTransactionLockHeld(read, /*bounded=*/true, left);
  });
  if (timed && s.code() == absl::StatusCode::kDeadlineExceeded) {
    return internal::QueryOutOfTime("postgres");
  }
  HF_RETURN_IF_ERROR(s);
  return out;
}

absl::StatusOr<std::vector<ForceReleaseRow>> PostgresStore::ForceReleases(int limit) {
  const std::string sql = absl::StrCat("SELECT ", internal::kForceColumns, " FROM force_release",
                                       internal::kForceOrder, " LIMIT $1");
  absl::MutexLock l(&mu_);
  std::vector<ForceReleaseRow> out;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r, ExecLockHeld(sql, {IntParam(internal::ClampLimit(limit))}));
    out.clear();
    for (int i = 0; i < r.rows(); ++i) {
      ForceReleaseRow f;
      f.request_id = r.Text(i, 0);
      HF_ASSIGN_OR_RETURN(int64_t cluster, r.Int(i, 1));
      f.cluster_id = ClusterFromSql(cluster);
      HF_ASSIGN_OR_RETURN(f.revision, r.Int(i, 2));
      f.ns = r.Text(i, 3);
      f.lock_key = r.Text(i, 4);
      HF_ASSIGN_OR_RETURN(f.session_id, r.Int(i, 5));
      HF_ASSIGN_OR_RETURN(f.token, r.Int(i, 6));
      f.requester = r.Text(i, 7);
      f.approver = r.Text(i, 8);
      f.reason = r.Text(i, 9);
      f.class_was_fenced = r.Bool(i, 10);
      HF_ASSIGN_OR_RETURN(f.requested_at_unix_ms, r.Int(i, 11));
      HF_ASSIGN_OR_RETURN(f.approved_at_unix_ms, r.Int(i, 12));
      out.push_back(std::move(f));
    }
    return absl::OkStatus();
  }));
  return out;
}

// Reads one epoch row (columns in kEpochColumns order).
absl::StatusOr<EpochRow> EpochFromRow(const Result& r, int i) {
  EpochRow row;
  HF_ASSIGN_OR_RETURN(int64_t epoch, r.Int(i, 0));
  row.epoch = static_cast<int32_t>(epoch);
  HF_ASSIGN_OR_RETURN(int64_t cluster, r.Int(i, 1));
  row.cluster_id = ClusterFromSql(cluster);
  HF_ASSIGN_OR_RETURN(row.advanced_at_unix_ms, r.Int(i, 2));
  row.reason = r.Text(i, 3);
  row.actor = r.Text(i, 4);
  return row;
}

absl::Status PostgresStore::AppendEpoch(const EpochRow& row) {
  HF_RETURN_IF_ERROR(internal::ValidateEpochRow(row));
  const std::string cluster = IntParam(ClusterToSql(row.cluster_id));
  absl::MutexLock l(&mu_);
  return RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(
        Result insert,
        ExecLockHeld(absl::StrCat("INSERT INTO epoch (", internal::kEpochColumns,
                                  ") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"),
                     {IntParam(row.epoch), cluster, IntParam(row.advanced_at_unix_ms), row.reason,
                      row.actor}));
    if (insert.Affected() == 1) return absl::OkStatus();
    // The key is taken: the same row again is a harmless retry, another is refused.
    HF_ASSIGN_OR_RETURN(
        Result r, ExecLockHeld(absl::StrCat("SELECT ", internal::kEpochColumns,
                                            " FROM epoch WHERE epoch = $1 AND cluster_id = $2"),
                               {IntParam(row.epoch), cluster}));
    if (r.rows() == 0) {
      return absl::InternalError("postgres audit store: epoch insert ignored, row absent");
    }
    HF_ASSIGN_OR_RETURN(EpochRow stored, EpochFromRow(r, 0));
    if (internal::SameEpochRow(stored, row)) return absl::OkStatus();
    return internal::EpochConflict(stored);
  });
}

absl::StatusOr<int32_t> PostgresStore::MaxEpoch() {
  absl::MutexLock l(&mu_);
  int32_t out = 0;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r, ExecLockHeld("SELECT COALESCE(MAX(epoch), 0) FROM epoch"));
    HF_ASSIGN_OR_RETURN(int64_t max, r.Int(0, 0));
    out = static_cast<int32_t>(max);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<EpochRow>> PostgresStore::Epochs() {
  absl::MutexLock l(&mu_);
  std::vector<EpochRow> out;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r,
                        ExecLockHeld(absl::StrCat("SELECT ", internal::kEpochColumns,
                                                  " FROM epoch ORDER BY epoch, cluster_id")));
    out.clear();
    for (int i = 0; i < r.rows(); ++i) {
      HF_ASSIGN_OR_RETURN(EpochRow row, EpochFromRow(r, i));
      out.push_back(std::move(row));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<int> PostgresStore::SchemaVersion() {
  absl::MutexLock l(&mu_);
  int out = 0;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    HF_ASSIGN_OR_RETURN(Result r,
                        ExecLockHeld("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
    HF_ASSIGN_OR_RETURN(int64_t v, r.Int(0, 0));
    out = static_cast<int>(v);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<AuditStore::Durability> PostgresStore::CommitDurability() {
  absl::MutexLock l(&mu_);
  Durability out;
  HF_RETURN_IF_ERROR(RunBoundedLockHeld([&]() -> absl::Status {
    // Inside the transaction: `setting` is what it runs with, `reset_val` what
    // the session would have had without the BEGIN's raise.
    HF_ASSIGN_OR_RETURN(Result r, ExecLockHeld("SELECT setting, reset_val FROM pg_settings "
                                               "WHERE name = 'synchronous_commit'"));
    if (PQntuples(r.get()) != 1) {
      return absl::InternalError("postgres audit store: no synchronous_commit in pg_settings");
    }
    const std::string setting = PQgetvalue(r.get(), 0, 0);
    const std::string base = PQgetvalue(r.get(), 0, 1);
    out.setting = absl::StrCat("synchronous_commit=", setting);
    if (base != setting) out.raised_from = absl::StrCat("synchronous_commit=", base);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AuditStore>> OpenPostgresStore(const std::string& conninfo,
                                                              const StoreOptions& options) {
  return PostgresStore::Open(conninfo, options);
}

}  // namespace holdfast::audit
