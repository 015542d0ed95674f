// The FIFO queue of one lock key: pure decisions on a KeySnapshot, so every rule
// of ARCHITECTURE §4 is unit-tested without etcd (queue_test.cc). The engine turns
// each decision into one guarded transaction whose compares make it safe.
//
// Rules:
//   Q1. Waiters are served in create_revision order.
//   Q2. An exclusive acquire is granted when no hold exists and no live waiter is
//       ahead of it; a shared one when no exclusive hold exists and no live
//       exclusive waiter is ahead of it.
//   Q3. A waiter whose deadline has passed is dead: never granted, and removed by
//       whoever finds it (its own server, or a grant or release that passes it).
//   Q4. A release hands the lock to the head in the same commit: the head alone if
//       exclusive, else the run of shared waiters at the head (dead ones skipped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lock/snapshot.h"

namespace holdfast::lock::queue {

inline bool Dead(const WaiterEntry& w, int64_t now_ms) {
  return w.record.deadline_unix_ms() <= now_ms;
}

struct AcquireDecision {
  enum class Kind {
    kHeld,     // the session already holds the key: `own_hold`
    kGrant,    // grant now (deleting `dead_ahead` and `own_waiter` in the same txn;
               // more than kMaxDeadPerGrant dead ones are removed first)
    kBlocked,  // wait (enqueue first when `own_waiter` is null)
  };
  Kind kind = Kind::kBlocked;
  const HoldEntry* own_hold = nullptr;
  const WaiterEntry* own_waiter = nullptr;
  std::vector<const WaiterEntry*> dead_ahead;
  // When blocked: the nearest live waiter ahead (null: this one is at the head),
  // the earliest deadline among live waiters ahead (0: none), and who blocks.
  const WaiterEntry* predecessor = nullptr;
  int64_t wake_at_ms = 0;
  std::string blocked_by;
};

// What `lease` asking for `lock_key` (shared or not) may do in snapshot `s`.
AcquireDecision DecideAcquire(const KeySnapshot& s, int64_t lease, bool shared, int64_t now_ms);

// A waiter that joins the queue from a replica's view of it (acquire_op.cc, an
// enqueue from the views) may join behind `seen`'s last waiter and read back only
// that one in its commit, instead of every waiter (a record each, read inside the
// commit of the release it rides with). `seen` is in queue order and complete
// through `complete_through` (later waiters may be missing). Returns that last
// waiter when:
//  - it blocks the newcomer on its own (live; exclusive, or the newcomer is), so
//    the newcomer waits whatever else the queue holds;
//  - at least kJoinBehindMargin live waiters are listed through
//    `complete_through`. A release planned on the view hands the key only to
//    those (engine.cc, PlanOnViews), each hand-over takes one from the head, and a
//    newcomer that joins behind adds none: the margin leaves the next releases a
//    head to plan on until a newcomer that reads the whole queue makes the view
//    complete again, and an exclusive head out of the way of the last waiter in
//    the release the newcomer rides with. (A run of shared waiters handed the key
//    together, or listed waiters that are gone, may take the last one with it:
//    the newcomer then finds it gone and reads the queue.)
// Null otherwise: the newcomer reads the key's holds and waiters. Several
// newcomers that glance before the first of them commits join behind the same
// waiter, and each reads the queue when it goes.
inline constexpr int64_t kJoinBehindMargin = 3;
const WaiterEntry* JoinBehind(const std::vector<WaiterEntry>& seen, int64_t complete_through,
                              bool shared, int64_t now_ms);

// Who blocks a call (shared or not) that has `waiting_ahead` live waiters ahead of
// it that it may not pass, besides `holds`: the hint its deadline's error gives.
std::string BlockedBy(const std::vector<HoldEntry>& holds, int64_t waiting_ahead, bool shared);

// At most this many waiters are granted (and dead ones removed) by one release, so
// the transaction stays under etcd's --max-txn-ops (128 by default); shared
// waiters after them claim on their own when their predecessor's key goes.
inline constexpr size_t kMaxHandOver = 32;

// At most this many dead waiters are removed by one grant (each costs two compares
// and up to two deletes, beside the grant's own compares and the shared grant's
// compares of live waiters ahead): a grant that finds more ahead removes this many
// first, in a transaction of its own, and decides again.
inline constexpr size_t kMaxDeadPerGrant = 32;

struct HandOver {
  std::vector<const WaiterEntry*> grant;  // in queue order
  std::vector<const WaiterEntry*> dead;   // dead waiters passed on the way
  // Waiters of sessions that hold the key (the releasing one among them), passed
  // on the way: an acquire from a stale view may queue a session that holds the
  // key, and its call answers with the hold and takes the waiter out; should that
  // delete fail, the waiter is left with nobody waiting on it. Handed the key it
  // would fail the release (etcd refuses a put and a delete of one hold key in one
  // commit) or every release while a shared holder is queued (its hold exists).
  // They are removed with the release; their sessions keep their claims.
  std::vector<const WaiterEntry*> stray;
};

// Who gets the key in the commit that deletes `releasing_lease`'s hold.
HandOver PlanHandOver(const KeySnapshot& s, int64_t releasing_lease, int64_t now_ms);

}  // namespace holdfast::lock::queue
