// How etcd's answers are read: which codes leave a write's outcome open.
#include "etcd/errors.h"

#include <gtest/gtest.h>

namespace holdfast::etcd {
namespace {

TEST(EtcdErrorsTest, FromEtcdKeepsTheCodeAndNamesTheHop) {
  absl::Status s = FromEtcd(grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                                         "etcdserver: mvcc: required revision has been compacted"));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "etcd: mvcc: required revision has been compacted");
  EXPECT_TRUE(FromEtcd(grpc::Status::OK).ok());
}

// A stream reset comes back as INTERNAL: the write may have committed, so it is
// not an answer that says "refused" (a force approval must say "not known").
TEST(EtcdErrorsTest, TransportFailuresLeaveAWritesOutcomeOpen) {
  for (auto code : {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                    absl::StatusCode::kInternal, absl::StatusCode::kCancelled,
                    absl::StatusCode::kUnknown}) {
    EXPECT_TRUE(WriteOutcomeUnknown(absl::Status(code, "x"))) << absl::StatusCodeToString(code);
  }
  // Only those two are also "ask this read again elsewhere".
  EXPECT_FALSE(OutcomeUnknown(absl::InternalError("etcd: Received RST_STREAM with error code 2")));
  for (auto code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
                    absl::StatusCode::kResourceExhausted, absl::StatusCode::kPermissionDenied,
                    absl::StatusCode::kNotFound, absl::StatusCode::kOutOfRange,
                    absl::StatusCode::kDataLoss, absl::StatusCode::kOk}) {
    EXPECT_FALSE(WriteOutcomeUnknown(absl::Status(code, "x"))) << absl::StatusCodeToString(code);
  }
}

}  // namespace
}  // namespace holdfast::etcd
