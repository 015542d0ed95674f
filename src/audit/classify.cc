#include "audit/classify.h"

#include <map>
#include <optional>
#include <set>

#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/token.h"

namespace holdfast::audit {
namespace {

struct RevisionEvents {
  std::vector<const mvccpb::Event*> events;
  std::optional<records::AuditMark> mark;
  std::set<std::pair<std::string, int64_t>> closing;  // (namespace, lease)
};

int64_t TokenOf(int32_t epoch, int64_t grant_revision) {
  auto t = token::Make(epoch, grant_revision);
  return t.ok() ? *t : 0;
}

}  // namespace

Classified Classify(uint64_t cluster_id, const std::vector<mvccpb::Event>& events,
                    int64_t now_unix_ms) {
  Classified out;
  // Group by revision first: a transaction's mark may come after its deletions.
  std::map<int64_t, RevisionEvents> by_rev;
  for (const auto& e : events) {
    const int64_t rev = e.kv().mod_revision();
    out.last_revision = std::max(out.last_revision, rev);
    auto& r = by_rev[rev];
    r.events.push_back(&e);
    const std::string& key = e.kv().key();
    if (e.type() == mvccpb::Event::PUT && key == keyspace::AuditMarkKey()) {
      records::AuditMark mark;
      if (mark.ParseFromString(e.kv().value())) r.mark = std::move(mark);
      continue;
    }
    if (e.type() == mvccpb::Event::DELETE && e.has_prev_kv()) {
      auto ns = keyspace::NamespaceOfKey(key);
      if (!ns) continue;
      auto lease = keyspace::ParseSessionKey(key, *ns);
      if (!lease) continue;
      records::SessionRecord rec;
      if (rec.ParseFromString(e.prev_kv().value()) && rec.closing()) {
        r.closing.insert({*ns, *lease});
      }
    }
  }

  for (const auto& [rev, r] : by_rev) {
    for (const mvccpb::Event* e : r.events) {
      auto hold = keyspace::ParseHoldKey(e->kv().key());
      if (!hold) continue;
      AuditEvent ev;
      ev.cluster_id = cluster_id;
      ev.revision = rev;
      ev.ns = hold->ns;
      ev.lock_key = hold->lock_key;
      ev.session_id = hold->lease;
      records::HoldRecord rec;
      if (e->type() == mvccpb::Event::PUT) {
        // Only a created hold is a grant (a hold is never rewritten today; a
        // rewrite would not be a new grant).
        if (e->kv().create_revision() != rev) continue;
        ev.type = EventType::kGrant;
        if (!rec.ParseFromString(e->kv().value())) {
          // Holder, token and grant time are unknown (the token's epoch is in
          // the record); the grant is still recorded, so the trail has no hole.
          ++out.malformed;
          ev.time_unix_ms = now_unix_ms;
        } else {
          ev.token = TokenOf(rec.epoch(), e->kv().create_revision());
          ev.time_unix_ms = rec.granted_at_unix_ms();
        }
      } else {
        if (!e->has_prev_kv() || !rec.ParseFromString(e->prev_kv().value())) {
          // Without the previous value the holder and token are unknown; the
          // event is still recorded, so the trail has no hole.
          ++out.malformed;
        } else {
          ev.token = TokenOf(rec.epoch(), e->prev_kv().create_revision());
        }
        if (r.mark && r.mark->kind() == "force") {
          ev.type = EventType::kForce;
          ev.time_unix_ms = r.mark->at_unix_ms();
          ForceReleaseRow f;
          f.request_id = r.mark->request_id();
          f.cluster_id = cluster_id;
          f.revision = rev;
          f.ns = hold->ns;
          f.lock_key = hold->lock_key;
          f.session_id = hold->lease;
          f.token = ev.token;
          f.requester = r.mark->requester();
          f.approver = r.mark->approver();
          f.reason = r.mark->reason();
          f.class_was_fenced = r.mark->class_was_fenced();
          f.requested_at_unix_ms = r.mark->requested_at_unix_ms();
          f.approved_at_unix_ms = r.mark->at_unix_ms();
          out.forces.push_back(std::move(f));
        } else if (r.mark) {
          ev.type = EventType::kRelease;
          ev.time_unix_ms = r.mark->at_unix_ms();
        } else if (r.closing.count({hold->ns, hold->lease})) {
          ev.type = EventType::kRelease;
          ev.time_unix_ms = now_unix_ms;
        } else {
          ev.type = EventType::kExpire;
          ev.time_unix_ms = now_unix_ms;
        }
      }
      ev.spiffe_id = rec.identity();
      ev.unprotected = rec.advisory();
      out.events.push_back(std::move(ev));
    }
  }
  return out;
}

}  // namespace holdfast::audit
