#include "lock/registry.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"
#include "common/spiffe.h"
#include "lock/engine.h"
#include "lock/keyspace.h"
#include "lock/txn_util.h"
#include "lock/records.pb.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

namespace {

constexpr int64_t kTtlFloorMs = 1000;
constexpr int64_t kTtlCeilingMs = 24 * 3600 * 1000;

// The most live sessions a namespace's held_lease_quota may allow. Each live
// session of a namespace with a quota keeps a slot key in etcd, which every
// open of the namespace reads; a figure beyond this is a typo for "unlimited"
// (0) more likely than a plan.
constexpr int64_t kMaxHeldLeaseQuota = 1'000'000;

absl::Status CheckHeldLeaseQuota(int64_t quota) {
  if (quota <= kMaxHeldLeaseQuota) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("held_lease_quota ", quota, " is above ", kMaxHeldLeaseQuota,
                   ", the most live sessions a namespace may be allowed (0 = unlimited)"));
}

// Far above what one etcd cluster commits a second: a larger figure is a typo
// (or meant "unlimited", which is 0).
constexpr int64_t kMaxOpRateQuota = 1'000'000;

absl::Status CheckOpRateQuota(int64_t quota) {
  if (quota <= kMaxOpRateQuota) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "op_rate_quota ", quota, " is above ", kMaxOpRateQuota,
      ", the most operations per second a namespace may be allowed (0 = unlimited)"));
}

// What one session of a namespace holds and waits for, read from its claims
// (keyspace: a claim key per lock key the session holds or waits for).
struct Involvement {
  bool live = false;                                   // its session key exists
  std::vector<std::string> held;                       // lock keys it holds
  std::vector<std::pair<std::string, int64_t>> waits;  // lock keys it waits for, and
                                                       // each wait key's mod revision
  std::vector<std::string> stray_claims;  // claims of neither a hold nor a wait
};

// Ranges per read transaction (etcd's --max-txn-ops is 128 by default).
constexpr size_t kRangesPerTxn = 100;

// Not one snapshot across chunks: every write that relies on a figure here is
// guarded by a compare of its own.
absl::StatusOr<std::map<int64_t, Involvement>> ReadInvolvement(
    etcd::Client* etcd, const std::string& ns, const std::vector<int64_t>& leases,
    etcd::Deadline d) {
  std::map<int64_t, Involvement> out;
  std::vector<std::pair<int64_t, std::string>> claimed;  // (session, lock key)
  for (size_t at = 0; at < leases.size(); at += kRangesPerTxn / 2) {
    const size_t end = std::min(leases.size(), at + kRangesPerTxn / 2);
    pb::TxnRequest txn;
    for (size_t i = at; i < end; ++i) {
      auto* session = txn.add_success()->mutable_request_range();
      session->set_key(keyspace::SessionKey(ns, leases[i]));
      session->set_count_only(true);
      const std::string prefix = keyspace::ClaimPrefix(ns, leases[i]);
      auto* claims = txn.add_success()->mutable_request_range();
      claims->set_key(prefix);
      claims->set_range_end(keyspace::PrefixEnd(prefix));
      claims->set_keys_only(true);
    }
    auto t = etcd->TxnSync(std::move(txn), d);
    if (!t.ok()) return t.status();
    for (size_t i = at; i < end; ++i) {
      const int r = static_cast<int>(2 * (i - at));
      out[leases[i]].live = t->responses(r).response_range().count() > 0;
      const size_t prefix_size = keyspace::ClaimPrefix(ns, leases[i]).size();
      for (const auto& kv : t->responses(r + 1).response_range().kvs()) {
        claimed.emplace_back(leases[i], kv.key().substr(prefix_size));
      }
    }
  }
  for (size_t at = 0; at < claimed.size(); at += kRangesPerTxn / 2) {
    const size_t end = std::min(claimed.size(), at + kRangesPerTxn / 2);
    pb::TxnRequest txn;
    for (size_t i = at; i < end; ++i) {
      const auto& [lease, key] = claimed[i];
      auto* hold = txn.add_success()->mutable_request_range();
      hold->set_key(keyspace::HoldKey(ns, key, lease));
      hold->set_count_only(true);
      auto* wait = txn.add_success()->mutable_request_range();
      wait->set_key(keyspace::WaitKey(ns, key, lease));
      wait->set_keys_only(true);
    }
    auto t = etcd->TxnSync(std::move(txn), d);
    if (!t.ok()) return t.status();
    for (size_t i = at; i < end; ++i) {
      const auto& [lease, key] = claimed[i];
      const int r = static_cast<int>(2 * (i - at));
      Involvement& inv = out[lease];
      // (A session may both hold a key and have a waiter for it, put from a
      // stale view: that waiter is withdrawn too.)
      const bool held = t->responses(r).response_range().count() > 0;
      const bool waits = t->responses(r + 1).response_range().kvs_size() > 0;
      if (held) inv.held.push_back(key);
      if (waits) {
        inv.waits.emplace_back(key, t->responses(r + 1).response_range().kvs(0).mod_revision());
      }
      if (!held && !waits) inv.stray_claims.push_back(key);
    }
  }
  return out;
}

std::vector<int64_t> LeasesOf(const std::map<int64_t, std::string>& owners) {
  std::vector<int64_t> out;
  for (const auto& [lease, owner] : owners) out.push_back(lease);
  return out;
}

// "session 12 of spiffe://a holds "db", "q"; ...", at most five sessions named.
std::string NameHolds(const std::map<int64_t, std::vector<std::string>>& holds,
                      const std::map<int64_t, std::string>& owners) {
  std::string out;
  size_t shown = 0;
  for (const auto& [lease, keys] : holds) {
    if (shown++ == 5) {
      absl::StrAppend(&out, "; and ", holds.size() - 5, " more");
      break;
    }
    auto owner = owners.find(lease);
    absl::StrAppend(&out, out.empty() ? "" : "; ", "session ", lease, " of ",
                    owner == owners.end() ? "?" : owner->second, " holds ");
    for (size_t i = 0; i < keys.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ", ", "\"", keys[i], "\"");
    }
  }
  return out;
}

// Withdraws the waits of a session of `ns` as read in `inv`, each guarded by its
// wait key as read (one handed the lock meanwhile is a hold, found by the next
// read), and deletes its claims of neither a hold nor a wait (guarded so). A
// wait's claim goes with it, unless the session also holds the key. False if a
// guard failed: read again.
absl::StatusOr<bool> WithdrawWaits(etcd::Client* etcd, const std::string& ns, int64_t lease,
                                   const Involvement& inv, etcd::Deadline d) {
  struct Item {
    std::string key;
    int64_t wait_mod = 0;  // 0: a stray claim
  };
  std::vector<Item> items;
  for (const auto& [key, mod] : inv.waits) items.push_back({key, mod});
  for (const auto& key : inv.stray_claims) items.push_back({key, 0});
  const std::set<std::string> held(inv.held.begin(), inv.held.end());
  for (size_t at = 0; at < items.size(); at += kRangesPerTxn / 3) {
    const size_t end = std::min(items.size(), at + kRangesPerTxn / 3);
    pb::TxnRequest txn;
    for (size_t i = at; i < end; ++i) {
      const std::string wait_key = keyspace::WaitKey(ns, items[i].key, lease);
      const std::string hold_key = keyspace::HoldKey(ns, items[i].key, lease);
      if (items[i].wait_mod != 0) {
        AddCompare(&txn, wait_key, pb::Compare::MOD, pb::Compare::EQUAL)
            ->set_mod_revision(items[i].wait_mod);
        txn.add_success()->mutable_request_delete_range()->set_key(wait_key);
        if (held.count(items[i].key)) continue;  // the claim is the hold's too
      } else {
        AddCompare(&txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
            ->set_create_revision(0);
      }
      AddCompare(&txn, hold_key, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
      txn.add_success()->mutable_request_delete_range()->set_key(
          keyspace::ClaimKey(ns, items[i].key, lease));
    }
    auto t = etcd->TxnSync(std::move(txn), d);
    if (!t.ok()) return t.status();
    if (!t->succeeded()) return false;
  }
  return true;
}

// Ends a session of `ns` that holds no lock, and answers the lock keys it holds
// instead if it holds any (then it is left as it is, its waits withdrawn:
// ending it would force those locks open, which takes two admins, ARCHITECTURE
// §8). First its waits are withdrawn (WithdrawWaits). Then one commit, guarded
// by "the session has no claim at all" (so it holds and waits for nothing),
// deletes its session key and its quota slot: every grant and enqueue compares
// the session key, so none of this session can commit after it, and no
// hand-over can pick it (it waits for nothing). Last, its lease is revoked; if
// that fails, the lease, which carries no key any more, lives on while its
// client renews it (told as an error, with the lease to revoke by hand).
absl::StatusOr<std::vector<std::string>> EndSessionHoldingNothing(
    etcd::Client* etcd, const std::string& ns, int64_t lease, Involvement inv,
    const std::string& slot_key, etcd::Deadline d) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) {
      auto again = ReadInvolvement(etcd, ns, {lease}, d);
      if (!again.ok()) return again.status();
      inv = std::move((*again)[lease]);
    }
    if (!inv.live) return std::vector<std::string>{};  // ended meanwhile
    auto withdrawn = WithdrawWaits(etcd, ns, lease, inv, d);
    if (!withdrawn.ok()) return withdrawn.status();
    if (!*withdrawn) continue;
    if (!inv.held.empty()) return inv.held;
    pb::TxnRequest end;
    AddCompare(&end, keyspace::SessionKey(ns, lease), pb::Compare::VERSION,
               pb::Compare::GREATER)
        ->set_version(0);
    const std::string claims = keyspace::ClaimPrefix(ns, lease);
    auto* none = AddCompare(&end, claims, pb::Compare::CREATE, pb::Compare::EQUAL);
    none->set_range_end(keyspace::PrefixEnd(claims));
    none->set_create_revision(0);  // (over a range with no key, the compare holds)
    end.add_success()->mutable_request_delete_range()->set_key(keyspace::SessionKey(ns, lease));
    if (!slot_key.empty()) {
      AddCompare(&end, slot_key, pb::Compare::VALUE, pb::Compare::EQUAL)
          ->set_value(absl::StrCat(lease));
      end.add_success()->mutable_request_delete_range()->set_key(slot_key);
    }
    auto t = etcd->TxnSync(std::move(end), d);
    if (!t.ok()) return t.status();
    if (!t->succeeded()) continue;
    pb::LeaseRevokeRequest rr;
    rr.set_id(lease);
    absl::Status revoked;
    for (int tries = 0; tries < 3; ++tries) {
      auto x = etcd->LeaseRevokeSync(rr, d);
      revoked = x.status();
      if (x.ok() || x.status().code() == absl::StatusCode::kNotFound) {
        return std::vector<std::string>{};
      }
    }
    return absl::UnavailableError(absl::StrCat(
        "its record is gone, so it can take no lock, but its lease could not be revoked (",
        revoked.message(), "): revoke it with `etcdctl lease revoke ",
        absl::StrFormat("%x", lease), "`"));
  }
  return absl::AbortedError(absl::StrCat("session ", lease, " kept changing while it was ended"));
}

v1::Namespace NamespaceFromRecord(const std::string& name, const mvccpb::KeyValue& kv,
                                  const records::NamespaceRecord& r) {
  v1::Namespace n;
  n.set_name(name);
  n.set_tenant_id(r.tenant_id());
  n.set_held_lease_quota(r.held_lease_quota());
  n.set_op_rate_quota(r.op_rate_quota());
  n.set_cluster_tier(r.cluster_tier());
  n.set_create_revision(kv.create_revision());
  *n.mutable_members() = r.members();
  return n;
}

records::ClassRecord RecordFromClass(const v1::LockClass& c) {
  records::ClassRecord r;
  r.set_key_prefix(c.key_prefix());
  r.set_ttl_min_ms(c.ttl_min_ms());
  r.set_ttl_max_ms(c.ttl_max_ms());
  r.set_mode(c.mode());
  r.set_enforcement(c.enforcement());
  r.set_on_quorum_loss(c.on_quorum_loss());
  return r;
}

absl::StatusOr<v1::LockClass> ClassFromKv(const std::string& ns, const std::string& id,
                                          const mvccpb::KeyValue& kv) {
  records::ClassRecord r;
  if (!r.ParseFromString(kv.value())) {
    return absl::DataLossError(absl::StrCat("corrupt class record at ", kv.key()));
  }
  v1::LockClass c;
  c.set_namespace_(ns);
  c.set_class_id(id);
  c.set_key_prefix(r.key_prefix());
  c.set_ttl_min_ms(r.ttl_min_ms());
  c.set_ttl_max_ms(r.ttl_max_ms());
  c.set_mode(static_cast<v1::LockMode>(r.mode()));
  c.set_enforcement(static_cast<v1::Enforcement>(r.enforcement()));
  c.set_on_quorum_loss(static_cast<v1::OnQuorumLoss>(r.on_quorum_loss()));
  c.set_create_revision(kv.create_revision());
  return c;
}

absl::Status NamespaceNotFound(const std::string& ns) {
  return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist"));
}

// A namespace being moved to another etcd cluster (holdfast ns rehome), or moved
// away: its records here are being copied, or are the old home's. A change made
// here would not reach the new home (a member removed would stay a member there),
// so it is refused, whatever route a replica with a stale view of the move took.
//
// Parses the namespace's record from `range` (a read of its key): NOT_FOUND when
// it is absent, DATA_LOSS when corrupt, FAILED_PRECONDITION when marked for a move.
absl::StatusOr<records::NamespaceRecord> NamespaceNotMoving(const std::string& ns,
                                                            const pb::RangeResponse& range) {
  if (range.kvs_size() == 0) {
    return NamespaceNotFound(ns);
  }
  records::NamespaceRecord rec;
  if (!rec.ParseFromString(range.kvs(0).value())) {
    return absl::DataLossError(absl::StrCat("corrupt namespace record for ", ns));
  }
  if (rec.moved()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace \"", ns, "\" has moved to etcd cluster \"", rec.draining_to(),
        "\"; this replica's view of it is stale: try again in a moment; nothing changed"));
  }
  if (!rec.draining_to().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace \"", ns, "\" is being rehomed to \"", rec.draining_to(),
        "\"; finish or abort the rehome first (its records are being copied); nothing "
        "changed"));
  }
  return rec;
}

}  // namespace

absl::StatusOr<v1::LockClass> Registry::NormalizeClass(v1::LockClass c) {
  if (auto s = keyspace::ValidateNamespaceName(c.namespace_()); !s.ok()) return s;
  if (auto s = keyspace::ValidateClassId(c.class_id()); !s.ok()) return s;
  if (auto s = keyspace::ValidateKeyPrefix(c.key_prefix()); !s.ok()) return s;
  if (c.mode() == v1::LOCK_MODE_UNSPECIFIED) c.set_mode(v1::LOCK_MODE_EXCLUSIVE);
  if (c.enforcement() == v1::ENFORCEMENT_UNSPECIFIED) c.set_enforcement(v1::ENFORCEMENT_FENCED);
  if (c.on_quorum_loss() == v1::ON_QUORUM_LOSS_UNSPECIFIED) {
    c.set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
  }
  for (const auto& [field, value, valid] :
       {std::tuple{"mode", static_cast<int>(c.mode()), v1::LockMode_IsValid(c.mode())},
        std::tuple{"enforcement", static_cast<int>(c.enforcement()),
                   v1::Enforcement_IsValid(c.enforcement())},
        std::tuple{"on_quorum_loss", static_cast<int>(c.on_quorum_loss()),
                   v1::OnQuorumLoss_IsValid(c.on_quorum_loss())}}) {
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("class ", field, " ", value, " is not one this holdfastd knows"));
    }
  }
  if (c.ttl_min_ms() == 0) c.set_ttl_min_ms(kTtlFloorMs);
  if (c.ttl_max_ms() == 0) c.set_ttl_max_ms(3600 * 1000);
  if (c.ttl_min_ms() < kTtlFloorMs || c.ttl_max_ms() > kTtlCeilingMs ||
      c.ttl_min_ms() > c.ttl_max_ms()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "class ttl bounds [", c.ttl_min_ms(), "ms, ", c.ttl_max_ms(),
        "ms] are invalid: need 1000ms <= ttl_min <= ttl_max <= ", kTtlCeilingMs, "ms"));
  }
  c.set_create_revision(0);
  return c;
}

absl::StatusOr<v1::LockClass> Registry::CheckCreateNamespace(
    const v1::CreateNamespaceRequest& req) {
  const v1::Namespace& n = req.namespace_();
  if (auto s = keyspace::ValidateNamespaceName(n.name()); !s.ok()) return s;
  if (n.held_lease_quota() < 0 || n.op_rate_quota() < 0) {
    return absl::InvalidArgumentError("quotas must be >= 0 (0 = unlimited)");
  }
  if (auto s = CheckHeldLeaseQuota(n.held_lease_quota()); !s.ok()) return s;
  if (auto s = CheckOpRateQuota(n.op_rate_quota()); !s.ok()) return s;
  if (n.tenant_id().size() > 256 || n.cluster_tier().size() > 63) {
    return absl::InvalidArgumentError("tenant_id (256) or cluster_tier (63 bytes) too long");
  }
  // Shown in tables (`holdfast ns list`): control characters would garble them.
  if (auto s = names::ValidatePlainText("tenant_id", n.tenant_id()); !s.ok()) return s;
  if (n.members_size() > 1000) return absl::InvalidArgumentError("at most 1000 members");
  for (const auto& m : n.members()) {
    if (auto s = spiffe::ValidatePattern(m); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("member pattern: ", s.message()));
    }
  }
  v1::LockClass def = req.default_class();
  def.set_namespace_(n.name());
  def.set_class_id(kCatchAllClassId);
  def.set_key_prefix("");
  return NormalizeClass(def);
}

absl::StatusOr<v1::Namespace> Registry::CreateNamespace(const v1::CreateNamespaceRequest& req,
                                                        etcd::Deadline d,
                                                        const std::string& also_absent) {
  const v1::Namespace& n = req.namespace_();
  auto cls = CheckCreateNamespace(req);
  if (!cls.ok()) return cls.status();

  records::NamespaceRecord rec;
  rec.set_tenant_id(n.tenant_id());
  rec.set_held_lease_quota(n.held_lease_quota());
  rec.set_op_rate_quota(n.op_rate_quota());
  rec.set_cluster_tier(n.cluster_tier());
  *rec.mutable_members() = n.members();
  pb::TxnRequest txn;
  AddCompare(&txn, keyspace::NamespaceKey(n.name()), pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(0);
  if (!also_absent.empty()) {
    AddCompare(&txn, also_absent, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
  }
  auto* put_ns = txn.add_success()->mutable_request_put();
  put_ns->set_key(keyspace::NamespaceKey(n.name()));
  put_ns->set_value(rec.SerializeAsString());
  auto* put_cls = txn.add_success()->mutable_request_put();
  put_cls->set_key(keyspace::ClassKey(n.name(), kCatchAllClassId));
  put_cls->set_value(RecordFromClass(*cls).SerializeAsString());
  auto t = etcd_->TxnSync(std::move(txn), d);
  if (!t.ok()) return t.status();
  if (!t->succeeded()) {
    return absl::AlreadyExistsError(absl::StrCat("namespace \"", n.name(), "\" already exists"));
  }
  v1::Namespace out = n;
  out.set_create_revision(t->header().revision());
  return out;
}

absl::StatusOr<v1::Namespace> Registry::GetNamespace(const std::string& name, etcd::Deadline d) {
  if (auto s = keyspace::ValidateNamespaceName(name); !s.ok()) return s;
  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey(name));
  auto resp = etcd_->RangeSync(r, d);
  if (!resp.ok()) return resp.status();
  if (resp->kvs_size() == 0) return NamespaceNotFound(name);
  records::NamespaceRecord rec;
  if (!rec.ParseFromString(resp->kvs(0).value())) {
    return absl::DataLossError(absl::StrCat("corrupt namespace record for ", name));
  }
  return NamespaceFromRecord(name, resp->kvs(0), rec);
}

absl::StatusOr<std::vector<v1::Namespace>> Registry::ListNamespaces(etcd::Deadline d,
                                                                   const std::string& after,
                                                                   size_t limit,
                                                                   size_t max_bytes) {
  size_t bytes = 0;
  // Skip-scan: ranges of one key, two per namespace (its record, then the next
  // key, from whose subtree it jumps), so the cost does not grow with the number
  // of sessions and holds. Record keys sort as the names do.
  std::vector<v1::Namespace> out;
  std::string from =
      after.empty() ? keyspace::NamespacesBegin() : keyspace::NamespaceKey(after) + '\0';
  const std::string end = keyspace::NamespacesEnd();
  int64_t revision = 0;
  while ((limit == 0 || out.size() < limit) && (max_bytes == 0 || bytes <= max_bytes)) {
    pb::RangeRequest r;
    r.set_key(from);
    r.set_range_end(end);
    r.set_limit(1);
    r.set_revision(revision);  // every step reads the same revision
    auto resp = etcd_->RangeSync(r, d);
    if (!resp.ok()) return resp.status();
    if (revision == 0) revision = resp->header().revision();
    if (resp->kvs_size() == 0) break;
    const auto& kv = resp->kvs(0);
    auto ns = keyspace::NamespaceOfKey(kv.key());
    if (!ns) {
      // Not a namespace's key (holdfast writes none; someone else did): stepped
      // over with all that shares its first segment, never the end of the list.
      const std::string rest = kv.key().substr(keyspace::NamespacesBegin().size());
      const size_t slash = rest.find('/');
      from = slash == std::string::npos
                 ? kv.key() + '\0'
                 : keyspace::PrefixEnd(keyspace::NamespacesBegin() + rest.substr(0, slash + 1));
      continue;
    }
    if (kv.key() == keyspace::NamespaceKey(*ns)) {
      records::NamespaceRecord rec;
      if (rec.ParseFromString(kv.value())) {
        out.push_back(NamespaceFromRecord(*ns, kv, rec));
        bytes += out.back().ByteSizeLong();
      }
      // The next key: names with '-' or '.' after this one ("a-b" after "a") sort
      // before its own keys ("a/..."), so the subtree is not skipped from here.
      from = kv.key() + '\0';
    } else {
      from = keyspace::PrefixEnd(keyspace::NamespacePrefix(*ns));  // past "<ns>/..."
    }
  }
  return out;
}

absl::StatusOr<v1::Namespace> Registry::UpdateNamespace(
    const v1::UpdateNamespaceRequest& req, etcd::Deadline d,
    const std::function<bool(const std::string&)>& is_admin) {
  if (auto s = keyspace::ValidateNamespaceName(req.name()); !s.ok()) return s;
  if ((req.has_held_lease_quota() && req.held_lease_quota() < 0) ||
      (req.has_op_rate_quota() && req.op_rate_quota() < 0)) {
    return absl::InvalidArgumentError("quotas must be >= 0 (0 = unlimited)");
  }
  if (req.has_held_lease_quota()) {
    if (auto s = CheckHeldLeaseQuota(req.held_lease_quota()); !s.ok()) return s;
  }
  if (req.has_op_rate_quota()) {
    if (auto s = CheckOpRateQuota(req.op_rate_quota()); !s.ok()) return s;
  }
  if (req.members_size() > 1000) return absl::InvalidArgumentError("at most 1000 members");
  for (const auto& m : req.members()) {
    if (auto s = spiffe::ValidatePattern(m); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("member pattern: ", s.message()));
    }
  }
  if (req.end_sessions_of_removed() && !req.set_members()) {
    return absl::InvalidArgumentError(
        "end_sessions_of_removed needs a new member list (set_members)");
  }
  // Members without set_members would be dropped, and an update of nothing
  // would rewrite the record all the same: both are a caller's mistake.
  if (req.members_size() > 0 && !req.set_members()) {
    return absl::InvalidArgumentError(
        "members given without set_members: set it to replace the member list");
  }
  if (!req.has_held_lease_quota() && !req.has_op_rate_quota() && !req.set_members()) {
    return absl::InvalidArgumentError(
        "nothing to change: give held_lease_quota, op_rate_quota, or set_members with the "
        "new list");
  }
  const std::string sessions = keyspace::SessionPrefix(req.name());
  auto add_session_read = [&](pb::TxnRequest* txn) {
    auto* rs = txn->add_success()->mutable_request_range();
    rs->set_key(sessions);
    rs->set_range_end(keyspace::PrefixEnd(sessions));
  };
  // The live sessions (lease -> owner) of a read that `members` leaves out.
  auto left_out = [&](const pb::RangeResponse& read,
                      const google::protobuf::RepeatedPtrField<std::string>& members) {
    std::map<int64_t, std::string> out;
    for (const auto& kv : read.kvs()) {
      auto lease = keyspace::ParseSessionKey(kv.key(), req.name());
      records::SessionRecord s;
      if (!lease || !s.ParseFromString(kv.value())) continue;
      const Caller owner{s.identity(), is_admin && is_admin(s.identity())};
      if (!CheckMember(owner, req.name(), members).ok()) out.emplace(*lease, s.identity());
    }
    return out;
  };
  // A few rounds when refusing is the answer to sessions left out: a session
  // opened between the read and the write (under the old list, so perhaps by an
  // identity the new one leaves out) makes the write fail and the check run again.
  for (int attempt = 0;; ++attempt) {
    pb::TxnRequest read_txn;
    read_txn.add_success()->mutable_request_range()->set_key(keyspace::NamespaceKey(req.name()));
    if (req.set_members()) add_session_read(&read_txn);
    auto read = etcd_->TxnSync(std::move(read_txn), d);
    if (!read.ok()) return read.status();
    const auto& ns_range = read->responses(0).response_range();
    auto parsed = NamespaceNotMoving(req.name(), ns_range);
    if (!parsed.ok()) return parsed.status();
    records::NamespaceRecord rec = *std::move(parsed);
    if (req.has_held_lease_quota()) rec.set_held_lease_quota(req.held_lease_quota());
    if (req.has_op_rate_quota()) rec.set_op_rate_quota(req.op_rate_quota());
    const bool check_sessions = req.set_members() && !req.end_sessions_of_removed();
    if (req.set_members()) *rec.mutable_members() = req.members();
    if (check_sessions) {
      auto removed = left_out(read->responses(1).response_range(), rec.members());
      if (!removed.empty()) {
        std::set<std::string> owners;
        for (const auto& r : removed) owners.insert(r.second);
        std::string named;
        int shown = 0;
        for (const auto& o : owners) {
          if (shown++ == 5) {
            absl::StrAppend(&named, ", and ", owners.size() - 5, " more");
            break;
          }
          absl::StrAppend(&named, named.empty() ? "" : ", ", o);
        }
        return absl::FailedPreconditionError(absl::StrCat(
            removed.size(), " live session", removed.size() == 1 ? "" : "s",
            " of namespace \"", req.name(), "\" belong to identities the new members do not "
            "admit (", named, "); end them with the change (holdfast ns set "
            "--end-sessions-of-removed), or close them first"));
      }
    }
    // What the sessions left out hold and wait for, as read before the write.
    // Used again after it: every write that relies on it is guarded.
    std::map<int64_t, Involvement> involved;
    if (req.end_sessions_of_removed()) {
      // Ending a session that holds a lock forces that lock open, which takes two
      // admins (ARCHITECTURE §8): one admin's member change never does it. Sessions
      // that hold locks are refused here, changing nothing; one that takes a lock
      // between this read and the write is left alone after it (below).
      const auto owners = left_out(read->responses(1).response_range(), rec.members());
      auto read_before = ReadInvolvement(etcd_, req.name(), LeasesOf(owners), d);
      if (!read_before.ok()) return read_before.status();
      involved = std::move(*read_before);
      std::map<int64_t, std::vector<std::string>> holding;
      for (const auto& [lease, inv] : involved) {
        if (inv.live && !inv.held.empty()) holding[lease] = inv.held;
      }
      if (!holding.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sessions of namespace \"", req.name(), "\" that the new members leave out hold "
            "locks (", NameHolds(holding, owners), "); ending them would force those locks "
            "open, which takes two admins: have them released, or force-release them "
            "(holdfast force request NS/KEY, approved by another admin), then run this again; "
            "nothing changed"));
      }
    }
    // Guarded by the record read: a concurrent update makes this one fail, not lost.
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::NamespaceKey(req.name()), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(ns_range.kvs(0).mod_revision());
    if (check_sessions) {
      auto* none_since = AddCompare(&txn, sessions, pb::Compare::CREATE, pb::Compare::LESS);
      none_since->set_create_revision(read->header().revision() + 1);
      none_since->set_range_end(keyspace::PrefixEnd(sessions));
    }
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::NamespaceKey(req.name()));
    put->set_value(rec.SerializeAsString());
    // Sessions are opened only inside the namespace record they read (a compare
    // on it): every one opened after this write was admitted by the new list, so
    // the sessions read with the write are all the list can leave out.
    if (req.end_sessions_of_removed()) {
      add_session_read(&txn);
      auto* slots = txn.add_success()->mutable_request_range();
      slots->set_key(keyspace::SlotPrefix(req.name()));
      slots->set_range_end(keyspace::PrefixEnd(keyspace::SlotPrefix(req.name())));
    }
    txn.add_failure()->mutable_request_range()->set_key(keyspace::NamespaceKey(req.name()));
    auto t = etcd_->TxnSync(std::move(txn), d);
    if (!t.ok()) return t.status();
    if (!t->succeeded()) {
      const auto& now = t->responses(0).response_range();
      const bool ns_changed =
          now.kvs_size() == 0 || now.kvs(0).mod_revision() != ns_range.kvs(0).mod_revision();
      if (ns_changed) return absl::AbortedError("the namespace changed meanwhile; try again");
      if (attempt == 9) {
        return absl::AbortedError(absl::StrCat(
            "sessions kept opening in namespace \"", req.name(), "\" while its members were "
            "checked; try again, or pass end_sessions_of_removed"));
      }
      continue;  // a session was opened meanwhile: check again
    }
    if (req.end_sessions_of_removed()) {
      // The new list is in place: no session it leaves out can start a grant or a
      // wait any more. Each of them is ended if it holds nothing
      // (EndSessionHoldingNothing); one that took a lock since the check above is
      // kept, and named.
      std::map<int64_t, std::string> slot_of;  // session -> its quota slot key
      for (const auto& kv : t->responses(2).response_range().kvs()) {
        int64_t lease = 0;
        if (absl::SimpleAtoi(kv.value(), &lease)) slot_of[lease] = kv.key();
      }
      auto owners = left_out(t->responses(1).response_range(), rec.members());
      // Read only the sessions opened since the check (the others as read then).
      std::vector<int64_t> unread;
      for (const auto& [lease, owner] : owners) {
        if (!involved.count(lease)) unread.push_back(lease);
      }
      auto read_after = ReadInvolvement(etcd_, req.name(), unread, d);
      if (!read_after.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "the new members of namespace \"", req.name(), "\" are in place, but the sessions "
            "they leave out could not be read (", read_after.status().message(), "); run the "
            "same command again"));
      }
      involved.merge(*read_after);
      std::erase_if(involved, [&](const auto& e) { return !owners.count(e.first); });
      std::map<int64_t, std::vector<std::string>> kept;
      std::string failed;
      // Every wait of them first, so that no release hands one of them a lock
      // while the others are ended (a guard that fails here is read again below).
      for (auto& [lease, inv] : involved) {
        if (!inv.live) continue;
        auto withdrawn = WithdrawWaits(etcd_, req.name(), lease, inv, d);
        if (withdrawn.ok() && *withdrawn) {
          inv.waits.clear();
          inv.stray_claims.clear();
        }
      }
      for (auto& [lease, inv] : involved) {
        auto slot = slot_of.find(lease);
        auto held = EndSessionHoldingNothing(etcd_, req.name(), lease, std::move(inv),
                                             slot == slot_of.end() ? "" : slot->second, d);
        if (!held.ok()) {
          absl::StrAppend(&failed, failed.empty() ? "" : "; ", "session ", lease, " of ",
                          owners[lease], ": ", held.status().message());
        } else if (!held->empty()) {
          kept[lease] = std::move(*held);
        }
      }
      if (!failed.empty()) {
        return absl::UnavailableError(absl::StrCat(
            "the new members of namespace \"", req.name(), "\" are in place, but ending the "
            "sessions they leave out failed (", failed, "); run the same command again"));
      }
      if (!kept.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the new members of namespace \"", req.name(), "\" are in place and the sessions "
            "they leave out that held nothing are ended, but some took a lock meanwhile and "
            "were kept (", NameHolds(kept, owners), "): ending them would force those locks "
            "open, which takes two admins; have them released, or force-release them "
            "(holdfast force request NS/KEY, approved by another admin), then run the same "
            "command again"));
      }
    }
    mvccpb::KeyValue kv = ns_range.kvs(0);
    return NamespaceFromRecord(req.name(), kv, rec);
  }
}

absl::Status Registry::DeleteNamespace(const std::string& name, etcd::Deadline d,
                                       const std::string& also_absent) {
  if (auto s = keyspace::ValidateNamespaceName(name); !s.ok()) return s;
  // The record is read first: one marked for a move is not deleted here (on the
  // old home it is the copy being moved, or the one left behind, and its
  // placement names the new home), whatever this replica's view of the move.
  // (A corrupt record cannot say so; deleting is the way out of it.)
  pb::RangeRequest read;
  read.set_key(keyspace::NamespaceKey(name));
  auto got = etcd_->RangeSync(read, d);
  if (!got.ok()) return got.status();
  if (auto rec = NamespaceNotMoving(name, *got);
      !rec.ok() && rec.status().code() != absl::StatusCode::kDataLoss) {
    return rec.status();
  }
  pb::TxnRequest txn;
  if (!also_absent.empty()) {
    AddCompare(&txn, also_absent, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
  }
  AddCompare(&txn, keyspace::NamespaceKey(name), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(got->kvs(0).mod_revision());
  const std::string sessions = keyspace::SessionPrefix(name);
  auto* no_sessions =
      AddCompare(&txn, sessions, pb::Compare::CREATE, pb::Compare::EQUAL);
  no_sessions->set_create_revision(0);
  no_sessions->set_range_end(keyspace::PrefixEnd(sessions));
  txn.add_success()->mutable_request_delete_range()->set_key(keyspace::NamespaceKey(name));
  auto* sub = txn.add_success()->mutable_request_delete_range();
  sub->set_key(keyspace::NamespacePrefix(name));
  sub->set_range_end(keyspace::PrefixEnd(keyspace::NamespacePrefix(name)));
  auto* probe = txn.add_failure()->mutable_request_range();
  probe->set_key(keyspace::NamespaceKey(name));
  probe->set_count_only(true);
  auto* live = txn.add_failure()->mutable_request_range();
  live->set_key(sessions);
  live->set_range_end(keyspace::PrefixEnd(sessions));
  live->set_count_only(true);
  auto t = etcd_->TxnSync(std::move(txn), d);
  if (!t.ok()) return t.status();
  if (t->succeeded()) return absl::OkStatus();
  if (t->responses(0).response_range().count() == 0) return NamespaceNotFound(name);
  if (t->responses(1).response_range().count() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace \"", name, "\" has live sessions; close them (or let them expire) first"));
  }
  return absl::AbortedError(absl::StrCat(
      "namespace \"", name, "\" was changed meanwhile; try again; nothing changed"));
}

absl::StatusOr<v1::LockClass> Registry::CreateClass(const v1::LockClass& in, etcd::Deadline d) {
  auto cls = NormalizeClass(in);
  if (!cls.ok()) return cls.status();
  const std::string& ns = cls->namespace_();
  // Read the namespace's classes, check the prefix is new, then write guarded by
  // "no class changed since the read" so two admins cannot both pass the check.
  pb::TxnRequest read;
  auto* rn = read.add_success()->mutable_request_range();
  rn->set_key(keyspace::NamespaceKey(ns));
  auto* rc = read.add_success()->mutable_request_range();
  rc->set_key(keyspace::ClassPrefix(ns));
  rc->set_range_end(keyspace::PrefixEnd(keyspace::ClassPrefix(ns)));
  auto snap = etcd_->TxnSync(std::move(read), d);
  if (!snap.ok()) return snap.status();
  if (auto rec = NamespaceNotMoving(ns, snap->responses(0).response_range()); !rec.ok()) {
    return rec.status();
  }
  for (const auto& kv : snap->responses(1).response_range().kvs()) {
    auto id = keyspace::ParseClassKey(kv.key(), ns).value_or("");
    if (id == cls->class_id()) {
      return absl::AlreadyExistsError(
          absl::StrCat("class \"", id, "\" already exists in namespace \"", ns, "\""));
    }
    records::ClassRecord r;
    if (r.ParseFromString(kv.value()) && r.key_prefix() == cls->key_prefix()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "class \"", id, "\" already has key prefix \"", r.key_prefix(), "\""));
    }
  }
  const int64_t rev = snap->header().revision();
  pb::TxnRequest txn;
  AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::LESS)
      ->set_mod_revision(rev + 1);
  AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::CREATE, pb::Compare::GREATER)
      ->set_create_revision(0);
  AddNoClassChangedSince(&txn, ns, rev);
  auto* unchanged_count = AddCompare(&txn, keyspace::ClassKey(ns, cls->class_id()),
                                     pb::Compare::CREATE, pb::Compare::EQUAL);
  unchanged_count->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::ClassKey(ns, cls->class_id()));
  put->set_value(RecordFromClass(*cls).SerializeAsString());
  auto t = etcd_->TxnSync(std::move(txn), d);
  if (!t.ok()) return t.status();
  if (!t->succeeded()) {
    return absl::AbortedError("the namespace's classes changed meanwhile; try again");
  }
  v1::LockClass out = *cls;
  out.set_create_revision(t->header().revision());
  return out;
}

absl::StatusOr<v1::LockClass> Registry::GetClass(const std::string& ns, const std::string& id,
                                                 etcd::Deadline d) {
  if (auto s = keyspace::ValidateNamespaceName(ns); !s.ok()) return s;
  if (auto s = keyspace::ValidateClassId(id); !s.ok()) return s;
  pb::RangeRequest r;
  r.set_key(keyspace::ClassKey(ns, id));
  auto resp = etcd_->RangeSync(r, d);
  if (!resp.ok()) return resp.status();
  if (resp->kvs_size() == 0) {
    return absl::NotFoundError(
        absl::StrCat("class \"", id, "\" does not exist in namespace \"", ns, "\""));
  }
  return ClassFromKv(ns, id, resp->kvs(0));
}

absl::StatusOr<std::vector<v1::LockClass>> Registry::ListClasses(const std::string& ns,
                                                                 etcd::Deadline d,
                                                                 const std::string& after,
                                                                 size_t limit) {
  if (auto s = keyspace::ValidateNamespaceName(ns); !s.ok()) return s;
  pb::TxnRequest read;
  read.add_success()->mutable_request_range()->set_key(keyspace::NamespaceKey(ns));
  auto* rc = read.add_success()->mutable_request_range();
  rc->set_key(after.empty() ? keyspace::ClassPrefix(ns) : keyspace::ClassKey(ns, after) + '\0');
  rc->set_range_end(keyspace::PrefixEnd(keyspace::ClassPrefix(ns)));
  rc->set_limit(static_cast<int64_t>(limit));
  auto t = etcd_->TxnSync(std::move(read), d);
  if (!t.ok()) return t.status();
  if (t->responses(0).response_range().kvs_size() == 0) return NamespaceNotFound(ns);
  std::vector<v1::LockClass> out;
  for (const auto& kv : t->responses(1).response_range().kvs()) {
    auto c = ClassFromKv(ns, keyspace::ParseClassKey(kv.key(), ns).value_or(""), kv);
    if (!c.ok()) return c.status();
    out.push_back(std::move(*c));
  }
  return out;
}

absl::Status Registry::DeleteClass(const std::string& ns, const std::string& id,
                                   etcd::Deadline d) {
  auto cls = GetClass(ns, id, d);
  if (!cls.ok()) return cls.status();
  if (cls->key_prefix().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "class \"", id, "\" is the catch-all class of \"", ns, "\" and cannot be deleted"));
  }
  // The holds that may belong to the class: every hold under its prefix (a longer
  // prefix's class may own some; the record says). Read a page at a time, so
  // that any number of holds fits the client's receive limit. The later pages
  // are read as they are then (a long scan read at the first page's revision
  // could fall behind a compaction): a hold of the class that stands at the
  // commit and was created by the first page's revision stood at every read, so
  // it was counted, and one created after fails the commit's guard.
  const std::string holds = keyspace::HoldPrefix(ns, cls->key_prefix());
  constexpr int64_t kPage = 256;
  pb::TxnRequest both;
  auto* r = both.add_success()->mutable_request_range();
  r->set_key(holds);
  r->set_range_end(keyspace::PrefixEnd(holds));
  r->set_limit(kPage);
  both.add_success()->mutable_request_range()->set_key(keyspace::NamespaceKey(ns));
  auto read = etcd_->TxnSync(std::move(both), d);
  if (!read.ok()) return read.status();
  const auto& ns_range = read->responses(1).response_range();
  if (auto rec = NamespaceNotMoving(ns, ns_range); !rec.ok()) return rec.status();
  int64_t held = 0;
  pb::RangeResponse page = read->responses(0).response_range();
  while (true) {
    for (const auto& kv : page.kvs()) {
      records::HoldRecord rec;
      if (rec.ParseFromString(kv.value()) && rec.class_id() == id) ++held;
    }
    if (!page.more() || page.kvs_size() == 0) break;
    pb::RangeRequest next;
    next.set_key(page.kvs(page.kvs_size() - 1).key() + '\0');
    next.set_range_end(keyspace::PrefixEnd(holds));
    next.set_limit(kPage);
    auto got = etcd_->RangeSync(next, d);
    if (!got.ok()) return got.status();
    page = *std::move(got);
  }
  if (held > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "class \"", id, "\" has ", held, " hold(s); it can be deleted once they are released"));
  }
  // Guarded: no hold appeared under the prefix since the read (a grant in flight
  // compares the class's mod_revision, so one of the two fails).
  pb::TxnRequest txn;
  AddCompare(&txn, keyspace::ClassKey(ns, id), pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(cls->create_revision());
  auto* unchanged = AddCompare(&txn, holds, pb::Compare::CREATE, pb::Compare::LESS);
  unchanged->set_range_end(keyspace::PrefixEnd(holds));
  unchanged->set_create_revision(read->header().revision() + 1);
  // And the namespace record as read (not marked for a rehome since).
  AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(ns_range.kvs(0).mod_revision());
  txn.add_success()->mutable_request_delete_range()->set_key(keyspace::ClassKey(ns, id));
  auto t = etcd_->TxnSync(std::move(txn), d);
  if (!t.ok()) return t.status();
  if (!t->succeeded()) {
    return absl::AbortedError("the class, its holds or its namespace changed meanwhile; try again");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Epoch> Registry::GetEpoch(etcd::Deadline d) {
  pb::RangeRequest r;
  r.set_key(keyspace::EpochKey());
  auto resp = etcd_->RangeSync(r, d);
  if (!resp.ok()) return resp.status();
  v1::Epoch out;
  out.set_observed_cluster_id(absl::StrCat(resp->header().cluster_id()));
  if (resp->kvs_size() > 0) {
    records::EpochRecord rec;
    if (!rec.ParseFromString(resp->kvs(0).value())) {
      return absl::DataLossError("corrupt epoch record (/holdfast/epoch)");
    }
    out.set_epoch(rec.epoch());
    out.set_etcd_cluster_id(absl::StrCat(rec.etcd_cluster_id()));
    out.set_advanced_at_unix_ms(rec.advanced_at_unix_ms());
    out.set_reason(rec.reason());
  }
  return out;
}

}  // namespace holdfast::lock
