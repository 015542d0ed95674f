#include "audit/store.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "audit/store_internal.h"

namespace holdfast::audit {

const char* EventTypeName(EventType t) {
  switch (t) {
    case EventType::kGrant:
      return "grant";
    case EventType::kRelease:
      return "release";
    case EventType::kExpire:
      return "expire";
    case EventType::kForce:
      return "force";
  }
  return "unknown";
}

std::optional<EventType> ParseEventType(std::string_view s) {
  for (EventType t :
       {EventType::kGrant, EventType::kRelease, EventType::kExpire, EventType::kForce}) {
    if (s == EventTypeName(t)) return t;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<AuditStore>> OpenStore(const std::string& url,
                                                      const StoreOptions& options) {
  constexpr const char* kExpected =
      "expected sqlite:///absolute/path.db, sqlite:relative/path.db, postgresql://... or "
      "postgres://...";
  if (url.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("audit store URL is empty; ", kExpected));
  }
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "sqlite:")) {
    // "sqlite://" introduces an authority in URL syntax; only an empty one
    // ("sqlite:///abs") is meaningful for a local file.
    if (absl::ConsumePrefix(&rest, "//") && !absl::StartsWith(rest, "/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "audit store URL \"", url,
          "\": sqlite:// must be followed by an absolute path "
          "(sqlite:///abs/path.db); a relative path is written sqlite:relative/path.db"));
    }
    if (rest.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("audit store URL \"", url, "\" names no file; ", kExpected));
    }
    if (rest == ":memory:") {
      // SQLite's in-memory database: gone when holdfastd stops (the audit trail
      // must outlive it), and private to one connection, while holdfastd opens
      // several (one per cluster's auditor, one for queries and epochs).
      return absl::InvalidArgumentError(absl::StrCat(
          "audit store URL \"", url,
          "\": an in-memory SQLite database would lose the audit trail when holdfastd "
          "stops, and each of holdfastd's connections would see a database of its own; "
          "name a file (sqlite:///absolute/path.db or sqlite:relative/path.db)"));
    }
    return OpenSqliteStore(std::string(rest), options);
  }
  if (absl::StartsWith(url, "postgresql://") || absl::StartsWith(url, "postgres://")) {
    return OpenPostgresStore(url, options);
  }
  // Only the scheme is echoed: the rest may hold a password.
  auto colon = url.find(':');
  bool has_scheme = colon != std::string::npos && colon > 0 && absl::ascii_isalpha(url[0]);
  for (size_t i = 0; has_scheme && i < colon; ++i) {
    char c = url[i];
    has_scheme = absl::ascii_isalnum(c) || c == '+' || c == '-' || c == '.';
  }
  if (!has_scheme) {
    return absl::InvalidArgumentError(absl::StrCat("audit store URL has no scheme; ", kExpected));
  }
  return absl::InvalidArgumentError(absl::StrCat("audit store URL scheme \"", url.substr(0, colon),
                                                 "\" is not supported; ", kExpected));
}

namespace {
// Where CursorRegression marks its status (IsCursorRegression).
constexpr char kCursorRegressionPayload[] = "holdfast.audit/cursor_regression";
}  // namespace

bool IsCursorRegression(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition &&
         s.GetPayload(kCursorRegressionPayload).has_value();
}

namespace internal {

int ClampLimit(int limit) { return std::clamp(limit, 1, kMaxRows); }

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

absl::Status ValidateBatch(uint64_t cluster_id, const std::vector<AuditEvent>& events,
                           const std::vector<ForceReleaseRow>& forces) {
  for (const AuditEvent& e : events) {
    if (e.cluster_id != cluster_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "audit event at revision ", e.revision, " belongs to cluster ", absl::Hex(e.cluster_id),
          ", not to cluster ", absl::Hex(cluster_id), " whose cursor the batch moves"));
    }
    if (!ParseEventType(EventTypeName(e.type))) {
      return absl::InvalidArgumentError(absl::StrCat("audit event at revision ", e.revision,
                                                     " has no valid type (",
                                                     static_cast<int>(e.type), ")"));
    }
  }
  for (const ForceReleaseRow& f : forces) {
    if (f.cluster_id != cluster_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "force_release ", f.request_id, " belongs to cluster ", absl::Hex(f.cluster_id),
          ", not to cluster ", absl::Hex(cluster_id), " whose cursor the batch moves"));
    }
  }
  return absl::OkStatus();
}

std::string PruneForceReleasesStatement(const char* cutoff) {
  return absl::StrCat(
      "DELETE FROM force_release WHERE approved_at_unix_ms < ", cutoff,
      " AND NOT EXISTS (SELECT 1 FROM audit_event e WHERE e.cluster_id = "
      "force_release.cluster_id AND e.revision = force_release.revision AND e.namespace = "
      "force_release.namespace AND e.lock_key = force_release.lock_key AND e.session_id = "
      "force_release.session_id)");
}

std::string PruneStatement(bool with_grants, const char* row_id, const char* cutoff,
                           const char* limit) {
  // x: the candidate; y: another event of the same hold (cluster, namespace, key,
  // session): a grant goes once its end (a later non-grant) is there, an end once
  // no grant before it is left.
  constexpr const char* kSameHold =
      "SELECT 1 FROM audit_event y WHERE y.namespace = x.namespace AND "
      "y.lock_key = x.lock_key AND y.cluster_id = x.cluster_id AND "
      "y.session_id = x.session_id AND ";
  const std::string end_gone = absl::StrCat(
      "(x.type <> 'grant' AND NOT EXISTS (", kSameHold,
      "y.revision < x.revision AND y.type = 'grant'))");
  const std::string ended = absl::StrCat("(x.type = 'grant' AND EXISTS (", kSameHold,
                                         "y.revision > x.revision AND y.type <> 'grant'))");
  return absl::StrCat("DELETE FROM audit_event WHERE ", row_id, " IN (SELECT x.", row_id,
                      " FROM audit_event x WHERE x.time_unix_ms < ", cutoff, " AND ",
                      with_grants ? absl::StrCat("(", ended, " OR ", end_gone, ")") : end_gone,
                      " ORDER BY x.time_unix_ms LIMIT ", limit, ")");
}

absl::StatusOr<std::optional<std::chrono::milliseconds>> QueryTimeLeft(const AuditQuery& q,
                                                                        absl::string_view store) {
  if (!q.deadline) return std::optional<std::chrono::milliseconds>();
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*q.deadline -
                                                            std::chrono::steady_clock::now());
  if (left <= std::chrono::milliseconds(0)) return QueryOutOfTime(store);
  // PostgreSQL's statement_timeout stops at INT_MAX ms (24.8 days).
  return std::optional<std::chrono::milliseconds>(std::min<std::chrono::milliseconds>(
      left, std::chrono::hours(24)));
}

absl::Status QueryOutOfTime(absl::string_view store) {
  return absl::DeadlineExceededError(absl::StrCat(
      store, " audit store: the query did not finish before its deadline (a read of one "
             "cluster, or narrower filters, reads less)"));
}

absl::Status ValidateStoreOptions(const StoreOptions& options) {
  if (options.lock_wait < std::chrono::milliseconds(1) || options.lock_wait > kMaxLockWait) {
    return absl::InvalidArgumentError(
        absl::StrCat("audit store: lock_wait must be between 1ms and ", kMaxLockWait.count(),
                     "ms, not ", options.lock_wait.count(), "ms"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrune(int64_t before_unix_ms, int max_events) {
  if (before_unix_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prune: the cutoff must be a positive unix time in ms, not ", before_unix_ms));
  }
  if (max_events < 1 || max_events > AuditStore::kMaxPruneEvents) {
    return absl::InvalidArgumentError(absl::StrCat("prune: max_events ", max_events,
                                                   " is outside 1..", AuditStore::kMaxPruneEvents));
  }
  return absl::OkStatus();
}

absl::Status ValidateEpochRow(const EpochRow& row) {
  if (row.epoch < 1 || row.epoch > 32767) {
    return absl::InvalidArgumentError(absl::StrCat("epoch ", row.epoch, " is outside 1..32767"));
  }
  if (row.reason != "init" && row.reason != "restore" && row.reason != "rehome") {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch reason \"", row.reason, "\" is not one of init, restore, rehome"));
  }
  return absl::OkStatus();
}

absl::Status CursorRegression(uint64_t cluster_id, int64_t stored, int64_t requested) {
  absl::Status s = absl::FailedPreconditionError(
      absl::StrCat("audit cursor of cluster ", absl::Hex(cluster_id), " is at revision ", stored,
                   "; refusing to move it back to ", requested, " (nothing was written)"));
  s.SetPayload(kCursorRegressionPayload, absl::Cord("1"));
  return s;
}

absl::Status EpochConflict(const EpochRow& stored) {
  return absl::AlreadyExistsError(
      absl::StrCat("epoch ", stored.epoch, " of cluster ", absl::Hex(stored.cluster_id),
                   " is already recorded (", stored.reason, " by ", stored.actor, " at unix ms ",
                   stored.advanced_at_unix_ms, ")"));
}

bool SameEpochRow(const EpochRow& a, const EpochRow& b) {
  return a.epoch == b.epoch && a.cluster_id == b.cluster_id &&
         a.advanced_at_unix_ms == b.advanced_at_unix_ms && a.reason == b.reason &&
         a.actor == b.actor;
}

BuiltQuery BuildEventQuery(const AuditQuery& q, char placeholder) {
  BuiltQuery out;
  // A force event comes with its force_release row (the two people and why),
  // by the same five columns: at most one row each.
  out.sql =
      "SELECT e.cluster_id, e.revision, e.namespace, e.lock_key, e.session_id, e.type, "
      "e.spiffe_id, e.token, e.unprotected, e.time_unix_ms, f.request_id, f.requester, "
      "f.approver, f.reason, f.class_was_fenced FROM audit_event e LEFT JOIN force_release f "
      "ON e.type = 'force' AND f.cluster_id = e.cluster_id AND f.revision = e.revision AND "
      "f.namespace = e.namespace AND f.lock_key = e.lock_key AND f.session_id = e.session_id";
  const char* glue = " WHERE ";
  auto add = [&](const char* condition, SqlParam value) {
    out.params.push_back(std::move(value));
    absl::StrAppend(&out.sql, glue, condition, " ", std::string(1, placeholder), out.params.size());
    glue = " AND ";
  };
  if (q.cluster_id) add("e.cluster_id =", ClusterToSql(*q.cluster_id));
  if (!q.ns.empty()) add("e.namespace =", q.ns);
  if (!q.lock_key.empty()) add("e.lock_key =", q.lock_key);
  if (q.type) add("e.type =", std::string(EventTypeName(*q.type)));
  if (!q.spiffe_id.empty()) add("e.spiffe_id =", q.spiffe_id);
  if (q.since_unix_ms != 0) add("e.time_unix_ms >=", q.since_unix_ms);
  if (q.after_revision != 0) add("e.revision >", q.after_revision);
  if (q.after_event) {
    // A row value compares column by column, as ORDER BY below does. The plain
    // revision bound beside it lets a store that does not seek on a row value
    // still seek the primary key (cluster_id, revision, ...): a follower's poll
    // reads from its place on, not the cluster's whole trail.
    const AuditEventKey& k = *q.after_event;
    add("e.revision >=", k.revision);
    std::vector<SqlParam> values = {k.revision, k.ns, k.lock_key, k.session_id,
                                    ClusterToSql(k.cluster_id)};
    absl::StrAppend(&out.sql, glue,
                    "(e.revision, e.namespace, e.lock_key, e.session_id, e.cluster_id) > (");
    for (size_t i = 0; i < values.size(); ++i) {
      out.params.push_back(std::move(values[i]));
      absl::StrAppend(&out.sql, i == 0 ? "" : ", ", std::string(1, placeholder),
                      out.params.size());
    }
    absl::StrAppend(&out.sql, ")");
    glue = " AND ";
  }
  // cluster_id last only makes the order total when several clusters answer.
  absl::StrAppend(&out.sql,
                  " ORDER BY e.revision, e.namespace, e.lock_key, e.session_id, e.cluster_id");
  out.params.push_back(int64_t{ClampLimit(q.limit)});
  absl::StrAppend(&out.sql, " LIMIT ", std::string(1, placeholder), out.params.size());
  return out;
}

}  // namespace internal

}  // namespace holdfast::audit
