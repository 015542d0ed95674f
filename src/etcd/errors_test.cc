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

// A member that cannot serve sends the client elsewhere; an answer etcd gives
// about its whole cluster, which every member would give, is first checked
// against the member's Status (moving in the middle of an election would only
// break the watch and keepalive streams).
TEST(EtcdErrorsTest, OnlyAMembersOwnUnavailabilityMovesTheClientAtOnce) {
  auto from = [](const char* msg) {
    return FromEtcd(grpc::Status(grpc::StatusCode::UNAVAILABLE, msg));
  };
  for (const char* msg : {"etcdserver: no leader", "etcdserver: server stopped",
                          "etcdserver: request timed out",
                          "etcdserver: request timed out, possibly due to connection lost",
                          "etcdserver: rpc not supported for learner",
                          "failed to connect to all addresses", "Socket closed"}) {
    EXPECT_TRUE(EndpointUnavailable(from(msg))) << msg;
    EXPECT_FALSE(ClusterWideUnavailable(from(msg))) << msg;
  }
  for (const char* msg : {"etcdserver: leader changed",
                          "etcdserver: request timed out, possibly due to previous leader failure",
                          "etcdserver: unhealthy cluster", "etcdserver: not capable"}) {
    EXPECT_FALSE(EndpointUnavailable(from(msg))) << msg;
    EXPECT_TRUE(ClusterWideUnavailable(from(msg))) << msg;
    EXPECT_TRUE(OutcomeUnknown(from(msg))) << msg;  // a write's outcome is still open
  }
  for (auto s : {absl::DeadlineExceededError("etcd: Deadline Exceeded"),
                 absl::FailedPreconditionError("etcd: leader changed")}) {
    EXPECT_FALSE(EndpointUnavailable(s)) << s;
    EXPECT_FALSE(ClusterWideUnavailable(s)) << s;
  }
}

}  // namespace
}  // namespace holdfast::etcd
