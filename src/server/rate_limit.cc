#include "server/rate_limit.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace holdfast::server {

namespace {

// What a replica is considered to need, over its average demand.
constexpr double kHeadroom = 1.2;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

RateLimiter::RateLimiter(Options options, Clock clock)
    : options_(options), clock_(std::move(clock)) {}

double RateLimiter::ShareOf(int64_t quota, double self_demand, const std::vector<double>& others,
                            int replicas) {
  if (quota <= 0) return 0;
  const double q = static_cast<double>(quota);
  const int n = std::max<int>(replicas, static_cast<int>(others.size()) + 1);
  const double floor = q / (10.0 * n);
  auto need = [&](double demand) { return std::max(kHeadroom * demand, floor); };
  std::vector<double> needs;
  needs.reserve(n);
  for (double d : others) needs.push_back(need(d));
  needs.resize(n - 1, floor);  // idle replicas
  const double self = need(self_demand);
  needs.push_back(self);
  const double total = std::accumulate(needs.begin(), needs.end(), 0.0);
  if (total <= q) return self + (q - total) / n;
  // Water-filling: the level L at which sum(min(need, L)) == Q.
  std::sort(needs.begin(), needs.end());
  double remaining = q;
  double level = q / n;
  for (int i = 0; i < n; ++i) {
    const int left = n - i;
    if (needs[i] * left >= remaining) {
      level = remaining / left;
      break;
    }
    remaining -= needs[i];
  }
  return std::min(self, level);
}

double RateLimiter::ShareLocked(const std::string& ns, int64_t quota) const {
  auto self = view_.self.find(ns);
  auto others = view_.others.find(ns);
  static const std::vector<double> kNone;
  return ShareOf(quota, self == view_.self.end() ? 0.0 : self->second,
                 others == view_.others.end() ? kNone : others->second, view_.replicas);
}

double RateLimiter::DemandAtLocked(const Bucket& b,
                                   std::chrono::steady_clock::time_point now) const {
  const double tau = std::chrono::duration<double>(options_.demand_tau).count();
  const double dt = std::max(0.0, Seconds(now - b.demand_at));
  // The average starts from zero, so early on it under-states the rate: divide
  // by the weight it has had time to gather (as Adam's bias correction does),
  // counting at least a tenth of a time constant (a first call alone then
  // reads as about 10/s for a moment, then fades).
  const double age = std::max(0.1 * tau, Seconds(now - b.first_demand));
  return b.demand * std::exp(-dt / tau) / (1.0 - std::exp(-age / tau));
}

RateLimiter::Bucket& RateLimiter::TakeLocked(const std::string& ns, int64_t quota,
                                             double* share_out, double* capacity_out) {
  const auto now = clock_();
  Bucket& b = buckets_[ns];
  quotas_[ns] = quota;
  const double share = ShareLocked(ns, quota);
  const double capacity = std::max(1.0, share * options_.burst_seconds);
  *share_out = share;
  *capacity_out = capacity;
  if (b.fresh) {
    b.fresh = false;
    b.tokens = capacity;
    b.demand = 0;
    b.demand_at = now;
    b.first_demand = now;
  } else {
    const double dt = std::max(0.0, Seconds(now - b.refilled));
    b.tokens = std::min(capacity, b.tokens + share * dt);
  }
  b.refilled = now;
  const double tau = std::chrono::duration<double>(options_.demand_tau).count();
  const double dt = std::max(0.0, Seconds(now - b.demand_at));
  b.demand = b.demand * std::exp(-dt / tau) + 1.0 / tau;
  b.demand_at = now;
  return b;
}

RateLimiter::Decision RateLimiter::Admit(const std::string& ns, int64_t quota) {
  absl::MutexLock l(&mu_);
  if (quota <= 0) {
    buckets_.erase(ns);
    quotas_.erase(ns);
    return {};
  }
  double share, capacity;
  Bucket& b = TakeLocked(ns, quota, &share, &capacity);
  if (b.tokens >= 1.0) {
    b.tokens -= 1.0;
    return {};
  }
  const double wait_ms = std::ceil((1.0 - b.tokens) / share * 1000.0);
  return {false, std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(wait_ms)))};
}

void RateLimiter::Charge(const std::string& ns, int64_t quota) {
  absl::MutexLock l(&mu_);
  if (quota <= 0) return;
  double share, capacity;
  Bucket& b = TakeLocked(ns, quota, &share, &capacity);
  b.tokens = std::max(-capacity, b.tokens - 1.0);
}

void RateLimiter::SetView(PeerView view) {
  absl::MutexLock l(&mu_);
  view.replicas = std::max(1, view.replicas);
  view_ = std::move(view);
}

std::map<std::string, double> RateLimiter::Demand() {
  absl::MutexLock l(&mu_);
  const auto now = clock_();
  std::map<std::string, double> out;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    const Bucket& b = it->second;
    const double demand = DemandAtLocked(b, now);
    if (demand >= options_.min_demand) {
      out[it->first] = demand;
      ++it;
      continue;
    }
    const int64_t quota = quotas_[it->first];
    const double share = ShareLocked(it->first, quota);
    const double capacity = std::max(1.0, share * options_.burst_seconds);
    const bool full = b.tokens + share * std::max(0.0, Seconds(now - b.refilled)) >= capacity;
    if (full) {
      quotas_.erase(it->first);
      it = buckets_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

double RateLimiter::Share(const std::string& ns, int64_t quota) const {
  absl::MutexLock l(&mu_);
  return ShareLocked(ns, quota);
}

}  // namespace holdfast::server
