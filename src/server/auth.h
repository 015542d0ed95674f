// Who is calling: the boundary where holdfastd turns a connection into an
// identity (ARCHITECTURE §9).
//
// With TLS (production), the caller is the SPIFFE ID in its client certificate,
// which gRPC has already verified against the CA bundle: exactly one URI SAN, a
// valid SPIFFE ID (common/spiffe.h) with a path, and a trust domain of the
// configured list. With a bundle of its own for that trust domain (tls.trust_bundles,
// required by the config with more than one domain), the peer's chain must also
// lead to one of that bundle's CAs: ca_file holds every domain's CAs for the
// handshake, and a CA of one domain must not vouch for an ID of another (the
// SPIFFE rule: an SVID is checked against its own trust domain's bundle). A bundle
// file is read at start (Load) and again when its modification time changes, seen
// when a certificate not met before arrives; the kept answers are dropped then.
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
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
    std::map<std::string, std::string> trust_bundles;  // trust domain -> PEM file
    size_t max_cached_certificates = 1024;
  };
  static constexpr size_t kMaxCachedPemBytes = 16 * 1024;
  explicit Authenticator(Options options) : options_(std::move(options)) {}
  ~Authenticator();

  // Reads every trust bundle; an error names the file (holdfastd does not start).
  absl::Status Load();

  // UNAUTHENTICATED with the reason when the peer has no acceptable identity.
  absl::StatusOr<lock::Caller> CallerOf(const grpc::ServerContextBase& ctx) const;
  // The identity of a PEM certificate, by the rules above (exposed for tests).
  // `chain`: the peer's chain as gRPC reports it (PEM): on the server side, the
  // certificates presented after the leaf, without it; empty: the leaf alone.
  absl::StatusOr<lock::Caller> CallerOfCertificate(absl::string_view pem,
                                                   absl::string_view chain = {}) const;
  // Certificates whose identity is kept now.
  size_t cached_certificates() const;
  // PERMISSION_DENIED unless the caller is an admin.
  static absl::Status RequireAdmin(const lock::Caller& caller);
  // Whether `identity` (a SPIFFE ID) matches one of the admin patterns; in
  // insecure mode, whether it is the dev identity.
  bool IsAdmin(const std::string& identity) const;
  // INVALID_ARGUMENT naming the pattern when `pattern` (a valid SPIFFE ID
  // pattern) is in a trust domain this holdfastd does not accept: it would admit
  // nobody, since a caller from there is refused before any pattern is looked at.
  // OK in insecure mode, where every caller is the dev identity. `field` leads
  // the message ("member pattern").
  absl::Status CheckPatternAccepted(absl::string_view field, absl::string_view pattern) const;

 private:
  struct Bundle;
  // *cacheable: false when the answer depends on more than the certificate (a
  // bundle that could not be read).
  absl::StatusOr<lock::Caller> Parse(absl::string_view pem, absl::string_view chain,
                                     bool* cacheable) const;
  // OK when `chain` (or `pem` alone) leads to a CA of `domain`'s bundle, or the
  // domain has none; UNAVAILABLE when the bundle cannot be read.
  absl::Status VerifyDomain(const std::string& domain, absl::string_view pem,
                            absl::string_view chain) const;
  // The domain's bundle, read again if its file changed.
  absl::StatusOr<std::shared_ptr<const Bundle>> BundleOf(const std::string& domain) const;

  const Options options_;
  mutable absl::Mutex bundles_mu_;
  mutable std::map<std::string, std::shared_ptr<const Bundle>> bundles_
      ABSL_GUARDED_BY(bundles_mu_);
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, absl::StatusOr<lock::Caller>> by_pem_
      ABSL_GUARDED_BY(mu_);
  // Bumped by each bundle reload (which empties by_pem_): an answer worked out
  // against the bundle before is not kept after.
  mutable uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace holdfast::server
