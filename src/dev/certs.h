// X.509 certificates made with OpenSSL, for development and tests: a CA and leaf
// certificates with DNS, IP and URI (SPIFFE ID) SANs, valid or already expired.
// `holdfast dev` keeps its dev CA with these (dev/dev_pki.h); the test harness
// makes its test CAs with them. Never used by holdfastd.
//
// Keys are EC P-256, signatures SHA-256, serial numbers 63 random bits.
//
// Thread-safe (no shared state).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace holdfast::dev {

// A certificate and its private key, both PEM.
struct Pem {
  std::string cert;
  std::string key;
};

struct CaOptions {
  std::string common_name = "holdfast CA";
  // From an hour ago (clock skew) to this long from now.
  std::chrono::seconds validity = std::chrono::hours(7 * 24);
};

// A self-signed CA (basicConstraints CA:TRUE, keyCertSign).
absl::StatusOr<Pem> MakeCa(const CaOptions& options);
inline absl::StatusOr<Pem> MakeCa(const std::string& common_name) {
  CaOptions o;
  o.common_name = common_name;
  return MakeCa(o);
}

struct LeafOptions {
  std::string common_name = "leaf";
  std::vector<std::string> dns;   // DNS SANs
  std::vector<std::string> ips;   // IP SANs
  std::vector<std::string> uris;  // URI SANs (SPIFFE IDs)
  // From an hour ago to this long from now.
  std::chrono::seconds validity = std::chrono::hours(2 * 24);
  bool expired = false;           // valid from two days ago to yesterday instead
};
// A leaf for both server and client authentication, signed by `ca`.
// Errors: INVALID_ARGUMENT (bad CA PEM, bad SAN), INTERNAL (OpenSSL failed).
absl::StatusOr<Pem> MakeLeaf(const Pem& ca, const LeafOptions& options);

// What a certificate says about itself.
struct CertInfo {
  std::chrono::system_clock::time_point not_after;
  std::vector<std::string> uris;  // URI SANs
  std::string pem;                // the certificate (first of the PEM text)
};
// Errors: INVALID_ARGUMENT when `pem` holds no parsable certificate.
absl::StatusOr<CertInfo> InspectCert(const std::string& pem);
// True when `cert_pem`'s signature verifies with `ca_pem`'s key and its issuer
// is the CA's subject.
bool IsSignedBy(const std::string& cert_pem, const std::string& ca_pem);
// True when the certificate carries `host` as an IP SAN (an IP literal) or
// matches it as a DNS name.
bool CoversHost(const std::string& cert_pem, const std::string& host);
// True when `key_pem` is the private key of `cert_pem`.
bool KeyMatches(const std::string& cert_pem, const std::string& key_pem);

// Reads <dir>/<name>.pem and <dir>/<name>_key.pem. NOT_FOUND when either is missing.
absl::StatusOr<Pem> ReadPem(const std::string& dir, const std::string& name);
// Writes <dir>/<name>.pem (mode 0644) and <dir>/<name>_key.pem (mode 0600), each
// through a temporary file and a rename, so a reader never sees half a file.
absl::Status WritePem(const std::string& dir, const std::string& name, const Pem& pem);
// Writes `contents` to `path` the same way, with file mode `mode`.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode);

}  // namespace holdfast::dev
