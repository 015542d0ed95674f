#include "harness/stall_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace holdfast::testing {

namespace {

int ConnectTo(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StallProxy>> StallProxy::Start(const std::string& target) {
  auto p = std::unique_ptr<StallProxy>(new StallProxy());
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(target.substr(colon + 1), &p->target_port_)) {
    return absl::InvalidArgumentError(absl::StrCat("not HOST:PORT: ", target));
  }
  p->target_host_ = target.substr(0, colon);
  p->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (p->listen_fd_ < 0 || ::bind(p->listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
      ::listen(p->listen_fd_, 64) != 0 ||
      ::getsockname(p->listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return absl::InternalError(absl::StrCat("proxy listen: ", std::strerror(errno)));
  }
  p->port_ = ntohs(a.sin_port);
  p->acceptor_ = std::thread([raw = p.get()] { raw->AcceptLoop(); });
  return p;
}

StallProxy::~StallProxy() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> relays;
  {
    std::lock_guard l(mu_);
    relays.swap(relays_);
  }
  for (auto& t : relays) t.join();
}

std::string StallProxy::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

void StallProxy::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (cut_) {
      ::close(client);
      continue;
    }
    const int upstream = ConnectTo(target_host_, target_port_);
    if (upstream < 0) {
      ::close(client);
      continue;
    }
    int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard l(mu_);
    relays_.emplace_back([this, client, upstream] { Relay(client, upstream); });
  }
}

// Copies both ways until either side closes or the link is cut. Stalled answers
// are not read (their bytes wait in the kernel's buffers and then etcd's, as a
// link that stopped would keep them).
void StallProxy::Relay(int client, int upstream) {
  char buf[16384];
  bool open = true;
  while (open && !stop_ && !cut_) {
    pollfd fds[2] = {{client, POLLIN, 0},
                     {upstream, static_cast<short>(stall_answers_ ? 0 : POLLIN), 0}};
    if (::poll(fds, 2, 20) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if (fds[i].revents == 0) continue;
      const int from = i == 0 ? client : upstream;
      const int to = i == 0 ? upstream : client;
      const ssize_t n = ::read(from, buf, sizeof(buf));
      if (n <= 0) {
        open = false;
        break;
      }
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t w = ::write(to, buf + sent, static_cast<size_t>(n - sent));
        if (w <= 0) {
          open = false;
          break;
        }
        sent += w;
      }
    }
  }
  ::close(client);
  ::close(upstream);
}

}  // namespace holdfast::testing
