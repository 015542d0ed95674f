// What this replica last read of each namespace and session, for Acquire's first
// attempt (acquire_op.cc, "fast grant"): the call builds its grant transaction
// from this guess, with compares that hold only while the guess is still true,
// and the transaction's else branch reads the snapshot that the call then decides
// on as usual. A stale entry so costs nothing but the read every call made before
// (one round trip), and a fresh one saves it.
//
// Each entry is valid "as of" a revision: the namespace record and the session
// record by their mod_revision (compared for equality), the class set by the read
// revision (no class key modified after it), the session's claims as an upper
// bound at a revision (no claim put after it; deletions only lower the count).
//
// Bounded (cleared when full: a miss costs one read); thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lock/snapshot.h"

namespace holdfast::lock {

struct NamespaceView {
  records::NamespaceRecord record;
  int64_t mod_revision = 0;
  std::vector<ClassEntry> classes;
  int64_t classes_revision = 0;  // no class key was modified after it
  uint64_t cluster_id = 0;       // the cluster that answered the read
};

struct SessionView {
  records::SessionRecord record;
  int64_t mod_revision = 0;
  int64_t claims = 0;           // the session has at most this many claims ...
  int64_t claims_revision = 0;  // ... at this revision, and none was put after it
};

class ViewCache {
 public:
  static constexpr size_t kMaxEntries = 100'000;

  // Keeps what a snapshot read for (ns, session) showed.
  void Observe(const std::string& ns, int64_t session, const KeySnapshot& s) {
    absl::MutexLock l(&mu_);
    if (s.namespace_exists) {
      auto& n = Slot(namespaces_, ns);
      // (A restored cluster's revisions go back: a new cluster id replaces all.)
      if (s.revision >= n.classes_revision || s.cluster_id != n.cluster_id) {
        n.record = s.ns_record;
        n.mod_revision = s.ns_mod_revision;
        n.classes = s.classes;
        n.classes_revision = s.revision;
        n.cluster_id = s.cluster_id;
      }
    } else {
      namespaces_.erase(ns);
    }
    if (session == 0) return;
    if (!s.session) {
      sessions_.erase(session);
      return;
    }
    auto& v = Slot(sessions_, session);
    if (s.revision >= v.claims_revision) {
      v.record = *s.session;
      v.mod_revision = s.session_mod_revision;
      v.claims = s.session_claims;
      v.claims_revision = s.revision;
    }
  }

  // A transaction at `revision` put one claim of `session`, guarded by "no claim
  // put after the view's claims_revision", with the view showing `claims_before`.
  void ClaimAdded(int64_t session, int64_t claims_before, int64_t revision) {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end() || it->second.claims_revision >= revision) return;
    it->second.claims = claims_before + 1;
    it->second.claims_revision = revision;
  }

  void Forget(int64_t session) {
    absl::MutexLock l(&mu_);
    sessions_.erase(session);
  }

  std::optional<NamespaceView> Namespace(const std::string& ns) {
    absl::MutexLock l(&mu_);
    auto it = namespaces_.find(ns);
    if (it == namespaces_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<SessionView> Session(int64_t session) {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return std::nullopt;
    return it->second;
  }

 private:
  template <class K, class V>
  static V& Slot(std::map<K, V>& m, const K& k) {
    if (m.size() >= kMaxEntries && m.find(k) == m.end()) m.clear();
    return m[k];
  }

  absl::Mutex mu_;
  std::map<std::string, NamespaceView> namespaces_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, SessionView> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::lock
