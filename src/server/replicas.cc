#include "server/replicas.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "lock/keyspace.h"

namespace holdfast::server {

namespace pb = ::etcdserverpb;

namespace {

constexpr std::chrono::milliseconds kCallTimeout{2000};
// A demand is republished when it moved by more than this fraction.
constexpr double kRepublishChange = 0.2;

bool DemandMoved(const std::map<std::string, double>& now,
                 const std::map<std::string, double>& published) {
  std::set<std::string> names;
  for (const auto& [ns, d] : now) names.insert(ns);
  for (const auto& [ns, d] : published) names.insert(ns);
  for (const auto& ns : names) {
    auto a = now.find(ns), b = published.find(ns);
    if ((a == now.end()) != (b == published.end())) return true;
    const double x = a->second, y = b->second;
    if (std::abs(x - y) > kRepublishChange * std::max(x, y)) return true;
  }
  return false;
}

}  // namespace

ReplicaSet::ReplicaSet(etcd::Client* etcd, RateLimiter* limiter, Options options)
    : etcd_(etcd),
      limiter_(limiter),
      options_(std::move(options)),
      started_at_unix_ms_(absl::ToUnixMillis(absl::Now())) {}

ReplicaSet::~ReplicaSet() { Stop(); }

etcd::Deadline ReplicaSet::CallDeadline() const { return etcd::DeadlineIn(kCallTimeout); }

bool ReplicaSet::BeginCallLocked() {
  if (stopped_) return false;
  ++calls_;
  return true;
}

void ReplicaSet::EndCall() {
  absl::MutexLock l(&mu_);
  if (--calls_ == 0) idle_.SignalAll();
}

int64_t ReplicaSet::id() const {
  absl::MutexLock l(&mu_);
  return lease_;
}

int ReplicaSet::size() const {
  absl::MutexLock l(&mu_);
  return ViewLocked().replicas;
}

absl::Status ReplicaSet::Start(etcd::Deadline d) {
  absl::Status status = StartSync(d);
  if (!status.ok()) {
    // Keep trying in the background: the first ticks register and read the set.
    absl::MutexLock l(&mu_);
    stopped_ = false;
    lease_ = 0;
    timer_ = etcd_->timers().ScheduleAfter(options_.tick, [this] { Tick(); });
  }
  return status;
}

absl::Status ReplicaSet::StartSync(etcd::Deadline d) {
  pb::LeaseGrantRequest grant;
  grant.set_ttl(options_.ttl.count());
  auto lease = etcd_->LeaseGrantSync(grant, d);
  if (!lease.ok()) return lease.status();
  records::ReplicaRecord rec;
  rec.set_address(options_.address);
  rec.set_started_at_unix_ms(started_at_unix_ms_);
  pb::PutRequest put;
  put.set_key(keyspace::ReplicaKey(lease->id()));
  put.set_value(rec.SerializeAsString());
  put.set_lease(lease->id());
  if (auto p = etcd_->PutSync(put, d); !p.ok()) return p.status();
  pb::RangeRequest range;
  range.set_key(keyspace::ReplicaPrefix());
  range.set_range_end(keyspace::PrefixEnd(keyspace::ReplicaPrefix()));
  auto read = etcd_->RangeSync(range, d);
  if (!read.ok()) return read.status();
  {
    absl::MutexLock l(&mu_);
    stopped_ = false;
    lease_ = lease->id();
    records_.clear();
    for (const auto& kv : read->kvs()) ApplyLocked(kv.key(), &kv.value());
    timer_ = etcd_->timers().ScheduleAfter(options_.tick, [this] { Tick(); });
  }
  Watch(read->header().revision() + 1);
  PushView();
  return absl::OkStatus();
}

void ReplicaSet::Stop() {
  TimerQueue::TimerId timer;
  etcd::WatchId watch;
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    timer = timer_;
    watch = watch_;
    lease = lease_;
    timer_ = 0;
    watch_ = 0;
    ++watch_generation_;  // batches still on their way are ignored
  }
  if (timer != 0) etcd_->timers().Cancel(timer);
  if (watch != 0) etcd_->watches().Cancel(watch);
  {
    absl::MutexLock l(&mu_);
    const absl::Time until = absl::Now() + absl::Seconds(3);
    while (calls_ > 0 && !idle_.WaitWithDeadline(&mu_, until)) {
    }
  }
  if (lease == 0) return;
  // Leave at once: the others take this replica's share without waiting for the TTL.
  pb::LeaseRevokeRequest revoke;
  revoke.set_id(lease);
  auto revoked = etcd::Await<pb::LeaseRevokeResponse>(
      [&](etcd::Callback<pb::LeaseRevokeResponse> cb) {
        etcd_->LeaseRevoke(revoke, etcd::DeadlineIn(std::chrono::seconds(1)), std::move(cb));
      });
  (void)revoked;  // on failure the lease expires within its TTL
}

void ReplicaSet::Tick() {
  std::map<std::string, double> demand = limiter_->Demand();
  bool renew = false, publish = false, reregister = false, relist = false;
  {
    absl::MutexLock l(&mu_);
    timer_ = 0;
    if (stopped_) return;
    ++ticks_;
    const int renew_every = std::max<int>(
        1, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(options_.ttl)
                                .count() /
                            3 / std::max<int64_t>(1, options_.tick.count())));
    if (lease_ == 0) {
      reregister = !registering_;
      registering_ = true;
    } else {
      renew = ticks_ % renew_every == 0;
      publish = !publishing_ && DemandMoved(demand, published_);
      publishing_ = publishing_ || publish;
    }
    relist = watch_ == 0 && !relisting_;
    relisting_ = relisting_ || relist;
    timer_ = etcd_->timers().ScheduleAfter(options_.tick, [this] { Tick(); });
  }
  if (reregister) Register();
  if (renew) RenewLease();
  if (publish) Publish(std::move(demand));
  if (relist) Relist();
}

void ReplicaSet::RenewLease() {
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    if (lease == 0 || !BeginCallLocked()) return;
  }
  etcd_->KeepAlive(lease, CallDeadline(), [this, lease](absl::StatusOr<pb::LeaseKeepAliveResponse> r) {
    if (r.ok() && r->ttl() <= 0) {
      // The lease expired under us (etcd was out of reach for longer than the TTL):
      // its key is gone; register again on the next tick.
      std::fprintf(stderr, "holdfastd: replica lease %016llx expired; registering again\n",
                   static_cast<unsigned long long>(lease));
      absl::MutexLock l(&mu_);
      if (lease_ == lease) {
        lease_ = 0;
        published_.clear();
      }
    }
    EndCall();
  });
}

void ReplicaSet::Register() {
  {
    absl::MutexLock l(&mu_);
    if (!BeginCallLocked()) {
      registering_ = false;
      return;
    }
  }
  pb::LeaseGrantRequest grant;
  grant.set_ttl(options_.ttl.count());
  etcd_->LeaseGrant(grant, CallDeadline(), [this](absl::StatusOr<pb::LeaseGrantResponse> g) {
    if (!g.ok()) {
      {
        absl::MutexLock l(&mu_);
        registering_ = false;
      }
      return EndCall();
    }
    const int64_t lease = g->id();
    std::map<std::string, double> demand = limiter_->Demand();
    records::ReplicaRecord rec;
    rec.set_address(options_.address);
    rec.set_started_at_unix_ms(started_at_unix_ms_);
    for (const auto& [ns, d] : demand) (*rec.mutable_demand())[ns] = d;
    pb::PutRequest put;
    put.set_key(keyspace::ReplicaKey(lease));
    put.set_value(rec.SerializeAsString());
    put.set_lease(lease);
    etcd_->Put(put, CallDeadline(),
               [this, lease, demand](absl::StatusOr<pb::PutResponse> p) mutable {
                 {
                   absl::MutexLock l(&mu_);
                   registering_ = false;
                   // On failure the new lease expires by itself; try again next tick.
                   if (p.ok() && !stopped_) {
                     lease_ = lease;
                     published_ = std::move(demand);
                   }
                 }
                 EndCall();
               });
  });
}

void ReplicaSet::Publish(std::map<std::string, double> demand) {
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    if (lease == 0 || !BeginCallLocked()) {
      publishing_ = false;
      return;
    }
  }
  records::ReplicaRecord rec;
  rec.set_address(options_.address);
  rec.set_started_at_unix_ms(started_at_unix_ms_);
  for (const auto& [ns, d] : demand) (*rec.mutable_demand())[ns] = d;
  pb::PutRequest put;
  put.set_key(keyspace::ReplicaKey(lease));
  put.set_value(rec.SerializeAsString());
  put.set_lease(lease);
  etcd_->Put(put, CallDeadline(),
             [this, lease, demand = std::move(demand)](absl::StatusOr<pb::PutResponse> p) mutable {
               {
                 absl::MutexLock l(&mu_);
                 publishing_ = false;
                 if (p.ok()) {
                   published_ = std::move(demand);
                 } else if (p.status().code() == absl::StatusCode::kNotFound ||
                            absl::StrContains(p.status().message(), "lease not found")) {
                   if (lease_ == lease) lease_ = 0;  // register again on the next tick
                 }
               }
               EndCall();
             });
}

void ReplicaSet::Relist() {
  {
    absl::MutexLock l(&mu_);
    if (!BeginCallLocked()) {
      relisting_ = false;
      return;
    }
  }
  pb::RangeRequest range;
  range.set_key(keyspace::ReplicaPrefix());
  range.set_range_end(keyspace::PrefixEnd(keyspace::ReplicaPrefix()));
  etcd_->Range(range, CallDeadline(), [this](absl::StatusOr<pb::RangeResponse> r) {
    int64_t from = 0;
    {
      absl::MutexLock l(&mu_);
      relisting_ = false;
      if (r.ok() && !stopped_) {
        records_.clear();
        for (const auto& kv : r->kvs()) ApplyLocked(kv.key(), &kv.value());
        from = r->header().revision() + 1;
      }
    }
    if (from != 0) {
      Watch(from);
      PushView();
    }
    EndCall();
  });
}

void ReplicaSet::Watch(int64_t from_revision) {
  etcd::WatchSpec spec;
  spec.key = keyspace::ReplicaPrefix();
  spec.range_end = keyspace::PrefixEnd(keyspace::ReplicaPrefix());
  spec.start_revision = from_revision;
  uint64_t generation;
  etcd::WatchId old;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    generation = ++watch_generation_;
    old = watch_;
    watch_ = 0;
  }
  if (old != 0) etcd_->watches().Cancel(old);
  etcd::WatchId id = etcd_->watches().Watch(
      spec, [this, generation](absl::StatusOr<etcd::WatchBatch> batch) {
        {
          absl::MutexLock l(&mu_);
          if (stopped_ || generation != watch_generation_) return;
        }
        OnWatch(std::move(batch));
      });
  bool cancel = false;
  {
    absl::MutexLock l(&mu_);
    if (stopped_ || generation != watch_generation_) {
      cancel = true;
    } else {
      watch_ = id;
    }
  }
  if (cancel) etcd_->watches().Cancel(id);
}

void ReplicaSet::OnWatch(absl::StatusOr<etcd::WatchBatch> batch) {
  bool changed = false;
  {
    absl::MutexLock l(&mu_);
    if (!batch.ok()) {
      // Compacted past us, or cancelled by etcd: read the set again (next tick).
      std::fprintf(stderr, "holdfastd: replica watch ended (%s); reading the set again\n",
                   batch.status().ToString().c_str());
      watch_ = 0;
      ++watch_generation_;
      return;
    }
    for (const auto& e : batch->events) {
      const bool put = e.type() == mvccpb::Event::PUT;
      changed = ApplyLocked(e.kv().key(), put ? &e.kv().value() : nullptr) || changed;
      // Our own key gone (our lease expired; etcd 3.4 may still have answered the
      // keepalive): register again on the next tick.
      if (!put && lease_ != 0 && keyspace::ParseReplicaKey(e.kv().key()) == lease_) {
        std::fprintf(stderr, "holdfastd: replica key %016llx was deleted; registering again\n",
                     static_cast<unsigned long long>(lease_));
        lease_ = 0;
        published_.clear();
      }
    }
  }
  if (changed) PushView();
}

bool ReplicaSet::ApplyLocked(const std::string& key, const std::string* value) {
  auto id = keyspace::ParseReplicaKey(key);
  if (!id) return false;
  if (value == nullptr) return records_.erase(*id) > 0;
  records::ReplicaRecord rec;
  if (!rec.ParseFromString(*value)) return false;  // a newer replica's format: ignored
  records_[*id] = std::move(rec);
  return true;
}

RateLimiter::PeerView ReplicaSet::ViewLocked() const {
  RateLimiter::PeerView view;
  view.replicas = static_cast<int>(records_.size()) + (records_.count(lease_) ? 0 : 1);
  for (const auto& [id, rec] : records_) {
    for (const auto& [ns, demand] : rec.demand()) {
      if (id == lease_) {
        view.self[ns] = demand;
      } else {
        view.others[ns].push_back(demand);
      }
    }
  }
  return view;
}

void ReplicaSet::PushView() {
  // Under mu_, so views reach the limiter in the order they were seen.
  absl::MutexLock l(&mu_);
  limiter_->SetView(ViewLocked());
}

}  // namespace holdfast::server
