#include "bench/runner.h"

#include <algorithm>
#include <atomic>
#include <latch>
#include <thread>

namespace holdfast::bench {

namespace {

constexpr std::chrono::milliseconds kErrorBackoff{10};

struct Window {
  SteadyClock::time_point begin;
  SteadyClock::time_point end;
};

struct WorkerTally {
  SeriesResult result;
  LatencySamples samples;
};

void Record(const absl::Status& s, SteadyClock::duration took, WorkerTally* tally) {
  if (s.ok()) {
    ++tally->result.ops;
    tally->samples.Add(std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    ++tally->result.timeouts;
  } else {
    ++tally->result.errors;
    if (tally->result.first_error.empty()) tally->result.first_error = s.ToString();
  }
}

// One worker's closed loop, bounded by the window, kMaxOpsPerWorker and `stop`.
void Loop(Worker* worker, const Window& w, const StopFlag& stop, WorkerTally* tally) {
  for (int64_t i = 0; i < kMaxOpsPerWorker && !stop.stopped(); ++i) {
    worker->Pace(w.end, stop);
    auto t0 = SteadyClock::now();
    if (t0 >= w.end) break;
    absl::Status s = worker->Op();
    auto t1 = SteadyClock::now();
    if (s.ok()) s = worker->AfterOp();
    if (s.ok()) ++tally->result.all_ops;
    if (t1 >= w.begin && t1 <= w.end) Record(s, t1 - t0, tally);
    if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) {
      stop.SleepUntil(std::min(t1 + kErrorBackoff, w.end));
    }
  }
}

}  // namespace

void StopFlag::Stop() {
  absl::MutexLock l(&mu_);
  stopped_ = true;
}

bool StopFlag::stopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

bool StopFlag::SleepUntil(SteadyClock::time_point until) const {
  absl::MutexLock l(&mu_);
  auto left = until - SteadyClock::now();
  if (left > SteadyClock::duration::zero()) {
    mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::FromChrono(left));
  }
  return !stopped_;
}

std::map<std::string, SeriesResult> RunWorkers(std::vector<std::unique_ptr<Worker>>& workers,
                                               const Timing& timing, const StopFlag& stop) {
  std::vector<WorkerTally> tallies(workers.size());
  Window window;
  std::latch go(1);
  std::vector<std::thread> threads;
  threads.reserve(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] {
      go.wait();
      Loop(workers[i].get(), window, stop, &tallies[i]);
    });
  }
  // Written before count_down, read after wait: ordered by the latch.
  window.begin = SteadyClock::now() + timing.warmup;
  window.end = window.begin + timing.measure;
  go.count_down();
  for (auto& t : threads) t.join();

  std::map<std::string, SeriesResult> out;
  std::map<std::string, LatencySamples> samples;
  double seconds = std::chrono::duration<double>(timing.measure).count();
  for (size_t i = 0; i < workers.size(); ++i) {
    auto& r = out[workers[i]->series()];
    const auto& t = tallies[i].result;
    ++r.workers;
    r.ops += t.ops;
    r.all_ops += t.all_ops;
    r.errors += t.errors;
    r.timeouts += t.timeouts;
    if (r.first_error.empty()) r.first_error = t.first_error;
    samples[workers[i]->series()].Merge(tallies[i].samples);
  }
  for (auto& [name, r] : out) {
    r.seconds = seconds;
    r.ops_per_sec = seconds > 0 ? static_cast<double>(r.ops) / seconds : 0;
    r.latency = samples[name].Summarize();
  }
  return out;
}

int64_t ParallelFor(int64_t n, int threads, SteadyClock::time_point deadline,
                    const StopFlag& stop, const std::function<void(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> ran{0};
  std::vector<std::thread> pool;
  int count = static_cast<int>(std::clamp<int64_t>(n, 0, std::max(threads, 1)));
  for (int t = 0; t < count; ++t) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) {
        if (stop.stopped() || SteadyClock::now() >= deadline) return;
        fn(i);
        ++ran;
      }
    });
  }
  for (auto& t : pool) t.join();
  return ran.load();
}

}  // namespace holdfast::bench
