#include "lock/session_owners.h"

#include <algorithm>
#include <vector>

namespace holdfast::lock {

const std::string* SessionOwners::Intern(std::string_view s) {
  return &*strings_.emplace(s).first;
}

void SessionOwners::DropLeastRecentlyUsed() {
  std::vector<uint64_t> used;
  used.reserve(entries_.size());
  for (const auto& [session, e] : entries_) used.push_back(e.used);
  auto mid = used.begin() + static_cast<std::ptrdiff_t>(used.size() / 2);
  std::nth_element(used.begin(), mid, used.end());
  const uint64_t keep_from = used.empty() ? 0 : *mid;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.used < keep_from) {
      entries_.erase(it++);  // the other iterators stay valid
    } else {
      ++it;
    }
  }
  // The strings the kept entries use, moved to a new set (nodes keep their
  // addresses only within one set, so the entries are pointed at the new ones).
  absl::node_hash_set<std::string> kept;
  for (auto& [session, e] : entries_) {
    e.ns = &*kept.emplace(*e.ns).first;
    e.identity = &*kept.emplace(*e.identity).first;
  }
  strings_.swap(kept);
}

void SessionOwners::Remember(int64_t session, std::string_view ns, std::string_view identity) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(session);
  if (it != entries_.end() && *it->second.ns == ns && *it->second.identity == identity) {
    it->second.used = ++use_;
    return;
  }
  if (entries_.size() >= kMaxEntries || strings_.size() + 2 > 2 * kMaxEntries) {
    DropLeastRecentlyUsed();
  }
  entries_[session] = Entry{Intern(ns), Intern(identity), ++use_};
}

std::optional<bool> SessionOwners::IsOwner(int64_t session, std::string_view ns,
                                           std::string_view identity) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(session);
  if (it == entries_.end() || *it->second.ns != ns) return std::nullopt;
  it->second.used = ++use_;
  return *it->second.identity == identity;
}

void SessionOwners::Forget(int64_t session) {
  absl::MutexLock l(&mu_);
  entries_.erase(session);
}

size_t SessionOwners::size() const {
  absl::MutexLock l(&mu_);
  return entries_.size();
}

}  // namespace holdfast::lock
