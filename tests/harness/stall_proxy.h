// A TCP relay between holdfastd and one etcd member that can stall etcd's
// answers (kept, and sent on once released) or cut the link. Stalling the
// answers makes a write's outcome unknown to holdfastd while etcd commits it
// (an answer lost to a partition after the request got through); a cut makes
// every write fail without reaching etcd, ever.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace holdfast::testing {

class StallProxy {
 public:
  // Listens on a free loopback port and relays every connection to `target`
  // (HOST:PORT).
  static absl::StatusOr<std::unique_ptr<StallProxy>> Start(const std::string& target);
  ~StallProxy();
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;

  std::string endpoint() const;
  // While set, what etcd sends waits in the relay.
  void StallAnswers(bool on) { stall_answers_ = on; }
  // While set, every connection is closed, and a new one closed as it comes.
  void Cut(bool on) { cut_ = on; }

 private:
  StallProxy() = default;
  void AcceptLoop();
  void Relay(int client, int upstream);

  int listen_fd_ = -1;
  int port_ = 0;
  std::string target_host_;
  int target_port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stall_answers_{false}, cut_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> relays_;  // guarded by mu_
};

}  // namespace holdfast::testing
