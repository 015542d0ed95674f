// Asynchronous etcd v3 client: KV, Lease, Watch and Maintenance over gRPC's
// asynchronous API on an event loop (common/event_loop.h), with per-call deadlines
// and fail-over across several endpoints.
//
// Thread-safe. Every asynchronous method returns at once and invokes its callback
// exactly once, on the client's event loop thread (or, for calls refused before
// sending, on the caller's thread), never while holding a lock of this client.
// Callbacks must not block: they hold up every call on the loop. The *Sync helpers
// block the calling thread; on an event loop's thread they refuse to run
// (FAILED_PRECONDITION) rather than deadlock it. They exist for start-up, admin
// work off the loop, tools and tests.
//
// The loop is the one given in ClientOptions (holdfastd runs its server and all
// its etcd clients on one), or one the client starts for itself. Never destroy a
// Client from one of its own callbacks.
//
// Fail-over: calls go to the current endpoint; an UNAVAILABLE answer about the
// member itself (EndpointUnavailable) moves the client to the next endpoint for
// later calls. One etcd gives about its whole cluster, such as "leader changed"
// (ClusterWideUnavailable), moves it only if the member's Status then shows no
// leader or gets no answer (CheckSilent, below); a read is asked once more after
// that check. Reads (Range, Status, TimeToLive)
// are retried once on the next endpoint; writes are not, because an UNAVAILABLE or
// DEADLINE_EXCEEDED write has an unknown outcome and its caller converges by
// re-reading (STYLE habit 5). A read or a lease renewal that gets no answer before
// its deadline may move the client on too: a member cut off from the network
// answers nothing and ends no connection (gRPC's keepalive would notice only after
// ~15 s), so silence is the only sign. But reads and renewals also go unanswered
// on every member while etcd elects a leader or has no quorum, and moving then
// would only churn the streams; so the client first asks that member for its
// Status (served by the member alone, no quorum needed) and moves only if that
// gets no answer either, or says the member has no leader (CheckSilent): a
// member cut off from its cluster's quorum answers Status on its own, and would
// otherwise keep every renewal and watch of the client for as long as it is cut
// off. (While the cluster elects a leader, that can move the client once more
// than needed.) The caller's error callback runs after that
// check. When the client moves, the Watch and LeaseKeepAlive streams on the
// endpoint left behind move with it (watchers resume after the last revision they
// were given).
//
// Every response's header (cluster_id, revision) reaches the caller untouched; the
// client also remembers the last cluster id and the highest revision it has seen.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "common/timer_queue.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace holdfast::etcd {

namespace pb = ::etcdserverpb;
using Deadline = std::chrono::system_clock::time_point;
template <class T>
using Callback = std::function<void(absl::StatusOr<T>)>;

inline Deadline DeadlineIn(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// Told about every unary etcd call, for metrics. Thread-safe implementations
// only: called on the loop thread that finished the call, just before the call's
// own callback, never under a lock of the client. Must not block.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // `method` is the etcd RPC's name ("Txn", "Range", "LeaseGrant", ...). Every
  // attempt is reported: a read retried on the next endpoint counts twice.
  virtual void OnEtcdCall(std::string_view method, const absl::Status& status,
                          std::chrono::steady_clock::duration latency) = 0;
};

struct ClientOptions {
  // host:port of each etcd member, e.g. {"127.0.0.1:2379"}.
  std::vector<std::string> endpoints;
  // Insecure when null (loopback development); TLS credentials in production.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of calls that the client starts itself (stream health checks).
  std::chrono::milliseconds internal_timeout{5000};
  // Not owned; null: nothing is reported. Must outlive the client.
  CallObserver* observer = nullptr;
  // The event loop every call and stream of the client runs on (not owned; must
  // outlive the client). Null: the client starts a loop of its own.
  EventLoop* loop = nullptr;
  // The largest answer taken from etcd. Watches ask etcd to split a larger
  // response (into parts of at most its --max-request-bytes, 1.5 MiB by
  // default), so this must stay above that setting.
  int max_receive_bytes = 64 << 20;
};

class KeepAliveMux;
class WatchHub;

class Client {
 public:
  // Fails with INVALID_ARGUMENT when no endpoint is given. Does not connect yet.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options,
                                                        std::shared_ptr<TimerQueue> timers);
  ~Client();

  // --- KV -------------------------------------------------------------------
  void Range(pb::RangeRequest req, Deadline d, Callback<pb::RangeResponse> cb);
  void Put(pb::PutRequest req, Deadline d, Callback<pb::PutResponse> cb);
  void DeleteRange(pb::DeleteRangeRequest req, Deadline d, Callback<pb::DeleteRangeResponse> cb);
  void Txn(pb::TxnRequest req, Deadline d, Callback<pb::TxnResponse> cb);
  void Compact(pb::CompactionRequest req, Deadline d, Callback<pb::CompactionResponse> cb);

  // --- Lease ----------------------------------------------------------------
  void LeaseGrant(pb::LeaseGrantRequest req, Deadline d, Callback<pb::LeaseGrantResponse> cb);
  void LeaseRevoke(pb::LeaseRevokeRequest req, Deadline d, Callback<pb::LeaseRevokeResponse> cb);
  void LeaseTimeToLive(pb::LeaseTimeToLiveRequest req, Deadline d,
                       Callback<pb::LeaseTimeToLiveResponse> cb);
  // Renews a lease over the one multiplexed LeaseKeepAlive stream. The callback
  // gets etcd's answer: TTL in seconds, 0 when the lease no longer exists. NOTE:
  // etcd 3.4.23 can report a renewal of a revoked lease; never infer ownership
  // from this answer (ARCHITECTURE §12).
  void KeepAlive(int64_t lease_id, Deadline d, Callback<pb::LeaseKeepAliveResponse> cb);

  // --- Maintenance ----------------------------------------------------------
  void Status(Deadline d, Callback<pb::StatusResponse> cb);

  // --- Watch ----------------------------------------------------------------
  WatchHub& watches() { return *watch_hub_; }
  // The endpoint calls go to now (an index into ClientOptions::endpoints); it
  // changes when the client moves (fail-over, above).
  size_t current_endpoint() const { return current_.load() % endpoints_.size(); }

  // --- Synchronous helpers (never from a gRPC callback thread) ----------------
  absl::StatusOr<pb::RangeResponse> RangeSync(pb::RangeRequest req, Deadline d);
  absl::StatusOr<pb::PutResponse> PutSync(pb::PutRequest req, Deadline d);
  absl::StatusOr<pb::DeleteRangeResponse> DeleteRangeSync(pb::DeleteRangeRequest req, Deadline d);
  absl::StatusOr<pb::TxnResponse> TxnSync(pb::TxnRequest req, Deadline d);
  absl::StatusOr<pb::LeaseGrantResponse> LeaseGrantSync(pb::LeaseGrantRequest req, Deadline d);
  absl::StatusOr<pb::LeaseRevokeResponse> LeaseRevokeSync(pb::LeaseRevokeRequest req, Deadline d);
  absl::StatusOr<pb::StatusResponse> StatusSync(Deadline d);

  // etcd cluster id from the most recent response header (0 before any).
  uint64_t last_cluster_id() const { return last_cluster_id_.load(); }
  // Highest revision seen in any response header.
  int64_t last_revision() const { return last_revision_.load(); }
  // Called by every response path with the response's header.
  void ObserveHeader(const pb::ResponseHeader& h);

  TimerQueue& timers() { return *timers_; }
  EventLoop& loop() { return *loop_; }

  // One endpoint's channel and stubs. Internal; public for the stream classes.
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Maintenance::Stub> maintenance;
  };
  // The endpoint to use now, and its index.
  std::pair<Endpoint*, size_t> PickEndpoint();
  // Endpoint `index` answered UNAVAILABLE or nothing in time: move on to the next
  // one (if it is still the current one), and move the streams with it. Never
  // call it under a lock that the streams' owners take.
  void ReportUnavailable(size_t index);
  size_t endpoint_count() const { return endpoints_.size(); }
  // A read or renewal given at least this long that gets no answer makes the
  // client check the endpoint (a tight deadline says nothing about it) ...
  static constexpr std::chrono::milliseconds kSilentEndpoint{500};
  // ... with a Status call of this deadline; no answer moves the client.
  static constexpr std::chrono::milliseconds kSilenceCheck{300};
  // Marks a stream as needing a leader (etcd's "hasleader" metadata): a member
  // that has had none for a while (cut off from its cluster's quorum) ends it
  // with UNAVAILABLE "no leader" instead of keeping it open and quiet, so it
  // moves to another member. The LeaseKeepAlive stream only (watch_hub.cc says
  // why not the Watch stream).
  static void RequireLeader(grpc::ClientContext* ctx);
  // Asks endpoint `index` for its Status; moves the client off it when that gets no
  // answer (or fails). Then runs `then`, on the loop thread.
  void CheckSilent(size_t index, std::function<void()> then);

 private:
  Client(ClientOptions options, std::shared_ptr<TimerQueue> timers);

  // Runs one unary call; `prepare` makes it on the given endpoint and queue
  // (the stub's PrepareAsync method). Retries once on the next endpoint when
  // `retry_unavailable` and the answer is UNAVAILABLE. `method` names the RPC
  // for the observer.
  template <class Req, class Resp, class PrepareFn>
  void Unary(const char* method, PrepareFn prepare, Req req, Deadline d, Callback<Resp> cb,
             bool retry_unavailable);

  // A unary call finished (its callback has returned).
  void CallDone();

  ClientOptions options_;
  std::shared_ptr<TimerQueue> timers_;
  // The loop of options_.loop, or own_loop_ when none was given. own_loop_ goes
  // last in ~Client, after every call and stream on it has ended.
  std::unique_ptr<EventLoop> own_loop_;
  EventLoop* loop_ = nullptr;
  std::atomic<int64_t> calls_in_flight_{0};
  absl::Mutex idle_mu_;
  absl::CondVar idle_cv_;  // signalled when calls_in_flight_ drops to 0
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  std::atomic<uint64_t> last_cluster_id_{0};
  std::atomic<int64_t> last_revision_{0};
  std::unique_ptr<KeepAliveMux> keepalive_mux_;
  std::unique_ptr<WatchHub> watch_hub_;
  // Telling the streams' owners when the client moves: ~Client sets closing_ and
  // waits until no ReportUnavailable is between its check and its last use.
  std::atomic<bool> closing_{false};
  std::atomic<int> moving_{0};
};

// Turns a callback-style call into a blocking one. On an event loop's thread it
// returns FAILED_PRECONDITION without starting the call: waiting there for a
// callback that the same thread must run would never end.
template <class T>
absl::StatusOr<T> Await(const std::function<void(Callback<T>)>& start);

}  // namespace holdfast::etcd

#include "etcd/client_inl.h"
