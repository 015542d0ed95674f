#include "common/timer_queue.h"

#include "absl/time/clock.h"

namespace holdfast {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() { Stop(); }

void TimerQueue::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
  decltype(timers_) dropped;
  {
    absl::MutexLock l(&mu_);
    dropped.swap(timers_);
    when_.clear();
  }
  // `dropped` goes here, outside the lock: a callback's captures may schedule or
  // cancel as they are destroyed.
}

TimerQueue::TimerId TimerQueue::Schedule(Clock::time_point when, std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  if (stop_) return 0;  // `fn` goes as this returns
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
