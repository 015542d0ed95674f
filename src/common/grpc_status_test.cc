#include "common/grpc_status.h"

#include <string>

#include <gtest/gtest.h>

namespace holdfast {
namespace {

TEST(GrpcStatusTest, CodesAndShortMessagesGoAcrossAsTheyAre) {
  const absl::Status s = absl::InvalidArgumentError("lock key \"jobs/é\" is too long");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(), s.message());
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

// A message echoing a caller's megabyte reason is cut, at a character
// boundary, and says how much was left out.
TEST(GrpcStatusTest, ALongMessageIsCutAndSaysByHowMuch) {
  std::string reason = "reason \"";
  while (reason.size() < 100'000) reason += "é";  // two bytes each
  const grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError(reason));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::string& m = g.error_message();
  EXPECT_LE(m.size(), kMaxStatusMessageBytes);
  EXPECT_EQ(m.rfind("reason \"é", 0), 0u);
  const size_t note = m.find("... (");
  ASSERT_NE(note, std::string::npos) << m.substr(m.size() - 60);
  const size_t kept = note;
  EXPECT_EQ(m.substr(note), "... (" + std::to_string(reason.size() - kept) + " more bytes)");
  // Whole characters only: the kept part ends after a complete "é".
  EXPECT_EQ(reason.substr(0, kept), m.substr(0, kept));
  EXPECT_NE(static_cast<unsigned char>(reason[kept]) & 0xC0, 0x80u);
}

}  // namespace
}  // namespace holdfast
