// Many watchers over one etcd Watch stream.
//
// Thread-safe. Each watcher chooses its own watch id (etcd >= 3.4), so creates
// need no ordering. When the stream breaks, the hub reopens it (on the client's
// current endpoint, after a short back-off) and re-creates every watcher from the
// revision after the last one it delivered, so no event is lost or repeated.
//
// Callback contract: a watcher's callback runs on the loop thread, one call at a
// time and in revision order. It gets batches of events, and at most one error,
// after which it is never called again: OUT_OF_RANGE when the start revision was
// compacted (CompactedError: its message and CompactRevisionOf name the compact
// revision), or the cancel reason etcd gave. Cancel() is asynchronous: a callback
// already running (or about to start) may still finish after Cancel() returns, so
// owners guard their own state.
// No callback runs after the hub is destroyed.
//
// A watcher's resume revision advances only with the events it is given. A quiet
// watcher re-created after a break or a move can therefore be refused as
// compacted although it missed nothing; its owner then reads again, as for any
// compaction. The hub does not ask etcd for progress (WatchProgressRequest) to
// advance it: etcd 3.4.23 answers such a request from the store's revision, on a
// channel not ordered with the events still being sent (etcd issue 15220, fixed
// in 3.4.24 and 3.5.8), so the answer can name a revision whose events for some
// watcher are yet to come, and resuming after it would skip them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
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
  uint64_t cluster_id = 0;  // of the cluster that sent it (its header's)
};

using WatchCallback = std::function<void(absl::StatusOr<WatchBatch>)>;
using WatchId = int64_t;

// The error of a watch whose start revision etcd had compacted: OUT_OF_RANGE,
// naming `compact_revision`, the oldest revision etcd still has.
absl::Status CompactedError(int64_t compact_revision);
// The compact revision of a CompactedError (0 for any other status).
int64_t CompactRevisionOf(const absl::Status& s);

class WatchHub {
 public:
  explicit WatchHub(Client* client);
  // Ends every watch (no callback after it) and waits until gRPC has finished
  // with the stream; a watch asked for from then on gets none. Idempotent.
  void Shutdown();
  ~WatchHub() { Shutdown(); }

  WatchId Watch(WatchSpec spec, WatchCallback cb);
  // A watcher inside [group_key, group_end), served by one etcd watch over that
  // range which the hub shares among all such watchers (the waiters of one lock
  // key on this replica): each one's key or range, filters and start revision are
  // applied here. It joins the shared watch only when that watch started at or
  // before spec.start_revision and has delivered no event at or after it, so it
  // misses nothing and sees nothing twice; otherwise (and with prev_kv, or a start
  // of 0) it is a watcher of its own, as from Watch(). The same callback contract
  // (an error from the shared watch reaches every watcher in it) and Cancel(); the
  // shared watch ends with the last watcher in it. `spec`'s keys must lie within
  // the group's range.
  WatchId WatchWithin(const std::string& group_key, const std::string& group_end,
                      WatchSpec spec, WatchCallback cb);
  void Cancel(WatchId id);

  // Number of live watchers, as callers see them (for metrics and tests).
  size_t size();
  // Number of etcd watches behind them (a shared one counts once).
  size_t etcd_watches();

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
    // Events of a response etcd split (WatchResponse.fragment) until its last
    // part: delivered together, so a batch is still whole revisions.
    std::vector<mvccpb::Event> fragments;
  };

  // A watcher of WatchWithin() inside a shared watch.
  struct Member {
    WatchSpec spec;
    std::shared_ptr<WatchCallback> cb;
  };
  using GroupRange = std::pair<std::string, std::string>;
  struct Group {
    WatchId etcd_id = 0;         // its watcher in watchers_
    int64_t start = 0;           // the shared watch's start revision
    int64_t last_delivered = 0;  // the highest revision of an event it delivered
    // Its create request has gone out. Until then another thread may join it and
    // leave it empty: the cancel then waits for the create (ended_unsent_).
    bool sent = false;
    std::map<WatchId, Member> members;
  };
  // A create request to send once mu_ is released.
  struct Pending {
    pb::WatchRequest req;
    std::shared_ptr<Stream> stream;
    bool fresh = false;
    bool send = false;
  };

  Pending AddWatcherLocked(WatchId id, WatchSpec spec, WatchCallback cb)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void SendPending(Pending p);
  void OnGroupBatch(const GroupRange& range, WatchId etcd_id, absl::StatusOr<WatchBatch> batch);
  pb::WatchRequest CreateRequestLocked(WatchId id, Watcher& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens a stream if there is none. Returns it, and whether Go() is due.
  std::pair<std::shared_ptr<Stream>, bool> EnsureStreamLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnResponse(Stream* s, const pb::WatchResponse& resp);
  void OnFinished(Stream* s, const grpc::Status& status, size_t endpoint_index);
  void Reconnect();
  // No stream and no reconnect can still use this hub (the destructor waits).
  bool GoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client* const client_;
  absl::Mutex mu_;
  std::shared_ptr<Stream> current_ ABSL_GUARDED_BY(mu_);
  Stream* leaving_ ABSL_GUARDED_BY(mu_) = nullptr;  // cancelled by MoveFrom, not finished
  std::map<WatchId, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  std::map<GroupRange, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::map<WatchId, GroupRange> member_group_ ABSL_GUARDED_BY(mu_);
  // Shared watches whose last watcher left before their create request went out:
  // their creator sends the cancel after the create, so etcd never keeps one.
  std::set<WatchId> ended_unsent_ ABSL_GUARDED_BY(mu_);
  WatchId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool reconnect_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  TimerQueue::TimerId reconnect_timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace holdfast::etcd
