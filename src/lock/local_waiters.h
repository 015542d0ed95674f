// The waiting Acquire calls of this replica, by the hold key that a hand-over to
// them puts. A release on this replica whose transaction hands the lock over tells
// those waiters at once, from the committed transaction, instead of leaving them to
// etcd's watch: a watch created at a revision that etcd has already passed is
// served by etcd's background sync, which runs every 100 ms, and one such waiter
// stalls a whole queue for that long. The watch still answers a hand-over made
// by another replica (or any this table misses); a waiter answers once, whichever
// comes first (acquire_op.cc). The last hand-overs are kept for a waiter that
// registers only after the release committed (it read just before the commit):
// Recent() answers it, for the etcd cluster and epoch the waiter read; they are
// dropped when a restore is detected (Engine::ForgetHistory), and a release
// answered after that but sent before tells and keeps nothing.
//
// A waiter is told only of hand-overs after the revision it read at. The release's
// answer can come later than the watch event of its own commit: the session handed
// the key may have seen its hold on the watch, released it and queued again on the
// same key (the same hold key) before the releasing call gets here, and that older
// hand-over must not answer the new wait with a token already released.
//
// Thread-safe. Callbacks run on the releasing call's thread, outside the lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lock/records.pb.h"

namespace holdfast::lock {

class LocalWaiters {
 public:
  // Called with the hold's create revision (the releasing commit's), its record,
  // and the id of the etcd cluster that committed it.
  using Handed = std::function<void(int64_t create_revision, const records::HoldRecord&,
                                    uint64_t cluster_id)>;
  struct Handover {
    int64_t revision = 0;
    records::HoldRecord rec;
    uint64_t cluster_id = 0;
  };

  // A waiter for `hold_key` that read the key at `read_revision`.
  uint64_t Add(const std::string& hold_key, int64_t read_revision, Handed cb) {
    absl::MutexLock l(&mu_);
    const uint64_t id = ++next_id_;
    by_id_[id] = by_key_.emplace(hold_key, Waiter{id, read_revision, std::move(cb)});
    return id;
  }

  void Remove(uint64_t id) {
    absl::MutexLock l(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;
    by_key_.erase(it->second);
    by_id_.erase(it);
  }

  // Of what is kept now: taken before the request whose answer is passed to
  // HandedOver.
  uint64_t Generation() {
    absl::MutexLock l(&mu_);
    return generation_;
  }

  // A committed transaction of cluster `cluster_id` put `hold_key` (a new hold) at
  // `revision`. Returns how many waiters were told. `generation`: Generation()
  // before the transaction was sent; one sent before ForgetRecent may have
  // committed in the history a restore took back, and nobody is told of it,
  // nor is it kept (a waiter learns of a hand-over that stands from the watch
  // or its read).
  int HandedOver(const std::string& hold_key, int64_t revision, const records::HoldRecord& rec,
                 uint64_t cluster_id, uint64_t generation) {
    std::vector<Handed> told;
    {
      absl::MutexLock l(&mu_);
      if (generation != generation_) return 0;
      auto& kept = recent_[hold_key];
      // The newest, or one of another cluster (after a restore with a new id, its
      // revisions start again below the kept ones).
      if (kept.handover.revision < revision || kept.handover.cluster_id != cluster_id) {
        kept = Kept{{revision, rec, cluster_id}, ++seq_};
        order_.emplace_back(hold_key, kept.seq);
        while (order_.size() > kRecent) {
          // Only the newest entry of a key counts: older ones are stale.
          auto old = recent_.find(order_.front().first);
          if (old != recent_.end() && old->second.seq == order_.front().second) {
            recent_.erase(old);
          }
          order_.pop_front();
        }
      }
      auto [b, e] = by_key_.equal_range(hold_key);
      for (auto it = b; it != e; ++it) {
        if (it->second.read_revision < revision) told.push_back(it->second.cb);
      }
    }
    for (auto& cb : told) cb(revision, rec, cluster_id);
    return static_cast<int>(told.size());
  }

  // The last hand-over that put `hold_key` after `revision` in a commit of etcd
  // cluster `cluster_id` under epoch `epoch` (the cluster and epoch record the
  // waiter read), if still kept. Any other is not this history: after a restore
  // revisions start again below ones kept here (with a new cluster id, or with
  // the id kept, and then an advance to a new epoch before any grant), and that
  // hold is not in etcd. (A hand-over committed after an advance would have
  // failed its compare on the epoch record.)
  std::optional<Handover> Recent(const std::string& hold_key, int64_t revision,
                                 uint64_t cluster_id, int32_t epoch) {
    absl::MutexLock l(&mu_);
    auto it = recent_.find(hold_key);
    if (it == recent_.end() || it->second.handover.revision <= revision ||
        it->second.handover.cluster_id != cluster_id ||
        it->second.handover.rec.epoch() != epoch) {
      return std::nullopt;
    }
    return it->second.handover;
  }

  // Drops every kept hand-over: etcd went back in its history (a restore that
  // kept the cluster id, once detected), so their revisions may come round again
  // for other commits.
  void ForgetRecent() {
    absl::MutexLock l(&mu_);
    ++generation_;
    recent_.clear();
    order_.clear();
  }

  size_t size() {
    absl::MutexLock l(&mu_);
    return by_id_.size();
  }

 private:
  static constexpr size_t kRecent = 4096;
  struct Waiter {
    uint64_t id = 0;
    int64_t read_revision = 0;
    Handed cb;
  };
  using ByKey = std::multimap<std::string, Waiter>;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // ForgetRecent's count
  ByKey by_key_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ByKey::iterator> by_id_ ABSL_GUARDED_BY(mu_);
  struct Kept {
    Handover handover;
    uint64_t seq = 0;
  };
  std::map<std::string, Kept> recent_ ABSL_GUARDED_BY(mu_);
  // (key, seq) of every hand-over kept, oldest first; stale pairs are skipped.
  std::deque<std::pair<std::string, uint64_t>> order_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::lock
