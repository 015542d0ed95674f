// holdfast/fence.h: the fencing-token check for resource servers (ARCHITECTURE §3,
// invariant §11.3: a fenced resource never admits a write from a superseded holder).
//
// A lock holder sends its token (Hold::token()) with every write. The resource
// server keeps one FenceVerifier and lets a write through only while its token is
// not lower than the highest token already admitted for the same lock key:
//
//   holdfast::FenceVerifier fence;
//   absl::Status s = fence.CheckAndApply(lock_key, token, [&]() -> absl::Status {
//     return table.Put(row, value);  // runs only while `token` is still the newest
//   });
//
// The verifier remembers tokens in memory only: after a restart it has forgotten
// them. docs/fencing.md says how to persist them, why the caller's identity must
// be checked too (tokens are guessable), and when Lock.CheckToken is the better tool.
//
// Header-only. Needs absl: status, strings, synchronization, node_hash_map
// (CMake: link the holdfast_fence interface target).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace holdfast {

// Token layout: token = epoch << 48 | grant_revision, a positive int64, with
// epoch in [1, 2^15) and grant_revision in [1, 2^48).
// DO NOT CHANGE: holdfastd mints this layout (src/lock/token.h) and resources store it.
inline constexpr int kTokenRevisionBits = 48;
inline constexpr int64_t kTokenRevisionMask = (int64_t{1} << kTokenRevisionBits) - 1;

// The epoch (generation of the etcd cluster) of a token; >= 1 for every token
// holdfast mints. A later epoch makes a token higher than any of an earlier epoch.
constexpr int32_t TokenEpoch(int64_t token) {
  return static_cast<int32_t>(token >> kTokenRevisionBits);
}

// The etcd revision of the transaction that granted the hold; >= 1.
constexpr int64_t TokenRevision(int64_t token) { return token & kTokenRevisionMask; }

// How the holder presenting a token holds its lock (HoldInfo.shared). Take it
// from the hold (Describe's HoldInfo.shared, or the key's class), never from the
// caller: a superseded exclusive holder that called its token shared would pass
// every shared token admitted since (docs/fencing.md).
enum class FenceMode {
  // An exclusive hold: admitted only if no token of the key admitted so far, of
  // either mode, is higher (every lower hold was released or lost before it).
  kExclusive,
  // A shared hold of a class of mode S: shared holds of one key coexist with
  // different tokens, so one is admitted unless a higher *exclusive* token was
  // admitted (then it was superseded by a writer).
  kShared,
};

// The write that CheckAndApply runs: a callable taking nothing and returning
// absl::Status.
template <typename F>
concept FenceWrite = std::is_invocable_r_v<absl::Status, F&>;

struct FenceVerifierOptions {
  // How many lock keys to remember. 0 (the default): every key ever admitted,
  // forever, at about 160 bytes per key (plus the key if longer than 15 bytes).
  // Otherwise, when more than max_keys keys are remembered, those least recently
  // admitted are forgotten (never one a call is using), and the highest token
  // forgotten becomes a floor: a key the verifier does not remember admits no
  // token below it. That keeps every stale token out (safety), at a cost in
  // liveness: a current holder of a key not remembered, granted before the floor's
  // token, is rejected and must acquire its lock again. Feed one verifier the keys
  // of one namespace (one etcd cluster): tokens of two clusters do not compare, and
  // a floor from the cluster at the higher epoch would reject every token of the
  // other.
  size_t max_keys = 0;
  // Partitions of the key space, each with its own mutex (less contention).
  // Lowered to max_keys when max_keys is smaller.
  int shards = 16;
};

// Remembers the highest fencing token admitted per lock key and rejects lower ones.
//
// A FenceVerifier is safe for concurrent access from multiple threads without any
// external synchronization. Calls for one lock key are serialized (a write run by
// CheckAndApply finishes before the next call for that key is checked); calls for
// different keys run in parallel. Highest() never waits for a write.
//
// Lock keys are compared as exact byte strings: "a" and "a/b" are independent.
class FenceVerifier {
 public:
  explicit FenceVerifier(FenceVerifierOptions options = {})
      : shard_count_(ShardCount(options)), shards_(new Shard[shard_count_]) {
    if (options.max_keys == 0) return;
    for (size_t i = 0; i < shard_count_; ++i) {
      // The remainder goes to the first shards: the capacities add up to max_keys.
      shards_[i].capacity =
          options.max_keys / shard_count_ + (i < options.max_keys % shard_count_ ? 1 : 0);
    }
  }
  FenceVerifier(const FenceVerifier&) = delete;
  FenceVerifier& operator=(const FenceVerifier&) = delete;

  // Admits `token` for `lock_key` and remembers it if it is the highest so far.
  // Waits while a CheckAndApply write of the same key runs.
  //
  // Admit alone does not stop a slow write admitted earlier from landing after a
  // newer holder's write; unless the store serializes writes per key itself, use
  // CheckAndApply.
  //
  // Errors: INVALID_ARGUMENT when `token` is not a holdfast token (not positive,
  // epoch 0 or revision 0); FAILED_PRECONDITION when it is lower than a token
  // already admitted for `lock_key` (the message names both): its holder was
  // superseded and must stop, not retry.
  absl::Status Admit(std::string_view lock_key, int64_t token,
                     FenceMode mode = FenceMode::kExclusive) {
    return CheckAndApply(lock_key, token, mode, [] { return absl::OkStatus(); });
  }

  // Admits `token` as Admit does and, only if it is admitted, runs `write()` before
  // any other call for `lock_key` is checked, so a check-then-write cannot
  // interleave with a newer holder's. Returns Admit's error (write not run) or
  // write()'s status. The token stays admitted even when write() fails (the holder
  // may retry with it; older tokens stay out).
  //
  // Callback contract: write() runs exactly once if the token is admitted, never
  // otherwise, on the calling thread, while the key's write slot is held (not the
  // verifier's internal mutexes). It must not call Admit or CheckAndApply (Highest
  // is fine), and should be short: it delays every other call for the same key. An
  // exception thrown by write() propagates after the slot is released.
  template <FenceWrite Write>
  absl::Status CheckAndApply(std::string_view lock_key, int64_t token, Write&& write) {
    return CheckAndApply(lock_key, token, FenceMode::kExclusive, std::forward<Write>(write));
  }

  template <FenceWrite Write>
  absl::Status CheckAndApply(std::string_view lock_key, int64_t token, FenceMode mode,
                             Write&& write) {
    if (absl::Status valid = ValidateToken(token); !valid.ok()) return valid;
    Shard& shard = ShardFor(lock_key);
    Pin pin(shard, lock_key);
    absl::MutexLock slot(pin.write_mu());
    if (absl::Status admitted = shard.Check(pin.node(), token, mode); !admitted.ok()) {
      return admitted;
    }
    return std::invoke(write);
  }

  // The lowest token Admit(lock_key, token) accepts in exclusive mode: the highest
  // token admitted for `lock_key`, or, for a key not remembered, the floor left by
  // forgotten keys (0 if none was forgotten). Does not wait for writes.
  int64_t Highest(std::string_view lock_key) const {
    const Shard& shard = ShardFor(lock_key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.entries.find(AbslView(lock_key));
    return it == shard.entries.end() ? shard.floor : it->second.highest;
  }

  // How many lock keys are remembered now (includes keys whose first call is in
  // progress).
  size_t RememberedKeys() const {
    size_t total = 0;
    for (size_t i = 0; i < shard_count_; ++i) {
      absl::MutexLock lock(&shards_[i].mu);
      total += shards_[i].entries.size();
    }
    return total;
  }

 private:
  struct Entry;
  using Map = absl::node_hash_map<std::string, Entry>;
  using Node = std::pair<const std::string, Entry>;  // stable address in a node_hash_map

  struct Entry {
    int64_t highest = 0;              // any mode
    int64_t highest_exclusive = 0;    // <= highest
    bool admitted = false;            // false: highest is the floor copied at creation
    bool exclusive_admitted = false;  // false: highest_exclusive is that floor
    int pins = 0;                     // calls between Pin and ~Pin; never evicted while > 0
    std::list<Node*>::iterator lru;   // position in Shard::lru, valid once admitted
    // Serializes the calls of one key, held across CheckAndApply's write.
    // Lock order: an entry's write_mu before its shard's mu.
    std::unique_ptr<absl::Mutex> write_mu = std::make_unique<absl::Mutex>();
  };

  struct Shard {
    mutable absl::Mutex mu;
    Map entries ABSL_GUARDED_BY(mu);
    // Admitted entries, most recently admitted first.
    std::list<Node*> lru ABSL_GUARDED_BY(mu);
    // Highest token of every key forgotten; new keys start from it.
    int64_t floor ABSL_GUARDED_BY(mu) = 0;
    // Keys to keep; 0 = all. Set before the verifier is shared.
    size_t capacity = 0;

    // Finds or creates the key's entry and pins it (the entry cannot be evicted).
    Node* Pin(std::string_view lock_key) ABSL_LOCKS_EXCLUDED(mu) {
      absl::MutexLock lock(&mu);
      auto it = entries.find(AbslView(lock_key));
      if (it == entries.end()) {
        it = entries.try_emplace(std::string(lock_key)).first;
        it->second.highest = it->second.highest_exclusive = floor;
      }
      ++it->second.pins;
      return &*it;
    }

    void Unpin(Node* node) ABSL_LOCKS_EXCLUDED(mu) {
      absl::MutexLock lock(&mu);
      Entry& entry = node->second;
      if (--entry.pins == 0 && !entry.admitted) {
        // Created by a call that was rejected: it knows nothing the floor does not.
        entries.erase(entries.find(node->first));
      }
      EvictLocked();
    }

    // The admission decision; on success remembers the token.
    absl::Status Check(Node* node, int64_t token, FenceMode mode) ABSL_LOCKS_EXCLUDED(mu) {
      absl::MutexLock lock(&mu);
      Entry& entry = node->second;
      const bool shared = mode == FenceMode::kShared;
      const int64_t bound = shared ? entry.highest_exclusive : entry.highest;
      if (token < bound) {
        return StaleError(node->first, token, bound, mode,
                          shared ? entry.exclusive_admitted : entry.admitted);
      }
      entry.highest = std::max(entry.highest, token);
      if (!shared) {
        entry.highest_exclusive = std::max(entry.highest_exclusive, token);
        entry.exclusive_admitted = true;
      }
      if (entry.admitted) lru.erase(entry.lru);
      entry.admitted = true;
      lru.push_front(node);
      entry.lru = lru.begin();
      return absl::OkStatus();
    }

    // Forgets the least recently admitted unpinned keys while over capacity.
    void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (capacity == 0) return;
      auto it = lru.end();
      while (entries.size() > capacity && it != lru.begin()) {
        --it;
        Node* victim = *it;
        if (victim->second.pins > 0) continue;  // a call is using it; try an older one
        floor = std::max(floor, victim->second.highest);
        it = lru.erase(it);
        entries.erase(entries.find(victim->first));
      }
    }
  };

  // Pins a key's entry for the duration of one call.
  class Pin {
   public:
    Pin(Shard& shard, std::string_view lock_key) : shard_(shard), node_(shard.Pin(lock_key)) {}
    ~Pin() { shard_.Unpin(node_); }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

    Node* node() const { return node_; }
    // Stable while pinned: the entry is not erased and the mutex is never replaced.
    absl::Mutex* write_mu() const { return node_->second.write_mu.get(); }

   private:
    Shard& shard_;
    Node* const node_;
  };

  // absl::string_view is its own type in some absl builds (Debian's among them).
  static absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

  static size_t ShardCount(const FenceVerifierOptions& options) {
    size_t count = options.shards > 0 ? static_cast<size_t>(options.shards) : 1;
    if (options.max_keys > 0) count = std::min(count, options.max_keys);
    return count;
  }

  Shard& ShardFor(std::string_view lock_key) const {
    return shards_[std::hash<std::string_view>{}(lock_key) % shard_count_];
  }

  static std::string DescribeToken(int64_t token) {
    return absl::StrCat(token, " (epoch ", TokenEpoch(token), ", revision ", TokenRevision(token),
                        ")");
  }

  static absl::Status ValidateToken(int64_t token) {
    if (token <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fencing token ", token, " is not positive: not a holdfast token"));
    }
    if (TokenEpoch(token) == 0 || TokenRevision(token) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fencing token ", DescribeToken(token),
                       " is not a holdfast token (epoch << 48 | grant revision, both >= 1); pass "
                       "Hold::token(), not the grant revision"));
    }
    return absl::OkStatus();
  }

  static absl::Status StaleError(std::string_view lock_key, int64_t token, int64_t bound,
                                 FenceMode mode, bool bound_admitted) {
    std::string key = absl::StrCat("lock key \"", absl::CHexEscape(AbslView(lock_key)), "\"");
    if (!bound_admitted) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale fencing token for ", key, ": token ", DescribeToken(token), " is lower than ",
          DescribeToken(bound),
          ", the floor for keys this verifier no longer remembers (max_keys); release "
          "the lock and acquire it again for a newer token (asked again while held, "
          "Acquire returns the same hold and token)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "stale fencing token for ", key, ": token ", DescribeToken(token), " is lower than ",
        mode == FenceMode::kShared ? "exclusive token " : "token ", DescribeToken(bound),
        ", already admitted; the holder of ", token, " was superseded and must stop"));
  }

  const size_t shard_count_;
  const std::unique_ptr<Shard[]> shards_;
};

}  // namespace holdfast
