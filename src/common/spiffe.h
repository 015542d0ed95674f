// SPIFFE IDs (spiffe://<trust-domain>/<path>) as the X.509-SVID rules define
// them, and the member patterns namespaces use to admit them. Pure logic,
// shared by holdfastd (which authenticates callers) and the CLI.
//
//   trust domain: 1..255 of [a-z0-9.-_], no port, no user info
//   path:         "" or segments "/seg" of [a-zA-Z0-9.-_], no "." or ".." segment,
//                 no empty segment, no trailing "/"
//   no query, no fragment; at most 2048 bytes
//
// Pattern: an exact SPIFFE ID, or a prefix ending in "/*" that matches the IDs
// below it ("spiffe://acme.org/payments/*" matches ".../payments/api", not
// ".../payments" itself nor ".../payments-old/x").
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace holdfast::spiffe {

struct Id {
  std::string trust_domain;
  std::string path;  // "" or "/a/b"
  std::string ToString() const { return "spiffe://" + trust_domain + path; }
};

// INVALID_ARGUMENT naming the rule that failed.
absl::StatusOr<Id> Parse(absl::string_view uri);

// INVALID_ARGUMENT unless `pattern` is a valid ID with a path (every caller's
// has one) or a valid ID followed by "/*" ("spiffe://acme.org/*": the whole
// trust domain).
absl::Status ValidatePattern(absl::string_view pattern);
// The ID a valid pattern names (for one ending in "/*", the ID before it);
// ValidatePattern's error otherwise.
absl::StatusOr<Id> ParsePattern(absl::string_view pattern);
bool Matches(absl::string_view id, absl::string_view pattern);

}  // namespace holdfast::spiffe
