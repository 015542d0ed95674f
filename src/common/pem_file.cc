#include "common/pem_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace holdfast {

absl::Status CheckPemFile(const std::string& path, PemKind kind) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, why));
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return refuse(absl::StrCat(": cannot read: ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) return refuse(" is a directory");
  std::ifstream in(path);
  if (!in) return refuse(absl::StrCat(": cannot read: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  // The label of each "-----BEGIN LABEL-----" line: a key file may start with
  // another block ("-----BEGIN EC PARAMETERS-----" from openssl ecparam).
  const std::string pem = text.str();
  bool found = false;
  for (size_t at = pem.find("-----BEGIN "); at != std::string::npos && !found;
       at = pem.find("-----BEGIN ", at + 1)) {
    const size_t start = at + std::strlen("-----BEGIN ");
    const size_t end = pem.find("-----", start);
    if (end == std::string::npos) break;
    const absl::string_view label = absl::string_view(pem).substr(start, end - start);
    // OpenSSL reads trusted certificates (RHEL's ca-bundle.trust.crt) and the
    // old X509 label as certificates too.
    found = kind == PemKind::kCertificates
                ? label == "CERTIFICATE" || label == "TRUSTED CERTIFICATE" ||
                      label == "X509 CERTIFICATE"
                : label == "PRIVATE KEY" || absl::EndsWith(label, " PRIVATE KEY");
  }
  if (!found) {
    return refuse(kind == PemKind::kCertificates
                      ? " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)"
                      : " holds no PEM private key (no \"-----BEGIN PRIVATE KEY-----\" line)");
  }
  return absl::OkStatus();
}

}  // namespace holdfast
