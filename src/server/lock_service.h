// The Lock service (Acquire, Release, CheckToken, Describe) on gRPC's callback
// API. A waiting Acquire holds no thread; a client that cancels its Acquire ends
// the wait. Acquire and Release count against the namespace's op_rate_quota
// (server/op_quota.h); CheckToken and Describe do not. Every request goes to the
// engine of its namespace's home cluster (server/clusters.h).
//
// Thread-safe.
#pragma once

#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/engine.h"
#include "server/auth.h"
#include "server/clusters.h"
#include "server/op_quota.h"

namespace holdfast::server {

class LockService final : public v1::Lock::CallbackService {
 public:
  LockService(const Router* router, const Authenticator* auth)
      : router_(router), auth_(auth) {}

  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx,
                                    const v1::AcquireRequest* req,
                                    v1::AcquireResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* CheckToken(grpc::CallbackServerContext* ctx,
                                       const v1::CheckTokenRequest* req,
                                       v1::CheckTokenResponse* resp) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* ctx,
                                     const v1::DescribeRequest* req,
                                     v1::DescribeResponse* resp) override;

 private:
  const Router* const router_;
  const Authenticator* const auth_;
};

}  // namespace holdfast::server
