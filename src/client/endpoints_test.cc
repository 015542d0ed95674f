// Which of its endpoints a Client calls: two stand-ins for holdfastd in this
// process count the sessions opened on each. No etcd is involved: what is
// tested is the client's choice of replica.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "holdfast/client.h"
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast {
namespace {

class CountingSessions final : public v1::Session::Service {
 public:
  int opened() const { return opened_.load(); }

 private:
  grpc::Status Open(grpc::ServerContext*, const v1::OpenSessionRequest*,
                    v1::OpenSessionResponse* resp) override {
    resp->set_session_id(++opened_);
    resp->set_ttl_ms(30'000);
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest>* stream) override {
    v1::KeepAliveRequest req;
    while (stream->Read(&req)) {
    }
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext*, const v1::CloseSessionRequest*,
                     v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }

  std::atomic<int> opened_{0};
};

// One stand-in replica on a port of its own.
struct Replica {
  CountingSessions sessions;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;

  void Start() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&sessions);
    server = b.BuildAndStart();
    ASSERT_TRUE(server != nullptr && port != 0);
    endpoint = "127.0.0.1:" + std::to_string(port);
  }
};

class EndpointOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_.Start();
    b_.Start();
  }
  void TearDown() override {
    a_.server->Shutdown();
    b_.server->Shutdown();
  }

  // Connects `n` Clients given the same list {a, b}, each opening one session.
  void OpenFrom(int n, EndpointOrder order) {
    for (int i = 0; i < n; ++i) {
      ClientOptions o;
      o.endpoints = {a_.endpoint, b_.endpoint};
      o.endpoint_order = order;
      o.rpc_timeout = std::chrono::seconds(5);
      auto c = Client::Connect(o);
      ASSERT_TRUE(c.ok()) << c.status();
      auto s = (*c)->OpenSession("default");
      ASSERT_TRUE(s.ok()) << s.status();
      (void)(*s)->Close();
    }
  }

  Replica a_, b_;
};

TEST_F(EndpointOrderTest, ClientsGivenTheSameListSpreadOverItsReplicas) {
  // Each Client draws its own order: 32 all on one replica would happen once in
  // 2^31 runs.
  OpenFrom(32, EndpointOrder::kShuffled);
  EXPECT_EQ(a_.sessions.opened() + b_.sessions.opened(), 32);
  EXPECT_GT(a_.sessions.opened(), 0);
  EXPECT_GT(b_.sessions.opened(), 0);
}

TEST_F(EndpointOrderTest, AsListedEveryClientCallsTheFirstThatAnswers) {
  OpenFrom(16, EndpointOrder::kAsListed);
  EXPECT_EQ(a_.sessions.opened(), 16);
  EXPECT_EQ(b_.sessions.opened(), 0);

  // With the first gone, the next one listed.
  a_.server->Shutdown();
  OpenFrom(4, EndpointOrder::kAsListed);
  EXPECT_EQ(b_.sessions.opened(), 4);
}

}  // namespace
}  // namespace holdfast
