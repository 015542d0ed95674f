// Small pieces every callback-API handler of holdfastd uses.
#pragma once

#include <algorithm>
#include <chrono>

#include <grpcpp/grpcpp.h>

#include "common/grpc_status.h"
#include "lock/engine.h"

namespace holdfast::server {

// Work for a unary RPC without a client deadline stops after this long.
inline constexpr std::chrono::seconds kUnaryCap{30};

// The deadline for work on behalf of an RPC: the client's deadline, but never more
// than `cap` from now (a client without a deadline must not pin work forever).
inline lock::Deadline RpcDeadline(const grpc::ServerContextBase& ctx,
                                  std::chrono::milliseconds cap) {
  auto limit = std::chrono::system_clock::now() + cap;
  return std::min(ctx.deadline(), limit);
}

// An engine callback that finishes a unary reactor with the result.
template <class T>
lock::Done<T> FinishInto(grpc::ServerUnaryReactor* reactor, T* resp) {
  return [reactor, resp](absl::StatusOr<T> r) {
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  };
}

// Finishes a unary reactor at once (a refused call).
inline grpc::ServerUnaryReactor* FinishNow(grpc::ServerUnaryReactor* reactor,
                                           const absl::Status& why) {
  reactor->Finish(ToGrpcStatus(why));
  return reactor;
}

}  // namespace holdfast::server
