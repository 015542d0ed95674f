#include "bench/latency.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace holdfast::bench {

namespace {
constexpr double kNsPerMs = 1e6;

// Nearest-rank percentile of sorted, non-empty samples; q in (0, 1].
int64_t Percentile(const std::vector<int64_t>& sorted, double q) {
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}
}  // namespace

void LatencySamples::Merge(const LatencySamples& other) {
  samples_ns_.insert(samples_ns_.end(), other.samples_ns_.begin(), other.samples_ns_.end());
}

LatencySummary LatencySamples::Summarize() {
  LatencySummary s;
  if (samples_ns_.empty()) return s;
  std::sort(samples_ns_.begin(), samples_ns_.end());
  double total = std::accumulate(samples_ns_.begin(), samples_ns_.end(), 0.0);
  s.count = static_cast<int64_t>(samples_ns_.size());
  s.mean_ms = total / static_cast<double>(samples_ns_.size()) / kNsPerMs;
  s.p50_ms = static_cast<double>(Percentile(samples_ns_, 0.50)) / kNsPerMs;
  s.p99_ms = static_cast<double>(Percentile(samples_ns_, 0.99)) / kNsPerMs;
  s.max_ms = static_cast<double>(samples_ns_.back()) / kNsPerMs;
  return s;
}

}  // namespace holdfast::bench
