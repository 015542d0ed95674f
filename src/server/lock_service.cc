#include "server/lock_service.h"

#include <algorithm>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {

// The longest wait acquire.max_wait may allow (config.cc checks it).
constexpr int64_t kMaxWaitMs = 24 * 3600 * 1000;

// The cancellable part of one Acquire call. Shared between the reactor and the
// code that starts the engine operation, so neither outlives what it touches.
struct AcquireCall {
  absl::Mutex mu;
  std::shared_ptr<lock::Cancellable> op ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;

  void SetOp(std::shared_ptr<lock::Cancellable> o) {
    bool cancel;
    {
      absl::MutexLock l(&mu);
      op = o;
      cancel = cancelled;
    }
    if (cancel) o->Cancel();
  }
  void Cancel() {
    std::shared_ptr<lock::Cancellable> o;
    {
      absl::MutexLock l(&mu);
      cancelled = true;
      o = op;
    }
    if (o) o->Cancel();
  }
};

class AcquireReactor : public grpc::ServerUnaryReactor {
 public:
  explicit AcquireReactor(std::shared_ptr<AcquireCall> call) : call_(std::move(call)) {}
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<AcquireCall> call_;
};

}  // namespace

grpc::ServerUnaryReactor* LockService::Acquire(grpc::CallbackServerContext* ctx,
                                               const v1::AcquireRequest* req,
                                               v1::AcquireResponse* resp) {
  auto call = std::make_shared<AcquireCall>();
  auto* reactor = new AcquireReactor(call);
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const Route route = router_->RouteFor(req->namespace_());
  AdmitThen(route.quota, ctx, reactor, *caller, req->namespace_(), [=, caller = *caller] {
    // Work may go on for the wait plus a margin for the grant itself. A wait out
    // of range is refused by the engine; clamped here so the sum cannot overflow.
    auto deadline = RpcDeadline(
        *ctx, std::chrono::milliseconds(std::clamp<int64_t>(req->wait_ms(), 0, kMaxWaitMs)) +
                  kUnaryCap);
    // The reactor may be gone once the engine finishes it; `call` (held by this
    // closure) stays alive here.
    call->SetOp(route.engine->Acquire(caller, *req, deadline, FinishInto(reactor, resp)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* LockService::Release(grpc::CallbackServerContext* ctx,
                                               const v1::ReleaseRequest* req,
                                               v1::ReleaseResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return FinishNow(reactor, caller.status());
  const Route route = router_->RouteFor(req->namespace_());
  AdmitThen(route.quota, ctx, reactor, *caller, req->namespace_(), [=, caller = *caller] {
    route.engine->Release(caller, *req, RpcDeadline(*ctx, kUnaryCap), FinishInto(reactor, resp));
  });
  return reactor;
}

grpc::ServerUnaryReactor* LockService::CheckToken(grpc::CallbackServerContext* ctx,
                                                  const v1::CheckTokenRequest* req,
                                                  v1::CheckTokenResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return FinishNow(reactor, caller.status());
  router_->RouteFor(req->namespace_()).engine->CheckToken(*caller, *req, RpcDeadline(*ctx, kUnaryCap), FinishInto(reactor, resp));
  return reactor;
}

grpc::ServerUnaryReactor* LockService::Describe(grpc::CallbackServerContext* ctx,
                                                const v1::DescribeRequest* req,
                                                v1::DescribeResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return FinishNow(reactor, caller.status());
  router_->RouteFor(req->namespace_()).engine->Describe(*caller, *req, RpcDeadline(*ctx, kUnaryCap), FinishInto(reactor, resp));
  return reactor;
}

}  // namespace holdfast::server
