// The Session service (Open, KeepAlive, Close), served on holdfastd's event loop
// (server/async_rpc.h): no RPC holds a thread while etcd answers. Open and Close
// count against the namespace's op_rate_quota (server/op_quota.h); KeepAlive never
// does, but its reads of sessions new to the replica are paced per identity
// (server/lookup_pacer.h). Every request goes to the engine of its namespace's home cluster
// (server/clusters.h).
//
// Thread-safe. Handlers run on the loop thread and never block.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/timer_queue.h"
#include "holdfast/v1/session.grpc.pb.h"
#include "lock/engine.h"
#include "server/async_rpc.h"
#include "server/auth.h"
#include "server/clusters.h"
#include "server/lookup_pacer.h"

namespace holdfast::server {

class SessionService {
 public:
  // `lookups`: the pace of KeepAlive's reads of sessions new to this replica,
  // per identity (server/lookup_pacer.h); `timers` runs its waits.
  SessionService(const Router* router, const Authenticator* auth,
                 LookupPacer::Options lookups, std::weak_ptr<TimerQueue> timers);

  // Registered with the grpc::ServerBuilder.
  grpc::Service* grpc_service() { return &service_; }
  // Starts serving; after the gRPC server has been built and started.
  void Serve(RpcServer* rpc);

  // The replica is stopping (Server::Shutdown): every KeepAlive stream ends with
  // UNAVAILABLE and the kStoppingMetadata trailer once the renewals it has under
  // way are answered, and a stream that arrives from now on ends so at once;
  // libholdfast renews on its next endpoint. A renewal whose lookup waits for its
  // identity's pace is not looked up then: it gets no answer, and the client
  // renews it on the next endpoint. From any thread; idempotent.
  void EndStreams();

 private:
  class KeepAliveStream;
  void Open(UnaryCall<v1::OpenSessionRequest, v1::OpenSessionResponse>* call);
  void Close(UnaryCall<v1::CloseSessionRequest, v1::CloseSessionResponse>* call);
  // Asks gRPC for the next KeepAlive stream.
  void RequestKeepAlive();

  const Router* const router_;
  const Authenticator* const auth_;
  LookupPacer lookups_;
  RpcServer* rpc_ = nullptr;
  v1::Session::AsyncService service_;
  absl::Mutex streams_mu_;
  bool stopping_ ABSL_GUARDED_BY(streams_mu_) = false;
  // The streams that have arrived and not been deleted.
  absl::flat_hash_set<KeepAliveStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace holdfast::server
