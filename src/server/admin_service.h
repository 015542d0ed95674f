// The Admin service: namespaces, classes and the epoch. Admin IDs only (any
// authenticated caller may read the epoch). Runs on gRPC's
// synchronous thread pool (admin calls are rare and each is a few etcd round
// trips), so its handlers may block.
//
// Thread-safe.
#pragma once

#include <functional>

#include "audit/epochs.h"
#include "audit/store.h"
#include "holdfast/v1/admin.grpc.pb.h"
#include "lock/force_release.h"
#include "lock/registry.h"
#include "server/auth.h"

namespace holdfast::server {

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(lock::Registry* registry, const Authenticator* auth)
      : registry_(registry), auth_(auth) {}

  grpc::Status CreateNamespace(grpc::ServerContext* ctx, const v1::CreateNamespaceRequest* req,
                               v1::Namespace* resp) override;
  grpc::Status GetNamespace(grpc::ServerContext* ctx, const v1::GetNamespaceRequest* req,
                            v1::Namespace* resp) override;
  grpc::Status ListNamespaces(grpc::ServerContext* ctx, const v1::ListNamespacesRequest* req,
                              v1::ListNamespacesResponse* resp) override;
  grpc::Status UpdateNamespace(grpc::ServerContext* ctx, const v1::UpdateNamespaceRequest* req,
                               v1::Namespace* resp) override;
  grpc::Status DeleteNamespace(grpc::ServerContext* ctx, const v1::DeleteNamespaceRequest* req,
                               v1::DeleteNamespaceResponse* resp) override;
  grpc::Status CreateClass(grpc::ServerContext* ctx, const v1::CreateClassRequest* req,
                           v1::LockClass* resp) override;
  grpc::Status GetClass(grpc::ServerContext* ctx, const v1::GetClassRequest* req,
                        v1::LockClass* resp) override;
  grpc::Status ListClasses(grpc::ServerContext* ctx, const v1::ListClassesRequest* req,
                           v1::ListClassesResponse* resp) override;
  grpc::Status DeleteClass(grpc::ServerContext* ctx, const v1::DeleteClassRequest* req,
                           v1::DeleteClassResponse* resp) override;
  grpc::Status GetEpoch(grpc::ServerContext* ctx, const v1::GetEpochRequest* req,
                        v1::Epoch* resp) override;

  // The audit store (null: audit off), force-release, and the auditor's status.
  // Set once, before serving.
  void SetAudit(audit::AuditStore* store, lock::ForceReleases* force,
                std::function<v1::AuditStatus()> status) {
    audit_store_ = store;
    force_ = force;
    audit_status_ = std::move(status);
  }
  // `on_advanced` runs after a successful advance (the server re-checks at once).
  void SetEpochs(audit::Epochs* epochs, std::function<std::string()> restore_reason,
                 std::function<void()> on_advanced) {
    epochs_ = epochs;
    restore_reason_ = std::move(restore_reason);
    on_advanced_ = std::move(on_advanced);
  }
  grpc::Status AdvanceEpoch(grpc::ServerContext* ctx, const v1::AdvanceEpochRequest* req,
                            v1::Epoch* resp) override;
  grpc::Status QueryAudit(grpc::ServerContext* ctx, const v1::QueryAuditRequest* req,
                          v1::QueryAuditResponse* resp) override;
  grpc::Status GetAuditStatus(grpc::ServerContext* ctx, const v1::GetAuditStatusRequest* req,
                              v1::AuditStatus* resp) override;
  grpc::Status RequestForceRelease(grpc::ServerContext* ctx,
                                   const v1::RequestForceReleaseRequest* req,
                                   v1::ForceRequest* resp) override;
  grpc::Status ApproveForceRelease(grpc::ServerContext* ctx,
                                   const v1::ApproveForceReleaseRequest* req,
                                   v1::ApproveForceReleaseResponse* resp) override;
  grpc::Status ListForceRequests(grpc::ServerContext* ctx,
                                 const v1::ListForceRequestsRequest* req,
                                 v1::ListForceRequestsResponse* resp) override;

 private:
  // UNAUTHENTICATED or PERMISSION_DENIED unless the caller is an admin.
  absl::Status Admit(const grpc::ServerContext& ctx) const;

  lock::Registry* const registry_;
  const Authenticator* const auth_;
  audit::AuditStore* audit_store_ = nullptr;
  lock::ForceReleases* force_ = nullptr;
  std::function<v1::AuditStatus()> audit_status_;
  audit::Epochs* epochs_ = nullptr;
  std::function<std::string()> restore_reason_;
  std::function<void()> on_advanced_;
};

}  // namespace holdfast::server
