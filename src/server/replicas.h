// The set of live holdfastd replicas, as this replica sees it through etcd, and
// this replica's place in it: how replicas share each namespace's op_rate_quota
// (server/rate_limit.h) without talking to each other.
//
// Each replica grants itself a lease (TTL `ttl`), and puts
// /holdfast/replica/<lease:016x> on it (keyspace.h) with a ReplicaRecord: its
// address and its recent demand per namespace. It renews the lease every ttl/3,
// republishes its demand at most every `tick` when it has moved by more than a
// fifth (a namespace appearing or disappearing counts), and watches the prefix.
// Every change of the set or of a record becomes a new RateLimiter::PeerView. A
// replica that dies drops out when its lease expires (at most `ttl`); one that
// stops revokes its lease, so the others take its share at once. A replica whose
// lease expired under it (etcd unreachable for longer than the TTL) registers
// again with a new lease.
//
// Thread-safe. Start() and Stop() block and belong to the server's start-up and
// shutdown thread. The rest runs on timer and gRPC threads, never blocking and
// never calling out while holding mu_. Callbacks of the etcd client may still
// run after Stop() returns: destroy a ReplicaSet only after its etcd client.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "etcd/client.h"
#include "etcd/watch_hub.h"
#include "lock/records.pb.h"
#include "server/rate_limit.h"

namespace holdfast::server {

class ReplicaSet {
 public:
  struct Options {
    std::string address;  // shown in the record
    std::chrono::seconds ttl{5};
    std::chrono::milliseconds tick{500};
  };
  // `etcd` and `limiter` must outlive this object.
  ReplicaSet(etcd::Client* etcd, RateLimiter* limiter, Options options);
  ~ReplicaSet();

  // Registers this replica, reads the set, and starts renewing, publishing and
  // watching. Errors: what etcd answered; the replica then goes on trying in
  // the background (from the first tick), so a failure need not stop the server.
  absl::Status Start(etcd::Deadline d);
  // Stops all of that and revokes this replica's lease (waits up to a second).
  // Safe to call twice.
  void Stop();

  // This replica's id (its lease), 0 before Start().
  int64_t id() const;
  // Live replicas seen, this one included.
  int size() const;

 private:
  absl::Status StartSync(etcd::Deadline d);
  void Tick();
  void RenewLease();
  void Register();
  void Publish(std::map<std::string, double> demand);
  void Relist();
  void Watch(int64_t from_revision);
  void OnWatch(absl::StatusOr<etcd::WatchBatch> batch);
  // Applies one record change; true if it changed the view.
  bool ApplyLocked(const std::string& key, const std::string* value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RateLimiter::PeerView ViewLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void PushView();
  // Bracket every asynchronous etcd call: Stop() waits for them.
  bool BeginCallLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndCall();
  etcd::Deadline CallDeadline() const;

  etcd::Client* const etcd_;
  RateLimiter* const limiter_;
  const Options options_;
  const int64_t started_at_unix_ms_;

  // Lock order: mu_, then the limiter's (PushView calls SetView under mu_).
  mutable absl::Mutex mu_;
  absl::CondVar idle_;  // signalled when calls_ drops to 0
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = true;
  bool registering_ ABSL_GUARDED_BY(mu_) = false;
  bool relisting_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int ticks_ ABSL_GUARDED_BY(mu_) = 0;
  TimerQueue::TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  etcd::WatchId watch_ ABSL_GUARDED_BY(mu_) = 0;
  // Watch batches of older watches are ignored.
  uint64_t watch_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // What this replica last published (or is publishing).
  std::map<std::string, double> published_ ABSL_GUARDED_BY(mu_);
  bool publishing_ ABSL_GUARDED_BY(mu_) = false;
  // Every live replica's record, by lease id.
  std::map<int64_t, records::ReplicaRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::server
