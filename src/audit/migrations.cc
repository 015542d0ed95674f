#include "audit/migrations.h"

namespace holdfast::audit {
namespace {

// Version 1: the tables of ARCHITECTURE §2 and §7 (see store.h for their keys).
// Namespaces and lock keys compare as bytes in both dialects (SQLite's BINARY;
// PostgreSQL's "C" collation, whatever the database's locale), so both stores
// return Query() results in the same order.
constexpr const char* kV1Sqlite = R"sql(
CREATE TABLE audit_event (
  cluster_id    INTEGER NOT NULL,
  revision      INTEGER NOT NULL,
  namespace     TEXT    NOT NULL,
  lock_key      TEXT    NOT NULL,
  session_id    INTEGER NOT NULL,
  type          TEXT    NOT NULL CHECK (type IN ('grant', 'release', 'expire', 'force')),
  spiffe_id     TEXT    NOT NULL,
  token         INTEGER NOT NULL,
  unprotected   INTEGER NOT NULL CHECK (unprotected IN (0, 1)),
  time_unix_ms  INTEGER NOT NULL,
  PRIMARY KEY (cluster_id, revision, namespace, lock_key, session_id)
);
CREATE INDEX audit_event_by_key ON audit_event (namespace, lock_key, revision);
CREATE INDEX audit_event_by_identity ON audit_event (spiffe_id, revision);
CREATE INDEX audit_event_by_time ON audit_event (time_unix_ms);
CREATE TABLE force_release (
  request_id            TEXT    PRIMARY KEY,
  cluster_id            INTEGER NOT NULL,
  revision              INTEGER NOT NULL,
  namespace             TEXT    NOT NULL,
  lock_key              TEXT    NOT NULL,
  session_id            INTEGER NOT NULL,
  token                 INTEGER NOT NULL,
  requester             TEXT    NOT NULL,
  approver              TEXT    NOT NULL CHECK (approver <> requester),
  reason                TEXT    NOT NULL,
  class_was_fenced      INTEGER NOT NULL CHECK (class_was_fenced IN (0, 1)),
  requested_at_unix_ms  INTEGER NOT NULL,
  approved_at_unix_ms   INTEGER NOT NULL
);
CREATE INDEX force_release_by_revision ON force_release (cluster_id, revision);
CREATE TABLE epoch (
  epoch                INTEGER NOT NULL CHECK (epoch BETWEEN 1 AND 32767),
  cluster_id           INTEGER NOT NULL,
  advanced_at_unix_ms  INTEGER NOT NULL,
  reason               TEXT    NOT NULL CHECK (reason IN ('init', 'restore', 'rehome')),
  actor                TEXT    NOT NULL,
  PRIMARY KEY (epoch, cluster_id)
);
CREATE TABLE audit_cursor (
  cluster_id          INTEGER PRIMARY KEY,
  revision            INTEGER NOT NULL,
  updated_at_unix_ms  INTEGER NOT NULL
)
)sql";

constexpr const char* kV1Postgres = R"sql(
CREATE TABLE audit_event (
  cluster_id    BIGINT  NOT NULL,
  revision      BIGINT  NOT NULL,
  namespace     TEXT    COLLATE "C" NOT NULL,
  lock_key      TEXT    COLLATE "C" NOT NULL,
  session_id    BIGINT  NOT NULL,
  type          TEXT    NOT NULL CHECK (type IN ('grant', 'release', 'expire', 'force')),
  spiffe_id     TEXT    NOT NULL,
  token         BIGINT  NOT NULL,
  unprotected   BOOLEAN NOT NULL,
  time_unix_ms  BIGINT  NOT NULL,
  PRIMARY KEY (cluster_id, revision, namespace, lock_key, session_id)
);
CREATE INDEX audit_event_by_key ON audit_event (namespace, lock_key, revision);
CREATE INDEX audit_event_by_identity ON audit_event (spiffe_id, revision);
CREATE INDEX audit_event_by_time ON audit_event (time_unix_ms);
CREATE TABLE force_release (
  request_id            TEXT    PRIMARY KEY,
  cluster_id            BIGINT  NOT NULL,
  revision              BIGINT  NOT NULL,
  namespace             TEXT    COLLATE "C" NOT NULL,
  lock_key              TEXT    COLLATE "C" NOT NULL,
  session_id            BIGINT  NOT NULL,
  token                 BIGINT  NOT NULL,
  requester             TEXT    NOT NULL,
  approver              TEXT    NOT NULL CHECK (approver <> requester),
  reason                TEXT    NOT NULL,
  class_was_fenced      BOOLEAN NOT NULL,
  requested_at_unix_ms  BIGINT  NOT NULL,
  approved_at_unix_ms   BIGINT  NOT NULL
);
CREATE INDEX force_release_by_revision ON force_release (cluster_id, revision);
CREATE TABLE epoch (
  epoch                INTEGER NOT NULL CHECK (epoch BETWEEN 1 AND 32767),
  cluster_id           BIGINT  NOT NULL,
  advanced_at_unix_ms  BIGINT  NOT NULL,
  reason               TEXT    NOT NULL CHECK (reason IN ('init', 'restore', 'rehome')),
  actor                TEXT    NOT NULL,
  PRIMARY KEY (epoch, cluster_id)
);
CREATE TABLE audit_cursor (
  cluster_id          BIGINT PRIMARY KEY,
  revision            BIGINT NOT NULL,
  updated_at_unix_ms  BIGINT NOT NULL
)
)sql";

constexpr Migration kMigrations[] = {
    {1, "audit_event, force_release, epoch, audit_cursor", kV1Sqlite, kV1Postgres},
};

}  // namespace

std::span<const Migration> Migrations() { return kMigrations; }

}  // namespace holdfast::audit
