#include "common/event_loop.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>

namespace holdfast {

namespace {
thread_local EventLoop* current_loop = nullptr;
}  // namespace

EventLoop::EventLoop(std::string name)
    : name_(std::move(name)), cq_(std::make_unique<grpc::CompletionQueue>()) {
  thread_ = std::thread([this] { Run(); });
}

EventLoop::EventLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq, std::string name)
    : name_(std::move(name)), cq_(std::move(cq)) {
  server_cq_ = static_cast<grpc::ServerCompletionQueue*>(cq_.get());
  thread_ = std::thread([this] { Run(); });
}

EventLoop::~EventLoop() { Shutdown(); }

EventLoop* EventLoop::Current() { return current_loop; }

void EventLoop::Shutdown() {
  if (shut_down_) return;
  if (Current() == this) {
    std::fprintf(stderr, "event loop %s: Shutdown() from its own thread\n", name_.c_str());
    std::abort();
  }
  shut_down_ = true;
  cq_->Shutdown();
  thread_.join();
}

void EventLoop::Run() {
  // Thread names are at most 15 characters; seen in top -H and perf.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  current_loop = this;
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) static_cast<Tag*>(tag)->Proceed(ok);
  current_loop = nullptr;
}

}  // namespace holdfast
