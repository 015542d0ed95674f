#include "server/session_service.h"

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {

// One KeepAlive stream. Requests are read one after another; each is answered
// once etcd has. Every request's session is checked (it exists in the namespace
// named and belongs to the caller): from the engine's table of sessions it has
// seen, or with one read of a session new to it. The reactor finishes only when
// reads are over and no engine callback is outstanding, so no callback outlives it.
class KeepAliveReactor
    : public grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse> {
 public:
  KeepAliveReactor(const Router* router, lock::Caller caller)
      : router_(router), caller_(std::move(caller)) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock l(&mu_);
        reads_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    v1::KeepAliveRequest req = req_;
    {
      absl::MutexLock l(&mu_);
      ++outstanding_;
    }
    StartRead(&req_);  // pipelined: the next request may come before this answer
    Handle(std::move(req));
  }

  void OnWriteDone(bool ok) override {
    bool more = false, finish = false;
    {
      absl::MutexLock l(&mu_);
      if (!ok) {
        broken_ = true;
        writes_.clear();
      }
      if (!broken_ && !writes_.empty()) {
        write_buf_ = std::move(writes_.front());
        writes_.pop_front();
        more = true;
      } else {
        writing_ = false;
        finish = ShouldFinishLocked();
      }
    }
    if (more) StartWrite(&write_buf_);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void Handle(v1::KeepAliveRequest req) {
    // Each request goes to its namespace's home cluster. A session is verified
    // per cluster: after a rehome its id means nothing on the new home. The
    // engine knows the sessions it has seen (lock/session_owners.h): those are
    // checked at once, and only a session new to this replica costs a read.
    lock::Engine* engine = router_->RouteFor(req.namespace_()).engine;
    auto deadline = lock::Deadline(std::chrono::system_clock::now() +
                                   engine->options().etcd_timeout);
    if (auto known = engine->CheckKnownSession(caller_, req.namespace_(), req.session_id())) {
      if (!known->ok()) return Refuse(req, *known);
      return Renew(engine, std::move(req), deadline);
    }
    engine->VerifySession(caller_, req.namespace_(), req.session_id(), deadline,
                           [this, engine, req, deadline](absl::StatusOr<bool> ok) mutable {
                             if (ok.ok()) return Renew(engine, std::move(req), deadline);
                             Refuse(req, ok.status());
                           });
  }

  // Answers a request whose session did not pass the check: lost when it is not
  // (or not the caller's) to renew, etcd_unavailable when etcd could not tell.
  void Refuse(const v1::KeepAliveRequest& req, const absl::Status& why) {
    v1::KeepAliveResponse resp;
    resp.set_session_id(req.session_id());
    resp.set_sequence(req.sequence());
    const auto code = why.code();
    bool gone = code == absl::StatusCode::kNotFound ||
                code == absl::StatusCode::kInvalidArgument ||
                code == absl::StatusCode::kPermissionDenied;
    resp.set_lost(gone);
    resp.set_etcd_unavailable(!gone);
    resp.set_reason(std::string(why.message()));
    Answer(std::move(resp));
  }

  void Renew(lock::Engine* engine, v1::KeepAliveRequest req, lock::Deadline deadline) {
    engine->Renew(req, deadline, [this](absl::StatusOr<v1::KeepAliveResponse> r) {
      Answer(*std::move(r));  // Renew never fails; errors are in the answer
    });
  }

  void Answer(v1::KeepAliveResponse resp) {
    bool start = false, finish = false;
    {
      absl::MutexLock l(&mu_);
      --outstanding_;
      if (!broken_) {
        if (writing_) {
          writes_.push_back(std::move(resp));
        } else {
          writing_ = true;
          write_buf_ = std::move(resp);
          start = true;
        }
      }
      finish = !start && ShouldFinishLocked();
    }
    if (start) StartWrite(&write_buf_);
    if (finish) Finish(grpc::Status::OK);
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || outstanding_ > 0 || writing_) return false;
    finished_ = true;
    return true;
  }

  const Router* const router_;
  const lock::Caller caller_;
  v1::KeepAliveRequest req_;              // owned by the read chain
  v1::KeepAliveResponse write_buf_;       // owned by the write in flight
  absl::Mutex mu_;
  std::deque<v1::KeepAliveResponse> writes_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A KeepAlive stream from a caller without an acceptable identity.
class RefusedStream
    : public grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse> {
 public:
  explicit RefusedStream(const absl::Status& why) { Finish(ToGrpcStatus(why)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* SessionService::Open(grpc::CallbackServerContext* ctx,
                                               const v1::OpenSessionRequest* req,
                                               v1::OpenSessionResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return FinishNow(reactor, caller.status());
  const Route route = router_->RouteFor(req->namespace_());
  AdmitThen(route.quota, ctx, reactor, *caller, req->namespace_(), [=, caller = *caller] {
    route.engine->OpenSession(caller, *req, RpcDeadline(*ctx, kUnaryCap), FinishInto(reactor, resp));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>* SessionService::KeepAlive(
    grpc::CallbackServerContext* ctx) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return new RefusedStream(caller.status());
  return new KeepAliveReactor(router_, *caller);
}

grpc::ServerUnaryReactor* SessionService::Close(grpc::CallbackServerContext* ctx,
                                                const v1::CloseSessionRequest* req,
                                                v1::CloseSessionResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return FinishNow(reactor, caller.status());
  const Route route = router_->RouteFor(req->namespace_());
  AdmitThen(route.quota, ctx, reactor, *caller, req->namespace_(), [=, caller = *caller] {
    route.engine->CloseSession(caller, *req, RpcDeadline(*ctx, kUnaryCap), FinishInto(reactor, resp));
  });
  return reactor;
}

}  // namespace holdfast::server
