// The namespace and owner of each session this replica has seen: opened here,
// read from etcd, or shown by an acquire's snapshot. Neither changes for a
// session, so while the session lives its keepalives and releases are checked
// against this table without a read. A session that ended is caught by what
// follows the check: its renewal finds the lease gone (lost), its release finds
// no hold. A session's record goes with its lease: a close, an expiry and a
// rehome's removal of a namespace end both (a namespace cannot be deleted while
// it has sessions). The one exception is an open that commits while a rehome
// removes its namespace, between the removal's read and its delete: the lease
// then outlives the record until its TTL, and a replica that still routes the
// namespace here renews it. That is also what a keepalive stream did before
// this table, once it had verified the session.
//
// Sized for many sessions per replica: one flat table of 32-byte slots, the
// namespaces and identities kept once each however many sessions share them,
// so a live session costs no heap block of its own.
//
// Bounded: at kMaxEntries sessions (or twice as many distinct strings), the half
// least recently used is dropped (sessions that ended elsewhere, expired, or
// renew through other replicas go first), and the strings no entry uses with
// them. A session dropped costs its next keepalive or release one read. A
// renewal that finds the session lost forgets it (Engine::Renew).
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

  void Remember(int64_t session, std::string_view ns, std::string_view identity);
  // Whether `identity` owns the session, when it was seen in `ns`; nullopt when
  // not seen, or seen in another namespace (the caller then reads, and learns
  // it is not there).
  std::optional<bool> IsOwner(int64_t session, std::string_view ns, std::string_view identity);
  // The session was closed here, or found lost.
  void Forget(int64_t session);

  size_t size() const;

 private:
  struct Entry {
    const std::string* ns;
    const std::string* identity;
    uint64_t used;  // use_ when last remembered or asked about
  };
  const std::string* Intern(std::string_view s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the older half of the entries and the strings no one uses any more.
  void DropLeastRecentlyUsed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // node_hash_set: the strings stay where they are as the set grows.
  absl::node_hash_set<std::string> strings_ ABSL_GUARDED_BY(mu_);
  uint64_t use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::lock
