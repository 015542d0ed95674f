// The Session service (Open, KeepAlive, Close), served on holdfastd's event loop
// (server/async_rpc.h): no RPC holds a thread while etcd answers. Open and Close
// count against the namespace's op_rate_quota (server/op_quota.h); KeepAlive never
// does. Every request goes to the engine of its namespace's home cluster
// (server/clusters.h).
//
// Thread-safe. Handlers run on the loop thread and never block.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
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

  // The replica is stopping (Server::Shutdown): every KeepAlive stream ends with
  // UNAVAILABLE and the kStoppingMetadata trailer once the renewals it has under
  // way are answered, and a stream that arrives from now on ends so at once;
  // libholdfast renews on its next endpoint. From any thread; idempotent.
  void EndStreams();

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
  absl::Mutex streams_mu_;
  bool stopping_ ABSL_GUARDED_BY(streams_mu_) = false;
  // The streams that have arrived and not been deleted.
  absl::flat_hash_set<KeepAliveStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace holdfast::server
