#include "server/auth.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/pem_file.h"
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

// The file's modification time, or nullopt when it cannot be read.
std::optional<struct timespec> ModifiedAt(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st.st_mtim;
}

}  // namespace

// One trust domain's CAs, as read from its file at `modified`.
struct Authenticator::Bundle {
  std::string file;
  struct timespec modified {};
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store{nullptr, X509_STORE_free};
};

Authenticator::~Authenticator() = default;

absl::Status Authenticator::Load() {
  for (const auto& [domain, file] : options_.trust_bundles) {
    if (auto b = BundleOf(domain); !b.ok()) return b.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Authenticator::Bundle>> Authenticator::BundleOf(
    const std::string& domain) const {
  auto configured = options_.trust_bundles.find(domain);
  if (configured == options_.trust_bundles.end()) return nullptr;
  const std::string& file = configured->second;
  const auto modified = ModifiedAt(file);
  {
    absl::ReaderMutexLock l(&bundles_mu_);
    auto it = bundles_.find(domain);
    if (it != bundles_.end() && modified && it->second->modified.tv_sec == modified->tv_sec &&
        it->second->modified.tv_nsec == modified->tv_nsec) {
      return it->second;
    }
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  bool complete = false;
  auto certs = ReadPemCertificates(text.str(), &complete);
  if (!modified || !in || certs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the trust bundle of ", domain, " (", file, ") cannot be read or holds no certificate"));
  }
  if (!complete) {
    // Kept, the CAs after it would be lost without a word.
    return absl::FailedPreconditionError(absl::StrCat(
        "the trust bundle of ", domain, " (", file, ") has a block after its certificate ",
        certs.size(), " that cannot be read as a certificate"));
  }
  auto bundle = std::make_shared<Bundle>();
  bundle->file = file;
  bundle->modified = *modified;
  bundle->store.reset(X509_STORE_new());
  for (const auto& c : certs) X509_STORE_add_cert(bundle->store.get(), c.get());
  ERR_clear_error();  // a certificate listed twice reads as an error
  {
    absl::MutexLock l(&bundles_mu_);
    bundles_[domain] = bundle;
  }
  // Answers worked out with the old bundle go, and those being worked out now
  // are not kept.
  absl::MutexLock l(&mu_);
  by_pem_.clear();
  ++generation_;
  return bundle;
}

absl::Status Authenticator::VerifyDomain(const std::string& domain, absl::string_view pem,
                                         absl::string_view chain) const {
  auto bundle = BundleOf(domain);
  if (!bundle.ok()) return absl::UnavailableError(bundle.status().message());
  if (*bundle == nullptr) return absl::OkStatus();
  auto certs = ReadPemCertificates(chain.empty() ? pem : chain);
  auto leaf = ReadPemCertificates(pem);
  if (certs.empty() || leaf.empty()) {
    return absl::UnauthenticatedError("the client certificate cannot be parsed");
  }
  auto free_stack = [](STACK_OF(X509) * s) { sk_X509_free(s); };  // not the certificates
  std::unique_ptr<STACK_OF(X509), decltype(free_stack)> untrusted(sk_X509_new_null(), free_stack);
  for (const auto& c : certs) sk_X509_push(untrusted.get(), c.get());
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      X509_STORE_CTX_free);
  if (!ctx || X509_STORE_CTX_init(ctx.get(), (*bundle)->store.get(), leaf.front().get(),
                                  untrusted.get()) != 1) {
    ERR_clear_error();
    return absl::UnauthenticatedError("the client certificate chain cannot be checked");
  }
  const bool verified = X509_verify_cert(ctx.get()) == 1;
  const int error = X509_STORE_CTX_get_error(ctx.get());
  ERR_clear_error();
  if (verified) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(
      "the client certificate is not signed by a CA of trust domain ", domain,
      " (tls.trust_bundles): ", X509_verify_cert_error_string(error)));
}

absl::StatusOr<lock::Caller> Authenticator::CallerOfCertificate(absl::string_view pem,
                                                                absl::string_view chain) const {
  // The leaf decides the identity; with bundles, the answer depends on the
  // certificates presented with it too (which, on the server side, gRPC reports
  // without the leaf: many callers' leaves share one chain).
  std::string with_chain;
  absl::string_view key = pem;
  if (!options_.trust_bundles.empty() && !chain.empty()) {
    with_chain = absl::StrCat(pem, "\n", chain);
    key = with_chain;
  }
  uint64_t generation;
  {
    absl::ReaderMutexLock l(&mu_);
    if (auto it = by_pem_.find(key); it != by_pem_.end()) return it->second;
    generation = generation_;
  }
  bool cacheable = true;
  absl::StatusOr<lock::Caller> caller = Parse(pem, chain, &cacheable);
  if (!cacheable || key.size() > kMaxCachedPemBytes || options_.max_cached_certificates == 0) {
    return caller;
  }
  absl::MutexLock l(&mu_);
  if (generation != generation_) return caller;  // a bundle was reloaded meanwhile
  if (by_pem_.size() >= options_.max_cached_certificates) by_pem_.clear();
  by_pem_.emplace(key, caller);
  return caller;
}

absl::Status Authenticator::CheckPatternAccepted(absl::string_view field,
                                                 absl::string_view pattern) const {
  if (options_.insecure) return absl::OkStatus();
  auto parsed = spiffe::ParsePattern(pattern);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", parsed.status().message()));
  }
  const auto& tds = options_.trust_domains;
  if (std::find(tds.begin(), tds.end(), parsed->trust_domain) != tds.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " \"", pattern, "\" is in trust domain \"", parsed->trust_domain,
      "\", which this holdfastd does not accept (tls.trust_domains: ", absl::StrJoin(tds, ", "),
      "): it would admit nobody"));
}

size_t Authenticator::cached_certificates() const {
  absl::ReaderMutexLock l(&mu_);
  return by_pem_.size();
}

absl::StatusOr<lock::Caller> Authenticator::Parse(absl::string_view pem,
                                                  absl::string_view chain,
                                                  bool* cacheable) const {
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
  if (auto s = VerifyDomain(id->trust_domain, pem, chain); !s.ok()) {
    // A bundle that cannot be read now (mid-rotation, say) decides nothing for
    // good: the answer is not kept.
    if (s.code() == absl::StatusCode::kUnavailable) *cacheable = false;
    return absl::UnauthenticatedError(absl::StrCat(id->ToString(), ": ", s.message()));
  }
  lock::Caller caller{id->ToString(), false};
  caller.admin = IsAdmin(caller.identity);
  return caller;
}

bool Authenticator::IsAdmin(const std::string& identity) const {
  if (options_.insecure) return identity == options_.dev_identity;
  for (const auto& pattern : options_.admin_ids) {
    if (spiffe::Matches(identity, pattern)) return true;
  }
  return false;
}

absl::StatusOr<lock::Caller> Authenticator::CallerOf(const grpc::ServerContextBase& ctx) const {
  if (options_.insecure) return lock::Caller{options_.dev_identity, true};
  auto auth = ctx.auth_context();
  if (!auth) return absl::UnauthenticatedError("no TLS peer");
  auto pems = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pems.empty()) return absl::UnauthenticatedError("no client certificate was presented");
  absl::string_view chain;
  if (!options_.trust_bundles.empty()) {
    auto chains = auth->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
    if (!chains.empty()) chain = absl::string_view(chains.front().data(), chains.front().size());
  }
  return CallerOfCertificate(absl::string_view(pems.front().data(), pems.front().size()), chain);
}

absl::Status Authenticator::RequireAdmin(const lock::Caller& caller) {
  if (caller.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.identity, " is not an admin of this holdfast service"));
}

}  // namespace holdfast::server
