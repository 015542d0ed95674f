// Whether a file can be used where a PEM file is asked for (a CA bundle, a
// certificate chain, a key): checked where it is named, so a typo in a path, or
// a certificate and a key swapped, is refused with the path and the reason before
// anything connects, rather than showing up later as handshakes that fail
// (gRPC's certificate watcher only logs a file it cannot use).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace holdfast {

// What the file must hold: certificates (a CA bundle, a certificate chain:
// "-----BEGIN CERTIFICATE-----", or TRUSTED or X509 CERTIFICATE) or a private key ("-----BEGIN ... PRIVATE
// KEY-----": PKCS#8, EC or RSA).
enum class PemKind { kCertificates, kPrivateKey };

// OK when `path` can be read, is not a directory, and holds a block of `kind`.
// Otherwise INVALID_ARGUMENT: "PATH: cannot read: <the OS's reason>", "PATH is a
// directory", or "PATH holds no PEM certificate (no "-----BEGIN CERTIFICATE-----"
// line)" / "... no PEM private key ...". Reads the file (whole: PEM files are
// small).
absl::Status CheckPemFile(const std::string& path, PemKind kind);

}  // namespace holdfast
