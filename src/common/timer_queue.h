// A single-threaded timer wheel for deadlines of asynchronous operations.
//
// Thread-safe: Schedule() and Cancel() may be called from any thread. Callbacks run
// on the queue's own thread, one at a time, and must not block (they may call
// Schedule/Cancel). A callback runs at most once; after Cancel() returns true it
// never runs. After Stop() (or destruction) no callback runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast {

class TimerQueue {
 public:
  using Clock = std::chrono::steady_clock;
  using TimerId = uint64_t;

  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at or after `when`. Returns an id for Cancel().
  TimerId Schedule(Clock::time_point when, std::function<void()> fn);
  TimerId ScheduleAfter(Clock::duration d, std::function<void()> fn) {
    return Schedule(Clock::now() + d, std::move(fn));
  }
  // True if the timer was pending and will now never run; false if it has run,
  // is running, or was never scheduled.
  bool Cancel(TimerId id);

  // Ends the queue's thread (after a callback running now) and drops every
  // pending timer, destroying its callback here; later Schedule calls drop theirs
  // (and return 0), and Cancel of a dropped one returns false: only for an owner
  // none of whose users waits for a timer to run (the destructor's case). Not
  // from a callback. Idempotent.
  void Stop();

 private:
  void Run();

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when stop_ is set or an earlier timer is added
  std::multimap<Clock::time_point, std::pair<TimerId, std::function<void()>>> timers_
      ABSL_GUARDED_BY(mu_);
  std::map<TimerId, Clock::time_point> when_ ABSL_GUARDED_BY(mu_);
  TimerId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace holdfast
