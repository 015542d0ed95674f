#include "server/lock_service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {

// The longest wait acquire.max_wait may allow (config.cc checks it).
constexpr int64_t kMaxWaitMs = 24 * 3600 * 1000;

// Calls of the busiest methods kept requested from gRPC at once, so that a burst
// of arrivals does not wait for the loop to ask for each one.
constexpr int kHotBacklog = 8;

}  // namespace

// The cancellable part of one Acquire call: the call's cancel (or the replica's
// stop) may come before the engine operation has started (the quota's first
// read of a namespace is asynchronous), or after it has ended.
class LockService::AcquireCall {
 public:
  explicit AcquireCall(LockService* service) : service_(service) {}
  ~AcquireCall() {
    absl::MutexLock l(&service_->calls_mu_);
    service_->calls_.erase(this);
  }

  void SetOp(std::shared_ptr<lock::Cancellable> o) {
    bool cancel;
    std::optional<absl::Status> moved;
    {
      absl::MutexLock l(&mu_);
      op_ = o;
      cancel = cancelled_;
      moved = moved_;
    }
    if (cancel) {
      o->Cancel();
    } else if (moved) {
      o->Move(*moved);
    }
  }
  void Cancel() {
    std::shared_ptr<lock::Cancellable> o;
    {
      absl::MutexLock l(&mu_);
      cancelled_ = true;
      o = op_;
    }
    if (o) o->Cancel();
  }
  void Move(const absl::Status& why) {
    std::shared_ptr<lock::Cancellable> o;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_ || moved_) return;
      moved_ = why;
      o = op_;
    }
    if (o) o->Move(why);
  }

 private:
  LockService* const service_;
  absl::Mutex mu_;
  std::shared_ptr<lock::Cancellable> op_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> moved_ ABSL_GUARDED_BY(mu_);
};

void LockService::MoveWaits() {
  std::vector<std::shared_ptr<AcquireCall>> calls;
  {
    absl::MutexLock l(&calls_mu_);
    stopping_.store(true);
    for (const auto& [raw, weak] : calls_) {
      if (auto c = weak.lock()) calls.push_back(std::move(c));
    }
  }
  const absl::Status why = absl::UnavailableError(kStoppingMessage);
  for (const auto& c : calls) c->Move(why);
}

void LockService::Serve(RpcServer* rpc) {
  using S = v1::Lock::AsyncService;
  rpc->ServeUnary<S, v1::AcquireRequest, v1::AcquireResponse>(
      &service_, &S::RequestAcquire, [this](auto* call) { Acquire(call); }, kHotBacklog);
  rpc->ServeUnary<S, v1::ReleaseRequest, v1::ReleaseResponse>(
      &service_, &S::RequestRelease, [this](auto* call) { Release(call); }, kHotBacklog);
  rpc->ServeUnary<S, v1::CheckTokenRequest, v1::CheckTokenResponse>(
      &service_, &S::RequestCheckToken, [this](auto* call) { CheckToken(call); }, kHotBacklog);
  rpc->ServeUnary<S, v1::DescribeRequest, v1::DescribeResponse>(
      &service_, &S::RequestDescribe, [this](auto* call) { Describe(call); });
}

void LockService::Acquire(UnaryCall<v1::AcquireRequest, v1::AcquireResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  auto cancel = std::make_shared<AcquireCall>(this);
  bool stopping;
  {
    absl::MutexLock l(&calls_mu_);
    stopping = stopping_.load();
    if (!stopping) calls_.emplace(cancel.get(), cancel);
  }
  if (stopping) {
    call->context().AddTrailingMetadata(kStoppingMetadata, "1");
    return call->Finish(absl::UnavailableError(kStoppingMessage));
  }
  call->OnCancel([cancel] { cancel->Cancel(); });
  const v1::AcquireRequest* req = &call->request();  // lives as long as the call
  const Route route = router_->RouteFor(req->namespace_());
  AdmitThen(route.quota, call, *caller, req->namespace_(), [=, this, caller = *caller] {
    // Work may go on for the wait plus a margin for the grant itself. A wait out
    // of range is refused by the engine; clamped here so the sum cannot overflow.
    auto deadline = RpcDeadline(
        call->context(),
        std::chrono::milliseconds(std::clamp<int64_t>(req->wait_ms(), 0, kMaxWaitMs)) + kUnaryCap);
    // The call may be gone once the engine answers it; `cancel` (held by this
    // closure) stays alive here.
    cancel->SetOp(route.engine->Acquire(
        caller, *req, deadline,
        [this, call, finish = FinishInto(call)](absl::StatusOr<v1::AcquireResponse> r) {
          if (r.status().code() == absl::StatusCode::kUnavailable && stopping_.load()) {
            call->context().AddTrailingMetadata(kStoppingMetadata, "1");
          }
          finish(std::move(r));
        }));
  });
}

void LockService::Release(UnaryCall<v1::ReleaseRequest, v1::ReleaseResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  const v1::ReleaseRequest* req = &call->request();
  const Route route = router_->RouteFor(req->namespace_());
  // Counted against op_rate_quota, never refused by it (OpQuota::Charge).
  if (route.quota != nullptr) route.quota->Charge(*caller, req->namespace_());
  route.engine->Release(*caller, *req, RpcDeadline(call->context(), kUnaryCap), FinishInto(call));
}

void LockService::CheckToken(UnaryCall<v1::CheckTokenRequest, v1::CheckTokenResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  const auto& req = call->request();
  router_->RouteFor(req.namespace_())
      .engine->CheckToken(*caller, req, RpcDeadline(call->context(), kUnaryCap), FinishInto(call));
}

void LockService::Describe(UnaryCall<v1::DescribeRequest, v1::DescribeResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  const auto& req = call->request();
  router_->RouteFor(req.namespace_())
      .engine->Describe(*caller, req, RpcDeadline(call->context(), kUnaryCap), FinishInto(call));
}

}  // namespace holdfast::server
