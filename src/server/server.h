// holdfastd as a library: wires the etcd client, the lock engine and the gRPC
// services together. holdfastd_main.cc only parses flags and waits for a signal.
//
// Thread-compatible: Start() and Shutdown() from one thread.
#pragma once

#include <atomic>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include <condition_variable>
#include <mutex>
#include <thread>

#include "audit/auditor.h"
#include "audit/epochs.h"
#include "audit/store.h"
#include "common/timer_queue.h"
#include "etcd/client.h"
#include "lock/engine.h"
#include "lock/force_release.h"
#include "lock/etcd_health.h"
#include "lock/registry.h"
#include "server/admin_service.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/lock_service.h"
#include "server/metrics.h"
#include "server/op_quota.h"
#include "server/rate_limit.h"
#include "server/replicas.h"
#include "server/session_service.h"

namespace holdfast::server {

class Server {
 public:
  explicit Server(Config config);
  ~Server();

  // Connects to etcd, makes sure the epoch record exists (retrying while etcd is
  // not reachable, up to `etcd_wait`), then serves. Errors: what etcd or the
  // listener reported.
  absl::Status Start(std::chrono::milliseconds etcd_wait = std::chrono::seconds(60));
  // Stops accepting calls; in-flight calls get `grace` to finish.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // The address actually bound (resolves port 0).
  std::string bound_address() const { return bound_address_; }

 private:
  // The restore guard (audit/epochs.h): every epochs.check_interval, refuses
  // grants while a restore is detected (and advances, if configured).
  void GuardEpochs();
  void GuardEpochsOnce();
  std::string RestoreReason() const;
  // What GetAuditStatus answers (blocks on etcd; Admin's pool only).
  v1::AuditStatus AuditStatus() const;
  // mTLS with client certificates required (or plaintext when insecure).
  std::shared_ptr<grpc::ServerCredentials> Credentials() const;
  // TLS with a client certificate to etcd (etcd --client-cert-auth).
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials() const;

  Config config_;
  // Null unless metrics are on. Declared first: the etcd client and the engine
  // report to it until they are gone.
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<etcd::Client> etcd_;
  std::unique_ptr<lock::EtcdHealth> health_;
  std::atomic<grpc::HealthCheckServiceInterface*> health_service_{nullptr};
  std::unique_ptr<lock::Engine> engine_;
  std::unique_ptr<lock::Registry> registry_;
  std::unique_ptr<audit::AuditStore> audit_store_;  // null: audit off ("none")
  std::unique_ptr<audit::Auditor> auditor_;
  std::unique_ptr<lock::ForceReleases> force_;
  std::unique_ptr<audit::Epochs> epochs_;
  std::thread epoch_guard_;
  std::mutex guard_stop_mu_;
  std::condition_variable guard_stop_cv_;
  bool guard_stop_ = false;
  mutable std::mutex guard_mu_;
  std::string restore_reason_;  // "" while grants may go on
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RateLimiter> rate_limiter_;
  std::unique_ptr<ReplicaSet> replicas_;  // reset after etcd_ (its callbacks)
  std::unique_ptr<OpQuota> op_quota_;     // reset after etcd_ (its callbacks)
  std::unique_ptr<SessionService> session_service_;
  std::unique_ptr<LockService> lock_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::string bound_address_;
};

}  // namespace holdfast::server
