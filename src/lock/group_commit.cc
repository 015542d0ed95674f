#include "lock/group_commit.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

namespace {
// The key a put writes (nullptr for any other op).
const std::string* PutKey(const pb::RequestOp& op) {
  return op.has_request_put() ? &op.request_put().key() : nullptr;
}
}  // namespace

GroupCommit::GroupCommit(etcd::Client* etcd, GroupCommitOptions options, BatchObserver observer)
    : etcd_(etcd), options_(options), observer_(std::move(observer)) {}

void GroupCommit::Txn(Footprint footprint, pb::TxnRequest txn, etcd::Deadline d,
                      etcd::Callback<pb::TxnResponse> done) {
  std::vector<Batch> out;
  {
    absl::MutexLock l(&mu_);
    queue_.push_back(Member{std::move(footprint), std::move(txn), d, std::move(done)});
    out = TakeLocked();
  }
  for (auto& b : out) Send(std::move(b));
}

std::vector<GroupCommit::Batch> GroupCommit::TakeLocked() {
  std::vector<Batch> out;
  while (in_flight_ < options_.max_in_flight && !queue_.empty()) {
    Batch batch;
    std::set<std::pair<std::string, std::string>> keys;
    std::set<int64_t> sessions;
    int compares = 0, ops = 0;
    for (auto it = queue_.begin(); it != queue_.end() &&
                                   static_cast<int>(batch.size()) < options_.max_members;) {
      const auto& f = it->footprint;
      const int c = it->txn.compare_size(), o = it->txn.success_size();
      const bool conflicts =
          keys.count({f.ns, f.lock_key}) > 0 || sessions.count(f.session) > 0;
      const bool fits = batch.empty() || (compares + c <= options_.max_txn_ops &&
                                          ops + o <= options_.max_txn_ops);
      if (conflicts || !fits) {
        ++it;  // a later batch takes it, in queue order
        continue;
      }
      keys.insert({f.ns, f.lock_key});
      sessions.insert(f.session);
      compares += c;
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

void GroupCommit::Send(Batch batch) {
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
  // Merged: all compares; all success ops, a key put by several members once.
  // origin[i] lists, for member i, the index of each of its ops in the merged list.
  pb::TxnRequest merged;
  std::vector<std::vector<int>> origin(batch.size());
  std::map<std::string, int> put_at;
  etcd::Deadline deadline = batch.front().deadline;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& txn = batch[i].txn;
    deadline = std::min(deadline, batch[i].deadline);
    for (const auto& c : txn.compare()) *merged.add_compare() = c;
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
                 for (auto& m : members) m.done(t.status());
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
