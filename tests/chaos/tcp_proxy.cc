#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"

namespace holdfast::chaos {
namespace {

sockaddr_in Address(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Writes all of `data`; false if the socket failed.
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int upstream_port,
                                                          const std::string& upstream_host) {
  in_addr parsed{};
  if (inet_pton(AF_INET, upstream_host.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", upstream_host));
  }
  std::unique_ptr<TcpProxy> p(new TcpProxy(upstream_port, upstream_host));
  auto listener = dev::ListenOnLoopback();
  if (!listener.ok()) return listener.status();
  p->listen_fd_ = listener->fd;
  p->port_ = listener->port;
  p->acceptor_ = std::thread([raw = p.get()] { raw->AcceptLoop(); });
  return p;
}

TcpProxy::~TcpProxy() { Stop(); }

void TcpProxy::Stop() {
  if (stopping_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void TcpProxy::AcceptLoop() {
  while (!stopping_.load()) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    absl::MutexLock lock(&mu_);
    if (stopping_.load() || live_ >= kMaxConnections) {
      close(fd);
      continue;
    }
    ++live_;
    fds_.push_back(fd);
    threads_.emplace_back([this, fd] { Forward(fd); });
  }
}

void TcpProxy::Forward(int client_fd) {
  int upstream_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Address(upstream_host_, upstream_port_);
  // A member cut off by a partition does not answer: bound the connect (and so
  // Stop(), which cannot interrupt a connect in progress).
  timeval connect_timeout{2, 0};
  bool ok = upstream_fd >= 0 &&
            setsockopt(upstream_fd, SOL_SOCKET, SO_SNDTIMEO, &connect_timeout,
                       sizeof connect_timeout) == 0 &&
            connect(upstream_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (ok) {  // writes upstream stall as long as the link does, like TCP's
    timeval none{0, 0};
    setsockopt(upstream_fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  }
  if (ok) {
    absl::MutexLock lock(&mu_);
    fds_.push_back(upstream_fd);
    if (stopping_.load()) shutdown(upstream_fd, SHUT_RDWR);
  }
  char buffer[16384];
  while (ok && !stopping_.load()) {
    if (cut_.load()) {  // partitioned: forward nothing, close nothing
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    pollfd fds[2] = {{client_fd, POLLIN, 0}, {upstream_fd, POLLIN, 0}};
    int n = poll(fds, 2, 50);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0 && ok; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      ok = got > 0 && WriteAll(fds[1 - i].fd, buffer, static_cast<size_t>(got));
    }
  }
  absl::MutexLock lock(&mu_);
  for (int fd : {client_fd, upstream_fd}) {
    if (fd < 0) continue;
    fds_.erase(std::remove(fds_.begin(), fds_.end(), fd), fds_.end());
    close(fd);
  }
  --live_;
}

}  // namespace holdfast::chaos
