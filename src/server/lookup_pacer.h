// Paces, per caller identity, the etcd reads that KeepAlive makes for sessions
// new to this replica (server/session_service.cc). A session the replica has
// seen is renewed without a read; one it has not costs a read of the session
// record (and, for a caller not a member, of the namespace record) before the
// renewal. Without a bound, any authenticated identity could drive etcd's read
// load with made-up session ids on a stream.
//
// The bound: each identity has a bucket of `burst` tokens, refilled at
// `per_second`. A lookup takes a token when it starts; one that finds a session
// the caller may renew gives it back (GiveBack), and so does one that made no
// read. So a caller's real sessions cost it nothing, however many arrive at once
// (a replica restarted, or clients moved to it: they go about `burst` at a time,
// as fast as etcd answers), while lookups that find nothing, or that etcd does
// not answer (when etcd struggles, made-up ids must not add to it), are held to
// `per_second` over time. A lookup without a token waits, in arrival order per
// identity, until one comes back or is refilled: its renewal is answered late,
// not refused, so a holder is not told its session is in doubt because of what
// another stream of its identity did. (A renewal waiting long enough is late for
// its TTL like any renewal in a slow moment; only an identity that keeps asking
// for sessions that do not exist gets there.) Past `max_waiting` waiting lookups
// of one identity, more are refused (the caller leaves them unanswered).
//
// Thread-safe. Lookups run never under the pacer's lock: on the thread that
// calls Run, or, when they waited, on the thread whose GiveBack or timer gave
// them a token (one identity's waiting lookups run one after another there, in
// a loop, never nested in each other's calls).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::server {

class LookupPacer {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // Runs `fn` once, after `delay` (a timer of the server's).
  using Schedule = std::function<void(std::chrono::steady_clock::duration delay,
                                      std::function<void()> fn)>;

  struct Options {
    double per_second = 100;  // 0: no bound
    double burst = 1000;      // at least 1
    // Lookups of one identity that may wait; past it, Run refuses (kFull).
    size_t max_waiting = 16384;
  };
  enum class Admission {
    kRan,    // run at once
    kWaits,  // waits for a token (it may have run already, on another thread)
    kFull,   // not run, and will not be: max_waiting of the identity's wait
  };

  LookupPacer(Options options, Schedule schedule,
              Clock clock = std::chrono::steady_clock::now);
  ~LookupPacer();

  // Runs `lookup` now when `identity` has a token and none of its lookups waits,
  // else once a token comes (in order), unless max_waiting of them wait. The
  // lookup holds its token until GiveBack, or for good.
  Admission Run(const std::string& identity, std::function<void()> lookup);
  // The lookup found the caller's session, or was not made: its token comes
  // back.
  void GiveBack(const std::string& identity);
  // Runs every waiting lookup now, and every later one at once (the replica is
  // stopping: its streams must be able to finish).
  void Stop();

  // Lookups waiting, over all identities.
  size_t waiting() const;
  // Identities with state kept (a bucket not full, or lookups waiting).
  size_t identities() const;

 private:
  struct State;
  // Runs `identity`'s waiting lookups that have a token, and arms a timer for
  // the rest (holding the state weakly).
  static void Drain(const std::shared_ptr<State>& state, const std::string& identity,
                    bool from_timer);
  std::shared_ptr<State> state_;  // timers hold it weakly: they may outlive the pacer
};

}  // namespace holdfast::server
