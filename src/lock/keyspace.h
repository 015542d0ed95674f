// etcd key space, version 1. DO NOT CHANGE without a migration: these keys are
// persisted. The one place where holdfast builds or parses etcd keys.
//
//   /holdfast/epoch                                  EpochRecord
//   /holdfast/ns/<ns>                                NamespaceRecord
//   /holdfast/ns/<ns>/class/<class_id>               ClassRecord
//   /holdfast/ns/<ns>/session/<lease:016x>           SessionRecord, on <lease>
//   /holdfast/ns/<ns>/hold/<lock_key>\0<lease:016x>  HoldRecord, on <lease>
//   /holdfast/ns/<ns>/wait/<lock_key>\0<lease:016x>  WaiterRecord, on <lease>
//   /holdfast/ns/<ns>/slot/<index:08d>               session id (decimal), on the session's
//                                                    lease: one of held_lease_quota slots
//   /holdfast/ns/<ns>/claim/<lease:016x>/<lock_key>  empty, on <lease>: the session holds or
//                                                    waits for <lock_key> (counted against
//                                                    limits.max_holds_per_session)
//   /holdfast/audit/mark                             AuditMark, put by every release and
//                                                    force-release transaction
//   /holdfast/audit/leader                           the auditor's replica id, on its lease
//   /holdfast/force/<request_id>                     ForceRequestRecord, on a lease whose
//                                                    TTL is the request's lifetime
//   /holdfast/replica/<lease:016x>                   ReplicaRecord: one live holdfastd,
//                                                    on its own lease (op_rate_quota)
//   /holdfast/placement/<ns>                         PlacementRecord, control cluster only:
//                                                    the namespace's home cluster and a
//                                                    rehome in progress
//
// Several etcd clusters (holdfastd's `clusters:` config). Every cluster has the
// whole layout above for the namespaces it homes, and its own /holdfast/epoch,
// audit mark, auditor and force requests. One cluster is the control cluster:
// it alone has /holdfast/placement/, and every replica watches and caches that
// prefix to route each request to the namespace's home by its name (session ids
// are lease ids, unique per cluster only, so they never route). A namespace
// without a placement record is homed on the control cluster, so the default
// single-cluster install (today's `etcd:` section) has no placement records and
// the layout it always had.
//   Departure from ARCHITECTURE §2: the namespace and class records live on the
// namespace's HOME cluster, not on the control cluster, because every grant
// guards on its class record's mod_revision, and a compare can only name a key
// of the cluster the transaction runs on. The control cluster's placement
// records are the registry of names: a namespace is created by a guarded
// transaction on the control cluster (no placement record and no namespace
// record there) before its records are written on its home.
//
// <ns> and <class_id> match [a-z0-9][a-z0-9._-]{0,62}, so they hold no '/'.
// <lock_key> is 1..512 bytes of UTF-8 without control characters (no NUL), stored
// raw; NUL (0x00) separates it from the lease. <lease> is 16 lower-case hex digits.
//
// Invariants (keyspace_test pins the encoding):
//   K1. lock keys "a" and "a/b" never share a range: the holds of "a" are exactly
//       [hold/a\0, hold/a\1), and no other lock key's hold starts with "a\0".
//   K2. every session, hold and waiter key is attached to the lease it names.
//   K3. a hold's token is epoch<<48 | its create_revision; successive holds of a
//       key have increasing tokens (revisions only grow, epochs only grow).
//   K4. a namespace has holds on one cluster at most: a rehome seals the old
//       home (no hold, and no grant can commit there: the seal rewrites every
//       class record) before the new home's records are written, and the new
//       home's epoch is above every epoch any token of the namespace carries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "common/names.h"

namespace holdfast::keyspace {

inline constexpr absl::string_view kRoot = "/holdfast/";
inline constexpr char kLeaseSeparator = '\0';

// --- validation (INVALID_ARGUMENT with the reason; see common/names.h)
using names::kMaxLockKeyBytes;
using names::kMaxNameBytes;
using names::ValidateClassId;
using names::ValidateKeyPrefix;
using names::ValidateLockKey;
using names::ValidateNamespaceName;

// --- keys
std::string EpochKey();
// A restore the epoch guard detected (records::RestoreRefusal, audit/epochs.h).
std::string RestoreRefusalKey();
// Put in the same commit as every release and force (AuditMark).
std::string AuditMarkKey();
// The auditor's leader-election key.
std::string AuditorKey();
// Pending force-release requests; <request_id> is 16 lower-case hex digits.
std::string ForceRequestKey(absl::string_view request_id);
std::string ForceRequestPrefix();
// Live holdfastd replicas, one key each, named by and attached to the replica's
// own lease: [ReplicaPrefix, PrefixEnd(ReplicaPrefix)) is the replica set.
std::string ReplicaKey(int64_t lease);
std::string ReplicaPrefix();
std::optional<int64_t> ParseReplicaKey(absl::string_view key);
// Placement of namespaces on clusters (control cluster only).
std::string PlacementKey(absl::string_view ns);
std::string PlacementPrefix();
std::optional<std::string> ParsePlacementKey(absl::string_view key);
std::string NamespaceKey(absl::string_view ns);
// Everything under one namespace: [NamespacePrefix, PrefixEnd(NamespacePrefix)).
std::string NamespacePrefix(absl::string_view ns);
// The first key after every namespace record and subtree ("/holdfast/ns0").
std::string NamespacesBegin();
std::string NamespacesEnd();
std::string ClassKey(absl::string_view ns, absl::string_view class_id);
std::string ClassPrefix(absl::string_view ns);
std::string SessionKey(absl::string_view ns, int64_t lease);
std::string SessionPrefix(absl::string_view ns);
// The live-session slots of a namespace with a held_lease_quota: each session
// holds one, attached to its lease, so at most `quota` sessions live at once.
std::string SlotKey(absl::string_view ns, int64_t index);
std::string SlotPrefix(absl::string_view ns);
std::optional<int64_t> ParseSlotKey(absl::string_view key, absl::string_view ns);
// A session's claims: one key per lock key it holds or waits for, so that the
// number of them is one count-only range ([ClaimPrefix, PrefixEnd(ClaimPrefix))).
// Put with the session's first waiter or hold on the key, kept when a waiter is
// handed the lock, deleted with the last of them (release, undo, force, a waiter
// leaving or removed as dead); a lease that ends takes them all.
std::string ClaimKey(absl::string_view ns, absl::string_view lock_key, int64_t lease);
std::string ClaimPrefix(absl::string_view ns, int64_t lease);
std::string HoldKey(absl::string_view ns, absl::string_view lock_key, int64_t lease);
// All holds of one lock key: [HoldRangeBegin, HoldRangeEnd).
std::string HoldRangeBegin(absl::string_view ns, absl::string_view lock_key);
std::string HoldRangeEnd(absl::string_view ns, absl::string_view lock_key);

std::string WaitKey(absl::string_view ns, absl::string_view lock_key, int64_t lease);
// All waiters of one lock key: [WaitRangeBegin, WaitRangeEnd), in key (not queue) order.
std::string WaitRangeBegin(absl::string_view ns, absl::string_view lock_key);
std::string WaitRangeEnd(absl::string_view ns, absl::string_view lock_key);
// Holds and waiters of every key starting with `prefix` (for class deletion).
std::string HoldPrefix(absl::string_view ns, absl::string_view key_prefix);
// Every waiter of the namespace, of any lock key (a rehome's seal).
std::string WaitPrefix(absl::string_view ns);

// The smallest key greater than every key with this prefix (etcd's range_end).
std::string PrefixEnd(absl::string_view prefix);

// --- parsing
// The namespace name a key under /holdfast/ns/ belongs to (nullopt otherwise).
std::optional<std::string> NamespaceOfKey(absl::string_view key);
struct ParsedHoldKey {
  std::string ns;
  std::string lock_key;
  int64_t lease;
};
std::optional<ParsedHoldKey> ParseHoldKey(absl::string_view key);
// Same layout under wait/.
std::optional<ParsedHoldKey> ParseWaitKey(absl::string_view key);
std::optional<int64_t> ParseSessionKey(absl::string_view key, absl::string_view ns);
std::optional<std::string> ParseClassKey(absl::string_view key, absl::string_view ns);

}  // namespace holdfast::keyspace
