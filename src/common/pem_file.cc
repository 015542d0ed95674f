#include "common/pem_file.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/openssl_error.h"

namespace holdfast {

bool IsPemLabelOf(PemKind kind, absl::string_view label) {
  // OpenSSL reads trusted certificates (RHEL's ca-bundle.trust.crt) and the old
  // X509 label as certificates too.
  return kind == PemKind::kCertificates
             ? label == "CERTIFICATE" || label == "TRUSTED CERTIFICATE" ||
                   label == "X509 CERTIFICATE"
             : label == "PRIVATE KEY" || absl::EndsWith(label, " PRIVATE KEY");
}

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
    found = IsPemLabelOf(kind, label);
  }
  if (!found) {
    return refuse(kind == PemKind::kCertificates
                      ? " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)"
                      : " holds no PEM private key (no \"-----BEGIN PRIVATE KEY-----\" line)");
  }
  return absl::OkStatus();
}

std::vector<X509Ptr> ReadPemCertificates(absl::string_view pem, bool* complete) {
  std::vector<X509Ptr> out;
  if (complete != nullptr) *complete = false;
  if (pem.empty() || pem.size() > static_cast<size_t>(INT_MAX)) return out;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  // (_AUX: also the TRUSTED CERTIFICATE form of a CA, as OpenSSL's tools write it.)
  while (X509* cert = PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr)) {
    out.emplace_back(cert, X509_free);
  }
  // The end of the text reads as "no start line"; anything else is a block
  // that is not a certificate.
  const unsigned long err = ERR_peek_last_error();
  if (complete != nullptr) {
    *complete = ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE;
  }
  ERR_clear_error();
  return out;
}

size_t CountWholeCertificates(absl::string_view pem) {
  bool complete = false;
  const size_t n = ReadPemCertificates(pem, &complete).size();
  return complete ? n : 0;
}

absl::Status CheckKeyPairPem(const std::string& where, const std::string& cert_path,
                             const std::string& key_path, const std::string& cert_pem,
                             const std::string& key_pem, const std::string& reader) {
  using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;
  ERR_clear_error();
  BioPtr cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())), BIO_free);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "cert_file ", cert_path, ": its first certificate cannot be read: ",
                     TakeOpenSslErrors("no certificate")));
  }
  BioPtr key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), BIO_free);
  auto no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr), EVP_PKEY_free);
  if (!key) {
    const std::string why = TakeOpenSslErrors("no private key");
    if (key_pem.find("-----BEGIN ENCRYPTED PRIVATE KEY-----") != std::string::npos ||
        key_pem.find("Proc-Type: 4,ENCRYPTED") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "key_file ", key_path, " is encrypted: ", reader,
          " reads keys without a passphrase (write it out unencrypted, readable by ", reader,
          " only: openssl pkey -in KEY -out KEY.plain)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, "key_file ", key_path, ": the private key cannot be read: ", why));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        where, "cert_file and ", where, "key_file do not belong together: ", key_path,
        " is not the key of the certificate in ", cert_path,
        " (a certificate renewed without its key, or the other way round?)"));
  }
  return absl::OkStatus();
}

}  // namespace holdfast
