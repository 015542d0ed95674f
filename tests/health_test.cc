// grpc.health.v1 as holdfastd serves it (src/server/health_service.h), against a
// real etcd and holdfastd: what a load balancer or a Kubernetes probe sees.
#include <signal.h>

#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "harness/cluster.h"

namespace holdfast {
namespace {

using std::chrono::seconds;
namespace hv1 = grpc::health::v1;
using Status = hv1::HealthCheckResponse::ServingStatus;

std::unique_ptr<hv1::Health::Stub> HealthStub(const std::string& endpoint) {
  return hv1::Health::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
}

grpc::Status Check(hv1::Health::Stub& stub, const std::string& service, Status* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  hv1::HealthCheckRequest req;
  req.set_service(service);
  hv1::HealthCheckResponse resp;
  grpc::Status s = stub.Check(&ctx, req, &resp);
  *out = resp.status();
  return s;
}

// One Watch call; Next() is the next status sent (false: the stream ended).
class Watcher {
 public:
  Watcher(hv1::Health::Stub& stub, const std::string& service) {
    ctx_.set_deadline(std::chrono::system_clock::now() + seconds(60));
    hv1::HealthCheckRequest req;
    req.set_service(service);
    reader_ = stub.Watch(&ctx_, req);
  }
  bool Next(Status* out) {
    hv1::HealthCheckResponse resp;
    if (!reader_->Read(&resp)) return false;
    *out = resp.status();
    return true;
  }
  grpc::Status Finish() { return reader_->Finish(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<hv1::HealthCheckResponse>> reader_;
};

TEST(HealthTest, CheckKnowsHoldfastdAndItsServicesAndRefusesOtherNames) {
  auto c = testing::TestCluster::Start();
  ASSERT_TRUE(c.ok()) << c.status();
  auto stub = HealthStub((*c)->endpoint());
  for (const char* service : {"", "holdfast.v1.Session", "holdfast.v1.Lock", "holdfast.v1.Admin"}) {
    Status status = hv1::HealthCheckResponse::UNKNOWN;
    grpc::Status s = Check(*stub, service, &status);
    ASSERT_TRUE(s.ok()) << service << ": " << s.error_message();
    EXPECT_EQ(status, hv1::HealthCheckResponse::SERVING) << service;
  }
  Status status;
  grpc::Status s = Check(*stub, "holdfast.v1.Nope", &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "unknown service \"holdfast.v1.Nope\"");
  // The refusal changed nothing: the services known still answer.
  ASSERT_TRUE(Check(*stub, "holdfast.v1.Lock", &status).ok());
  EXPECT_EQ(status, hv1::HealthCheckResponse::SERVING);
}

TEST(HealthTest, WatchFollowsEtcdsQuorumAndEndsWhenHoldfastdStops) {
  auto c = testing::TestCluster::Start();
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  auto stub = HealthStub(cluster.endpoint());
  Watcher lock(*stub, "holdfast.v1.Lock");
  Watcher unknown(*stub, "holdfast.v1.Nope");
  Status status;
  ASSERT_TRUE(lock.Next(&status));
  EXPECT_EQ(status, hv1::HealthCheckResponse::SERVING);
  ASSERT_TRUE(unknown.Next(&status));
  EXPECT_EQ(status, hv1::HealthCheckResponse::SERVICE_UNKNOWN);

  // etcd stops answering: holdfastd's probe sees it, and the Lock service is
  // NOT_SERVING until it answers again.
  cluster.etcd().process()->Signal(SIGSTOP);
  ASSERT_TRUE(lock.Next(&status));
  EXPECT_EQ(status, hv1::HealthCheckResponse::NOT_SERVING);
  cluster.etcd().process()->Signal(SIGCONT);
  ASSERT_TRUE(lock.Next(&status));
  EXPECT_EQ(status, hv1::HealthCheckResponse::SERVING);

  // A clean stop says NOT_SERVING, then ends the stream.
  cluster.holdfastd().Stop();
  ASSERT_TRUE(lock.Next(&status));
  EXPECT_EQ(status, hv1::HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(lock.Next(&status));
  grpc::Status end = lock.Finish();
  EXPECT_TRUE(end.ok()) << end.error_code() << " " << end.error_message();
}

}  // namespace
}  // namespace holdfast
