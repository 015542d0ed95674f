#include "cli/signal_waiter.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace holdfast::cli {

absl::StatusOr<std::unique_ptr<SignalWaiter>> SignalWaiter::Create(
    const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) {
    sigaddset(&set, s);
    if (s == SIGCHLD) ::signal(SIGCHLD, SIG_DFL);
  }
  if (int e = pthread_sigmask(SIG_BLOCK, &set, nullptr); e != 0) {
    return absl::InternalError(absl::StrCat("pthread_sigmask: ", std::strerror(e)));
  }
  int signal_fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    return absl::InternalError(absl::StrCat("signalfd: ", std::strerror(errno)));
  }
  int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    int e = errno;
    ::close(signal_fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(e)));
  }
  return std::unique_ptr<SignalWaiter>(new SignalWaiter(signal_fd, wake_fd));
}

SignalWaiter::~SignalWaiter() {
  ::close(signal_fd_);
  ::close(wake_fd_);
}

void SignalWaiter::Wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

std::optional<SignalWaiter::Event> SignalWaiter::ReadReady(bool signal_ready, bool wake_ready) {
  if (signal_ready) {
    signalfd_siginfo info;
    if (::read(signal_fd_, &info, sizeof info) == sizeof info) {
      return Event{Event::Kind::kSignal, static_cast<int>(info.ssi_signo)};
    }
  }
  if (wake_ready) {
    uint64_t count;
    if (::read(wake_fd_, &count, sizeof count) == sizeof count) {
      return Event{Event::Kind::kWake};
    }
  }
  return std::nullopt;
}

SignalWaiter::Event SignalWaiter::Wait(std::optional<std::chrono::milliseconds> timeout) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> until;
  if (timeout) until = Clock::now() + *timeout;
  for (;;) {
    int wait_ms = -1;
    if (until) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - Clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, wait_ms);
    if (n < 0 && errno != EINTR) return Event{Event::Kind::kTimeout};
    if (n > 0) {
      if (auto event = ReadReady(fds[0].revents & POLLIN, fds[1].revents & POLLIN)) {
        return *event;
      }
    }
    if (until && Clock::now() >= *until) return Event{Event::Kind::kTimeout};
  }
}

}  // namespace holdfast::cli
