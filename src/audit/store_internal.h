// What the SQLite and PostgreSQL audit stores share: argument checks, the event
// query builder and the column lists, so that both implementations answer the
// same calls the same way. Not part of the store's API; include only from
// src/audit/*_store.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "audit/store.h"

namespace holdfast::audit::internal {

// Query() and ForceReleases() return at most this many rows (and at least one).
inline constexpr int kMaxRows = 10000;
int ClampLimit(int limit);

// The columns of audit_event, force_release and epoch in the order the stores
// read and write them.
inline constexpr const char* kEventColumns =
    "cluster_id, revision, namespace, lock_key, session_id, type, spiffe_id, token, "
    "unprotected, time_unix_ms";
inline constexpr const char* kForceColumns =
    "request_id, cluster_id, revision, namespace, lock_key, session_id, token, requester, "
    "approver, reason, class_was_fenced, requested_at_unix_ms, approved_at_unix_ms";
inline constexpr const char* kEpochColumns =
    "epoch, cluster_id, advanced_at_unix_ms, reason, actor";

// Newest approval first (store.h, ForceReleases).
inline constexpr const char* kForceOrder =
    " ORDER BY approved_at_unix_ms DESC, revision DESC, request_id";

// INVALID_ARGUMENT when a row of the batch names another cluster than the one
// whose cursor it moves, or an event has no valid type. Other row checks are the
// schema's (they surface as INTERNAL from the database, inside the transaction).
absl::Status ValidateBatch(uint64_t cluster_id, const std::vector<AuditEvent>& events,
                           const std::vector<ForceReleaseRow>& forces);

// The DELETE of AuditStore::Prune, in a dialect: `row_id` names a row ("rowid",
// "ctid"), `cutoff` and `limit` are the parameters ("?1", "?2" / "$1", "$2"). It
// deletes, oldest first, ends with no grant of their hold left before them and,
// `with_grants`, grants whose hold has a recorded end (store.h). In one statement
// an end is judged before its grant goes (the statement reads the table as it
// was), so Prune follows with an ends-only one. The inner lookups go through
// audit_event_by_key.
std::string PruneStatement(bool with_grants, const char* row_id, const char* cutoff,
                           const char* limit);
// The DELETE of force_release rows approved before `cutoff` whose `force` event
// is gone: a row goes with its event, never before it (the event waits for its
// grant, and for its turn among max_events), so an event kept never lacks its
// requester, approver and reason.
std::string PruneForceReleasesStatement(const char* cutoff);

// INVALID_ARGUMENT unless 1 ms <= options.lock_wait <= kMaxLockWait. Zero is no
// bound at all to PostgreSQL (lock_timeout 0) and no wait to SQLite, and more
// than an hour would hold a caller past any deadline holdfastd sets.
inline constexpr std::chrono::milliseconds kMaxLockWait{3'600'000};
absl::Status ValidateStoreOptions(const StoreOptions& options);

// INVALID_ARGUMENT unless before_unix_ms > 0 and 1 <= max_events <= kMaxPruneEvents.
absl::Status ValidatePrune(int64_t before_unix_ms, int max_events);

// INVALID_ARGUMENT unless 1 <= epoch <= 32767 and reason is init|restore|rehome.
absl::Status ValidateEpochRow(const EpochRow& row);

// The FAILED_PRECONDITION of Record() for a cursor that would move back.
absl::Status CursorRegression(uint64_t cluster_id, int64_t stored, int64_t requested);

// The ALREADY_EXISTS of AppendEpoch() for a different row under the same key.
absl::Status EpochConflict(const EpochRow& stored);

bool SameEpochRow(const EpochRow& a, const EpochRow& b);

// Cluster ids are unsigned in etcd and stored bit-for-bit in signed columns.
inline int64_t ClusterToSql(uint64_t id) { return static_cast<int64_t>(id); }
inline uint64_t ClusterFromSql(int64_t v) { return static_cast<uint64_t>(v); }

// The wall clock, for applied_at / updated_at columns.
int64_t NowUnixMs();

// A SELECT over audit_event with the query's filters as numbered parameters:
// `placeholder` is '?' for SQLite (?1, ?2, ...) and '$' for PostgreSQL.
struct SqlParam {
  SqlParam(int64_t v) : integer(v) {}                             // NOLINT: implicit on purpose
  SqlParam(std::string v) : is_text(true), text(std::move(v)) {}  // NOLINT
  bool is_text = false;
  int64_t integer = 0;
  std::string text;
};
struct BuiltQuery {
  std::string sql;
  std::vector<SqlParam> params;
};
BuiltQuery BuildEventQuery(const AuditQuery& q, char placeholder);

// The time a query has left (at least 1 ms, at most 24 h), or none without a deadline;
// QueryOutOfTime when its deadline has passed. Asked once the store's
// connection is this query's, so the wait for it counts.
absl::StatusOr<std::optional<std::chrono::milliseconds>> QueryTimeLeft(const AuditQuery& q,
                                                                        absl::string_view store);
// DEADLINE_EXCEEDED: the query did not finish before its deadline. `store` is
// "sqlite" or "postgres".
absl::Status QueryOutOfTime(absl::string_view store);

}  // namespace holdfast::audit::internal
