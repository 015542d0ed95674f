// The Session service (Open, KeepAlive, Close), served on holdfastd's event loop
// (server/async_rpc.h): no RPC holds a thread while etcd answers. Open and Close
// count against the namespace's op_rate_quota (server/op_quota.h); KeepAlive never
// does. Every request goes to the engine of its namespace's home cluster
// (server/clusters.h).
//
// Thread-safe. Handlers run on the loop thread and never block.
#pragma once

#include "holdfast/v1/session.grpc.pb.h"
#include "lock/engine.h"
#include "server/async_rpc.h"
#include "server/auth.h"
#include "server/clusters.h"

namespace holdfast::server {

class SessionService {
 public:
  SessionService(const Router* router, const Authenticator* auth)
      : router_(router), auth_(auth) {}

  // Registered with the grpc::ServerBuilder.
  grpc::Service* grpc_service() { return &service_; }
  // Starts serving; after the gRPC server has been built and started.
  void Serve(RpcServer* rpc);

 private:
  class KeepAliveStream;
  void Open(UnaryCall<v1::OpenSessionRequest, v1::OpenSessionResponse>* call);
  void Close(UnaryCall<v1::CloseSessionRequest, v1::CloseSessionResponse>* call);
  // Asks gRPC for the next KeepAlive stream.
  void RequestKeepAlive();

  const Router* const router_;
  const Authenticator* const auth_;
  RpcServer* rpc_ = nullptr;
  v1::Session::AsyncService service_;
};

}  // namespace holdfast::server
