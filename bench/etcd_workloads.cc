#include "bench/etcd_workloads.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace holdfast::bench {

namespace {

namespace pb = ::etcdserverpb;

constexpr std::chrono::seconds kEtcdCallTimeout{5};
constexpr int kSetupThreads = 32;
constexpr std::chrono::milliseconds kPacerTick{5};
constexpr std::chrono::seconds kDrainTimeout{10};
// About the size of a HoldRecord: class id, identity, epoch.
const std::string kValue(64, 'v');

pb::Compare CreateRevisionIs(const std::string& key, int64_t revision) {
  pb::Compare c;
  c.set_result(pb::Compare::EQUAL);
  c.set_target(pb::Compare::CREATE);
  c.set_key(key);
  c.set_create_revision(revision);
  return c;
}

pb::RequestOp PutOp(const std::string& key, int64_t lease) {
  pb::RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(kValue);
  put->set_lease(lease);
  return op;
}

pb::RequestOp DeleteOp(const std::string& key) {
  pb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return op;
}

std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // the whole key space
}

// Runs a guarded txn: OK when it committed, ABORTED when its compare failed.
absl::StatusOr<pb::TxnResponse> GuardedTxn(etcd::Client& client, pb::Compare compare,
                                           pb::RequestOp op) {
  pb::TxnRequest req;
  *req.add_compare() = std::move(compare);
  *req.add_success() = std::move(op);
  auto r = client.TxnSync(std::move(req), etcd::DeadlineIn(kEtcdCallTimeout));
  if (!r.ok()) return r.status();
  if (!r->succeeded()) return absl::AbortedError("guarded txn: compare failed");
  return r;
}

class GuardedTxnWorker : public Worker {
 public:
  GuardedTxnWorker(etcd::Client* client, std::string prefix)
      : client_(client), prefix_(std::move(prefix)) {}

  absl::Status Op() override {
    std::string key = absl::StrCat(prefix_, next_++);
    return GuardedTxn(*client_, CreateRevisionIs(key, 0), PutOp(key, 0)).status();
  }

 private:
  etcd::Client* const client_;
  const std::string prefix_;
  int64_t next_ = 0;
};

class RawCycleWorker : public Worker {
 public:
  RawCycleWorker(etcd::Client* client, std::string key, int64_t lease)
      : client_(client), key_(std::move(key)), lease_(lease) {}

  absl::Status Op() override {
    auto grant = GuardedTxn(*client_, CreateRevisionIs(key_, 0), PutOp(key_, lease_));
    if (!grant.ok()) return grant.status();
    int64_t grant_rev = grant->header().revision();
    return GuardedTxn(*client_, CreateRevisionIs(key_, grant_rev), DeleteOp(key_)).status();
  }

 private:
  etcd::Client* const client_;
  const std::string key_;
  const int64_t lease_;
};

// etcd v3lock. A cycle worker measures Lock+Unlock; a waiting worker measures
// Lock alone (the wait for the hand-over) and unlocks after it.
class V3LockWorker : public Worker {
 public:
  V3LockWorker(v3lockpb::Lock::Stub* stub, std::string name, int64_t lease,
               std::chrono::milliseconds wait, bool measure_lock_only)
      : stub_(stub),
        name_(std::move(name)),
        lease_(lease),
        wait_(wait),
        measure_lock_only_(measure_lock_only) {}

  absl::Status Op() override {
    v3lockpb::LockRequest req;
    req.set_name(name_);
    req.set_lease(lease_);
    v3lockpb::LockResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + wait_);
    auto s = FromGrpcStatus(stub_->Lock(&ctx, req, &resp));
    if (!s.ok()) return s;
    locked_key_ = resp.key();
    return measure_lock_only_ ? absl::OkStatus() : AfterOp();
  }

  absl::Status AfterOp() override {
    if (locked_key_.empty()) return absl::OkStatus();
    v3lockpb::UnlockRequest req;
    req.set_key(std::move(locked_key_));
    locked_key_.clear();
    v3lockpb::UnlockResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kEtcdCallTimeout);
    return FromGrpcStatus(stub_->Unlock(&ctx, req, &resp));
  }

 private:
  v3lockpb::Lock::Stub* const stub_;
  const std::string name_;
  const int64_t lease_;
  const std::chrono::milliseconds wait_;
  const bool measure_lock_only_;
  std::string locked_key_;  // held, not yet unlocked
};

class KeepAliveWorker : public Worker {
 public:
  KeepAliveWorker(etcd::Client* client, int64_t lease) : client_(client), lease_(lease) {}

  absl::Status Op() override {
    auto r = etcd::Await<pb::LeaseKeepAliveResponse>(
        [this](etcd::Callback<pb::LeaseKeepAliveResponse> cb) {
          client_->KeepAlive(lease_, etcd::DeadlineIn(kEtcdCallTimeout), std::move(cb));
        });
    if (!r.ok()) return r.status();
    if (r->ttl() <= 0) return absl::NotFoundError(absl::StrCat("lease ", lease_, " is gone"));
    return absl::OkStatus();
  }

 private:
  etcd::Client* const client_;
  const int64_t lease_;
};

// Shared by the pacer and the renewal callbacks of RunPacedKeepAlive.
struct PacedState {
  SteadyClock::time_point begin;  // immutable once renewals start
  SteadyClock::time_point end;
  absl::Mutex mu;
  std::vector<bool> outstanding ABSL_GUARDED_BY(mu);
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  SeriesResult result ABSL_GUARDED_BY(mu);
  LatencySamples samples ABSL_GUARDED_BY(mu);

  // A renewal of lease `index`, sent at `sent`, was answered (or failed).
  void Done(size_t index, SteadyClock::time_point sent,
            const absl::StatusOr<pb::LeaseKeepAliveResponse>& r) {
    auto now = SteadyClock::now();
    absl::MutexLock l(&mu);
    outstanding[index] = false;
    --in_flight;
    if (now < begin || now > end) return;
    if (r.ok() && r->ttl() > 0) {
      ++result.ops;
      samples.Add(now - sent);
    } else if (!r.ok() && r.status().code() == absl::StatusCode::kDeadlineExceeded) {
      ++result.timeouts;
    } else {
      ++result.errors;
      if (result.first_error.empty()) {
        result.first_error = r.ok() ? "lease gone (TTL 0)" : r.status().ToString();
      }
    }
  }
};

// Sends the renewals that are due; returns when the next one is due.
SteadyClock::time_point SendDue(etcd::Client& client, const std::vector<int64_t>& leases,
                                std::chrono::milliseconds period,
                                std::vector<SteadyClock::time_point>& next,
                                const std::shared_ptr<PacedState>& state) {
  auto now = SteadyClock::now();
  auto earliest = now + period;
  std::vector<size_t> due;
  {
    absl::MutexLock l(&state->mu);
    for (size_t i = 0; i < leases.size(); ++i) {
      if (next[i] <= now && !state->outstanding[i]) {
        state->outstanding[i] = true;
        ++state->in_flight;
        next[i] = now + period;
        due.push_back(i);
      }
      // A lease with a renewal outstanding is looked at again on the next tick.
      if (!state->outstanding[i]) earliest = std::min(earliest, next[i]);
    }
  }
  for (size_t i : due) {
    client.KeepAlive(leases[i], etcd::DeadlineIn(kEtcdCallTimeout),
                     [state, i, now](absl::StatusOr<pb::LeaseKeepAliveResponse> r) {
                       state->Done(i, now, r);
                     });
  }
  return earliest;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdPool>> EtcdPool::Create(const std::string& endpoint,
                                                           int max_workers,
                                                           const std::string& prefix) {
  std::unique_ptr<EtcdPool> pool(new EtcdPool());
  pool->prefix_ = prefix;
  pool->timers_ = std::make_shared<TimerQueue>();
  int n = std::max(1, (max_workers + kCallersPerEtcdClient - 1) / kCallersPerEtcdClient);
  for (int i = 0; i < n; ++i) {
    etcd::ClientOptions o;
    o.endpoints = {endpoint};
    auto c = etcd::Client::Create(o, pool->timers_);
    if (!c.ok()) return c.status();
    pool->clients_.push_back(std::move(*c));
    pool->lock_stubs_.push_back(v3lockpb::Lock::NewStub(
        grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials())));
  }
  return pool;
}

EtcdPool::~EtcdPool() {
  clients_.clear();  // each waits for its calls in flight
  lock_stubs_.clear();
  timers_.reset();
}

etcd::Client& EtcdPool::client(int worker) {
  return *clients_[(worker / kCallersPerEtcdClient) % clients_.size()];
}

v3lockpb::Lock::Stub& EtcdPool::lock_stub(int worker) {
  return *lock_stubs_[(worker / kCallersPerEtcdClient) % lock_stubs_.size()];
}

absl::StatusOr<std::vector<int64_t>> EtcdPool::GrantLeases(int64_t n, int64_t ttl_s,
                                                           SteadyClock::time_point deadline,
                                                           const StopFlag& stop) {
  std::vector<int64_t> leases(n, 0);
  absl::Mutex mu;
  absl::Status first_error;
  int64_t ran = ParallelFor(n, kSetupThreads, deadline, stop, [&](int64_t i) {
    pb::LeaseGrantRequest req;
    req.set_ttl(ttl_s);
    auto r = client(static_cast<int>(i)).LeaseGrantSync(req, etcd::DeadlineIn(kEtcdCallTimeout));
    if (r.ok() && r->error().empty()) {
      leases[i] = r->id();
      return;
    }
    absl::MutexLock l(&mu);
    if (first_error.ok()) {
      first_error = r.ok() ? absl::InternalError(absl::StrCat("lease grant: ", r->error()))
                           : r.status();
    }
  });
  absl::Status s = first_error;
  if (s.ok() && ran < n) {
    s = absl::DeadlineExceededError(absl::StrCat("granted ", ran, " of ", n, " leases in time"));
  }
  if (s.ok()) return leases;
  leases.erase(std::remove(leases.begin(), leases.end(), 0), leases.end());
  RevokeLeases(leases, SteadyClock::now() + kEtcdCallTimeout);
  return s;
}

void EtcdPool::RevokeLeases(const std::vector<int64_t>& leases,
                            SteadyClock::time_point deadline) {
  StopFlag never;
  ParallelFor(static_cast<int64_t>(leases.size()), kSetupThreads, deadline, never,
              [&](int64_t i) {
                pb::LeaseRevokeRequest req;
                req.set_id(leases[i]);
                (void)etcd::Await<pb::LeaseRevokeResponse>(
                    [&](etcd::Callback<pb::LeaseRevokeResponse> cb) {
                      client(static_cast<int>(i))
                          .LeaseRevoke(req, etcd::DeadlineIn(kEtcdCallTimeout), std::move(cb));
                    });
              });
}

void EtcdPool::DeletePrefix(const std::string& under) {
  const std::string prefix = prefix_ + under;
  pb::DeleteRangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  (void)clients_[0]->DeleteRangeSync(req, etcd::DeadlineIn(kEtcdCallTimeout));
}

void EtcdPool::Settle(std::chrono::milliseconds period) {
  // Each step must fall in a commit period of its own: a period ends at etcd's
  // next tick after it, at most `period` later.
  const auto past_a_tick = period + period / 2;
  etcd::Client& c = *clients_[0];
  auto failed = [](const char* step, const absl::Status& s) {
    std::fprintf(stderr, "holdfast-bench: settling etcd: %s: %s (the cell starts unsettled)\n",
                 step, s.ToString().c_str());
  };
  std::this_thread::sleep_for(past_a_tick);
  const std::string key = prefix_ + "settle";
  pb::PutRequest put;
  put.set_key(key);
  put.set_value(kValue);
  if (auto r = c.PutSync(put, etcd::DeadlineIn(kEtcdCallTimeout)); !r.ok()) {
    return failed("put", r.status());
  }
  std::this_thread::sleep_for(past_a_tick);
  pb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto lease = c.LeaseGrantSync(grant, etcd::DeadlineIn(kEtcdCallTimeout));
  if (!lease.ok() || !lease->error().empty()) {
    failed("lease grant", lease.ok() ? absl::InternalError(lease->error()) : lease.status());
  }
  std::this_thread::sleep_for(past_a_tick);
  if (lease.ok() && lease->error().empty()) {
    RevokeLeases({lease->id()}, SteadyClock::now() + kEtcdCallTimeout);
  }
  pb::DeleteRangeRequest del;
  del.set_key(key);
  (void)c.DeleteRangeSync(del, etcd::DeadlineIn(kEtcdCallTimeout));
}

std::string GuardedTxnPrefix(const std::string& cell) { return absl::StrCat("txn/", cell, "/"); }

std::vector<std::unique_ptr<Worker>> GuardedTxnWorkers(EtcdPool& pool, int n,
                                                       const std::string& cell) {
  std::vector<std::unique_ptr<Worker>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<GuardedTxnWorker>(
        &pool.client(i), absl::StrCat(pool.prefix(), GuardedTxnPrefix(cell), i, "/")));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> RawCycleWorkers(EtcdPool& pool,
                                                     const std::vector<int64_t>& leases,
                                                     const std::string& cell) {
  std::vector<std::unique_ptr<Worker>> out;
  for (size_t i = 0; i < leases.size(); ++i) {
    int w = static_cast<int>(i);
    out.push_back(std::make_unique<RawCycleWorker>(
        &pool.client(w), absl::StrCat(pool.prefix(), "cycle/", cell, "/", i), leases[i]));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> V3LockWorkers(EtcdPool& pool,
                                                   const std::vector<int64_t>& leases,
                                                   const std::string& cell, bool shared_name,
                                                   std::chrono::milliseconds wait) {
  std::vector<std::unique_ptr<Worker>> out;
  for (size_t i = 0; i < leases.size(); ++i) {
    int w = static_cast<int>(i);
    std::string name = absl::StrCat(pool.prefix(), "v3lock/", cell);
    if (!shared_name) absl::StrAppend(&name, "/", i);
    // Contended: the op is the wait for the lock, as holdfast's contended op.
    out.push_back(
        std::make_unique<V3LockWorker>(&pool.lock_stub(w), name, leases[i], wait, shared_name));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> KeepAliveWorkers(EtcdPool& pool,
                                                      const std::vector<int64_t>& leases) {
  std::vector<std::unique_ptr<Worker>> out;
  for (size_t i = 0; i < leases.size(); ++i) {
    out.push_back(std::make_unique<KeepAliveWorker>(&pool.client(static_cast<int>(i)),
                                                    leases[i]));
  }
  return out;
}

SeriesResult RunPacedKeepAlive(etcd::Client& client, const std::vector<int64_t>& leases,
                               std::chrono::milliseconds ttl, const Timing& timing,
                               const StopFlag& stop) {
  auto state = std::make_shared<PacedState>();
  auto start = SteadyClock::now();
  state->begin = start + timing.warmup;
  state->end = state->begin + timing.measure;
  {
    absl::MutexLock l(&state->mu);
    state->outstanding.assign(leases.size(), false);
  }
  // Spread the first renewals over one period, as sessions opened over time are.
  auto period = std::max<std::chrono::milliseconds>(ttl / 3, std::chrono::milliseconds(1));
  std::vector<SteadyClock::time_point> next(leases.size());
  for (size_t i = 0; i < leases.size(); ++i) {
    next[i] = start + period * static_cast<int64_t>(i) / static_cast<int64_t>(leases.size());
  }
  while (!stop.stopped() && SteadyClock::now() < state->end) {
    auto earliest = SendDue(client, leases, period, next, state);
    stop.SleepUntil(std::min({earliest, SteadyClock::now() + kPacerTick, state->end}));
  }
  absl::MutexLock l(&state->mu);
  state->mu.AwaitWithTimeout(
      absl::Condition(+[](int64_t* n) { return *n == 0; }, &state->in_flight),
      absl::FromChrono(kDrainTimeout));
  SeriesResult r = state->result;
  r.workers = static_cast<int>(leases.size());
  r.seconds = std::chrono::duration<double>(timing.measure).count();
  r.ops_per_sec = r.seconds > 0 ? static_cast<double>(r.ops) / r.seconds : 0;
  r.latency = state->samples.Summarize();
  return r;
}

}  // namespace holdfast::bench
