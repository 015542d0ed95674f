// What this replica last read of each namespace and session, for Acquire's first
// attempt (acquire_op.cc, "fast grant"): the call builds its grant transaction
// from this guess, with compares that hold only while the guess is still true,
// and the transaction's else branch reads the snapshot that the call then decides
// on as usual. A stale entry so costs nothing but the read every call made before
// (one round trip), and a fresh one saves it.
//
// Each entry is valid "as of" a revision: the namespace record and the session
// record by their mod_revision (compared for equality), the class set by the read
// revision (no class key modified after it; a class deleted before it may still be
// listed, since an enqueue from the views carries the set forward without reading
// it, and a range compare cannot see a deletion: every use compares the class it
// resolves), the session's claims as an upper bound at a revision (no claim put
// after it; deletions only lower the count).
//
// A key's view serves Release's first attempt (engine.cc): a release that hands
// the key over plans the hand-over from it, with compares that hold only while it
// is true, instead of failing a "no waiter" compare and deciding on the else
// branch's read. It knows every hold of the key as of `holds_revision` (no hold
// created after it but those listed) and every waiter created up to
// `waiters_revision` (some may have left since; later ones may be missing, and are
// never handed the key from the view, so the queue's order holds). Only a read of
// the whole queue moves `waiters_revision`: a waiter that joined behind the view's
// last one without reading the queue (lock/queue.h, JoinBehind) is listed past it.
//
// A detected restore clears every view (Clear) and starts a new generation. An
// answer to a request sent before that (a read or a commit of the history the
// restore took back) may arrive after it: every change to the views names the
// generation its request was sent under (Generation(), taken before the read or
// the plan on the views), and one of an older generation changes nothing, or
// forgets what it would have changed. Revisions cannot tell the two histories
// apart: the lost one's may be higher than any the restored cluster has reached.
//
// Bounded (cleared when full: a miss costs one read); thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lock/queue.h"
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
  uint64_t cluster_id = 0;      // the cluster that answered the read
};

struct KeyView {
  int64_t holds_revision = 0;
  int64_t waiters_revision = 0;
  std::vector<HoldEntry> holds;      // in key order
  std::vector<WaiterEntry> waiters;  // in queue order
  uint64_t cluster_id = 0;           // the cluster that answered the read
};

// What an acquire from the views needs of a key's view (acquire_op.cc, FastStart),
// without a copy of its waiters (a record each: 255 with 256 clients on a key).
struct KeyGlance {
  bool held_by_other = false;  // a hold of another session
  bool mine = false;           // a hold or a waiter of the asking session
  size_t waiters = 0;
  // The waiter the call may join behind (lock/queue.h, JoinBehind), and then the
  // key's holds and the live waiters that block the call: who blocks it.
  std::optional<WaiterEntry> behind;
  std::vector<HoldEntry> holds;
  int64_t blocking = 0;
};

class ViewCache {
 public:
  static constexpr size_t kMaxEntries = 100'000;
  static constexpr size_t kMaxKeys = 10'000;

  // --- keys -------------------------------------------------------------------

  // Of the views as they are now: taken before a request whose answer changes
  // them, and passed with the change.
  uint64_t Generation() {
    absl::MutexLock l(&mu_);
    return generation_;
  }

  // A snapshot read of the key (complete as of its revision). A free key is
  // forgotten: only keys with holds have releases to serve.
  void ObserveKey(const std::string& ns, const std::string& key, const KeySnapshot& s,
                  uint64_t generation) {
    absl::MutexLock l(&mu_);
    if (generation != generation_) return;
    const std::string k = KeyId(ns, key);
    if (s.holds.empty()) {
      keys_.erase(k);
      return;
    }
    auto it = keys_.find(k);
    // (A restored cluster's revisions go back: a new cluster id replaces all.)
    if (it != keys_.end() && it->second.cluster_id == s.cluster_id &&
        it->second.holds_revision > s.revision) {
      return;
    }
    auto& v = Slot(keys_, k, kMaxKeys);
    v.holds_revision = v.waiters_revision = s.revision;
    v.holds = s.holds;
    v.waiters = s.waiters;
    v.cluster_id = s.cluster_id;
  }

  std::optional<KeyView> Key(const std::string& ns, const std::string& key) {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(KeyId(ns, key));
    if (it == keys_.end()) return std::nullopt;
    return it->second;
  }

  std::optional<KeyGlance> GlanceKey(const std::string& ns, const std::string& key,
                                     int64_t session, bool shared, int64_t now_ms) {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(KeyId(ns, key));
    if (it == keys_.end()) return std::nullopt;
    const KeyView& v = it->second;
    KeyGlance g;
    for (const auto& h : v.holds) (h.lease == session ? g.mine : g.held_by_other) = true;
    for (const auto& w : v.waiters) g.mine = g.mine || w.lease == session;
    g.waiters = v.waiters.size();
    if (const WaiterEntry* last =
            queue::JoinBehind(v.waiters, v.waiters_revision, shared, now_ms)) {
      g.behind = *last;
      g.holds = v.holds;
      g.blocking = std::count_if(v.waiters.begin(), v.waiters.end(), [&](const WaiterEntry& w) {
        return !queue::Dead(w, now_ms) && (!shared || !w.record.shared());
      });
    }
    return g;
  }

  // Forgets everything: etcd went back in its history (a restore detected),
  // and a view read before could outrank every read of the restored data by
  // its revision, with compares against it that nothing fails.
  void Clear() {
    absl::MutexLock l(&mu_);
    ++generation_;
    namespaces_.clear();
    sessions_.clear();
    keys_.clear();
  }

  void ForgetKey(const std::string& ns, const std::string& key) {
    absl::MutexLock l(&mu_);
    keys_.erase(KeyId(ns, key));
  }

  // A transaction put `w` (a new waiter at w.create_revision, or the same waiter
  // with a new record).
  void WaiterPut(const std::string& ns, const std::string& key, const WaiterEntry& w,
                 uint64_t generation) {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(KeyId(ns, key));
    if (it == keys_.end()) return;
    if (generation != generation_) {  // maybe committed on the restored cluster
      keys_.erase(it);
      return;
    }
    auto& ws = it->second.waiters;
    for (auto& have : ws) {
      if (have.lease != w.lease) continue;
      if (have.create_revision == w.create_revision && have.mod_revision < w.mod_revision) {
        have.record = w.record;
        have.mod_revision = w.mod_revision;
      }
      return;
    }
    // At or below waiters_revision the view saw it (or its removal) already.
    if (w.create_revision <= it->second.waiters_revision) return;
    auto pos = ws.begin();
    while (pos != ws.end() && pos->create_revision < w.create_revision) ++pos;
    ws.insert(pos, w);
  }

  // A transaction removed this waiter (created at `create_revision`).
  void WaiterGone(const std::string& ns, const std::string& key, int64_t lease,
                  int64_t create_revision, uint64_t generation) {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(KeyId(ns, key));
    if (it == keys_.end()) return;
    if (generation != generation_) {  // the restored queue may have it: read again
      keys_.erase(it);
      return;
    }
    std::erase_if(it->second.waiters, [&](const WaiterEntry& w) {
      return w.lease == lease && w.create_revision == create_revision;
    });
  }

  // A release committed at `revision`, planned on `base` and guarded by "no hold
  // created after base.holds_revision": it deleted `releasing`'s hold, the waiters
  // `gone` (by lease) and put `granted` (created at `revision`).
  // `cluster_id`: the commit's (a release committed on another cluster than
  // its plan's leaves no view); `generation`: the plan's (one planned before a
  // restore was found leaves none either).
  void Released(const std::string& ns, const std::string& key, const KeyView& base,
                int64_t releasing, const std::vector<int64_t>& gone,
                const std::vector<HoldEntry>& granted, int64_t revision, uint64_t cluster_id,
                uint64_t generation) {
    absl::MutexLock l(&mu_);
    const std::string k = KeyId(ns, key);
    if (cluster_id != base.cluster_id || generation != generation_) {
      keys_.erase(k);
      return;
    }
    auto it = keys_.find(k);
    KeyView v;
    if (it != keys_.end() && it->second.cluster_id == base.cluster_id &&
        it->second.holds_revision >= base.holds_revision) {
      if (it->second.holds_revision >= revision) return;  // read at or after the release
      v = std::move(it->second);  // knows at least what base knew of the holds
    } else {
      v = base;
    }
    std::erase_if(v.holds, [&](const HoldEntry& h) { return h.lease == releasing; });
    std::erase_if(v.waiters, [&](const WaiterEntry& w) {
      return std::find(gone.begin(), gone.end(), w.lease) != gone.end();
    });
    for (const auto& h : granted) {
      auto pos = v.holds.begin();  // key order: the hold keys end in the lease, %016x
      while (pos != v.holds.end() && pos->lease < h.lease) ++pos;
      v.holds.insert(pos, h);
    }
    v.holds_revision = revision;
    if (v.holds.empty()) {
      keys_.erase(k);
      return;
    }
    Slot(keys_, k, kMaxKeys) = std::move(v);
  }

  // --- namespaces and sessions --------------------------------------------------

  // Keeps what a snapshot read for (ns, session) showed.
  void Observe(const std::string& ns, int64_t session, const KeySnapshot& s,
               uint64_t generation) {
    absl::MutexLock l(&mu_);
    if (generation != generation_) return;
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
    if (s.revision >= v.claims_revision || s.cluster_id != v.cluster_id) {
      v.record = *s.session;
      v.mod_revision = s.session_mod_revision;
      v.claims = s.session_claims;
      v.claims_revision = s.revision;
      v.cluster_id = s.cluster_id;
    }
  }

  // A transaction at `revision` put one claim of `session`, guarded by "no claim
  // put after the view's claims_revision", with the view showing `claims_before`.
  void ClaimAdded(int64_t session, int64_t claims_before, int64_t revision,
                  uint64_t generation) {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    if (generation != generation_) {  // the count it knew was of the lost history
      sessions_.erase(it);
      return;
    }
    if (it->second.claims_revision >= revision) return;
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
  static V& Slot(std::map<K, V>& m, const K& k, size_t max = kMaxEntries) {
    if (m.size() >= max && m.find(k) == m.end()) m.clear();
    return m[k];
  }
  static std::string KeyId(const std::string& ns, const std::string& key) {
    std::string id = ns;
    id.push_back('\0');
    id += key;
    return id;
  }

  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, NamespaceView> namespaces_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, SessionView> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, KeyView> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::lock
