#include "lock/forced_holds.h"

#include <cstdio>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "etcd/watch_hub.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;
using Clock = std::chrono::steady_clock;

struct ForcedHolds::State : std::enable_shared_from_this<State> {
  explicit State(etcd::Client* e) : etcd(e) {}

  using SessionKey = std::pair<std::string, int64_t>;  // (namespace, session)

  etcd::Client* const etcd;
  // Held by the rewatch timer while it starts a watch, and by Stop: a watch is
  // never started on a client that Stop's caller is about to destroy.
  absl::Mutex start_mu;
  mutable absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  etcd::WatchId watch ABSL_GUARDED_BY(mu) = 0;
  // Each session's ended holds, oldest first; and every entry's session in the
  // order noted, for pruning the oldest.
  std::map<SessionKey, std::deque<v1::EndedHold>> by_session ABSL_GUARDED_BY(mu);
  std::deque<std::pair<SessionKey, Clock::time_point>> order ABSL_GUARDED_BY(mu);

  void PruneLocked(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!order.empty() &&
           (order.size() > kMaxEntries || now - order.front().second > kKeep)) {
      auto it = by_session.find(order.front().first);
      if (it != by_session.end()) {
        it->second.pop_front();
        if (it->second.empty()) by_session.erase(it);
      }
      order.pop_front();
    }
  }

  void Note(const std::string& ns, int64_t session, v1::EndedHold ended) {
    absl::MutexLock l(&mu);
    const auto now = Clock::now();
    by_session[{ns, session}].push_back(std::move(ended));
    order.emplace_back(SessionKey{ns, session}, now);
    PruneLocked(now);
  }

  void Watch() {
    etcd::WatchSpec spec;
    spec.key = keyspace::ForceRequestPrefix();
    spec.range_end = keyspace::PrefixEnd(keyspace::ForceRequestPrefix());
    spec.prev_kv = true;
    spec.no_put = true;
    std::weak_ptr<State> weak = shared_from_this();
    etcd::WatchId id = etcd->watches().Watch(spec, [weak](absl::StatusOr<etcd::WatchBatch> b) {
      if (auto self = weak.lock()) self->OnBatch(std::move(b));
    });
    bool cancel = false;
    {
      absl::MutexLock l(&mu);
      if (stopped) {
        cancel = true;
      } else {
        watch = id;
      }
    }
    if (cancel) etcd->watches().Cancel(id);
  }

  void OnBatch(absl::StatusOr<etcd::WatchBatch> batch) {
    if (!batch.ok()) {
      std::fprintf(stderr,
                   "holdfastd: force-request watch ended (%s); watching again in %llds, "
                   "requests deleted meanwhile are not told to their holders\n",
                   batch.status().ToString().c_str(),
                   static_cast<long long>(kRewatchAfter.count()));
      {
        absl::MutexLock l(&mu);
        if (stopped) return;
        watch = 0;
      }
      std::weak_ptr<State> weak = shared_from_this();
      etcd->timers().ScheduleAfter(kRewatchAfter, [weak] {
        if (auto self = weak.lock()) {
          absl::MutexLock start(&self->start_mu);
          {
            absl::MutexLock l(&self->mu);
            if (self->stopped) return;
          }
          self->Watch();
        }
      });
      return;
    }
    for (const auto& e : batch->events) {
      if (e.type() != mvccpb::Event::DELETE || !e.has_prev_kv()) continue;
      records::ForceRequestRecord rec;
      if (!rec.ParseFromString(e.prev_kv().value())) continue;
      const std::string id(e.kv().key().substr(keyspace::ForceRequestPrefix().size()));
      CheckHold(std::move(rec), id, e.kv().mod_revision());
    }
  }

  // The request was deleted at `revision`: was the hold it named gone by then?
  void CheckHold(records::ForceRequestRecord rec, std::string id, int64_t revision) {
    {
      absl::MutexLock l(&mu);
      if (stopped) return;
    }
    pb::RangeRequest r;
    r.set_key(keyspace::HoldKey(rec.ns(), rec.lock_key(), rec.session_id()));
    r.set_revision(revision);
    std::weak_ptr<State> weak = shared_from_this();
    etcd->Range(std::move(r), etcd::DeadlineIn(std::chrono::seconds(5)),
                [weak, rec = std::move(rec), id = std::move(id)](
                    absl::StatusOr<pb::RangeResponse> got) {
                  auto self = weak.lock();
                  if (!self || !got.ok()) return;  // compacted or unreachable: best effort
                  if (got->kvs_size() > 0 &&
                      got->kvs(0).create_revision() == rec.grant_revision()) {
                    return;  // the request expired; the hold is still there
                  }
                  v1::EndedHold ended;
                  ended.set_lock_key(rec.lock_key());
                  ended.set_token(rec.token());
                  ended.set_reason(absl::StrCat("force-released (request ", id, ", requested by ",
                                                rec.requester(), ": ", rec.reason(), ")"));
                  self->Note(rec.ns(), rec.session_id(), std::move(ended));
                });
  }
};

ForcedHolds::ForcedHolds(etcd::Client* etcd) : state_(std::make_shared<State>(etcd)) {
  state_->Watch();
}

ForcedHolds::~ForcedHolds() { Stop(); }

void ForcedHolds::Stop() {
  absl::MutexLock start(&state_->start_mu);  // a rewatch under way has started
  etcd::WatchId id;
  {
    absl::MutexLock l(&state_->mu);
    state_->stopped = true;
    id = state_->watch;
    state_->watch = 0;
  }
  if (id != 0) state_->etcd->watches().Cancel(id);
}

std::vector<v1::EndedHold> ForcedHolds::For(const std::string& ns, int64_t session) const {
  absl::MutexLock l(&state_->mu);
  state_->PruneLocked(Clock::now());
  auto it = state_->by_session.find({ns, session});
  if (it == state_->by_session.end()) return {};
  return std::vector<v1::EndedHold>(it->second.begin(), it->second.end());
}

void ForcedHolds::Note(const std::string& ns, int64_t session, v1::EndedHold ended) {
  state_->Note(ns, session, std::move(ended));
}

}  // namespace holdfast::lock
