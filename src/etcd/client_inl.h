// Template definitions for etcd/client.h. Include client.h, not this file.
#pragma once

#include <future>

namespace holdfast::etcd {

template <class T>
absl::StatusOr<T> Await(const std::function<void(Callback<T>)>& start) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<T>>>();
  auto future = promise->get_future();
  start([promise](absl::StatusOr<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

}  // namespace holdfast::etcd
