// Baselines straight on etcd, on the same etcd as holdfast: a guarded txn, a
// grant+release cycle (guarded put txn, then guarded delete txn), raw lease
// renewals over LeaseKeepAlive, and etcd's own v3lock Lock/Unlock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "bench/runner.h"
#include "common/timer_queue.h"
#include "etcd/client.h"
#include "etcd/etcdserver/api/v3lock/v3lockpb/v3lock.grpc.pb.h"

namespace holdfast::bench {

// Workers per etcd::Client (and per v3lock channel).
inline constexpr int kCallersPerEtcdClient = 32;

// etcd clients for up to `max_workers` baseline workers: one per
// kCallersPerEtcdClient. Thread-safe. Every key it writes is under prefix().
class EtcdPool {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdPool>> Create(const std::string& endpoint,
                                                          int max_workers,
                                                          const std::string& prefix);
  ~EtcdPool();

  etcd::Client& client(int worker);
  v3lockpb::Lock::Stub& lock_stub(int worker);
  const std::string& prefix() const { return prefix_; }

  // Grants `n` leases of `ttl_s` seconds. Errors: the first failed grant, or
  // DEADLINE_EXCEEDED when not all were granted by `deadline`.
  absl::StatusOr<std::vector<int64_t>> GrantLeases(int64_t n, int64_t ttl_s,
                                                   SteadyClock::time_point deadline,
                                                   const StopFlag& stop);
  // Revokes the leases (and so their keys); best effort, bounded by `deadline`.
  void RevokeLeases(const std::vector<int64_t>& leases, SteadyClock::time_point deadline);
  // Deletes every key under prefix() + `under` (every key under prefix() by
  // default). Best effort.
  void DeletePrefix(const std::string& under = "");

  // Brings etcd's buffer of writes not yet committed to its backend back to its
  // smallest before a cell is measured, so that every cell starts from the same
  // etcd whatever the cell before it wrote. etcd 3.4 copies that buffer's whole
  // array into every transaction and range it serves (ConcurrentReadTx), and a
  // bucket's array keeps its largest size for as long as each commit period
  // (etcd's --backend-batch-interval, `period`, 100 ms by default) writes to the
  // bucket again. After one burst (a cell's thousands of keys deleted in one
  // request, thousands of leases granted or revoked) every transaction copied
  // thousands of entries, and etcd ran the raw grant+release cycle at a third of
  // its speed, until some period happened to pass without a write to that bucket
  // (docs/performance.md, "etcd's write buffer"). Settle makes such periods: it
  // waits out the current one; writes a key (a period with no lease written);
  // grants a lease (a period with no key written); then revokes the lease and
  // deletes the key. About 4.5 periods. It assumes nothing else writes meanwhile
  // (holdfastd writes no key while no client calls it), and says on stderr when
  // a step failed, the cell then starting unsettled.
  void Settle(std::chrono::milliseconds period = std::chrono::milliseconds(100));

 private:
  EtcdPool() = default;
  std::string prefix_;
  std::shared_ptr<TimerQueue> timers_;
  std::vector<std::unique_ptr<etcd::Client>> clients_;
  std::vector<std::unique_ptr<v3lockpb::Lock::Stub>> lock_stubs_;
};

// `n` workers, each putting fresh keys under `cell` behind a create_revision == 0
// compare: one guarded txn per op. The keys are under GuardedTxnPrefix(cell) of
// the pool's prefix.
std::string GuardedTxnPrefix(const std::string& cell);
std::vector<std::unique_ptr<Worker>> GuardedTxnWorkers(EtcdPool& pool, int n,
                                                       const std::string& cell);

// `n` workers, each on its own key with its own lease: one op is a guarded put
// txn then a guarded delete txn (compare create_revision == the put's revision).
std::vector<std::unique_ptr<Worker>> RawCycleWorkers(EtcdPool& pool,
                                                     const std::vector<int64_t>& leases,
                                                     const std::string& cell);

// etcd v3lock. Without `shared_name` each worker locks its own name and one op
// is Lock(name, lease) then Unlock(key). With `shared_name` every worker locks
// the same name (contended): the op is the Lock (one hand-over), and the Unlock
// follows unmeasured. A Lock waits at most `wait`.
std::vector<std::unique_ptr<Worker>> V3LockWorkers(EtcdPool& pool,
                                                   const std::vector<int64_t>& leases,
                                                   const std::string& cell, bool shared_name,
                                                   std::chrono::milliseconds wait);

// One op is one renewal of the worker's own lease over the client's multiplexed
// LeaseKeepAlive stream, as fast as answers come back.
std::vector<std::unique_ptr<Worker>> KeepAliveWorkers(EtcdPool& pool,
                                                      const std::vector<int64_t>& leases);

// Renews every lease every ttl/3, as libholdfast renews sessions, over one
// LeaseKeepAlive stream; each lease has at most one renewal outstanding. The
// result counts renewals etcd confirmed (TTL > 0) inside the window.
SeriesResult RunPacedKeepAlive(etcd::Client& client, const std::vector<int64_t>& leases,
                               std::chrono::milliseconds ttl, const Timing& timing,
                               const StopFlag& stop);

}  // namespace holdfast::bench
