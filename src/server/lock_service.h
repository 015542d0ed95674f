// The Lock service (Acquire, Release, CheckToken, Describe), served on holdfastd's
// event loop (server/async_rpc.h). A waiting Acquire holds no thread; a client
// that cancels its Acquire, or whose deadline passes, ends the wait. Acquire and
// Release count against the namespace's op_rate_quota (server/op_quota.h);
// CheckToken and Describe do not. Every request goes to the engine of its
// namespace's home cluster (server/clusters.h).
//
// Thread-safe. Handlers run on the loop thread and never block.
#pragma once

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

 private:
  void Acquire(UnaryCall<v1::AcquireRequest, v1::AcquireResponse>* call);
  void Release(UnaryCall<v1::ReleaseRequest, v1::ReleaseResponse>* call);
  void CheckToken(UnaryCall<v1::CheckTokenRequest, v1::CheckTokenResponse>* call);
  void Describe(UnaryCall<v1::DescribeRequest, v1::DescribeResponse>* call);

  const Router* const router_;
  const Authenticator* const auth_;
  v1::Lock::AsyncService service_;
};

}  // namespace holdfast::server
