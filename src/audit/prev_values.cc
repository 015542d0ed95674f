#include "audit/prev_values.h"

#include "lock/keyspace.h"

namespace holdfast::audit {

bool NeedsPrevValue(const std::string& key) {
  if (keyspace::ParseHoldKey(key)) return true;
  auto ns = keyspace::NamespaceOfKey(key);
  return ns && keyspace::ParseSessionKey(key, *ns).has_value();
}

absl::Status PrevValues::Fill(std::vector<mvccpb::Event>* events, const Lookup& lookup) {
  for (auto& e : *events) {
    const std::string& key = e.kv().key();
    if (!NeedsPrevValue(key)) continue;
    if (e.type() == mvccpb::Event::PUT) {
      last_[key] = e.kv();
      continue;
    }
    auto it = last_.find(key);
    if (!e.has_prev_kv()) {
      if (it != last_.end()) {
        *e.mutable_prev_kv() = it->second;
      } else {
        ++lookups_;
        auto found = lookup(key, e.kv().mod_revision() - 1);
        if (!found.ok() && found.status().code() != absl::StatusCode::kOutOfRange) {
          return found.status();
        }
        if (!found.ok()) {
          ++lost_;
        } else if (*found) {
          *e.mutable_prev_kv() = std::move(**found);
        }
      }
    }
    if (it != last_.end()) last_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace holdfast::audit
