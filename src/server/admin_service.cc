#include "server/admin_service.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "etcd/errors.h"
#include "lock/keyspace.h"
#include "lock/txn_util.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {
template <class T, class R>
grpc::Status Reply(absl::StatusOr<T> r, R* resp) {
  if (r.ok()) *resp = std::move(*r);
  return ToGrpcStatus(r.status());
}

// An etcd cluster id as the API carries it (a decimal string of the uint64);
// `field` and `hint` go into the error.
absl::StatusOr<uint64_t> ParseClusterId(absl::string_view field, const std::string& text,
                                        absl::string_view hint = "") {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(text, &id)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", text, "\" is not a decimal etcd cluster id", hint));
  }
  return id;
}

// The most a QueryAudit answer carries (server.cc sends at most 4 MiB a
// message): a page of large events ends there, with `more` set.
constexpr size_t kMaxAuditPageBytes = 3 << 20;
// The longest a QueryAudit reads from the store, however long its caller waits
// (or with no deadline at all): a read across clusters of a large trail scans
// and sorts it whole, on the server's one store connection, which the epoch
// guard and other admins' calls wait for meanwhile.
constexpr std::chrono::seconds kMaxAuditQueryTime{30};
}  // namespace

void AdminService::Serve(RpcServer* rpc) {
  using S = v1::Admin::AsyncService;
  rpc->ServeBlocking<S, v1::CreateNamespaceRequest, v1::Namespace>(
      &service_, &S::RequestCreateNamespace, [this](auto* ctx, auto* req, auto* resp) { return CreateNamespace(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::GetNamespaceRequest, v1::Namespace>(
      &service_, &S::RequestGetNamespace, [this](auto* ctx, auto* req, auto* resp) { return GetNamespace(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::ListNamespacesRequest, v1::ListNamespacesResponse>(
      &service_, &S::RequestListNamespaces, [this](auto* ctx, auto* req, auto* resp) { return ListNamespaces(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::UpdateNamespaceRequest, v1::Namespace>(
      &service_, &S::RequestUpdateNamespace, [this](auto* ctx, auto* req, auto* resp) { return UpdateNamespace(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::DeleteNamespaceRequest, v1::DeleteNamespaceResponse>(
      &service_, &S::RequestDeleteNamespace, [this](auto* ctx, auto* req, auto* resp) { return DeleteNamespace(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::CreateClassRequest, v1::LockClass>(
      &service_, &S::RequestCreateClass, [this](auto* ctx, auto* req, auto* resp) { return CreateClass(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::GetClassRequest, v1::LockClass>(
      &service_, &S::RequestGetClass, [this](auto* ctx, auto* req, auto* resp) { return GetClass(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::ListClassesRequest, v1::ListClassesResponse>(
      &service_, &S::RequestListClasses, [this](auto* ctx, auto* req, auto* resp) { return ListClasses(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::DeleteClassRequest, v1::DeleteClassResponse>(
      &service_, &S::RequestDeleteClass, [this](auto* ctx, auto* req, auto* resp) { return DeleteClass(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::GetEpochRequest, v1::Epoch>(
      &service_, &S::RequestGetEpoch, [this](auto* ctx, auto* req, auto* resp) { return GetEpoch(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::RehomeNamespaceRequest, v1::RehomeNamespaceResponse>(
      &service_, &S::RequestRehomeNamespace, [this](auto* ctx, auto* req, auto* resp) { return RehomeNamespace(ctx, req, resp); },
      // Its abort ends a waiting one, so does not wait behind them.
      [](const v1::RehomeNamespaceRequest& r) { return r.abort() ? Blocking::kBrief : Blocking::kWaiting; });
  rpc->ServeBlocking<S, v1::AdvanceEpochRequest, v1::Epoch>(
      &service_, &S::RequestAdvanceEpoch, [this](auto* ctx, auto* req, auto* resp) { return AdvanceEpoch(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::QueryAuditRequest, v1::QueryAuditResponse>(
      &service_, &S::RequestQueryAudit, [this](auto* ctx, auto* req, auto* resp) { return QueryAudit(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::GetAuditStatusRequest, v1::AuditStatus>(
      &service_, &S::RequestGetAuditStatus, [this](auto* ctx, auto* req, auto* resp) { return GetAuditStatus(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::RequestForceReleaseRequest, v1::ForceRequest>(
      &service_, &S::RequestRequestForceRelease, [this](auto* ctx, auto* req, auto* resp) { return RequestForceRelease(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::ApproveForceReleaseRequest, v1::ApproveForceReleaseResponse>(
      &service_, &S::RequestApproveForceRelease, [this](auto* ctx, auto* req, auto* resp) { return ApproveForceRelease(ctx, req, resp); });
  rpc->ServeBlocking<S, v1::ListForceRequestsRequest, v1::ListForceRequestsResponse>(
      &service_, &S::RequestListForceRequests, [this](auto* ctx, auto* req, auto* resp) { return ListForceRequests(ctx, req, resp); });
}

absl::Status AdminService::Admit(const grpc::ServerContext& ctx) const {
  auto caller = auth_->CallerOf(ctx);
  if (!caller.ok()) return caller.status();
  return Authenticator::RequireAdmin(*caller);
}

#define HF_ADMIN_ONLY(ctx)                                   \
  if (auto admitted = Admit(*ctx); !admitted.ok()) {          \
    return ToGrpcStatus(admitted);                           \
  }

namespace {

// FAILED_PRECONDITION when the placement record shows a rehome in progress.
absl::Status NoRehomeIn(const std::string& ns, const records::PlacementRecord& rec) {
  if (!rec.has_rehome()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "namespace \"", ns, "\" is being rehomed to \"", rec.rehome().to(),
      "\"; finish or abort the rehome first (its records are being copied)"));
}

// The placement record in `kv`, DATA_LOSS when it cannot be parsed.
absl::StatusOr<records::PlacementRecord> ParsePlacement(const std::string& ns,
                                                        const mvccpb::KeyValue& kv) {
  records::PlacementRecord rec;
  if (!rec.ParseFromString(kv.value())) {
    return absl::DataLossError(
        absl::StrCat("corrupt placement record for namespace \"", ns, "\""));
  }
  return rec;
}

}  // namespace

absl::Status AdminService::NotRehoming(const std::string& ns) const {
  if (auto* p = clusters_->placements()) {
    if (auto rec = p->Get(ns)) return NoRehomeIn(ns, *rec);
  }
  return absl::OkStatus();
}

void AdminService::AddPlacement(v1::Namespace* n) const {
  n->set_home_cluster(clusters_->Home(n->name()).name());
  if (auto* p = clusters_->placements()) {
    if (auto rec = p->Get(n->name()); rec && rec->has_rehome()) {
      n->set_rehoming_to(rec->rehome().to());
    }
  }
}

// A member pattern in a trust domain this holdfastd does not accept would admit
// nobody, silently (every caller from there is refused before the member list
// is read), as an admin_ids pattern would (config.cc): refused before anything
// is written (a pattern of bad syntax is refused here too, with the Registry's
// words).
absl::Status AdminService::CheckMembersAccepted(
    const google::protobuf::RepeatedPtrField<std::string>& members) const {
  if (members.size() > 1000) return absl::OkStatus();  // the Registry refuses it
  for (const auto& m : members) {
    if (auto s = auth_->CheckPatternAccepted("member pattern", m); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A namespace is homed on a cluster of its tier. Its name is claimed on the
// control cluster first (keyspace.h): by its record there when the control
// cluster homes it, else by a placement record, each created only if neither
// exists; then its records are written on the home.
absl::StatusOr<v1::Namespace> AdminService::CreateNamespaceOn(
    const v1::CreateNamespaceRequest& req, etcd::Deadline d) {
  const std::string& name = req.namespace_().name();
  // The whole request is checked before the name is claimed below: a claim
  // left by a request refused afterwards would route the name to a cluster
  // that never gets it (ALREADY_EXISTS to a corrected retry with another tier,
  // NOT_FOUND to every read).
  if (auto s = lock::Registry::CheckCreateNamespace(req); !s.ok()) return s.status();
  if (auto s = CheckMembersAccepted(req.namespace_().members()); !s.ok()) return s;
  auto home = clusters_->ForTier(req.namespace_().cluster_tier());
  if (!home.ok()) return home.status();
  Cluster& control = clusters_->control();
  if (clusters_->single()) return control.registry->CreateNamespace(req, d);
  if (*home == &control) {
    return control.registry->CreateNamespace(req, d, keyspace::PlacementKey(name));
  }
  namespace pb = ::etcdserverpb;
  records::PlacementRecord rec;
  rec.set_home((*home)->name());
  // The claim: the placement record, written only while the name has neither
  // one nor a namespace on the control cluster; its failure reads the record.
  auto claim = [&] {
    pb::TxnRequest txn;
    lock::AddCompare(&txn, keyspace::PlacementKey(name), pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(0);
    lock::AddCompare(&txn, keyspace::NamespaceKey(name), pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::PlacementKey(name));
    put->set_value(rec.SerializeAsString());
    txn.add_failure()->mutable_request_range()->set_key(keyspace::PlacementKey(name));
    return control.etcd->TxnSync(std::move(txn), d);
  };
  auto t = claim();
  if (!t.ok()) return t.status();
  if (t->succeeded()) {
    clusters_->placements()->Note(name, rec, t->header().revision());
  } else {
    // Claimed before: go on only if that claim is ours, left by a create that
    // stopped before the home had the records (and so not a namespace yet).
    records::PlacementRecord was;
    const auto& got = t->responses(0).response_range();
    bool resumable = got.kvs_size() > 0 && was.ParseFromString(got.kvs(0).value()) &&
                     was.home() == (*home)->name() && !was.has_rehome() &&
                     !(*home)->registry->GetNamespace(name, d).ok();
    if (!resumable) {
      return absl::AlreadyExistsError(absl::StrCat("namespace \"", name, "\" already exists"));
    }
    // Take the claim over with a write, guarded by the record as read. A delete
    // of the name that read the record before (and has just deleted the home's
    // copy) compares it when it deletes the record, so it leaves this create's
    // claim in place rather than a namespace with no placement record.
    pb::TxnRequest take;
    lock::AddCompare(&take, keyspace::PlacementKey(name), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(got.kvs(0).mod_revision());
    auto* again = take.add_success()->mutable_request_put();
    again->set_key(keyspace::PlacementKey(name));
    again->set_value(rec.SerializeAsString());
    auto taken = control.etcd->TxnSync(std::move(take), d);
    if (!taken.ok()) return taken.status();
    if (!taken->succeeded()) {
      return absl::AbortedError(absl::StrCat(
          "namespace \"", name, "\" was deleted or created through another replica meanwhile; "
          "try again; nothing changed"));
    }
    clusters_->placements()->Note(name, rec, taken->header().revision());
  }
  auto created = (*home)->registry->CreateNamespace(req, d);
  if (!created.ok()) return created;
  // A delete that read the claim before the home had the namespace took it for
  // a half-done one and may have deleted it meanwhile: the claim is put back
  // (the delete came first; this create stands), if nobody else has the name:
  // the same claim as above.
  auto kept = claim();
  if (!kept.ok()) return kept.status();
  if (kept->succeeded()) {
    clusters_->placements()->Note(name, rec, kept->header().revision());
    // Unless that delete came after the home had it, and so deleted it there
    // too (the create came first, then the delete): the claim goes again.
    auto still = (*home)->registry->GetNamespace(name, d);
    if (still.status().code() == absl::StatusCode::kNotFound) {
      pb::TxnRequest undo;
      lock::AddCompare(&undo, keyspace::PlacementKey(name), pb::Compare::MOD, pb::Compare::EQUAL)
          ->set_mod_revision(kept->header().revision());
      undo.add_success()->mutable_request_delete_range()->set_key(keyspace::PlacementKey(name));
      auto undone = control.etcd->TxnSync(std::move(undo), d);
      if (undone.ok() && undone->succeeded()) {
        clusters_->placements()->Note(name, std::nullopt, undone->header().revision());
      }
    }
    return created;
  }
  records::PlacementRecord now;
  const auto& there = kept->responses(0).response_range();
  if (there.kvs_size() > 0 && now.ParseFromString(there.kvs(0).value()) &&
      now.home() == rec.home() && !now.has_rehome()) {
    return created;
  }
  if (there.kvs_size() == 0) {
    // The name went to the control cluster meanwhile (deleted, then created
    // there): this create's copy would be reached by nothing, and goes.
    auto removed = (*home)->registry->DeleteNamespace(name, d);
    return absl::AbortedError(absl::StrCat(
        "namespace \"", name, "\" was deleted and created again on the control cluster "
        "through another replica meanwhile; this create's copy on cluster \"", rec.home(), "\" ",
        removed.ok() ? std::string("was removed again")
                     : absl::StrCat("could not be removed (", removed.message(),
                                    "): delete its keys there with etcdctl del ",
                                    keyspace::NamespaceKey(name), " and etcdctl del --prefix ",
                                    keyspace::NamespacePrefix(name))));
  }
  return absl::AbortedError(absl::StrCat(
      "namespace \"", name, "\" was written on cluster \"", rec.home(),
      "\", but its placement record was changed through another replica meanwhile; check it "
      "(holdfast ns get ", name, ")"));
}

grpc::Status AdminService::CreateNamespace(grpc::ServerContext* ctx,
                                           const v1::CreateNamespaceRequest* req,
                                           v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  auto n = CreateNamespaceOn(*req, RpcDeadline(*ctx, kUnaryCap));
  if (n.ok()) AddPlacement(&*n);
  return Reply(std::move(n), resp);
}

grpc::Status AdminService::GetNamespace(grpc::ServerContext* ctx,
                                        const v1::GetNamespaceRequest* req, v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  auto n = RegistryOf(req->name()).GetNamespace(req->name(), RpcDeadline(*ctx, kUnaryCap));
  if (n.ok()) AddPlacement(&*n);
  return Reply(std::move(n), resp);
}

namespace {

// A page of a list: at most this many entries (page_size 0 asks for the
// default), and entries while the answer stays under kPageBytes (at least one),
// so that a page fits a client's 4 MiB receive limit whatever the records hold.
constexpr int32_t kDefaultPageSize = 100;
constexpr int32_t kMaxPageSize = 1000;
constexpr size_t kPageBytes = 1 << 20;

absl::StatusOr<size_t> PageSize(int32_t asked) {
  if (asked < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be >= 0 (0: ", kDefaultPageSize, "), not ", asked));
  }
  return static_cast<size_t>(asked == 0 ? kDefaultPageSize : std::min(asked, kMaxPageSize));
}

// Adds `items` (in order) to `out` while the page has room; returns how many.
template <class T>
size_t FillPage(std::vector<T>& items, size_t page_size,
                google::protobuf::RepeatedPtrField<T>* out) {
  size_t bytes = 0, n = 0;
  for (auto& item : items) {
    if (n == page_size) break;
    const size_t size = item.ByteSizeLong() + 8;
    if (n > 0 && bytes + size > kPageBytes) break;
    bytes += size;
    *out->Add() = std::move(item);
    ++n;
  }
  return n;
}

}  // namespace

grpc::Status AdminService::ListNamespaces(grpc::ServerContext* ctx,
                                          const v1::ListNamespacesRequest* req,
                                          v1::ListNamespacesResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  auto page_size = PageSize(req->page_size());
  if (!page_size.ok()) return ToGrpcStatus(page_size.status());
  // Each cluster lists the namespaces it has after the token, one more than the
  // page; a namespace counts where it is homed (a rehome leaves a copy on the
  // other cluster for a while). A cluster whose list was cut may have more
  // before names another cluster listed: the page ends at the first name cut.
  std::map<std::string, v1::Namespace> all;
  std::optional<std::string> cut;  // the least last name of a list cut short
  for (const auto& c : clusters_->all()) {
    // Read no further than a page could carry: records past 1 MiB would be read
    // again for the next page.
    auto r = c->registry->ListNamespaces(RpcDeadline(*ctx, kUnaryCap), req->page_token(),
                                         *page_size + 1, kPageBytes);
    if (!r.ok()) return ToGrpcStatus(r.status());
    size_t bytes = 0;
    for (const auto& n : *r) bytes += n.ByteSizeLong();
    const bool cut_here = r->size() > *page_size || bytes > kPageBytes;
    if (cut_here && (!cut || r->back().name() < *cut)) cut = r->back().name();
    for (auto& n : *r) {
      if (&clusters_->Home(n.name()) != c.get()) continue;
      AddPlacement(&n);
      all[n.name()] = std::move(n);
    }
  }
  std::vector<v1::Namespace> listed;
  for (auto& [name, n] : all) {
    if (cut && name > *cut) break;
    listed.push_back(std::move(n));
  }
  const size_t n = FillPage(listed, *page_size, resp->mutable_namespaces());
  if (n < listed.size() || cut) {
    // On from the last one listed, or past the cut when none was (the names up
    // to it are none of them homed where they were read).
    resp->set_next_page_token(n > 0 ? resp->namespaces(n - 1).name() : *cut);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::UpdateNamespace(grpc::ServerContext* ctx,
                                           const v1::UpdateNamespaceRequest* req,
                                           v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  if (auto s = NotRehoming(req->name()); !s.ok()) return ToGrpcStatus(s);
  if (auto s = CheckMembersAccepted(req->members()); !s.ok()) return ToGrpcStatus(s);
  auto n = RegistryOf(req->name()).UpdateNamespace(
      *req, RpcDeadline(*ctx, kUnaryCap),
      [this](const std::string& identity) { return auth_->IsAdmin(identity); });
  if (n.ok()) AddPlacement(&*n);
  return Reply(std::move(n), resp);
}

grpc::Status AdminService::DeleteNamespace(grpc::ServerContext* ctx,
                                           const v1::DeleteNamespaceRequest* req,
                                           v1::DeleteNamespaceResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  return ToGrpcStatus(DeleteNamespaceOn(req->name(), RpcDeadline(*ctx, kUnaryCap)));
}

// The placement record is read from etcd, not from this replica's view of it: a
// create, a delete or a rehome through another replica may not have reached that
// view yet, and the record decides where the namespace is deleted, and is itself
// deleted last, guarded by that read.
absl::Status AdminService::DeleteNamespaceOn(const std::string& name, etcd::Deadline d) {
  if (auto s = keyspace::ValidateNamespaceName(name); !s.ok()) return s;
  auto* placements = clusters_->placements();
  Cluster& control = clusters_->control();
  if (placements == nullptr) return control.registry->DeleteNamespace(name, d);
  namespace pb = ::etcdserverpb;
  pb::RangeRequest read;
  read.set_key(keyspace::PlacementKey(name));
  auto got = control.etcd->RangeSync(read, d);
  if (!got.ok()) return got.status();
  if (got->kvs_size() == 0) {
    // Homed on the control cluster; guarded by "still no placement record" (a
    // rehome away writes one before it touches the namespace).
    return control.registry->DeleteNamespace(name, d, keyspace::PlacementKey(name));
  }
  auto parsed = ParsePlacement(name, got->kvs(0));
  if (!parsed.ok()) return parsed.status();
  const records::PlacementRecord placed = *std::move(parsed);
  if (auto s = NoRehomeIn(name, placed); !s.ok()) return s;
  // (An empty home is the control cluster, as for routing.)
  Cluster* home = placed.home().empty() ? &control : clusters_->Named(placed.home());
  if (home == nullptr) {
    // The namespace may live on that cluster: neither it nor its record is touched.
    return absl::NotFoundError(absl::StrCat(
        "namespace \"", name, "\" is homed on cluster \"", placed.home(),
        "\", which this holdfastd's config does not list; nothing changed"));
  }
  const absl::Status at_home = home->registry->DeleteNamespace(name, d);
  // NOT_FOUND with the record there: a delete that stopped between the two (or a
  // create that stopped before the home had it). The record alone would keep the
  // name from being created again, and from being deleted: this finishes the job.
  if (!at_home.ok() && at_home.code() != absl::StatusCode::kNotFound) return at_home;
  // The name is free again once its placement record goes, if it is still the
  // one read: a create that took the claim over since (the home's copy gone)
  // rewrote it, and keeps it.
  pb::TxnRequest del;
  lock::AddCompare(&del, keyspace::PlacementKey(name), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(got->kvs(0).mod_revision());
  del.add_success()->mutable_request_delete_range()->set_key(keyspace::PlacementKey(name));
  del.add_failure()->mutable_request_range()->set_key(keyspace::PlacementKey(name));
  auto gone = control.etcd->TxnSync(std::move(del), d);
  if (!gone.ok()) return gone.status();
  if (gone->succeeded()) {
    placements->Note(name, std::nullopt, gone->header().revision());
    return absl::OkStatus();
  }
  const auto& now = gone->responses(0).response_range();
  if (now.kvs_size() == 0) return absl::OkStatus();  // another delete finished it
  auto parsed_after = ParsePlacement(name, now.kvs(0));
  if (!parsed_after.ok()) return parsed_after.status();
  const records::PlacementRecord after = *std::move(parsed_after);
  const std::string deleted =
      at_home.ok() ? absl::StrCat("namespace \"", name, "\" was deleted from cluster \"",
                                  home->name(), "\", but ")
                   : absl::StrCat("namespace \"", name, "\": ");
  if (after.has_rehome()) {
    // Begun between the read and now: it finds no namespace to move, and its
    // abort puts the record back, which a delete then removes.
    return absl::AbortedError(absl::StrCat(
        deleted, "a rehome of it to \"", after.rehome().to(),
        "\" began during this delete; abort it (holdfast ns rehome ", name, " --to ",
        after.rehome().to(), " --abort), then delete the namespace again"));
  }
  if (after.home() != placed.home()) {
    return absl::AbortedError(absl::StrCat("namespace \"", name, "\" moved to cluster \"",
                                           after.home(), "\" during this delete; try again"));
  }
  // Rewritten by a create of the same home. The namespace there now is that
  // create's, made after this delete, and stands with its record. None there:
  // the create has not written it yet (or this delete removed it), and the
  // record is that create's to finish or a later delete's to remove.
  auto there = home->registry->GetNamespace(name, d);
  if (there.ok()) return absl::OkStatus();
  if (there.status().code() != absl::StatusCode::kNotFound) return there.status();
  return absl::AbortedError(absl::StrCat(
      deleted, "it was being created again through another replica during this delete; check "
      "it (holdfast ns get ", name, ") and delete it again if it should go"));
}

grpc::Status AdminService::CreateClass(grpc::ServerContext* ctx,
                                       const v1::CreateClassRequest* req, v1::LockClass* resp) {
  HF_ADMIN_ONLY(ctx);
  const auto& ns = req->class_().namespace_();
  if (auto s = NotRehoming(ns); !s.ok()) return ToGrpcStatus(s);
  return Reply(RegistryOf(ns).CreateClass(req->class_(), RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::GetClass(grpc::ServerContext* ctx, const v1::GetClassRequest* req,
                                    v1::LockClass* resp) {
  HF_ADMIN_ONLY(ctx);
  const auto& ns = req->namespace_();
  return Reply(RegistryOf(ns).GetClass(ns, req->class_id(), RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::ListClasses(grpc::ServerContext* ctx,
                                       const v1::ListClassesRequest* req,
                                       v1::ListClassesResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  const auto& ns = req->namespace_();
  auto page_size = PageSize(req->page_size());
  if (!page_size.ok()) return ToGrpcStatus(page_size.status());
  auto r = RegistryOf(ns).ListClasses(ns, RpcDeadline(*ctx, kUnaryCap), req->page_token(),
                                      *page_size + 1);
  if (!r.ok()) return ToGrpcStatus(r.status());
  const size_t n = FillPage(*r, *page_size, resp->mutable_classes());
  if (n < r->size()) resp->set_next_page_token(resp->classes(n - 1).class_id());
  return grpc::Status::OK;
}

grpc::Status AdminService::DeleteClass(grpc::ServerContext* ctx,
                                       const v1::DeleteClassRequest* req,
                                       v1::DeleteClassResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  const auto& ns = req->namespace_();
  if (auto s = NotRehoming(ns); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(
      RegistryOf(ns).DeleteClass(ns, req->class_id(), RpcDeadline(*ctx, kUnaryCap)));
}

absl::StatusOr<Cluster*> AdminService::ClusterNamed(const std::string& name,
                                                    bool empty_is_control) const {
  if (name.empty()) {
    if (clusters_->single() || empty_is_control) return &clusters_->control();
    return absl::InvalidArgumentError(absl::StrCat(
        "this holdfastd has several etcd clusters (", clusters_->Names(),
        "); name one with --cluster"));
  }
  Cluster* c = clusters_->Named(name);
  if (c != nullptr) return c;
  if (clusters_->single()) {
    return absl::NotFoundError(absl::StrCat(
        "no etcd cluster named \"", name, "\": this holdfastd has one cluster (\"",
        clusters_->control().name(), "\"); leave --cluster out"));
  }
  return absl::NotFoundError(absl::StrCat("no etcd cluster named \"", name, "\" (clusters: ",
                                          clusters_->Names(), ")"));
}

grpc::Status AdminService::GetEpoch(grpc::ServerContext* ctx, const v1::GetEpochRequest* req,
                                    v1::Epoch* resp) {
  // Any authenticated caller may read the epoch (it is also a readiness probe);
  // admins also get the history.
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto cluster = ClusterNamed(req->cluster(), /*empty_is_control=*/true);
  if (!cluster.ok()) return ToGrpcStatus(cluster.status());
  auto epoch = (*cluster)->registry->GetEpoch(RpcDeadline(*ctx, kUnaryCap));
  if (!epoch.ok()) return ToGrpcStatus(epoch.status());
  *resp = std::move(*epoch);
  resp->set_cluster((*cluster)->name());
  if (restore_reason_) resp->set_restore_detected(restore_reason_((*cluster)->name()));
  if (Authenticator::RequireAdmin(*caller).ok()) {
    auto state = (*cluster)->epochs->Read(RpcDeadline(*ctx, kUnaryCap));
    if (state.ok()) {
      for (const auto& row : state->history) {
        auto* h = resp->add_history();
        h->set_epoch(row.epoch);
        h->set_etcd_cluster_id(absl::StrCat(row.cluster_id));
        h->set_advanced_at_unix_ms(row.advanced_at_unix_ms);
        h->set_reason(row.reason);
        h->set_actor(row.actor);
      }
      // Fresher than the guard's last look.
      resp->set_restore_detected(audit::Epochs::RestoreReason(*state));
    }
  }
  if (req->cluster().empty() && !clusters_->single()) {
    for (const auto& c : clusters_->all()) {
      auto each = c->registry->GetEpoch(RpcDeadline(*ctx, kUnaryCap));
      if (!each.ok()) return ToGrpcStatus(each.status());
      each->set_cluster(c->name());
      if (restore_reason_) each->set_restore_detected(restore_reason_(c->name()));
      *resp->add_clusters() = std::move(*each);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::AdvanceEpoch(grpc::ServerContext* ctx,
                                        const v1::AdvanceEpochRequest* req, v1::Epoch* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  auto cluster = ClusterNamed(req->cluster(), /*empty_is_control=*/false);
  if (!cluster.ok()) return ToGrpcStatus(cluster.status());
  auto advanced =
      (*cluster)->epochs->Advance(req->reason(), caller->identity, RpcDeadline(*ctx, kUnaryCap),
                                  req->min_epoch());
  if (!advanced.ok()) return ToGrpcStatus(advanced.status());
  if (on_advanced_) on_advanced_();
  resp->set_epoch(advanced->epoch());
  resp->set_etcd_cluster_id(absl::StrCat(advanced->etcd_cluster_id()));
  resp->set_advanced_at_unix_ms(advanced->advanced_at_unix_ms());
  resp->set_reason(advanced->reason());
  resp->set_observed_cluster_id(absl::StrCat(advanced->etcd_cluster_id()));
  resp->set_cluster((*cluster)->name());
  return grpc::Status::OK;
}

grpc::Status AdminService::RehomeNamespace(grpc::ServerContext* ctx,
                                           const v1::RehomeNamespaceRequest* req,
                                           v1::RehomeNamespaceResponse* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  lock::Caller who;
  who.identity = caller->identity;
  who.admin = true;
  // Its wait for holds ends in time for the caller to hear the outcome: a call
  // that waited for a thread (server/async_rpc.h) has less time left than its
  // deadline_ms.
  return Reply(rehomer_->Rehome(who, *req, [ctx] { return ctx->IsCancelled(); },
                                SteadyCallDeadline(*ctx, std::chrono::hours(25))),
               resp);
}

// --- audit and force-release ------------------------------------------------

grpc::Status AdminService::QueryAudit(grpc::ServerContext* ctx, const v1::QueryAuditRequest* req,
                                      v1::QueryAuditResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  if (audit_store_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        "this holdfastd has no audit store (audit.store is \"none\")"));
  }
  audit::AuditQuery q;
  q.ns = req->namespace_();
  q.lock_key = req->lock_key();
  q.spiffe_id = req->spiffe_id();
  q.since_unix_ms = req->since_unix_ms();
  q.after_revision = req->after_revision();
  if (!req->cluster_id().empty()) {
    auto id = ParseClusterId("cluster_id", req->cluster_id());
    if (!id.ok()) return ToGrpcStatus(id.status());
    q.cluster_id = *id;
  }
  if (req->has_after()) {
    const v1::AuditEvent& a = req->after();
    auto id = ParseClusterId("after.cluster_id", a.cluster_id(),
                             " (pass the last event of the previous page)");
    if (!id.ok()) return ToGrpcStatus(id.status());
    q.after_event = audit::AuditEventKey{a.revision(), a.namespace_(), a.lock_key(),
                                         a.session_id(), *id};
  }
  if (req->limit() < 0 || req->limit() > 10000) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("limit ", req->limit(), " is out of range (1..10000)")));
  }
  q.limit = req->limit() == 0 ? 1000 : req->limit();
  if (!req->type().empty()) {
    auto t = audit::ParseEventType(req->type());
    if (!t) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "unknown event type \"", req->type(), "\" (grant, release, expire or force)")));
    }
    q.type = *t;
  }
  // The store gives up a little before the caller's deadline (so that the
  // caller is told why, not just that its time ran out), and after
  // kMaxAuditQueryTime at the latest: a query whose caller is gone is of no use
  // to anyone.
  const auto now = std::chrono::steady_clock::now();
  const auto call_deadline = SteadyCallDeadline(*ctx, kMaxAuditQueryTime);
  q.deadline = call_deadline - std::max<std::chrono::steady_clock::duration>(
                                   std::chrono::milliseconds(250), (call_deadline - now) / 10);
  auto rows = audit_store_->Query(q);
  if (!rows.ok()) return ToGrpcStatus(rows.status());
  size_t bytes = 0;
  for (const auto& e : *rows) {
    // Each event's own size plus its field tag and length (at most 4 bytes).
    const size_t size = 4 + e.ns.size() + e.lock_key.size() + e.spiffe_id.size() + 80 +
                        e.force_request_id.size() + e.force_requester.size() +
                        e.force_approver.size() + e.force_reason.size();
    if (resp->events_size() > 0 && bytes + size > kMaxAuditPageBytes) {
      resp->set_more(true);
      break;
    }
    bytes += size;
    auto* out = resp->add_events();
    out->set_cluster_id(absl::StrCat(e.cluster_id));
    out->set_revision(e.revision);
    out->set_type(audit::EventTypeName(e.type));
    out->set_namespace_(e.ns);
    out->set_lock_key(e.lock_key);
    out->set_session_id(e.session_id);
    out->set_spiffe_id(e.spiffe_id);
    out->set_token(e.token);
    out->set_unprotected(e.unprotected);
    out->set_time_unix_ms(e.time_unix_ms);
    if (!e.force_request_id.empty()) {
      auto* f = out->mutable_force();
      f->set_request_id(e.force_request_id);
      f->set_requester(e.force_requester);
      f->set_approver(e.force_approver);
      f->set_reason(e.force_reason);
      f->set_class_was_fenced(e.force_class_was_fenced);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetAuditStatus(grpc::ServerContext* ctx,
                                          const v1::GetAuditStatusRequest* req,
                                          v1::AuditStatus* resp) {
  HF_ADMIN_ONLY(ctx);
  if (audit_status_) *resp = audit_status_(*req);
  return grpc::Status::OK;
}

grpc::Status AdminService::RequestForceRelease(grpc::ServerContext* ctx,
                                               const v1::RequestForceReleaseRequest* req,
                                               v1::ForceRequest* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  return Reply(clusters_->Home(req->namespace_())
                   .force->Request(caller->identity, *req, RpcDeadline(*ctx, kUnaryCap)),
               resp);
}

grpc::Status AdminService::ApproveForceRelease(grpc::ServerContext* ctx,
                                               const v1::ApproveForceReleaseRequest* req,
                                               v1::ApproveForceReleaseResponse* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  // The request lives on the cluster of its hold: ask each until one has it. A
  // cluster that cannot answer does not stop the others; if none has it, the
  // answer says which could not be asked (the request may be there).
  absl::StatusOr<v1::ApproveForceReleaseResponse> r;
  absl::Status unasked;
  for (const auto& c : clusters_->all()) {
    r = c->force->Approve(caller->identity, *req, RpcDeadline(*ctx, kUnaryCap));
    if (etcd::OutcomeUnknown(r.status())) {
      if (unasked.ok()) {
        unasked = absl::Status(r.status().code(), absl::StrCat("etcd cluster \"", c->name(),
                                                  "\" could not be asked for request ",
                                                  req->request_id(), " (", r.status().message(),
                                                  "); nothing released there; try again"));
      }
      continue;
    }
    if (r.status().code() != absl::StatusCode::kNotFound) return Reply(std::move(r), resp);
  }
  if (!unasked.ok()) return ToGrpcStatus(unasked);
  return Reply(std::move(r), resp);
}

grpc::Status AdminService::ListForceRequests(grpc::ServerContext* ctx,
                                             const v1::ListForceRequestsRequest* req,
                                             v1::ListForceRequestsResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  for (const auto& c : clusters_->all()) {
    auto r = c->force->List(RpcDeadline(*ctx, kUnaryCap));
    if (!r.ok()) return ToGrpcStatus(r.status());
    for (auto& f : *r) *resp->add_requests() = std::move(f);
  }
  return grpc::Status::OK;
}

}  // namespace holdfast::server
