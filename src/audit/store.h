// The audit store: where holdfast keeps what outlives the lock keys (ARCHITECTURE
// §7–8). One interface, two real implementations: SQLite (embedded default,
// sqlite_store.cc) and PostgreSQL 15 (production, postgres_store.cc).
//
// Tables (schema in migrations.cc, versioned; applied by Open()):
//   audit_event   one row per grant | release | expire | force, primary key
//                 (cluster_id, revision, namespace, lock_key, session_id): one etcd
//                 revision can end many holds (a lease expiry), and shared holds of a
//                 key share a grant revision, so the seed's (cluster, revision) key
//                 would collide.
//   force_release one row per executed force-release, joined to its `force` event by
//                 (cluster_id, revision).
//   epoch         the epoch history (the authority on the highest epoch ever used).
//   audit_cursor  per etcd cluster, the last revision whose events are all recorded.
//
// Retention: rows are kept until Prune() deletes those older than a cutoff (the
// auditor does it when `audit.retention` is set; auditor.h). Epochs and cursors are
// never pruned: the epoch history is the authority on the highest epoch ever used.
//
// Tokens and revisions are signed 64-bit columns (a token is < 2^63: epochs stay
// below 2^15). Cluster ids are unsigned in etcd; they are stored bit-for-bit in a
// signed 64-bit column and converted back on read.
//
// Thread safety: every method may be called from any thread; implementations
// serialise access to their connection. Several stores may share one database
// (replicas of holdfastd, or a CLI reading while the auditor writes).
//
// Errors, for every method: UNAVAILABLE when the database cannot be reached or
// stays busy (retry; for a write the outcome is unknown, and retrying is safe
// because writes are idempotent); DEADLINE_EXCEEDED for a Query past its
// deadline (and for a statement PostgreSQL cancelled: an operator's
// pg_cancel_backend or statement_timeout); INTERNAL for any other database
// error, with the database's message.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace holdfast::audit {

enum class EventType { kGrant, kRelease, kExpire, kForce };

// "grant" | "release" | "expire" | "force".
const char* EventTypeName(EventType t);
std::optional<EventType> ParseEventType(std::string_view s);

struct AuditEvent {
  uint64_t cluster_id = 0;
  int64_t revision = 0;       // the etcd revision of the grant / release / ...
  std::string ns;             // namespace
  std::string lock_key;       // raw bytes (UTF-8, validated at grant)
  int64_t session_id = 0;     // the holder's lease id
  EventType type = EventType::kGrant;
  std::string spiffe_id;      // the holder's identity (for force too: see force_release)
  int64_t token = 0;          // the hold's fencing token
  bool unprotected = false;   // advisory class: the holder is not fenced off
  int64_t time_unix_ms = 0;   // best known wall time of the event (see auditor.h)
  // A `force` event, as Query reads it: its force_release row (empty when the
  // row is not there). Not written by Record, which takes the rows apart.
  std::string force_request_id, force_requester, force_approver, force_reason;
  bool force_class_was_fenced = false;
};

struct ForceReleaseRow {
  std::string request_id;
  uint64_t cluster_id = 0;
  int64_t revision = 0;       // joins the `force` audit_event
  std::string ns;
  std::string lock_key;
  int64_t session_id = 0;
  int64_t token = 0;
  std::string requester;
  std::string approver;
  std::string reason;
  bool class_was_fenced = true;
  int64_t requested_at_unix_ms = 0;
  int64_t approved_at_unix_ms = 0;
};

struct EpochRow {
  int32_t epoch = 0;
  uint64_t cluster_id = 0;
  int64_t advanced_at_unix_ms = 0;
  std::string reason;  // "init" | "restore" | "rehome"
  std::string actor;   // SPIFFE ID of the admin (or "holdfastd" for automatic ones)
};

// Where an event stands in a query's order (keyset paging).
struct AuditEventKey {
  int64_t revision = 0;
  std::string ns;
  std::string lock_key;
  int64_t session_id = 0;
  uint64_t cluster_id = 0;
};

// Filters of a query; empty / unset fields match everything. Results come in
// (revision, namespace, lock_key, session_id, cluster_id) order, strings as
// bytes, cluster ids as signed 64-bit integers (their SQL form).
struct AuditQuery {
  std::optional<uint64_t> cluster_id;
  std::string ns;
  std::string lock_key;
  std::optional<EventType> type;
  std::string spiffe_id;
  int64_t since_unix_ms = 0;    // time_unix_ms >= since
  int64_t after_revision = 0;   // revision > after
  // Only events after this one in the order above: the last event of a page gives
  // the next page, even inside a revision with more events than a page holds.
  std::optional<AuditEventKey> after_event;
  int limit = 1000;             // at most this many rows (1..10000)
  // When the query gives up: DEADLINE_EXCEEDED, no rows. The time spent waiting
  // for the store's connection (another call on it) counts too. Without one, a
  // query runs as long as it takes.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// Whether `s` is Record()'s refusal of a cursor that would move back: another
// auditor recorded past this one. Not every FAILED_PRECONDITION is that one (a
// SQLite file turned read-only is FAILED_PRECONDITION too).
bool IsCursorRegression(const absl::Status& s);

class AuditStore {
 public:
  virtual ~AuditStore() = default;

  // Records one batch of events (and force_release rows) and moves the cluster's
  // cursor to `cursor_revision`, in ONE SQL transaction. Rows already present
  // (same primary key) are left as they are, so a replay is harmless. Refuses
  // (FAILED_PRECONDITION, nothing written) a cursor lower than the stored one.
  // An equal cursor is accepted (a replay, or an empty batch). INVALID_ARGUMENT
  // (nothing written) when a row's cluster_id is not `cluster_id`; a row the
  // schema refuses (e.g. approver == requester) fails the whole batch: INTERNAL,
  // nothing written.
  virtual absl::Status Record(uint64_t cluster_id, int64_t cursor_revision,
                              const std::vector<AuditEvent>& events,
                              const std::vector<ForceReleaseRow>& forces) = 0;

  // The cluster's cursor: last revision whose events are all recorded; nullopt if
  // this cluster was never audited.
  virtual absl::StatusOr<std::optional<int64_t>> Cursor(uint64_t cluster_id) = 0;
  // Every cluster that has a cursor (was ever audited), in ascending id order.
  virtual absl::StatusOr<std::vector<uint64_t>> Clusters() = 0;

  // Moves the cluster's cursor back to `revision` (no-op if it is already at or
  // below it). Only for an etcd cluster whose revisions went backwards (restored
  // from a snapshot with the same cluster id): the epoch advance calls it, so the
  // auditor resumes from the restored cluster's revision. Rows stay.
  virtual absl::Status RewindCursor(uint64_t cluster_id, int64_t revision) = 0;

  // Deletes audit_event rows whose time_unix_ms is before `before_unix_ms`, at
  // most `max_events` of them, oldest first, and every force_release row approved
  // before it, in ONE SQL transaction. Epochs and cursors stay, and so does the
  // trail of every hold that may still be live: a grant goes only once an end of
  // that hold (a later release, expire or force of the same cluster, namespace, key
  // and session) is recorded, and an end only once no grant before it of the same
  // hold is left (so a grant never loses its end first, even when the two servers'
  // clocks put the end before the grant). A grant whose end was never recorded (an
  // audit gap) is kept. Returns how many rows of each went; fewer events than
  // `max_events` means none prunable was left when it ran.
  // INVALID_ARGUMENT (nothing deleted) unless before_unix_ms > 0 and 1 <= max_events
  // <= kMaxPruneEvents.
  struct Pruned {
    int64_t events = 0;
    int64_t force_releases = 0;
  };
  static constexpr int kMaxPruneEvents = 100000;
  virtual absl::StatusOr<Pruned> Prune(int64_t before_unix_ms, int max_events) = 0;

  // q.limit is clamped to 1..10000.
  virtual absl::StatusOr<std::vector<AuditEvent>> Query(const AuditQuery& q) = 0;
  // Newest approval first; `limit` is clamped to 1..10000.
  virtual absl::StatusOr<std::vector<ForceReleaseRow>> ForceReleases(int limit) = 0;

  // Epoch history. AppendEpoch: INVALID_ARGUMENT unless 1 <= epoch <= 32767 and
  // reason is init|restore|rehome; ALREADY_EXISTS when another row holds the same
  // (epoch, cluster_id); the identical row again is OK (a retry). Epochs() comes
  // in epoch order.
  virtual absl::Status AppendEpoch(const EpochRow& row) = 0;
  virtual absl::StatusOr<int32_t> MaxEpoch() = 0;  // 0 when the history is empty
  virtual absl::StatusOr<std::vector<EpochRow>> Epochs() = 0;

  // The schema version this store is at (the highest migration applied).
  virtual absl::StatusOr<int> SchemaVersion() = 0;

  // What a commit of this store waits for before it counts as done, read from the
  // database: SQLite's `synchronous` (FULL: flushed to disk), or the
  // `synchronous_commit` PostgreSQL runs this store's transactions with. Each
  // transaction raises `off` (the role's, the database's or the server's setting)
  // to `on`, so a crash of PostgreSQL cannot lose events holdfastd saw committed;
  // any other setting (local, remote_write, remote_apply) is left as configured.
  struct Durability {
    std::string setting;  // "synchronous=FULL", "synchronous_commit=on", ...
    std::string raised_from;  // the setting it would have had, when raised; else ""
  };
  virtual absl::StatusOr<Durability> CommitDurability() = 0;
};

struct StoreOptions {
  // How long one wait for a lock that another connection holds lasts (SQLite:
  // the file's write lock, its busy timeout; PostgreSQL: each row or table lock,
  // the transaction's lock_timeout) before the call fails UNAVAILABLE, to be
  // retried. Opening (the migrations) waits up to 10 s (SQLite) or as long as it
  // takes (PostgreSQL) for another replica's migration. holdfastd sets a quarter
  // of the auditor lease's TTL, so that a record waiting on a lock does not
  // outlast the lease (server.cc).
  std::chrono::milliseconds lock_wait{10'000};
};

// Opens (creating if needed) a SQLite store at `path` and applies migrations.
// FAILED_PRECONDITION when the file cannot be opened or is not a database.
absl::StatusOr<std::unique_ptr<AuditStore>> OpenSqliteStore(const std::string& path,
                                                            const StoreOptions& options = {});

// Opens a PostgreSQL store from a libpq connection string ("host=... dbname=..."
// or "postgresql://...") and applies migrations. INVALID_ARGUMENT for a malformed
// string, UNAVAILABLE when the server cannot be reached. Unless the string sets
// them: connect_timeout 10 s; TCP keepalives after 5 s idle, every 2 s, 3 missed
// end the connection, and tcp_user_timeout 10 s (a server that vanished without
// closing is noticed in about 10 s, not after the kernel's two hours). Every
// call but the migrations, reads included, runs as one transaction whose
// lock_timeout is `options.lock_wait`.
absl::StatusOr<std::unique_ptr<AuditStore>> OpenPostgresStore(const std::string& conninfo,
                                                              const StoreOptions& options = {});

// Opens by URL: "sqlite:///abs/path.db" or "sqlite:relative.db", or
// "postgresql://..." / "postgres://...". INVALID_ARGUMENT for anything else.
absl::StatusOr<std::unique_ptr<AuditStore>> OpenStore(const std::string& url,
                                                      const StoreOptions& options = {});

}  // namespace holdfast::audit
