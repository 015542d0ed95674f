// Template definitions for etcd/client.h. Include client.h, not this file.
#pragma once

#include <future>

namespace holdfast::etcd {

template <class T>
absl::StatusOr<T> Await(const std::function<void(Callback<T>)>& start) {
  if (EventLoop* loop = EventLoop::Current()) {
    return absl::FailedPreconditionError(
        "etcd client: a blocking call on event loop thread \"" + loop->name() +
        "\" (it would wait for itself)");
  }
  auto promise = std::make_shared<std::promise<absl::StatusOr<T>>>();
  auto future = promise->get_future();
  start([promise](absl::StatusOr<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

}  // namespace holdfast::etcd
