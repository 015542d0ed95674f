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
