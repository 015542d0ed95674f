// Small builders shared by the engine's and the registry's etcd transactions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::lock {

// Adds `compare(target of key) result ?` to the txn; the caller sets the value
// (and range_end for a range compare) on the returned Compare.
inline etcdserverpb::Compare* AddCompare(etcdserverpb::TxnRequest* txn, std::string key,
                                         etcdserverpb::Compare::CompareTarget target,
                                         etcdserverpb::Compare::CompareResult result) {
  auto* c = txn->add_compare();
  c->set_key(std::move(key));
  c->set_target(target);
  c->set_result(result);
  return c;
}

// Adds "no class of namespace `ns` was created or changed after revision `rev`"
// (every class key's mod_revision <= rev). A class of a longer prefix created
// since would decide a key differently: its mode, TTL bounds and enforcement.
// A deleted class leaves no mod revision, so callers that depend on one class
// also compare that class's own key.
inline void AddNoClassChangedSince(etcdserverpb::TxnRequest* txn, const std::string& ns,
                                   int64_t rev) {
  auto* c = AddCompare(txn, keyspace::ClassPrefix(ns), etcdserverpb::Compare::MOD,
                       etcdserverpb::Compare::LESS);
  c->set_range_end(keyspace::PrefixEnd(keyspace::ClassPrefix(ns)));
  c->set_mod_revision(rev + 1);
}

// This server's wall clock, for records people read (grant times, deadlines).
inline int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

// Puts the audit mark in the success branch: the holds this transaction deletes
// were released (or, with a force mark, forced), not expired (ARCHITECTURE §7).
inline void AddAuditMark(etcdserverpb::TxnRequest* txn,
                         records::AuditMark mark = records::AuditMark()) {
  if (mark.kind().empty()) mark.set_kind("release");
  mark.set_at_unix_ms(NowUnixMs());
  auto* put = txn->add_success()->mutable_request_put();
  put->set_key(keyspace::AuditMarkKey());
  put->set_value(mark.SerializeAsString());
}

}  // namespace holdfast::lock
