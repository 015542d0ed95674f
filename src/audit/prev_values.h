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
// put of these keys anyway, so it keeps the last value of each live hold and
// session key and gives deletions their previous value itself. A deletion of a key
// put before the auditor started watching (before its term, or before a gap) is
// looked up in etcd at the revision before the deletion: once per such key.
//
// Memory: one etcd KeyValue per live hold and session (their records are small:
// ~150 bytes each with the key). Not thread-safe: the auditor's thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
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
  void Clear() { last_.clear(); }

  size_t size() const { return last_.size(); }
  int64_t lookups() const { return lookups_; }
  int64_t lost() const { return lost_; }

 private:
  std::unordered_map<std::string, mvccpb::KeyValue> last_;
  int64_t lookups_ = 0;
  int64_t lost_ = 0;
};

// Whether `key` is a hold or session key: the keys whose deletions need their
// previous value.
bool NeedsPrevValue(const std::string& key);

}  // namespace holdfast::audit
