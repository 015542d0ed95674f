#include "common/pem_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace holdfast {
namespace {

constexpr char kCert[] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

TEST(PemFileTest, CertificatesAndKeysAreAcceptedAnythingElseRefusedWithTheReason) {
  std::string dir = ::testing::TempDir() + "/holdfast-pem-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string cert = write("ca.pem", kCert);
  EXPECT_TRUE(CheckPemFile(cert, PemKind::kCertificates).ok());
  const std::string trusted = write("trust.crt", "-----BEGIN TRUSTED CERTIFICATE-----\nAAAA\n");
  EXPECT_TRUE(CheckPemFile(trusted, PemKind::kCertificates).ok());
  // A key as openssl writes each kind, one after its parameters.
  for (const char* label : {"PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"}) {
    const std::string key = write("key.pem", absl::StrCat("-----BEGIN ", label, "-----\nAAAA\n"));
    EXPECT_TRUE(CheckPemFile(key, PemKind::kPrivateKey).ok()) << label;
  }
  const std::string ec = write(
      "ec.pem", "-----BEGIN EC PARAMETERS-----\nBggq\n-----END EC PARAMETERS-----\n"
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n");
  EXPECT_TRUE(CheckPemFile(ec, PemKind::kPrivateKey).ok());

  auto s = CheckPemFile(dir + "/svdi.pem", PemKind::kCertificates);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir + "/svdi.pem: cannot read: No such file or directory");
  EXPECT_EQ(CheckPemFile(dir, PemKind::kCertificates).message(), dir + " is a directory");
  // A certificate and a key swapped.
  EXPECT_EQ(CheckPemFile(cert, PemKind::kPrivateKey).message(),
            cert + " holds no PEM private key (no \"-----BEGIN PRIVATE KEY-----\" line)");
  EXPECT_EQ(CheckPemFile(ec, PemKind::kCertificates).message(),
            ec + " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)");
  const std::string der = write("der.crt", std::string("\x30\x82\x01\x0a", 4));
  EXPECT_EQ(CheckPemFile(der, PemKind::kCertificates).message(),
            der + " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)");
  const std::string empty = write("empty.pem", "");
  EXPECT_FALSE(CheckPemFile(empty, PemKind::kPrivateKey).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace holdfast
