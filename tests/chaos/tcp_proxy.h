// A loopback TCP proxy that can cut the link it carries: the chaos suite's
// holdfastd partition. holdfastd replica 1 reaches each etcd member through one; Cut(true) stops
// forwarding in both directions (bytes wait, as behind a dropped link, and TCP's
// flow control stalls the senders) without closing anything; Cut(false) heals.
//
// Thread-safe. One thread accepts, one thread per connection forwards (at most
// kMaxConnections at once); Stop() (or the destructor) closes every socket and
// joins every thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::chaos {

class TcpProxy {
 public:
  static constexpr int kMaxConnections = 256;

  // Listens on 127.0.0.1 (a free port) and forwards to upstream_host:upstream_port
  // (an IPv4 address). A connection upstream that is not made within 2 s is closed.
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(
      int upstream_port, const std::string& upstream_host = "127.0.0.1");
  ~TcpProxy();

  int port() const { return port_; }
  void Cut(bool cut) { cut_.store(cut); }
  bool cut() const { return cut_.load(); }
  void Stop();

 private:
  TcpProxy(int upstream_port, std::string upstream_host)
      : upstream_port_(upstream_port), upstream_host_(std::move(upstream_host)) {}
  void AcceptLoop();
  void Forward(int client_fd);

  const int upstream_port_;
  const std::string upstream_host_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> cut_{false};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // open sockets of live connections
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::chaos
