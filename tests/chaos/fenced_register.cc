#include "fenced_register.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"
#include "absl/strings/str_split.h"

namespace holdfast::chaos {

absl::StatusOr<std::unique_ptr<FencedRegister>> FencedRegister::Start(HistoryWriter* history,
                                                                      bool fenced) {
  std::unique_ptr<FencedRegister> r(new FencedRegister(history, fenced));
  auto listener = dev::ListenOnLoopback();
  if (!listener.ok()) return listener.status();
  r->listen_fd_ = listener->fd;
  r->port_ = listener->port;
  r->acceptor_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  return r;
}

FencedRegister::~FencedRegister() { Stop(); }

void FencedRegister::Stop() {
  if (stopping_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : conn_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
  }
  for (std::thread& t : threads) t.join();
}

void FencedRegister::AcceptLoop() {
  while (!stopping_.load()) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    absl::MutexLock lock(&mu_);
    // Reap the threads of connections that ended (their fd slot is -1).
    if (stopping_.load() || std::count_if(conn_fds_.begin(), conn_fds_.end(),
                                          [](int f) { return f >= 0; }) >= kMaxConnections) {
      close(fd);
      continue;
    }
    conn_fds_.push_back(fd);
    conn_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void FencedRegister::Serve(int fd) {
  std::string buffer;
  char chunk[4096];
  while (!stopping_.load()) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t nl = buffer.find('\n'); nl != std::string::npos; nl = buffer.find('\n')) {
      std::string answer = Handle(buffer.substr(0, nl)) + "\n";
      buffer.erase(0, nl + 1);
      if (send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) < 0) break;
    }
    if (buffer.size() > (1 << 20)) break;  // no line that long is ours
  }
  absl::MutexLock lock(&mu_);
  std::replace(conn_fds_.begin(), conn_fds_.end(), fd, -1);
  close(fd);
}

std::string FencedRegister::Handle(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 5));
  int64_t token = 0;
  if (f.size() != 6 || f[0] != "W" || !absl::SimpleAtoi(f[3], &token) ||
      (f[4] != "x" && f[4] != "s")) {
    return "ERR bad request";
  }
  const std::string& writer = f[1];
  const std::string& key = f[2];
  const bool shared = f[4] == "s";
  auto apply = [&]() -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      values_[key] = f[5];
      last_[key] = {writer, MonotonicNanos(), token};
    }
    // Recorded inside the key's write slot: the history keeps admission order.
    Event e;
    e.p = "register";
    e.type = "write";
    e.key = key;
    e.token = token;
    e.shared = shared;
    e.writer = writer;
    e.verdict = "admitted";
    history_->Record(std::move(e));
    return absl::OkStatus();
  };
  absl::Status s;
  if (fenced_) {
    s = fence_.CheckAndApply(key, token, shared ? FenceMode::kShared : FenceMode::kExclusive,
                             apply);
  } else {
    absl::MutexLock lock(&unfenced_mu_);
    s = apply();
  }
  if (s.ok()) return "OK";
  Event e;
  e.p = "register";
  e.type = "write";
  e.key = key;
  e.token = token;
  e.shared = shared;
  e.writer = writer;
  e.verdict = "rejected";
  e.detail = std::string(s.message());
  history_->Record(std::move(e));
  return absl::StrCat(s.code() == absl::StatusCode::kFailedPrecondition ? "STALE " : "ERR ",
                      s.message());
}

FencedRegister::LastWrite FencedRegister::RecentWriter(int64_t max_age_ns, uint64_t pick) const {
  absl::MutexLock lock(&mu_);
  const int64_t now = MonotonicNanos();
  std::vector<LastWrite> recent;
  for (const auto& [key, last] : last_) {
    if (now - last.ts <= max_age_ns) recent.push_back({last.writer, key, last.token});
  }
  if (recent.empty()) return {};
  std::sort(recent.begin(), recent.end(),
            [](const LastWrite& a, const LastWrite& b) { return a.key < b.key; });
  return recent[pick % recent.size()];
}

}  // namespace holdfast::chaos
