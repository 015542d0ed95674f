// Engine::Acquire: one state machine per call.
//
//   Start ──▶ Read ──▶ Decide ──▶ Grant txn ──▶ done (hold)
//                        │  ▲          │ compare failed: Decide on the else branch
//                        │  └──────────┘
//                        ├─ held, try ──▶ done (ABORTED)
//                        └─ held, wait ──▶ Watch the key's holds from (read rev + 1)
//                                           └─ a hold deleted ──▶ Read
//   the wait deadline or a cancel ──▶ done (DEADLINE_EXCEEDED / CANCELLED)
//
// A grant that commits after the call has ended (deadline, cancel) is released
// again at once by a guarded delete, so a caller never holds a lock it was told it
// did not get. Nothing blocks: every step is an etcd callback or a timer.
#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd/watch_hub.h"
#include "lock/engine.h"
#include "lock/keyspace.h"
#include "lock/snapshot.h"
#include "lock/token.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

class AcquireOp : public Cancellable, public std::enable_shared_from_this<AcquireOp> {
 public:
  AcquireOp(Engine* engine, Caller caller, v1::AcquireRequest req, Deadline rpc_deadline,
            Done<v1::AcquireResponse> done)
      : engine_(engine),
        caller_(std::move(caller)),
        req_(std::move(req)),
        rpc_deadline_(rpc_deadline),
        done_(std::move(done)) {}

  void Start() {
    const auto& o = engine_->options();
    if (auto s = keyspace::ValidateNamespaceName(req_.namespace_()); !s.ok()) return Finish(s);
    if (auto s = keyspace::ValidateLockKey(req_.lock_key()); !s.ok()) return Finish(s);
    if (req_.session_id() <= 0) {
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("session id ", req_.session_id(), " is invalid")));
    }
    if (req_.wait_ms() < 0 || req_.wait_ms() > o.max_wait.count()) {
      return Finish(absl::InvalidArgumentError(absl::StrCat(
          "wait ", req_.wait_ms(), "ms is outside [0, ", o.max_wait.count(), "ms]")));
    }
    if (req_.holder_meta().size() > o.max_holder_meta_bytes) {
      return Finish(absl::InvalidArgumentError(absl::StrCat(
          "holder_meta is ", req_.holder_meta().size(), " bytes; at most ",
          o.max_holder_meta_bytes)));
    }
    if (req_.wait_ms() > 0) {
      auto self = shared_from_this();
      absl::MutexLock l(&mu_);
      timer_ = engine_->etcd().timers().ScheduleAfter(
          std::chrono::milliseconds(req_.wait_ms()), [self] { self->OnWaitDeadline(); });
    }
    Read();
  }

  void Cancel() override {
    {
      absl::MutexLock l(&mu_);
      if (grant_in_flight_) {
        ended_reason_ = absl::CancelledError("acquire cancelled by the caller");
        return;  // the grant's callback finishes (and undoes a late grant)
      }
    }
    Finish(absl::CancelledError("acquire cancelled by the caller"));
  }

 private:
  void OnWaitDeadline() {
    absl::Status why;
    {
      absl::MutexLock l(&mu_);
      why = absl::DeadlineExceededError(absl::StrCat(
          "\"", req_.lock_key(), "\" was not granted within ", req_.wait_ms(), "ms",
          holders_hint_.empty() ? "" : absl::StrCat(" (held by ", holders_hint_, ")")));
      timer_ = 0;
      if (grant_in_flight_) {
        ended_reason_ = why;
        return;
      }
    }
    Finish(why);
  }

  bool Ended() {
    absl::MutexLock l(&mu_);
    return finished_;
  }

  Deadline EtcdDeadline() const { return engine_->EtcdDeadline(rpc_deadline_); }

  void Read() {
    if (Ended()) return;
    pb::TxnRequest txn;
    AddSnapshotReads(req_.namespace_(), req_.session_id(), req_.lock_key(),
                     txn.mutable_success());
    auto self = shared_from_this();
    engine_->etcd().Txn(std::move(txn), EtcdDeadline(), [self](absl::StatusOr<pb::TxnResponse> t) {
      if (!t.ok()) return self->Finish(t.status());
      auto snap = ParseSnapshot(t->header(), t->responses());
      if (!snap.ok()) return self->Finish(snap.status());
      self->Decide(std::move(*snap));
    });
  }

  void Decide(KeySnapshot snap) {
    if (Ended()) return;
    engine_->epochs_.Observe(snap.epoch);
    const std::string& ns = req_.namespace_();
    if (!snap.namespace_exists) {
      return Finish(absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist")));
    }
    if (!snap.session) {
      return Finish(absl::NotFoundError(absl::StrCat(
          "session ", req_.session_id(), " not found in namespace \"", ns,
          "\" (it expired or was closed)")));
    }
    if (auto s = CheckEpoch(snap.epoch, snap.cluster_id); !s.ok()) return Finish(s);
    const ClassEntry* cls = ResolveClass(snap.classes, req_.lock_key());
    if (cls == nullptr) {
      return Finish(absl::FailedPreconditionError(absl::StrCat(
          "no lock class of namespace \"", ns, "\" matches \"", req_.lock_key(), "\"")));
    }
    const auto& c = cls->record;
    const int64_t ttl = snap.session->ttl_ms();
    if (ttl < c.ttl_min_ms() || ttl > c.ttl_max_ms()) {
      return Finish(absl::InvalidArgumentError(absl::StrCat(
          "session ttl ", ttl, "ms is outside the bounds of class \"", cls->class_id, "\": [",
          c.ttl_min_ms(), "ms, ", c.ttl_max_ms(), "ms]")));
    }
    if (req_.shared() && c.mode() != v1::LOCK_MODE_SHARED) {
      return Finish(absl::InvalidArgumentError(absl::StrCat(
          "class \"", cls->class_id, "\" is exclusive (mode X): a shared hold cannot be asked")));
    }
    // Idempotent: the session's existing hold is the answer.
    std::vector<std::string> holders;
    bool conflict = false;
    for (const auto& h : snap.holds) {
      if (h.lease == req_.session_id()) return Granted(MakeHoldInfo(req_.lock_key(), h));
      holders.push_back(absl::StrCat("session ", h.lease, h.record.shared() ? " (shared)" : ""));
      if (!req_.shared() || !h.record.shared()) conflict = true;
    }
    if (conflict) {
      std::string hint = absl::StrJoin(holders, ", ");
      if (req_.wait_ms() == 0) {
        return Finish(absl::AbortedError(
            absl::StrCat("\"", req_.lock_key(), "\" is held by ", hint)));
      }
      {
        absl::MutexLock l(&mu_);
        holders_hint_ = std::move(hint);
      }
      return Wait(snap.revision);
    }
    Grant(snap, *cls);
  }

  void Grant(const KeySnapshot& snap, const ClassEntry& cls) {
    const std::string& ns = req_.namespace_();
    const std::string& key = req_.lock_key();
    const int64_t lease = req_.session_id();
    pb::TxnRequest txn;
    auto compare = [&](std::string k, pb::Compare::CompareTarget target,
                       pb::Compare::CompareResult result) {
      auto* c = txn.add_compare();
      c->set_key(std::move(k));
      c->set_target(target);
      c->set_result(result);
      return c;
    };
    // The epoch the token will carry is still the current one.
    compare(keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(snap.epoch->mod_revision);
    // The session (and so its lease) is alive.
    compare(keyspace::SessionKey(ns, lease), pb::Compare::VERSION, pb::Compare::GREATER)
        ->set_version(0);
    // The class that decided is unchanged.
    compare(keyspace::ClassKey(ns, cls.class_id), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(cls.mod_revision);
    auto* holds = compare(keyspace::HoldRangeBegin(ns, key), pb::Compare::CREATE,
                          req_.shared() ? pb::Compare::LESS : pb::Compare::EQUAL);
    holds->set_range_end(keyspace::HoldRangeEnd(ns, key));
    if (req_.shared()) {
      // No hold was created since the read (which had no exclusive one).
      holds->set_create_revision(snap.revision + 1);
    } else {
      // No hold at all.
      holds->set_create_revision(0);
    }
    records::HoldRecord rec;
    rec.set_class_id(cls.class_id);
    rec.set_shared(req_.shared());
    rec.set_holder_meta(req_.holder_meta());
    rec.set_identity(caller_.identity);
    rec.set_epoch(snap.epoch->record.epoch());
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::HoldKey(ns, key, lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    AddSnapshotReads(ns, lease, key, txn.mutable_failure());

    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      grant_in_flight_ = true;
    }
    const int32_t epoch = snap.epoch->record.epoch();
    const uint64_t epoch_cluster = snap.epoch->record.etcd_cluster_id();
    auto self = shared_from_this();
    engine_->etcd().Txn(std::move(txn), EtcdDeadline(), [self, epoch, epoch_cluster, rec](
                                                            absl::StatusOr<pb::TxnResponse> t) {
      self->OnGrantDone(std::move(t), epoch, epoch_cluster, rec);
    });
  }

  void OnGrantDone(absl::StatusOr<pb::TxnResponse> t, int32_t epoch, uint64_t epoch_cluster,
                   const records::HoldRecord& rec) {
    std::optional<absl::Status> ended;
    {
      absl::MutexLock l(&mu_);
      grant_in_flight_ = false;
      ended = ended_reason_;
    }
    if (!t.ok()) {
      // Outcome unknown: converge by reading (Acquire is idempotent per session).
      if (!ended && !retried_unknown_ &&
          (t.status().code() == absl::StatusCode::kUnavailable ||
           t.status().code() == absl::StatusCode::kDeadlineExceeded) &&
          std::chrono::system_clock::now() < rpc_deadline_) {
        retried_unknown_ = true;
        return Read();
      }
      return Finish(ended ? *ended : t.status());
    }
    if (!t->succeeded()) {
      if (ended) return Finish(*ended);
      auto snap = ParseSnapshot(t->header(), t->responses());
      if (!snap.ok()) return Finish(snap.status());
      return Decide(std::move(*snap));
    }
    const int64_t grant_rev = t->header().revision();
    HoldEntry entry{req_.session_id(), grant_rev, rec};
    absl::Status refuse;
    if (t->header().cluster_id() != epoch_cluster) {
      refuse = CheckEpoch(EpochEntry{[&] {
                            records::EpochRecord r;
                            r.set_epoch(epoch);
                            r.set_etcd_cluster_id(epoch_cluster);
                            return r;
                          }(), 0},
                          t->header().cluster_id());
    } else if (auto tok = token::Make(epoch, grant_rev); !tok.ok()) {
      refuse = tok.status();
    }
    if (!refuse.ok() || ended) {
      Undo(grant_rev);
      return Finish(!refuse.ok() ? refuse : *ended);
    }
    Granted(MakeHoldInfo(req_.lock_key(), entry));
  }

  // Deletes the hold this call created at `grant_rev`, if it is still that one.
  void Undo(int64_t grant_rev) {
    pb::TxnRequest txn;
    const std::string hold_key =
        keyspace::HoldKey(req_.namespace_(), req_.lock_key(), req_.session_id());
    auto* c = txn.add_compare();
    c->set_key(hold_key);
    c->set_target(pb::Compare::CREATE);
    c->set_result(pb::Compare::EQUAL);
    c->set_create_revision(grant_rev);
    txn.add_success()->mutable_request_delete_range()->set_key(hold_key);
    engine_->etcd().Txn(std::move(txn),
                        etcd::DeadlineIn(engine_->options().etcd_timeout), [](auto) {});
  }

  void Wait(int64_t read_revision) {
    etcd::WatchSpec spec;
    spec.key = keyspace::HoldRangeBegin(req_.namespace_(), req_.lock_key());
    spec.range_end = keyspace::HoldRangeEnd(req_.namespace_(), req_.lock_key());
    // After the read: etcd serves watches at or before its current revision from
    // a 100 ms sync loop, and events up to the read are already decided on.
    spec.start_revision = read_revision + 1;
    spec.no_put = true;  // only a deletion can free the lock
    std::weak_ptr<AcquireOp> weak = weak_from_this();
    auto& hub = engine_->etcd().watches();
    etcd::WatchId id = hub.Watch(spec, [weak](absl::StatusOr<etcd::WatchBatch>) {
      // Any event or watch error: re-read and decide again (bounded by the deadline).
      if (auto self = weak.lock()) self->OnWake();
    });
    bool cancel_now = false;
    {
      absl::MutexLock l(&mu_);
      if (finished_) {
        cancel_now = true;
      } else {
        watch_ = id;
      }
    }
    if (cancel_now) hub.Cancel(id);
  }

  void OnWake() {
    etcd::WatchId id = 0;
    {
      absl::MutexLock l(&mu_);
      if (finished_ || watch_ == 0) return;  // already woken or over
      id = watch_;
      watch_ = 0;
    }
    engine_->etcd().watches().Cancel(id);
    Read();
  }

  void Granted(v1::HoldInfo info) {
    v1::AcquireResponse resp;
    *resp.mutable_hold() = std::move(info);
    Finish(std::move(resp));
  }

  void Finish(absl::StatusOr<v1::AcquireResponse> result) {
    Done<v1::AcquireResponse> done;
    TimerQueue::TimerId timer = 0;
    etcd::WatchId watch = 0;
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      finished_ = true;
      done = std::move(done_);
      std::swap(timer, timer_);
      std::swap(watch, watch_);
    }
    if (timer != 0) engine_->etcd().timers().Cancel(timer);
    if (watch != 0) engine_->etcd().watches().Cancel(watch);
    done(std::move(result));
  }

  Engine* const engine_;
  const Caller caller_;
  const v1::AcquireRequest req_;
  const Deadline rpc_deadline_;
  bool retried_unknown_ = false;  // touched by one step at a time

  absl::Mutex mu_;
  Done<v1::AcquireResponse> done_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string holders_hint_ ABSL_GUARDED_BY(mu_);  // for the deadline's message
  bool grant_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> ended_reason_ ABSL_GUARDED_BY(mu_);
  TimerQueue::TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  etcd::WatchId watch_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<Cancellable> Engine::Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                             Deadline d, Done<v1::AcquireResponse> done) {
  auto op = std::make_shared<AcquireOp>(this, caller, req, d, std::move(done));
  op->Start();
  return op;
}

}  // namespace holdfast::lock
