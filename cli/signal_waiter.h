// Waiting, without busy-waiting, for signals (SIGINT, SIGTERM, SIGCHLD...) and
// for wake-ups from other threads, in one place: a signalfd and an eventfd
// polled together. No work ever runs in a signal handler.
//
// Create it on the main thread before any other thread starts (before
// Client::Connect): it blocks the signals in the calling thread, so every thread
// started later inherits the mask and the signals are seen only through Wait().
// The signals stay blocked for the rest of the process. Children started with
// dev::Subprocess reset their signal mask. Waiting for SIGCHLD, it sets that
// signal's action to the default: ignored (SIG_IGN) as a launcher may leave it,
// the kernel would reap the children before their exit could be seen.
//
// Thread-safety: Wait() is called by one thread (the owner); Wake() may be
// called from any thread at any time while the object lives.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace holdfast::cli {

class SignalWaiter {
 public:
  // Errors: INTERNAL (signalfd or eventfd failed).
  static absl::StatusOr<std::unique_ptr<SignalWaiter>> Create(const std::vector<int>& signals);
  ~SignalWaiter();
  SignalWaiter(const SignalWaiter&) = delete;
  SignalWaiter& operator=(const SignalWaiter&) = delete;

  struct Event {
    enum class Kind { kSignal, kWake, kTimeout };
    Kind kind;
    int signal = 0;  // set for kSignal
  };

  // Blocks until a signal arrives, Wake() is called, or `timeout` passes
  // (nullopt: no timeout). Pending signals come before wake-ups; several
  // Wake() calls since the last Wait() are reported once.
  Event Wait(std::optional<std::chrono::milliseconds> timeout);

  // Makes the current or next Wait() return kWake.
  void Wake();

 private:
  SignalWaiter(int signal_fd, int wake_fd) : signal_fd_(signal_fd), wake_fd_(wake_fd) {}
  std::optional<Event> ReadReady(bool signal_ready, bool wake_ready);

  const int signal_fd_;
  const int wake_fd_;
};

}  // namespace holdfast::cli
