#include "lock/session_owners.h"

namespace holdfast::lock {

const std::string* SessionOwners::Intern(std::string_view s) {
  return &*strings_.emplace(s).first;
}

void SessionOwners::Remember(int64_t session, std::string_view ns, std::string_view identity) {
  absl::MutexLock l(&mu_);
  if (entries_.size() >= kMaxEntries || strings_.size() + 2 > kMaxStrings) {
    entries_.clear();
    strings_.clear();  // after entries_: nothing points into it any more
  }
  entries_[session] = Entry{Intern(ns), Intern(identity)};
}

std::optional<std::string> SessionOwners::OwnerIn(int64_t session, std::string_view ns) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(session);
  if (it == entries_.end() || *it->second.ns != ns) return std::nullopt;
  return *it->second.identity;
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
