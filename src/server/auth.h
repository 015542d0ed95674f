// Who is calling: the boundary where holdfastd turns a connection into an
// identity (ARCHITECTURE §9).
//
// With TLS (production), the caller is the SPIFFE ID in its client certificate,
// which gRPC has already verified against the CA bundle: exactly one URI SAN, a
// valid SPIFFE ID (common/spiffe.h), and a trust domain of the configured list.
// Insecure mode (loopback development only) makes every caller the dev identity,
// and an admin.
//
// Thread-safe (immutable after construction).
#pragma once

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "lock/engine.h"

namespace holdfast::server {

class Authenticator {
 public:
  struct Options {
    bool insecure = false;
    std::string dev_identity;
    std::vector<std::string> trust_domains;
    std::vector<std::string> admin_ids;  // SPIFFE ID patterns
  };
  explicit Authenticator(Options options) : options_(std::move(options)) {}

  // UNAUTHENTICATED with the reason when the peer has no acceptable identity.
  absl::StatusOr<lock::Caller> CallerOf(const grpc::ServerContextBase& ctx) const;
  // The identity of a PEM certificate, by the rules above (exposed for tests).
  absl::StatusOr<lock::Caller> CallerOfCertificate(const std::string& pem) const;
  // PERMISSION_DENIED unless the caller is an admin.
  static absl::Status RequireAdmin(const lock::Caller& caller);

 private:
  const Options options_;
};

}  // namespace holdfast::server
