// The previous value of a deleted hold or session key, without asking etcd for it
// on every event.
//
// The audit needs, for each deletion of a hold key, the hold it ended (its token
// is the key's create revision; the holder's identity and `advisory` are in its
// value), and for each deletion of a session key whether the session was closing.
// etcd's watch can attach that previous value to every event (prev_kv), but etcd
// 3.4 reads it with one backend read per event, each copying its read buffer, for
// every key under /holdfast/ (waiters, claims and audit marks too): about five
// reads per lock cycle, taken from the lock calls' CPU. The auditor sees every
// put of these keys anyway, so it keeps what it needs of each live hold and
// session and gives deletions their previous value itself. A deletion of a key
// put before the auditor started watching (before its term, or before a gap) is
// looked up in etcd at the revision before the deletion: once per such key.
//
// Sessions: only the leases of sessions marked closing are kept (a close marks its
// session just before deleting it), not an entry per live session (10,000
// sessions must stay under 1 KiB each in all of holdfastd; an entry each cost ~85
// bytes). A session deletion that ends none of its holds in the same revision
// needs nothing; one that does and is not marked closing here is looked up: one
// read per session that expired holding locks.
//
// Memory: per live hold its key, create revision, identity, epoch and advisory
// flag (~150 bytes; not its holder_meta); per closing session its lease. Not
// thread-safe: the auditor's thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace holdfast::audit {

class PrevValues {
 public:
  // The key's value at `revision` (nullopt: it did not exist then), or an error:
  // OUT_OF_RANGE when etcd compacted that revision, anything else when etcd could
  // not answer now.
  using Lookup = std::function<absl::StatusOr<std::optional<mvccpb::KeyValue>>(
      const std::string& key, int64_t revision)>;

  // Walks `events` (in revision order, continuing the events of earlier calls):
  // remembers each put of a hold or session key, and gives each deletion of one
  // that has no prev_kv the value remembered, or else the one `lookup` finds at
  // the revision before it. A value compacted away leaves the deletion without
  // one (Classify records the event without holder and token; counted in
  // `lost()`). Any other lookup error stops the walk and is returned: call again
  // on the same events later. Calling it again on events already walked (a batch
  // the store refused, retried) changes nothing more.
  absl::Status Fill(std::vector<mvccpb::Event>* events, const Lookup& lookup);

  // Forgets everything (the next events do not continue the last ones: a gap).
  void Clear() {
    holds_.clear();
    closing_.clear();
  }

  size_t size() const { return holds_.size() + closing_.size(); }
  int64_t lookups() const { return lookups_; }
  int64_t lost() const { return lost_; }

 private:
  struct Hold {
    int64_t create_revision = 0;
    std::string value;  // a HoldRecord with what the audit reads of it
  };
  std::unordered_map<std::string, Hold> holds_;  // by hold key
  std::unordered_set<int64_t> closing_;          // leases of sessions marked closing
  int64_t lookups_ = 0;
  int64_t lost_ = 0;
};

}  // namespace holdfast::audit
