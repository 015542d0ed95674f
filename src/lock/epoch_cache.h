// The newest /holdfast/epoch record this replica has read. Used to guard releases
// (a token's epoch must be the current one) without an extra read; every
// snapshot the engine reads refreshes it, and a guarded compare on the record's
// mod_revision catches a cache that is behind.
//
// Thread-safe.
#pragma once

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lock/snapshot.h"

namespace holdfast::lock {

class EpochCache {
 public:
  std::optional<EpochEntry> Get() {
    absl::MutexLock l(&mu_);
    return current_;
  }
  // Keeps the record read last. (Not the highest mod_revision: a restored
  // cluster's revisions go back.) A stale pick only costs a failed compare.
  void Observe(const std::optional<EpochEntry>& e) {
    if (!e) return;
    absl::MutexLock l(&mu_);
    current_ = e;
  }

 private:
  absl::Mutex mu_;
  std::optional<EpochEntry> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::lock
