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

// True for the UNAVAILABLE answers etcd gives while its cluster elects a leader
// or refuses a change, which every member would give alike: "leader changed",
// "request timed out, possibly due to previous leader failure", "unhealthy
// cluster", "not capable". The client does not move on them blindly (that would
// only break its streams and open them elsewhere in the middle of an election):
// it asks that member for its Status and moves only if it has no leader or does
// not answer (Client::CheckSilent). A member can also say "leader changed" of
// itself (its link to the leader came back), which the check tells apart. Plain
// "request timed out" is not among them: a member without a leader answers a
// write with it.
bool ClusterWideUnavailable(const absl::Status& s);

// True for answers that mean "this endpoint cannot serve now", after which the
// client moves to another member at once: every UNAVAILABLE but the cluster-wide
// ones above (the transport's refusals and resets; a member's "no leader",
// "server stopped", "request timed out", "... due to connection lost", "rpc not
// supported for learner").
inline bool EndpointUnavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable && !ClusterWideUnavailable(s);
}

}  // namespace holdfast::etcd
