// Force-release, two people (ARCHITECTURE §8). An admin requests the release of
// one named hold (its session and grant revision at request time) with a reason;
// a DIFFERENT admin approves; the approval deletes exactly that hold in one
// guarded transaction that also puts an AuditMark of kind "force", so the auditor
// records a `force` event and a force_release row joined by the revision.
//
// A pending request is /holdfast/force/<id> on a lease of `request_ttl`: it
// expires by itself. Requests are visible to every replica.
//
// Why two people: a forced hold's holder may still be running; for a fenced class
// the fence stops its writes, for an advisory class nothing does, so approving
// one of those needs an explicit acknowledgement (ack_unfenced).
//
// The released hold's waiters are served as after any release: the head of the
// queue watches the holds and takes the lock.
//
// Thread-safe; blocking (runs on the Admin service's synchronous pool).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "etcd/client.h"
#include "holdfast/v1/admin.pb.h"

namespace holdfast::lock {

class ForceReleases {
 public:
  ForceReleases(etcd::Client* etcd, std::chrono::seconds request_ttl)
      : etcd_(etcd), request_ttl_(request_ttl) {}

  absl::StatusOr<v1::ForceRequest> Request(const std::string& requester,
                                           const v1::RequestForceReleaseRequest& req,
                                           etcd::Deadline d);
  absl::StatusOr<v1::ApproveForceReleaseResponse> Approve(
      const std::string& approver, const v1::ApproveForceReleaseRequest& req, etcd::Deadline d);
  absl::StatusOr<std::vector<v1::ForceRequest>> List(etcd::Deadline d);

  static constexpr size_t kMaxReasonBytes = 1024;

 private:
  etcd::Client* const etcd_;
  const std::chrono::seconds request_ttl_;
};

}  // namespace holdfast::lock
