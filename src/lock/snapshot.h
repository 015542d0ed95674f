// What the lock engine reads about one lock key in one etcd round trip. The same
// seven ranges are the read transaction and the else branch of every grant, enqueue
// and release transaction, so a lost race re-decides without re-reading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "holdfast/v1/types.pb.h"
#include "lock/records.pb.h"

namespace holdfast::lock {

struct HoldEntry {
  int64_t lease = 0;
  int64_t create_revision = 0;
  records::HoldRecord record;
  // Of `record`, when read from etcd (ParseSnapshot); 0 where it was not (views, a
  // grant's own commit). Releasing a hold granted before an epoch advance needs it.
  int64_t mod_revision = 0;
};

struct WaiterEntry {
  int64_t lease = 0;
  int64_t create_revision = 0;  // the queue position
  records::WaiterRecord record;
  int64_t mod_revision = 0;     // of `record` (a retry re-puts it in place)
};

struct ClassEntry {
  std::string class_id;
  int64_t mod_revision = 0;
  records::ClassRecord record;
};

struct EpochEntry {
  records::EpochRecord record;
  int64_t mod_revision = 0;
};

// The state of one (namespace, session, lock key) at one etcd revision.
struct KeySnapshot {
  int64_t revision = 0;        // the read's header revision
  uint64_t cluster_id = 0;     // the read's header cluster id
  bool namespace_exists = false;
  records::NamespaceRecord ns_record;
  int64_t ns_mod_revision = 0;
  std::optional<records::SessionRecord> session;
  int64_t session_mod_revision = 0;
  std::optional<EpochEntry> epoch;
  std::vector<ClassEntry> classes;
  std::vector<HoldEntry> holds;  // every hold of the lock key, in key order
  std::vector<WaiterEntry> waiters;  // every waiter of the lock key, in queue order
  int64_t session_claims = 0;  // lock keys the session holds or waits for (keyspace::ClaimKey)
};

// Adds to `txn` the deletion of the claim of a dead waiter of `lock_key` (one
// deleted in the same transaction), unless its session holds the key, as
// `snap` shows: then the claim is the hold's too (a waiter put from a stale view
// while the session held the key). Guarded by "no hold of that session on the
// key", for one granted since the snapshot.
void DeleteClaimOfDeadWaiter(const KeySnapshot& snap, const std::string& ns,
                             const std::string& lock_key, int64_t lease,
                             etcdserverpb::TxnRequest* txn);

// Adds to `txn` the removal of `dead`, a dead waiter of `lock_key` in `snap`:
// its wait key, guarded by its record as read (a retried acquire that took it
// over in place since, with a later deadline, is alive: the compare fails), and
// its claim (DeleteClaimOfDeadWaiter).
void RemoveDeadWaiter(const KeySnapshot& snap, const std::string& ns,
                      const std::string& lock_key, const WaiterEntry& dead,
                      etcdserverpb::TxnRequest* txn);

// Appends the snapshot's range requests to a txn branch (success or failure).
void AddSnapshotReads(const std::string& ns, int64_t session, const std::string& lock_key,
                      google::protobuf::RepeatedPtrField<etcdserverpb::RequestOp>* ops);
// Parses the responses that AddSnapshotReads asked for, starting at `first`.
absl::StatusOr<KeySnapshot> ParseSnapshot(const etcdserverpb::ResponseHeader& header,
                                          const google::protobuf::RepeatedPtrField<
                                              etcdserverpb::ResponseOp>& responses,
                                          int first = 0);

// The key's part of the snapshot alone: its holds, its waiters and the count of
// the session's claims (three ranges). For a transaction whose compares already
// pin the rest (the namespace and session records by mod revision, no class
// changed, the epoch record by mod revision), so that the snapshot's other parts
// are what the caller saw: etcd reads only what the transaction may have changed.
void AddKeyReads(const std::string& ns, int64_t session, const std::string& lock_key,
                 google::protobuf::RepeatedPtrField<etcdserverpb::RequestOp>* ops);
// Fills `snap`'s revision, cluster id, holds, waiters and session_claims from the
// responses that AddKeyReads asked for, starting at `first`; leaves the rest.
absl::Status ParseKeyReads(const etcdserverpb::ResponseHeader& header,
                           const google::protobuf::RepeatedPtrField<etcdserverpb::ResponseOp>&
                               responses,
                           int first, KeySnapshot* snap);

// The class whose key_prefix is the longest prefix of `lock_key` (nullptr: none).
const ClassEntry* ResolveClass(const std::vector<ClassEntry>& classes, const std::string& lock_key);

// FAILED_PRECONDITION unless the epoch record exists, is usable, and belongs to
// the etcd cluster that answered (ARCHITECTURE §6, invariant 8).
absl::Status CheckEpoch(const std::optional<EpochEntry>& epoch, uint64_t answering_cluster_id);

// Builds the public view of a hold (class policy from `classes`, when found there).
v1::HoldInfo MakeHoldInfo(const std::string& lock_key, const HoldEntry& hold,
                          const std::vector<ClassEntry>& classes = {});
v1::WaiterInfo MakeWaiterInfo(const std::string& lock_key, const WaiterEntry& waiter);

}  // namespace holdfast::lock
