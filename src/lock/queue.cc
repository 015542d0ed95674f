#include "lock/queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::lock::queue {

AcquireDecision DecideAcquire(const KeySnapshot& s, int64_t lease, bool shared, int64_t now_ms) {
  AcquireDecision d;
  for (const auto& h : s.holds) {
    if (h.lease == lease) {
      d.kind = AcquireDecision::Kind::kHeld;
      d.own_hold = &h;
      return d;
    }
  }
  for (const auto& w : s.waiters) {
    if (w.lease == lease) d.own_waiter = &w;
  }
  bool held_against = false;
  for (const auto& h : s.holds) {
    if (!shared || !h.record.shared()) held_against = true;
  }
  int waiting_ahead = 0;
  for (const auto& w : s.waiters) {
    if (d.own_waiter && w.create_revision >= d.own_waiter->create_revision) break;
    if (Dead(w, now_ms)) {
      d.dead_ahead.push_back(&w);
      continue;
    }
    d.predecessor = &w;
    if (d.wake_at_ms == 0 || w.record.deadline_unix_ms() < d.wake_at_ms) {
      d.wake_at_ms = w.record.deadline_unix_ms();
    }
    if (!shared || !w.record.shared()) ++waiting_ahead;
  }
  if (!held_against && waiting_ahead == 0) {
    d.kind = AcquireDecision::Kind::kGrant;
    return d;
  }
  d.kind = AcquireDecision::Kind::kBlocked;
  d.blocked_by = BlockedBy(s.holds, waiting_ahead, shared);
  return d;
}

const WaiterEntry* JoinBehind(const std::vector<WaiterEntry>& seen, int64_t complete_through,
                              bool shared, int64_t now_ms) {
  if (seen.empty()) return nullptr;
  const WaiterEntry& last = seen.back();
  if (Dead(last, now_ms) || (shared && last.record.shared())) return nullptr;
  const auto complete_live = std::count_if(seen.begin(), seen.end(), [&](const WaiterEntry& w) {
    return w.create_revision <= complete_through && !Dead(w, now_ms);
  });
  return complete_live >= kJoinBehindMargin ? &last : nullptr;
}

std::string BlockedBy(const std::vector<HoldEntry>& holds, int64_t waiting_ahead, bool shared) {
  std::vector<std::string> blockers;
  for (const auto& h : holds) {
    if (!shared || !h.record.shared()) {
      blockers.push_back(absl::StrCat("session ", h.lease, h.record.shared() ? " (shared)" : ""));
    }
  }
  if (waiting_ahead > 0) blockers.push_back(absl::StrCat(waiting_ahead, " waiter(s) ahead"));
  return absl::StrJoin(blockers, ", ");
}

HandOver PlanHandOver(const KeySnapshot& s, int64_t releasing_lease, int64_t now_ms) {
  HandOver h;
  bool exclusive_left = false, any_left = false;
  for (const auto& hold : s.holds) {
    if (hold.lease == releasing_lease) continue;
    any_left = true;
    if (!hold.record.shared()) exclusive_left = true;
  }
  if (exclusive_left) return h;
  for (const auto& w : s.waiters) {
    if (h.grant.size() + h.dead.size() + h.stray.size() >= kMaxHandOver) break;
    if (Dead(w, now_ms)) {
      h.dead.push_back(&w);
      continue;
    }
    if (std::any_of(s.holds.begin(), s.holds.end(),
                    [&](const HoldEntry& hold) { return hold.lease == w.lease; })) {
      h.stray.push_back(&w);
      continue;
    }
    if (!w.record.shared()) {
      // An exclusive head takes the key only when nothing else holds it, and
      // nothing behind it passes it.
      if (h.grant.empty() && !any_left) h.grant.push_back(&w);
      break;
    }
    h.grant.push_back(&w);  // a run of shared waiters at the head
  }
  return h;
}

}  // namespace holdfast::lock::queue
