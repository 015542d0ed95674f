// One bidirectional gRPC stream on the asynchronous API and an event loop, with a
// write queue and safe cancellation from any thread. The base of the keepalive
// and watch multiplexers.
//
// Thread-safe: Send() and Cancel() may be called from any thread, but never while
// holding a lock that OnResponse/OnFinished take. OnResponse runs on the loop
// thread, one at a time, in stream order. OnFinished runs exactly once, on the
// loop thread, after which no reaction runs; the object stays alive while anyone
// holds a shared_ptr to it.
//
// Lifetime: create with std::make_shared, then Prepare() and Go(); the stream keeps
// itself alive until OnFinished has returned and gRPC has handed back every
// operation it was given.
//
// The stream's operations, each with its own tag: the start (which takes the
// write slot until it is back: no message goes out before), one read at a time
// (the next one is asked for once a response has been handled), one write at a
// time (the queue holds the rest), and the finish, asked for once every other
// operation is back (gRPC: Finish must not overlap another operation).
#pragma once

#include <deque>
#include <functional>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"

namespace holdfast::etcd {

template <class Req, class Resp>
class BidiStream : public std::enable_shared_from_this<BidiStream<Req, Resp>> {
 public:
  using Rpc = grpc::ClientAsyncReaderWriter<Req, Resp>;
  // Makes the call on a stub's PrepareAsync method, e.g.
  //   [&](auto* ctx, auto* cq) { return stub->PrepareAsyncWatch(ctx, cq); }
  using Binder = std::function<std::unique_ptr<Rpc>(grpc::ClientContext*, grpc::CompletionQueue*)>;

  virtual ~BidiStream() = default;

  // Runs `fn` when the stream object is destroyed, after its ClientContext (so
  // after its channel reference) is gone. Owners wait for it before they drop
  // their channels. Set before Prepare().
  void OnDestroyed(std::function<void()> fn) { destroyed_.fn = std::move(fn); }

  // Creates the call on `loop`; starts nothing, so it may be called under the
  // owner's lock. Send() may be called from here on; messages go out after Go().
  void Prepare(EventLoop* loop, const Binder& bind) {
    self_ = this->shared_from_this();
    rpc_ = bind(&ctx_, loop->cq());
  }

  // Starts the call and its first read; the messages queued go out once the call
  // has started. Never under the owner's lock.
  void Go() {
    {
      absl::MutexLock l(&mu_);
      pending_ops_ += 2;  // the start and the read
    }
    rpc_->StartCall(&start_tag_);
    rpc_->Read(&resp_, &read_tag_);
  }

  // Queues a message. False if the stream is cancelled or over.
  bool Send(Req req) {
    {
      absl::MutexLock l(&mu_);
      if (cancelled_ || read_done_) return false;
      if (writing_ || !started_) {  // the start uses the write slot until it is back
        writes_.push_back(std::move(req));
        return true;
      }
      writing_ = true;
      ++pending_ops_;
      write_buf_ = std::move(req);
    }
    rpc_->Write(write_buf_, &write_tag_);
    return true;
  }

  // Cancels the stream; OnFinished follows (once Go() has run). Idempotent.
  void Cancel() {
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
    }
    ctx_.TryCancel();
  }

 protected:
  BidiStream() = default;
  virtual void OnResponse(const Resp& resp) = 0;
  virtual void OnFinished(const grpc::Status& status) = 0;
  grpc::ClientContext* context() { return &ctx_; }

 private:
  using Op = EventLoop::MemberTag<BidiStream>;

  // The call started (or failed to): the write slot is free for the queue.
  void OnStarted(bool ok) {
    bool write = false;
    {
      absl::MutexLock l(&mu_);
      started_ = true;
      if (ok && !cancelled_ && !read_done_ && !writes_.empty()) {
        write_buf_ = std::move(writes_.front());
        writes_.pop_front();
        writing_ = true;
        ++pending_ops_;
        write = true;
      }
    }
    if (write) rpc_->Write(write_buf_, &write_tag_);
    OpDone();
  }

  void OnRead(bool ok) {
    if (ok) {
      OnResponse(resp_);
      rpc_->Read(&resp_, &read_tag_);  // the read stays pending: no OpDone
      return;
    }
    {
      absl::MutexLock l(&mu_);
      read_done_ = true;
    }
    OpDone();
  }

  void OnWritten(bool ok) {
    bool more = false;
    {
      absl::MutexLock l(&mu_);
      if (!ok) {
        // A failed write means the stream is over; the read fails too.
        writes_.clear();
      } else if (!cancelled_ && !read_done_ && !writes_.empty()) {
        write_buf_ = std::move(writes_.front());
        writes_.pop_front();
        more = true;
      } else {
        writes_.clear();
      }
      if (!more) writing_ = false;
    }
    if (more) return rpc_->Write(write_buf_, &write_tag_);  // still pending: no OpDone
    OpDone();
  }

  void OnFinishedTag(bool) {
    OnFinished(status_);
    auto keep = std::move(self_);  // may destroy *this when it goes out of scope
  }

  // An operation other than the finish ended. Once none is left (the read is
  // pending until reads are over, so reads are over too), the finish is asked
  // for: its tag is then the last one gRPC holds, and the stream may go with it.
  void OpDone() {
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      --pending_ops_;
      if (pending_ops_ == 0 && !finish_asked_) {
        finish_asked_ = true;
        finish = true;
      }
    }
    if (finish) rpc_->Finish(&status_, &finish_tag_);
  }

  struct Finally {
    std::function<void()> fn;
    ~Finally() {
      if (fn) fn();
    }
  };
  Finally destroyed_;  // declared first: destroyed last, after ctx_
  grpc::ClientContext ctx_;
  std::unique_ptr<Rpc> rpc_;
  Op start_tag_{this, &BidiStream::OnStarted};
  Op read_tag_{this, &BidiStream::OnRead};
  Op write_tag_{this, &BidiStream::OnWritten};
  Op finish_tag_{this, &BidiStream::OnFinishedTag};
  Resp resp_;       // owned by the read in flight
  Req write_buf_;   // owned by the write in flight
  grpc::Status status_;
  absl::Mutex mu_;
  std::deque<Req> writes_ ABSL_GUARDED_BY(mu_);
  int pending_ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the start is back
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_asked_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<BidiStream> self_;
};

}  // namespace holdfast::etcd
