// Group commit (issue 9): when several grants and releases on different lock keys
// are ready at once, one etcd transaction carries them all.
//
// A member is a guarded transaction (compares, success ops, an else branch) and
// its footprint: the namespace, lock key and session it is about. While fewer
// than max_in_flight transactions of this engine are in flight, a member is sent
// alone at once, as it is (so one caller alone waits for nothing). Beyond that,
// members queue; each time a transaction comes back, the queue goes out merged:
// every compare of every member, then every success op, so the batch commits
// only if all of their compares hold, and all of them in one revision (grants in
// one batch share it; per key there is one member per batch, besides a rider
// (below), which grants nothing, so per-key token order is kept). If the batch's compares fail, each member is sent alone again
// and answered by its own transaction, else branch included.
//
// Merging is sound because members of one batch are independent: no two share a
// lock key or a session (a rider and its release share the key, and are checked
// key by key instead), so no member writes a key another one compares (holds,
// waiters and claims are per key or per session; nobody in a batch writes
// namespace, class, session or epoch records). The one key several members put is
// the audit mark (every release puts one): it is put once, with the first
// member's value (it only says "deletions in this revision were releases").
//
// A compare that several members make (byte for byte the same: the epoch record,
// the namespace and class records, the namespace's class range, all compared by
// every grant in a namespace) is made once: a conjunction is unchanged by
// dropping a repeated term. Batches are bounded by etcd's --max-txn-ops in
// distinct compares, so members of one namespace share the bound (a grant brings
// four compares of its own instead of eight), and etcd evaluates each repeated
// range compare once instead of once per member.
//
// A batch is sent with its members' earliest deadline, so a member with little
// time left (less than kShortLeft: a call near its own deadline) would cut the
// others' short, each of them then hearing DEADLINE_EXCEEDED, an unknown
// outcome: such members batch only with each other, and the rest only with the
// rest.
//
// A batch that committed answers each member with the batch's header and the
// member's own success responses. A transport error reaches every member (an
// unknown outcome, handled by each as for its own transaction).
//
// A rider (Ride) is a member in no hurry: an enqueue behind other waiters, which
// cannot be granted before the key's holder releases anyway. It waits up to a
// bound for a release of its own lock key by another session (queued or yet to
// come) and goes in the release's transaction, its ops after the release's: a
// contended key's hand-over and the next enqueue then cost etcd one commit
// instead of two. A rider joins a release only when the pair is the same as the
// release then the rider, one after the other: the release writes no key the
// rider compares, and the two write no key in common (lock/group_commit.cc,
// RidesAfter). The pair shares a revision and so goes into a batch as one unit;
// the rider's reads see the release's writes. A rider that finds no release goes
// alone after its bound; a failed batch sends it alone like any member.
//
// Thread-safe; callbacks run on the etcd client's threads, never under its lock.
// Like the transactions in flight, a rider's timer refers to the GroupCommit,
// which must outlive them (the engine's does: it ends after its calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "etcd/client.h"
#include "lock/observer.h"

namespace holdfast::lock {

struct GroupCommitOptions {
  // Transactions (single or batched) in flight before members queue.
  int max_in_flight = 8;
  // Members in one batch.
  int max_members = 32;
  // etcd's --max-txn-ops (128 by default) bounds compares and success ops.
  int max_txn_ops = 128;
};

class GroupCommit {
 public:
  struct Footprint {
    std::string ns;
    std::string lock_key;
    int64_t session = 0;
    bool release = false;  // the member releases a hold of lock_key: a rider may join it
  };
  // Told the number of members of every transaction sent (1: alone).
  using BatchObserver = std::function<void(int members)>;
  // Told each step of each rider (lock/observer.h).
  using RideObserver = std::function<void(RideStep)>;

  GroupCommit(etcd::Client* etcd, GroupCommitOptions options, BatchObserver observer = nullptr,
              RideObserver ride_observer = nullptr);

  // Answers every rider still parked UNAVAILABLE (not sent). Before the etcd
  // client goes (Engine::Stop at shutdown); the destructor does it otherwise.
  void Stop();
  ~GroupCommit();

  void Txn(Footprint footprint, etcdserverpb::TxnRequest txn, etcd::Deadline d,
           etcd::Callback<etcdserverpb::TxnResponse> done);
  // As Txn, after waiting up to `at_most` for a release of the same lock key to
  // ride with (see above). Riders of one key ride in the order they came, one per
  // release (two in one revision would tie in the queue's order).
  void Ride(Footprint footprint, etcdserverpb::TxnRequest txn, etcd::Deadline d,
            etcd::Callback<etcdserverpb::TxnResponse> done, std::chrono::milliseconds at_most);

  // True if `rider` run right after `host` in the same revision does what it
  // would do alone right after it: `host` writes no key that `rider` compares, and
  // the two write no key in common (etcd refuses a transaction that writes a key
  // twice). Only single-key writes are understood; a range delete never pairs.
  static bool RidesAfter(const etcdserverpb::TxnRequest& host,
                         const etcdserverpb::TxnRequest& rider);

 private:
  struct Member {
    Footprint footprint;
    etcdserverpb::TxnRequest txn;
    // Each compare of `txn`, serialized: what makes two members' compares the same.
    std::vector<std::string> compare_keys;
    etcd::Deadline deadline;
    etcd::Callback<etcdserverpb::TxnResponse> done;
    // A rider that goes right after this member, in its transaction (0 or 1).
    std::vector<Member> riders;
  };
  using Batch = std::vector<Member>;
  // Less time left than this makes a unit (a member and its rider) short: it
  // never shares a batch with one that is not (the batch's deadline is its
  // members' earliest).
  static constexpr std::chrono::milliseconds kShortLeft{1000};
  struct Waiting {
    Member rider;
    uint64_t id = 0;
    TimerQueue::TimerId timer = 0;
  };
  using KeyId = std::pair<std::string, std::string>;  // namespace, lock key

  static Member MakeMember(Footprint footprint, etcdserverpb::TxnRequest txn, etcd::Deadline d,
                           etcd::Callback<etcdserverpb::TxnResponse> done);
  // True if `rider` may go right after `host` in its transaction: another session,
  // RidesAfter, and the pair within max_txn_ops. The one test for both ways a pair
  // forms (a release meeting a waiting rider, a rider meeting a queued release).
  bool MayRide(const Member& host, const Member& rider) const;
  // Attaches the first rider waiting for `host`'s key, if it may ride with it.
  bool TakeRiderLocked(Member* host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rider's bound passed: it goes as Txn would.
  void RiderDue(const KeyId& key, uint64_t id);
  // Ride's work while not stopped: joins a queued release of the key, or parks
  // until the next one (or `at_most`). *rode: it joined one.
  void RideLocked(Member m, std::chrono::milliseconds at_most, bool* rode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Takes batches off the queue while transactions may be sent.
  std::vector<Batch> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Batch batch);
  void Sent();  // a transaction came back: the queue may go out

  etcd::Client* const etcd_;
  const GroupCommitOptions options_;
  const BatchObserver observer_;
  const RideObserver ride_observer_;
  absl::Mutex mu_;
  std::deque<Member> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Stop: no rider parks any more
  std::map<KeyId, std::deque<Waiting>> riders_ ABSL_GUARDED_BY(mu_);
  uint64_t next_rider_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::lock
