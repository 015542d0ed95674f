// What the lock engine reports as it works, for metrics. The engine knows no
// metrics library: holdfastd implements this interface (server/metrics.h) and
// passes it in EngineOptions; without one, nothing is reported.
//
// Labels: `ns` and `class_id` are only ever names that etcd showed to exist (an
// existing namespace, a class resolved from it), or "" when the call ended
// before that was known, so a caller cannot mint label values by sending made-up
// names. Lock keys are never reported.
//
// Implementations must be thread-safe. Every hook is called on a gRPC or timer
// thread, never under a lock of the engine, and must not block (no I/O).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace holdfast::lock {

// One Acquire call's answer.
struct AcquireEnd {
  std::string_view ns;        // "" unless the namespace exists
  std::string_view class_id;  // "" unless a class was resolved for the key
  absl::StatusCode code = absl::StatusCode::kOk;
  // From the call reaching the engine to its answer.
  std::chrono::steady_clock::duration latency{};
  // Set when the call waited in the queue: from its first decision to queue to
  // the answer.
  std::optional<std::chrono::steady_clock::duration> waited;
};

// How a hold came to be.
enum class GrantPath {
  kAcquire,   // an acquire's own grant transaction (free key, or the head claiming it)
  kHandOver,  // a release handed the key to the head of the queue in its commit
};

enum class RideStep { kWaiting, kRode, kAlone };

// One renewal of a session's lease, as answered to the client.
struct RenewEnd {
  std::string_view ns;  // as verified on the KeepAlive stream
  int64_t session = 0;
  // etcd's TTL after the renewal; 0 unless renewed.
  std::chrono::milliseconds ttl{0};
  bool renewed = false;           // etcd confirmed the renewal
  bool lost = false;              // the lease no longer exists
  bool etcd_unavailable = false;  // no answer, or no quorum: not confirmed
  // From the request reaching the engine to etcd's answer (KeepAliveMux round
  // trip); zero when refused without asking etcd.
  std::chrono::steady_clock::duration round_trip{};
};

// A KeepAlive's read of a session new to this replica (server/session_service.cc).
enum class SessionLookup {
  kFound,   // the caller's session: renewed
  kMissed,  // no such session, or not the caller's
  kFailed,  // etcd did not answer, or the record was corrupt
  kRefused, // not made: too many of the identity's lookups wait (left unanswered)
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;

  virtual void OnAcquireDone(const AcquireEnd& end) {}
  // `count` holds were created by one commit of this replica.
  virtual void OnGranted(std::string_view ns, std::string_view class_id, GrantPath path,
                         int count) {}
  // A release committed; `handed_over` waiters were granted in its commit.
  virtual void OnReleased(std::string_view ns, int handed_over) {}
  // An Acquire of this replica started (+1) or stopped (-1) waiting in a queue.
  virtual void OnParked(std::string_view ns, std::string_view class_id, int delta) {}
  virtual void OnSessionOpened(std::string_view ns, int64_t session,
                               std::chrono::milliseconds ttl) {}
  virtual void OnSessionClosed(std::string_view ns, int64_t session) {}
  virtual void OnRenewed(const RenewEnd& end) {}
  // A session new to this replica was looked up for a renewal; `waited`: the
  // lookup waited for its identity's pace (server/lookup_pacer.h).
  virtual void OnSessionLookup(SessionLookup result, bool waited) {}
  // A grant or release transaction went to etcd carrying `members` of them (1:
  // alone; more: a group commit, lock/group_commit.h).
  virtual void OnCommitBatch(int members) {}
  // An enqueue behind other waiters started waiting for a release of its key to
  // ride with (kWaiting), then rode in a release's transaction (kRode) or went
  // alone after its bound (kAlone); lock/group_commit.h.
  virtual void OnRide(RideStep step) {}
};

}  // namespace holdfast::lock
