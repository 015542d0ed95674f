#include "common/spiffe.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace holdfast::spiffe {

namespace {
constexpr absl::string_view kScheme = "spiffe://";
constexpr size_t kMaxIdBytes = 2048;
constexpr size_t kMaxTrustDomainBytes = 255;

bool TrustDomainChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}
bool PathChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '-' || c == '_';
}
absl::Status Bad(absl::string_view uri, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", uri.substr(0, 200), "\" is not a SPIFFE ID: ", why));
}
}  // namespace

absl::StatusOr<Id> Parse(absl::string_view uri) {
  if (uri.size() > kMaxIdBytes) return Bad(uri, "longer than 2048 bytes");
  if (uri.substr(0, kScheme.size()) != kScheme) return Bad(uri, "the scheme must be spiffe://");
  absl::string_view rest = uri.substr(kScheme.size());
  if (rest.find_first_of("?#") != absl::string_view::npos) {
    return Bad(uri, "no query or fragment is allowed");
  }
  size_t slash = rest.find('/');
  absl::string_view td = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash);
  if (td.empty()) return Bad(uri, "the trust domain is empty");
  if (td.size() > kMaxTrustDomainBytes) return Bad(uri, "the trust domain is too long");
  if (td.find('@') != absl::string_view::npos) return Bad(uri, "no user info is allowed");
  if (td.find(':') != absl::string_view::npos) return Bad(uri, "no port is allowed");
  for (char c : td) {
    if (!TrustDomainChar(c)) {
      return Bad(uri, "the trust domain may hold only lower-case letters, digits, '.', '-', '_'");
    }
  }
  if (!path.empty()) {
    if (path.back() == '/') return Bad(uri, "the path must not end with '/'");
    for (absl::string_view seg : absl::StrSplit(path.substr(1), '/')) {
      if (seg.empty()) return Bad(uri, "the path has an empty segment");
      if (seg == "." || seg == "..") return Bad(uri, "the path has a '.' or '..' segment");
      for (char c : seg) {
        if (!PathChar(c)) return Bad(uri, "the path may hold only letters, digits, '.', '-', '_'");
      }
    }
  }
  return Id{std::string(td), std::string(path)};
}

absl::Status ValidatePattern(absl::string_view pattern) { return ParsePattern(pattern).status(); }

absl::StatusOr<Id> ParsePattern(absl::string_view pattern) {
  absl::string_view id = pattern;
  const bool wildcard = absl::EndsWith(pattern, "/*");
  if (wildcard) id = pattern.substr(0, pattern.size() - 2);
  HF_ASSIGN_OR_RETURN(Id parsed, Parse(id));
  // A caller's SVID always has a path (holdfastd refuses one without), so an
  // exact pattern without one would admit nobody.
  if (!wildcard && parsed.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", pattern.substr(0, 200), "\" names a trust domain, which no caller's SPIFFE ID "
        "is (each has a path): \"", pattern.substr(0, 200), "/*\" admits the whole trust "
        "domain"));
  }
  return parsed;
}

bool Matches(absl::string_view id, absl::string_view pattern) {
  if (absl::EndsWith(pattern, "/*")) {
    absl::string_view prefix = pattern.substr(0, pattern.size() - 1);  // keeps the '/'
    return id.size() > prefix.size() && id.substr(0, prefix.size()) == prefix;
  }
  return id == pattern;
}

}  // namespace holdfast::spiffe
