// Whether a file can be used where a PEM file is asked for (a CA bundle, a
// certificate chain, a key): checked where it is named, so a typo in a path, or
// a certificate and a key swapped, is refused with the path and the reason before
// anything connects, rather than showing up later as handshakes that fail
// (gRPC's certificate watcher only logs a file it cannot use).
#pragma once

#include <openssl/x509.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace holdfast {

// What the file must hold: certificates (a CA bundle, a certificate chain:
// "-----BEGIN CERTIFICATE-----", or TRUSTED or X509 CERTIFICATE) or a private key ("-----BEGIN ... PRIVATE
// KEY-----": PKCS#8, EC or RSA).
enum class PemKind { kCertificates, kPrivateKey };

// Whether a "-----BEGIN LABEL-----" block holds `kind`.
bool IsPemLabelOf(PemKind kind, absl::string_view label);

// OK when `path` can be read, is not a directory, and holds a block of `kind`.
// Otherwise INVALID_ARGUMENT: "PATH: cannot read: <the OS's reason>", "PATH is a
// directory", or "PATH holds no PEM certificate (no "-----BEGIN CERTIFICATE-----"
// line)" / "... no PEM private key ...". Reads the file (whole: PEM files are
// small).
absl::Status CheckPemFile(const std::string& path, PemKind kind);

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// Every certificate of a PEM text (CERTIFICATE or TRUSTED CERTIFICATE blocks),
// in order, up to the first block that cannot be read as one; `complete` (when
// given) says whether the text ended there. Blocks of other kinds (a key) are
// passed over.
std::vector<X509Ptr> ReadPemCertificates(absl::string_view pem, bool* complete = nullptr);

// The certificates a PEM text holds, or 0 when a block of it cannot be read as
// one (a file cut off mid-write).
size_t CountWholeCertificates(absl::string_view pem);

// That `cert_pem` (its first certificate) and `key_pem` (a key without a
// passphrase) read and belong together. INVALID_ARGUMENT naming the setting as
// `where` + "cert_file" / "key_file" ("tls.", or "" for a client's options) and
// the files' paths: "<where>cert_file PATH: its first certificate cannot be
// read: ...", "<where>key_file PATH is encrypted: <reader> reads keys without a
// passphrase ...", "<where>cert_file and <where>key_file do not belong together:
// KEY is not the key of the certificate in CERT ...".
absl::Status CheckKeyPairPem(const std::string& where, const std::string& cert_path,
                             const std::string& key_path, const std::string& cert_pem,
                             const std::string& key_pem, const std::string& reader);

}  // namespace holdfast
