#include "common/timer_queue.h"

#include "absl/time/clock.h"

namespace holdfast {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  thread_.join();
}

TimerQueue::TimerId TimerQueue::Schedule(Clock::time_point when, std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  TimerId id = next_id_++;
  bool earliest = timers_.empty() || when < timers_.begin()->first;
  timers_.emplace(when, std::make_pair(id, std::move(fn)));
  when_.emplace(id, when);
  if (earliest) cv_.Signal();
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  absl::MutexLock l(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) return false;
  auto range = timers_.equal_range(it->second);
  for (auto t = range.first; t != range.second; ++t) {
    if (t->second.first == id) {
      timers_.erase(t);
      break;
    }
  }
  when_.erase(it);
  return true;
}

void TimerQueue::Run() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    if (timers_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    auto first = timers_.begin();
    auto now = Clock::now();
    if (first->first > now) {
      auto wait = std::chrono::duration_cast<std::chrono::microseconds>(first->first - now);
      cv_.WaitWithTimeout(&mu_, absl::Microseconds(wait.count()));
      continue;
    }
    std::function<void()> fn = std::move(first->second.second);
    when_.erase(first->second.first);
    timers_.erase(first);
    mu_.Unlock();
    fn();  // never under the lock
    mu_.Lock();
  }
}

}  // namespace holdfast
