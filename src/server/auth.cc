#include "server/auth.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <climits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/spiffe.h"

namespace holdfast::server {

namespace {

// The URI SANs of a certificate.
absl::StatusOr<std::vector<std::string>> UriSans(absl::string_view pem) {
  if (pem.empty() || pem.size() > static_cast<size_t>(INT_MAX)) {
    return absl::UnauthenticatedError("the client certificate cannot be parsed");
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) {
    ERR_clear_error();  // leave no stale entry for this thread's next TLS call
    return absl::UnauthenticatedError("the client certificate cannot be parsed");
  }
  std::vector<std::string> uris;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      ASN1_STRING_length(uri));
  }
  GENERAL_NAMES_free(names);
  return uris;
}

}  // namespace

absl::StatusOr<lock::Caller> Authenticator::CallerOfCertificate(absl::string_view pem) const {
  {
    absl::ReaderMutexLock l(&mu_);
    if (auto it = by_pem_.find(pem); it != by_pem_.end()) return it->second;
  }
  absl::StatusOr<lock::Caller> caller = Parse(pem);
  if (pem.size() > kMaxCachedPemBytes || options_.max_cached_certificates == 0) return caller;
  absl::MutexLock l(&mu_);
  if (by_pem_.size() >= options_.max_cached_certificates) by_pem_.clear();
  by_pem_.emplace(pem, caller);
  return caller;
}

size_t Authenticator::cached_certificates() const {
  absl::ReaderMutexLock l(&mu_);
  return by_pem_.size();
}

absl::StatusOr<lock::Caller> Authenticator::Parse(absl::string_view pem) const {
  auto uris = UriSans(pem);
  if (!uris.ok()) return uris.status();
  if (uris->size() != 1) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate must have exactly one URI SAN (a SPIFFE ID); it has ",
        uris->size()));
  }
  auto id = spiffe::Parse(uris->front());
  if (!id.ok()) return absl::UnauthenticatedError(id.status().message());
  bool trusted = false;
  for (const auto& td : options_.trust_domains) trusted = trusted || td == id->trust_domain;
  if (!trusted) {
    return absl::UnauthenticatedError(absl::StrCat(
        "trust domain \"", id->trust_domain, "\" of ", id->ToString(), " is not accepted"));
  }
  // X.509-SVID: a workload's ID has a path; the bare trust domain names the
  // domain itself, never a caller.
  if (id->path.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        id->ToString(), " names a trust domain, not a workload: a client SVID's SPIFFE ID "
        "needs a path"));
  }
  lock::Caller caller{id->ToString(), false};
  for (const auto& pattern : options_.admin_ids) {
    caller.admin = caller.admin || spiffe::Matches(caller.identity, pattern);
  }
  return caller;
}

absl::StatusOr<lock::Caller> Authenticator::CallerOf(const grpc::ServerContextBase& ctx) const {
  if (options_.insecure) return lock::Caller{options_.dev_identity, true};
  auto auth = ctx.auth_context();
  if (!auth) return absl::UnauthenticatedError("no TLS peer");
  auto pems = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pems.empty()) return absl::UnauthenticatedError("no client certificate was presented");
  return CallerOfCertificate(absl::string_view(pems.front().data(), pems.front().size()));
}

absl::Status Authenticator::RequireAdmin(const lock::Caller& caller) {
  if (caller.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.identity, " is not an admin of this holdfast service"));
}

}  // namespace holdfast::server
