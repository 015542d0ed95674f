// Namespaces and lock classes in etcd (the Admin API's store).
//
// Thread-safe; every method blocks on etcd and must run on a thread that may
// block (holdfastd serves Admin on its synchronous thread pool). Writes are
// guarded transactions, so concurrent admins cannot create duplicates.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "etcd/client.h"
#include "holdfast/v1/admin.pb.h"

namespace holdfast::lock {

class Registry {
 public:
  explicit Registry(etcd::Client* etcd) : etcd_(etcd) {}

  // Also creates the catch-all class "default" (prefix "") from `default_class`.
  // `also_absent`: another key of this cluster that must not exist either (the
  // namespace's placement record, on the control cluster); ALREADY_EXISTS if it does.
  absl::StatusOr<v1::Namespace> CreateNamespace(const v1::CreateNamespaceRequest& req,
                                                etcd::Deadline d,
                                                const std::string& also_absent = "");
  absl::StatusOr<v1::Namespace> GetNamespace(const std::string& name, etcd::Deadline d);
  // The namespaces whose names sort after `after`, in name order; at most
  // `limit` of them (0: all), and none more once they pass `max_bytes` (0: no
  // bound) as messages.
  absl::StatusOr<std::vector<v1::Namespace>> ListNamespaces(etcd::Deadline d,
                                                            const std::string& after = "",
                                                            size_t limit = 0,
                                                            size_t max_bytes = 0);
  // With set_members: the live sessions whose owner the new list does not admit
  // (nor `is_admin`) make it FAILED_PRECONDITION, changing nothing, unless
  // end_sessions_of_removed is set. Then such sessions that hold a lock make it
  // FAILED_PRECONDITION, changing nothing (ending them would force their locks
  // open, which takes two admins); otherwise the list is written and those
  // sessions are ended: their waits withdrawn, their records and quota slots
  // deleted, their leases revoked. One that takes a lock between the check and
  // the write is kept, and named (FAILED_PRECONDITION, the list stays); a failed
  // end is UNAVAILABLE (the list stays, and the same call again ends the rest).
  // A refusal's write is guarded by "no session opened since the read", and the
  // sessions to end are read in the write's own commit, so a session opened
  // under the old list meanwhile is never missed.
  absl::StatusOr<v1::Namespace> UpdateNamespace(
      const v1::UpdateNamespaceRequest& req, etcd::Deadline d,
      const std::function<bool(const std::string&)>& is_admin = {});
  // FAILED_PRECONDITION while the namespace has live sessions, or while its
  // record is marked for a move. With `also_absent`, the delete is guarded by
  // that key not existing (a namespace homed on the control cluster: no
  // placement record, so no rehome of it has begun).
  absl::Status DeleteNamespace(const std::string& name, etcd::Deadline d,
                               const std::string& also_absent = "");

  absl::StatusOr<v1::LockClass> CreateClass(const v1::LockClass& cls, etcd::Deadline d);
  absl::StatusOr<v1::LockClass> GetClass(const std::string& ns, const std::string& id,
                                         etcd::Deadline d);
  // The classes whose ids sort after `after`, in id order; at most `limit` (0: all).
  absl::StatusOr<std::vector<v1::LockClass>> ListClasses(const std::string& ns, etcd::Deadline d,
                                                         const std::string& after = "",
                                                         size_t limit = 0);
  // The catch-all class cannot be deleted (FAILED_PRECONDITION).
  absl::Status DeleteClass(const std::string& ns, const std::string& id, etcd::Deadline d);

  absl::StatusOr<v1::Epoch> GetEpoch(etcd::Deadline d);

  // Checks a create request's fields (name, quotas, tenant, tier length,
  // members, the catch-all class) and returns that class, normalized. Nothing is
  // read or written: the multi-cluster create calls it before it claims the
  // name on the control cluster.
  static absl::StatusOr<v1::LockClass> CheckCreateNamespace(const v1::CreateNamespaceRequest& req);

  // Checks a class's fields (id, prefix, TTL bounds, enums); fills defaults for
  // UNSPECIFIED enums (exclusive, fenced, closed) and TTL bounds (1 s, 1 h).
  static absl::StatusOr<v1::LockClass> NormalizeClass(v1::LockClass cls);

  static constexpr const char* kCatchAllClassId = "default";

 private:
  etcd::Client* const etcd_;
};

}  // namespace holdfast::lock
