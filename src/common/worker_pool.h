// A fixed set of threads that run blocking work off the event loop (common/
// event_loop.h): holdfastd's admin calls, which wait for several etcd round trips
// or for the audit store.
//
// Thread-safe. Run() queues `fn`; the pool's threads take the queue in order, so
// at most `threads` functions run at once and the rest wait their turn. The
// threads never poll gRPC, so they take nothing from the loop (event_loop.h says
// why that matters).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast {

class WorkerPool {
 public:
  WorkerPool(int threads, std::string name);
  // Stop().
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `fn`. After Stop() it is dropped unrun (and false is returned).
  bool Run(std::function<void()> fn);
  // Runs what is queued, refuses the rest, and joins the threads. Idempotent;
  // not from a pool thread.
  void Stop();

 private:
  void Work();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace holdfast
