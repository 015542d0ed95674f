// Latency samples of one benchmark series and their summary.
//
// Thread-compatible: each worker thread fills its own LatencySamples; the runner
// merges them after the threads have joined.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace holdfast::bench {

struct LatencySummary {
  int64_t count = 0;
  double mean_ms = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

class LatencySamples {
 public:
  void Add(std::chrono::nanoseconds d) { samples_ns_.push_back(d.count()); }
  void Merge(const LatencySamples& other);
  size_t size() const { return samples_ns_.size(); }
  // Sorts the samples; nearest-rank percentiles. All zero when empty.
  LatencySummary Summarize();

 private:
  std::vector<int64_t> samples_ns_;
};

}  // namespace holdfast::bench
