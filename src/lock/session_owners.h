// The namespace and owner of each session this replica has seen: opened here,
// read from etcd, or shown by an acquire's snapshot. Both never change for a
// session, so while the session lives its keepalives and releases are checked
// against this table without a read. A session that ended is caught by what
// follows the check: its renewal finds the lease gone (lost), its release finds
// no hold. A namespace cannot be deleted while it has sessions (Registry), so a
// session's record lives exactly as long as its lease.
//
// Sized for many sessions per replica: one flat table of 24-byte slots, the
// namespaces and identities kept once each however many sessions share them,
// so a live session costs no heap block of its own (10,000 sessions of one
// identity take ~0.5 MB less than a std::map of strings, and leave no small
// blocks among the burst of calls that opened them).
//
// Bounded: when kMaxEntries sessions or kMaxStrings distinct strings are held,
// the table starts over empty; a miss costs the caller one read.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::lock {

class SessionOwners {
 public:
  static constexpr size_t kMaxEntries = 200'000;
  static constexpr size_t kMaxStrings = 10'000;

  void Remember(int64_t session, std::string_view ns, std::string_view identity);
  // The session's owner when it was seen in `ns`; nullopt when not seen, or
  // seen in another namespace (the caller then reads, and learns it is not there).
  std::optional<std::string> OwnerIn(int64_t session, std::string_view ns) const;
  // The session was closed here.
  void Forget(int64_t session);

  size_t size() const;

 private:
  struct Entry {
    const std::string* ns;
    const std::string* identity;
  };
  const std::string* Intern(std::string_view s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // node_hash_set: the strings stay where they are as the set grows.
  absl::node_hash_set<std::string> strings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::lock
