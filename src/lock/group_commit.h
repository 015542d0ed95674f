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
// one batch share it; per key there is one member per batch, so per-key token
// order is kept). If the batch's compares fail, each member is sent alone again
// and answered by its own transaction, else branch included.
//
// Merging is sound because members of one batch are independent: no two share a
// lock key or a session, so no member writes a key another one compares (holds,
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
// A batch that committed answers each member with the batch's header and the
// member's own success responses. A transport error reaches every member (an
// unknown outcome, handled by each as for its own transaction).
//
// Thread-safe; callbacks run on the etcd client's threads, never under its lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "etcd/client.h"

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
  };
  // Told the number of members of every transaction sent (1: alone).
  using BatchObserver = std::function<void(int members)>;

  GroupCommit(etcd::Client* etcd, GroupCommitOptions options, BatchObserver observer = nullptr);

  void Txn(Footprint footprint, etcdserverpb::TxnRequest txn, etcd::Deadline d,
           etcd::Callback<etcdserverpb::TxnResponse> done);

 private:
  struct Member {
    Footprint footprint;
    etcdserverpb::TxnRequest txn;
    // Each compare of `txn`, serialized: what makes two members' compares the same.
    std::vector<std::string> compare_keys;
    etcd::Deadline deadline;
    etcd::Callback<etcdserverpb::TxnResponse> done;
  };
  using Batch = std::vector<Member>;

  // Takes batches off the queue while transactions may be sent.
  std::vector<Batch> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Batch batch);
  void Sent();  // a transaction came back: the queue may go out

  etcd::Client* const etcd_;
  const GroupCommitOptions options_;
  const BatchObserver observer_;
  absl::Mutex mu_;
  std::deque<Member> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::lock
