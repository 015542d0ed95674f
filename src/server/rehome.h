// Rehome: moves a namespace from its home etcd cluster to another (ARCHITECTURE
// §6; runbook: docs/operations.md "Rehome").
//
// The rehome's state lives in the namespace's placement record on the control
// cluster (records::RehomeState), written before each step's effects are relied
// on, and every step is idempotent, so a rehome interrupted anywhere (holdfastd
// killed, a cluster unreachable) is finished by asking again with the same
// target, or rolled back with abort until it has flipped. Steps (RehomePhase):
//
//   kDraining   placement written {home: from, rehome: {from, to}}; on `from` the
//               namespace record gets draining_to and every class record is
//               rewritten, so no grant decided before it can commit (grants guard
//               on their class's mod_revision). From here `from` refuses new
//               sessions, grants and queueing with UNAVAILABLE and a retry hint,
//               and a release hands nothing over. Then: wait until the namespace
//               has no hold on `from`. At the deadline, with holds left: roll back
//               (nothing changed) and fail FAILED_PRECONDITION. A rehome never
//               forces a hold open: force needs two admins (ARCHITECTURE §8), and
//               a hold that will not end is force-released by the two-person
//               request and approval, before the rehome is asked again.
//   kSealed     one transaction on `from`: no hold of the namespace exists (the
//               compare), the record is marked moved, the class records are
//               rewritten again and every waiter key is deleted (the waiters wake,
//               re-read, and get UNAVAILABLE). No grant can commit on `from` again.
//   kEpochReady the target's epoch is above every epoch a token of the namespace
//               can carry: above `from`'s record and every epoch of the audit
//               store's history on a cluster other than the target (tokens minted
//               on the target itself carry its revisions, which only grow). If not,
//               the target's epoch is advanced (reason "rehome"; audit/epochs.h).
//   kCopied     the namespace and class records written on the target (anything
//               left there under the namespace is removed first).
//   kFlipped    placement home = to. Requests route to the target from here; a
//               session of the old cluster is not found there, so its holder
//               sees the session lost and opens a new one.
//   (done)      on `from`: every session lease of the namespace revoked, its
//               records deleted; the placement record keeps only {home: to}
//               (deleted when the target is the control cluster).
//
// Abort (before kFlipped): the placement record is marked aborting first, by a
// compare-and-swap, and only then is the target's copy removed and `from`
// undrained, and the record restored. A rehome command still running (an abort
// runs beside one, on the brief pool) fails its next step's compare-and-swap,
// so it can neither flip the home after `from` took sessions again nor remove
// `from` after the abort removed the target's copy; a command run later refuses
// to resume a rehome marked so (the abort, asked again, finishes it). A copy
// step in flight as the abort removes the target's copy can still leave records
// of the namespace there (not its home; a later rehome there replaces them).
//
// Thread-safe; blocking (the Admin service's synchronous pool). Two rehomes of
// one namespace at once are kept apart by the compare-and-swaps on its
// placement record: the loser gets ABORTED.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "audit/store.h"
#include "holdfast/v1/admin.pb.h"
#include "lock/engine.h"
#include "server/clusters.h"

namespace holdfast::server {

enum RehomePhase : int32_t {
  kRehomeDraining = 1,
  kRehomeSealed = 2,
  kRehomeEpochReady = 3,
  kRehomeCopied = 4,
  kRehomeFlipped = 5,
  // Not a phase: for Options::exit_after_phase, right after an abort marked the
  // record (RehomeState.aborting) and before it undid anything.
  kRehomeAbortMarked = 100,
};

class Rehomer {
 public:
  struct Options {
    std::chrono::milliseconds poll{100};          // how often the drain looks at the holds
    std::chrono::milliseconds default_deadline{60'000};
    // For tests of crash safety: the process exits (no clean-up at all) right
    // after this phase is recorded. From HOLDFAST_TEST_REHOME_EXIT_AFTER; 0: never.
    int32_t exit_after_phase = 0;
  };
  // `store` may be null (audit off: no history to consult).
  Rehomer(ClusterSet* clusters, audit::AuditStore* store, Options options)
      : clusters_(clusters), store_(store), options_(options) {}

  // `cancelled` says when the caller has gone (its call cancelled or past its
  // deadline): the drain's wait for holds then stops, leaving the rehome where it
  // is, as any interruption does (the same command resumes it, --abort rolls it
  // back). The wait for holds ends at the request's deadline_ms, and at the
  // latest kAfterTheDrain before `call_deadline`, so that a call that came late
  // to a thread rolls its drain back and says so, rather than being cut off while
  // its namespace drains.
  absl::StatusOr<v1::RehomeNamespaceResponse> Rehome(
      const lock::Caller& caller, const v1::RehomeNamespaceRequest& req,
      const std::function<bool()>& cancelled = [] { return false; },
      std::chrono::steady_clock::time_point call_deadline =
          std::chrono::steady_clock::time_point::max());

  // What the steps after the wait for holds (seal, epoch, copy, flip, clean-up:
  // a few etcd round trips each) are left of the call's time. libholdfast gives
  // a rehome call its deadline_ms plus 30 s.
  static constexpr std::chrono::seconds kAfterTheDrain{15};

 private:
  struct Placed;  // the placement record as read, with its mod_revision
  absl::StatusOr<Placed> ReadPlacement(const std::string& ns, etcd::Deadline d);
  // Compare-and-swap of the placement record; ABORTED when it changed.
  absl::Status WritePlacement(const std::string& ns, const Placed& was,
                              const std::optional<records::PlacementRecord>& now,
                              etcd::Deadline d);
  absl::Status Drain(Cluster& from, const std::string& ns, const std::string& to,
                     etcd::Deadline d);
  // Holds of the namespace on `c` (key, grant revision).
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> Holds(Cluster& c,
                                                                      const std::string& ns,
                                                                      etcd::Deadline d);
  // OK when sealed; FAILED_PRECONDITION while holds remain; ABORTED when the
  // namespace is no longer draining to `to` (the rehome was rolled back).
  absl::Status Seal(Cluster& from, const std::string& ns, const std::string& to,
                    etcd::Deadline d);
  absl::StatusOr<std::pair<int32_t, bool>> EnsureEpoch(Cluster& from, Cluster& to,
                                                      const std::string& actor,
                                                      etcd::Deadline d);
  absl::Status Copy(Cluster& from, Cluster& to, const std::string& ns, etcd::Deadline d);
  // FAILED_PRECONDITION when `from` and `to` answer with one etcd cluster id: two
  // names for one cluster (or two clusters made with one --initial-cluster-token),
  // where the copy's clearing of the target and the old home's removal would
  // delete the namespace itself.
  absl::Status Distinct(Cluster& from, Cluster& to, etcd::Deadline d);
  // Removes the namespace from `c`: revokes its sessions' leases, deletes its keys.
  absl::Status Remove(Cluster& c, const std::string& ns, etcd::Deadline d);
  // Undoes the drain (and the seal) on `from`.
  absl::Status Undrain(Cluster& from, const std::string& ns, etcd::Deadline d);
  absl::Status RollBack(const std::string& ns, Placed placed, etcd::Deadline d);
  void MaybeExit(int32_t phase) const;

  ClusterSet* const clusters_;
  audit::AuditStore* const store_;
  const Options options_;
};

}  // namespace holdfast::server
