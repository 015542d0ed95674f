// libholdfast internals shared by client.cc and keepalive_pump.cc.
#pragma once

#include <chrono>
#include <atomic>
#include <functional>
#include <map>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <stop_token>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/tls_files.h"
#include "holdfast/client.h"
#include "holdfast/v1/admin.grpc.pb.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast::internal {

using SteadyClock = std::chrono::steady_clock;

// A holdfastd that is stopping ends its waits and renewal streams UNAVAILABLE with
// this trailer (server/rpc_util.h, kStoppingMetadata): go to the next endpoint.
inline bool SaysStopping(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  return trailers.find("holdfast-stopping") != trailers.end();
}

class KeepAlivePump;

// Runs the on_lost callbacks of one Client's sessions, one at a time and in the
// order they were posted, on a thread of its own (`holdfast-onlost`). The
// keepalive pump's threads, which find the losses, post and go on: a callback
// that blocks (an Acquire to take the lock again, a slow log) holds up only the
// callbacks after it, never the renewals and deadline checks of the Client's
// other sessions, whose leases would run out while their Holds said held.
// Thread-safe.
class OnLostRunner {
 public:
  OnLostRunner();
  ~OnLostRunner() { Stop(); }
  OnLostRunner(const OnLostRunner&) = delete;
  OnLostRunner& operator=(const OnLostRunner&) = delete;

  // Runs `fn` on the runner's thread after what was posted before; once its
  // thread has ended (after Stop), on the calling thread, at once.
  void Post(std::function<void()> fn);
  // Runs what was posted, then ends the thread (idempotent). Called on the
  // runner's own thread (a callback that destroys the Client), it does not wait
  // for itself: the thread runs the rest once that callback returns, then ends.
  void Stop();

 private:
  struct Queue {
    absl::Mutex mu;
    std::deque<std::function<void()>> fns ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool ended ABSL_GUARDED_BY(mu) = false;  // the thread has run its last
  };
  static void Run(const std::shared_ptr<Queue>& q);
  // Shared with the thread, which may outlive this object (Stop from inside).
  const std::shared_ptr<Queue> q_ = std::make_shared<Queue>();
  std::thread thread_;
};

// The channels and stubs of one Client, shared with its sessions (which may
// outlive the Client object). Thread-safe.
//
// One channel per endpoint, in the Client's order (ClientOptions::endpoint_order),
// as holdfastd's own etcd client has one per member: a channel per endpoint follows
// its host name's DNS records and checks the server certificate against that name,
// which one channel over a list of addresses cannot do for names. The Client
// calls one endpoint, the current one, while it is connected; Connected() moves it
// on when it is not (docs/cli.md, "Endpoints").
class ClientCore {
 public:
  struct Endpoint {
    size_t index = 0;  // in the Client's order
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Session::Stub> session;
    std::unique_ptr<v1::Lock::Stub> lock;
    std::unique_ptr<v1::Admin::Stub> admin;
  };

  // tls_files: the checked copies of the mTLS files that the channels read
  // (Connect makes them; null: the files themselves, or plaintext without ca_file).
  explicit ClientCore(ClientOptions options, std::unique_ptr<TlsFiles> tls_files = nullptr);
  ~ClientCore();

  const ClientOptions& options() const { return options_; }
  KeepAlivePump& pump() { return *pump_; }
  OnLostRunner& on_lost_runner() { return on_lost_runner_; }

  // The endpoint to call: the current one if it is connected; else the first,
  // from the current one on in the Client's order, that connects by `deadline`.
  // Each endpoint is asked to connect in turn: the next as soon as the one before
  // it refuses, or after kConnectGrace without an answer (a host that drops
  // packets, a replica too busy to finish a handshake), so that a replica gone
  // away costs a call at most that grace per endpoint, not its deadline. The
  // endpoints asked earlier go on connecting, and the first of them to be
  // connected is taken. Nothing connected by `deadline`: the current endpoint,
  // `*connected` false.
  Endpoint& Connected(std::chrono::system_clock::time_point deadline, bool* connected = nullptr);
  static constexpr std::chrono::milliseconds kConnectGrace{1000};
  // `e` is connected but does not answer (KeepAlivePump's silence check): if it is
  // the current endpoint, the next one in order becomes current, so that calls and
  // streams that pick an endpoint from now on go there first; and the calls in
  // flight on `e` that can be asked again (Moveable) are cancelled, to be.
  void PassOver(const Endpoint& e);
  // `e` said it is stopping (holdfastd's `holdfast-stopping` trailer): if it is the
  // current endpoint, the next one becomes current. Its calls in flight are left
  // to finish there.
  void Skip(const Endpoint& e);

  // A call in flight on one endpoint that a pass-over of that endpoint moves:
  // PassOver cancels it, and moved() then tells its caller to ask again (on the
  // endpoint current now). Only for calls that may be asked again whatever became
  // of the first attempt: Acquire (per session and key), Release (by token) and
  // Close (by session id).
  // Lives on the caller's stack around the call, after its ClientContext.
  class Moveable {
   public:
    Moveable(ClientCore& core, const Endpoint& e, grpc::ClientContext* ctx);
    ~Moveable();
    Moveable(const Moveable&) = delete;
    Moveable& operator=(const Moveable&) = delete;
    bool moved() const { return moved_.load(); }

   private:
    friend class ClientCore;
    ClientCore& core_;
    const size_t endpoint_;
    grpc::ClientContext* const ctx_;
    std::atomic<bool> moved_{false};
  };
  size_t endpoint_count() const { return endpoints_.size(); }

  // Prepares a unary call and picks its endpoint: deadline `extra` past the rpc
  // timeout (or `deadline`, when given), and an endpoint connected within it. A
  // call with no endpoint connected by then waits on the current one until its
  // deadline (wait_for_ready), which then names it unreachable (FromCall); a call
  // on a connected endpoint fails at once instead if the connection is gone by the
  // time it is sent, so that the callers that retry move on.
  Endpoint& Prepare(grpc::ClientContext* ctx,
                    std::chrono::milliseconds extra = std::chrono::milliseconds(0),
                    std::optional<std::chrono::system_clock::time_point> deadline = std::nullopt);

 private:
  ClientOptions options_;
  // Before the channels, which read its copies while they live.
  std::unique_ptr<TlsFiles> tls_files_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  absl::Mutex moveable_mu_;
  std::vector<Moveable*> moveable_ ABSL_GUARDED_BY(moveable_mu_);
  // Before the pump: it posts to the runner, so it goes first.
  OnLostRunner on_lost_runner_;
  std::unique_ptr<KeepAlivePump> pump_;
};

// One hold's liveness. Thread-safe.
//   lost:        stop using the resource; final.
//   unprotected: (open classes only) etcd cannot confirm the session now; the
//                hold is still usable at the class owner's risk, and becomes
//                protected again when a renewal is confirmed.
class HoldState {
 public:
  HoldState(std::string lock_key, bool open_class, int64_t token)
      : lock_key_(std::move(lock_key)), open_class_(open_class), token_(token) {}
  // A hold is its key and its token: one commit can grant a session two keys,
  // which then carry the same token.
  const std::string& lock_key() const { return lock_key_; }
  bool open_class() const { return open_class_; }
  int64_t token() const { return token_; }
  bool lost() const;
  bool unprotected() const;
  absl::Status lost_reason() const;
  std::stop_token lost_token() const { return stop_.get_token(); }
  // True if this call made it lost.
  bool MarkLost(const absl::Status& why);
  void SetUnprotected(bool unprotected);

 private:
  const std::string lock_key_;
  const bool open_class_;
  const int64_t token_;
  std::stop_source stop_;
  mutable absl::Mutex mu_;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool unprotected_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
};

// One session's shared state: its liveness as the keepalive pump sees it, and
// the liveness of the holds on it. Thread-safe.
class SessionState : public std::enable_shared_from_this<SessionState> {
 public:
  SessionState(std::shared_ptr<ClientCore> core, std::string ns, int64_t id,
               std::chrono::milliseconds ttl, const SessionOptions& options,
               SteadyClock::time_point opened_at);

  ClientCore& core() { return *core_; }
  const std::string& ns() const { return ns_; }
  int64_t id() const { return id_; }
  std::chrono::milliseconds ttl() const { return ttl_; }
  std::chrono::milliseconds margin() const { return margin_; }

  bool lost() const;
  absl::Status lost_reason() const;
  std::stop_token lost_token() const { return stop_.get_token(); }
  SteadyClock::time_point deadline() const;
  int64_t renewals() const;

  // The state of the session's hold of `lock_key` with `token`: the one its
  // other handles share (Acquire of a held key returns the same hold), or a new
  // one. Drops the entries of holds no handle keeps any more.
  std::shared_ptr<HoldState> HoldFor(const std::string& lock_key, bool open_class, int64_t token);
  // The hold of `lock_key` with `token` ended (released): every state of it
  // says so, `why`; runs no on_lost. It is no longer lost here (LostHere).
  void EndHold(const std::string& lock_key, int64_t token, const absl::Status& why);
  // True while the hold of `lock_key` with `token` was lost here only (Suspect:
  // etcd could not confirm renewals) and no release of it has gone through: the
  // hold may still be in etcd, and an Acquire of the key would be answered with
  // it again. A lost hold is final (docs/safety.md, (e)), so Acquire releases it
  // and asks anew.
  bool LostHere(const std::string& lock_key, int64_t token) const;

  // The pump's view --------------------------------------------------------
  // A renewal confirmed by etcd: sent at `sent_at`, TTL `ttl` remaining. Open
  // holds become protected again.
  void Confirm(SteadyClock::time_point sent_at, std::chrono::milliseconds ttl);
  // holdfastd says etcd cannot confirm renewals now, or the local deadline
  // passed: closed-class holds are lost at once, open-class holds become
  // unprotected. The session stays (and is renewed) while open holds live.
  void Suspect(const absl::Status& why, bool deadline_passed);
  // holdfastd says these holds were forced open (KeepAliveResponse.ended): each
  // one this session still holds is lost. Tokens it no longer holds are ignored.
  void HoldsEnded(const google::protobuf::RepeatedPtrField<v1::EndedHold>& ended);
  // Declares the session and all its holds lost (once): the lease is gone.
  void MarkLost(absl::Status why);
  // True while the pump should keep renewing.
  bool WantsRenewal() const;
  // Marks the session closed by its owner: no more renewals, every hold on it
  // lost ("was closed"), no lost callback. Returns once no on_lost call is
  // running (other than one that called it); false when it was closed already.
  bool MarkClosed();
  bool closed() const;
  // holdfastd answered a CloseSession of the session with OK: its lease is gone.
  // Until then a Close called again (after one that failed) sends it again.
  void CloseAnswered();
  bool close_answered() const;
  // What a hold of a closed session says it ended with.
  absl::Status ClosedReason() const;
  // A release its caller can no longer ask again: the Hold was destroyed while
  // holdfastd could not do it (etcd unreachable, say, after the hold was lost
  // here). Without it the hold would stay in etcd, keeping the key from everyone,
  // for as long as the session lives. The keepalive pump asks it again
  // (SendOwedReleases) until it is done, is no longer current, or the session
  // ends.
  void OweRelease(const std::string& lock_key, int64_t token);
  // Starts, without blocking, the owed releases that are due (on the pump thread):
  // each at most once at a time, the next try 1 s after a failed one, doubling up
  // to 30 s.
  static void SendOwedReleases(const std::shared_ptr<SessionState>& self,
                               SteadyClock::time_point now);
  size_t owed_releases() const;
  // An Acquire was answered with the session's hold of `lock_key` with `token`,
  // whose release is owed: the caller holds it again, so the release is no
  // longer owed (kTakenBack), unless it is being sent now or went through
  // already (kInFlight: it may end or have ended the hold, which Acquire then
  // treats as lost here). kNotOwed otherwise.
  enum class TakeBack { kNotOwed, kTakenBack, kInFlight };
  TakeBack TakeBackRelease(const std::string& lock_key, int64_t token);
  // An Acquire of `lock_key` starts / ends (ended with a Hold: `held`). While
  // one is out, a doubt of the key waits (that call may be answered with the
  // hold); one answered with a Hold ends the doubts of the key: a session holds
  // a key once, and that hold is now the caller's.
  void AcquireStarts(const std::string& lock_key);
  void AcquireEnds(const std::string& lock_key, bool held);
  // An Acquire of `lock_key` failed without an answer that says what became of
  // it: its connection was lost or its deadline passed, so holdfastd may have
  // granted it (the answer lost, or a hand-over in the 2 s a cancelled waiter
  // keeps its place). Nothing here would ever release such a grant: the key
  // would stay held, by a session that does not know it, for as long as the
  // session lives. So the pump asks holdfastd (Lock.Describe) once that grace
  // is past (kDoubtAfter from the latest such failure): a hold of this
  // session's it finds there becomes an owed release, unless a handle of that
  // hold is about or it is owed already; a waiter of the session still queued,
  // or an Acquire of the key out, has it asked again later; nothing there: the
  // doubt is over. Not when the session is lost or closed (its holds end with
  // it). A doubt of the key made again starts over (an answer to the earlier
  // one's Describe is not taken for it).
  void DoubtAcquire(const std::string& lock_key);
  static constexpr std::chrono::milliseconds kDoubtAfter{3000};
  size_t doubted_acquires() const;
  // Whether any release is owed (or any acquire doubted): read by the pump on
  // every turn for every session, so a plain atomic, not the mutex.
  bool owes_releases() const { return owes_.load(std::memory_order_relaxed); }
  // True on a thread that is running this session's on_lost.
  bool RunningOwnOnLost() const;
  // True on a thread that is running any session's on_lost (the Client's
  // callback thread, which the other sessions' callbacks wait for).
  static bool RunningAnyOnLost();

 private:
  const std::shared_ptr<ClientCore> core_;
  const std::string ns_;
  const int64_t id_;
  const std::chrono::milliseconds ttl_;
  const std::chrono::milliseconds margin_;
  // Posts a run of on_lost_ to the Client's OnLostRunner (a session already
  // gone by then runs none).
  void RunOnLost(const absl::Status& why);
  // Runs on_lost_ unless the session is closed; MarkClosed waits for a run in
  // progress, so no callback runs once Close (or ~Session) has returned.
  void RunOnLostNow(const absl::Status& why);

  const std::function<void(const absl::Status&)> on_lost_;
  std::stop_source stop_;
  mutable absl::Mutex mu_;
  int on_lost_running_ ABSL_GUARDED_BY(mu_) = 0;
  SteadyClock::time_point deadline_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_reason_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool close_answered_ ABSL_GUARDED_BY(mu_) = false;
  bool deadline_passed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<HoldState>> holds_ ABSL_GUARDED_BY(mu_);
  // A doubted acquire (DoubtAcquire) is one with token 0 (tokens are positive)
  // until the Describe that answers it gives the token of the hold to release.
  struct OwedRelease {
    std::string lock_key;
    int64_t token = 0;
    // Of a doubt: which one (DoubtAcquire numbers them), so that the answer to
    // an earlier doubt's Describe is not taken for a later one's.
    uint64_t doubt = 0;
    SteadyClock::time_point next{};
    std::chrono::milliseconds backoff{1000};
    bool in_flight = false;
  };
  std::vector<OwedRelease> owed_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> owes_{false};  // !owed_.empty(), as last set under mu_
  // Acquires out per key (AcquireStarts, AcquireEnds); no entry for none.
  std::map<std::string, int> acquiring_ ABSL_GUARDED_BY(mu_);
  uint64_t doubts_made_ ABSL_GUARDED_BY(mu_) = 0;
  // Answers doubt number `doubt` of `key` with what Describe said (the pump's
  // callback).
  void AnswerDoubt(const std::string& key, uint64_t doubt,
                   const absl::StatusOr<v1::DescribeResponse>& r);
  // (lock key, token) of holds the pump's owed releases ended, the latest
  // kMaxLostHere: an Acquire answered with one of them (sent before the release
  // went through) has a hold that is gone, and treats it as one lost here.
  std::deque<std::pair<std::string, int64_t>> released_by_pump_ ABSL_GUARDED_BY(mu_);
  // (lock key, token) of holds lost here only, until a release of one goes
  // through; at most kMaxLostHere (the oldest go first: a session that lost more
  // holds than that without releasing them is past saving them anyway).
  static constexpr size_t kMaxLostHere = 1024;
  std::deque<std::pair<std::string, int64_t>> lost_here_ ABSL_GUARDED_BY(mu_);
};

// Renews every session of a Client over one KeepAlive stream.
//
// Thread-safe. Owns two threads: the pump sends renewals every ttl/3 and checks
// local deadlines (every kIdleWait at least, with a time read after the turn's
// waits); the reader matches answers to requests. When the stream
// breaks (holdfastd restarted or unreachable), the pump reopens it with back-off;
// sessions survive as long as a renewal is confirmed before their deadline.
// Sessions are renewed only while their Client object exists.
class KeepAlivePump {
 public:
  explicit KeepAlivePump(ClientCore* core);
  ~KeepAlivePump() { Stop(); }

  // Stops renewing and joins the threads. Idempotent. Called by ~Client, so the
  // pump thread never drops the last reference to the core that owns it.
  void Stop();

  // `opened_at`: when the OpenSession that made it was sent. Its lease counts
  // from about then, so its first renewal is due a third of the TTL after that,
  // at once if the call took longer (etcd electing a leader, say).
  void Add(std::shared_ptr<SessionState> s, SteadyClock::time_point opened_at = SteadyClock::now());
  void Remove(int64_t session_id);

  // Test seam: what a turn of the pump does, told on the pump thread in order.
  // `blocking_step_ended` after a step that can block (closing a stream, waiting
  // for a connection) returned; `ticked` with the time the deadline checks and
  // renewals are given (Tick), before they run. Unset in production.
  struct TurnObserver {
    std::function<void()> blocking_step_ended;
    std::function<void(SteadyClock::time_point)> ticked;
  };
  void SetTurnObserverForTest(TurnObserver observer);

 private:
  struct Entry {
    std::weak_ptr<SessionState> state;
    SteadyClock::time_point next_send;
  };
  // Whether a replica that leaves renewals unanswered answers at all: a
  // grpc.health.v1 Check (any answer counts, NOT_SERVING too), on a thread of
  // its own so that the pump goes on checking local deadlines meanwhile.
  struct SilenceCheck {
    std::thread thread;
    std::atomic<bool> done{false};
    bool answered = false;  // read once done
  };
  struct Stream {
    ClientCore::Endpoint* endpoint = nullptr;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::KeepAliveRequest, v1::KeepAliveResponse>> rw;
    std::thread reader;
    std::atomic<bool> broken{false};
    std::atomic<bool> read_ended{false};  // the reader's Read returned false
    std::atomic<int64_t> answers{0};
    std::unique_ptr<SilenceCheck> check;
    bool passed_over = false;  // broken by CheckSilence: reopen without back-off
    SteadyClock::time_point next_check{};  // no silence check before this
  };

  void Run();
  void ReadLoop(Stream* s);
  void CloseStream();
  // A renewal on the stream has had no answer for SilenceAfter(its session's TTL):
  // checks that the stream's replica still answers (within CheckTimeout), and if it
  // does not, breaks the stream and passes the replica over, so that the stream
  // opens again on another endpoint and the renewals go there. Only for Clients of
  // several endpoints. A replica that answers the check is left alone (etcd, not
  // the replica, is slow: every replica's renewals wait for it).
  void CheckSilence(SteadyClock::time_point now);
  static std::chrono::milliseconds SilenceAfter(std::chrono::milliseconds ttl);
  static std::chrono::milliseconds CheckTimeout(std::chrono::milliseconds ttl);
  // Sends due renewals; declares sessions past their deadline lost.
  void Tick(SteadyClock::time_point now);

  ClientCore* const core_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // a session was added, or stop_ was set
  std::map<int64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  // seq -> (session id, send time) of renewals not answered yet
  std::map<uint64_t, std::pair<int64_t, SteadyClock::time_point>> sent_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const TurnObserver> observer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stream> stream_;                          // pump thread only
  SteadyClock::time_point next_connect_{};                  // pump thread only
  std::chrono::milliseconds backoff_{50};                   // pump thread only
  std::thread thread_;
};

}  // namespace holdfast::internal
