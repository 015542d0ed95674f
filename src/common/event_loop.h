// An event loop: one thread that runs every completion of one gRPC completion
// queue, for gRPC's asynchronous (completion-queue) API.
//
// holdfastd serves every RPC and makes every etcd call on one loop, instead of on
// gRPC's callback API. gRPC 1.51 runs the callback API on at least two "nexting"
// threads that take turns polling one queue, and its epoll1 poller passes the
// polling role to another waiting thread at every event it returns: each message
// in or out woke a second thread. One thread that polls and then runs the handler
// it woke for takes those wake-ups out (a lock cycle: 24 context switches in
// holdfastd before, under 10 after; docs/performance.md, "One event loop"). Any
// thread of the process that polls gRPC joins that hand-off, so the gain holds
// only while no other thread polls: no callback API, no synchronous service, no
// second loop.
//
// Thread-safe. Tags complete on the loop's thread, one at a time, in no promised
// order; a tag must never block (it holds up every call on the loop), and must
// not run a blocking call that waits for this loop (that deadlocks: see
// `Current()`).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

namespace holdfast {

class EventLoop {
 public:
  // What a completion runs. Passed to gRPC as the operation's tag; it must stay
  // alive until Proceed() is called, exactly once per operation it was given to.
  class Tag {
   public:
    // `ok` is gRPC's: false when the operation failed (a read after the stream
    // ended, a request of a server that is shutting down, ...).
    virtual void Proceed(bool ok) = 0;

   protected:
    ~Tag() = default;
  };

  // A tag that runs `(object->*fn)(ok)`: one per kind of operation of an object
  // that has at most one of each kind in flight (a stream's read, its write...).
  template <class T>
  class MemberTag final : public Tag {
   public:
    MemberTag(T* object, void (T::*fn)(bool)) : object_(object), fn_(fn) {}
    void Proceed(bool ok) override { (object_->*fn_)(ok); }

   private:
    T* const object_;
    void (T::*const fn_)(bool);
  };

  // A loop on a completion queue of its own, for client calls only.
  explicit EventLoop(std::string name);
  // A loop on a queue made by a grpc::ServerBuilder (AddCompletionQueue), on
  // which asynchronous server methods may be requested too. The queue may be used
  // for client calls before the server is built.
  EventLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq, std::string name);
  // Shutdown().
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  grpc::CompletionQueue* cq() const { return cq_.get(); }
  // Null for a loop made without a server queue.
  grpc::ServerCompletionQueue* server_cq() const { return server_cq_; }
  const std::string& name() const { return name_; }

  // The loop whose thread calls this, or null on any other thread. A blocking
  // call that would wait for a loop (etcd::Client's *Sync helpers) refuses to run
  // on a loop's thread instead of deadlocking it.
  static EventLoop* Current();

  // Shuts the queue down, runs the completions still due, and joins the thread.
  // Every operation on the queue must have ended or be bound to end (calls
  // finished or cancelled, a server on it shut down), and none may start after.
  // Never from the loop's own thread. Idempotent.
  void Shutdown();

 private:
  void Run();

  const std::string name_;
  std::unique_ptr<grpc::CompletionQueue> cq_;
  grpc::ServerCompletionQueue* server_cq_ = nullptr;  // cq_, when it is one
  std::thread thread_;
  bool shut_down_ = false;  // Shutdown() runs on one thread (the owner's)
};

}  // namespace holdfast
