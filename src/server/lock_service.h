// The Lock service (Acquire, Release, CheckToken, Describe), served on holdfastd's
// event loop (server/async_rpc.h). A waiting Acquire holds no thread; a client
// that cancels its Acquire, or whose deadline passes, ends the wait. Acquire and
// Release count against the namespace's op_rate_quota (server/op_quota.h);
// CheckToken and Describe do not. Every request goes to the engine of its
// namespace's home cluster (server/clusters.h).
//
// Thread-safe. Handlers run on the loop thread and never block.
#pragma once

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/engine.h"
#include "server/async_rpc.h"
#include "server/auth.h"
#include "server/clusters.h"

namespace holdfast::server {

class LockService {
 public:
  LockService(const Router* router, const Authenticator* auth)
      : router_(router), auth_(auth) {}

  // Registered with the grpc::ServerBuilder.
  grpc::Service* grpc_service() { return &service_; }
  // Starts serving; after the gRPC server has been built and started.
  void Serve(RpcServer* rpc);

  // The replica is stopping (Server::Shutdown): every Acquire under way here is
  // answered UNAVAILABLE with the kStoppingMetadata trailer, a queued one keeping
  // its waiter a moment for the call asked again elsewhere (lock::Cancellable::
  // Move); an Acquire that arrives from now on is answered so at once. From any
  // thread; idempotent.
  void MoveWaits();

 private:
  class AcquireCall;
  void Acquire(UnaryCall<v1::AcquireRequest, v1::AcquireResponse>* call);
  void Release(UnaryCall<v1::ReleaseRequest, v1::ReleaseResponse>* call);
  void CheckToken(UnaryCall<v1::CheckTokenRequest, v1::CheckTokenResponse>* call);
  void Describe(UnaryCall<v1::DescribeRequest, v1::DescribeResponse>* call);

  const Router* const router_;
  const Authenticator* const auth_;
  v1::Lock::AsyncService service_;
  absl::Mutex calls_mu_;
  // Set under calls_mu_ (so that no call registers after MoveWaits has looked);
  // read without it by the answers.
  std::atomic<bool> stopping_{false};
  // The Acquire calls under way (each takes itself out as it goes).
  absl::flat_hash_map<AcquireCall*, std::weak_ptr<AcquireCall>> calls_ ABSL_GUARDED_BY(calls_mu_);
};

}  // namespace holdfast::server
