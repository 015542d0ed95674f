// Engine::Acquire: one state machine per call (ARCHITECTURE §4, lock/queue.h).
//
//   Start ─┬─ views allow, key free: Fast grant txn ─▶ done (new hold)
//          │            └ compare failed: Decide on the else branch
//          ├─ views allow, key held by another: Enqueue txn ─▶ Decide on its read
//          │            (or, joined behind the view's last waiter: Wait behind it)
//          └─▶ Read ─▶ Decide ─┬─ held ───────────────────────▶ done (the hold)
//              ▲                ├─ grant ─▶ Grant txn ──────────▶ done (new hold)
//              │                │            └ compare failed: Decide on the else branch
//              │                └─ blocked ─┬─ try ──────────────▶ done (ABORTED)
//              │                            ├─ not queued: Enqueue txn ─▶ Decide on its read
//              │                            └─ queued: Wait on watches
//              └──────────────── a watched key deleted, or a waiter ahead's deadline
//   the wait deadline, or a cancel ─▶ End: remove the own waiter (guarded) ─▶ done
//
// A call that finds its session's waiter already queued (an earlier attempt of
// the same call, asked again on another replica) takes it over in place, and the
// earlier attempt's end leaves it alone (Decide, EndNow).
//
// While waiting the call watches only the keys it depends on, each from the read's
// revision + 1: its own hold key (a release that hands it the lock puts it: the
// call answers from that event, or sooner when the release ran on this replica:
// lock/local_waiters.h), its own waiter key (deleted without a hand-over:
// read again), the waiter just ahead of it (or, joined behind the view's last
// waiter without reading the queue, that one), and, at the head, the key's holds
// (deletions wake it kLookAgainAfterDelete later, so a hand-over's own-hold event
// of the same revision comes first). No thread is held.
//
// The fast grant is the common case of a free key with no extra round trip: built
// from this replica's views (lock/view_cache.h) with compares that hold only while
// they are true, so it grants exactly what Decide on a fresh read would; otherwise
// its else branch is that read. A waiting call on a key this replica's view shows
// held by another session skips the grant that would fail and joins the queue
// first, under the same compares. An enqueue transaction reads the queue in both
// branches, after its own put, so the call decides (and starts its watches) on the
// queue as that commit left it without a read of its own; one that joins from the
// views behind a queue the view shows complete reads back only the waiter it joins
// behind, and waits behind it (JoinBehind, WaitBehind). An enqueue behind other
// waiters may wait a little for the key's next release on this replica and go in
// its transaction (lock/group_commit.h, Ride; EngineOptions::ride_at_most).
//
// One etcd step is in flight at a time; a deadline or cancel that arrives during a
// step takes effect when the step completes. A grant that commits after the call
// has ended is deleted again by a guarded delete; a grant or enqueue etcd did not
// answer as the call ended is read back first (EndUncertain), and a waiter whose
// delete at the end etcd did not answer is deleted again later (KeepLeaving).
#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "etcd/errors.h"
#include "etcd/watch_hub.h"
#include "lock/engine.h"
#include "lock/keyspace.h"
#include "lock/txn_util.h"
#include "lock/queue.h"
#include "lock/snapshot.h"
#include "lock/token.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

// How long a waiter woken by a deletion (the hold it waits for, the waiter ahead,
// its own waiter key) waits for the own hold's event of a hand-over in the same
// revision before it reads again. Only a holder that ends without a hand-over (an
// expiry, a force-release) makes a waiter pay it.
constexpr std::chrono::milliseconds kLookAgainAfterDelete{50};

// An enqueue behind other waiters may wait up to EngineOptions::ride_at_most for
// a release of its key on this replica to ride with (lock/group_commit.h, Ride):
// it cannot be granted before the waiters ahead of it anyway. Only a call whose
// wait has at least this many times that left rides (200 ms at the default 5 ms),
// so riding never takes a noticeable part of a wait.
constexpr int kRideWaitFactor = 40;

// How long a queued call cancelled by its caller keeps its waiter for the same
// call asked again elsewhere to take over (AcquireOp::Cancel): libholdfast asks
// again 50 ms after a broken connection, or once the replica it moves to has
// answered its connection (ClientCore::kConnectGrace, 1 s).
constexpr std::chrono::milliseconds kCancelGrace{2000};

// The shortest a wait is cut to by its call's deadline (AcquireOp::WaitWithin).
constexpr std::chrono::milliseconds kMinCutWait{250};

// The first pause between tries of a refused grant's delete (AcquireOp::UndoThenFail).
constexpr std::chrono::milliseconds kUndoPause{250};
// Grant: the most live waiters ahead a shared grant compares (one each).
constexpr int kMaxAheadCompares = 32;

class AcquireOp : public Cancellable, public std::enable_shared_from_this<AcquireOp> {
 public:
  AcquireOp(Engine* engine, Caller caller, v1::AcquireRequest req, Deadline rpc_deadline,
            Done<v1::AcquireResponse> done)
      : engine_(engine),
        caller_(std::move(caller)),
        req_(std::move(req)),
        rpc_deadline_(rpc_deadline),
        wait_ms_(WaitWithin(req_.wait_ms(), engine->options().max_wait.count(), rpc_deadline)),
        deadline_unix_ms_(NowUnixMs() + wait_ms_),
        started_(std::chrono::steady_clock::now()),
        done_(std::move(done)) {}

  // How long a call asking to wait `wait_ms` (clamped to [0, max_wait]: Validate
  // refuses one out of range, but runs later) waits: no longer than its caller
  // does. A wait that outlasted the call's deadline (a raw gRPC client's deadline
  // shorter than its wait_ms) kept its waiter queued after the caller had given
  // up, to be handed the key nobody was waiting for; and every step after that
  // deadline failed as DEADLINE_EXCEEDED, which leaves a waiter in place for a
  // retry. It ends a tenth of the call's time before the deadline (at least
  // 50 ms, at most 1 s), so the caller hears DEADLINE_EXCEEDED and the waiter
  // goes; but a waiting call waits at least kMinCutWait (or its wait_ms, if
  // less), so that a call with a very short deadline is still granted a free
  // key rather than have its wait end under its grant (which would be undone).
  // libholdfast's calls, whose deadline is the wait plus its rpc timeout, wait
  // what they ask for with an rpc timeout of 1 s or more (with less, up to a
  // tenth of the call's time less).
  static int64_t WaitWithin(int64_t wait_ms, int64_t max_wait_ms, Deadline rpc_deadline) {
    const int64_t wait = std::clamp<int64_t>(wait_ms, 0, max_wait_ms);
    if (wait == 0) return 0;
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             rpc_deadline - std::chrono::system_clock::now())
                             .count();
    const int64_t margin = std::clamp<int64_t>(left / 10, 50, 1000);
    return std::clamp<int64_t>(left - margin, std::min<int64_t>(wait, kMinCutWait.count()), wait);
  }

  void Start() {
    if (auto s = Validate(); !s.ok()) return Finish(s);
    if (auto s = engine_->EtcdStatus(); !s.ok()) {  // fail fast, without a read that hangs
      return Finish(absl::UnavailableError(absl::StrCat(s.message(), ": no new grants; retry")));
    }
    if (req_.wait_ms() > 0) {
      auto self = shared_from_this();
      absl::MutexLock l(&mu_);
      timer_ = engine_->After(std::chrono::milliseconds(wait_ms_),
                              [self] { self->OnWaitDeadline(); });
    }
    if (BeginStep() && !FastStart()) Read();
  }

  // The caller cancelled: its connection broke, its replica is shutting down, or
  // libholdfast moved the call off a replica that went silent. Most often the
  // same call is asked again at once on another replica (libholdfast does within
  // its connect grace, a second), so a queued call keeps its waiter
  // kCancelGrace first: the new attempt takes it over (Decide) and this one's end
  // then leaves it alone (EndNow). A client that died instead leaves its waiter a
  // moment longer: a hand-over in that moment gives its session a hold, which
  // ends with the session's lease, as every hold of a dead client does.
  void Cancel() override { Leave(absl::CancelledError("acquire cancelled by the caller"), false); }

  // The replica is stopping (server/lock_service.h, MoveWaits): as a cancel, but
  // the caller is answered at once with `why` (UNAVAILABLE), so it asks again on
  // another replica now rather than when its connection closes.
  void Move(absl::Status why) override { Leave(std::move(why), true); }

 private:
  // Cancel and Move: a queued call keeps its waiter kCancelGrace, then ends;
  // `answer_now` answers the caller with `why` before that. A call not queued yet
  // ends now; one whose enqueue is in flight then takes out the waiter it put,
  // so that call asked again queues anew (a window of one etcd round trip).
  // Counted in Engine::leavers_ while it keeps the waiter.
  void Leave(absl::Status why, bool answer_now) {
    bool now;
    Done<v1::AcquireResponse> answer;
    {
      absl::MutexLock l(&mu_);
      if (finished_ || end_reason_ || cancelled_) return;
      cancelled_ = true;
      now = own_waiter_rev_ == 0 || deadline_unix_ms_ - NowUnixMs() <= kCancelGrace.count();
      if (!now) {
        if (answer_now) {
          answer = std::move(done_);
          done_ = nullptr;
          answered_ = true;
        }
        leaving_ = true;
        absl::MutexLock c(&engine_->leavers_mu_);
        ++engine_->leavers_;
      }
    }
    if (now) return End(std::move(why));
    if (answer) {
      ReportEnd(why.code());
      answer(why);
    }
    WatchTakeOver();
    auto self = shared_from_this();
    engine_->After(kCancelGrace, [self] {
      self->End(absl::CancelledError("acquire cancelled by the caller"));
    });
  }

  // A leaving call ends as soon as another call of the session puts its waiter
  // again (Decide's take-over), not at the grace's end: its guarded delete then
  // leaves the waiter alone, and a stopping replica need not wait for it.
  void WatchTakeOver() {
    int64_t mod;
    {
      absl::MutexLock l(&mu_);
      mod = own_waiter_mod_;
    }
    if (mod == 0) return;  // the grace's timer ends it
    const std::string& ns = req_.namespace_();
    etcd::WatchSpec spec;
    spec.key = keyspace::WaitKey(ns, req_.lock_key(), req_.session_id());
    spec.start_revision = mod + 1;
    spec.no_delete = true;
    std::weak_ptr<AcquireOp> weak = weak_from_this();
    auto& hub = engine_->etcd().watches();
    const etcd::WatchId id = hub.WatchWithin(
        keyspace::WaitRangeBegin(ns, req_.lock_key()), keyspace::WaitRangeEnd(ns, req_.lock_key()),
        std::move(spec), [weak](absl::StatusOr<etcd::WatchBatch> b) {
          if (!b.ok() || b->events.empty()) return;  // broken: the timer ends it
          if (auto self = weak.lock()) {
            self->End(absl::CancelledError("acquire cancelled by the caller"));
          }
        });
    bool over;
    {
      absl::MutexLock l(&mu_);
      over = finished_;
      if (!over) take_over_watch_ = id;
    }
    if (over) hub.Cancel(id);
  }

  // What this replica's views show for the call, when they show it allowed.
  struct Views {
    NamespaceView ns;
    SessionView session;
    EpochEntry epoch;
    ClassEntry cls;
  };

  // What an enqueue from the views joins behind without reading the queue
  // (lock/queue.h, JoinBehind): the waiter the key's view shows last, and, for the
  // hint of who blocks the call, the view's holds and its live waiters that block
  // the call.
  struct Behind {
    WaiterEntry last;
    std::vector<HoldEntry> holds;
    int64_t blocking = 0;
  };

  absl::Status Validate() const {
    const auto& o = engine_->options();
    if (auto s = keyspace::ValidateNamespaceName(req_.namespace_()); !s.ok()) return s;
    if (auto s = keyspace::ValidateLockKey(req_.lock_key()); !s.ok()) return s;
    if (req_.session_id() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("session id ", req_.session_id(), " is invalid"));
    }
    if (req_.wait_ms() < 0 || req_.wait_ms() > o.max_wait.count()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wait ", req_.wait_ms(), "ms is outside [0, ", o.max_wait.count(),
          "ms] (this server's acquire.max_wait)"));
    }
    if (req_.holder_meta().size() > o.max_holder_meta_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("holder_meta is ", req_.holder_meta().size(),
                                                     " bytes; at most ",
                                                     o.max_holder_meta_bytes));
    }
    return absl::OkStatus();
  }

  // --- step bookkeeping -------------------------------------------------------

  // Marks an etcd step as started. False when the call is ending or over.
  bool BeginStep() {
    absl::MutexLock l(&mu_);
    if (finished_ || end_reason_) return false;
    busy_ = true;
    return true;
  }
  // The views' generation (ViewCache::Generation) as of what the call decides
  // on: taken when it reads (Read) or looks at the views (FastStart), before
  // either, and kept by the steps that decide on that read (a grant, an
  // enqueue). What their answers change of the views is of that generation, so
  // a restore found since the read (ViewCache::Clear) makes them change nothing.
  void TakeViewsGen() {
    const uint64_t gen = engine_->views_.Generation();
    absl::MutexLock l(&mu_);
    step_views_gen_ = gen;
  }
  uint64_t StepViewsGen() {
    absl::MutexLock l(&mu_);
    return step_views_gen_;
  }

  // Marks the step done. Returns the reason when the call is ending: the caller
  // then ends it (its own way) instead of going on.
  std::optional<absl::Status> StepDone() {
    absl::MutexLock l(&mu_);
    busy_ = false;
    if (finished_) return absl::CancelledError("finished");
    return end_reason_;
  }

  void OnWaitDeadline() {
    std::string hint;
    {
      absl::MutexLock l(&mu_);
      timer_ = 0;
      hint = blocked_by_;
    }
    End(absl::DeadlineExceededError(
        absl::StrCat("\"", req_.lock_key(), "\" was not granted within ", wait_ms_, "ms",
                     wait_ms_ < req_.wait_ms() ? " (the wait asked for, cut to end before the call's "
                                                 "deadline)"
                                               : "",
                     hint.empty() ? "" : absl::StrCat(" (blocked by ", hint, ")"))));
  }

  // The deadline passed or the caller cancelled.
  void End(absl::Status why) {
    {
      absl::MutexLock l(&mu_);
      if (finished_ || end_reason_) return;
      end_reason_ = why;
      if (busy_) return;  // the step in flight ends it
      busy_ = true;
    }
    EndNow(why);
  }

  // Leaves the queue (a guarded delete of the own waiter), then finishes. If the
  // waiter was handed the lock before that, the call returns the hold.
  void EndNow(absl::Status why) {
    StopWaiting();
    int64_t own, own_mod;
    {
      absl::MutexLock l(&mu_);
      own = own_waiter_rev_;
      own_mod = own_waiter_mod_;
    }
    if (own == 0) return Finish(why);
    const std::string wait_key =
        keyspace::WaitKey(req_.namespace_(), req_.lock_key(), req_.session_id());
    pb::TxnRequest txn;
    AddCompare(&txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(own);
    // Not if another call of the session has taken the waiter over since (a
    // retry on another replica, Decide): the waiter is that call's now.
    if (own_mod != 0) {
      AddCompare(&txn, wait_key, pb::Compare::MOD, pb::Compare::EQUAL)->set_mod_revision(own_mod);
    }
    // Not if the session holds the key (a waiter put from a stale view, or by a
    // call of the session that did not know): then the claim is the hold's, and
    // the call returns the hold (read on the failure branch), as a call that
    // finds its session holding the key does.
    AddCompare(&txn, keyspace::HoldKey(req_.namespace_(), req_.lock_key(), req_.session_id()),
               pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(0);
    txn.add_success()->mutable_request_delete_range()->set_key(wait_key);
    txn.add_success()->mutable_request_delete_range()->set_key(
        keyspace::ClaimKey(req_.namespace_(), req_.lock_key(), req_.session_id()));
    AddSnapshotReads(req_.namespace_(), req_.session_id(), req_.lock_key(),
                     txn.mutable_failure());
    auto self = shared_from_this();
    const uint64_t gen = engine_->views_.Generation();
    engine_->etcd().Txn(std::move(txn), etcd::DeadlineIn(engine_->options().etcd_timeout),
                        [self, why, own, own_mod, gen](absl::StatusOr<pb::TxnResponse> t) {
                          if (t.ok() && t->succeeded()) {
                            self->engine_->views_.WaiterGone(self->req_.namespace_(),
                                                             self->req_.lock_key(),
                                                             self->req_.session_id(), own, gen);
                          }
                          // Not taken out (etcd did not answer): asked again after
                          // the answer, or the waiter would stand until its own
                          // deadline and be handed a hold no call waits for.
                          if (!t.ok()) self->KeepLeaving(own, own_mod, kUndoPause);
                          if (t.ok() && !t->succeeded()) {
                            auto snap = ParseSnapshot(t->header(), t->responses());
                            if (snap.ok()) {
                              for (const auto& h : snap->holds) {
                                if (h.lease != self->req_.session_id()) continue;
                                if (auto refused = self->HandOverElsewhere(
                                        h.record, snap->cluster_id, /*found=*/true)) {
                                  return self->UndoThenFail(h.create_revision, *refused);
                                }
                                return self->Granted(MakeHoldInfo(self->req_.lock_key(), h,
                                                                  snap->classes));
                              }
                            }
                          }
                          self->Finish(why);
                        });
  }

  Deadline EtcdDeadline() const { return engine_->EtcdDeadline(rpc_deadline_); }

  // --- steps ------------------------------------------------------------------

  void Read() {
    TakeViewsGen();
    pb::TxnRequest txn;
    AddSnapshotReads(req_.namespace_(), req_.session_id(), req_.lock_key(),
                     txn.mutable_success());
    auto self = shared_from_this();
    engine_->etcd().Txn(std::move(txn), EtcdDeadline(), [self](absl::StatusOr<pb::TxnResponse> t) {
      if (auto end = self->StepDone()) return self->EndNow(*end);
      if (!t.ok()) return self->Fail(t.status());
      auto snap = ParseSnapshot(t->header(), t->responses());
      if (!snap.ok()) return self->Fail(snap.status());
      self->Decide(std::move(*snap));
    });
  }

  // Answers with the session's hold; a waiter of the session left beside it
  // leaves the queue (it would be handed the key by the session's own release).
  // A hold whose token was minted under another etcd cluster's epoch record than
  // the one read (a hand-over planned before a restore and committed after it,
  // found by a read rather than told: HandedOver) is not answered: deleted, and
  // the call fails. So is a hold restored from a backup onto a cluster with a new
  // id: nothing tells the two apart, and its token may be below tokens issued
  // after the backup.
  void ReturnOwnHold(const KeySnapshot& snap, const HoldEntry& hold) {
    // In the other mode: not this call's to return, and nothing else of the
    // session's (its hold, a waiter of another call) is touched; a waiter this
    // call put (from a view that did not show the hold) leaves the queue.
    auto other = OtherMode(hold.record.shared());
    int64_t put = 0;
    if (other) {
      absl::MutexLock l(&mu_);
      put = put_rev_;
    }
    for (const auto& w : snap.waiters) {
      if (w.lease == req_.session_id() && (!other || (put != 0 && w.create_revision == put))) {
        LeaveQueue(w.create_revision);
      }
    }
    if (other) return Finish(*std::move(other));
    if (auto refused = HandOverElsewhere(hold.record, snap.cluster_id, /*found=*/true)) {
      return UndoThenFail(hold.create_revision, *std::move(refused));
    }
    Granted(MakeHoldInfo(req_.lock_key(), hold, snap.classes));
  }

  // Ends the call with a refusal or an error found between steps. A call whose
  // session has a waiter of the key leaves the queue first (EndNow: a guarded
  // delete, and the hold if a hand-over came before it). A waiter left behind
  // would stand in the queue after its call had answered: whoever came next would
  // wait behind it until its deadline, and a release would hand it a hold no call
  // waits for, kept as long as the session lives. Except after an error the
  // caller retries (UNAVAILABLE, DEADLINE_EXCEEDED: libholdfast asks again with
  // what is left of the wait), where the waiter keeps its place for the retry
  // and, if none comes, goes at its own deadline. `leave` takes the waiter out
  // whatever the error (a rehome's drain: UNAVAILABLE, but the queue is not this
  // cluster's any more, and a rehome rolled back would hand the key to a waiter
  // whose caller may have stopped asking).
  void Fail(absl::Status why, bool leave = false) {
    const bool retried = !leave && etcd::OutcomeUnknown(why);
    int64_t own;
    {
      absl::MutexLock l(&mu_);
      if (finished_ || end_reason_) return;  // End is ending the call already
      own = retried ? 0 : own_waiter_rev_;
      if (own != 0) {
        end_reason_ = why;
        busy_ = true;
      }
    }
    if (own != 0) return EndNow(std::move(why));
    Finish(std::move(why));
  }

  // Called between steps (not busy); starts the next step, waits, or finishes.
  void Decide(KeySnapshot snap) {
    read_revision_ = snap.revision;
    engine_->epochs_.Observe(snap.epoch);
    const uint64_t gen = StepViewsGen();
    engine_->views_.Observe(req_.namespace_(), req_.session_id(), snap, gen);
    engine_->views_.ObserveKey(req_.namespace_(), req_.lock_key(), snap, gen);
    const std::string& ns = req_.namespace_();
    // What the caller's own session has of the key: only its own, so that a
    // caller naming another's session is refused without touching its holds or
    // its place in the queue.
    const bool own_session =
        snap.session &&
        Engine::CheckOwner(caller_, req_.session_id(), snap.session->identity()).ok();
    const HoldEntry* own_hold = nullptr;
    {
      // The waiter a refusal below takes out of the queue (Fail). A call that
      // does not wait never queues: a waiter of the session is then another
      // call's, and keeps its place.
      absl::MutexLock l(&mu_);
      own_waiter_rev_ = 0;
      own_waiter_mod_ = 0;
      for (const auto& w : snap.waiters) {
        if (w.lease == req_.session_id() && req_.wait_ms() > 0 && own_session) {
          own_waiter_rev_ = w.create_revision;
          own_waiter_mod_ = w.create_revision == put_rev_ ? put_mod_ : w.mod_revision;
        }
      }
    }
    for (const auto& h : snap.holds) {
      if (h.lease == req_.session_id() && own_session) own_hold = &h;
    }
    if (!snap.namespace_exists) {
      return Fail(NoSuchNamespace(caller_, ns));
    }
    NoteLabels(ns, "");
    if (auto s = CheckMember(caller_, ns, snap.ns_record.members()); !s.ok()) {
      if (own_hold) return ReturnOwnHold(snap, *own_hold);
      return Fail(s);
    }
    if (!snap.session) {
      return Fail(absl::NotFoundError(absl::StrCat(
          "session ", req_.session_id(), " not found in namespace \"", ns,
          "\" (it expired or was closed)")));
    }
    engine_->owners_.Remember(req_.session_id(), ns, snap.session->identity());
    if (auto s = Engine::CheckOwner(caller_, req_.session_id(), snap.session->identity());
        !s.ok()) {
      return Fail(s);
    }
    // The session holds the key already: handed over while this call waited, or
    // granted to an earlier call. That hold is returned whatever the policy says
    // now (members, classes, epochs, grant blocks): the policy decides new grants
    // and queueing, and a hold that exists stays the session's until released. A
    // caller answered with an error instead would not know to release it, and it
    // would last as long as the session.
    if (own_hold) return ReturnOwnHold(snap, *own_hold);
    const ClassEntry* cls = ResolveClass(snap.classes, req_.lock_key());
    if (cls == nullptr) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "no lock class of namespace \"", ns, "\" matches \"", req_.lock_key(), "\"")));
    }
    NoteLabels(ns, cls->class_id);
    const auto& c = cls->record;
    const int64_t ttl = snap.session->ttl_ms();
    session_ttl_ms_ = ttl;
    if (ttl < c.ttl_min_ms() || ttl > c.ttl_max_ms()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "session ttl ", ttl, "ms is outside the bounds of class \"", cls->class_id, "\": [",
          c.ttl_min_ms(), "ms, ", c.ttl_max_ms(), "ms]")));
    }
    if (req_.shared() && c.mode() != v1::LOCK_MODE_SHARED) {
      // This request's own mistake: a waiter of the session that this call did
      // not put is another call's, and keeps its place.
      {
        absl::MutexLock l(&mu_);
        if (own_waiter_rev_ != put_rev_) own_waiter_rev_ = own_waiter_mod_ = 0;
      }
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "class \"", cls->class_id, "\" is exclusive (mode X): a shared hold cannot be asked")));
    }
    // (Not kHeld: a hold of the session was answered above.)
    auto d = queue::DecideAcquire(snap, req_.session_id(), req_.shared(), NowUnixMs());
    if (!snap.ns_record.draining_to().empty()) {
      // A rehome drains the namespace: no grant and no queueing here; a waiter
      // leaves the queue.
      return Fail(Engine::Rehoming(ns, snap.ns_record.draining_to(), snap.ns_record.moved()),
                  /*leave=*/true);
    }
    // A new claim (neither held nor queued yet) counts against the session's limit;
    // the grant or enqueue that adds it is guarded by "no claim of this session
    // changed since the read", so concurrent calls on one session cannot pass it.
    const size_t max_holds = engine_->options().max_holds_per_session;
    if (d.own_waiter == nullptr && max_holds > 0 &&
        snap.session_claims >= static_cast<int64_t>(max_holds)) {
      return Fail(absl::ResourceExhaustedError(absl::StrCat(
          "session ", req_.session_id(), " already holds or waits for ", snap.session_claims,
          " locks, the most one session may (limits.max_holds_per_session); release one "
          "first; \"", req_.lock_key(), "\" not acquired")));
    }
    if (auto s = CheckEpoch(snap.epoch, snap.cluster_id); !s.ok()) return Fail(s);
    if (auto s = engine_->GrantBlock(); !s.ok()) return Fail(s);
    if (auto s = engine_->EtcdStatus(); !s.ok()) {
      return Fail(absl::UnavailableError(absl::StrCat(s.message(), ": no new grants; retry")));
    }
    {
      absl::MutexLock l(&mu_);
      blocked_by_ = d.blocked_by;
    }
    if (d.kind == queue::AcquireDecision::Kind::kGrant) return Grant(snap, *cls, d);
    if (req_.wait_ms() == 0) {
      return Fail(absl::AbortedError(
          absl::StrCat("\"", req_.lock_key(), "\" is held by ", d.blocked_by)));
    }
    const size_t max_waiters = engine_->options().max_waiters_per_key;
    if (d.own_waiter == nullptr && max_waiters > 0 && snap.waiters.size() >= max_waiters) {
      return Fail(WaitersFull(static_cast<int64_t>(snap.waiters.size())));
    }
    NoteQueued();
    if (d.own_waiter == nullptr) {
      // Behind other waiters, the enqueue may ride with the next release.
      return Enqueue(nullptr, nullptr, ShouldRide(snap.waiters.size()));
    }
    // The session's waiter, put by an earlier call: this call takes it over with
    // a re-put in place (same create_revision, same place in the queue), so that
    // the earlier call's end does not take it out from under this one. That call
    // is most often this one's own first attempt, whose answer was lost, asked
    // again on another replica (libholdfast moves a call off a replica that went
    // silent, and asks again after a broken connection): when that replica wakes
    // up it ends the first attempt, and its guarded delete (EndNow) fails. A
    // waiter this call put itself is put again only for a later deadline.
    bool put_it;
    {
      absl::MutexLock l(&mu_);
      put_it = d.own_waiter->create_revision == put_rev_;
    }
    if (!put_it || d.own_waiter->record.deadline_unix_ms() < deadline_unix_ms_) {
      return Enqueue(d.own_waiter);
    }
    Wait(snap, d);
  }

  // A new waiter rides when `waiters` are queued ahead of it and its wait is long
  // enough to spend up to ride_at_most of it riding.
  bool ShouldRide(size_t waiters) const {
    const int64_t ride = engine_->options().ride_at_most.count();
    return waiters > 0 && ride > 0 &&
           deadline_unix_ms_ - NowUnixMs() >= kRideWaitFactor * ride;
  }

  // Puts the own waiter key (new, or refreshed with this call's later deadline:
  // a re-put keeps its create_revision, so its place in the queue).
  // `views`: the call joins from the views (FastStart), not from a read, so the
  // transaction also compares what a read would have shown of the namespace.
  // `ride`: the views show waiters ahead: the transaction may wait a little for a
  // release of the key to go with (lock/group_commit.h, Ride).
  // `behind`: the call joins behind the waiter the views show last, and its commit
  // reads back only that waiter and counts the call's own hold (JoinBehind).
  void Enqueue(const WaiterEntry* existing, const Views* views = nullptr, bool ride = false,
               std::shared_ptr<const Behind> behind = nullptr) {
    if (views == nullptr && !BeginStep()) return;  // FastStart's step is begun
    const std::string& ns = req_.namespace_();
    const int64_t lease = req_.session_id();
    const std::string wait_key = keyspace::WaitKey(ns, req_.lock_key(), lease);
    records::WaiterRecord rec;
    rec.set_shared(req_.shared());
    // Taken over from another call of the session: the later of the two deadlines,
    // so that one still waiting is not passed as expired by those behind it.
    rec.set_deadline_unix_ms(
        existing ? std::max(existing->record.deadline_unix_ms(), deadline_unix_ms_)
                 : deadline_unix_ms_);
    rec.set_holder_meta(req_.holder_meta());
    rec.set_identity(caller_.identity);
    rec.set_admin(caller_.admin);
    rec.set_enqueued_at_unix_ms(existing ? existing->record.enqueued_at_unix_ms() : NowUnixMs());
    rec.set_session_ttl_ms(views != nullptr ? views->session.record.ttl_ms() : session_ttl_ms_);
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::SessionKey(ns, lease), pb::Compare::VERSION, pb::Compare::GREATER)
        ->set_version(0);
    AddCompare(&txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(existing ? existing->create_revision : 0);
    if (views != nullptr) {
      AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
          ->set_mod_revision(views->ns.mod_revision);
      AddCompare(&txn, keyspace::SessionKey(ns, lease), pb::Compare::MOD, pb::Compare::EQUAL)
          ->set_mod_revision(views->session.mod_revision);
      AddNoClassChangedSince(&txn, ns, views->ns.classes_revision);
      AddCompare(&txn, keyspace::ClassKey(ns, views->cls.class_id), pb::Compare::MOD,
                 pb::Compare::EQUAL)
          ->set_mod_revision(views->cls.mod_revision);
      AddCompare(&txn, keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
          ->set_mod_revision(views->epoch.mod_revision);
    }
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(wait_key);
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    if (existing == nullptr) AddNewClaim(&txn);
    // Both branches end with the read that decides next (ranges in a transaction
    // see its own writes): the queue as this commit left it, own waiter included,
    // so the watches start right after it without a read of their own. From the
    // views, the success branch reads only the key's holds and waiters and the
    // session's claims: its compares pin the namespace and session records, the
    // classes and the epoch record to what the views hold, so the snapshot takes
    // those from the views (a class deleted since may still be among them, but is
    // not the one resolved: that one's compare would have failed). A riding
    // enqueue's ranges are applied inside the release's commit, before the new
    // holder can be answered, so each one it skips shortens the hand-over. Joining
    // behind a waiter, it reads back that waiter (and counts its own hold) instead
    // of the key's holds and waiters (JoinBehind).
    const int reads_at = txn.success_size();
    std::shared_ptr<const KeySnapshot> facts;
    if (views != nullptr) {
      auto f = std::make_shared<KeySnapshot>();
      f->namespace_exists = true;
      f->ns_record = views->ns.record;
      f->ns_mod_revision = views->ns.mod_revision;
      f->session = views->session.record;
      f->session_mod_revision = views->session.mod_revision;
      f->epoch = views->epoch;
      f->classes = views->ns.classes;
      facts = std::move(f);
      if (behind != nullptr) {
        txn.add_success()->mutable_request_range()->set_key(
            keyspace::WaitKey(ns, req_.lock_key(), behind->last.lease));
        // And the call's own hold, which a view older than a hand-over to this
        // session (on another replica) may not show: then Decide returns it.
        auto* own_hold = txn.add_success()->mutable_request_range();
        own_hold->set_key(keyspace::HoldKey(ns, req_.lock_key(), lease));
        own_hold->set_count_only(true);
        // And the queue's length as this commit left it (WaitBehind checks
        // max_waiters_per_key on it).
        auto* queued = txn.add_success()->mutable_request_range();
        queued->set_key(keyspace::WaitRangeBegin(ns, req_.lock_key()));
        queued->set_range_end(keyspace::WaitRangeEnd(ns, req_.lock_key()));
        queued->set_count_only(true);
      } else {
        AddKeyReads(ns, lease, req_.lock_key(), txn.mutable_success());
      }
    } else {
      AddSnapshotReads(ns, lease, req_.lock_key(), txn.mutable_success());
    }
    AddSnapshotReads(ns, lease, req_.lock_key(), txn.mutable_failure());
    auto self = shared_from_this();
    auto done = [self, rec, reads_at, facts = std::move(facts), behind = std::move(behind),
                 claims_before = views != nullptr ? views->session.claims : 0,
                 existing_rev = existing ? existing->create_revision : 0](
                    absl::StatusOr<pb::TxnResponse> t) {
      WaiterEntry own;
      if (t.ok() && t->succeeded()) {
        own = WaiterEntry{self->req_.session_id(),
                          existing_rev != 0 ? existing_rev : t->header().revision(), rec,
                          t->header().revision()};
        self->engine_->views_.WaiterPut(self->req_.namespace_(), self->req_.lock_key(), own,
                                        self->StepViewsGen());
        absl::MutexLock l(&self->mu_);
        self->own_waiter_rev_ = own.create_revision;
        self->own_waiter_mod_ = own.mod_revision;
        self->put_rev_ = own.create_revision;
        self->put_mod_ = own.mod_revision;
      }
      if (auto end = self->StepDone()) {
        // The enqueue may have committed: its waiter must not stay behind.
        if (!t.ok() && etcd::WriteOutcomeUnknown(t.status())) {
          return self->EndUncertain(*end, false, rec.SerializeAsString());
        }
        return self->EndNow(*end);
      }
      if (!t.ok()) {
        // Unknown outcome: read and decide with the queue as it is.
        if (!self->RetryUnknown(t.status())) return self->Finish(t.status());
        if (self->BeginStep()) self->Read();
        return;
      }
      // Queued, or a lost race: decide on the transaction's read.
      if (t->succeeded() && behind != nullptr && facts != nullptr) {
        return self->WaitBehind(*facts, *behind, own, claims_before, *t, reads_at);
      }
      if (t->succeeded() && facts != nullptr) {
        KeySnapshot snap = *facts;
        if (auto s = ParseKeyReads(t->header(), t->responses(), reads_at, &snap); !s.ok()) {
          return self->Finish(s);
        }
        if (existing_rev == 0) {
          if (auto full = self->OverWaiterLimit(snap)) return self->Fail(*std::move(full));
        }
        return self->Decide(std::move(snap));
      }
      auto snap = ParseSnapshot(t->header(), t->responses(),
                                t->succeeded() ? reads_at : 0);
      if (!snap.ok()) return self->Finish(snap.status());
      if (t->succeeded() && existing_rev == 0) {
        if (auto full = self->OverWaiterLimit(*snap)) return self->Fail(*std::move(full));
      }
      self->Decide(std::move(*snap));
    };
    if (ride) {
      engine_->commits_.Ride({ns, req_.lock_key(), lease}, std::move(txn), EtcdDeadline(),
                             std::move(done), engine_->options().ride_at_most);
    } else {
      engine_->etcd().Txn(std::move(txn), EtcdDeadline(), std::move(done));
    }
  }

  // Refusals of a new waiter past limits.max_waiters_per_key. A read, or a view
  // of the queue, decides whether to enqueue; enqueues that decided before each
  // other's commits could all pass the limit, and a view misses the joins
  // through other replicas since its read. So each new waiter's commit counts the
  // queue it left (`queued`, its own waiter included; the later of two commits
  // counts the earlier one's waiter): past the limit the waiter just put is
  // taken out again (Fail's guarded delete) and the call refused as a read would
  // have refused it; nothing of it stays. A waiter refused so exists for a
  // moment, and a join that counts it meanwhile is refused too: the queue then
  // ends below the limit, never above it.
  absl::Status WaitersFull(int64_t others) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        "\"", req_.lock_key(), "\" already has ", others,
        " waiters, the most one key may have (limits.max_waiters_per_key); not queued"));
  }
  std::optional<absl::Status> OverWaiterLimit(int64_t queued) const {
    const size_t max = engine_->options().max_waiters_per_key;
    if (max == 0 || queued <= static_cast<int64_t>(max)) return std::nullopt;
    return WaitersFull(queued - 1);
  }
  // On the snapshot read in the enqueue's commit; a session that holds the key
  // already (handed it on another replica) is answered with its hold instead.
  std::optional<absl::Status> OverWaiterLimit(const KeySnapshot& snap) const {
    for (const auto& h : snap.holds) {
      if (h.lease == req_.session_id()) return std::nullopt;
    }
    return OverWaiterLimit(static_cast<int64_t>(snap.waiters.size()));
  }

  // After an enqueue that joined behind `b.last` (JoinBehind) and read back only
  // that waiter: waits behind it when it is still queued and still blocks this
  // call, which needs no more of the queue than that (Decide would find it ahead,
  // and the call can be granted only after it goes, when the call reads again).
  // Otherwise (it was handed the key by the release this enqueue rode with, or
  // left, or is past its deadline; or this session holds the key already) the
  // call reads the queue and decides on that.
  // The queue it waits on may miss waiters that joined after the views' read,
  // between `b.last` and this one: such a waiter is found by the read that
  // `b.last`'s going starts, and never passed, since this call grants itself only
  // from a read.
  void WaitBehind(KeySnapshot snap, const Behind& b, const WaiterEntry& own,
                  int64_t claims_before, const pb::TxnResponse& t, int at) {
    snap.revision = t.header().revision();
    snap.cluster_id = t.header().cluster_id();
    // Guarded by "no claim put since the views' count" (AddNewClaim).
    engine_->views_.ClaimAdded(req_.session_id(), claims_before, snap.revision, StepViewsGen());
    std::optional<WaiterEntry> last;
    if (at + 1 < t.responses_size() && t.responses(at).response_range().kvs_size() == 1) {
      const auto& kv = t.responses(at).response_range().kvs(0);
      WaiterEntry w{b.last.lease, kv.create_revision(), {}, kv.mod_revision()};
      if (w.record.ParseFromString(kv.value())) last = std::move(w);
    }
    const bool holds_it = at + 1 < t.responses_size() &&
                          t.responses(at + 1).response_range().count() > 0;
    if (!holds_it && at + 2 < t.responses_size()) {
      if (auto full = OverWaiterLimit(t.responses(at + 2).response_range().count())) {
        return Fail(*std::move(full));
      }
    }
    if (last && !holds_it && snap.epoch &&
        snap.epoch->record.etcd_cluster_id() == snap.cluster_id) {
      // The queue as far as the call needs it: the waiter it waits behind, then
      // itself (one whose server is gone is looked at again at its deadline; the
      // waiters ahead of it are its business). The holds as the views saw them.
      snap.holds = b.holds;
      snap.waiters = {*last, own};
      auto d = queue::DecideAcquire(snap, req_.session_id(), req_.shared(), NowUnixMs());
      if (d.kind == queue::AcquireDecision::Kind::kBlocked && d.predecessor != nullptr &&
          d.predecessor->lease == last->lease && d.own_waiter != nullptr) {
        read_revision_ = snap.revision;
        {
          absl::MutexLock l(&mu_);
          blocked_by_ = queue::BlockedBy(b.holds, std::max<int64_t>(b.blocking, 1),
                                         req_.shared());
        }
        return Wait(snap, d);
      }
    }
    if (BeginStep()) Read();
  }

  // Puts the session's claim on this key, guarded by "none of the session's claims
  // was put since the read" (the read counted them against max_holds_per_session).
  void AddNewClaim(pb::TxnRequest* txn) {
    const std::string prefix = keyspace::ClaimPrefix(req_.namespace_(), req_.session_id());
    auto* unchanged = AddCompare(txn, prefix, pb::Compare::MOD, pb::Compare::LESS);
    unchanged->set_range_end(keyspace::PrefixEnd(prefix));
    unchanged->set_mod_revision(read_revision_ + 1);
    auto* put = txn->add_success()->mutable_request_put();
    put->set_key(keyspace::ClaimKey(req_.namespace_(), req_.lock_key(), req_.session_id()));
    put->set_lease(req_.session_id());
  }

  // The checks of Decide, on the views (no refusal: a doubt reads first).
  std::optional<Views> ViewsAllow() {
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    const int64_t lease = req_.session_id();
    auto nsv = engine_->views_.Namespace(ns);
    auto sv = engine_->views_.Session(lease);
    auto epoch = engine_->epochs_.Get();
    if (!nsv || !sv || !epoch) return std::nullopt;
    // Both read from the cluster answering now (etcd restored under a new
    // cluster id: a view read before could pass compares against the restored
    // keys; the read path's header decides instead).
    if (sv->cluster_id != nsv->cluster_id ||
        nsv->cluster_id != engine_->etcd_->last_cluster_id()) {
      return std::nullopt;
    }
    // A namespace being rehomed (or moved away) is refused from a fresh read.
    if (!nsv->record.draining_to().empty() || nsv->record.moved()) return std::nullopt;
    if (sv->record.identity() != caller_.identity || sv->record.closing()) return std::nullopt;
    if (!CheckMember(caller_, ns, nsv->record.members()).ok()) return std::nullopt;
    const ClassEntry* cls = ResolveClass(nsv->classes, key);
    if (cls == nullptr) return std::nullopt;
    const auto& c = cls->record;
    const int64_t ttl = sv->record.ttl_ms();
    if (ttl < c.ttl_min_ms() || ttl > c.ttl_max_ms()) return std::nullopt;
    if (req_.shared() && c.mode() != v1::LOCK_MODE_SHARED) return std::nullopt;
    const size_t max_holds = engine_->options().max_holds_per_session;
    if (max_holds > 0 && sv->claims >= static_cast<int64_t>(max_holds)) return std::nullopt;
    if (!CheckEpoch(epoch, nsv->cluster_id).ok() || !engine_->GrantBlock().ok()) {
      return std::nullopt;
    }
    ClassEntry chosen = *cls;
    return Views{std::move(*nsv), std::move(*sv), std::move(*epoch), std::move(chosen)};
  }

  // The first step when the views allow the call: a waiting call on a key that the
  // key's view shows held by another session joins the queue at once (the grant
  // would fail); otherwise the fast grant. False: the call reads first.
  bool FastStart() {
    TakeViewsGen();
    auto v = ViewsAllow();
    if (!v) return false;
    NoteLabels(req_.namespace_(), v->cls.class_id);
    const size_t max_waiters = engine_->options().max_waiters_per_key;
    if (req_.wait_ms() > 0) {
      if (auto kv = engine_->views_.GlanceKey(req_.namespace_(), req_.lock_key(),
                                              req_.session_id(), req_.shared(), NowUnixMs())) {
        if (kv->held_by_other && !kv->mine &&
            (max_waiters == 0 || kv->waiters < max_waiters)) {
          read_revision_ = v->session.claims_revision;
          NoteQueued();
          std::shared_ptr<const Behind> behind;
          if (kv->behind) {
            behind = std::make_shared<const Behind>(
                Behind{std::move(*kv->behind), std::move(kv->holds), kv->blocking});
          }
          Enqueue(nullptr, &*v, ShouldRide(kv->waiters), std::move(behind));
          return true;
        }
      }
    }
    return FastGrant(*v);
  }

  // The first step when this replica's views show the key free for this caller:
  // the grant transaction of Grant for a key with no hold and no waiter, with the
  // read's facts replaced by compares on what the views show (the namespace and
  // session records unchanged, no class changed since the views' read, the
  // resolved class unchanged, no claim of the session put since its count).
  // Never refuses: every error comes from a fresh read.
  bool FastGrant(const Views& v) {
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    const int64_t lease = req_.session_id();
    const NamespaceView* nsv = &v.ns;
    const SessionView* sv = &v.session;
    const EpochEntry* epoch = &v.epoch;
    const ClassEntry* cls = &v.cls;

    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(epoch->mod_revision);
    AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(nsv->mod_revision);
    AddCompare(&txn, keyspace::SessionKey(ns, lease), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(sv->mod_revision);
    AddNoClassChangedSince(&txn, ns, nsv->classes_revision);
    AddCompare(&txn, keyspace::ClassKey(ns, cls->class_id), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(cls->mod_revision);
    // No hold and no waiter at all (a range with no key compares as create 0).
    auto* holds = AddCompare(&txn, keyspace::HoldRangeBegin(ns, key), pb::Compare::CREATE,
                             pb::Compare::EQUAL);
    holds->set_range_end(keyspace::HoldRangeEnd(ns, key));
    holds->set_create_revision(0);
    auto* waiters = AddCompare(&txn, keyspace::WaitRangeBegin(ns, key), pb::Compare::CREATE,
                               pb::Compare::EQUAL);
    waiters->set_range_end(keyspace::WaitRangeEnd(ns, key));
    waiters->set_create_revision(0);
    read_revision_ = sv->claims_revision;
    AddNewClaim(&txn);
    claims_before_ = sv->claims;
    records::HoldRecord rec = NewHold(*cls, epoch->record);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::HoldKey(ns, key, lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    AddSnapshotReads(ns, lease, key, txn.mutable_failure());

    const uint64_t epoch_cluster = epoch->record.etcd_cluster_id();
    auto self = shared_from_this();
    engine_->commits_.Txn({ns, key, lease}, std::move(txn), EtcdDeadline(),
                          [self, epoch_cluster, rec, classes = nsv->classes](
                            absl::StatusOr<pb::TxnResponse> t) {
                          self->OnGrantDone(std::move(t), epoch_cluster, rec, classes);
                        });
    return true;
  }

  // More dead waiters ahead than one grant may remove beside its other operations
  // (etcd's --max-txn-ops; a replica that died with many waits on one key whose
  // callers did not ask again leaves such a queue): the first
  // queue::kMaxDeadPerGrant in queue order are removed in a transaction of their own, each
  // guarded as a grant guards it (one taken over in place since is alive), and
  // the call decides again on what it reads then. Nothing is granted here.
  void RemoveDeadAhead(const KeySnapshot& snap, const queue::AcquireDecision& d) {
    if (!BeginStep()) return;
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    pb::TxnRequest txn;
    for (size_t i = 0; i < queue::kMaxDeadPerGrant; ++i) {
      RemoveDeadWaiter(snap, ns, key, *d.dead_ahead[i], &txn);
    }
    AddSnapshotReads(ns, req_.session_id(), key, txn.mutable_failure());
    auto self = shared_from_this();
    engine_->etcd().Txn(std::move(txn), EtcdDeadline(), [self](absl::StatusOr<pb::TxnResponse> t) {
      if (auto end = self->StepDone()) return self->EndNow(*end);
      if (!t.ok()) {
        // Removing dead waiters twice is harmless: read and decide again.
        if (!self->RetryUnknown(t.status())) return self->Fail(t.status());
        if (self->BeginStep()) self->Read();
        return;
      }
      if (t->succeeded()) {
        if (self->BeginStep()) self->Read();
        return;
      }
      auto snap = ParseSnapshot(t->header(), t->responses());
      if (!snap.ok()) return self->Fail(snap.status());
      self->Decide(std::move(*snap));
    });
  }

  records::HoldRecord NewHold(const ClassEntry& cls, const records::EpochRecord& epoch) const {
    records::HoldRecord rec;
    rec.set_class_id(cls.class_id);
    rec.set_shared(req_.shared());
    rec.set_holder_meta(req_.holder_meta());
    rec.set_identity(caller_.identity);
    rec.set_epoch(epoch.epoch());
    rec.set_etcd_cluster_id(epoch.etcd_cluster_id());
    rec.set_granted_at_unix_ms(NowUnixMs());
    rec.set_advisory(cls.record.enforcement() == v1::ENFORCEMENT_ADVISORY);
    return rec;
  }

  void Grant(const KeySnapshot& snap, const ClassEntry& cls, const queue::AcquireDecision& d) {
    if (d.dead_ahead.size() > queue::kMaxDeadPerGrant) return RemoveDeadAhead(snap, d);
    if (!BeginStep()) return;
    claims_before_ = -1;
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    const int64_t lease = req_.session_id();
    pb::TxnRequest txn;
    // The epoch the token will carry is still the current one.
    AddCompare(&txn, keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(snap.epoch->mod_revision);
    // The session (and so its lease) is alive.
    AddCompare(&txn, keyspace::SessionKey(ns, lease), pb::Compare::VERSION, pb::Compare::GREATER)
        ->set_version(0);
    // The class that decided is unchanged, and no class was created or changed
    // since the read (one of a longer prefix would now decide the key: its mode,
    // TTL bounds and enforcement).
    AddCompare(&txn, keyspace::ClassKey(ns, cls.class_id), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(cls.mod_revision);
    AddNoClassChangedSince(&txn, ns, snap.revision);
    // Exclusive: no hold at all. Shared: no hold created since the read (which
    // had no exclusive one).
    auto* holds = AddCompare(&txn, keyspace::HoldRangeBegin(ns, key), pb::Compare::CREATE,
                             req_.shared() ? pb::Compare::LESS : pb::Compare::EQUAL);
    holds->set_range_end(keyspace::HoldRangeEnd(ns, key));
    holds->set_create_revision(req_.shared() ? snap.revision + 1 : 0);
    if (d.own_waiter) {
      // Still queued (not handed the lock, not removed). Nobody can join ahead.
      AddCompare(&txn, keyspace::WaitKey(ns, key, lease), pb::Compare::CREATE, pb::Compare::EQUAL)
          ->set_create_revision(d.own_waiter->create_revision);
      txn.add_success()->mutable_request_delete_range()->set_key(keyspace::WaitKey(ns, key, lease));
      // Shared past live waiters ahead, which were shared as read: each is
      // unchanged (one taken over in place by a retry of its session may now ask
      // for the key exclusive, and must not be passed). The nearest
      // kMaxAheadCompares of them, so that the transaction stays within etcd's
      // --max-txn-ops (128) beside its other operations; past them, the rare
      // take-over as exclusive can be passed.
      if (req_.shared()) {
        int compared = 0;
        for (auto it = snap.waiters.rbegin(); it != snap.waiters.rend(); ++it) {
          const WaiterEntry& w = *it;
          if (w.create_revision >= d.own_waiter->create_revision) continue;
          if (std::find(d.dead_ahead.begin(), d.dead_ahead.end(), &w) != d.dead_ahead.end()) {
            continue;
          }
          if (++compared > kMaxAheadCompares) break;
          AddCompare(&txn, keyspace::WaitKey(ns, key, w.lease), pb::Compare::MOD,
                     pb::Compare::EQUAL)
              ->set_mod_revision(w.mod_revision);
        }
      }
    } else {
      // Not queued: no waiter joined since the read (the ones seen were dead).
      auto* waiters = AddCompare(&txn, keyspace::WaitRangeBegin(ns, key), pb::Compare::MOD,
                                 pb::Compare::LESS);
      waiters->set_range_end(keyspace::WaitRangeEnd(ns, key));
      waiters->set_mod_revision(snap.revision + 1);
      AddNewClaim(&txn);
      claims_before_ = snap.session_claims;
    }
    // Each dead waiter ahead as read: one a retried acquire took over in place
    // with a later deadline since is alive, and ahead (the compare failing sends
    // the call to decide again on the else branch's read).
    for (const WaiterEntry* dead : d.dead_ahead) RemoveDeadWaiter(snap, ns, key, *dead, &txn);
    records::HoldRecord rec = NewHold(cls, snap.epoch->record);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::HoldKey(ns, key, lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    AddSnapshotReads(ns, lease, key, txn.mutable_failure());

    const uint64_t epoch_cluster = snap.epoch->record.etcd_cluster_id();
    auto self = shared_from_this();
    auto classes = snap.classes;
    engine_->commits_.Txn({ns, key, lease}, std::move(txn), EtcdDeadline(),
                          [self, epoch_cluster, rec, classes](absl::StatusOr<pb::TxnResponse> t) {
                            self->OnGrantDone(std::move(t), epoch_cluster, rec, classes);
                          });
  }

  void OnGrantDone(absl::StatusOr<pb::TxnResponse> t, uint64_t epoch_cluster,
                   const records::HoldRecord& rec, const std::vector<ClassEntry>& classes) {
    auto end = StepDone();
    if (!t.ok()) {
      // Ending, with the grant's outcome unknown: it may have committed, and the
      // call must not say "not granted" while the session holds the key.
      if (end && etcd::WriteOutcomeUnknown(t.status())) {
        return EndUncertain(*end, true, rec.SerializeAsString());
      }
      if (end) return EndNow(*end);
      if (!RetryUnknown(t.status())) return Finish(t.status());
      if (BeginStep()) Read();  // converge: Acquire is idempotent per session
      return;
    }
    if (!t->succeeded()) {
      if (end) return EndNow(*end);
      auto snap = ParseSnapshot(t->header(), t->responses());
      if (!snap.ok()) return Finish(snap.status());
      return Decide(std::move(*snap));
    }
    const int64_t grant_rev = t->header().revision();
    engine_->views_.ForgetKey(req_.namespace_(), req_.lock_key());  // a hold it never saw
    if (claims_before_ >= 0) {
      engine_->views_.ClaimAdded(req_.session_id(), claims_before_, grant_rev, StepViewsGen());
    }
    HoldEntry entry{req_.session_id(), grant_rev, rec};
    absl::Status refuse;
    if (t->header().cluster_id() != epoch_cluster) {
      EpochEntry seen;
      seen.record.set_epoch(rec.epoch());
      seen.record.set_etcd_cluster_id(epoch_cluster);
      refuse = CheckEpoch(seen, t->header().cluster_id());
    } else if (auto tok = token::Make(rec.epoch(), grant_rev); !tok.ok()) {
      refuse = tok.status();
    }
    if (!refuse.ok() || end) return UndoThenFail(grant_rev, !refuse.ok() ? refuse : *end);
    engine_->observer().OnGranted(req_.namespace_(), rec.class_id(), GrantPath::kAcquire, 1);
    Granted(MakeHoldInfo(req_.lock_key(), entry, classes));
  }

  // A write answered UNAVAILABLE, DEADLINE_EXCEEDED or a transport failure
  // (etcd::WriteOutcomeUnknown) may have committed: read once more (within the
  // RPC's deadline) instead of failing. A grant that committed is then found and
  // answered; failing would leave the session holding a key its caller was told
  // it did not get.
  bool RetryUnknown(const absl::Status& s) {
    if (!etcd::WriteOutcomeUnknown(s)) return false;
    if (retries_left_ <= 0 || std::chrono::system_clock::now() >= rpc_deadline_) return false;
    --retries_left_;
    return true;
  }

  // The call is ending after a write of its own whose outcome is unknown (etcd
  // did not answer: a leader election, say, which is also what makes the write
  // slow enough for the wait or a cancel to end the call meanwhile). Reads what
  // the session has of the key, asked again until the answer's bound, then ends
  // as if the write's answer had come. The write is known by what it wrote
  // (`written`, the record), put after the read it was decided on: another call
  // of the session (a retry on another replica) writes a record of its own.
  // `grant`: such a hold is this call's, and is undone (as a grant that commits
  // after the call's end is); an enqueue: such a waiter is this call's, and
  // leaves the queue (EndNow, which returns a hold handed to it meanwhile).
  void EndUncertain(absl::Status why, bool grant, std::string written) {
    const auto now = std::chrono::system_clock::now();
    const auto left = std::max<std::chrono::system_clock::duration>(rpc_deadline_ - now, {});
    EndUncertain(std::move(why), grant, std::move(written),
                 rpc_deadline_ - std::min<std::chrono::system_clock::duration>(
                                     left / 4, std::chrono::seconds(1)));
  }

  void EndUncertain(absl::Status why, bool grant, std::string written, Deadline answer_by) {
    StopWaiting();
    pb::TxnRequest txn;
    AddSnapshotReads(req_.namespace_(), req_.session_id(), req_.lock_key(),
                     txn.mutable_success());
    auto self = shared_from_this();
    engine_->etcd().Txn(
        std::move(txn), std::min(answer_by, engine_->EtcdDeadline(rpc_deadline_)),
        [self, why, grant, written, answer_by](absl::StatusOr<pb::TxnResponse> t) {
          absl::StatusOr<KeySnapshot> snap =
              t.ok() ? ParseSnapshot(t->header(), t->responses()) : t.status();
          if (!snap.ok()) {
            if (std::chrono::system_clock::now() + kUndoPause < answer_by) {
              self->engine_->After(kUndoPause, [self, why, grant, written, answer_by] {
                self->EndUncertain(why, grant, written, answer_by);
              });
              return;
            }
            return self->Finish(absl::Status(
                why.code(), absl::StrCat(why.message(), "; but a write of this call was not "
                                         "answered by etcd, and whether it committed is not "
                                         "known (", snap.status().message(), "): the session "
                                         "may hold or wait for the key")));
          }
          const int64_t decided_at = self->read_revision_;
          for (const auto& h : snap->holds) {
            if (grant && h.lease == self->req_.session_id() && h.create_revision > decided_at &&
                h.record.SerializeAsString() == written) {
              return self->UndoThenFail(h.create_revision, why);
            }
          }
          if (!grant) {
            for (const auto& w : snap->waiters) {
              if (w.lease != self->req_.session_id() || w.mod_revision <= decided_at ||
                  w.record.SerializeAsString() != written) {
                continue;
              }
              absl::MutexLock l(&self->mu_);
              self->own_waiter_rev_ = w.create_revision;
              self->own_waiter_mod_ = w.mod_revision;
            }
          }
          self->EndNow(why);
        });
  }

  // EndNow's guarded delete of the own waiter, after the call has been answered
  // and etcd did not answer the delete: asked again, each pause twice the last
  // (up to 4 s), until etcd answers (deleted, or the waiter is no longer this
  // call's) or the waiter's own deadline has passed (then nobody is handed the
  // key through it). Not across a restart of holdfastd. A hand-over to the
  // waiter before a retry commits gives the session the hold, as one during a
  // cancel's grace does (docs/errors.md, CANCELLED).
  void KeepLeaving(int64_t own, int64_t own_mod, std::chrono::milliseconds pause) {
    if (NowUnixMs() >= deadline_unix_ms_) return;
    auto self = shared_from_this();
    engine_->After(pause, [self, own, own_mod, pause] {
      const std::string wait_key = keyspace::WaitKey(
          self->req_.namespace_(), self->req_.lock_key(), self->req_.session_id());
      pb::TxnRequest txn;
      AddCompare(&txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
          ->set_create_revision(own);
      if (own_mod != 0) {
        AddCompare(&txn, wait_key, pb::Compare::MOD, pb::Compare::EQUAL)
            ->set_mod_revision(own_mod);
      }
      AddCompare(&txn,
                 keyspace::HoldKey(self->req_.namespace_(), self->req_.lock_key(),
                                   self->req_.session_id()),
                 pb::Compare::CREATE, pb::Compare::EQUAL)
          ->set_create_revision(0);
      txn.add_success()->mutable_request_delete_range()->set_key(wait_key);
      txn.add_success()->mutable_request_delete_range()->set_key(keyspace::ClaimKey(
          self->req_.namespace_(), self->req_.lock_key(), self->req_.session_id()));
      const uint64_t gen = self->engine_->views_.Generation();
      self->engine_->etcd().Txn(
          std::move(txn), etcd::DeadlineIn(self->engine_->options().etcd_timeout),
          [self, own, own_mod, pause, gen](absl::StatusOr<pb::TxnResponse> t) {
            if (t.ok()) {
              if (t->succeeded()) {
                self->engine_->views_.WaiterGone(self->req_.namespace_(), self->req_.lock_key(),
                                                 self->req_.session_id(), own, gen);
              }
              return;
            }
            self->KeepLeaving(own, own_mod,
                              std::min<std::chrono::milliseconds>(pause * 2,
                                                                  std::chrono::seconds(4)));
          });
    });
  }

  // Deletes the own waiter created at `create_revision`, if it is still that one,
  // and keeps the claim: the session holds the key. A session that holds the key
  // and asks again from the views (whose view of the key did not show the hold)
  // has queued first; left there, the waiter would be handed the key again by the
  // session's own release, which then would not free it.
  void LeaveQueue(int64_t create_revision) {
    const std::string wait_key =
        keyspace::WaitKey(req_.namespace_(), req_.lock_key(), req_.session_id());
    pb::TxnRequest txn;
    AddCompare(&txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(create_revision);
    txn.add_success()->mutable_request_delete_range()->set_key(wait_key);
    {
      absl::MutexLock l(&mu_);
      own_waiter_rev_ = 0;
    }
    auto self = shared_from_this();
    const uint64_t gen = engine_->views_.Generation();
    engine_->etcd().Txn(std::move(txn), etcd::DeadlineIn(engine_->options().etcd_timeout),
                        [self, create_revision, gen](absl::StatusOr<pb::TxnResponse> t) {
                          if (t.ok() && t->succeeded()) {
                            self->engine_->views_.WaiterGone(self->req_.namespace_(),
                                                             self->req_.lock_key(),
                                                             self->req_.session_id(),
                                                             create_revision, gen);
                          }
                        });
  }

  // Deletes the session's hold of the key if it is still the one created at
  // `grant_rev` (recorded as a release).
  pb::TxnRequest UndoTxn(int64_t grant_rev) const {
    pb::TxnRequest txn;
    const std::string hold_key =
        keyspace::HoldKey(req_.namespace_(), req_.lock_key(), req_.session_id());
    AddCompare(&txn, hold_key, pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(grant_rev);
    txn.add_success()->mutable_request_delete_range()->set_key(hold_key);
    txn.add_success()->mutable_request_delete_range()->set_key(
        keyspace::ClaimKey(req_.namespace_(), req_.lock_key(), req_.session_id()));
    AddAuditMark(&txn);  // recorded as a release, not an expiry
    return txn;
  }

  // Watches the few keys this waiter depends on, from the read's revision + 1. Each
  // is inside the key's holds or its waiters, and the replica's waiters of one key
  // share one etcd watch of each (WatchHub::WatchWithin): a queue that moves costs
  // etcd no watch created or cancelled per waiter.
  void Wait(const KeySnapshot& snap, const queue::AcquireDecision& d) {
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    const std::string holds_begin = keyspace::HoldRangeBegin(ns, key);
    const std::string holds_end = keyspace::HoldRangeEnd(ns, key);
    const std::string waits_begin = keyspace::WaitRangeBegin(ns, key);
    const std::string waits_end = keyspace::WaitRangeEnd(ns, key);
    // What it waits to go: the waiter ahead of it (`d.predecessor`), or at the head
    // the key's holds.
    const bool at_head = d.predecessor == nullptr;
    etcd::WatchSpec ahead;
    ahead.key = at_head ? holds_begin : keyspace::WaitKey(ns, key, d.predecessor->lease);
    ahead.range_end = at_head ? holds_end : "";
    ahead.start_revision = snap.revision + 1;
    ahead.no_put = true;
    uint64_t gen;
    {
      absl::MutexLock l(&mu_);
      gen = ++wait_gen_;
      wait_classes_ = snap.classes;
    }
    std::weak_ptr<AcquireOp> weak = weak_from_this();
    auto& hub = engine_->etcd().watches();
    std::vector<etcd::WatchId> ids;
    // A deletion wakes the call a moment later: when it is a hand-over to this call,
    // the same revision puts the own hold, and that event answers without a read.
    auto look_again_soon = [weak, gen](absl::StatusOr<etcd::WatchBatch>) {
      auto self = weak.lock();
      if (!self) return;
      self->engine_->After(kLookAgainAfterDelete, [weak, gen] {
        if (auto again = weak.lock()) again->OnWake(gen);
      });
    };
    ids.push_back(hub.WatchWithin(at_head ? holds_begin : waits_begin,
                                  at_head ? holds_end : waits_end, std::move(ahead),
                                  look_again_soon));
    // Handed the lock: the releasing commit puts the own hold (and deletes the own
    // waiter and the released hold) in one revision.
    etcd::WatchSpec own_hold;
    own_hold.key = keyspace::HoldKey(ns, key, req_.session_id());
    own_hold.start_revision = snap.revision + 1;
    own_hold.no_delete = true;
    ids.push_back(hub.WatchWithin(holds_begin, holds_end, std::move(own_hold),
                                  [weak, gen](absl::StatusOr<etcd::WatchBatch> b) {
                                    if (auto self = weak.lock()) {
                                      self->OnHandedOver(gen, std::move(b));
                                    }
                                  }));
    // ... and a release on this replica says so at once (lock/local_waiters.h).
    const uint64_t local = engine_->local_waiters_.Add(
        keyspace::HoldKey(ns, key, req_.session_id()), snap.revision,
        [weak, gen](int64_t create_revision, const records::HoldRecord& rec, uint64_t cluster) {
          if (auto self = weak.lock()) self->HandedOver(gen, create_revision, rec, cluster);
        });
    // The own waiter deleted with no hold put: found dead by another server, or the
    // namespace deleted.
    etcd::WatchSpec own_waiter;
    own_waiter.key = keyspace::WaitKey(ns, key, req_.session_id());
    own_waiter.start_revision = snap.revision + 1;
    own_waiter.no_put = true;
    ids.push_back(hub.WatchWithin(waits_begin, waits_end, std::move(own_waiter), look_again_soon));
    TimerQueue::TimerId wake_timer = 0;
    if (d.wake_at_ms > 0) {
      // A waiter ahead whose own server is gone dies at its deadline: look again then.
      auto in = std::chrono::milliseconds(std::max<int64_t>(d.wake_at_ms - NowUnixMs(), 0) + 1);
      wake_timer = engine_->After(in, [weak, gen] {
        if (auto self = weak.lock()) self->OnWake(gen);
      });
    }
    bool stale = false, parked = false;
    std::string ns_label, class_label;
    {
      absl::MutexLock l(&mu_);
      if (finished_ || end_reason_ || wait_gen_ != gen) {
        stale = true;
      } else {
        watches_ = ids;
        wake_timer_ = wake_timer;
        local_waiter_ = local;
        parked = !parked_;
        parked_ = true;
        ns_label = ns_label_;
        class_label = class_label_;
      }
    }
    if (parked) engine_->observer().OnParked(ns_label, class_label, +1);
    if (stale) {  // ended meanwhile (EndNow has already stopped what was there)
      engine_->local_waiters_.Remove(local);
      for (auto id : ids) hub.Cancel(id);
      if (wake_timer) engine_->etcd().timers().Cancel(wake_timer);
      return;
    }
    // Handed the key by a release here after the read, before the entry above.
    if (auto h = engine_->local_waiters_.Recent(keyspace::HoldKey(ns, key, req_.session_id()),
                                                snap.revision, snap.cluster_id,
                                                snap.epoch ? snap.epoch->record.epoch() : -1)) {
      HandedOver(gen, h->revision, h->rec, h->cluster_id);
    }
  }

  // The own hold's put: the lock was handed over while this call waited.
  void OnHandedOver(uint64_t gen, absl::StatusOr<etcd::WatchBatch> batch) {
    if (!batch.ok()) return OnWake(gen);  // the watch broke: read instead
    const mvccpb::KeyValue* kv = nullptr;
    for (const auto& e : batch->events) {
      if (e.type() == mvccpb::Event::PUT) kv = &e.kv();
    }
    if (kv == nullptr) return;
    records::HoldRecord rec;
    if (!rec.ParseFromString(kv->value())) return OnWake(gen);
    HandedOver(gen, kv->create_revision(), rec, batch->cluster_id);
  }

  // The own hold, put by a hand-over at `create_revision` in a commit of etcd
  // cluster `cluster` (seen by the watch or told by a release on this replica,
  // whichever comes first).
  //
  // A hand-over committed on another cluster than the one whose epoch record it
  // minted its token under was planned before etcd was restored or replaced and
  // committed after: its revision, and so its token, may repeat one issued
  // before. As an acquire's own grant (OnGrantDone), it is not answered as
  // granted: the hold is deleted and the call fails. (The releasing replica knows
  // it too, but a waiter on another replica hears of the hold from its watch.)
  void HandedOver(uint64_t gen, int64_t create_revision, const records::HoldRecord& rec,
                  uint64_t cluster) {
    std::vector<ClassEntry> classes;
    {
      absl::MutexLock l(&mu_);
      // Busy: a read is in flight and will find the hold. Ending: EndNow's
      // guarded delete fails and returns the hold.
      if (finished_ || end_reason_ || busy_ || gen != wait_gen_) return;
      ++wait_gen_;
      busy_ = true;
      classes = wait_classes_;
    }
    StopWaiting();
    if (auto refused = HandOverElsewhere(rec, cluster)) {
      return UndoThenFail(create_revision, *std::move(refused));
    }
    Granted(MakeHoldInfo(req_.lock_key(), HoldEntry{req_.session_id(), create_revision, rec},
                         classes));
  }

  // Why a hold handed over to this call, committed (or read) on etcd cluster
  // `cluster`, must not be answered: its record's epoch belongs to another
  // cluster. (0 on either side: not known, as for records of older versions.)
  // A watch that resumes on a restored cluster and replays a hand-over committed
  // before the backup also lands here: refused though its token was sound, on the
  // safe side.
  // `found`: the hold was found by a read (ReturnOwnHold), not told of as a
  // hand-over, so it may as well be one restored from a backup.
  std::optional<absl::Status> HandOverElsewhere(const records::HoldRecord& rec, uint64_t cluster,
                                                bool found = false) const {
    if (rec.etcd_cluster_id() == 0 || cluster == 0 || rec.etcd_cluster_id() == cluster) {
      return std::nullopt;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", req_.lock_key(), found ? "\" is held by this session on etcd cluster "
                                      : "\" was handed over on etcd cluster ",
        cluster, ", not on the cluster of the epoch record its token was minted under (",
        rec.etcd_cluster_id(), ", epoch ", rec.epoch(),
        found ? "): a hand-over committed after etcd was restored or replaced, or a hold "
                "restored from a backup, and the token could repeat or trail ones issued "
                "before; not granted (the hold is deleted)"
              : "): etcd was restored or replaced under the release, and the token could "
                "repeat one issued before; not granted (the hold is deleted)"));
  }

  // Deletes the hold granted or handed over to this call at `grant_rev`, then
  // fails with `why`. A hold left behind would be the session's, blocking the key
  // as long as the session lives, though its caller was told it is not granted.
  // While etcd does not commit the delete, it is tried again every 250 ms, up to
  // shortly before the call's deadline (a quarter of what was left of it, at most
  // 1 s, so that the answer still reaches the caller). The call then fails with
  // `why`'s code all the same (not UNAVAILABLE, which libholdfast would ask again)
  // saying the delete goes on, and it goes on after the answer (KeepUndoing) until
  // it commits. A later call of the session that finds the hold meanwhile is
  // refused the same way (ReturnOwnHold).
  void UndoThenFail(int64_t grant_rev, absl::Status why) {
    const auto now = std::chrono::system_clock::now();
    const auto left = std::max<std::chrono::system_clock::duration>(rpc_deadline_ - now, {});
    UndoThenFail(grant_rev, std::move(why),
                 rpc_deadline_ - std::min<std::chrono::system_clock::duration>(
                                     left / 4, std::chrono::seconds(1)));
  }

  void UndoThenFail(int64_t grant_rev, absl::Status why, Deadline answer_by) {
    engine_->views_.ForgetKey(req_.namespace_(), req_.lock_key());
    auto self = shared_from_this();
    engine_->etcd().Txn(
        UndoTxn(grant_rev), std::min(answer_by, engine_->EtcdDeadline(rpc_deadline_)),
        [self, grant_rev, why, answer_by](absl::StatusOr<pb::TxnResponse> t) {
          // Committed: deleted, or no longer that hold.
          if (t.ok()) return self->Finish(why);
          if (std::chrono::system_clock::now() + kUndoPause < answer_by) {
            self->engine_->After(kUndoPause, [self, grant_rev, why, answer_by] {
              self->UndoThenFail(grant_rev, why, answer_by);
            });
            return;
          }
          self->Finish(absl::Status(
              why.code(),
              absl::StrCat(why.message(), "; but deleting the hold has not committed yet (",
                           t.status().message(),
                           "): it is tried again until it does, and until then the session "
                           "holds the key")));
          self->KeepUndoing(grant_rev, kUndoPause);
        });
  }

  // The delete of UndoThenFail after the call has been answered: tried again,
  // each pause twice the last, up to 4 s, until it commits (the hold deleted, or
  // gone with its session already). Not across a restart of holdfastd: the hold
  // then stays until the session releases it or ends.
  void KeepUndoing(int64_t grant_rev, std::chrono::milliseconds pause) {
    auto self = shared_from_this();
    engine_->After(pause, [self, grant_rev, pause] {
      self->engine_->etcd().Txn(
          self->UndoTxn(grant_rev), self->engine_->EtcdDeadline(Deadline::max()),
          [self, grant_rev, pause](absl::StatusOr<pb::TxnResponse> t) {
            if (t.ok()) return;
            self->KeepUndoing(grant_rev,
                              std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(4)));
          });
    });
  }

  void OnWake(uint64_t gen) {
    {
      absl::MutexLock l(&mu_);
      if (finished_ || end_reason_ || busy_ || gen != wait_gen_) return;
      ++wait_gen_;  // later wakes of this wait are stale
      busy_ = true;
    }
    StopWaiting();
    Read();
  }

  void StopWaiting() {
    std::vector<etcd::WatchId> ids;
    TimerQueue::TimerId wake = 0;
    uint64_t local = 0;
    {
      absl::MutexLock l(&mu_);
      ids.swap(watches_);
      if (take_over_watch_ != 0) ids.push_back(std::exchange(take_over_watch_, 0));
      std::swap(wake, wake_timer_);
      std::swap(local, local_waiter_);
    }
    if (local) engine_->local_waiters_.Remove(local);
    for (auto id : ids) engine_->etcd().watches().Cancel(id);
    if (wake) engine_->etcd().timers().Cancel(wake);
  }

  // Why a hold of the session in mode `shared` does not answer this call: it
  // asked for the other mode. A hold never changes mode, and the session may hold
  // a key once: a shared hold answered to a call that asked for the key
  // exclusive would tell it the key is its alone while other sessions share it.
  // Such a hold was granted to an earlier call of the session, or handed over to
  // a waiter another call of the session took over in its own mode (Decide): it
  // stays that call's, and this call is refused (FAILED_PRECONDITION).
  std::optional<absl::Status> OtherMode(bool shared) const {
    if (shared == req_.shared()) return std::nullopt;
    const char* held = shared ? "shared" : "exclusive";
    const char* asked = req_.shared() ? "shared" : "exclusive";
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", req_.session_id(), " holds \"", req_.lock_key(), "\" ", held,
        ", and this call asked for it ", asked, ": a hold does not change mode (release it, "
        "then acquire the key ", asked, ")"));
  }

  // Every answer of a hold goes through here: the caller gets the mode it asked
  // for, or a refusal (OtherMode).
  void Granted(v1::HoldInfo info) {
    if (auto other = OtherMode(info.shared())) return Finish(*std::move(other));
    v1::AcquireResponse resp;
    *resp.mutable_hold() = std::move(info);
    Finish(std::move(resp));
  }

  void Finish(absl::StatusOr<v1::AcquireResponse> result) {
    Done<v1::AcquireResponse> done;
    TimerQueue::TimerId timer = 0;
    bool unpark, answered, left;
    std::string ns_label, class_label;
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      finished_ = true;
      done = std::move(done_);
      answered = answered_;
      left = leaving_;
      std::swap(timer, timer_);
      unpark = parked_;
      parked_ = false;
      ns_label = ns_label_;
      class_label = class_label_;
    }
    StopWaiting();
    if (timer != 0) engine_->etcd().timers().Cancel(timer);
    if (unpark) engine_->observer().OnParked(ns_label, class_label, -1);
    // A call answered already (Move) was counted then; what its waiter got since
    // is the call asked again's to report.
    if (!answered) {
      // Reported before the answer: a caller that has its answer sees it counted.
      ReportEnd(result.status().code());
      done(std::move(result));
    }
    if (left) {
      absl::MutexLock l(&engine_->leavers_mu_);
      --engine_->leavers_;
    }
  }

  // Counts the call's end in the metrics (once: Finish, or Move's answer).
  void ReportEnd(absl::StatusCode code) {
    AcquireEnd end;
    std::optional<std::chrono::steady_clock::time_point> queued_at;
    {
      absl::MutexLock l(&mu_);
      queued_at = queued_at_;
      end.ns = ns_label_;
      end.class_id = class_label_;
    }
    const auto now = std::chrono::steady_clock::now();
    end.code = code;
    end.latency = now - started_;
    if (queued_at) end.waited = now - *queued_at;
    engine_->observer().OnAcquireDone(end);
  }

  // The labels this call's metrics carry, once etcd has shown them to exist.
  void NoteLabels(const std::string& ns, const std::string& class_id) {
    absl::MutexLock l(&mu_);
    ns_label_ = ns;
    class_label_ = class_id;
  }

  // The call waits in the queue from now on (unless it already did).
  void NoteQueued() {
    absl::MutexLock l(&mu_);
    if (!queued_at_) queued_at_ = std::chrono::steady_clock::now();
  }

  Engine* const engine_;
  const Caller caller_;
  const v1::AcquireRequest req_;
  const Deadline rpc_deadline_;
  const int64_t wait_ms_;           // WaitWithin
  const int64_t deadline_unix_ms_;  // stored in the waiter record
  const std::chrono::steady_clock::time_point started_;
  int retries_left_ = 2;            // touched by one step at a time

  absl::Mutex mu_;
  Done<v1::AcquireResponse> done_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // an etcd step is in flight
  uint64_t step_views_gen_ ABSL_GUARDED_BY(mu_) = 0;  // StepViewsGen
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // by the caller (Cancel), or Move
  bool answered_ ABSL_GUARDED_BY(mu_) = false;   // Move answered the caller
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;    // counted in Engine::leavers_
  etcd::WatchId take_over_watch_ ABSL_GUARDED_BY(mu_) = 0;  // WatchTakeOver
  std::optional<absl::Status> end_reason_ ABSL_GUARDED_BY(mu_);
  // The revision of the snapshot the last Decide saw (only Decide and the step it
  // starts use it, one at a time).
  int64_t read_revision_ = 0;
  // The claim count the grant in flight was guarded with, when it adds a claim
  // (-1: it adds none). Same discipline as read_revision_.
  int64_t claims_before_ = -1;
  // The session's TTL as the last Decide read it, for the waiter record an
  // enqueue after that read puts. Same discipline as read_revision_.
  int64_t session_ttl_ms_ = 0;
  int64_t own_waiter_rev_ ABSL_GUARDED_BY(mu_) = 0;  // create_revision of the own waiter
  // The own waiter's mod_revision as this call put it (or, one it did not put, as
  // it last read it): its end takes the waiter out only if no other call of the
  // session has put it since (EndNow).
  int64_t own_waiter_mod_ ABSL_GUARDED_BY(mu_) = 0;
  // The create and mod revisions of the waiter this call last put (0: none).
  int64_t put_rev_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t put_mod_ ABSL_GUARDED_BY(mu_) = 0;
  std::string blocked_by_ ABSL_GUARDED_BY(mu_);       // for the deadline's message
  uint64_t wait_gen_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ClassEntry> wait_classes_ ABSL_GUARDED_BY(mu_);  // of the wait's snapshot
  std::vector<etcd::WatchId> watches_ ABSL_GUARDED_BY(mu_);
  TimerQueue::TimerId wake_timer_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t local_waiter_ ABSL_GUARDED_BY(mu_) = 0;  // Engine::local_waiters_ entry
  TimerQueue::TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  // For metrics: labels shown to exist, when the call joined the queue, and
  // whether it is counted as parked (waiting on watches) now.
  std::string ns_label_ ABSL_GUARDED_BY(mu_);
  std::string class_label_ ABSL_GUARDED_BY(mu_);
  std::optional<std::chrono::steady_clock::time_point> queued_at_ ABSL_GUARDED_BY(mu_);
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
};

bool Engine::WaitForLeavers(std::chrono::steady_clock::time_point deadline) {
  const absl::Time until = absl::Now() + absl::FromChrono(deadline - std::chrono::steady_clock::now());
  absl::MutexLock l(&leavers_mu_);
  return leavers_mu_.AwaitWithDeadline(
      absl::Condition(+[](int* left) { return *left == 0; }, &leavers_), until);
}

std::shared_ptr<Cancellable> Engine::Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                             Deadline d, Done<v1::AcquireResponse> done) {
  auto op = std::make_shared<AcquireOp>(this, caller, req, d, std::move(done));
  op->Start();
  return op;
}

}  // namespace holdfast::lock
