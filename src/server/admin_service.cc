#include "server/admin_service.h"

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
  // Any authenticated caller may read the epoch (it is also a readiness probe).
  if (auto caller = auth_->CallerOf(*ctx); !caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(registry_->GetEpoch(RpcDeadline(*ctx, kUnaryCap)), resp);
}

}  // namespace holdfast::server
