// Whether etcd answers linearizable reads in time, as this replica sees it.
//
// A probe (a linearizable Range of /holdfast/epoch with a short deadline) runs
// every `period`; one failure makes etcd unhealthy (no quorum, no leader, or
// unreachable) until a probe succeeds again. A probe that failed because its
// member was silent (the client moved off it, etcd/client.h) is asked once more at
// once on the next member (with a deadline under Client::kSilentEndpoint), so one
// member cut off from the network costs a probe's delay, not health. A quorum loss
// where the member asked still answers its Status counts at once, as before; one
// seen first through a silent member (paused, cut off, or holdfastd cut off from
// every member) counts up to Client::kSilenceCheck + 0.5 s later. The lock engine refuses new grants
// while unhealthy and every keepalive answer says so, so holders of closed
// classes stop within one keepalive interval (ARCHITECTURE §5).
//
// Thread-safe. `on_change` runs on a gRPC or timer thread, never under mu_.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "etcd/client.h"

namespace holdfast::lock {

class EtcdHealth {
 public:
  struct Options {
    std::chrono::milliseconds period{500};
    std::chrono::milliseconds probe_timeout{1000};
  };
  EtcdHealth(etcd::Client* etcd, Options options,
             std::function<void(bool healthy, const std::string& reason)> on_change = {});
  ~EtcdHealth();

  void Start();
  // Stops probing; waits for no probe. Safe to call twice.
  void Stop();

  // OK while healthy; else UNAVAILABLE with the reason.
  absl::Status status() const;

 private:
  void Probe();
  // One probe; a first one that failed on a member the client then moved off is
  // sent once more, on the next member, before it counts.
  void Send(bool again);
  void OnProbe(const absl::Status& result);

  etcd::Client* const etcd_;
  const Options options_;
  const std::function<void(bool, const std::string&)> on_change_;
  mutable absl::Mutex mu_;
  absl::CondVar idle_;  // signalled when a probe completes
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = true;
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  TimerQueue::TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::lock
