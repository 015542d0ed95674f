#include "server/admin_service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {
template <class T, class R>
grpc::Status Reply(absl::StatusOr<T> r, R* resp) {
  if (r.ok()) *resp = std::move(*r);
  return ToGrpcStatus(r.status());
}
}  // namespace

absl::Status AdminService::Admit(const grpc::ServerContext& ctx) const {
  auto caller = auth_->CallerOf(ctx);
  if (!caller.ok()) return caller.status();
  return Authenticator::RequireAdmin(*caller);
}

#define HF_ADMIN_ONLY(ctx)                                   \
  if (auto admitted = Admit(*ctx); !admitted.ok()) {          \
    return ToGrpcStatus(admitted);                           \
  }

grpc::Status AdminService::CreateNamespace(grpc::ServerContext* ctx,
                                           const v1::CreateNamespaceRequest* req,
                                           v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  return Reply(registry_->CreateNamespace(*req, RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::GetNamespace(grpc::ServerContext* ctx,
                                        const v1::GetNamespaceRequest* req, v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  return Reply(registry_->GetNamespace(req->name(), RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::ListNamespaces(grpc::ServerContext* ctx,
                                          const v1::ListNamespacesRequest* req,
                                          v1::ListNamespacesResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  auto r = registry_->ListNamespaces(RpcDeadline(*ctx, kUnaryCap));
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (auto& n : *r) *resp->add_namespaces() = std::move(n);
  return grpc::Status::OK;
}

grpc::Status AdminService::UpdateNamespace(grpc::ServerContext* ctx,
                                           const v1::UpdateNamespaceRequest* req,
                                           v1::Namespace* resp) {
  HF_ADMIN_ONLY(ctx);
  return Reply(registry_->UpdateNamespace(*req, RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::DeleteNamespace(grpc::ServerContext* ctx,
                                           const v1::DeleteNamespaceRequest* req,
                                           v1::DeleteNamespaceResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  return ToGrpcStatus(registry_->DeleteNamespace(req->name(), RpcDeadline(*ctx, kUnaryCap)));
}

grpc::Status AdminService::CreateClass(grpc::ServerContext* ctx,
                                       const v1::CreateClassRequest* req, v1::LockClass* resp) {
  HF_ADMIN_ONLY(ctx);
  return Reply(registry_->CreateClass(req->class_(), RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::GetClass(grpc::ServerContext* ctx, const v1::GetClassRequest* req,
                                    v1::LockClass* resp) {
  HF_ADMIN_ONLY(ctx);
  return Reply(
      registry_->GetClass(req->namespace_(), req->class_id(), RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::ListClasses(grpc::ServerContext* ctx,
                                       const v1::ListClassesRequest* req,
                                       v1::ListClassesResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  auto r = registry_->ListClasses(req->namespace_(), RpcDeadline(*ctx, kUnaryCap));
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (auto& c : *r) *resp->add_classes() = std::move(c);
  return grpc::Status::OK;
}

grpc::Status AdminService::DeleteClass(grpc::ServerContext* ctx,
                                       const v1::DeleteClassRequest* req,
                                       v1::DeleteClassResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  return ToGrpcStatus(
      registry_->DeleteClass(req->namespace_(), req->class_id(), RpcDeadline(*ctx, kUnaryCap)));
}

grpc::Status AdminService::GetEpoch(grpc::ServerContext* ctx, const v1::GetEpochRequest* req,
                                    v1::Epoch* resp) {
  // Any authenticated caller may read the epoch (it is also a readiness probe);
  // admins also get the history.
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto epoch = registry_->GetEpoch(RpcDeadline(*ctx, kUnaryCap));
  if (!epoch.ok()) return ToGrpcStatus(epoch.status());
  *resp = std::move(*epoch);
  if (restore_reason_) resp->set_restore_detected(restore_reason_());
  if (epochs_ != nullptr && Authenticator::RequireAdmin(*caller).ok()) {
    auto state = epochs_->Read(RpcDeadline(*ctx, kUnaryCap));
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
  return grpc::Status::OK;
}

grpc::Status AdminService::AdvanceEpoch(grpc::ServerContext* ctx,
                                        const v1::AdvanceEpochRequest* req, v1::Epoch* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  if (!req->cluster().empty() && req->cluster() != "default") {
    return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "no etcd cluster named \"", req->cluster(),
        "\": this holdfastd has one cluster (\"default\"); leave --cluster out")));
  }
  auto advanced = epochs_->Advance(req->reason(), caller->identity, RpcDeadline(*ctx, kUnaryCap));
  if (!advanced.ok()) return ToGrpcStatus(advanced.status());
  if (on_advanced_) on_advanced_();
  resp->set_epoch(advanced->epoch());
  resp->set_etcd_cluster_id(absl::StrCat(advanced->etcd_cluster_id()));
  resp->set_advanced_at_unix_ms(advanced->advanced_at_unix_ms());
  resp->set_reason(advanced->reason());
  resp->set_observed_cluster_id(absl::StrCat(advanced->etcd_cluster_id()));
  return grpc::Status::OK;
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
  auto rows = audit_store_->Query(q);
  if (!rows.ok()) return ToGrpcStatus(rows.status());
  for (const auto& e : *rows) {
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
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetAuditStatus(grpc::ServerContext* ctx,
                                          const v1::GetAuditStatusRequest* req,
                                          v1::AuditStatus* resp) {
  HF_ADMIN_ONLY(ctx);
  if (audit_status_) *resp = audit_status_();
  return grpc::Status::OK;
}

grpc::Status AdminService::RequestForceRelease(grpc::ServerContext* ctx,
                                               const v1::RequestForceReleaseRequest* req,
                                               v1::ForceRequest* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  return Reply(force_->Request(caller->identity, *req, RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::ApproveForceRelease(grpc::ServerContext* ctx,
                                               const v1::ApproveForceReleaseRequest* req,
                                               v1::ApproveForceReleaseResponse* resp) {
  auto caller = auth_->CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (auto s = Authenticator::RequireAdmin(*caller); !s.ok()) return ToGrpcStatus(s);
  return Reply(force_->Approve(caller->identity, *req, RpcDeadline(*ctx, kUnaryCap)), resp);
}

grpc::Status AdminService::ListForceRequests(grpc::ServerContext* ctx,
                                             const v1::ListForceRequestsRequest* req,
                                             v1::ListForceRequestsResponse* resp) {
  HF_ADMIN_ONLY(ctx);
  auto r = force_->List(RpcDeadline(*ctx, kUnaryCap));
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (auto& f : *r) *resp->add_requests() = std::move(f);
  return grpc::Status::OK;
}

}  // namespace holdfast::server
