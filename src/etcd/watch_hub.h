// Many watchers over one etcd Watch stream.
//
// Thread-safe. Each watcher chooses its own watch id (etcd >= 3.4), so creates
// need no ordering. When the stream breaks, the hub reopens it (on the client's
// current endpoint, after a short back-off) and re-creates every watcher from the
// revision after the last one it delivered, so no event is lost or repeated.
//
// Callback contract: a watcher's callback runs on a gRPC thread, one call at a
// time and in revision order. It gets batches of events, and at most one error,
// after which it is never called again: OUT_OF_RANGE when the start revision was
// compacted (the error names the compact revision), or the cancel reason etcd
// gave. Cancel() is asynchronous: a callback already running (or about to start)
// may still finish after Cancel() returns, so owners guard their own state.
// No callback runs after the hub is destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "etcd/bidi_stream.h"
#include "etcd/client.h"

namespace holdfast::etcd {

struct WatchSpec {
  std::string key;
  std::string range_end;     // empty: just `key`
  int64_t start_revision = 0;  // 0: from the next revision; use (read revision + 1)
  bool prev_kv = false;
  bool no_put = false;
  bool no_delete = false;
};

struct WatchBatch {
  std::vector<mvccpb::Event> events;
  int64_t header_revision = 0;
};

using WatchCallback = std::function<void(absl::StatusOr<WatchBatch>)>;
using WatchId = int64_t;

class WatchHub {
 public:
  explicit WatchHub(Client* client);
  ~WatchHub();

  WatchId Watch(WatchSpec spec, WatchCallback cb);
  void Cancel(WatchId id);

  // Number of live watchers (for metrics and tests).
  size_t size();

  // The client moved off endpoint `index` (Client::ReportUnavailable): a stream on
  // it is dropped (its later answers ignored) and every watcher is created again
  // on the current endpoint, after the last revision it was given.
  void MoveFrom(size_t index);

 private:
  class Stream;
  struct Watcher {
    WatchSpec spec;
    std::shared_ptr<WatchCallback> cb;
    int64_t next_revision = 0;  // resume point; 0 until known
  };

  pb::WatchRequest CreateRequestLocked(WatchId id, const Watcher& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens a stream if there is none. Returns it, and whether Go() is due.
  std::pair<std::shared_ptr<Stream>, bool> EnsureStreamLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnResponse(Stream* s, const pb::WatchResponse& resp);
  void OnFinished(Stream* s, const grpc::Status& status, size_t endpoint_index);
  void Reconnect();

  Client* const client_;
  absl::Mutex mu_;
  std::shared_ptr<Stream> current_ ABSL_GUARDED_BY(mu_);
  Stream* leaving_ ABSL_GUARDED_BY(mu_) = nullptr;  // cancelled by MoveFrom, not finished
  std::map<WatchId, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  WatchId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool reconnect_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  TimerQueue::TimerId reconnect_timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace holdfast::etcd
