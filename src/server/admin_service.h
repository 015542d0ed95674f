// The Admin service: namespaces, classes, epochs, audit, force-release and
// rehome. Admin IDs only (any authenticated caller may read the epoch). Calls
// about one namespace go to its home cluster (server/clusters.h). Its handlers
// block (admin calls are rare, and each is a few etcd round trips or an audit
// store query): they run on the RpcServer's worker pool, off the event loop
// (server/async_rpc.h, ServeBlocking).
//
// Thread-safe.
#pragma once

#include <functional>

#include "audit/epochs.h"
#include "audit/store.h"
#include "holdfast/v1/admin.grpc.pb.h"
#include "lock/force_release.h"
#include "lock/registry.h"
#include "server/async_rpc.h"
#include "server/auth.h"
#include "server/clusters.h"
#include "server/rehome.h"

namespace holdfast::server {

class AdminService {
 public:
  AdminService(ClusterSet* clusters, const Authenticator* auth)
      : clusters_(clusters), auth_(auth) {}

  // Registered with the grpc::ServerBuilder.
  grpc::Service* grpc_service() { return &service_; }
  // Starts serving; after the gRPC server has been built and started.
  void Serve(RpcServer* rpc);

  grpc::Status CreateNamespace(grpc::ServerContext* ctx, const v1::CreateNamespaceRequest* req,
                               v1::Namespace* resp);
  grpc::Status GetNamespace(grpc::ServerContext* ctx, const v1::GetNamespaceRequest* req,
                            v1::Namespace* resp);
  grpc::Status ListNamespaces(grpc::ServerContext* ctx, const v1::ListNamespacesRequest* req,
                              v1::ListNamespacesResponse* resp);
  grpc::Status UpdateNamespace(grpc::ServerContext* ctx, const v1::UpdateNamespaceRequest* req,
                               v1::Namespace* resp);
  grpc::Status DeleteNamespace(grpc::ServerContext* ctx, const v1::DeleteNamespaceRequest* req,
                               v1::DeleteNamespaceResponse* resp);
  grpc::Status CreateClass(grpc::ServerContext* ctx, const v1::CreateClassRequest* req,
                           v1::LockClass* resp);
  grpc::Status GetClass(grpc::ServerContext* ctx, const v1::GetClassRequest* req,
                        v1::LockClass* resp);
  grpc::Status ListClasses(grpc::ServerContext* ctx, const v1::ListClassesRequest* req,
                           v1::ListClassesResponse* resp);
  grpc::Status DeleteClass(grpc::ServerContext* ctx, const v1::DeleteClassRequest* req,
                           v1::DeleteClassResponse* resp);
  grpc::Status GetEpoch(grpc::ServerContext* ctx, const v1::GetEpochRequest* req,
                        v1::Epoch* resp);

  // The audit store (null: audit off) and the auditor's status. Set once,
  // before serving.
  void SetAudit(audit::AuditStore* store,
                std::function<v1::AuditStatus(const v1::GetAuditStatusRequest&)> status) {
    audit_store_ = store;
    audit_status_ = std::move(status);
  }
  // `restore_reason(cluster name)`; `on_advanced` runs after a successful
  // advance (the server re-checks at once).
  void SetEpochs(std::function<std::string(const std::string&)> restore_reason,
                 std::function<void()> on_advanced) {
    restore_reason_ = std::move(restore_reason);
    on_advanced_ = std::move(on_advanced);
  }
  void SetRehomer(Rehomer* rehomer) { rehomer_ = rehomer; }
  grpc::Status RehomeNamespace(grpc::ServerContext* ctx, const v1::RehomeNamespaceRequest* req,
                               v1::RehomeNamespaceResponse* resp);
  grpc::Status AdvanceEpoch(grpc::ServerContext* ctx, const v1::AdvanceEpochRequest* req,
                            v1::Epoch* resp);
  grpc::Status QueryAudit(grpc::ServerContext* ctx, const v1::QueryAuditRequest* req,
                          v1::QueryAuditResponse* resp);
  grpc::Status GetAuditStatus(grpc::ServerContext* ctx, const v1::GetAuditStatusRequest* req,
                              v1::AuditStatus* resp);
  grpc::Status RequestForceRelease(grpc::ServerContext* ctx,
                                   const v1::RequestForceReleaseRequest* req,
                                   v1::ForceRequest* resp);
  grpc::Status ApproveForceRelease(grpc::ServerContext* ctx,
                                   const v1::ApproveForceReleaseRequest* req,
                                   v1::ApproveForceReleaseResponse* resp);
  grpc::Status ListForceRequests(grpc::ServerContext* ctx,
                                 const v1::ListForceRequestsRequest* req,
                                 v1::ListForceRequestsResponse* resp);

 private:
  // UNAUTHENTICATED or PERMISSION_DENIED unless the caller is an admin.
  absl::Status Admit(const grpc::ServerContext& ctx) const;

  // The registry of the namespace's home cluster.
  lock::Registry& RegistryOf(const std::string& ns) const {
    return *clusters_->Home(ns).registry;
  }
  // FAILED_PRECONDITION while a rehome of `ns` is unfinished: a change of its
  // records then could miss the copy (as this replica's placements show it).
  absl::Status NotRehoming(const std::string& ns) const;
  // INVALID_ARGUMENT for a member pattern in a trust domain not accepted here.
  absl::Status CheckMembersAccepted(
      const google::protobuf::RepeatedPtrField<std::string>& members) const;
  // Fills home_cluster and rehoming_to.
  void AddPlacement(v1::Namespace* n) const;
  absl::Status DeleteNamespaceOn(const std::string& name, etcd::Deadline d);
  absl::StatusOr<v1::Namespace> CreateNamespaceOn(const v1::CreateNamespaceRequest& req,
                                                  etcd::Deadline d);
  // The cluster named (empty: the only one, else INVALID_ARGUMENT).
  absl::StatusOr<Cluster*> ClusterNamed(const std::string& name, bool empty_is_control) const;

  ClusterSet* const clusters_;
  const Authenticator* const auth_;
  audit::AuditStore* audit_store_ = nullptr;
  std::function<v1::AuditStatus(const v1::GetAuditStatusRequest&)> audit_status_;
  std::function<std::string(const std::string&)> restore_reason_;
  std::function<void()> on_advanced_;
  Rehomer* rehomer_ = nullptr;
  v1::Admin::AsyncService service_;
};

}  // namespace holdfast::server
