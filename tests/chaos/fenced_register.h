// The fenced register of the chaos suite: a tiny server on a loopback TCP port that
// stores one value per lock key and admits a write only through a FenceVerifier
// (include/holdfast/fence.h), or, in the --no-fence control mode, admits every write.
// Every write is recorded in the history, in admission order.
//
// Line protocol, one request per line:
//   W <writer> <lock_key> <token> <x|s> <value>\n   ->  OK\n | STALE <why>\n | ERR <why>\n
//
// Thread-safe. Serves each connection on its own thread (at most kMaxConnections at
// once); Stop() (or the destructor) closes the socket and joins every thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "history.h"
#include "holdfast/fence.h"

namespace holdfast::chaos {

class FencedRegister {
 public:
  static constexpr int kMaxConnections = 256;

  // Listens on 127.0.0.1 (a free port). `history` must outlive the register.
  static absl::StatusOr<std::unique_ptr<FencedRegister>> Start(HistoryWriter* history,
                                                               bool fenced);
  ~FencedRegister();

  int port() const { return port_; }
  void Stop();

  // The writer whose write of some key was admitted last, if within `max_age_ns`
  // (the nemesis pauses a current holder). Empty if none.
  struct LastWrite {
    std::string writer;
    std::string key;
    int64_t token = 0;  // the write's
  };
  LastWrite RecentWriter(int64_t max_age_ns, uint64_t pick) const;

  // Applies one request line and returns the answer (without the newline).
  std::string Handle(const std::string& line);

 private:
  FencedRegister(HistoryWriter* history, bool fenced) : history_(history), fenced_(fenced) {}
  void AcceptLoop();
  void Serve(int fd);

  HistoryWriter* const history_;
  const bool fenced_;
  FenceVerifier fence_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  // Lock order: unfenced_mu_ before mu_.
  absl::Mutex unfenced_mu_;  // serializes writes in --no-fence mode
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  struct Last {
    std::string writer;
    int64_t ts = 0;
    int64_t token = 0;
  };
  absl::flat_hash_map<std::string, Last> last_ ABSL_GUARDED_BY(mu_);
  std::vector<int> conn_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> conn_threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::chaos
