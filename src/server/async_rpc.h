// holdfastd's RPCs on gRPC's asynchronous API, all on one event loop (common/
// event_loop.h says why one: a second polling thread brings back a wake-up per
// message).
//
// A method is served by keeping `backlog` calls of it requested from gRPC. Each
// call that arrives asks for the next one, then goes to its handler on the loop
// thread. A handler must not block: it starts the work (an engine operation,
// whose callbacks come back on the loop or the timer thread) and returns; the
// call is answered by UnaryCall::Finish, from whichever thread the work ends on.
// Blocking handlers (the Admin service: several etcd round trips or an audit
// store query each) are served by ServeBlocking, which runs them on a worker pool
// whose threads never poll gRPC. Calls that wait for something outside holdfastd
// (a rehome waits for the namespace's holds to end, up to its deadline) have a
// pool of their own: however many of them wait, the other admin calls (a force
// approval, the epoch, the audit trail) are not queued behind them. A call whose
// caller has gone while it waited for a thread (its deadline passed, or it was
// cancelled) is not run: its caller was told DEADLINE_EXCEEDED or CANCELLED,
// and a change it would make now would come behind the operator's back.
//
// Shutdown: Stop() (no call is asked for any more), then the gRPC server's
// Shutdown (which waits for or cancels the calls in flight, while the loop keeps
// running), then StopWorkers(), then the loop.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "common/event_loop.h"
#include "common/grpc_status.h"
#include "common/worker_pool.h"

namespace holdfast::server {

class RpcServer;

// One call of a unary method. Handed to the handler when it arrives; lives until
// it is answered and gRPC is done with it.
template <class Req, class Resp>
class UnaryCall {
 public:
  grpc::ServerContext& context() { return ctx_; }
  const Req& request() const { return req_; }
  Resp* response() { return &resp_; }

  // Answers the call: response() when `status` is OK, else the error with its
  // message. Exactly once, from any thread; the call may be gone when it returns.
  void Finish(const absl::Status& status) {
    if (status.ok()) {
      responder_.Finish(resp_, grpc::Status::OK, &finished_);
    } else {
      responder_.FinishWithError(ToGrpcStatus(status), &finished_);
    }
  }

  // `fn` runs on the loop thread if the call is cancelled (the client went away,
  // or its deadline passed) while the work goes on. At most once, from the
  // handler, before it returns.
  void OnCancel(std::function<void()> fn) { on_cancel_ = std::move(fn); }

 private:
  friend class RpcServer;
  // How calls of one method are asked for and handled.
  struct Method {
    RpcServer* server;
    // Asks gRPC for the next call of the method, into `call`.
    std::function<void(UnaryCall*)> request;
    std::function<void(UnaryCall*)> handler;
  };

  explicit UnaryCall(std::shared_ptr<const Method> method) : method_(std::move(method)) {
    ctx_.AsyncNotifyWhenDone(&done_);
    method_->request(this);
  }

  void OnArrived(bool ok);
  // The answer went out (or could not).
  void OnFinished(bool) {
    finish_back_ = true;
    if (done_back_) delete this;
  }
  // gRPC is done with the call: answered, or cancelled.
  void OnDone(bool) {
    done_back_ = true;
    if (ctx_.IsCancelled() && on_cancel_) std::exchange(on_cancel_, nullptr)();
    if (finish_back_) delete this;
  }

  const std::shared_ptr<const Method> method_;
  grpc::ServerContext ctx_;
  Req req_;
  Resp resp_;
  grpc::ServerAsyncResponseWriter<Resp> responder_{&ctx_};
  std::function<void()> on_cancel_;
  // Touched on the loop thread only.
  bool finish_back_ = false;
  bool done_back_ = false;
  EventLoop::MemberTag<UnaryCall> arrived_{this, &UnaryCall::OnArrived};
  EventLoop::MemberTag<UnaryCall> finished_{this, &UnaryCall::OnFinished};
  EventLoop::MemberTag<UnaryCall> done_{this, &UnaryCall::OnDone};
};

// The generated AsyncService's RequestX method of a unary RPC.
template <class Service, class Req, class Resp>
using RequestUnaryFn = void (Service::*)(grpc::ServerContext*, Req*,
                                         grpc::ServerAsyncResponseWriter<Resp>*,
                                         grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                         void*);

// Which pool a blocking handler runs on.
enum class Blocking {
  kBrief,    // a few etcd round trips, an audit store call
  kWaiting,  // waits for others, up to the call's own deadline (a rehome's drain)
};

class RpcServer {
 public:
  // `loop` must have a server queue; `brief_threads` and `waiting_threads` run
  // the blocking handlers of each kind.
  RpcServer(EventLoop* loop, int brief_threads, int waiting_threads)
      : loop_(loop),
        brief_(brief_threads, "holdfastd-admin"),
        waiting_(waiting_threads, "holdfastd-wait") {}

  EventLoop* loop() const { return loop_; }
  // True once Stop() has run: no call is to be asked for any more.
  bool stopped() const { return stopped_.load(); }

  // Serves a unary method with a handler that must not block. Only after the
  // gRPC server has been built and started.
  template <class Service, class Req, class Resp>
  void ServeUnary(Service* service, RequestUnaryFn<Service, Req, Resp> request,
                  std::function<void(UnaryCall<Req, Resp>*)> handler, int backlog = 1) {
    using Call = UnaryCall<Req, Resp>;
    auto method = std::make_shared<typename Call::Method>();
    method->server = this;
    grpc::ServerCompletionQueue* cq = loop_->server_cq();
    method->request = [service, request, cq](Call* c) {
      (service->*request)(&c->ctx_, &c->req_, &c->responder_, cq, cq, &c->arrived_);
    };
    method->handler = std::move(handler);
    for (int i = 0; i < backlog; ++i) new Call(method);
  }

  // Serves a unary method whose handler blocks: it runs on the worker pool of
  // the call's kind (`kind` of its request; brief without one) and its status
  // answers the call (its response with OK). A call whose caller has gone before
  // a thread takes it is answered without running.
  template <class Service, class Req, class Resp>
  void ServeBlocking(Service* service, RequestUnaryFn<Service, Req, Resp> request,
                     std::function<grpc::Status(grpc::ServerContext*, const Req*, Resp*)> handler,
                     std::function<Blocking(const Req&)> kind = nullptr) {
    ServeUnary<Service, Req, Resp>(
        service, request,
        [this, handler = std::move(handler), kind = std::move(kind)](UnaryCall<Req, Resp>* call) {
          WorkerPool* pool =
              kind && kind(call->request()) == Blocking::kWaiting ? &waiting_ : &brief_;
          bool queued = pool->Run([call, handler] {
            // Known once the loop has seen the call end (ServerContext::IsCancelled
            // on the asynchronous API): a deadline that passed while queued.
            if (call->context().IsCancelled()) {
              call->Finish(absl::CancelledError(
                  "the call ended (its deadline passed, or its caller left) while it waited "
                  "for an admin thread; not run"));
              return;
            }
            grpc::Status s = handler(&call->context(), &call->request(), call->response());
            call->Finish(FromGrpcStatus(s));
          });
          if (!queued) call->Finish(absl::UnavailableError("holdfastd is shutting down"));
        });
  }

  // No call is asked for from here on. Before the gRPC server's Shutdown.
  void Stop() { stopped_.store(true); }
  // Runs the blocking handlers still queued and joins the pool's threads. After
  // the gRPC server's Shutdown, while the loop still runs.
  void StopWorkers() {
    waiting_.Stop();
    brief_.Stop();
  }

 private:
  EventLoop* const loop_;
  WorkerPool brief_;
  WorkerPool waiting_;
  std::atomic<bool> stopped_{false};
};

template <class Req, class Resp>
void UnaryCall<Req, Resp>::OnArrived(bool ok) {
  if (!ok) {
    // The server is shutting down; the call was never matched, so gRPC will not
    // tell it done either.
    delete this;
    return;
  }
  if (!method_->server->stopped()) new UnaryCall(method_);
  method_->handler(this);
}

}  // namespace holdfast::server
