// The one place absl::Status and grpc::Status are translated into each other.
// Codes map one to one (both use the canonical code space); messages are kept.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace holdfast {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace holdfast
