// Child processes for `holdfast dev`, `holdfast lock` and the test harness.
//
// Thread-compatible: one owner drives a Subprocess. The child runs in its own
// process group (so signals reach its children too) and, by default, is killed
// with its group when the Subprocess is destroyed.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace holdfast::dev {

struct SpawnOptions {
  // argv[0] is the program: a path, or a name looked up in the PATH of this
  // process's environment (not in `env`).
  std::vector<std::string> argv;
  // Added to (or replacing in) the parent's environment; of two entries of one
  // name, the later wins.
  std::vector<std::pair<std::string, std::string>> env;
  // Entries of the parent's environment whose names start with one of these are
  // left out (before `env` is put in): "ETCD_" keeps a caller's etcd settings
  // away from an etcd started here.
  std::vector<std::string> drop_env_prefixes;
  // Appends stdout and stderr here; empty: inherit the parent's.
  std::string log_file;
  // Put the child in a new process group (signals then go to the whole group).
  bool new_process_group = true;
  // Kill the group when this object is destroyed while the child runs.
  bool kill_on_destroy = true;
  // Have the kernel SIGKILL the child when the thread that called Spawn() ends,
  // as it does when this process dies, even of SIGKILL (Linux PR_SET_PDEATHSIG),
  // so that the child cannot outlive its supervisor. It is the spawning
  // *thread* that counts, not the process: call Spawn() from a thread that lives
  // as long as the child is to run (the main thread). Only the child itself is
  // covered, not the processes it starts; and the setting is dropped when the
  // child execs a set-user-ID or set-group-ID program (sudo) or one with file
  // capabilities.
  bool kill_with_parent = false;
  // With new_process_group and kill_with_parent: every process of the child's
  // group is killed when the spawning thread ends, not only the child (`sh -c
  // 'prepare; worker'`: the worker too). A guard process joins the group before
  // the child execs (the child waits for it): a fork of this process named
  // `holdfast-guard` that runs no program, holds no file descriptor and waits
  // with every signal blocked, so what is sent to the group (a forwarded
  // SIGTERM, Ctrl-C) leaves it be; SIGSTOP stops it and SIGCONT continues it
  // with the group, SIGKILL ends it. Woken by the kernel when its parent thread
  // ends (PR_SET_PDEATHSIG, SIGUSR1), it checks that the thread that forked it,
  // or the whole process, is gone (the same signal from anyone else changes
  // nothing) and sends SIGKILL to its group, itself included. Being in the
  // group, it keeps the group's id taken: the kill cannot reach a group that
  // took the id later. GroupAlive() does not count it. It ends when the child is
  // reaped (Running(), Wait()) or this object is destroyed, after sending the
  // group SIGKILL itself if the spawning thread has ended: what the child leaves
  // running after that is not covered, nor is a process that leaves the group
  // (setsid, setpgid) or that this process may not signal. A guard that could
  // not be started (fork failed, or it was not in place within 10 s) leaves the
  // child unguarded: see guarded().
  bool kill_group_with_parent = false;
};

class Subprocess {
 public:
  // Errors: INVALID_ARGUMENT (empty argv); NOT_FOUND (the program does not
  // exist: exec failed with ENOENT); FAILED_PRECONDITION (it exists but could
  // not be run: exec failed otherwise, EACCES...); both say "cannot run PROGRAM:
  // <strerror>". INTERNAL (the log file, pipe or fork failed).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(SpawnOptions options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Whether kill_group_with_parent's guard is in place (false without it).
  bool guarded() const { return guard_pid_ > 0; }
  // True while the child has not exited (reaps it when it has).
  bool Running();
  // True once the child has exited, without reaping it: until Running() or
  // Wait() reaps it, its pid, and so its process group's id, cannot be given to
  // another process.
  bool Exited();
  // The signal that stopped the child (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU) if it
  // stopped since the last call, else 0: takes the stop's notice (waitid
  // WSTOPPED), once per stop.
  int TakeStop();
  // Waits for exit; returns the exit code, or 128 + signal when killed.
  // nullopt when `timeout` passed first.
  std::optional<int> Wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // The signal that killed the child, once reaped; 0 if it exited.
  int killed_by() const { return killed_by_; }
  // Sends `sig` to the child's process group (or the child alone).
  void Signal(int sig);
  // With a process group of its own: whether a live process of the group other
  // than the child (and its guard) is left (zombies do not count), and sending
  // `sig` to the group.
  // Meant for after Exited() and before the child is reaped: the unreaped child
  // keeps the group's id taken, so `sig` cannot reach a group that took the id
  // after the last of this one had gone. (Linux: reads /proc.) False and no-ops
  // without a group.
  bool GroupAlive() const;
  void SignalGroup(int sig);
  // SIGTERM, then SIGKILL after `grace`; returns the exit status as Wait().
  int Stop(std::chrono::milliseconds grace = std::chrono::seconds(5));

 private:
  explicit Subprocess(pid_t pid, SpawnOptions options)
      : pid_(pid), options_(std::move(options)) {}
  // Takes the child's exit status from waitpid(), and ends the guard.
  void Reaped(int status);
  // Kills and reaps the guard, if there is one.
  void EndGuard();
  pid_t pid_;
  pid_t guard_pid_ = -1;  // kill_group_with_parent's guard, -1: none
  // Set once the thread that called Spawn() has ended.
  std::shared_ptr<const std::atomic<bool>> spawning_thread_ended_;
  SpawnOptions options_;
  std::optional<int> exit_status_;
  int killed_by_ = 0;
};

// What /proc/PID/stat says of a process: its state letter ('R', 'S', 'Z'...),
// parent, process group, session, and its controlling terminal's foreground group
// (-1: none). nullopt when there is no such process (Linux only).
struct ProcState {
  char state = 0;
  pid_t parent = 0;
  pid_t pgrp = 0;
  pid_t session = 0;
  pid_t terminal_group = -1;
};
std::optional<ProcState> ReadProcState(pid_t pid);

// Whether a live process (zombies do not count) other than `except` and
// `except_too` is in process group `pgrp` (Linux: reads `proc`, /proc but in
// tests; a process starting meanwhile may be missed). True when `proc` cannot be listed: a member
// may be there, and both callers are safe when told so (holdfast lock keeps its
// terminal; a group thought alive gets SIGKILL at the end of its grace).
bool GroupHasOtherLiveMember(pid_t pgrp, pid_t except, const std::string& proc = "/proc",
                             pid_t except_too = -1);

// Whether process group `pgrp` of `session` is orphaned (POSIX): no live member
// has a parent in the same session and another group, so no job-control shell
// would continue it once stopped, and the kernel does not stop it for Ctrl-Z or a
// read of the terminal. (Linux: reads `proc`; false when it cannot be listed. A
// member or parent /proc hides, hidepid, counts as absent, and so leans to
// "orphaned"; unlike the kernel, a member whose parent is init in init's session
// links the group, and a zombie leader with live threads does not.)
bool GroupOrphaned(pid_t pgrp, pid_t session, const std::string& proc = "/proc");

// Whether exec would find `program` and may run it, looked up as execvp does
// (PATH unless it holds a '/'): OK, or the error Spawn would give (NOT_FOUND,
// FAILED_PRECONDITION: "cannot run PROGRAM: <strerror>"). For refusing a command
// before anything is done for it (`holdfast lock` checks before it takes the
// lock); Spawn can still fail (the file changed, a bad interpreter line).
absl::Status FindProgram(const std::string& program);

// What `path` holds past its first `from` bytes ("" when unreadable): the part
// of a child's log written since a size read before it started.
std::string ReadFileFrom(const std::string& path, std::uintmax_t from);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// closed), for a server to be started on. Nothing holds the port itself until
// that server binds it, but it is reserved among the processes that pick ports
// here (ReservePort): one process never hands out a port another live one has
// handed out, as the kernel may when the port is free again, so two tests
// running side by side do not start their servers on one port. (A process that
// is not ours may still take it; the test servers' Start functions try other
// ports when so.) Errors: INTERNAL.
absl::StatusOr<int> PickFreePort();

// Reserves `port` for this process among the processes that call this: false
// if another live process holds it (true again for the process holding it).
// The reservation is an abstract Unix socket (`@holdfast-port-PORT`, of this
// network namespace), so it ends with the process, however it ends; a process
// holds its latest 64 reservations. (When no socket can be made, true: the port
// is not reserved.)
bool ReservePort(int port);

// A listening TCP socket on 127.0.0.1 with a port the kernel picked.
struct LoopbackListener {
  int fd = -1;  // owned by the caller (close it)
  int port = 0;
};
// Errors: INTERNAL naming the failed call.
absl::StatusOr<LoopbackListener> ListenOnLoopback(int backlog = 64);

// The absolute path of the running executable's directory ("" if unknown).
std::string SelfDir();

}  // namespace holdfast::dev
