#include "dev/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace holdfast::dev {

namespace {
int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

// The child's environment as "NAME=value" strings: this process's, less the
// entries whose names start with one of `drop_prefixes`, with `overrides` put in
// (replacing entries of the same name; the later of two overrides wins). Built before fork: in the child of a multi-threaded process,
// setenv() could deadlock on a lock another thread held at the fork, and it
// allocates.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides,
    const std::vector<std::string>& drop_prefixes) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (std::none_of(drop_prefixes.begin(), drop_prefixes.end(),
                     [&](const std::string& p) { return entry.starts_with(p); })) {
      env.emplace_back(entry);
    }
  }
  for (const auto& [name, value] : overrides) {
    const std::string prefix = name + "=";
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(prefix); });
    env.push_back(prefix + value);
  }
  return env;
}

// What a failed exec of `program` returns from Spawn().
absl::Status ExecError(const std::string& program, int child_errno) {
  std::string message = absl::StrCat("cannot run ", program, ": ", std::strerror(child_errno));
  if (child_errno == ENOENT) return absl::NotFoundError(message);
  return absl::FailedPreconditionError(message);
}

// The signal the kernel sends a group's guard when its parent thread ends (the
// thread that forked it, then any thread of the process it passes to). Anyone
// may send it too: the guard only wakes on it, and then looks.
constexpr int kGuardSignal = SIGUSR1;

// How long a guard woken by its signal looks for its parent thread's end: a
// thread that is ending can still be found for a moment after the signal.
constexpr int kGuardLooks = 100;
constexpr long kGuardLookEveryNs = 10'000'000;  // 10 ms

// How long Spawn waits for a guard to be in place before it goes on without.
constexpr int kGuardReadyMs = 10'000;

// Closes every file descriptor but `keep`: a guard must not keep this
// process's sockets, pipes or terminal open. Async-signal-safe.
void CloseDescriptorsBut(int keep) {
  const unsigned k = static_cast<unsigned>(keep);
  const bool below = k == 0 || ::close_range(0, k - 1, 0) == 0;
  if (::close_range(k + 1, ~0U, 0) == 0 && below) return;
  struct rlimit limit {};
  const rlim_t n = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 1024;
  for (rlim_t fd = 0; fd < n && fd < (1u << 20); ++fd) {
    if (static_cast<int>(fd) != keep) ::close(static_cast<int>(fd));
  }
}

// Set when the calling thread ends: its thread_local objects are destroyed
// before the kernel ends the thread, so before PR_SET_PDEATHSIG kills a child.
std::shared_ptr<const std::atomic<bool>> SpawningThreadEnd() {
  struct Flag {
    std::shared_ptr<std::atomic<bool>> ended = std::make_shared<std::atomic<bool>>(false);
    ~Flag() { ended->store(true); }
  };
  thread_local Flag flag;
  return flag.ended;
}

// Whether thread `tid` of process `pid` is a zombie (a process's first thread
// that ended while others run on) or dead, from /proc/PID/task/TID/stat; false
// when it cannot be read. Async-signal-safe: a buffer on the stack, plain
// system calls.
bool ThreadIsZombie(pid_t pid, pid_t tid) {
  char path[64];
  // "/proc/" PID "/task/" TID "/stat", without snprintf.
  char* p = path;
  auto put = [&](const char* text) {
    while (*text != '\0') *p++ = *text++;
  };
  auto put_number = [&](unsigned long n) {
    char digits[24];
    int count = 0;
    do {
      digits[count++] = static_cast<char>('0' + n % 10);
      n /= 10;
    } while (n != 0);
    while (count > 0) *p++ = digits[--count];
  };
  put("/proc/");
  put_number(static_cast<unsigned long>(pid));
  put("/task/");
  put_number(static_cast<unsigned long>(tid));
  put("/stat");
  *p = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t n = ::read(fd, stat, sizeof stat);
  ::close(fd);
  // "TID (COMM) STATE ...": COMM may hold anything, the state follows its
  // last ')' (a COMM is at most 16 bytes, within the buffer).
  ssize_t paren = -1;
  for (ssize_t i = 0; i < n; ++i) {
    if (stat[i] == ')') paren = i;
  }
  if (paren < 0 || paren + 2 >= n) return false;
  const char state = stat[paren + 2];
  return state == 'Z' || state == 'X';
}

// Whether the guard's parent thread has ended: the guard was given to another
// process (the whole process ended), or thread `tid` of process `parent` is
// gone or a zombie. Async-signal-safe.
bool GuardsParentEnded(pid_t parent, pid_t tid) {
  if (::getppid() != parent) return true;
  if (::tgkill(parent, tid, 0) != 0 && errno == ESRCH) return true;
  return ThreadIsZombie(parent, tid);
}

// Forks the guard of process group `group` (SpawnOptions::kill_group_with_parent)
// and returns its pid once it is in the group with its parent-death signal set;
// -1 when it could not be started, could not join, or was not ready in time.
// Between fork and _exit the guard makes only async-signal-safe calls, as
// Spawn's child does before exec.
pid_t StartGroupGuard(pid_t group) {
  const pid_t parent = ::getpid();
  const pid_t tid = ::gettid();
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return -1;
  const pid_t guard = ::fork();
  if (guard < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return -1;
  }
  if (guard == 0) {
    sigset_t all;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    CloseDescriptorsBut(ready[1]);
    ::prctl(PR_SET_NAME, "holdfast-guard");
    if (::setpgid(0, group) != 0) ::_exit(1);
    ::prctl(PR_SET_PDEATHSIG, kGuardSignal);
    // A parent gone before the prctl sends nothing: do now what the signal asks.
    if (GuardsParentEnded(parent, tid)) ::kill(0, SIGKILL);
    const char ok = 1;
    (void)!::write(ready[1], &ok, 1);
    ::close(ready[1]);
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, kGuardSignal);
    for (;;) {
      if (::sigwaitinfo(&wake, nullptr) != kGuardSignal) continue;
      for (int look = 0; look < kGuardLooks; ++look) {
        if (GuardsParentEnded(parent, tid)) {
          ::kill(0, SIGKILL);  // the group, the guard with it
          ::_exit(1);
        }
        const struct timespec pause {0, kGuardLookEveryNs};
        ::nanosleep(&pause, nullptr);
      }
    }
  }
  ::close(ready[1]);
  struct pollfd wait_ready {ready[0], POLLIN, 0};
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kGuardReadyMs);
  int polled;
  do {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    polled = ::poll(&wait_ready, 1, std::max<int>(0, static_cast<int>(left.count())));
  } while (polled < 0 && errno == EINTR);
  char ok = 0;
  ssize_t n = 0;
  if (polled > 0) {
    do {
      n = ::read(ready[0], &ok, 1);
    } while (n < 0 && errno == EINTR);
  }
  ::close(ready[0]);
  if (n != 1) {
    ::kill(guard, SIGKILL);
    while (::waitpid(guard, nullptr, 0) < 0 && errno == EINTR) {
    }
    return -1;
  }
  return guard;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(SpawnOptions options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("spawn: empty argv");
  // Everything the child needs is prepared before fork: between fork and exec
  // the child of a multi-threaded process may only make async-signal-safe calls
  // (no allocation, no libc lock another thread may have held at the fork).
  std::vector<char*> argv;
  for (auto& a : options.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = ChildEnvironment(options.env, options.drop_env_prefixes);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  int log_fd = -1;
  if (!options.log_file.empty()) {
    log_fd = ::open(options.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(
          absl::StrCat("spawn: cannot open ", options.log_file, ": ", std::strerror(errno)));
    }
  }
  const bool guarded =
      options.kill_group_with_parent && options.new_process_group && options.kill_with_parent;
  // With a guard, the child waits to exec until the guard is in its group (the
  // parent writes a byte to `go`): nothing it starts runs unguarded, and it
  // cannot leave the group before the guard joins.
  int go[2] = {-1, -1};
  int err_pipe[2];
  if ((guarded && ::pipe2(go, O_CLOEXEC) != 0) || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    if (log_fd >= 0) ::close(log_fd);
    if (go[0] >= 0) {
      ::close(go[0]);
      ::close(go[1]);
    }
    return absl::InternalError(absl::StrCat("spawn: pipe: ", std::strerror(e)));
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    if (log_fd >= 0) ::close(log_fd);
    if (guarded) {
      ::close(go[0]);
      ::close(go[1]);
    }
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return absl::InternalError(absl::StrCat("spawn: fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    if (options.new_process_group) ::setpgid(0, 0);
    if (options.kill_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // A parent that died before the prctl sends no signal; the child has been
      // given to another parent by then: go as the signal would have made it.
      if (::getppid() != parent) ::_exit(128 + SIGKILL);
    }
    if (guarded) {
      // A byte, not EOF: a child forked meanwhile by another thread may hold a
      // copy of go[1] until it execs.
      char byte = 0;
      ssize_t got;
      while ((got = ::read(go[0], &byte, 1)) < 0 && errno == EINTR) {
      }
      if (got != 1) ::_exit(128 + SIGKILL);  // the parent is gone
    }
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    // Undo signal dispositions the parent may have changed.
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // glibc's execvpe searches PATH with buffers on the stack, no allocation.
    ::execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    (void)!::write(err_pipe[1], &e, sizeof e);
    ::_exit(127);
  }
  if (options.new_process_group) ::setpgid(pid, pid);  // no race with the child's own call
  if (log_fd >= 0) ::close(log_fd);
  pid_t guard = -1;
  if (guarded) {
    guard = StartGroupGuard(pid);
    const char byte = 1;
    (void)!::write(go[1], &byte, 1);  // the child goes on
    ::close(go[0]);
    ::close(go[1]);
  }
  ::close(err_pipe[1]);
  int child_errno = 0;
  ssize_t n = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  ::close(err_pipe[0]);
  std::unique_ptr<Subprocess> child(new Subprocess(pid, std::move(options)));
  child->guard_pid_ = guard;
  child->spawning_thread_ended_ = SpawningThreadEnd();
  if (n == sizeof child_errno) {
    (void)child->Wait();  // reaps the child, then ends the guard
    return ExecError(child->options_.argv[0], child_errno);
  }
  return child;
}

Subprocess::~Subprocess() {
  if (options_.kill_on_destroy && Running()) {
    Signal(SIGKILL);
    Wait();
  }
  EndGuard();
}

void Subprocess::Reaped(int status) {
  exit_status_ = DecodeWaitStatus(status);
  if (WIFSIGNALED(status)) killed_by_ = WTERMSIG(status);
  EndGuard();
}

void Subprocess::EndGuard() {
  if (guard_pid_ < 0) return;
  // The spawning thread ended, and this process reaps the child before the
  // guard acted: the guard's work is done here. The guard keeps the group's id
  // taken until it is reaped below.
  if (spawning_thread_ended_ && spawning_thread_ended_->load()) ::kill(-pid_, SIGKILL);
  ::kill(guard_pid_, SIGKILL);
  while (::waitpid(guard_pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  guard_pid_ = -1;
}

bool Subprocess::Running() {
  if (exit_status_) return false;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    Reaped(status);
    return false;
  }
  if (r < 0) {
    Reaped(W_EXITCODE(255, 0));  // ECHILD: reaped elsewhere, as in Wait()
    return false;
  }
  return r == 0;
}

std::optional<int> Subprocess::Wait(std::optional<std::chrono::milliseconds> timeout) {
  if (exit_status_) return exit_status_;
  if (!timeout) {
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
    // ECHILD: reaped elsewhere (SIGCHLD ignored makes the kernel reap it); its
    // status is lost.
    Reaped(r == pid_ ? status : W_EXITCODE(255, 0));
    return exit_status_;
  }
  auto until = std::chrono::steady_clock::now() + *timeout;
  while (Running()) {
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_status_;
}

void Subprocess::Signal(int sig) {
  if (exit_status_) return;
  if (options_.new_process_group) {
    ::kill(-pid_, sig);
  } else {
    ::kill(pid_, sig);
  }
}

bool Subprocess::Exited() {
  if (exit_status_) return true;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return errno == ECHILD;  // reaped elsewhere: gone
  }
  return info.si_pid == pid_;
}

int Subprocess::TakeStop() {
  if (exit_status_) return 0;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WSTOPPED | WNOHANG) != 0) return 0;
  return info.si_pid == pid_ && info.si_code == CLD_STOPPED ? info.si_status : 0;
}

namespace {

std::optional<ProcState> ReadProcStateFrom(const std::string& proc, pid_t pid) {
  // "PID (COMM) STATE PPID PGRP SESSION TTY_NR TPGID ...": COMM may hold
  // anything, so the fields are read after its last ')'.
  std::ifstream in(absl::StrCat(proc, "/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 1));
  ProcState out;
  int tty = 0;
  if (!(fields >> out.state >> out.parent >> out.pgrp >> out.session >> tty >>
        out.terminal_group)) {
    return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<ProcState> ReadProcState(pid_t pid) { return ReadProcStateFrom("/proc", pid); }

absl::Status FindProgram(const std::string& program) {
  // 0 when `path` could be exec'd, else the errno exec would likely give (by the
  // effective ids, as exec checks).
  auto runnable = [](const std::string& path) -> int {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EACCES;
    return ::faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) == 0 ? 0 : errno;
  };
  if (program.empty()) return ExecError(program, ENOENT);
  if (program.find('/') != std::string::npos) {
    const int e = runnable(program);
    return e == 0 ? absl::OkStatus() : ExecError(program, e);
  }
  // As glibc's execvp: PATH's directories in order ("" is the current one), by
  // default /bin:/usr/bin; one found but not runnable gives EACCES unless a later
  // one runs; the errors that mean "not here" go on to the next, any other ends
  // the search with itself.
  const char* path = std::getenv("PATH");
  bool denied = false;
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/bin:/usr/bin", ':')) {
    const int e = runnable(absl::StrCat(dir.empty() ? "." : dir, "/", program));
    switch (e) {
      case 0:
        return absl::OkStatus();
      case EACCES:
        denied = true;
        break;
      case ENOENT:
      case ESTALE:
      case ENOTDIR:
      case ENODEV:
      case ETIMEDOUT:
        break;
      default:
        return ExecError(program, e);
    }
  }
  return ExecError(program, denied ? EACCES : ENOENT);
}

bool GroupHasOtherLiveMember(pid_t pgrp, pid_t except, const std::string& proc,
                             pid_t except_too) {
  std::error_code ec;
  std::filesystem::directory_iterator it(proc, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(it->path().filename().string(), &pid) || pid == except ||
        pid == except_too) {
      continue;
    }
    auto p = ReadProcStateFrom(proc, pid);  // nullopt: gone meanwhile
    if (p && p->pgrp == pgrp && p->state != 'Z' && p->state != 'X') return true;
  }
  return static_cast<bool>(ec);
}

bool GroupOrphaned(pid_t pgrp, pid_t session, const std::string& proc) {
  std::error_code ec;
  std::filesystem::directory_iterator it(proc, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(it->path().filename().string(), &pid)) continue;
    auto p = ReadProcStateFrom(proc, pid);
    if (!p || p->pgrp != pgrp || p->state == 'Z' || p->state == 'X') continue;
    auto parent = ReadProcStateFrom(proc, p->parent);
    if (parent && parent->pgrp != pgrp && parent->session == session) return false;
  }
  return !ec;
}

bool Subprocess::GroupAlive() const {
  return options_.new_process_group && GroupHasOtherLiveMember(pid_, pid_, "/proc", guard_pid_);
}

void Subprocess::SignalGroup(int sig) {
  if (options_.new_process_group) ::kill(-pid_, sig);
}

int Subprocess::Stop(std::chrono::milliseconds grace) {
  if (!Running()) return *exit_status_;
  Signal(SIGTERM);
  if (auto s = Wait(grace)) return *s;
  Signal(SIGKILL);
  return *Wait();
}

std::string ReadFileFrom(const std::string& path, std::uintmax_t from) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(from));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::StatusOr<int> PickFreePortOnce();

namespace {

std::mutex ports_mu;
std::set<int> ports_given;  // never handed out twice in one process
// The ports this process holds reserved, oldest first, each with the socket
// that holds it. The oldest are let go past kMaxReservations: by then the
// process they were picked for has long bound them, or given up.
std::deque<std::pair<int, int>> reservations;
constexpr size_t kMaxReservations = 64;

bool ReservePortLocked(int port) {
  for (const auto& [p, fd] : reservations) {
    if (p == port) return true;
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // (Out of descriptors: the port is handed out unreserved, as before there
  // were reservations, rather than none at all.)
  if (fd < 0) return true;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = absl::StrCat("holdfast-port-", port);
  // An abstract name (sun_path starts with a NUL): no file, gone with the socket.
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return false;
  }
  reservations.emplace_back(port, fd);
  if (reservations.size() > kMaxReservations) {
    ::close(reservations.front().second);
    reservations.pop_front();
  }
  return true;
}

}  // namespace

bool ReservePort(int port) {
  std::lock_guard<std::mutex> l(ports_mu);
  return ReservePortLocked(port);
}

absl::StatusOr<int> PickFreePort() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto port = PickFreePortOnce();
    if (!port.ok()) return port;
    std::lock_guard<std::mutex> l(ports_mu);
    if (!ports_given.insert(*port).second) continue;
    if (ReservePortLocked(*port)) return port;
  }
  return absl::InternalError("no free port found");
}

absl::StatusOr<int> PickFreePortOnce() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("bind: ", std::strerror(e)));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<LoopbackListener> ListenOnLoopback(int backlog) {
  LoopbackListener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l.fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(l.fd, backlog) != 0 ||
      ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    ::close(l.fd);
    return absl::InternalError(absl::StrCat("listen on loopback: ", std::strerror(e)));
  }
  l.port = ntohs(addr.sin_port);
  return l;
}

std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return p.parent_path().string();
}

}  // namespace holdfast::dev
