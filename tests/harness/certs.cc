#include "harness/certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::testing {

namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

KeyPtr NewKey() { return KeyPtr(EVP_EC_gen("P-256"), EVP_PKEY_free); }

std::string ToPem(X509* cert) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  char* data;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n);
}

std::string ToPem(EVP_PKEY* key) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n);
}

bool AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return true;
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
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_pubkey(cert.get(), key);
  return cert;
}

absl::StatusOr<CertPtr> ParseCert(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) return absl::InternalError("bad certificate PEM");
  return cert;
}

absl::StatusOr<KeyPtr> ParseKey(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!key) return absl::InternalError("bad key PEM");
  return key;
}

}  // namespace

absl::StatusOr<Pem> MakeCa(const std::string& common_name) {
  KeyPtr key = NewKey();
  if (!key) return absl::InternalError("key generation failed");
  CertPtr cert = NewCert(common_name, key.get(), -3600, 7 * 86400);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  AddExt(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  AddExt(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  AddExt(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return absl::InternalError("sign");
  return Pem{ToPem(cert.get()), ToPem(key.get())};
}

absl::StatusOr<Pem> MakeLeaf(const Pem& ca, const LeafOptions& o) {
  auto ca_cert = ParseCert(ca.cert);
  auto ca_key = ParseKey(ca.key);
  if (!ca_cert.ok() || !ca_key.ok()) return absl::InternalError("bad CA");
  KeyPtr key = NewKey();
  CertPtr cert = o.expired ? NewCert(o.common_name, key.get(), -2 * 86400, -86400)
                           : NewCert(o.common_name, key.get(), -3600, 2 * 86400);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert->get()));
  AddExt(cert.get(), ca_cert->get(), NID_basic_constraints, "critical,CA:FALSE");
  AddExt(cert.get(), ca_cert->get(), NID_key_usage, "critical,digitalSignature,keyAgreement");
  AddExt(cert.get(), ca_cert->get(), NID_ext_key_usage, "serverAuth,clientAuth");
  std::vector<std::string> sans;
  for (const auto& d : o.dns) sans.push_back("DNS:" + d);
  for (const auto& ip : o.ips) sans.push_back("IP:" + ip);
  for (const auto& u : o.uris) sans.push_back("URI:" + u);
  if (!sans.empty() &&
      !AddExt(cert.get(), ca_cert->get(), NID_subject_alt_name, absl::StrJoin(sans, ","))) {
    return absl::InternalError("bad SAN");
  }
  if (X509_sign(cert.get(), ca_key->get(), EVP_sha256()) == 0) return absl::InternalError("sign");
  return Pem{ToPem(cert.get()), ToPem(key.get())};
}

absl::Status WritePem(const std::string& dir, const std::string& name, const Pem& pem) {
  std::ofstream c(dir + "/" + name + ".pem"), k(dir + "/" + name + "_key.pem");
  c << pem.cert;
  k << pem.key;
  if (!c || !k) return absl::InternalError(absl::StrCat("cannot write ", dir, "/", name));
  return absl::OkStatus();
}

}  // namespace holdfast::testing
