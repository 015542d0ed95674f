// The Session service (Open, KeepAlive, Close) on gRPC's callback API: no RPC
// holds a thread while etcd answers. Open and Close count against the
// namespace's op_rate_quota (server/op_quota.h); KeepAlive never does. Every
// request goes to the engine of its namespace's home cluster (server/clusters.h).
//
// Thread-safe.
#pragma once

#include "holdfast/v1/session.grpc.pb.h"
#include "lock/engine.h"
#include "server/auth.h"
#include "server/clusters.h"
#include "server/op_quota.h"

namespace holdfast::server {

class SessionService final : public v1::Session::CallbackService {
 public:
  SessionService(const Router* router, const Authenticator* auth)
      : router_(router), auth_(auth) {}

  grpc::ServerUnaryReactor* Open(grpc::CallbackServerContext* ctx,
                                 const v1::OpenSessionRequest* req,
                                 v1::OpenSessionResponse* resp) override;
  grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>* KeepAlive(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Close(grpc::CallbackServerContext* ctx,
                                  const v1::CloseSessionRequest* req,
                                  v1::CloseSessionResponse* resp) override;

 private:
  const Router* const router_;
  const Authenticator* const auth_;
};

}  // namespace holdfast::server
