// One bidirectional gRPC stream on the callback API, with a write queue and safe
// cancellation from any thread. The base of the keepalive and watch multiplexers.
//
// Thread-safe: Send() and Cancel() may be called from any thread, but never while
// holding a lock that OnResponse/OnFinished take (gRPC may run reactions inline
// from inside those calls). OnResponse runs on a gRPC thread, one at a time, in
// stream order. OnFinished runs exactly once, after which no reaction runs; the
// object stays alive while anyone holds a shared_ptr to it.
//
// Lifetime: create with std::make_shared, then Prepare() and Go(); the stream keeps itself
// alive until OnFinished has returned.
#pragma once

#include <deque>
#include <functional>
#include <memory>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::etcd {

template <class Req, class Resp>
class BidiStream : public grpc::ClientBidiReactor<Req, Resp>,
                   public std::enable_shared_from_this<BidiStream<Req, Resp>> {
 public:
  using Reactor = grpc::ClientBidiReactor<Req, Resp>;
  // Binds the reactor to a stub's async method, e.g.
  //   [&](auto* ctx, auto* r) { stub->async()->Watch(ctx, r); }
  using Binder = std::function<void(grpc::ClientContext*, Reactor*)>;

  virtual ~BidiStream() = default;

  // Runs `fn` when the stream object is destroyed, after its ClientContext (so
  // after its channel reference) is gone. Owners wait for it before they drop
  // their channels: gRPC 1.51 must not see a channel's last reference dropped on
  // that channel's callback thread. Set before Prepare().
  void OnDestroyed(std::function<void()> fn) { destroyed_.fn = std::move(fn); }

  // Creates the call; runs no reaction, so it may be called under the owner's
  // lock. Send() may be called from here on; messages go out after Go().
  void Prepare(const Binder& bind) {
    self_ = this->shared_from_this();
    bind(&ctx_, this);
    this->StartRead(&resp_);
    this->AddHold();  // the base hold: lets us write from outside reactions
  }
  // Starts the call. Never under the owner's lock.
  void Go() { this->StartCall(); }

  // Queues a message. False if the stream is cancelled or over.
  bool Send(Req req) {
    {
      absl::MutexLock l(&mu_);
      if (cancelled_ || read_done_) return false;
      if (writing_) {
        writes_.push_back(std::move(req));
        return true;
      }
      writing_ = true;
      write_buf_ = std::move(req);
    }
    this->StartWrite(&write_buf_);
    return true;
  }

  // Cancels the stream; OnFinished follows. Idempotent.
  void Cancel() {
    bool release;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      release = TakeBaseHoldLocked();
    }
    ctx_.TryCancel();
    if (release) this->RemoveHold();
  }

 protected:
  BidiStream() = default;
  virtual void OnResponse(const Resp& resp) = 0;
  virtual void OnFinished(const grpc::Status& status) = 0;
  grpc::ClientContext* context() { return &ctx_; }

 private:
  // True when the base hold may go now (no write in flight and the stream is
  // ending); the caller then calls RemoveHold() outside mu_.
  bool TakeBaseHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (base_released_ || writing_ || !(cancelled_ || read_done_)) return false;
    base_released_ = true;
    return true;
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      OnResponse(resp_);
      this->StartRead(&resp_);
      return;
    }
    bool release;
    {
      absl::MutexLock l(&mu_);
      read_done_ = true;
      release = TakeBaseHoldLocked();
    }
    if (release) this->RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    bool more = false, release = false;
    {
      absl::MutexLock l(&mu_);
      if (!ok) read_done_ = true;  // a failed write means the stream is over
      if (ok && !cancelled_ && !read_done_ && !writes_.empty()) {
        write_buf_ = std::move(writes_.front());
        writes_.pop_front();
        more = true;
      } else {
        writing_ = false;
        writes_.clear();
        release = TakeBaseHoldLocked();
      }
    }
    if (more) this->StartWrite(&write_buf_);
    if (release) this->RemoveHold();
  }

  void OnDone(const grpc::Status& s) override {
    OnFinished(s);
    auto keep = std::move(self_);  // may destroy *this when it goes out of scope
  }

  struct Finally {
    std::function<void()> fn;
    ~Finally() {
      if (fn) fn();
    }
  };
  Finally destroyed_;  // declared first: destroyed last, after ctx_
  grpc::ClientContext ctx_;
  Resp resp_;       // owned by the read chain
  Req write_buf_;   // owned by the write in flight
  absl::Mutex mu_;
  std::deque<Req> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool base_released_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<BidiStream> self_;
};

}  // namespace holdfast::etcd
