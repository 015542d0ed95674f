// libholdfast's retries of Acquire, Release and Close, against a scripted stand-in for
// holdfastd in this process: it answers each call as the test scripts it (a reset
// stream, then an answer), which a real holdfastd behind a real network cannot be
// made to do on cue. No etcd is involved: what is tested is the client's side.
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "holdfast/client.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast {
namespace {

constexpr int64_t kSession = 7;
constexpr int64_t kToken = (int64_t{1} << 48) | 1234;

// Statuses to answer the next calls with, in order; OK once the script is spent.
class Script {
 public:
  void Push(grpc::Status s) {
    std::lock_guard l(mu_);
    next_.push_back(std::move(s));
  }
  grpc::Status Next() {
    std::lock_guard l(mu_);
    ++calls_;
    if (next_.empty()) return grpc::Status::OK;
    grpc::Status s = next_.front();
    next_.pop_front();
    return s;
  }
  int calls() {
    std::lock_guard l(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::deque<grpc::Status> next_;
  int calls_ = 0;
};

class FakeSessions final : public v1::Session::Service {
 public:
  Script close;

 private:
  grpc::Status Open(grpc::ServerContext*, const v1::OpenSessionRequest*,
                    v1::OpenSessionResponse* resp) override {
    resp->set_session_id(kSession);
    resp->set_ttl_ms(30'000);
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest>* stream) override {
    v1::KeepAliveRequest req;
    while (stream->Read(&req)) {
      v1::KeepAliveResponse resp;
      resp.set_session_id(req.session_id());
      resp.set_sequence(req.sequence());
      resp.set_ttl_ms(30'000);
      stream->Write(resp);
    }
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext*, const v1::CloseSessionRequest*,
                     v1::CloseSessionResponse*) override {
    return close.Next();
  }
};

class FakeLocks final : public v1::Lock::Service {
 public:
  Script acquire, release;
  std::mutex mu;
  std::vector<int64_t> released_tokens;  // guarded by mu

 private:
  grpc::Status Acquire(grpc::ServerContext*, const v1::AcquireRequest* req,
                       v1::AcquireResponse* resp) override {
    grpc::Status s = acquire.Next();
    auto* hold = resp->mutable_hold();
    hold->set_lock_key(req->lock_key());
    hold->set_session_id(req->session_id());
    hold->set_token(kToken);
    return s;
  }
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse*) override {
    {
      std::lock_guard l(mu);
      released_tokens.push_back(req->token());
    }
    return release.Next();
  }
};

// What gRPC reports to a client when an HTTP/2 stream is reset under its call.
grpc::Status ResetStream() {
  return grpc::Status(grpc::StatusCode::INTERNAL, "Received RST_STREAM with error code 2");
}

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&sessions_);
    b.RegisterService(&locks_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port != 0);
    ClientOptions o;
    o.endpoints = {"127.0.0.1:" + std::to_string(port)};
    o.rpc_timeout = std::chrono::seconds(5);
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto s = client_->OpenSession("default");
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    server_->Shutdown();
  }

  FakeSessions sessions_;
  FakeLocks locks_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(RetryTest, AnAcquireWhoseStreamWasResetIsAskedAgain) {
  locks_.acquire.Push(ResetStream());
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_EQ(hold->token(), kToken);
  EXPECT_EQ(locks_.acquire.calls(), 2);
}

TEST_F(RetryTest, AReleaseWhoseStreamWasResetIsAskedAgainWithTheSameToken) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  locks_.release.Push(ResetStream());
  locks_.release.Push(grpc::Status(grpc::StatusCode::UNKNOWN, "Stream removed"));
  EXPECT_TRUE(hold->Release().ok());
  EXPECT_EQ(locks_.release.calls(), 3);
  std::lock_guard l(locks_.mu);
  EXPECT_EQ(locks_.released_tokens, (std::vector<int64_t>{kToken, kToken, kToken}));
}

TEST_F(RetryTest, NotCurrentAfterAnUnknownOutcomeMeansTheReleaseWent) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  locks_.release.Push(ResetStream());
  locks_.release.Push(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "token is not the current hold"));
  EXPECT_TRUE(hold->Release().ok());
  EXPECT_EQ(locks_.release.calls(), 2);
  EXPECT_TRUE(hold->lost());  // released: every handle says it ended
}

TEST_F(RetryTest, ARefusalIsNotAskedAgain) {
  locks_.acquire.Push(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lock key \"\" is empty"));
  auto hold = session_->Acquire("jobs/a");
  ASSERT_FALSE(hold.ok());
  EXPECT_EQ(hold.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hold.status().message(), "lock key \"\" is empty");
  EXPECT_EQ(locks_.acquire.calls(), 1);
  // And a stale token on release, with no unknown outcome before it, is final.
  auto held = session_->Acquire("jobs/b");
  ASSERT_TRUE(held.ok()) << held.status();
  locks_.release.Push(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "token is not the current hold"));
  absl::Status r = held->Release();
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(locks_.release.calls(), 1);
}

// CloseSession is idempotent: a close whose outcome is unknown is asked again,
// as a release is, rather than left to the lease's TTL.
TEST_F(RetryTest, ACloseWhoseStreamWasResetIsAskedAgain) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  sessions_.close.Push(ResetStream());
  sessions_.close.Push(grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcd unreachable"));
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 3);
  EXPECT_TRUE(hold->lost());  // closing ended it
  // Answered: nothing is sent again.
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 3);
}

// A close that failed (here over the namespace's op_rate_quota, which the
// library leaves to the caller) is sent again by a Close called again, not
// reported OK with the lease still there.
TEST_F(RetryTest, ACloseCalledAgainAfterAFailedOneSendsItAgain) {
  sessions_.close.Push(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "retry after 40 ms"));
  absl::Status first = session_->Close();
  EXPECT_EQ(first.code(), absl::StatusCode::kResourceExhausted) << first;
  EXPECT_EQ(sessions_.close.calls(), 1);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 2);
  // Destroying the session sends nothing more.
  session_.reset();
  EXPECT_EQ(sessions_.close.calls(), 2);
}

// ~Session does not send again a close that failed: a Close(timeout) on the way
// out is not followed by a wait of the whole rpc timeout.
TEST_F(RetryTest, DestroyingASessionWhoseCloseFailedSendsNothingMore) {
  sessions_.close.Push(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not yours"));
  EXPECT_EQ(session_->Close(std::chrono::milliseconds(500)).code(),
            absl::StatusCode::kPermissionDenied);
  session_.reset();
  EXPECT_EQ(sessions_.close.calls(), 1);
}

}  // namespace
}  // namespace holdfast
