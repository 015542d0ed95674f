// grpc.health.v1 (Check and Watch) on holdfastd's event loop, in place of gRPC's
// default health service, which runs on the callback API (common/event_loop.h
// says why holdfastd uses none).
//
// Services known: "" (holdfastd as a whole), holdfast.v1.Session,
// holdfast.v1.Lock and holdfast.v1.Admin, all SERVING at the start. The server
// sets them (server.cc, UpdateHealth): NOT_SERVING while an etcd cluster has no
// quorum, and holdfast.v1.Lock also while grants are refused after a restore.
// Check of another name is NOT_FOUND; Watch of one sends SERVICE_UNKNOWN. A Watch
// sends the status at once, then each change (a change that comes while the last
// one is still being written is sent once that write is done, latest first, so a
// slow reader sees the newest status, not every step). Shutdown() makes every
// status NOT_SERVING for good and ends every Watch after it has sent that.
//
// Thread-safe. Lock order: mu_, then a watch's own.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/async_rpc.h"

namespace holdfast::server {

class HealthService {
 public:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;

  HealthService();
  ~HealthService();

  // Registered with the grpc::ServerBuilder.
  grpc::Service* grpc_service() { return &service_; }
  // Starts serving; after the gRPC server has been built and started.
  void Serve(RpcServer* rpc);

  // Sets every known service to `serving`, except those in `overrides`, set to
  // theirs (a new name becomes known). A Watch sees one change, and only a status
  // that differs from the one it sent last.
  void SetServingStatus(bool serving, const std::map<std::string, bool>& overrides = {});
  // NOT_SERVING for good; every Watch ends. Before the gRPC server's Shutdown.
  void Shutdown();

 private:
  class Watch;
  void StatusChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status of `service` now; SERVICE_UNKNOWN for a name not known.
  Status StatusOfLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A watch arrived: it is sent the status now (and ends after it once shut down).
  void AddWatch(Watch* w);
  void RemoveWatch(Watch* w);
  void RequestWatch();

  grpc::health::v1::Health::AsyncService service_;
  RpcServer* rpc_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  std::set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace holdfast::server
