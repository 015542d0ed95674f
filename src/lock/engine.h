// The lock engine: sessions, acquire, release, token checks and descriptions on
// etcd, for one holdfastd replica. Replicas share nothing but etcd: every grant
// and release is one guarded etcd transaction whose compares make a double grant
// impossible however replicas interleave (ARCHITECTURE §4, §12).
//
// Thread-safe and asynchronous. Each operation returns at once and calls `done`
// exactly once, on a gRPC or timer thread, never under a lock of the engine. No
// thread is held while an Acquire waits: the wait is an etcd watch plus a timer.
//
// Deadlines flow down: every etcd call gets min(rpc deadline, now + etcd_timeout).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "etcd/client.h"
#include "holdfast/v1/lock.pb.h"
#include "holdfast/v1/session.pb.h"
#include "lock/epoch_cache.h"
#include "lock/forced_holds.h"
#include "lock/group_commit.h"
#include "lock/local_waiters.h"
#include "lock/view_cache.h"
#include "lock/etcd_health.h"
#include "lock/observer.h"
#include "lock/session_owners.h"

namespace holdfast::lock {

template <class T>
using Done = std::function<void(absl::StatusOr<T>)>;
using Deadline = etcd::Deadline;

// Who is calling. Filled by the server's authentication layer.
struct Caller {
  std::string identity;  // SPIFFE ID
  bool admin = false;    // matches the server's admin IDs: may use every namespace
};

// INVALID_ARGUMENT unless `ns` is a valid namespace name and `session` a valid
// session id (what every call naming a session checks first, without a read).
absl::Status ValidateSessionRef(const std::string& ns, int64_t session);

// PERMISSION_DENIED unless `caller` may use a namespace whose member patterns
// are `members` (empty: every authenticated caller).
absl::Status CheckMember(const Caller& caller, const std::string& ns,
                         const google::protobuf::RepeatedPtrField<std::string>& members);
// What a caller is told of a namespace that does not exist: an admin, NOT_FOUND;
// anyone else, the very PERMISSION_DENIED that CheckMember gives a non-member, so
// that namespace names cannot be probed (ARCHITECTURE.md, "Identity").
absl::Status NoSuchNamespace(const Caller& caller, const std::string& ns);

struct EngineOptions {
  // Upper bound of one etcd round trip.
  std::chrono::milliseconds etcd_timeout{5000};
  // Session TTL bounds accepted by Open (each acquire also checks its class).
  std::chrono::milliseconds session_ttl_min{1000};
  std::chrono::milliseconds session_ttl_max{24 * 3600 * 1000};
  // Longest Acquire wait.
  std::chrono::milliseconds max_wait{3600 * 1000};
  size_t max_holder_meta_bytes = 1024;
  // Waiters one lock key may have at once (0: no limit). A new waiter beyond it
  // is refused with RESOURCE_EXHAUSTED: on the read (or the replica's view of the
  // queue) that decides, and again on the queue its enqueue's commit leaves,
  // where a waiter past the limit is taken out again (acquire_op.cc,
  // OverWaiterLimit). Concurrent enqueues never leave the queue above it; one
  // refused so may, for a moment, make another refused.
  size_t max_waiters_per_key = 1000;
  // Lock keys one session may hold or wait for at once (0: no limit). Beyond it an
  // Acquire of another key is refused with RESOURCE_EXHAUSTED; exact, also under
  // concurrent acquires on the session (keyspace::ClaimKey).
  size_t max_holds_per_session = 1000;
  // Batching of grants and releases on different keys into one etcd transaction.
  GroupCommitOptions group_commit;
  // How long an enqueue behind other waiters waits for a release of its key on
  // this replica to ride with (lock/group_commit.h, Ride; 0: never). Only a call
  // with at least 40 times that left of its wait rides (acquire_op.cc).
  std::chrono::milliseconds ride_at_most{5};
  // Deadline of one lease renewal: an answer later than this is not a renewal a
  // holder can trust.
  std::chrono::milliseconds renew_timeout{1000};
  // Told what the engine does, for metrics (not owned; must outlive the
  // engine). Null: nothing is reported.
  EngineObserver* observer = nullptr;
};

// A waiting operation that its caller may abandon (the RPC was cancelled).
class Cancellable {
 public:
  virtual ~Cancellable() = default;
  // Ends the operation with CANCELLED unless it has finished. Idempotent.
  virtual void Cancel() = 0;
  // The server is stopping: answers the caller now with `why` (UNAVAILABLE, so
  // that it asks again elsewhere) and leaves what the operation holds for the
  // caller (a queued waiter) a moment longer, for the call asked again to take
  // over. Idempotent; nothing after Cancel or the end.
  virtual void Move(absl::Status why) = 0;
};

class Engine {
 public:
  // `health` (optional, not owned) gates new grants and keepalive answers.
  Engine(etcd::Client* etcd, EngineOptions options, EtcdHealth* health = nullptr);

  // Ends the watch the engine keeps of its own (lock/forced_holds.h), answers the
  // enqueues still parked for a release to ride with (and any later one), and
  // ends the timers of its calls (After): none runs its work after this returns.
  // Before the etcd client goes, which is before the engine (its callbacks end
  // with the client's streams). Idempotent.
  void Stop();

  // Runs `fn` after `d` on the etcd client's timer queue, unless the engine has
  // been stopped by then (Stop waits for one that is running). For the timers of
  // acquire calls, which may still be pending when the server stops.
  TimerQueue::TimerId After(std::chrono::steady_clock::duration d, std::function<void()> fn);

  // Waits until every acquire that was cancelled or moved (Cancellable) while
  // queued has ended, taking its waiter out unless the call asked again took it
  // over, or until `deadline`; true if none is left. For a stopping server,
  // before its etcd client goes: a waiter left behind would stand in its queue
  // until its own deadline if its caller never asked again.
  bool WaitForLeavers(std::chrono::steady_clock::time_point deadline);

  // Makes sure /holdfast/epoch exists: creates {epoch, the answering cluster's
  // id} when absent (by compare-and-swap, so racing replicas agree). `epoch` is 1
  // on a fresh install, or above the audit store's history when the record is
  // missing but epochs were used before. Blocking; call once at start-up, not
  // from a gRPC thread.
  absl::Status Bootstrap(Deadline d, int32_t epoch = 1);

  // Refuses every new grant (and hand-over) with FAILED_PRECONDITION and this
  // reason, until called with "" (the restore guard, ARCHITECTURE §6).
  void SetGrantBlock(std::string reason);
  // A restore detected (also one advanced past at once): what this replica
  // kept of etcd's history goes, the views (lock/view_cache.h) and the
  // hand-overs kept for late waiters (LocalWaiters::Recent). Kept, a view read
  // before the restore would outrank every read of the restored data by its
  // revision, and a compare "nothing created after its revision" would pass
  // against keys the restore brought back.
  void ForgetHistory();
  absl::Status GrantBlock() const;

  // With `caller_gone` (true once the caller has gone away: cancelled, or its
  // connection closed), an open not begun by then is not begun (CANCELLED).
  void OpenSession(const Caller& caller, const v1::OpenSessionRequest& req, Deadline d,
                   Done<v1::OpenSessionResponse> done,
                   std::function<bool()> caller_gone = nullptr);
  // Ends a session opened for a caller that went away before it had the answer:
  // nobody knows its id, so nobody would renew or close it, and it would keep a
  // quota slot for its whole TTL. Its lease is revoked (asked again a few times
  // while etcd does not answer; it expires by itself otherwise).
  void AbandonSession(const std::string& ns, int64_t session);
  // The check VerifySession makes first, without a read: whether this replica
  // has seen `session` in `ns` as the caller's (lock/session_owners.h). False
  // when only reads can tell (also for another identity's: whether the caller
  // may be told so depends on its membership, AnswerIfMember).
  bool IsKnownOwnSession(const Caller& caller, const std::string& ns, int64_t session);
  // Checks that `session` is a live session of `ns` owned by the caller (before
  // renewing it on a stream). Errors: NOT_FOUND (no such session) and
  // PERMISSION_DENIED (another identity's) to a caller who may use `ns`; to one
  // who may not, the PERMISSION_DENIED of a namespace it may not use, either way.
  void VerifySession(const Caller& caller, const std::string& ns, int64_t session, Deadline d,
                     Done<bool> done);
  // Renews the session's lease once. Never fails: etcd errors are reported in the
  // answer (etcd_unavailable), a vanished lease as lost. A confirmed renewal
  // lists the session's holds forced open (lock/forced_holds.h).
  void Renew(const v1::KeepAliveRequest& req, Deadline d, Done<v1::KeepAliveResponse> done);
  void CloseSession(const Caller& caller, const v1::CloseSessionRequest& req, Deadline d,
                    Done<v1::CloseSessionResponse> done);

  // The returned handle cancels a waiting acquire.
  std::shared_ptr<Cancellable> Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                       Deadline d, Done<v1::AcquireResponse> done);
  void Release(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
               Done<v1::ReleaseResponse> done);
  void CheckToken(const Caller& caller, const v1::CheckTokenRequest& req, Deadline d,
                  Done<v1::CheckTokenResponse> done);
  void Describe(const Caller& caller, const v1::DescribeRequest& req, Deadline d,
                Done<v1::DescribeResponse> done);

  etcd::Client& etcd() { return *etcd_; }
  const EngineOptions& options() const { return options_; }
  // Deadline of one etcd call under the caller's deadline `d`.
  Deadline EtcdDeadline(Deadline d) const;

  struct HandOverResult {
    bool guarded = false;          // "no hold created since the snapshot" is compared
    std::vector<int64_t> gone;     // waiters (leases) the transaction deletes
    std::vector<int64_t> granted;  // of those, the ones handed the key, in order
  };
  // Adds the hand-over to the head of the queue to a release transaction. With
  // `on_read` (`snap` is a read from etcd, not the replica's views), also the
  // removal of dead and stray waiters passed on the way, each guarded by its
  // record as read, and, when it grants, "no class created or changed since the
  // read" and "the namespace record unchanged since the read" (a release planned
  // on the views compares both itself). Grants none when a waiter it would hand
  // the key to is refused by the deciding class (mode, TTL bounds) or left out
  // by the namespace's members (admins excepted).
  // Touches nothing but `txn`: public for tests.
  static HandOverResult AddHandOver(const KeySnapshot& snap, const std::string& ns,
                                    const std::string& key, int64_t releasing,
                                    bool grants_allowed, bool on_read, int64_t now_ms,
                                    etcdserverpb::TxnRequest* txn);

 private:
  friend class AcquireOp;
  // What an open carries from its namespace read to its commit.
  struct SessionOpen {
    Caller caller;
    v1::OpenSessionRequest req;  // to start again when the namespace changes under it
    int64_t ttl_s;
    int64_t quota;             // held_lease_quota as read; 0: none
    int64_t ns_mod_revision;   // of the namespace record read; the commit compares it
    int reads_left;            // times the open may read the namespace again
  };
  void OpenSessionAttempt(const Caller& caller, const v1::OpenSessionRequest& req, int reads_left,
                          Deadline d, Done<v1::OpenSessionResponse> done);
  void GrantSession(SessionOpen open, Deadline d, Done<v1::OpenSessionResponse> done);
  void CommitSession(const SessionOpen& open, int64_t lease, int attempts_left, Deadline d,
                     Done<v1::OpenSessionResponse> done);
  // Finds a free slot below `quota` for `lease`'s session and calls `commit` with
  // it and the revision the commit must see no session opened after (0: none);
  // RESOURCE_EXHAUSTED (and the lease revoked) when there is none.
  void PickSlot(const std::string& ns, int64_t quota, int64_t lease, Deadline d,
                std::function<void(int64_t slot, int64_t no_session_since)> commit,
                Done<v1::OpenSessionResponse> done);
  void ScanForSlot(const std::string& ns, int64_t quota, int64_t lease, Deadline d,
                   std::string start, int64_t lo, int64_t from, bool round,
                   int64_t no_session_since,
                   std::function<void(int64_t slot, int64_t no_session_since)> commit,
                   Done<v1::OpenSessionResponse> done);
  // Revokes `lease`, asking again 1 s later while etcd does not answer, up to
  // `attempts_left` times in all; best effort (the lease expires by itself).
  void RevokeQuietly(int64_t lease, int attempts_left = 1);
  void RenewAttempt(const v1::KeepAliveRequest& req, Deadline d, bool again,
                    std::chrono::steady_clock::time_point started, v1::KeepAliveResponse base,
                    Done<v1::KeepAliveResponse> done);
  static absl::Status QuotaExhausted(const std::string& ns, int64_t quota);
  // UNAVAILABLE with a retry hint: a rehome moves the namespace to cluster `to`.
  static absl::Status Rehoming(const std::string& ns, const std::string& to, bool moved);
  // What a release that may hand the key over decides on: a fresh read, or this
  // replica's views (classes_revision > 0; `key` is the key's view).
  struct ReleasePlan {
    KeySnapshot snap;
    int64_t now_ms = 0;
    int64_t classes_revision = 0;
    KeyView key;  // planned on the views: the view's revisions (its lists are in `snap`)
    uint64_t views_generation = 0;  // taken before the views or the read it is planned on
  };
  // `caller` decides only what a failed release may tell (CheckMember).
  void ReleaseAttempt(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
                      int attempts_left, Done<v1::ReleaseResponse> done);
  // A plan on the views when they show the caller's hold and waiters to hand the
  // key to (and nothing that only a fresh read may decide).
  bool PlanOnViews(const v1::ReleaseRequest& req, ReleasePlan* plan);
  void ReleaseTxn(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
                  int attempts_left, std::optional<ReleasePlan> plan,
                  Done<v1::ReleaseResponse> done);

  // OK, or UNAVAILABLE while etcd has no quorum (no new grants then).
  absl::Status EtcdStatus() const;
  // options_.observer, or one that ignores everything.
  EngineObserver& observer() const {
    static EngineObserver ignore_all;
    return options_.observer != nullptr ? *options_.observer : ignore_all;
  }

  etcd::Client* const etcd_;
  const EngineOptions options_;
  EtcdHealth* const health_;
  EpochCache epochs_;
  ViewCache views_;
  // This replica's waiting acquires, told of a hand-over by a release here.
  LocalWaiters local_waiters_;
  // Grants and releases go through it (lock/group_commit.h). After options_.
  GroupCommit commits_;
  // Holds forced open, for the keepalive answers of their sessions.
  ForcedHolds forced_;
  mutable absl::Mutex block_mu_;
  std::string block_reason_ ABSL_GUARDED_BY(block_mu_);
  // Namespace and owner of each session seen (lock/session_owners.h): lets a
  // keepalive or a release check its session without a read.
  SessionOwners owners_;
  // PERMISSION_DENIED unless the session belongs to the caller.
  static absl::Status CheckOwner(const Caller& caller, int64_t session,
                                 const std::string& owner);
  // Passes `answer` (what a call naming a session in `ns` found: none, or
  // another identity's) to `done` if the caller may use `ns`; else the
  // PERMISSION_DENIED every call naming a namespace it may not use gets, so that
  // a session id does not tell a non-member whether the namespace exists.
  // Admins are answered at once; anyone else costs a read of the namespace.
  void AnswerIfMember(const Caller& caller, const std::string& ns, absl::Status answer,
                      Deadline d, std::function<void(absl::Status)> done);
  // Acquires cancelled or moved that keep their waiters a moment (AcquireOp::
  // Leave) and have not ended yet (WaitForLeavers).
  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
  absl::Mutex leavers_mu_;
  int leavers_ ABSL_GUARDED_BY(leavers_mu_) = 0;
};

}  // namespace holdfast::lock
