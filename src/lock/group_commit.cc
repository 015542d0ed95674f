#include "lock/group_commit.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "etcd/errors.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

namespace {
// The key a put writes (nullptr for any other op).
const std::string* PutKey(const pb::RequestOp& op) {
  return op.has_request_put() ? &op.request_put().key() : nullptr;
}
}  // namespace

GroupCommit::GroupCommit(etcd::Client* etcd, GroupCommitOptions options, BatchObserver observer,
                         RideObserver ride_observer)
    : etcd_(etcd),
      options_(options),
      observer_(std::move(observer)),
      ride_observer_(std::move(ride_observer)) {}

GroupCommit::~GroupCommit() { Stop(); }

void GroupCommit::Stop() {
  std::map<KeyId, std::deque<Waiting>> riders;
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    riders.swap(riders_);
  }
  for (auto& [key, waiting] : riders) {
    for (auto& w : waiting) {
      etcd_->timers().Cancel(w.timer);
      if (ride_observer_) ride_observer_(RideStep::kAlone);
      w.rider.done(absl::UnavailableError("holdfastd is shutting down; the call was not sent"));
    }
  }
}

GroupCommit::Member GroupCommit::MakeMember(Footprint footprint, pb::TxnRequest txn,
                                            etcd::Deadline d,
                                            etcd::Callback<pb::TxnResponse> done) {
  std::vector<std::string> compare_keys;
  compare_keys.reserve(txn.compare_size());
  for (const auto& c : txn.compare()) compare_keys.push_back(c.SerializeAsString());
  return Member{std::move(footprint), std::move(txn), std::move(compare_keys), d, std::move(done),
                {}};
}

void GroupCommit::Txn(Footprint footprint, pb::TxnRequest txn, etcd::Deadline d,
                      etcd::Callback<pb::TxnResponse> done) {
  Member m = MakeMember(std::move(footprint), std::move(txn), d, std::move(done));
  std::vector<Batch> out;
  bool rode = false;
  {
    absl::MutexLock l(&mu_);
    if (m.footprint.release) rode = TakeRiderLocked(&m);
    queue_.push_back(std::move(m));
    out = TakeLocked();
  }
  if (rode && ride_observer_) ride_observer_(RideStep::kRode);
  for (auto& b : out) Send(std::move(b));
}

void GroupCommit::Ride(Footprint footprint, pb::TxnRequest txn, etcd::Deadline d,
                       etcd::Callback<pb::TxnResponse> done, std::chrono::milliseconds at_most) {
  Member m = MakeMember(std::move(footprint), std::move(txn), d, std::move(done));
  if (ride_observer_) ride_observer_(RideStep::kWaiting);
  bool rode = false;
  std::vector<Batch> out;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) {
      // Stopped: nothing waits for a release any more (its timer could outlive
      // the etcd client); it is queued now, as one whose bound passed.
      queue_.push_back(std::move(m));
      out = TakeLocked();
    } else {
      RideLocked(std::move(m), at_most, &rode);
    }
  }
  for (auto& b : out) Send(std::move(b));
  if (rode && ride_observer_) ride_observer_(RideStep::kRode);
}

void GroupCommit::RideLocked(Member m, std::chrono::milliseconds at_most, bool* rode_out) {
  bool rode = false;
  {
    const KeyId key{m.footprint.ns, m.footprint.lock_key};
    auto& waiting = riders_[key];
    // A release of the key that is queued, not sent yet: join it now (unless
    // riders that came first wait for the key).
    for (auto it = queue_.begin(); waiting.empty() && it != queue_.end(); ++it) {
      const Footprint& f = it->footprint;
      if (f.release && it->riders.empty() && f.ns == key.first && f.lock_key == key.second &&
          MayRide(*it, m)) {
        it->riders.push_back(std::move(m));
        rode = true;
        break;
      }
    }
    if (rode) {
      riders_.erase(key);
    } else {
      const uint64_t id = ++next_rider_;
      waiting.push_back(Waiting{std::move(m), id, 0});
      waiting.back().timer =
          etcd_->timers().ScheduleAfter(at_most, [this, key, id] { RiderDue(key, id); });
    }
  }
  *rode_out = rode;
}

void GroupCommit::RiderDue(const KeyId& key, uint64_t id) {
  std::vector<Batch> out;
  {
    absl::MutexLock l(&mu_);
    auto it = riders_.find(key);
    if (it == riders_.end()) return;
    auto& waiting = it->second;
    auto w = std::find_if(waiting.begin(), waiting.end(),
                          [id](const Waiting& x) { return x.id == id; });
    if (w == waiting.end()) return;  // it rode with a release
    queue_.push_back(std::move(w->rider));
    waiting.erase(w);
    if (waiting.empty()) riders_.erase(it);
    out = TakeLocked();
  }
  if (ride_observer_) ride_observer_(RideStep::kAlone);
  for (auto& b : out) Send(std::move(b));
}

bool GroupCommit::MayRide(const Member& host, const Member& rider) const {
  return rider.footprint.session != host.footprint.session && RidesAfter(host.txn, rider.txn) &&
         host.txn.success_size() + rider.txn.success_size() <= options_.max_txn_ops &&
         host.txn.compare_size() + rider.txn.compare_size() <= options_.max_txn_ops;
}

bool GroupCommit::TakeRiderLocked(Member* host) {
  auto it = riders_.find(KeyId{host->footprint.ns, host->footprint.lock_key});
  if (it == riders_.end()) return false;
  Waiting& first = it->second.front();
  Member& rider = first.rider;
  if (!MayRide(*host, rider)) return false;  // it waits on for another release, or its bound
  // A timer that fires anyway finds no such id and does nothing.
  etcd_->timers().Cancel(first.timer);
  host->riders.push_back(std::move(rider));
  it->second.pop_front();
  if (it->second.empty()) riders_.erase(it);
  return true;
}

namespace {
// [key, range_end) of a compare or a range op; an empty range_end is the key alone,
// "\0" is every key from `key` on.
bool InRange(std::string_view k, const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return k == key;
  if (k < key) return false;
  return range_end == std::string_view("\0", 1) || k < range_end;
}
}  // namespace

bool GroupCommit::RidesAfter(const pb::TxnRequest& host, const pb::TxnRequest& rider) {
  // The single keys each one writes; a range delete (or any other op that
  // writes) makes the pair unknown: no. A handful of keys each: views into the
  // requests, compared pairwise (this runs on every release of a contended key).
  auto writes = [](const pb::TxnRequest& txn, std::vector<std::string_view>* keys) {
    keys->reserve(txn.success_size());
    for (const auto& op : txn.success()) {
      if (op.has_request_put()) {
        keys->push_back(op.request_put().key());
      } else if (op.has_request_delete_range()) {
        if (!op.request_delete_range().range_end().empty()) return false;
        keys->push_back(op.request_delete_range().key());
      } else if (!op.has_request_range()) {
        return false;
      }
    }
    return true;
  };
  std::vector<std::string_view> host_writes, rider_writes;
  if (!writes(host, &host_writes) || !writes(rider, &rider_writes)) return false;
  for (const auto& k : rider_writes) {
    if (std::find(host_writes.begin(), host_writes.end(), k) != host_writes.end()) return false;
  }
  for (const auto& c : rider.compare()) {
    for (const auto& k : host_writes) {
      if (InRange(k, c.key(), c.range_end())) return false;
    }
  }
  return true;
}

std::vector<GroupCommit::Batch> GroupCommit::TakeLocked() {
  std::vector<Batch> out;
  while (in_flight_ < options_.max_in_flight && !queue_.empty()) {
    if (queue_.size() == 1) {
      // One unit (a member and its rider) alone: it goes as it is; nothing to
      // count against a batch's bounds or to check for conflicts. This is every
      // transaction of an engine that is not busy.
      Batch batch;
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
      ++in_flight_;
      out.push_back(std::move(batch));
      break;
    }
    Batch batch;
    const etcd::Deadline short_before = std::chrono::system_clock::now() + kShortLeft;
    bool batch_short = false;  // the class of the batch's first unit
    std::set<std::pair<std::string, std::string>> keys;
    std::set<int64_t> sessions;
    std::unordered_set<std::string> compared;  // the batch's distinct compares
    int ops = 0;
    for (auto it = queue_.begin(); it != queue_.end() &&
                                   static_cast<int>(batch.size()) < options_.max_members;) {
      const auto& f = it->footprint;
      // The member and its rider, if any, as one unit.
      int c = 0;  // compares this unit adds to the batch
      int o = it->txn.success_size();
      std::set<std::string> unit_compares;
      for (const auto& k : it->compare_keys) {
        if (compared.count(k) == 0 && unit_compares.insert(k).second) ++c;
      }
      bool conflicts = keys.count({f.ns, f.lock_key}) > 0 || sessions.count(f.session) > 0;
      for (const auto& r : it->riders) {
        for (const auto& k : r.compare_keys) {
          if (compared.count(k) == 0 && unit_compares.insert(k).second) ++c;
        }
        o += r.txn.success_size();
        conflicts = conflicts || sessions.count(r.footprint.session) > 0;
      }
      etcd::Deadline unit_deadline = it->deadline;
      for (const auto& r : it->riders) unit_deadline = std::min(unit_deadline, r.deadline);
      const bool unit_short = unit_deadline < short_before;
      const bool fits =
          batch.empty() || (static_cast<int>(compared.size()) + c <= options_.max_txn_ops &&
                            ops + o <= options_.max_txn_ops && unit_short == batch_short);
      if (conflicts || !fits) {
        ++it;  // a later batch takes it, in queue order
        continue;
      }
      if (batch.empty()) batch_short = unit_short;
      keys.insert({f.ns, f.lock_key});
      sessions.insert(f.session);
      for (const auto& r : it->riders) sessions.insert(r.footprint.session);
      compared.insert(unit_compares.begin(), unit_compares.end());
      ops += o;
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    ++in_flight_;
    out.push_back(std::move(batch));
  }
  return out;
}

void GroupCommit::Sent() {
  std::vector<Batch> out;
  {
    absl::MutexLock l(&mu_);
    --in_flight_;
    out = TakeLocked();
  }
  for (auto& b : out) Send(std::move(b));
}

void GroupCommit::Send(Batch units) {
  // Each rider right after its host: its ops (reads included) after the host's.
  Batch batch;
  for (auto& u : units) {
    std::vector<Member> riders = std::move(u.riders);
    batch.push_back(std::move(u));
    for (auto& r : riders) batch.push_back(std::move(r));
  }
  if (observer_) observer_(static_cast<int>(batch.size()));
  if (batch.size() == 1) {
    Member m = std::move(batch.front());
    etcd_->Txn(std::move(m.txn), m.deadline,
               [this, done = std::move(m.done)](absl::StatusOr<pb::TxnResponse> t) {
                 Sent();
                 done(std::move(t));
               });
    return;
  }
  // Merged: every distinct compare; all success ops, a key put by several members
  // once. origin[i] lists, for member i, the index of each of its ops in the
  // merged list.
  pb::TxnRequest merged;
  std::vector<std::vector<int>> origin(batch.size());
  std::map<std::string, int> put_at;
  std::unordered_set<std::string_view> compared;  // views of the members' keys
  etcd::Deadline deadline = batch.front().deadline;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& txn = batch[i].txn;
    deadline = std::min(deadline, batch[i].deadline);
    for (int c = 0; c < txn.compare_size(); ++c) {
      if (compared.insert(batch[i].compare_keys[c]).second) *merged.add_compare() = txn.compare(c);
    }
    for (const auto& op : txn.success()) {
      if (const std::string* key = PutKey(op)) {
        auto [it, inserted] = put_at.emplace(*key, merged.success_size());
        if (!inserted) {
          origin[i].push_back(it->second);
          continue;
        }
      }
      origin[i].push_back(merged.success_size());
      *merged.add_success() = op;
    }
  }
  auto shared = std::make_shared<Batch>(std::move(batch));
  etcd_->Txn(std::move(merged), deadline,
             [this, shared, origin = std::move(origin)](absl::StatusOr<pb::TxnResponse> t) {
               Sent();
               Batch& members = *shared;
               if (!t.ok()) {
                 if (etcd::WriteOutcomeUnknown(t.status())) {
                   // Maybe committed: each member converges by its own read.
                   for (auto& m : members) m.done(t.status());
                   return;
                 }
                 // Refused as a whole (INVALID_ARGUMENT: a member's own ops, such
                 // as a put and a delete of one key, or a limit of etcd's set below
                 // the bounds assumed here): nothing was applied, so each member
                 // alone, and one member's error stays its own.
                 for (auto& m : members) etcd_->Txn(std::move(m.txn), m.deadline, std::move(m.done));
                 return;
               }
               if (!t->succeeded()) {
                 // Some member's compare failed: each one alone, with its else branch.
                 for (auto& m : members) etcd_->Txn(std::move(m.txn), m.deadline, std::move(m.done));
                 return;
               }
               for (size_t i = 0; i < members.size(); ++i) {
                 pb::TxnResponse own;
                 *own.mutable_header() = t->header();
                 own.set_succeeded(true);
                 for (int at : origin[i]) *own.add_responses() = t->responses(at);
                 members[i].done(std::move(own));
               }
             });
}

}  // namespace holdfast::lock
