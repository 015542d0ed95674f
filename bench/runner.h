// Closed-loop benchmark cells: N workers, each on its own thread, repeat one
// operation for a fixed time and record the latency of every operation.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "bench/latency.h"

namespace holdfast::bench {

using SteadyClock = std::chrono::steady_clock;

// Set once when the run must end early (SIGINT or SIGTERM). Thread-safe.
class StopFlag {
 public:
  void Stop();
  bool stopped() const;
  // Sleeps until `until` or until Stop(), whichever comes first. Returns false
  // when stopped.
  bool SleepUntil(SteadyClock::time_point until) const;

 private:
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

struct Timing {
  // Operations completed before the window opens are not recorded.
  std::chrono::milliseconds warmup{0};
  // Length of the recorded window.
  std::chrono::milliseconds measure{1000};
};

// One closed-loop caller of a cell. Thread-compatible: driven by one runner
// thread from construction to destruction of the cell.
class Worker {
 public:
  virtual ~Worker() = default;
  // The measured operation. DEADLINE_EXCEEDED counts as a timeout, any other
  // error as an error; neither is in the latency figures.
  virtual absl::Status Op() = 0;
  // Runs after each Op, outside the measured time (e.g. the release after a
  // measured acquire). An error counts as an error of the op.
  virtual absl::Status AfterOp() { return absl::OkStatus(); }
  // Runs before each Op, outside the measured time; may wait (never past
  // `window_end`) to pace an occasional caller.
  virtual void Pace(SteadyClock::time_point window_end, const StopFlag& stop) {}
  // The series the worker's operations count in ("" for the cell's main one).
  virtual std::string series() const { return ""; }
};

struct SeriesResult {
  int workers = 0;
  int64_t ops = 0;       // completed OK inside the window
  int64_t all_ops = 0;   // completed OK at any time (warm-up and drain included)
  int64_t errors = 0;    // failed inside the window, other than timeouts
  int64_t timeouts = 0;  // DEADLINE_EXCEEDED inside the window
  double seconds = 0;    // length of the window
  double ops_per_sec = 0;
  LatencySummary latency;
  std::string first_error;
};

// Upper bound of operations one worker runs in one cell.
inline constexpr int64_t kMaxOpsPerWorker = 10'000'000;

// Runs every worker on its own thread until the window closes (or `stop`), then
// waits for each to finish its current operation. Operations that complete
// inside the window count; the result maps series name to figures.
std::map<std::string, SeriesResult> RunWorkers(std::vector<std::unique_ptr<Worker>>& workers,
                                               const Timing& timing, const StopFlag& stop);

// Runs fn(0..n-1) on up to `threads` threads; every call runs at most once and
// none starts after `deadline` or `stop`. Returns how many calls ran.
int64_t ParallelFor(int64_t n, int threads, SteadyClock::time_point deadline,
                    const StopFlag& stop, const std::function<void(int64_t)>& fn);

}  // namespace holdfast::bench
