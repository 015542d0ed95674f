#include "common/worker_pool.h"

#include <pthread.h>

namespace holdfast {

WorkerPool::WorkerPool(int threads, std::string name) : name_(std::move(name)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::Run(std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(fn));
  return true;
}

void WorkerPool::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool WorkerPool::ReadyLocked() const { return stopping_ || !queue_.empty(); }

void WorkerPool::Work() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &WorkerPool::ReadyLocked));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace holdfast
