#include "lock/snapshot.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lock/keyspace.h"
#include "lock/token.h"
#include "lock/txn_util.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;

namespace {
void AddRange(google::protobuf::RepeatedPtrField<pb::RequestOp>* ops, std::string key,
              std::string end = "") {
  auto* r = ops->Add()->mutable_request_range();
  r->set_key(std::move(key));
  r->set_range_end(std::move(end));
}
}  // namespace

void DeleteClaimOfDeadWaiter(const KeySnapshot& snap, const std::string& ns,
                             const std::string& lock_key, int64_t lease,
                             etcdserverpb::TxnRequest* txn) {
  for (const HoldEntry& h : snap.holds) {
    if (h.lease == lease) return;
  }
  AddCompare(txn, keyspace::HoldKey(ns, lock_key, lease), etcdserverpb::Compare::CREATE,
             etcdserverpb::Compare::EQUAL)
      ->set_create_revision(0);
  txn->add_success()->mutable_request_delete_range()->set_key(
      keyspace::ClaimKey(ns, lock_key, lease));
}

void RemoveDeadWaiter(const KeySnapshot& snap, const std::string& ns,
                      const std::string& lock_key, const WaiterEntry& dead,
                      etcdserverpb::TxnRequest* txn) {
  const std::string wait_key = keyspace::WaitKey(ns, lock_key, dead.lease);
  AddCompare(txn, wait_key, etcdserverpb::Compare::MOD, etcdserverpb::Compare::EQUAL)
      ->set_mod_revision(dead.mod_revision);
  txn->add_success()->mutable_request_delete_range()->set_key(wait_key);
  DeleteClaimOfDeadWaiter(snap, ns, lock_key, dead.lease, txn);
}

void AddSnapshotReads(const std::string& ns, int64_t session, const std::string& lock_key,
                      google::protobuf::RepeatedPtrField<pb::RequestOp>* ops) {
  AddRange(ops, keyspace::NamespaceKey(ns));                                    // 0
  AddRange(ops, keyspace::SessionKey(ns, session));                             // 1
  AddRange(ops, keyspace::EpochKey());                                          // 2
  AddRange(ops, keyspace::ClassPrefix(ns), keyspace::PrefixEnd(keyspace::ClassPrefix(ns)));  // 3
  AddKeyReads(ns, session, lock_key, ops);                                      // 4 – 6
}

void AddKeyReads(const std::string& ns, int64_t session, const std::string& lock_key,
                 google::protobuf::RepeatedPtrField<pb::RequestOp>* ops) {
  AddRange(ops, keyspace::HoldRangeBegin(ns, lock_key), keyspace::HoldRangeEnd(ns, lock_key));
  AddRange(ops, keyspace::WaitRangeBegin(ns, lock_key), keyspace::WaitRangeEnd(ns, lock_key));
  AddRange(ops, keyspace::ClaimPrefix(ns, session),
           keyspace::PrefixEnd(keyspace::ClaimPrefix(ns, session)));
  ops->rbegin()->mutable_request_range()->set_count_only(true);
}

absl::StatusOr<KeySnapshot> ParseSnapshot(
    const pb::ResponseHeader& header,
    const google::protobuf::RepeatedPtrField<pb::ResponseOp>& responses, int first) {
  if (responses.size() < first + 7) {
    return absl::InternalError("etcd: snapshot read returned too few responses");
  }
  auto range = [&](int i) -> const pb::RangeResponse& {
    return responses.Get(first + i).response_range();
  };
  KeySnapshot s;
  s.namespace_exists = range(0).kvs_size() > 0;
  if (s.namespace_exists && !s.ns_record.ParseFromString(range(0).kvs(0).value())) {
    return absl::DataLossError("corrupt namespace record in etcd");
  }
  if (s.namespace_exists) s.ns_mod_revision = range(0).kvs(0).mod_revision();
  if (range(1).kvs_size() > 0) {
    records::SessionRecord rec;
    if (!rec.ParseFromString(range(1).kvs(0).value())) {
      return absl::DataLossError("corrupt session record in etcd");
    }
    s.session = std::move(rec);
    s.session_mod_revision = range(1).kvs(0).mod_revision();
  }
  if (range(2).kvs_size() > 0) {
    EpochEntry e;
    if (!e.record.ParseFromString(range(2).kvs(0).value())) {
      return absl::DataLossError("corrupt epoch record in etcd (/holdfast/epoch)");
    }
    e.mod_revision = range(2).kvs(0).mod_revision();
    s.epoch = std::move(e);
  }
  for (const auto& kv : range(3).kvs()) {
    ClassEntry c;
    auto id = keyspace::ParseClassKey(kv.key(), keyspace::NamespaceOfKey(kv.key()).value_or(""));
    if (!id || !c.record.ParseFromString(kv.value())) {
      return absl::DataLossError(absl::StrCat("corrupt class record in etcd at ", kv.key()));
    }
    c.class_id = *id;
    c.mod_revision = kv.mod_revision();
    s.classes.push_back(std::move(c));
  }
  if (auto st = ParseKeyReads(header, responses, first + 4, &s); !st.ok()) return st;
  return s;
}

absl::Status ParseKeyReads(const pb::ResponseHeader& header,
                           const google::protobuf::RepeatedPtrField<pb::ResponseOp>& responses,
                           int first, KeySnapshot* s) {
  if (responses.size() < first + 3) {
    return absl::InternalError("etcd: key read returned too few responses");
  }
  auto range = [&](int i) -> const pb::RangeResponse& {
    return responses.Get(first + i).response_range();
  };
  s->revision = header.revision();
  s->cluster_id = header.cluster_id();
  s->holds.clear();
  s->waiters.clear();
  for (const auto& kv : range(0).kvs()) {
    auto parsed = keyspace::ParseHoldKey(kv.key());
    HoldEntry h;
    if (!parsed || !h.record.ParseFromString(kv.value())) {
      return absl::DataLossError("corrupt hold record in etcd");
    }
    h.lease = parsed->lease;
    h.create_revision = kv.create_revision();
    h.mod_revision = kv.mod_revision();
    s->holds.push_back(std::move(h));
  }
  for (const auto& kv : range(1).kvs()) {
    auto parsed = keyspace::ParseWaitKey(kv.key());
    WaiterEntry w;
    if (!parsed || !w.record.ParseFromString(kv.value())) {
      return absl::DataLossError("corrupt waiter record in etcd");
    }
    w.lease = parsed->lease;
    w.create_revision = kv.create_revision();
    w.mod_revision = kv.mod_revision();
    s->waiters.push_back(std::move(w));
  }
  std::sort(s->waiters.begin(), s->waiters.end(),
            [](const WaiterEntry& a, const WaiterEntry& b) {
              return a.create_revision < b.create_revision;
            });
  s->session_claims = range(2).count();
  return absl::OkStatus();
}

const ClassEntry* ResolveClass(const std::vector<ClassEntry>& classes,
                               const std::string& lock_key) {
  const ClassEntry* best = nullptr;
  for (const auto& c : classes) {
    const auto& p = c.record.key_prefix();
    if (lock_key.compare(0, p.size(), p) == 0 &&
        (best == nullptr || p.size() > best->record.key_prefix().size())) {
      best = &c;
    }
  }
  return best;
}

absl::Status CheckEpoch(const std::optional<EpochEntry>& epoch, uint64_t answering_cluster_id) {
  if (!epoch) {
    return absl::FailedPreconditionError(
        "no epoch record in etcd (/holdfast/epoch): grants are refused; restart holdfastd "
        "to create it, or run `holdfast epoch advance --reason restore` after a restore");
  }
  if (epoch->record.etcd_cluster_id() != answering_cluster_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd cluster id ", answering_cluster_id, " differs from the epoch record's (",
        epoch->record.etcd_cluster_id(), ", epoch ", epoch->record.epoch(),
        "): the cluster was restored or replaced, so grants are refused until an operator "
        "runs `holdfast epoch advance --reason restore`"));
  }
  if (epoch->record.epoch() < 1 || epoch->record.epoch() > token::kMaxEpoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch->record.epoch(), " is outside [1, 2^15)"));
  }
  return absl::OkStatus();
}

v1::HoldInfo MakeHoldInfo(const std::string& lock_key, const HoldEntry& hold,
                          const std::vector<ClassEntry>& classes) {
  v1::HoldInfo info;
  info.set_lock_key(lock_key);
  info.set_session_id(hold.lease);
  info.set_grant_revision(hold.create_revision);
  info.set_epoch(hold.record.epoch());
  auto t = token::Make(hold.record.epoch(), hold.create_revision);
  info.set_token(t.ok() ? *t : 0);
  info.set_shared(hold.record.shared());
  info.set_class_id(hold.record.class_id());
  info.set_identity(hold.record.identity());
  info.set_holder_meta(hold.record.holder_meta());
  info.set_granted_at_unix_ms(hold.record.granted_at_unix_ms());
  for (const auto& c : classes) {
    if (c.class_id == hold.record.class_id()) {
      info.set_enforcement(static_cast<v1::Enforcement>(c.record.enforcement()));
      info.set_on_quorum_loss(static_cast<v1::OnQuorumLoss>(c.record.on_quorum_loss()));
    }
  }
  return info;
}

v1::WaiterInfo MakeWaiterInfo(const std::string& lock_key, const WaiterEntry& waiter) {
  v1::WaiterInfo info;
  info.set_lock_key(lock_key);
  info.set_session_id(waiter.lease);
  info.set_shared(waiter.record.shared());
  info.set_identity(waiter.record.identity());
  info.set_deadline_unix_ms(waiter.record.deadline_unix_ms());
  info.set_create_revision(waiter.create_revision);
  info.set_enqueued_at_unix_ms(waiter.record.enqueued_at_unix_ms());
  return info;
}

}  // namespace holdfast::lock
