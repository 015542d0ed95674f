// The boundary between etcd's gRPC errors and holdfast's absl::Status.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace holdfast::etcd {

// Keeps the canonical code and prefixes the message with "etcd: ", so a caller's
// error says which hop failed. etcd reports "no leader" and "leader changed" as
// UNAVAILABLE, a compacted revision as OUT_OF_RANGE, an unknown lease as NOT_FOUND.
absl::Status FromEtcd(const grpc::Status& s);

// True for the answers after which a write may or may not have committed (the
// call timed out or lost its connection), and a read may be asked again.
inline bool OutcomeUnknown(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// True for the answers after which a write may or may not have committed, for a
// caller that can read to find out: OutcomeUnknown's, and the transport's own
// failures in the middle of a call (INTERNAL, such as a stream reset; CANCELLED;
// UNKNOWN, which etcd also answers for errors it has no code for). None of these
// says the request was refused, so none may be reported as "nothing changed".
inline bool WriteOutcomeUnknown(const absl::Status& s) {
  return OutcomeUnknown(s) || s.code() == absl::StatusCode::kInternal ||
         s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kUnknown;
}

// True for answers that mean "this endpoint cannot serve now", after which the
// client moves to another member: UNAVAILABLE from the transport (refused, reset,
// no answer) and from a member about itself ("no leader", "server stopped",
// "request timed out, possibly due to connection lost" to its leader, "rpc not
// supported for learner"). False for the UNAVAILABLE etcd answers about its whole
// cluster, which every member gives alike ("leader changed" during an election,
// "request timed out" and "... due to previous leader failure", "unhealthy
// cluster", "not capable"): moving would only break the streams and open them
// again elsewhere, in the middle of an election.
bool EndpointUnavailable(const absl::Status& s);

}  // namespace holdfast::etcd
