// Epochs (ARCHITECTURE §6): the etcd record /holdfast/epoch and its history in the
// audit store, the restore guard, and the advance.
//
// Restore detection. A cluster restored from a snapshot must not mint tokens that
// were minted before. It is recognised by any of:
//   1. etcd's cluster id differs from the epoch record's (a restore with a new
//      --initial-cluster-token, or another cluster);
//   2. the history holds an epoch for this cluster above the record's (the record
//      itself came back from the snapshot);
//   3. etcd's revision is below the audit cursor of this cluster id (a restore that
//      kept the cluster id: same member names, peer URLs and cluster token).
// Until an advance, holdfastd refuses grants with FAILED_PRECONDITION naming the
// command to run (`holdfast epoch advance --reason restore`). The guard writes what
// it detected to etcd (/holdfast/restore-refusal, NoteRefusal), tied to the epoch
// record it found, so the refusal stands until an advance rewrites the record: rule
// 3 alone would lift itself once the restored cluster's revision climbed past the
// cursor (sessions, renewals, expiries) and grants would repeat the tokens between
// them; the note also holds across restarts of every replica.
//
// Rule 3 is as good as the audit cursor is recent: a restore from a snapshot taken
// after the cursor's revision (the auditor lags by about audit.flush_interval, more
// while the store is down) is not seen by it. Restore with a new cluster token
// (docs/operations.md), which rule 1 always sees.
//
// Advance: new epoch = 1 + max(the record's epoch, the history's highest); the
// history row is written first, then the record by compare-and-swap; if etcd's
// revision is below the cluster's audit cursor, the cursor is rewound to it (the
// auditor then resumes on the restored history). Tokens minted after an advance
// are above every token minted before, on any cluster, because the epoch is the
// token's high bits. Epochs stop at 2^15 − 1: an advance past it is refused.
//
// Thread-safe; blocking (Admin pool, start-up, the guard thread).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "audit/store.h"
#include "etcd/client.h"
#include "lock/records.pb.h"

namespace holdfast::audit {

struct EpochState {
  bool exists = false;               // /holdfast/epoch is there
  records::EpochRecord record;
  int64_t mod_revision = 0;
  uint64_t observed_cluster_id = 0;  // etcd's answer now
  int64_t revision = 0;              // etcd's revision now
  std::vector<EpochRow> history;     // empty without a store
  int32_t history_max = 0;
  std::optional<int64_t> cursor;     // the audit cursor of observed_cluster_id
  // What the guard noted, when it still names this record (see NoteRefusal).
  std::optional<records::RestoreRefusal> refusal;
  // Read(d, /*store_optional=*/true) when the store could not be read: then there
  // is no history and no cursor, and rules 2 and 3 are not checked.
  absl::Status store_error;
};

class Epochs {
 public:
  // `store` may be null (audit off): then there is no history and no cursor.
  Epochs(etcd::Client* etcd, AuditStore* store) : etcd_(etcd), store_(store) {}

  // The record, the refusal noted for it, etcd's cluster id and revision, and the
  // store's history and cursor. A store that cannot be read fails the read, unless
  // `store_optional` (the guard: rule 1 and a noted refusal need etcd only).
  absl::StatusOr<EpochState> Read(etcd::Deadline d, bool store_optional = false);

  // Why grants must wait for an advance ("" when they need not). Rules 1-3 above,
  // then a refusal noted for the current record; a missing record is the engine's
  // own refusal.
  static std::string RestoreReason(const EpochState& s);

  // Writes `reason` to /holdfast/restore-refusal for the record `s` read, guarded
  // by the record's mod revision (an advance in between wins). The first note
  // stands: a no-op when `s` carries one already, and without a record.
  absl::Status NoteRefusal(const EpochState& s, const std::string& reason, etcd::Deadline d);

  // The epoch a missing record is created with: 1, or above the history.
  absl::StatusOr<int32_t> BootstrapEpoch();

  // Writes the current record into the history if it is not there (idempotent):
  // the record holdfastd bootstrapped, or one written by hand.
  absl::Status RecordCurrent(etcd::Deadline d);

  // reason: "restore" | "rehome". The new epoch is 1 + max(the record, the
  // history's highest, `floor`): a rehome passes the highest epoch the moving
  // namespace's tokens carry, which the history may not know (audit.store: none).
  // The history row goes first, then the record by compare-and-swap; an advance
  // that loses the swap to another one below its epoch swaps again, so a history
  // row never stays above the record it was written for.
  // Errors: INVALID_ARGUMENT (reason), FAILED_PRECONDITION (past 2^15 − 1),
  // ABORTED (another advance took this epoch or went past it).
  absl::StatusOr<records::EpochRecord> Advance(const std::string& reason,
                                               const std::string& actor, etcd::Deadline d,
                                               int32_t floor = 0);

 private:
  etcd::Client* const etcd_;
  AuditStore* const store_;
};

}  // namespace holdfast::audit
