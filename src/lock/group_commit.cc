#include "lock/group_commit.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_set>
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
  std::vector<std::string> compare_keys;
  compare_keys.reserve(txn.compare_size());
  for (const auto& c : txn.compare()) compare_keys.push_back(c.SerializeAsString());
  std::vector<Batch> out;
  {
    absl::MutexLock l(&mu_);
    queue_.push_back(
        Member{std::move(footprint), std::move(txn), std::move(compare_keys), d, std::move(done)});
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
    std::unordered_set<std::string> compared;  // the batch's distinct compares
    int ops = 0;
    for (auto it = queue_.begin(); it != queue_.end() &&
                                   static_cast<int>(batch.size()) < options_.max_members;) {
      const auto& f = it->footprint;
      int c = 0;  // compares this member adds to the batch
      for (const auto& k : it->compare_keys) c += compared.count(k) == 0 ? 1 : 0;
      const int o = it->txn.success_size();
      const bool conflicts =
          keys.count({f.ns, f.lock_key}) > 0 || sessions.count(f.session) > 0;
      const bool fits =
          batch.empty() || (static_cast<int>(compared.size()) + c <= options_.max_txn_ops &&
                            ops + o <= options_.max_txn_ops);
      if (conflicts || !fits) {
        ++it;  // a later batch takes it, in queue order
        continue;
      }
      keys.insert({f.ns, f.lock_key});
      sessions.insert(f.session);
      compared.insert(it->compare_keys.begin(), it->compare_keys.end());
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
