#include "audit/prev_values.h"

#include <set>
#include <utility>

#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::audit {
namespace {

// What Classify reads of a hold: the rest (holder_meta, up to 1 KiB) is not kept.
std::string Trimmed(const std::string& value) {
  records::HoldRecord full;
  if (!full.ParseFromString(value)) return value;  // Classify counts it malformed
  records::HoldRecord rec;
  rec.set_identity(full.identity());
  rec.set_epoch(full.epoch());
  rec.set_advisory(full.advisory());
  rec.set_granted_at_unix_ms(full.granted_at_unix_ms());
  return rec.SerializeAsString();
}

}  // namespace

absl::Status PrevValues::Fill(std::vector<mvccpb::Event>* events, const Lookup& lookup) {
  // (revision, lease) of every hold deletion: a session deletion's closing flag
  // matters only with one of them in the same revision.
  std::set<std::pair<int64_t, int64_t>> hold_deletions;
  for (const auto& e : *events) {
    if (e.type() != mvccpb::Event::DELETE) continue;
    if (auto h = keyspace::ParseHoldKey(e.kv().key())) {
      hold_deletions.insert({e.kv().mod_revision(), h->lease});
    }
  }
  for (auto& e : *events) {
    const std::string& key = e.kv().key();
    const bool put = e.type() == mvccpb::Event::PUT;
    std::optional<int64_t> lease;
    const bool hold = keyspace::ParseHoldKey(key).has_value();
    if (!hold) {
      auto ns = keyspace::NamespaceOfKey(key);
      if (ns) lease = keyspace::ParseSessionKey(key, *ns);
      if (!lease) continue;  // neither: its deletion needs no previous value
    }
    if (put) {
      if (hold) {
        holds_[key] = Hold{e.kv().create_revision(), Trimmed(e.kv().value())};
      } else {
        records::SessionRecord rec;
        if (rec.ParseFromString(e.kv().value()) && rec.closing()) {
          closing_.insert(*lease);
        } else {
          closing_.erase(*lease);
        }
      }
      continue;
    }
    if (!hold && !e.has_prev_kv() && !closing_.count(*lease) &&
        !hold_deletions.count({e.kv().mod_revision(), *lease})) {
      continue;  // no hold ended with it: whether it was closing does not matter
    }
    if (!e.has_prev_kv()) {
      mvccpb::KeyValue* prev = nullptr;
      if (hold) {
        if (auto it = holds_.find(key); it != holds_.end()) {
          prev = e.mutable_prev_kv();
          prev->set_create_revision(it->second.create_revision);
          prev->set_value(it->second.value);
        }
      } else if (closing_.count(*lease)) {
        records::SessionRecord rec;
        rec.set_closing(true);
        prev = e.mutable_prev_kv();
        prev->set_value(rec.SerializeAsString());
      }
      if (prev != nullptr) {
        prev->set_key(key);
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
    if (hold) {
      holds_.erase(key);
    } else {
      closing_.erase(*lease);
    }
  }
  return absl::OkStatus();
}

}  // namespace holdfast::audit
