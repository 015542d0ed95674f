#include "dev/certs.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::dev {

namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;
using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

constexpr long kBackdateSeconds = 3600;  // tolerate an hour of clock skew

KeyPtr NewKey() { return KeyPtr(EVP_EC_gen("P-256"), EVP_PKEY_free); }

std::string BioText(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n);
}

std::string ToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  return BioText(bio.get());
}

std::string ToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  return BioText(bio.get());
}

bool AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  bool added = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return added;
}

CertPtr NewCert(const std::string& cn, EVP_PKEY* key, long not_before, long not_after) {
  CertPtr cert(X509_new(), X509_free);
  X509_set_version(cert.get(), 2);
  unsigned char serial[8];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), not_before);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), not_after);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_pubkey(cert.get(), key);
  return cert;
}

absl::StatusOr<CertPtr> ParseCert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) return absl::InvalidArgumentError("not a PEM certificate");
  return cert;
}

absl::StatusOr<KeyPtr> ParseKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!key) return absl::InvalidArgumentError("not a PEM private key");
  return key;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<Pem> MakeCa(const CaOptions& o) {
  KeyPtr key = NewKey();
  if (!key) return absl::InternalError("key generation failed");
  CertPtr cert = NewCert(o.common_name, key.get(), -kBackdateSeconds,
                         static_cast<long>(o.validity.count()));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  if (!AddExt(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE") ||
      !AddExt(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExt(cert.get(), cert.get(), NID_subject_key_identifier, "hash")) {
    return absl::InternalError("cannot add the CA extensions");
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("cannot sign the CA certificate");
  }
  return Pem{ToPem(cert.get()), ToPem(key.get())};
}

absl::StatusOr<Pem> MakeLeaf(const Pem& ca, const LeafOptions& o) {
  auto ca_cert = ParseCert(ca.cert);
  if (!ca_cert.ok()) return absl::InvalidArgumentError("bad CA certificate");
  auto ca_key = ParseKey(ca.key);
  if (!ca_key.ok()) return absl::InvalidArgumentError("bad CA key");
  KeyPtr key = NewKey();
  if (!key) return absl::InternalError("key generation failed");
  CertPtr cert = o.expired ? NewCert(o.common_name, key.get(), -2 * 86400, -86400)
                           : NewCert(o.common_name, key.get(), -kBackdateSeconds,
                                     static_cast<long>(o.validity.count()));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert->get()));
  if (!AddExt(cert.get(), ca_cert->get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExt(cert.get(), ca_cert->get(), NID_key_usage,
              "critical,digitalSignature,keyAgreement") ||
      !AddExt(cert.get(), ca_cert->get(), NID_ext_key_usage, "serverAuth,clientAuth")) {
    return absl::InternalError("cannot add the leaf extensions");
  }
  std::vector<std::string> sans;
  for (const auto& d : o.dns) sans.push_back("DNS:" + d);
  for (const auto& ip : o.ips) sans.push_back("IP:" + ip);
  for (const auto& u : o.uris) sans.push_back("URI:" + u);
  if (!sans.empty() &&
      !AddExt(cert.get(), ca_cert->get(), NID_subject_alt_name, absl::StrJoin(sans, ","))) {
    return absl::InvalidArgumentError(absl::StrCat("bad SAN list: ", absl::StrJoin(sans, ",")));
  }
  if (X509_sign(cert.get(), ca_key->get(), EVP_sha256()) == 0) {
    return absl::InternalError("cannot sign the leaf certificate");
  }
  return Pem{ToPem(cert.get()), ToPem(key.get())};
}

absl::StatusOr<CertInfo> InspectCert(const std::string& pem) {
  auto cert = ParseCert(pem);
  if (!cert.ok()) return cert.status();
  CertInfo info;
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert->get()), &tm) != 1) {
    return absl::InvalidArgumentError("the certificate's notAfter cannot be read");
  }
  info.not_after = std::chrono::system_clock::from_time_t(timegm(&tm));
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert->get(), NID_subject_alt_name, nullptr, nullptr));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type != GEN_URI) continue;
      const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
      info.uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                             ASN1_STRING_length(uri));
    }
    GENERAL_NAMES_free(names);
  }
  info.pem = ToPem(cert->get());
  return info;
}

bool IsSignedBy(const std::string& cert_pem, const std::string& ca_pem) {
  auto cert = ParseCert(cert_pem);
  auto ca = ParseCert(ca_pem);
  if (!cert.ok() || !ca.ok()) return false;
  if (X509_check_issued(ca->get(), cert->get()) != X509_V_OK) return false;
  EVP_PKEY* ca_key = X509_get0_pubkey(ca->get());
  return ca_key != nullptr && X509_verify(cert->get(), ca_key) == 1;
}

bool CoversHost(const std::string& cert_pem, const std::string& host) {
  auto cert = ParseCert(cert_pem);
  if (!cert.ok()) return false;
  if (X509_check_ip_asc(cert->get(), host.c_str(), 0) == 1) return true;
  return X509_check_host(cert->get(), host.data(), host.size(), 0, nullptr) == 1;
}

bool KeyMatches(const std::string& cert_pem, const std::string& key_pem) {
  auto cert = ParseCert(cert_pem);
  auto key = ParseKey(key_pem);
  if (!cert.ok() || !key.ok()) return false;
  return X509_check_private_key(cert->get(), key->get()) == 1;
}

absl::StatusOr<Pem> ReadPem(const std::string& dir, const std::string& name) {
  auto cert = ReadWholeFile(absl::StrCat(dir, "/", name, ".pem"));
  if (!cert.ok()) return cert.status();
  auto key = ReadWholeFile(absl::StrCat(dir, "/", name, "_key.pem"));
  if (!key.ok()) return key.status();
  return Pem{*std::move(cert), *std::move(key)};
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return fail("create");
  // open() applies the umask, and an old tmp file keeps its mode: set it exactly.
  bool ok = ::fchmod(fd, static_cast<mode_t>(mode)) == 0;
  for (size_t done = 0; ok && done < contents.size();) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  if (::close(fd) != 0) ok = false;
  if (!ok) return fail("write");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename onto");
  return absl::OkStatus();
}

absl::Status WritePem(const std::string& dir, const std::string& name, const Pem& pem) {
  // The key first: a certificate on disk is never newer than its key.
  if (auto s = WriteFileAtomically(absl::StrCat(dir, "/", name, "_key.pem"), pem.key, 0600);
      !s.ok()) {
    return s;
  }
  return WriteFileAtomically(absl::StrCat(dir, "/", name, ".pem"), pem.cert, 0644);
}

}  // namespace holdfast::dev
