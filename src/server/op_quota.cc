#include "server/op_quota.h"

#include "absl/strings/str_cat.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::server {

namespace pb = ::etcdserverpb;

namespace {

constexpr std::chrono::milliseconds kReadTimeout{2000};
constexpr std::chrono::seconds kSweepInterval{60};

}  // namespace

OpQuota::OpQuota(etcd::Client* etcd, RateLimiter* limiter, Options options)
    : etcd_(etcd), limiter_(limiter), options_(options) {
  absl::MutexLock l(&mu_);
  sweep_timer_ = etcd_->timers().ScheduleAfter(kSweepInterval, [this] { Sweep(); });
}

OpQuota::~OpQuota() { Stop(); }

void OpQuota::Stop() {
  TimerQueue::TimerId timer;
  std::vector<etcd::WatchId> watches;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    timer = sweep_timer_;
    sweep_timer_ = 0;
    for (auto& [ns, e] : entries_) {
      if (e.watch != 0) watches.push_back(e.watch);
      e.watch = 0;
      ++e.generation;
    }
  }
  if (timer != 0) etcd_->timers().Cancel(timer);
  for (etcd::WatchId w : watches) etcd_->watches().Cancel(w);
  absl::MutexLock l(&mu_);
  while (calls_ > 0) idle_.Wait(&mu_);
}

void OpQuota::EndCall() {
  absl::MutexLock l(&mu_);
  if (--calls_ == 0) idle_.SignalAll();
}

OpQuota::Admission OpQuota::Decide(const lock::Caller& caller, const std::string& ns,
                                   const Policy& policy) {
  if (policy.op_rate_quota <= 0) {
    limiter_->Admit(ns, 0);  // drops what was kept for an earlier quota
    return {};
  }
  // Outsiders are refused by the engine; they must not use up the tenant's quota.
  if (!lock::CheckMember(caller, ns, policy.members).ok()) return {};
  RateLimiter::Decision d = limiter_->Admit(ns, policy.op_rate_quota);
  if (d.admitted) return {};
  return {absl::ResourceExhaustedError(absl::StrCat(
              "namespace \"", ns, "\" is over its op_rate_quota of ", policy.op_rate_quota,
              " operations per second (across all replicas); retry after ",
              d.retry_after.count(), " ms")),
          d.retry_after};
}

void OpQuota::Admit(const lock::Caller& caller, const std::string& ns, AdmitDone done) {
  // A bad name is the engine's to refuse.
  if (!keyspace::ValidateNamespaceName(ns).ok()) return done({});
  std::optional<Policy> policy;
  std::optional<Waiter> uncached;
  uint64_t generation = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(ns);
    if (stopped_) {
      policy = Policy{};  // shutting down: let it through
    } else if (it != entries_.end() && it->second.ready) {
      it->second.last_used = std::chrono::steady_clock::now();
      policy = it->second.policy;
    } else if (it != entries_.end()) {
      it->second.waiting.push_back({caller, std::move(done)});
      return;
    } else {
      ++calls_;
      if (entries_.size() >= options_.max_cached_namespaces) {
        uncached = Waiter{caller, std::move(done)};
      } else {
        Entry& e = entries_[ns];
        e.generation = next_generation_++;
        e.last_used = std::chrono::steady_clock::now();
        e.waiting.push_back({caller, std::move(done)});
        generation = e.generation;
      }
    }
  }
  if (policy) return done(Decide(caller, ns, *policy));
  Fetch(ns, generation, std::move(uncached));
}

void OpQuota::Charge(const lock::Caller& caller, const std::string& ns) {
  std::optional<Policy> policy;
  {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(ns);
    if (stopped_ || it == entries_.end() || !it->second.ready) return;
    it->second.last_used = std::chrono::steady_clock::now();
    policy = it->second.policy;
  }
  if (policy->op_rate_quota <= 0 || !lock::CheckMember(caller, ns, policy->members).ok()) return;
  limiter_->Charge(ns, policy->op_rate_quota);
}

void OpQuota::Fetch(const std::string& ns, uint64_t generation, std::optional<Waiter> uncached) {
  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey(ns));
  etcd_->Range(r, etcd::DeadlineIn(kReadTimeout),
               [this, ns, generation, uncached = std::move(uncached)](
                   absl::StatusOr<pb::RangeResponse> resp) mutable {
                 OnFetched(ns, generation, std::move(uncached), std::move(resp));
                 EndCall();
               });
}

void OpQuota::OnFetched(const std::string& ns, uint64_t generation,
                        std::optional<Waiter> uncached, absl::StatusOr<pb::RangeResponse> r) {
  std::optional<Policy> policy;
  records::NamespaceRecord rec;
  if (r.ok() && r->kvs_size() > 0 && rec.ParseFromString(r->kvs(0).value())) {
    policy = Policy{rec.op_rate_quota(), rec.members()};
  }
  if (uncached) {
    // Unreadable or unknown: let it through (the engine answers NOT_FOUND etc.).
    return uncached->done(policy ? Decide(uncached->caller, ns, *policy) : Admission{});
  }
  std::vector<Waiter> waiting;
  bool watch = false;
  {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(ns);
    if (it == entries_.end() || it->second.generation != generation) return;
    waiting = std::move(it->second.waiting);
    it->second.waiting.clear();
    if (policy && !stopped_) {
      it->second.ready = true;
      it->second.policy = *policy;
      watch = true;
    } else {
      entries_.erase(it);  // the next call reads again
    }
  }
  if (watch) {
    etcd::WatchSpec spec;
    spec.key = keyspace::NamespaceKey(ns);
    spec.start_revision = r->header().revision() + 1;
    etcd::WatchId id = etcd_->watches().Watch(
        spec, [this, ns, generation](absl::StatusOr<etcd::WatchBatch> batch) {
          OnWatch(ns, generation, std::move(batch));
        });
    bool cancel = false;
    {
      absl::MutexLock l(&mu_);
      auto it = entries_.find(ns);
      if (it == entries_.end() || it->second.generation != generation || stopped_) {
        cancel = true;
      } else {
        it->second.watch = id;
      }
    }
    if (cancel) etcd_->watches().Cancel(id);
  }
  for (auto& w : waiting) w.done(policy ? Decide(w.caller, ns, *policy) : Admission{});
}

void OpQuota::OnWatch(const std::string& ns, uint64_t generation,
                      absl::StatusOr<etcd::WatchBatch> batch) {
  etcd::WatchId cancel = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(ns);
    if (it == entries_.end() || it->second.generation != generation) return;
    Entry& e = it->second;
    bool drop = !batch.ok();  // compacted past us or cancelled: read again next time
    if (batch.ok()) {
      for (const auto& ev : batch->events) {
        records::NamespaceRecord rec;
        if (ev.type() == mvccpb::Event::PUT && rec.ParseFromString(ev.kv().value())) {
          e.policy = Policy{rec.op_rate_quota(), rec.members()};
        } else {
          drop = true;  // deleted (or unreadable)
        }
      }
    }
    if (drop) {
      cancel = e.watch;
      entries_.erase(it);
    }
  }
  if (cancel != 0) etcd_->watches().Cancel(cancel);
}

void OpQuota::Sweep() {
  std::vector<etcd::WatchId> cancel;
  {
    absl::MutexLock l(&mu_);
    sweep_timer_ = 0;
    if (stopped_) return;
    const auto before = std::chrono::steady_clock::now() - options_.idle_expiry;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.ready && it->second.last_used < before) {
        if (it->second.watch != 0) cancel.push_back(it->second.watch);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    sweep_timer_ = etcd_->timers().ScheduleAfter(kSweepInterval, [this] { Sweep(); });
  }
  for (etcd::WatchId w : cancel) etcd_->watches().Cancel(w);
}

}  // namespace holdfast::server
