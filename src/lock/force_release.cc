#include "lock/force_release.h"

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"
#include "common/status.h"
#include "etcd/errors.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/snapshot.h"
#include "lock/token.h"
#include "lock/txn_util.h"

namespace holdfast::lock {
namespace {

namespace pb = ::etcdserverpb;

v1::ForceRequest ToApi(const std::string& id, const records::ForceRequestRecord& r) {
  v1::ForceRequest out;
  out.set_request_id(id);
  out.set_namespace_(r.ns());
  out.set_lock_key(r.lock_key());
  out.set_session_id(r.session_id());
  out.set_token(r.token());
  out.set_holder(r.holder_identity());
  out.set_requester(r.requester());
  out.set_reason(r.reason());
  out.set_requested_at_unix_ms(r.requested_at_unix_ms());
  out.set_expires_at_unix_ms(r.expires_at_unix_ms());
  out.set_class_is_fenced(r.class_was_fenced());
  return out;
}

bool ValidRequestId(const std::string& id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!absl::ascii_isdigit(c) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

// Past the expiry the request announced. etcd gives a lease its whole TTL again
// when its leader changes, so the request key may outlive it; the announced
// expiry is the one that counts (this server's clock against the requester's:
// they may differ by their skew).
bool PastExpiry(const records::ForceRequestRecord& r) {
  return r.expires_at_unix_ms() > 0 && NowUnixMs() >= r.expires_at_unix_ms();
}

}  // namespace

absl::StatusOr<v1::ForceRequest> ForceReleases::Request(const std::string& requester,
                                                        const v1::RequestForceReleaseRequest& req,
                                                        etcd::Deadline d) {
  const std::string& ns = req.namespace_();
  const std::string& key = req.lock_key();
  HF_RETURN_IF_ERROR(keyspace::ValidateNamespaceName(ns));
  HF_RETURN_IF_ERROR(keyspace::ValidateLockKey(key));
  if (absl::StripAsciiWhitespace(req.reason()).empty()) {
    return absl::InvalidArgumentError("a force-release needs a reason (--reason)");
  }
  if (req.reason().size() > kMaxReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason is ", req.reason().size(), " bytes; at most ", kMaxReasonBytes));
  }
  // The reason is read in tables and stored as text: a NUL would cut it short in
  // PostgreSQL (and not in SQLite), other control characters garble the listings.
  HF_RETURN_IF_ERROR(names::ValidatePlainText("the reason", req.reason()));
  pb::TxnRequest read;
  AddSnapshotReads(ns, /*session=*/0, key, read.mutable_success());
  HF_ASSIGN_OR_RETURN(auto t, etcd_->TxnSync(std::move(read), d));
  HF_ASSIGN_OR_RETURN(KeySnapshot snap, ParseSnapshot(t.header(), t.responses()));
  if (!snap.namespace_exists) {
    return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist"));
  }
  const HoldEntry* hold = nullptr;
  for (const auto& h : snap.holds) {
    if (req.session_id() != 0 && h.lease != req.session_id()) continue;
    if (hold != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", key, "\" has ", snap.holds.size(),
          " shared holders; name the one to release with its session id (--session)"));
    }
    hold = &h;
  }
  if (hold == nullptr) {
    return absl::NotFoundError(
        req.session_id() != 0
            ? absl::StrCat("session ", req.session_id(), " holds no lock on \"", key, "\" in \"",
                           ns, "\"")
            : absl::StrCat("nobody holds \"", key, "\" in namespace \"", ns, "\""));
  }
  const ClassEntry* cls = ResolveClass(snap.classes, key);
  records::ForceRequestRecord rec;
  rec.set_ns(ns);
  rec.set_lock_key(key);
  rec.set_session_id(hold->lease);
  rec.set_grant_revision(hold->create_revision);
  rec.set_token(token::Make(hold->record.epoch(), hold->create_revision).value_or(0));
  rec.set_requester(requester);
  rec.set_reason(req.reason());
  rec.set_requested_at_unix_ms(NowUnixMs());
  rec.set_expires_at_unix_ms(rec.requested_at_unix_ms() + request_ttl_.count() * 1000);
  rec.set_holder_identity(hold->record.identity());
  // Advisory if the hold was granted so, or its class says so now (holds granted
  // before the flag existed): the safe side needs the acknowledgement.
  rec.set_class_was_fenced(
      !hold->record.advisory() &&
      !(cls != nullptr && cls->record.enforcement() == v1::ENFORCEMENT_ADVISORY));

  pb::LeaseGrantRequest g;
  g.set_ttl(request_ttl_.count());
  HF_ASSIGN_OR_RETURN(auto lease, etcd_->LeaseGrantSync(g, d));
  if (!lease.error().empty()) return absl::UnavailableError("etcd: " + lease.error());
  const std::string id = absl::StrFormat("%016x", absl::Uniform<uint64_t>(absl::BitGen()));
  pb::TxnRequest txn;
  // Only while the hold is still the one named.
  AddCompare(&txn, keyspace::HoldKey(ns, key, hold->lease), pb::Compare::CREATE,
             pb::Compare::EQUAL)
      ->set_create_revision(hold->create_revision);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::ForceRequestKey(id));
  put->set_value(rec.SerializeAsString());
  put->set_lease(lease.id());
  // An unknown outcome keeps the lease: a request that did land still expires
  // as announced.
  HF_ASSIGN_OR_RETURN(auto done, etcd_->TxnSync(std::move(txn), d));
  if (!done.succeeded()) {
    // No request was written: its lease goes now rather than at the end of its
    // TTL (best effort).
    pb::LeaseRevokeRequest revoke;
    revoke.set_id(lease.id());
    etcd_->LeaseRevoke(revoke, etcd::DeadlineIn(std::chrono::seconds(5)), [](auto) {});
    return absl::AbortedError(
        absl::StrCat("the hold of \"", key, "\" changed while the request was made; try again"));
  }
  return ToApi(id, rec);
}

absl::StatusOr<v1::ApproveForceReleaseResponse> ForceReleases::Approve(
    const std::string& approver, const v1::ApproveForceReleaseRequest& req, etcd::Deadline d) {
  if (!ValidRequestId(req.request_id())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", req.request_id(), "\" is not a request id (16 lower-case hex digits, from `force "
        "request`)"));
  }
  pb::RangeRequest r;
  r.set_key(keyspace::ForceRequestKey(req.request_id()));
  HF_ASSIGN_OR_RETURN(auto got, etcd_->RangeSync(r, d));
  if (got.kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("no pending force-release request ",
                                            req.request_id(),
                                            " (it expired, or was approved already)"));
  }
  records::ForceRequestRecord rec;
  if (!rec.ParseFromString(got.kvs(0).value())) {
    return absl::DataLossError("corrupt force-release request in etcd");
  }
  if (PastExpiry(rec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "force-release request ", req.request_id(), " expired ",
        NowUnixMs() - rec.expires_at_unix_ms(),
        "ms ago (audit.force_request_ttl); ask again with `holdfast force request`; nothing "
        "released"));
  }
  if (approver == rec.requester()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a force-release needs two people: ", approver,
        " requested it, so another admin must approve it; nothing released"));
  }
  // Fenced as it is now, not as it was at the request: a class made advisory
  // since (its enforcement changed, or a new advisory class now matches the key)
  // leaves the holder unfenced too, and needs the acknowledgement. The classes
  // read here are compared in the release's transaction.
  pb::TxnRequest read;
  AddSnapshotReads(rec.ns(), /*session=*/0, rec.lock_key(), read.mutable_success());
  HF_ASSIGN_OR_RETURN(auto now_read, etcd_->TxnSync(std::move(read), d));
  HF_ASSIGN_OR_RETURN(KeySnapshot snap, ParseSnapshot(now_read.header(), now_read.responses()));
  const ClassEntry* cls = ResolveClass(snap.classes, rec.lock_key());
  const bool class_advisory_now =
      cls != nullptr && cls->record.enforcement() == v1::ENFORCEMENT_ADVISORY;
  const bool fenced = rec.class_was_fenced() && !class_advisory_now;
  if (!fenced && !req.ack_unfenced()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", rec.lock_key(), "\" is held under an advisory class",
        rec.class_was_fenced() ? " (made advisory since the request)" : "", ": its holder (",
        rec.holder_identity(),
        ") is NOT fenced off and may go on writing after the release. Approve again with "
        "--ack-unfenced to release it anyway; nothing released"));
  }
  const std::string hold_key = keyspace::HoldKey(rec.ns(), rec.lock_key(), rec.session_id());
  pb::TxnRequest txn;
  // No class of the namespace changed, none was added, and the one resolved is
  // still there, since the read that judged the hold fenced.
  AddNoClassChangedSince(&txn, rec.ns(), snap.revision);
  if (cls != nullptr) {
    AddCompare(&txn, keyspace::ClassKey(rec.ns(), cls->class_id), pb::Compare::MOD,
               pb::Compare::EQUAL)
        ->set_mod_revision(cls->mod_revision);
  }
  AddCompare(&txn, hold_key, pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(rec.grant_revision());
  AddCompare(&txn, got.kvs(0).key(), pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(got.kvs(0).create_revision());
  txn.add_success()->mutable_request_delete_range()->set_key(hold_key);
  txn.add_success()->mutable_request_delete_range()->set_key(
      keyspace::ClaimKey(rec.ns(), rec.lock_key(), rec.session_id()));
  // And a waiter of the same session for the key, if one was left (put from a
  // stale view while the session held it): it goes with the claim, or a later
  // hand-over would give the session a hold without one.
  txn.add_success()->mutable_request_delete_range()->set_key(
      keyspace::WaitKey(rec.ns(), rec.lock_key(), rec.session_id()));
  txn.add_success()->mutable_request_delete_range()->set_key(got.kvs(0).key());
  records::AuditMark mark;
  mark.set_kind("force");
  mark.set_request_id(req.request_id());
  mark.set_requester(rec.requester());
  mark.set_approver(approver);
  mark.set_reason(rec.reason());
  mark.set_class_was_fenced(fenced);
  mark.set_requested_at_unix_ms(rec.requested_at_unix_ms());
  AddAuditMark(&txn, std::move(mark));
  auto sent = etcd_->TxnSync(std::move(txn), d);
  if (!sent.ok()) {
    if (!etcd::WriteOutcomeUnknown(sent.status())) return sent.status();
    // The release may have committed: not a "try again elsewhere".
    return absl::UnknownError(absl::StrCat(
        "etcd did not answer the approval of request ", req.request_id(), " (",
        sent.status().message(), "): whether the hold was released is not known. `holdfast "
        "holders` shows it; approving again answers NOT_FOUND if it was"));
  }
  const auto& t = *sent;
  if (!t.succeeded()) {
    // Tell which compare failed.
    pb::RangeRequest again;
    again.set_key(got.kvs(0).key());
    auto still = etcd_->RangeSync(again, d);
    if (!still.ok()) return still.status();  // which one failed is not known
    if (still->kvs_size() == 0) {
      return absl::NotFoundError(absl::StrCat("force-release request ", req.request_id(),
                                              " expired or was approved meanwhile"));
    }
    pb::RangeRequest hold_now;
    hold_now.set_key(hold_key);
    auto held = etcd_->RangeSync(hold_now, d);
    if (!held.ok()) return held.status();
    if (held->kvs_size() == 1 && held->kvs(0).create_revision() == rec.grant_revision()) {
      return absl::AbortedError(absl::StrCat(
          "the lock classes of namespace \"", rec.ns(), "\" changed while request ",
          req.request_id(), " was approved (whether the hold is fenced is judged again): "
          "approve again; nothing released"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the hold named by request ", req.request_id(), " (session ", rec.session_id(),
        ", token ", rec.token(), ") is no longer there: it was released or expired, and any hold "
        "of \"", rec.lock_key(), "\" granted since is not touched; nothing released"));
  }
  v1::ApproveForceReleaseResponse out;
  *out.mutable_request() = ToApi(req.request_id(), rec);
  out.set_revision(t.header().revision());
  return out;
}

absl::StatusOr<std::vector<v1::ForceRequest>> ForceReleases::List(etcd::Deadline d) {
  pb::RangeRequest r;
  r.set_key(keyspace::ForceRequestPrefix());
  r.set_range_end(keyspace::PrefixEnd(keyspace::ForceRequestPrefix()));
  HF_ASSIGN_OR_RETURN(auto got, etcd_->RangeSync(r, d));
  std::vector<v1::ForceRequest> out;
  for (const auto& kv : got.kvs()) {
    records::ForceRequestRecord rec;
    if (!rec.ParseFromString(kv.value())) continue;
    if (PastExpiry(rec)) continue;  // it can no longer be approved
    out.push_back(ToApi(kv.key().substr(keyspace::ForceRequestPrefix().size()), rec));
  }
  return out;
}

}  // namespace holdfast::lock
