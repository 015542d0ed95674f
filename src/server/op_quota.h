// op_rate_quota at the door of the namespace-scoped RPCs (ARCHITECTURE §9).
//
// Operations, each counted once per call whatever it does or waits for:
//   Session.Open, Session.Close, Lock.Acquire, Lock.Release.
// Only Open and Acquire are refused over the quota; Close and Release are counted
// and never refused (Charge).
// Not counted: Session.KeepAlive (refusing a renewal would make holders lose their
// locks: the quota must never be what ends a hold), Lock.CheckToken and
// Lock.Describe (reads that write nothing; resources call CheckToken on their
// fencing path), and the Admin API. Calls of a caller that is not a member of the
// namespace are not counted either (the engine refuses them), so outsiders cannot
// use up a tenant's quota.
//
// A call over the quota gets RESOURCE_EXHAUSTED before anything else happens (so
// it changes nothing in etcd), with the wait in the message and in the trailing
// metadata `retry-after-ms` (decimal milliseconds).
//
// The quota and members of each namespace in use are cached: read once from etcd
// (the first calls wait for that read), then kept current by a watch on the
// namespace's record, so `holdfast ns set --op-rate-quota` takes effect within
// a watch delivery. Entries unused for 10 minutes are dropped. If etcd cannot be
// read, calls are let through: the engine then answers them from etcd itself.
//
// Thread-safe. `done` callbacks run on the calling thread (cache hit) or on a
// gRPC thread, exactly once, never under a lock of this class. Callbacks of the
// etcd client may run after Stop(): destroy an OpQuota only after its etcd client.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "etcd/client.h"
#include "etcd/watch_hub.h"
#include "lock/engine.h"
#include "server/rate_limit.h"

namespace holdfast::server {

inline constexpr char kRetryAfterMetadata[] = "retry-after-ms";

class OpQuota {
 public:
  struct Admission {
    absl::Status status;                      // OK, or RESOURCE_EXHAUSTED
    std::chrono::milliseconds retry_after{0};  // when refused
  };
  using AdmitDone = std::function<void(Admission)>;

  struct Options {
    std::chrono::minutes idle_expiry{10};
    size_t max_cached_namespaces = 10'000;  // beyond: read per call, not cached
  };

  // `etcd` and `limiter` must outlive this object.
  OpQuota(etcd::Client* etcd, RateLimiter* limiter, Options options);
  OpQuota(etcd::Client* etcd, RateLimiter* limiter) : OpQuota(etcd, limiter, Options{}) {}
  ~OpQuota();

  // Decides one operation of `caller` on namespace `ns`.
  void Admit(const lock::Caller& caller, const std::string& ns, AdmitDone done);

  // Counts one operation of `caller` on `ns` that is never refused: a
  // Lock.Release or a Session.Close. Refusing what frees a lock or a session
  // would only keep it held longer (libholdfast asks a refused release again
  // 1 s later, then at longer pauses) and add the expiry's work later; a valid
  // one is bounded by the acquire or open before it, which the quota does
  // refuse. (A release with a stale token is not: it costs its etcd transaction
  // whatever the quota.)
  // RateLimiter::Charge takes its token, or puts the bucket into debt that the
  // next Acquire and Open calls wait out. Never waits: a namespace whose policy
  // is not cached yet is not counted.
  void Charge(const lock::Caller& caller, const std::string& ns);

  // Stops the watches and the expiry sweep; later calls are let through. Waits
  // for reads in flight (bounded by their deadlines). Safe to call twice.
  void Stop();

 private:
  struct Policy {
    int64_t op_rate_quota = 0;
    google::protobuf::RepeatedPtrField<std::string> members;
  };
  struct Waiter {
    lock::Caller caller;
    AdmitDone done;
  };
  struct Entry {
    bool ready = false;
    Policy policy;
    std::vector<Waiter> waiting;  // while !ready
    etcd::WatchId watch = 0;
    uint64_t generation = 0;      // tells this entry's watch from a former one's
    std::chrono::steady_clock::time_point last_used;
  };

  Admission Decide(const lock::Caller& caller, const std::string& ns, const Policy& policy);
  // Reads the namespace record; `uncached` (cache full) decides only for it.
  void Fetch(const std::string& ns, uint64_t generation, std::optional<Waiter> uncached);
  void OnFetched(const std::string& ns, uint64_t generation, std::optional<Waiter> uncached,
                 absl::StatusOr<etcdserverpb::RangeResponse> r);
  void OnWatch(const std::string& ns, uint64_t generation,
               absl::StatusOr<etcd::WatchBatch> batch);
  void Sweep();
  void EndCall();

  etcd::Client* const etcd_;
  RateLimiter* const limiter_;
  const Options options_;

  absl::Mutex mu_;
  absl::CondVar idle_;  // signalled when calls_ drops to 0
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  TimerQueue::TimerId sweep_timer_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::server
