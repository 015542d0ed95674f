// `holdfast lock [--ttl DUR] [--wait DUR] [--shared] [--meta TEXT] [--grace DUR]
//                NS/KEY -- CMD [ARGS...]`
//
// Opens a session, acquires NS/KEY, runs CMD in its own process group with
// HOLDFAST_TOKEN and HOLDFAST_LOCK in its environment, releases when CMD exits
// and exits with CMD's code (127 or 126 when CMD cannot be run). If the hold is
// lost while CMD runs, CMD's group gets SIGTERM, then SIGKILL after --grace, and
// holdfast exits 74. SIGINT, SIGTERM, SIGHUP and SIGQUIT received by holdfast are
// forwarded to CMD's group. If holdfast dies (SIGKILL), CMD's group is killed
// (the kernel kills CMD, and a guard in its group the rest).
// SIGTSTP (Ctrl-Z) stops CMD's group, then holdfast (Stop): nothing runs on
// under a lock nobody renews; when holdfast is continued, CMD's group is
// continued too, after a SIGTERM if the session's deadline passed meanwhile.
// Where no shell could continue holdfast (its process group orphaned: a session
// of its own, or its shell gone), nothing is stopped, as the kernel would not
// stop such a group (ShellCanContinue).
//
// Run by an interactive shell as a job of its own, holdfast lends the terminal to
// CMD's group when the shell gives its own group the terminal, as a shell does
// for a job (JobTerminal): CMD may read it (a prompt, an editor, psql) and gets Ctrl-C
// and Ctrl-Z itself. CMD stopped that way (or by reading the terminal while
// holdfast is in the background) stops holdfast too, so the shell sees its job
// stop; `fg` continues both and lends the terminal again. `fg` of a holdfast
// running in the background (after `bg`, or started with `&`) lends it when the
// shell continues the job (SIGCONT), or else (bash and zsh only give a running
// job the terminal) when CMD next reads or sets the terminal: CMD, stopped for it
// (SIGTTIN, SIGTTOU) while holdfast's group has the terminal, is lent it and
// continued. Anywhere else (no terminal, a pipeline, a script's `&`, a session of
// its own) holdfast keeps its terminal and CMD runs in a background group of it,
// where a read of the terminal stops it; so too from CMD's first stop after the
// shell that started holdfast exited.
//
// The main thread waits for everything (signals, CMD's exit, the session's
// lost signal, the end of the acquire call) through one SignalWaiter.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "cli/signal_waiter.h"
#include "dev/subprocess.h"

namespace holdfast::cli {

namespace {

using std::chrono::milliseconds;

// The longest wait any holdfastd may allow (acquire.max_wait is at most 24h); a
// server set lower refuses a longer one itself, naming its bound.
constexpr milliseconds kMaxWait = std::chrono::hours(24);
constexpr size_t kMaxMetaBytes = 1024;
// How long closing the session may take on the way out after the lock was not
// held (the acquire failed, or a signal ended the wait): holdfast must not sit
// for the call timeout on a holdfastd that went away. A close not answered in
// time leaves the session to its TTL.
constexpr milliseconds kCloseOnExit{2000};
// The longest --grace: a stop that takes longer is a stuck command, and the wait
// must fit the waiter's timeout (milliseconds in an int).
constexpr milliseconds kMaxGrace = std::chrono::hours(1);

// Signals holdfast passes on to CMD's process group. Any signal whose default
// action ends holdfast without it stopping CMD belongs here (SIGQUIT would end
// holdfast with a core dump), as CMD must not run on without the lock.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Flag values as CLI11 fills them in.
struct LockFlags {
  std::string lock;
  std::vector<std::string> command;
  // `--` was given: without it CLI11 would take CMD's own options that share
  // a name with holdfast's (`make --wait 5`) as holdfast's, silently.
  bool separated = false;
  std::string ttl = "15s";
  std::string wait = "0";
  // Empty: the session's safety margin (a tenth of --ttl), the time between the
  // local deadline and the lease's end (Validate).
  std::string grace;
  bool shared = false;
  std::string meta;
};

// The validated request.
struct LockRequest {
  LockRef ref;
  milliseconds ttl{};
  milliseconds grace{};
  AcquireOptions acquire;
  std::vector<std::string> command;
};

// Whether a job-control shell could continue holdfast were it to stop: its
// process group is not orphaned, a member's parent being in its session and
// another group (holdfast's own, when a shell made holdfast's group; the
// script's, when a script started holdfast). The kernel does not stop an orphaned
// group for Ctrl-Z or a read of the terminal (POSIX), as nobody would continue
// it: holdfast leading a session of its own (`ssh -t host holdfast lock ...`), or
// after the shell that started it exited. holdfast's parent is asked first, by
// system calls (a /proc mounted hidepid may hide a parent of another user); the
// other members through /proc. A group whose leader is outside holdfast's pid
// namespace (id 0) cannot be judged, and counts as not orphaned.
bool ShellCanContinue() {
  const pid_t parent = ::getppid();
  const pid_t group = ::getpgrp();
  if (group == 0 || (::getsid(parent) == ::getsid(0) && ::getpgid(parent) != group)) {
    return true;
  }
  return !dev::GroupOrphaned(group, ::getsid(0));
}

// The controlling terminal, when holdfast is a job of its own of an interactive
// shell. While CMD runs, CMD's group is the terminal's foreground group whenever
// holdfast's group would be, so CMD can read the terminal and is sent the
// terminal's signals (a background group reading it is stopped, SIGTTIN).
// holdfast runs with SIGTTOU blocked (SignalWaiter), so that it may write to the
// terminal and take it back from the background without being stopped.
//
// Lent only when lending cannot harm another process:
//  - holdfast's parent is in holdfast's session and another process group: a
//    job-control shell made holdfast's group. Not a script's `&` job, which shares
//    the script's group, and not the leader of a session of its own (`ssh -t host
//    holdfast lock ...`), whose stop no shell would see or continue;
//  - no other process is in holdfast's group: not `holdfast lock k -- make | less`,
//    where `less` would read the terminal from the then-background group and so
//    stop holdfast (SIGTTIN), leaving the lock unrenewed under a running CMD.
// (A process joining holdfast's group after the check is not seen.)
class JobTerminal {
 public:
  static std::unique_ptr<JobTerminal> IfOwnJob() {
    const pid_t parent = ::getppid();
    if (::getsid(parent) != ::getsid(0) || ::getpgid(parent) == ::getpgrp() ||
        dev::GroupHasOtherLiveMember(::getpgrp(), ::getpid())) {
      return nullptr;
    }
    const int fd = ::open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return nullptr;  // no controlling terminal
    return std::unique_ptr<JobTerminal>(new JobTerminal(fd));
  }
  ~JobTerminal() { ::close(fd_); }
  JobTerminal(const JobTerminal&) = delete;
  JobTerminal& operator=(const JobTerminal&) = delete;

  // Whether holdfast's group is the foreground group now.
  bool HeldByOwnGroup() const { return ::tcgetpgrp(fd_) == ::getpgrp(); }
  // Makes `group` the foreground group, if holdfast's group is it now (in the
  // background, holdfast must not take the terminal from the shell). Returns
  // whether `group` is the foreground group now.
  bool LendTo(pid_t group) {
    if (HeldByOwnGroup()) ::tcsetpgrp(fd_, group);
    return ::tcgetpgrp(fd_) == group;
  }
  // Makes holdfast's group the foreground group again, if `group` has it.
  void TakeBackFrom(pid_t group) {
    if (::tcgetpgrp(fd_) == group) ::tcsetpgrp(fd_, ::getpgrp());
  }

 private:
  explicit JobTerminal(int fd) : fd_(fd) {}
  const int fd_;
};

// Job control: SIGTSTP (Ctrl-Z) stops holdfast as it would by default, after
// CMD's group (SIGSTOP, which CMD cannot ignore: it must not run on while
// nobody renews its lock). Returns true once holdfast has been continued; false
// at once, stopping nothing, where no shell could continue it (as the kernel
// ignores Ctrl-Z for an orphaned group). A shell that exits while holdfast is
// stopped orphans a stopped group, which the kernel sends SIGHUP and SIGCONT:
// holdfast continues and passes the SIGHUP on to CMD. (One that exits in the few
// system calls between the check and the stop leaves holdfast stopped.)
bool StopForJobControl(dev::Subprocess* child) {
  if (!ShellCanContinue()) return false;
  if (child != nullptr) child->Signal(SIGSTOP);
  ::kill(::getpid(), SIGSTOP);
  return true;
}

// Whether `pid` is stopped now (not only was, since the last notice).
bool StoppedNow(pid_t pid) {
  auto state = dev::ReadProcState(pid);
  return state && state->state == 'T';
}

bool IsForwarded(int sig) {
  for (int s : kForwardedSignals) {
    if (s == sig) return true;
  }
  return false;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

absl::StatusOr<LockRequest> Validate(const LockFlags& flags) {
  LockRequest r;
  auto ref = ParseLockRef(flags.lock);
  if (!ref.ok()) return ref.status();
  r.ref = *std::move(ref);
  auto ttl = ParseDurationFlag("--ttl", flags.ttl);
  if (!ttl.ok()) return ttl.status();
  if (*ttl < std::chrono::seconds(1)) {
    return absl::InvalidArgumentError("--ttl must be at least 1s");
  }
  r.ttl = *ttl;
  auto wait = ParseDurationFlag("--wait", flags.wait);
  if (!wait.ok()) return wait.status();
  if (*wait > kMaxWait) return absl::InvalidArgumentError("--wait must be at most 24h");
  if (flags.grace.empty()) {
    // A lost hold's CMD gets SIGKILL at about the time its lease could end after a
    // lost renewal (the local deadline is the TTL less this margin), rather than
    // seconds after the next holder may have started. (A force-release frees the
    // key at once: there CMD may run up to the grace past it.)
    r.grace = std::chrono::duration_cast<milliseconds>(*ttl * SessionOptions{}.safety_margin);
  } else {
    auto grace = ParseDurationFlag("--grace", flags.grace);
    if (!grace.ok()) return grace.status();
    if (*grace > kMaxGrace) return absl::InvalidArgumentError("--grace must be at most 1h");
    r.grace = *grace;
  }
  if (flags.meta.size() > kMaxMetaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--meta is ", flags.meta.size(), " bytes, at most ", kMaxMetaBytes));
  }
  if (flags.command.empty()) {
    return absl::InvalidArgumentError("no command given: holdfast lock NS/KEY -- CMD [ARGS...]");
  }
  if (!flags.separated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "put the command after --: holdfast lock [OPTIONS] ", flags.lock, " -- ",
        flags.command[0], " ... (without --, the command's own options could be taken "
        "for holdfast's)"));
  }
  r.acquire.wait = *wait;
  r.acquire.shared = flags.shared;
  r.acquire.holder_meta = flags.meta;
  r.command = flags.command;
  return r;
}

// Leaves at once: an acquire call is still running on another thread and
// cannot be cancelled, so the process must not unwind past it. Closing the
// session first removes anything the call has made in etcd.
[[noreturn]] void AbandonAcquire(Session& session, absl::string_view why, int exit_code) {
  PrintMessage(why);
  (void)session.Close(kCloseOnExit);
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

// Runs the (blocking) OpenSession on a helper thread so that the main thread
// keeps answering signals: with no holdfastd answering, the call waits up to the
// client's rpc timeout. A signal to forward ends the wait at once (the function
// does not return): a session the call may still open holds nothing and ends
// with its TTL.
absl::StatusOr<std::unique_ptr<Session>> OpenSessionInterruptibly(
    Client& client, const LockRequest& request, const SessionOptions& options,
    SignalWaiter& waiter) {
  std::optional<absl::StatusOr<std::unique_ptr<Session>>> result;  // before `done`
  std::atomic<bool> done{false};
  std::thread opener([&] {
    result.emplace(client.OpenSession(request.ref.ns, options));
    done.store(true, std::memory_order_release);
    waiter.Wake();
  });
  while (!done.load(std::memory_order_acquire)) {
    auto event = waiter.Wait(std::nullopt);
    if (event.kind != SignalWaiter::Event::Kind::kSignal) continue;
    if (event.signal == SIGTSTP) {
      StopForJobControl(nullptr);
    } else if (IsForwarded(event.signal)) {
      PrintMessage(absl::StrCat(SignalName(event.signal), " while opening a session in namespace ",
                                request.ref.ns, "; ", request.ref.ToString(), " not acquired"));
      std::fflush(nullptr);
      std::_Exit(128 + event.signal);
    }
  }
  opener.join();
  return *std::move(result);
}

// Runs the (blocking) Acquire on a helper thread so that the main thread keeps
// answering signals. Returns the hold or the acquire's error. A signal to
// forward that arrives while the call runs, or the session's loss, ends the
// wait at once (the function does not return). One that arrives together with
// the answer is returned in *signal_received, and the command must not start.
absl::StatusOr<Hold> AcquireInterruptibly(Session& session, const LockRequest& request,
                                          SignalWaiter& waiter, int* signal_received) {
  std::optional<absl::StatusOr<Hold>> result;  // written by `acquirer` before `done`
  std::atomic<bool> done{false};
  std::thread acquirer([&] {
    result.emplace(session.Acquire(request.ref.key, request.acquire));
    done.store(true, std::memory_order_release);
    waiter.Wake();
  });
  *signal_received = 0;
  for (;;) {
    auto event = waiter.Wait(std::nullopt);
    bool finished = done.load(std::memory_order_acquire);
    if (event.kind == SignalWaiter::Event::Kind::kSignal && event.signal == SIGTSTP) {
      StopForJobControl(nullptr);  // the wait goes on when continued
      continue;
    }
    if (event.kind == SignalWaiter::Event::Kind::kSignal && IsForwarded(event.signal)) {
      if (finished) {
        *signal_received = event.signal;
        break;
      }
      AbandonAcquire(session,
                     absl::StrCat(SignalName(event.signal), " while waiting for ",
                                  request.ref.ToString(), "; not acquired"),
                     128 + event.signal);
    }
    if (finished) break;
    if (session.lost()) {
      AbandonAcquire(session,
                     absl::StrCat("session lost while waiting for ", request.ref.ToString(),
                                  ": ", session.lost_reason().ToString()),
                     kExitError);
    }
  }
  acquirer.join();
  return *std::move(result);
}

int ReportAcquireError(const absl::Status& status, const LockRequest& request) {
  std::string lock = request.ref.ToString();
  if (status.code() == absl::StatusCode::kAborted) {
    PrintMessage(absl::StrCat(lock, " is held by another session; not acquired (",
                              status.ToString(), ")"));
    return kExitNotAcquired;
  }
  // A wait that ended with no connection to holdfastd is an error, not a busy
  // lock: nothing says the lock was held, so the exit status must not say it.
  if (status.code() == absl::StatusCode::kDeadlineExceeded && !Unreachable(status)) {
    PrintMessage(absl::StrCat(lock, " was not granted within --wait; not acquired (",
                              status.ToString(), ")"));
    return kExitNotAcquired;
  }
  return ReportError(status, absl::StrCat("acquire ", lock));
}

// Must run on the main thread: CMD is killed when the thread that started it
// ends (kill_with_parent), and only the main thread lives as long as Supervise.
absl::StatusOr<std::unique_ptr<dev::Subprocess>> StartCommand(const LockRequest& request,
                                                              const Hold& hold) {
  dev::SpawnOptions options;
  options.argv = request.command;
  options.env = {{"HOLDFAST_TOKEN", absl::StrCat(hold.token())},
                 {"HOLDFAST_LOCK", request.ref.ToString()}};
  options.new_process_group = true;
  options.kill_on_destroy = true;
  // If holdfast dies without stopping CMD (SIGKILL, a crash), CMD must not run
  // on without the lock, which its session's TTL soon hands to someone else;
  // nor may what CMD started in its group (`sh -c 'migrate; reindex'`).
  options.kill_with_parent = true;
  options.kill_group_with_parent = true;
  return dev::Subprocess::Spawn(std::move(options));
}

// The exit code for a CMD that could not be started, as a shell has it: 127 not
// found, 126 found but not runnable; 1 when holdfast itself failed (fork...).
int ReportStartError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      PrintMessage(status.message());
      return kExitCommandNotFound;
    case absl::StatusCode::kFailedPrecondition:
      PrintMessage(status.message());
      return kExitCommandNotRunnable;
    default:
      return ReportError(status, "run the command");
  }
}

// Sends SIGKILL to CMD's group at a set time from a thread of its own: the kill
// after a loss must not wait for the main thread, which may be blocked writing
// to a stderr nobody reads (a pipe to a pager, a stalled journal) while CMD's
// group runs on without the lock. Disarmed before CMD is reaped: the group's id,
// which the unreaped CMD keeps taken, cannot name another group when it fires.
class GroupKiller {
 public:
  using Clock = std::chrono::steady_clock;
  explicit GroupKiller(dev::Subprocess& child) : child_(child) {}
  ~GroupKiller() { Disarm(); }
  GroupKiller(const GroupKiller&) = delete;
  GroupKiller& operator=(const GroupKiller&) = delete;

  // Once; later calls change nothing.
  void ArmAt(Clock::time_point at) {
    std::lock_guard l(mu_);
    if (thread_.joinable() || disarmed_) return;
    thread_ = std::thread([this, at] {
      std::unique_lock l(mu_);
      if (!cv_.wait_until(l, at, [this] { return disarmed_; })) child_.SignalGroup(SIGKILL);
    });
  }

  // Before CMD is reaped. Returns once the thread has ended.
  void Disarm() {
    {
      std::lock_guard l(mu_);
      disarmed_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  dev::Subprocess& child_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool disarmed_ = false;  // guarded by mu_
  std::thread thread_;
};

struct CommandOutcome {
  int exit_code = 0;
  bool hold_lost = false;
  bool terminal_lent = false;  // to the end: the terminal's Ctrl-C went to CMD
};

// Waits for CMD to exit, forwarding signals to its group, and stops it when the
// hold is lost: SIGTERM, then SIGKILL once `request.grace` has passed, to every
// process of CMD's group, also those left after CMD itself exited (they ran under
// the hold too). (A hold of an open class that is only unprotected keeps CMD
// running.) When CMD exits with the hold kept, what it left running in its group
// is not touched: that is CMD's to manage, and it runs without the lock; but
// after a signal holdfast passed on, the rest of the group gets --grace from the
// signal, then SIGKILL, before the release.
CommandOutcome Supervise(dev::Subprocess& child, const Session& session, const Hold& hold,
                         const LockRequest& request, SignalWaiter& waiter,
                         JobTerminal* terminal) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> kill_at;  // set once the loss is handled
  bool killed = false;
  // Set when holdfast first passed a signal on to CMD's group: holdfast started
  // that stop, so CMD's exit does not end it; the rest of the group has until
  // then (--grace after the signal) before SIGKILL, and the lock is released
  // only once the group is gone.
  std::optional<Clock::time_point> forwarded_until;
  GroupKiller killer(child);
  // Signal first, then tell: a write to stderr may fail (a closed pipe) or
  // block, and must not keep CMD running without the lock (the SIGKILL after
  // the grace is the killer's, which a blocked write does not hold back).
  // Each signal is followed by SIGCONT, so that a CMD stopped on its own (a read
  // from the terminal: SIGTTIN) acts on it rather than holding the lock stopped.
  auto stop_command = [&](const std::string& why) {
    child.Signal(SIGTERM);
    child.Signal(SIGCONT);
    kill_at = Clock::now() + request.grace;
    killer.ArmAt(*kill_at);
    PrintMessage(absl::StrCat("lost the hold on ", request.ref.ToString(), " (", why,
                              "); stopping the command: SIGTERM, SIGKILL after ",
                              request.grace.count(), "ms"));
  };
  // Stops CMD's group and holdfast (job control), and continues both once
  // holdfast is continued.
  auto stop_with_command = [&] {
    if (terminal) terminal->TakeBackFrom(child.pid());
    if (!StopForJobControl(&child)) {
      // The shell exited since the caller's check: as in Supervise's branch for
      // that, holdfast lends the terminal no more.
      terminal = nullptr;
      return;
    }
    // Continued. Nothing renewed the session while holdfast was stopped: past
    // its deadline the lock may be someone else's, so CMD gets its SIGTERM
    // before it runs again (the keepalive pump may not have said so yet).
    if (!kill_at && (hold.lost() || Clock::now() >= session.deadline())) {
      stop_command(hold.lost() ? hold.lost_reason().ToString()
                               : "holdfast was stopped past the session's deadline");
    }
    while (child.TakeStop()) {
    }  // the stop holdfast made: not one to follow
    if (terminal) terminal->LendTo(child.pid());
    child.Signal(SIGCONT);
  };
  // Exited(), not Running(): CMD is reaped only at the end, so that its pid, the
  // group's id, stays taken while the rest of its group is signalled.
  while (!child.Exited()) {
    if (!kill_at && hold.lost()) stop_command(hold.lost_reason().ToString());
    std::optional<milliseconds> timeout;
    if (kill_at && !killed) {
      timeout = std::max(milliseconds(0),
                         std::chrono::ceil<milliseconds>(*kill_at - Clock::now()));
    }
    auto event = waiter.Wait(timeout);
    const bool signalled = event.kind == SignalWaiter::Event::Kind::kSignal;
    if (signalled && event.signal == SIGTSTP) {
      // Ignored where no shell could continue holdfast, as the kernel would.
      if (ShellCanContinue()) stop_with_command();
    } else if (signalled && IsForwarded(event.signal)) {
      child.Signal(event.signal);
      child.Signal(SIGCONT);
      if (!forwarded_until) forwarded_until = Clock::now() + request.grace;
    } else if (event.kind == SignalWaiter::Event::Kind::kTimeout && kill_at && !killed &&
               Clock::now() >= *kill_at && !child.Exited()) {
      child.Signal(SIGKILL);
      killed = true;
    } else if (signalled && event.signal == SIGCONT) {
      // `fg` of holdfast running in the background (`bg`, or started with `&`),
      // from a shell that continues a running job too: the terminal is
      // holdfast's group's now, and so CMD's.
      if (terminal) terminal->LendTo(child.pid());
    } else if (terminal && !kill_at) {
      // (SIGCHLD, or a wake-up.) Did CMD stop on its own in a terminal?
      const int stop = child.TakeStop();
      if (stop == 0 || !StoppedNow(child.pid())) continue;
      if ((stop == SIGTTIN || stop == SIGTTOU) && terminal->LendTo(child.pid())) {
        // CMD read or set the terminal from the background, yet the job is in
        // the foreground: `fg` of holdfast running in the background, from a
        // shell that gives a running job the terminal without SIGCONT. Lent the
        // terminal, CMD retries and succeeds.
        child.Signal(SIGCONT);
      } else if (ShellCanContinue()) {
        // Ctrl-Z (the terminal's SIGTSTP goes to its foreground group, CMD's),
        // or a read of the terminal from the background. holdfast stops too, so
        // that its shell sees the job stop and takes the terminal back; `fg`
        // continues holdfast, which lends the terminal to CMD and continues it.
        stop_with_command();
      } else {
        // No shell could continue the job any more: the one that started
        // holdfast exited. holdfast runs on, renewing, leaves CMD stopped, and
        // lends the terminal no more: if CMD's group had it, holdfast's has it
        // now (Ctrl-C reaches holdfast, which passes it on), as in a terminal
        // it keeps.
        terminal->TakeBackFrom(child.pid());
        terminal = nullptr;
      }
    }
  }
  // CMD is gone but others of its group may not be (one that ignores SIGTERM,
  // or still shutting down): after a loss, or a signal holdfast passed on, the
  // rest of the grace, then SIGKILL. SIGKILL is sent whatever the scan of the
  // group says (it can miss a process forking as it reads): CMD, not reaped yet,
  // keeps the group's id taken, so the signal reaches no other group.
  std::optional<Clock::time_point> until = kill_at ? kill_at : forwarded_until;
  if (until && !killed) {
    while (child.GroupAlive() && Clock::now() < *until) {
      auto event = waiter.Wait(milliseconds(20));
      if (event.kind == SignalWaiter::Event::Kind::kSignal && IsForwarded(event.signal)) {
        child.SignalGroup(event.signal);
      }
      if (!kill_at && hold.lost()) break;  // lost meanwhile: no grace left to give
    }
    child.SignalGroup(SIGKILL);
  }
  CommandOutcome outcome;
  outcome.hold_lost = kill_at.has_value();
  if (!outcome.hold_lost && hold.lost()) {
    // Lost at about the time CMD ended: it may have run unprotected at the end,
    // and what it left in its group runs without the lock.
    child.SignalGroup(SIGKILL);
    PrintMessage(absl::StrCat("lost the hold on ", request.ref.ToString(),
                              " before the command's exit was seen (",
                              hold.lost_reason().ToString(), ")"));
    outcome.hold_lost = true;
  }
  killer.Disarm();  // before the reap frees the group's id
  outcome.exit_code = *child.Wait();
  outcome.terminal_lent = terminal != nullptr;
  return outcome;
}

// Returns false when the hold was found no longer current as it was released
// (lost locally, or released, expired or forced in etcd before the renewals said
// so): CMD may have run at its end without the lock.
bool ReleaseAndClose(Hold& hold, Session& session, const LockRequest& request) {
  absl::Status closed;
  const bool lost_before = hold.lost() || session.lost();
  absl::Status released = lost_before ? absl::OkStatus() : hold.Release();
  const bool not_current = released.code() == absl::StatusCode::kFailedPrecondition ||
                           released.code() == absl::StatusCode::kNotFound;
  if (lost_before || not_current) {
    PrintMessage(absl::StrCat("the hold on ", request.ref.ToString(),
                              " was no longer current when the command ended (",
                              lost_before ? hold.lost_reason().ToString() : released.ToString(),
                              "): the command may have run without the lock at its end"));
    closed = session.Close(kCloseOnExit);
  } else if (auto s = released; !s.ok()) {
    PrintMessage(absl::StrCat("warning: release of ", request.ref.ToString(),
                              " failed (", s.ToString(), "); closing the session ends it"));
    // Most often no holdfastd answered the release's whole call timeout.
    closed = session.Close(kCloseOnExit);
  } else {
    closed = session.Close();
  }
  if (auto s = closed; !s.ok()) {
    PrintMessage(absl::StrCat("warning: closing the session failed (", s.ToString(),
                              "); its holds end when its TTL runs out"));
  }
  return !(lost_before || not_current);
}

int RunLock(const GlobalOptions& global, const LockFlags& flags) {
  auto request = Validate(flags);
  if (!request.ok()) return ReportUsageError(request.status());
  // A command that is not there (a typo) is said before the lock is waited for,
  // taken and released for nothing: 127 or 126 as below, nothing sent.
  if (auto found = dev::FindProgram(request->command[0]); !found.ok()) {
    return ReportStartError(found);
  }
  // Before any thread exists (the client starts some).
  std::vector<int> signals(std::begin(kForwardedSignals), std::end(kForwardedSignals));
  signals.push_back(SIGCHLD);
  signals.push_back(SIGTSTP);
  // Blocked, never waited for: holdfast writes to its terminal and takes it back
  // from CMD (JobTerminal) from the background without being stopped.
  signals.push_back(SIGTTOU);
  // Continues holdfast all the same (blocking does not hold that back); seen, it
  // tells holdfast that the shell may have given it the terminal (`fg`).
  signals.push_back(SIGCONT);
  auto waiter = SignalWaiter::Create(signals);
  if (!waiter.ok()) return ReportError(waiter.status());

  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  SessionOptions session_options;
  session_options.ttl = request->ttl;
  session_options.on_lost = [w = waiter->get()](const absl::Status&) { w->Wake(); };
  auto session = OpenSessionInterruptibly(*client, *request, session_options, **waiter);
  if (!session.ok()) {
    return ReportError(session.status(),
                       absl::StrCat("open a session in namespace ", request->ref.ns));
  }
  int signal_received = 0;
  auto hold = AcquireInterruptibly(**session, *request, **waiter, &signal_received);
  if (!hold.ok()) {
    (void)(*session)->Close(kCloseOnExit);
    if (signal_received != 0) {
      // The signal ended holdfast's wait as much as the answer did: its exit
      // status says so, as for a signal that came first.
      PrintMessage(absl::StrCat(SignalName(signal_received), " while waiting for ",
                                request->ref.ToString(), "; not acquired (",
                                hold.status().ToString(), ")"));
      return 128 + signal_received;
    }
    return ReportAcquireError(hold.status(), *request);
  }
  if (signal_received != 0) {
    PrintMessage(absl::StrCat(SignalName(signal_received), " as ", request->ref.ToString(),
                              " was granted; released without running the command"));
    ReleaseAndClose(*hold, **session, *request);
    return 128 + signal_received;
  }
  // Past the session's deadline (holdfast was stopped, Ctrl-Z, while the grant
  // came): the lock may be someone else's already, whatever the keepalive pump
  // has not said yet.
  const bool past_deadline = std::chrono::steady_clock::now() >= (*session)->deadline();
  if (hold->lost() || past_deadline) {
    PrintMessage(absl::StrCat("the session was lost as ", request->ref.ToString(),
                              " was granted (",
                              hold->lost() ? hold->lost_reason().ToString()
                                           : "its deadline passed while holdfast was stopped",
                              "); the command was not run"));
    // A way out without the lock: closed within kCloseOnExit, not the call
    // timeout ~Session would wait (holdfastd may be gone). Closed first, the
    // session also spares ~Hold a release call.
    (void)(*session)->Close(kCloseOnExit);
    return kExitError;
  }

  auto child = StartCommand(*request, *hold);
  if (!child.ok()) {
    int code = ReportStartError(child.status());
    ReleaseAndClose(*hold, **session, *request);
    return code;
  }
  if (!(*child)->guarded()) {
    PrintMessage(
        "warning: no guard could be put in the command's process group; if holdfast is "
        "killed, processes the command started may outlive it");
  }
  // Lent to CMD at once: it may read the terminal from its first instruction (a
  // read before this is stopped, SIGTTIN, and continued here).
  std::unique_ptr<JobTerminal> terminal = JobTerminal::IfOwnJob();
  if (terminal) {
    terminal->LendTo((*child)->pid());
    while ((*child)->TakeStop()) {
    }  // not a stop to follow
    (*child)->Signal(SIGCONT);
  }
  CommandOutcome outcome =
      Supervise(**child, **session, *hold, *request, **waiter, terminal.get());
  if (terminal) terminal->TakeBackFrom((*child)->pid());
  if (outcome.hold_lost) {
    // Lost mostly because holdfastd stopped answering: do not wait for it.
    (void)(*session)->Close(kCloseOnExit);
    return kExitHoldLost;
  }
  if (!ReleaseAndClose(*hold, **session, *request)) return kExitHoldLost;
  if (outcome.terminal_lent && (*child)->killed_by() == SIGINT) {
    // Ctrl-C went to CMD alone (it had the terminal). A shell running holdfast
    // from a script stops the script only if holdfast dies of SIGINT too
    // (exiting 130 says "handled"), as it would have had it received the Ctrl-C.
    std::fflush(nullptr);
    ::signal(SIGINT, SIG_DFL);
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    ::pthread_sigmask(SIG_UNBLOCK, &sigint, nullptr);
    ::raise(SIGINT);
  }
  return outcome.exit_code;
}

}  // namespace

void RegisterLockCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<LockFlags>();
  CLI::App* cmd = app.add_subcommand(
      "lock", "Run a command while holding a lock: holdfast lock NS/KEY -- CMD [ARGS...]");
  cmd->add_option("--ttl", flags->ttl, "session TTL: how long the hold outlives a crash")
      ->capture_default_str();
  cmd->add_option("--wait", flags->wait, "how long to wait for the lock; 0 tries once")
      ->capture_default_str();
  cmd->add_flag("--shared", flags->shared, "take a shared hold (classes of mode S)");
  cmd->add_option("--meta", flags->meta, "text shown to operators by `holdfast holders`");
  cmd->add_option("--grace", flags->grace,
                  "after the hold is lost, or a signal passed on: time between the signal "
                  "and SIGKILL to what is left of the command's group; default a tenth of "
                  "--ttl (the session's safety margin), at most 1h");
  cmd->add_option("lock", flags->lock, "NS/KEY: namespace, '/', lock key")->required();
  // Not required(): Validate says what is missing in holdfast's words.
  cmd->add_option("command", flags->command, "the command to run (after --) and its arguments");
  // Separated only when what follows the first `--` is the command, word for
  // word: not a `--` at the end (`make --shared --`), nor one taken as a value.
  cmd->parse_complete_callback([flags, &ctx] {
    auto dashes = std::find(ctx.args.begin(), ctx.args.end(), "--");
    flags->separated = dashes != ctx.args.end() &&
                       std::equal(std::next(dashes), ctx.args.end(), flags->command.begin(),
                                  flags->command.end());
  });
  SetAction(cmd, ctx, flags, RunLock);
}

}  // namespace holdfast::cli
