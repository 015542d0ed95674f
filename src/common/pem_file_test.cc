#include "common/pem_file.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace holdfast {
namespace {

TEST(PemFileTest, ReadablePemIsAcceptedAnythingElseRefusedWithTheReason) {
  std::string dir = ::testing::TempDir() + "/holdfast-pem-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string pem = dir + "/ca.pem";
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  EXPECT_TRUE(CheckPemFile(pem).ok()) << CheckPemFile(pem);

  auto s = CheckPemFile(dir + "/svdi.pem");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir + "/svdi.pem: cannot read: No such file or directory");
  EXPECT_EQ(CheckPemFile(dir).message(), dir + " is not a file");
  const std::string der = dir + "/der.crt";
  std::ofstream(der) << std::string("\x30\x82\x01\x0a", 4);
  EXPECT_EQ(CheckPemFile(der).message(), der + " is not PEM (no \"-----BEGIN\" line)");
  const std::string empty = dir + "/empty.pem";
  std::ofstream{empty};
  EXPECT_EQ(CheckPemFile(empty).message(), empty + " is not PEM (no \"-----BEGIN\" line)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace holdfast
