// op_rate_quota: operations per second per namespace, across all holdfastd
// replicas (ARCHITECTURE §9). Pure logic with an injected clock; ReplicaSet
// (server/replicas.h) feeds it what the other replicas publish, and OpQuota
// (server/op_quota.h) asks it before each operation.
//
// The split. Every replica publishes, per namespace, its recent demand d: the
// rate of operations its callers asked for (admitted or not), an exponentially
// weighted moving average with time constant `demand_tau`. From the demands as
// published (its own included) each of the N live replicas computes the same
// max-min fair split of the quota Q and enforces its own part with a token bucket:
//
//   e_j = max(1.2 * d_j, Q / (10 N))   what replica j is considered to need: a
//                                      fifth over its average (so a steady client
//                                      is not refused by the average's noise), and
//                                      at least a floor
//   if sum e_j <= Q:  share_j = e_j + (Q - sum e_j) / N      (the surplus, evenly)
//   else:             share_j = min(e_j, L), with L such that sum min(e_j, L) = Q
//
// Replicas that see the same published records compute shares that sum to exactly
// Q. A replica asked for less than the level L gets what it is asked for; those
// asked for more split the rest evenly. An idle replica keeps the floor Q/(10N), so
// traffic arriving there is admitted at once while its demand gets published. A
// replica that sees no demand anywhere enforces Q/N. Clients that stay on one
// replica (the usual case) get about 90% of Q or more there, not Q/N.
//
// The bucket holds at most `burst` seconds of its share, and at least one
// operation. So over any interval of T seconds a namespace admits at most about
// Q*T + Q*burst + N operations, plus what the skew between replicas' views allows
// while the published demands move (a watch delivery, milliseconds).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::server {

class RateLimiter {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  struct Options {
    // Bucket capacity in seconds of the share (and at least one operation).
    double burst_seconds = 0.5;
    // Time constant of the demand average.
    std::chrono::milliseconds demand_tau{1000};
    // Demand below this (operations/s) counts as none: not published, and the
    // namespace's state is dropped once its bucket is full again.
    double min_demand = 0.01;
  };

  // What the replicas have published (ReplicaSet builds it from etcd).
  struct PeerView {
    // Live replicas, this one included (at least 1).
    int replicas = 1;
    // This replica's published demand per namespace.
    std::map<std::string, double> self;
    // The other replicas' published demands per namespace, one entry per replica
    // that published one; replicas without an entry count as idle.
    std::map<std::string, std::vector<double>> others;
  };

  struct Decision {
    bool admitted = true;
    // When not admitted: how long until the bucket has a token again.
    std::chrono::milliseconds retry_after{0};
  };

  explicit RateLimiter(Options options, Clock clock = std::chrono::steady_clock::now);

  // One operation on `ns`, whose op_rate_quota is `quota` (0: unlimited, always
  // admitted and not measured). Counts towards the demand either way.
  Decision Admit(const std::string& ns, int64_t quota);

  // One operation on `ns` that is never refused (a release or a session close:
  // refusing what frees a lock would only keep it held longer). It takes a token
  // like any other; with none left the bucket runs into debt, of at most its
  // capacity, which the operations after it wait out. Counts towards the demand.
  void Charge(const std::string& ns, int64_t quota);

  // Replaces the view of the replicas; shares follow at once.
  void SetView(PeerView view);

  // This replica's demand per namespace now (above min_demand), for publishing.
  // Drops the state of namespaces with no demand and a full bucket.
  std::map<std::string, double> Demand();

  // This replica's share of `quota` on `ns` under the current view (ops/s).
  double Share(const std::string& ns, int64_t quota) const;

  // The share formula above, exposed for tests: this replica's share given its
  // demand, the others' published demands, and the number of live replicas
  // (those beyond 1 + others.size() are idle).
  static double ShareOf(int64_t quota, double self_demand, const std::vector<double>& others,
                        int replicas);

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
    double demand = 0;  // the raw average, decayed to `demand_at`
    std::chrono::steady_clock::time_point demand_at;
    std::chrono::steady_clock::time_point first_demand;  // when the average started
    bool fresh = true;
  };

  // Refills `ns`'s bucket and counts one operation in its demand; returns the
  // bucket, with this replica's share and the bucket's capacity.
  Bucket& TakeLocked(const std::string& ns, int64_t quota, double* share, double* capacity)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double ShareLocked(const std::string& ns, int64_t quota) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  double DemandAtLocked(const Bucket& b, std::chrono::steady_clock::time_point now) const;

  const Options options_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  PeerView view_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> quotas_ ABSL_GUARDED_BY(mu_);  // last quota seen per ns
};

}  // namespace holdfast::server
