// Small pieces every handler of holdfastd's unary RPCs uses.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "lock/engine.h"
#include "server/async_rpc.h"
#include "server/op_quota.h"

namespace holdfast::server {

// Trailing metadata of an UNAVAILABLE answer from a replica that is stopping
// (Server::Shutdown): ask the next endpoint now. libholdfast reads it
// (client/internal.h, SaysStopping).
inline constexpr char kStoppingMetadata[] = "holdfast-stopping";
inline constexpr char kStoppingMessage[] =
    "this holdfastd is stopping: ask another replica (a queued waiter keeps its place "
    "for a moment)";

// Work for a unary RPC without a client deadline stops after this long.
inline constexpr std::chrono::seconds kUnaryCap{30};

// The deadline for work on behalf of an RPC: the client's deadline, but never more
// than `cap` from now (a client without a deadline must not pin work forever).
inline lock::Deadline RpcDeadline(const grpc::ServerContextBase& ctx,
                                  std::chrono::milliseconds cap) {
  auto limit = std::chrono::system_clock::now() + cap;
  return std::min(ctx.deadline(), limit);
}

// RpcDeadline as a point on the steady clock (now when it has passed).
inline std::chrono::steady_clock::time_point SteadyCallDeadline(
    const grpc::ServerContextBase& ctx, std::chrono::milliseconds cap) {
  const auto left = RpcDeadline(ctx, cap) - std::chrono::system_clock::now();
  return std::chrono::steady_clock::now() +
         std::max<std::chrono::steady_clock::duration>(
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(left), {});
}

// An engine callback that answers `call` with the result.
template <class Req, class Resp>
lock::Done<Resp> FinishInto(UnaryCall<Req, Resp>* call) {
  return [call](absl::StatusOr<Resp> r) {
    if (r.ok()) *call->response() = std::move(*r);
    call->Finish(r.status());
  };
}

// Runs `proceed` when `quota` (null: no quota) admits `caller`'s operation on
// `ns`; otherwise answers `call` with the refusal and the retry-after-ms trailer.
template <class Req, class Resp>
void AdmitThen(OpQuota* quota, UnaryCall<Req, Resp>* call, const lock::Caller& caller,
               const std::string& ns, std::function<void()> proceed) {
  if (quota == nullptr) return proceed();
  quota->Admit(caller, ns, [call, proceed = std::move(proceed)](OpQuota::Admission a) {
    if (a.status.ok()) return proceed();
    call->context().AddTrailingMetadata(kRetryAfterMetadata, absl::StrCat(a.retry_after.count()));
    call->Finish(a.status);
  });
}

}  // namespace holdfast::server
