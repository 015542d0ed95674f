// All lease renewals of one etcd client over one LeaseKeepAlive stream.
//
// Thread-safe. Each KeepAlive() sends one request and gets exactly one callback:
// etcd's answer, or DEADLINE_EXCEEDED when none came before the deadline, or
// UNAVAILABLE when the stream broke. Answers for one lease come back in request
// order, so they are matched first-in first-out. A request that times out makes
// the stream suspect: it is cancelled, the client checks the endpoint (when the
// request was given at least Client::kSilentEndpoint; Client::CheckSilent) and
// moves on if it is silent, the timed-out request is failed after that check, and
// the next request opens a new stream on the client's current endpoint. When the client moves for any reason
// (MoveFrom), the requests still unanswered on the stream left behind are sent
// again on the new one, each under its own deadline, so renewals carry on.
// Callbacks run on the loop or timer thread, never under mu_. The destructor waits
// for a timeout that the timer thread has taken to finish (timers_armed_), so no
// timer runs into a destroyed mux; the client's TimerQueue must not be stopped
// while the mux lives (Client holds it).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "etcd/bidi_stream.h"
#include "etcd/client.h"

namespace holdfast::etcd {

class KeepAliveMux {
 public:
  explicit KeepAliveMux(Client* client);
  // Cancels the stream and waits until gRPC has finished with it; from then on a
  // KeepAlive is answered UNAVAILABLE at once. Idempotent.
  void Shutdown();
  ~KeepAliveMux() { Shutdown(); }

  void KeepAlive(int64_t lease_id, Deadline d, Callback<pb::LeaseKeepAliveResponse> cb);

  // The client moved off endpoint `index` (Client::ReportUnavailable).
  void MoveFrom(size_t index);

 private:
  class Stream;
  struct Pending {
    uint64_t id;
    Callback<pb::LeaseKeepAliveResponse> cb;  // empty once answered by the timer
    TimerQueue::TimerId timer;
    Deadline deadline;
    bool silence_counts;  // given at least Client::kSilentEndpoint
  };
  // Requests sent on one stream and not answered yet, per lease, in send order.
  using PendingMap = std::map<int64_t, std::deque<Pending>>;

  void OnResponse(Stream* s, const pb::LeaseKeepAliveResponse& resp);
  void OnFinished(Stream* s, const grpc::Status& status, size_t endpoint_index);
  void OnTimeout(int64_t lease_id, uint64_t id);

  Client* const client_;
  absl::Mutex mu_;
  std::shared_ptr<Stream> current_ ABSL_GUARDED_BY(mu_);
  std::map<Stream*, PendingMap> pending_ ABSL_GUARDED_BY(mu_);
  // The stream each unanswered request went out on.
  std::map<uint64_t, std::shared_ptr<Stream>> by_id_ ABSL_GUARDED_BY(mu_);
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  // Streams left behind by MoveFrom: their unanswered requests are sent again.
  std::map<Stream*, bool> moved_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Deadline timers scheduled and not yet done with: each is either cancelled
  // before it runs (by the answer or the stream's end) or runs OnTimeout, which
  // gives it back as its last use of the mux.
  int timers_armed_ ABSL_GUARDED_BY(mu_) = 0;
  bool GoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_streams_ == 0 && timers_armed_ == 0;
  }
  // Cancels a pending request's timer; a timer cancelled before it ran is given
  // back here, one already taken gives itself back at the end of OnTimeout.
  void CancelTimerLocked(const Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace holdfast::etcd
