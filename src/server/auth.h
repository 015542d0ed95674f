// Who is calling: the boundary where holdfastd turns a connection into an
// identity (ARCHITECTURE §9).
//
// With TLS (production), the caller is the SPIFFE ID in its client certificate,
// which gRPC has already verified against the CA bundle: exactly one URI SAN, a
// valid SPIFFE ID (common/spiffe.h), and a trust domain of the configured list.
// Insecure mode (loopback development only) makes every caller the dev identity,
// and an admin.
//
// A connection presents the same certificate on every call, so the identity of
// each certificate is kept (by its PEM text) once worked out, and a call costs a
// hash lookup instead of a PEM and X.509 parse (a rotated SVID is a new entry).
// Refusals are kept too: the answer for a certificate depends on nothing else,
// since the options never change. At most max_cached_certificates are kept (0:
// none), of at most kMaxCachedPemBytes each (an SVID is about 1 KiB; a larger one
// is parsed on every call): 1–2 MiB for a thousand SVIDs, 17 MiB at worst. The
// cache is emptied when it is full, so more live certificates than the bound
// (or a fleet rotating its SVIDs) costs a parse per certificate once per fill.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lock/engine.h"

namespace holdfast::server {

class Authenticator {
 public:
  struct Options {
    bool insecure = false;
    std::string dev_identity;
    std::vector<std::string> trust_domains;
    std::vector<std::string> admin_ids;  // SPIFFE ID patterns
    size_t max_cached_certificates = 1024;
  };
  static constexpr size_t kMaxCachedPemBytes = 16 * 1024;
  explicit Authenticator(Options options) : options_(std::move(options)) {}

  // UNAUTHENTICATED with the reason when the peer has no acceptable identity.
  absl::StatusOr<lock::Caller> CallerOf(const grpc::ServerContextBase& ctx) const;
  // The identity of a PEM certificate, by the rules above (exposed for tests).
  absl::StatusOr<lock::Caller> CallerOfCertificate(absl::string_view pem) const;
  // Certificates whose identity is kept now.
  size_t cached_certificates() const;
  // PERMISSION_DENIED unless the caller is an admin.
  static absl::Status RequireAdmin(const lock::Caller& caller);

 private:
  absl::StatusOr<lock::Caller> Parse(absl::string_view pem) const;

  const Options options_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, absl::StatusOr<lock::Caller>> by_pem_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::server
