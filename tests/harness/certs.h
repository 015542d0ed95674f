// Test certificates made with OpenSSL: a CA and leaf certificates with DNS, IP and
// URI (SPIFFE ID) SANs, valid or already expired. For the TLS tests only.
//
// Thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace holdfast::testing {

struct Pem {
  std::string cert;
  std::string key;
};

// A self-signed CA.
absl::StatusOr<Pem> MakeCa(const std::string& common_name);

struct LeafOptions {
  std::string common_name = "leaf";
  std::vector<std::string> dns;   // DNS SANs
  std::vector<std::string> ips;   // IP SANs
  std::vector<std::string> uris;  // URI SANs (SPIFFE IDs)
  bool expired = false;           // valid from two days ago to yesterday
};
absl::StatusOr<Pem> MakeLeaf(const Pem& ca, const LeafOptions& options);

// Writes <dir>/<name>.pem, <name>_key.pem.
absl::Status WritePem(const std::string& dir, const std::string& name, const Pem& pem);

}  // namespace holdfast::testing
