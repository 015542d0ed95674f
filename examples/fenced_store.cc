// A storage server that fences its writes with holdfast tokens (docs/fencing.md).
//
// Two holders of the lock "reports/daily" write one object. The first pauses (a
// long GC, a SIGSTOP, a slow disk) past its TTL; holdfast grants the lock to the
// second, which writes; then the first wakes up and sends its late write. The
// store rejects it because its token is lower than one it has already admitted.
//
// Exits 0 when the store behaved so, 1 otherwise (ctest runs it).
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/fence.h"

namespace {

// An in-memory object store whose objects are each protected by one holdfast lock.
// Thread-safe.
class FencedStore {
 public:
  // Writes `value` under `name` if `token` is still the newest token of `lock_key`.
  // A real server takes lock_key and token from the request, and the caller's
  // identity from its TLS peer (see docs/fencing.md: tokens are guessable).
  absl::Status Put(std::string_view lock_key, int64_t token, const std::string& name,
                   const std::string& value) {
    return fence_.CheckAndApply(lock_key, token, [&]() -> absl::Status {
      absl::MutexLock lock(&mu_);
      objects_[name] = value;
      return absl::OkStatus();
    });
  }

  std::string Get(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(name);
    return it == objects_.end() ? "" : it->second;
  }

 private:
  holdfast::FenceVerifier fence_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> objects_ ABSL_GUARDED_BY(mu_);
};

// What holdfastd would mint: epoch 1, grants at etcd revisions 100 and 130.
constexpr int64_t kPausedHolderToken = (int64_t{1} << holdfast::kTokenRevisionBits) | 100;
constexpr int64_t kNextHolderToken = (int64_t{1} << holdfast::kTokenRevisionBits) | 130;

bool Expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok:  " : "FAIL:", what);
  return ok;
}

}  // namespace

int main() {
  FencedStore store;
  bool ok = true;

  // Holder 1 holds "reports/daily" and writes.
  ok &= Expect(store.Put("reports/daily", kPausedHolderToken, "report", "draft 1").ok(),
               "holder 1 writes with its token");

  // Holder 1 pauses past its TTL; holdfast grants the lock to holder 2, which writes.
  ok &= Expect(store.Put("reports/daily", kNextHolderToken, "report", "final").ok(),
               "holder 2 writes with a newer token");

  // Holder 1 wakes up and sends the write it had prepared before its pause.
  absl::Status late = store.Put("reports/daily", kPausedHolderToken, "report", "draft 2");
  std::printf("       holder 1's late write: %s\n", late.ToString().c_str());
  ok &= Expect(late.code() == absl::StatusCode::kFailedPrecondition,
               "holder 1's late write is rejected");
  ok &= Expect(store.Get("report") == "final", "holder 2's write survives");

  // Other locks are fenced independently.
  ok &= Expect(store.Put("reports/weekly", kPausedHolderToken, "weekly", "w1").ok(),
               "another lock key is not affected");
  return ok ? 0 : 1;
}
