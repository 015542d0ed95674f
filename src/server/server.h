// holdfastd as a library: wires the etcd clients, the lock engines (one per etcd
// cluster, server/clusters.h) and the gRPC services together. holdfastd_main.cc only parses flags and waits for a signal.
//
// Thread-compatible: Start() and Shutdown() from one thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include <condition_variable>
#include <mutex>
#include <thread>

#include "audit/auditor.h"
#include "audit/epochs.h"
#include "audit/store.h"
#include "common/event_loop.h"
#include "common/timer_queue.h"
#include "etcd/client.h"
#include "lock/engine.h"
#include "lock/force_release.h"
#include "lock/etcd_health.h"
#include "lock/registry.h"
#include "server/admin_service.h"
#include "server/async_rpc.h"
#include "server/auth.h"
#include "server/clusters.h"
#include "server/config.h"
#include "server/health_service.h"
#include "server/lock_service.h"
#include "server/metrics.h"
#include "server/op_quota.h"
#include "server/rate_limit.h"
#include "server/rehome.h"
#include "server/replicas.h"
#include "server/session_service.h"
#include "common/tls_files.h"

namespace holdfast::server {

class Server {
 public:
  explicit Server(Config config);
  ~Server();

  // Connects to etcd, makes sure the epoch record exists (retrying while etcd is
  // not reachable, up to `etcd_wait`), then serves. Errors: what etcd or the
  // listener reported.
  absl::Status Start(std::chrono::milliseconds etcd_wait = std::chrono::seconds(60));
  // Stops serving. First the callers that would otherwise wait out the grace are
  // sent elsewhere: every queued Acquire is answered UNAVAILABLE (its waiter kept
  // a moment for the call asked again on another replica: lock::Cancellable::Move)
  // and every KeepAlive stream is ended UNAVAILABLE, both with the
  // `holdfast-stopping` trailer that tells libholdfast to go to its next endpoint
  // at once. The other calls in flight then get `grace` (default: the config's
  // shutdown_grace) to finish before gRPC cancels them, and the waiters kept
  // for their calls asked again are taken out (if no such call took them over)
  // within the same grace, before the etcd clients go.
  void Shutdown(std::optional<std::chrono::milliseconds> grace = std::nullopt);
  // The address actually bound (resolves port 0).
  std::string bound_address() const { return bound_address_; }

 private:
  // Connects to one etcd cluster and starts what runs on it (not the auditor).
  absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const ClusterConfig& cc,
                                                        std::chrono::milliseconds etcd_wait);
  // The restore guard (audit/epochs.h): every epochs.check_interval, refuses
  // grants on a cluster while a restore is detected there (and advances, if
  // configured). Also reloads the placements after their watch ended.
  void GuardEpochs();
  void GuardEpochsOnce();
  void GuardClusterOnce(Cluster& c);
  // The restore reason of the cluster named `cluster` ("" = control).
  std::string RestoreReason(const std::string& cluster) const;
  // Serving status of grpc.health.v1: every cluster healthy; the Lock service
  // also needs no restore pending anywhere.
  void UpdateHealth();
  // What GetAuditStatus answers (blocks on etcd and the store; Admin's pool only;
  // with req.clusters_only, one store read).
  v1::AuditStatus AuditStatus(const v1::GetAuditStatusRequest& req) const;
  // How metrics are served: TLS to readers and admins, unless insecure or
  // metrics.plaintext (none: plain HTTP).
  std::optional<MetricsEndpoint::Tls> MetricsTls() const;
  // mTLS with client certificates required (or plaintext when insecure).
  std::shared_ptr<grpc::ServerCredentials> Credentials() const;
  // TLS with a client certificate to one etcd cluster (etcd --client-cert-auth),
  // its files re-read every tls.refresh (kept in etcd_tls_files_).
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(
      const ClusterConfig& cc);

  Config config_;
  // Null unless metrics are on. Declared first: the etcd clients and the engines
  // report to it until they are gone.
  std::unique_ptr<Metrics> metrics_;
  // The API's TLS files as gRPC reads them (null when insecure): only a set that
  // is whole replaces the one serving. After metrics_, which it reports to.
  std::unique_ptr<TlsFiles> tls_files_;
  // The same for each etcd cluster's client TLS; before clusters_, whose
  // channels read them.
  std::vector<std::unique_ptr<TlsFiles>> etcd_tls_files_;
  std::shared_ptr<TimerQueue> timers_;
  // The one event loop that every RPC and every etcd call of this process runs on
  // (common/event_loop.h); its queue is the gRPC server's. Shutdown ends it last.
  std::unique_ptr<EventLoop> loop_;
  // Asks gRPC for calls and runs the Admin service's blocking handlers.
  std::unique_ptr<RpcServer> rpc_;
  std::unique_ptr<HealthService> health_;
  // health_ while it may be told of changes (null before serving and at shutdown).
  std::atomic<HealthService*> health_service_{nullptr};
  std::unique_ptr<audit::AuditStore> audit_store_;  // null: audit off ("none")
  // The control cluster's auditor once it runs (null before, and with audit off).
  // AuditStatus reads it here: GetAuditStatus is served from before Start
  // creates the auditors, and Cluster::auditor is not synchronised.
  std::atomic<const audit::Auditor*> control_auditor_{nullptr};
  // Every etcd cluster, each with its engine, registry, epochs, auditor, quota.
  std::unique_ptr<ClusterSet> clusters_;
  std::unique_ptr<Rehomer> rehomer_;
  std::thread epoch_guard_;
  std::mutex guard_stop_mu_;
  std::condition_variable guard_stop_cv_;
  bool guard_stop_ = false;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RateLimiter> rate_limiter_;
  std::unique_ptr<ReplicaSet> replicas_;  // on the control cluster; reset after the clients
  std::unique_ptr<SessionService> session_service_;
  std::unique_ptr<LockService> lock_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::string bound_address_;
};

}  // namespace holdfast::server
