#include "audit/epochs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "lock/keyspace.h"
#include "lock/token.h"
#include "lock/txn_util.h"

namespace holdfast::audit {
namespace {
namespace pb = ::etcdserverpb;
}  // namespace

absl::StatusOr<EpochState> Epochs::Read(etcd::Deadline d, bool store_optional) {
  EpochState s;
  pb::RangeRequest r;
  r.set_key(keyspace::EpochKey());
  // The audit cursor is read BEFORE the revision it is compared with: the cursor
  // only ever names revisions etcd has committed, so on a cluster that was not
  // restored it cannot be above a revision read after it (read the other way
  // round, an auditor recording in between would look like a restore).
  std::optional<int64_t> cursor;
  uint64_t cursor_cluster = 0;
  if (store_ != nullptr) {
    HF_ASSIGN_OR_RETURN(auto first, etcd_->RangeSync(r, d));
    cursor_cluster = first.header().cluster_id();
    auto got = store_->Cursor(cursor_cluster);
    if (got.ok()) {
      cursor = *got;
    } else if (store_optional) {
      s.store_error = got.status();
    } else {
      return got.status();
    }
  }
  // The record and the refusal noted for it, at one revision.
  pb::TxnRequest both;
  *both.add_success()->mutable_request_range() = r;
  both.add_success()->mutable_request_range()->set_key(keyspace::RestoreRefusalKey());
  HF_ASSIGN_OR_RETURN(auto got, etcd_->TxnSync(std::move(both), d));
  if (got.responses_size() != 2) {
    return absl::InternalError("etcd answered the epoch read with the wrong number of ranges");
  }
  const auto& record = got.responses(0).response_range();
  const auto& refusal = got.responses(1).response_range();
  s.observed_cluster_id = got.header().cluster_id();
  s.revision = got.header().revision();
  if (record.kvs_size() > 0) {
    if (!s.record.ParseFromString(record.kvs(0).value())) {
      return absl::DataLossError("corrupt epoch record in etcd (/holdfast/epoch)");
    }
    s.exists = true;
    s.mod_revision = record.kvs(0).mod_revision();
  }
  if (refusal.kvs_size() > 0) {
    records::RestoreRefusal noted;
    if (!noted.ParseFromString(refusal.kvs(0).value())) {
      // Unreadable, it still says a restore was seen: refuse rather than forget.
      noted.set_reason("corrupt restore refusal in etcd (/holdfast/restore-refusal)");
      noted.set_record_mod_revision(s.mod_revision);
    }
    if (s.exists && noted.record_mod_revision() == s.mod_revision) s.refusal = std::move(noted);
  }
  if (store_ != nullptr && s.store_error.ok()) {
    auto history = store_->Epochs();
    if (history.ok()) {
      s.history = std::move(*history);
      for (const auto& row : s.history) s.history_max = std::max(s.history_max, row.epoch);
      // The cluster changed between the two reads: no comparison this time (the
      // cluster-id check catches that case).
      if (cursor_cluster == s.observed_cluster_id) s.cursor = cursor;
    } else if (store_optional) {
      s.store_error = history.status();
    } else {
      return history.status();
    }
  }
  return s;
}

std::string Epochs::RestoreReason(const EpochState& s) {
  const std::string fix = "; run `holdfast epoch advance --reason restore` (docs/operations.md)";
  if (!s.exists) return "";
  if (s.record.etcd_cluster_id() != s.observed_cluster_id) {
    return absl::StrCat("etcd cluster id ", s.observed_cluster_id,
                        " differs from the epoch record's (", s.record.etcd_cluster_id(),
                        "): the cluster was restored or replaced, so grants are refused", fix);
  }
  for (const auto& row : s.history) {
    if (row.cluster_id == s.observed_cluster_id && row.epoch > s.record.epoch()) {
      return absl::StrCat("the epoch record says epoch ", s.record.epoch(),
                          " but epoch ", row.epoch, " was used on this cluster before: the "
                          "record came back from a snapshot (or an advance to it was cut "
                          "short), so grants are refused", fix);
    }
  }
  if (s.cursor && s.revision < *s.cursor) {
    return absl::StrCat("etcd's revision ", s.revision, " is below the audit cursor ", *s.cursor,
                        " of this cluster: it was restored from a snapshot, so its revisions "
                        "(and tokens) would repeat; grants are refused", fix);
  }
  if (s.refusal) return s.refusal->reason();
  return "";
}

absl::Status Epochs::NoteRefusal(const EpochState& s, const std::string& reason,
                                 etcd::Deadline d) {
  if (!s.exists || reason.empty() || s.refusal) {
    return absl::OkStatus();
  }
  records::RestoreRefusal noted;
  noted.set_record_mod_revision(s.mod_revision);
  noted.set_reason(reason);
  noted.set_detected_at_unix_ms(lock::NowUnixMs());
  pb::TxnRequest txn;
  lock::AddCompare(&txn, keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(s.mod_revision);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::RestoreRefusalKey());
  put->set_value(noted.SerializeAsString());
  HF_ASSIGN_OR_RETURN(auto t, etcd_->TxnSync(std::move(txn), d));
  // Not succeeded: the record changed since `s` (an advance); nothing to note.
  (void)t;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Epochs::BootstrapEpoch() {
  if (store_ == nullptr) return 1;
  HF_ASSIGN_OR_RETURN(int32_t max, store_->MaxEpoch());
  if (max >= token::kMaxEpoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("the epoch history reached ", max, " = 2^15 - 1: no epoch is left"));
  }
  return max + 1;
}

absl::Status Epochs::RecordCurrent(etcd::Deadline d) {
  if (store_ == nullptr) return absl::OkStatus();
  HF_ASSIGN_OR_RETURN(EpochState s, Read(d));
  if (!s.exists) return absl::OkStatus();
  for (const auto& row : s.history) {
    if (row.epoch == s.record.epoch() && row.cluster_id == s.record.etcd_cluster_id()) {
      return absl::OkStatus();
    }
  }
  EpochRow row;
  row.epoch = s.record.epoch();
  row.cluster_id = s.record.etcd_cluster_id();
  row.advanced_at_unix_ms = s.record.advanced_at_unix_ms();
  row.reason = s.record.reason().empty() ? "init" : s.record.reason();
  row.actor = "holdfastd";
  absl::Status appended = store_->AppendEpoch(row);
  // Another replica wrote it first: fine.
  if (appended.code() == absl::StatusCode::kAlreadyExists) return absl::OkStatus();
  return appended;
}

absl::StatusOr<records::EpochRecord> Epochs::Advance(const std::string& reason,
                                                    const std::string& actor, etcd::Deadline d,
                                                    int32_t floor) {
  if (reason != "restore" && reason != "rehome") {
    return absl::InvalidArgumentError(
        absl::StrCat("--reason \"", reason, "\": use restore or rehome"));
  }
  if (floor < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--min-epoch ", floor, " is negative"));
  }
  if (store_ == nullptr && reason == "restore" && floor == 0) {
    // The record came back with the snapshot, and nothing else remembers the
    // epochs used since: 1 + the record's could be one already used, and its
    // tokens would repeat (a second restore of the same snapshot, say).
    return absl::FailedPreconditionError(
        "this holdfastd has no audit store (audit.store: none), so no epoch history: the "
        "restored epoch record may be older than epochs already used, and an advance from it "
        "could repeat tokens. Give the highest epoch this cluster has had: holdfast epoch "
        "advance --reason restore --min-epoch N (N from `holdfast epoch show` before the "
        "restore, or from any token a resource has seen: token >> 48); nothing changed");
  }
  HF_ASSIGN_OR_RETURN(EpochState s, Read(d));
  const int32_t current = s.exists ? s.record.epoch() : 0;
  const int32_t next = 1 + std::max({current, s.history_max, floor});
  if (next > token::kMaxEpoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot advance past epoch ", next - 1, ": epochs stop at 32767 (2^15 - 1, the "
        "token's high bits); nothing changed"));
  }
  records::EpochRecord rec;
  rec.set_epoch(next);
  rec.set_etcd_cluster_id(s.observed_cluster_id);
  rec.set_advanced_at_unix_ms(lock::NowUnixMs());
  rec.set_reason(reason);
  // History first: once etcd has the record, the history already knows the epoch.
  if (store_ != nullptr) {
    EpochRow row;
    row.epoch = next;
    row.cluster_id = s.observed_cluster_id;
    row.advanced_at_unix_ms = rec.advanced_at_unix_ms();
    row.reason = reason;
    row.actor = actor;
    absl::Status appended = store_->AppendEpoch(row);
    if (appended.code() == absl::StatusCode::kAlreadyExists) {
      return absl::AbortedError(absl::StrCat("epoch ", next, " was just taken by another "
                                             "advance; run `holdfast epoch show`"));
    }
    HF_RETURN_IF_ERROR(appended);
    if (s.cursor && s.revision < *s.cursor) {
      HF_RETURN_IF_ERROR(store_->RewindCursor(s.observed_cluster_id, s.revision));
    }
  }
  // Another advance may swap its record in between. One below `next` (it read
  // before this one's history row) is swapped over: its history row and this one
  // are both there, and the record ends at the higher. Left below, this row would
  // read as "the record came back from a snapshot" and refuse every grant.
  for (int attempt = 0;; ++attempt) {
    pb::TxnRequest txn;
    auto* c = lock::AddCompare(&txn, keyspace::EpochKey(),
                               s.exists ? pb::Compare::MOD : pb::Compare::CREATE,
                               pb::Compare::EQUAL);
    if (s.exists) {
      c->set_mod_revision(s.mod_revision);
    } else {
      c->set_create_revision(0);
    }
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::EpochKey());
    put->set_value(rec.SerializeAsString());
    // The refusal the guard noted names the record replaced here: gone with it.
    txn.add_success()->mutable_request_delete_range()->set_key(keyspace::RestoreRefusalKey());
    HF_ASSIGN_OR_RETURN(auto t, etcd_->TxnSync(std::move(txn), d));
    if (t.succeeded()) return rec;
    HF_ASSIGN_OR_RETURN(s, Read(d));
    if (attempt == 4 || s.observed_cluster_id != rec.etcd_cluster_id() ||
        (s.exists && s.record.epoch() >= next)) {
      return absl::AbortedError(absl::StrCat(
          "the epoch record changed while advancing to ", next, " (another advance?); the record "
          "is now epoch ", s.exists ? s.record.epoch() : 0, ": run `holdfast epoch show`"));
    }
  }
}

}  // namespace holdfast::audit
