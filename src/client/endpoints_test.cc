// Which of its endpoints a Client calls: two stand-ins for holdfastd in this
// process count the sessions opened on each. No etcd is involved: what is
// tested is the client's choice of replica.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdlib.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <functional>
#include <limits>
#include <thread>
#include <type_traits>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "grpc/health/v1/health.grpc.pb.h"
#include "dev/certs.h"
#include "holdfast/client.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast {
namespace {

// What holdfastd answers a call that it is stopping to serve.
grpc::Status Stopping(grpc::ServerContext* ctx) {
  ctx->AddTrailingMetadata("holdfast-stopping", "1");
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this holdfastd is stopping");
}

// Sessions of `ttl_ms` (ids from `first_id` on). Renewals are answered unless
// `silent_renewals` is set.
class CountingSessions final : public v1::Session::Service {
 public:
  int opened() const { return opened_.load(); }
  int keepalive_streams() const { return keepalive_streams_.load(); }
  int renewals_answered() const { return renewals_answered_.load(); }
  std::atomic<int64_t> ttl_ms{30'000};
  std::atomic<int64_t> first_id{1};
  std::atomic<bool> silent_renewals{false};
  // As holdfastd stopping: every stream ends UNAVAILABLE with the
  // holdfast-stopping trailer (at its next renewal, or at once when it arrives).
  std::atomic<bool> stopping{false};
  std::atomic<int> closes{0};

 private:
  grpc::Status Open(grpc::ServerContext*, const v1::OpenSessionRequest*,
                    v1::OpenSessionResponse* resp) override {
    resp->set_session_id(first_id.load() + opened_++);
    resp->set_ttl_ms(ttl_ms.load());
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest>* stream) override {
    ++keepalive_streams_;
    v1::KeepAliveRequest req;
    while (!stopping.load() && stream->Read(&req)) {
      if (stopping.load()) break;
      if (silent_renewals.load()) continue;
      v1::KeepAliveResponse resp;
      resp.set_session_id(req.session_id());
      resp.set_sequence(req.sequence());
      resp.set_ttl_ms(ttl_ms.load());
      if (!stream->Write(resp)) break;
      ++renewals_answered_;
    }
    if (stopping.load()) return Stopping(ctx);
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext* ctx, const v1::CloseSessionRequest*,
                     v1::CloseSessionResponse*) override {
    ++closes;
    if (stopping.load()) return Stopping(ctx);
    return grpc::Status::OK;
  }

  std::atomic<int> opened_{0};
  std::atomic<int> keepalive_streams_{0};
  std::atomic<int> renewals_answered_{0};
};

// Acquire grants every key with token `token`, or, `stopping`, answers as a
// stopping holdfastd; Release lets go.
class StandInLock final : public v1::Lock::Service {
 public:
  std::atomic<int> acquires{0};
  std::atomic<int64_t> token{1};
  std::atomic<bool> stopping{false};

 private:
  grpc::Status Acquire(grpc::ServerContext* ctx, const v1::AcquireRequest* req,
                       v1::AcquireResponse* resp) override {
    ++acquires;
    if (stopping.load()) return Stopping(ctx);
    resp->mutable_hold()->set_lock_key(req->lock_key());
    resp->mutable_hold()->set_token(token.load());
    return grpc::Status::OK;
  }
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest*,
                       v1::ReleaseResponse*) override {
    return grpc::Status::OK;
  }
};

// grpc.health.v1 as holdfastd answers it, or, `silent`, not at all (a paused
// replica): the check waits until the caller gives up.
class StandInHealth final : public grpc::health::v1::Health::Service {
 public:
  std::atomic<bool> silent{false};
  std::atomic<int> checks{0};

 private:
  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* resp) override {
    ++checks;
    while (silent.load() && !ctx->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    resp->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

// One stand-in replica on a port of its own.
struct Replica {
  CountingSessions sessions;
  StandInLock lock;
  StandInHealth health;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;

  void Start() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&sessions);
    b.RegisterService(&lock);
    b.RegisterService(&health);
    server = b.BuildAndStart();
    ASSERT_TRUE(server != nullptr && port != 0);
    port_ = port;
    endpoint = "127.0.0.1:" + std::to_string(port);
  }
  // The same replica by a host name.
  std::string by_name() const { return "localhost:" + std::to_string(port_); }
  // Gone: calls in progress end (a stream is cut after 100 ms), new ones are refused.
  void Stop() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }

 private:
  int port_ = 0;
};

// A replica that takes connections and never answers them: the kernel accepts
// them into a listening socket that nothing reads, so a client's handshake
// waits, as with a host that drops packets or a replica too busy to answer.
struct HungReplica {
  int fd = -1;
  std::string endpoint;

  void Start() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd, 64), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  ~HungReplica() {
    if (fd >= 0) close(fd);
  }
};

class EndpointOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_.Start();
    b_.Start();
  }
  void TearDown() override {
    a_.Stop();
    b_.Stop();
  }

  // A Client of `endpoints`, tried in the order given.
  static std::unique_ptr<Client> ConnectAsListed(std::vector<std::string> endpoints) {
    ClientOptions o;
    o.endpoints = std::move(endpoints);
    o.endpoint_order = EndpointOrder::kAsListed;
    // Longer than the one-second grace, shorter than gRPC's own connect timeout
    // (20 s): a call given a replica that never answers succeeds only if the
    // client asks the next endpoint while that one's handshake still waits.
    o.rpc_timeout = std::chrono::seconds(5);
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Connects `n` Clients given the same list {a, b}, each opening one session.
  void OpenFrom(int n, EndpointOrder order, bool by_name = false) {
    for (int i = 0; i < n; ++i) {
      ClientOptions o;
      o.endpoints = {a_.endpoint, b_.endpoint};
      if (by_name) o.endpoints = {a_.by_name(), b_.by_name()};
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
  a_.Stop();
  OpenFrom(4, EndpointOrder::kAsListed);
  EXPECT_EQ(b_.sessions.opened(), 4);
}

TEST_F(EndpointOrderTest, HostNamesSpreadAndFailOverLikeAddresses) {
  OpenFrom(32, EndpointOrder::kShuffled, /*by_name=*/true);
  EXPECT_EQ(a_.sessions.opened() + b_.sessions.opened(), 32);
  EXPECT_GT(a_.sessions.opened(), 0);
  EXPECT_GT(b_.sessions.opened(), 0);

  const int on_a = a_.sessions.opened(), on_b = b_.sessions.opened();
  OpenFrom(4, EndpointOrder::kAsListed, /*by_name=*/true);
  EXPECT_EQ(a_.sessions.opened(), on_a + 4);
  a_.Stop();
  OpenFrom(4, EndpointOrder::kAsListed, /*by_name=*/true);
  EXPECT_EQ(b_.sessions.opened(), on_b + 4);
}

TEST_F(EndpointOrderTest, AClientWhoseReplicaGoesMovesItsCallsAndRenewalsOn) {
  auto c = ConnectAsListed({a_.by_name(), b_.by_name()});
  ASSERT_NE(c, nullptr);
  auto first = c->OpenSession("default");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(a_.sessions.opened(), 1);
  // The session's renewals went to a stream on the same replica.
  for (int i = 0; i < 500 && a_.sessions.keepalive_streams() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(a_.sessions.keepalive_streams(), 1);
  EXPECT_EQ(b_.sessions.keepalive_streams(), 0);

  a_.Stop();
  auto second = c->OpenSession("default");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(b_.sessions.opened(), 1);
  EXPECT_EQ(a_.sessions.opened(), 1);
  for (int i = 0; i < 500 && b_.sessions.keepalive_streams() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(b_.sessions.keepalive_streams(), 1);
  (void)(*first)->Close();
  (void)(*second)->Close();
}

TEST_F(EndpointOrderTest, AReplicaThatNeverAnswersCostsACallItsGraceNotItsDeadline) {
  HungReplica hung;
  hung.Start();
  auto c = ConnectAsListed({hung.endpoint, a_.endpoint});
  ASSERT_NE(c, nullptr);
  auto s = c->OpenSession("default");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(a_.sessions.opened(), 1);
  (void)(*s)->Close();
}

TEST_F(EndpointOrderTest, NoReplicaAnsweringEndsTheCallAtItsDeadlineAsUnreachable) {
  HungReplica hung;
  hung.Start();
  a_.Stop();
  b_.Stop();
  ClientOptions o;
  o.endpoints = {hung.endpoint, a_.endpoint, b_.by_name()};
  o.rpc_timeout = std::chrono::milliseconds(2500);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto s = (*c)->OpenSession("default");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded) << s.status();
  EXPECT_TRUE(Unreachable(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("no connection to holdfastd at"), std::string::npos)
      << s.status();
}

TEST(EndpointListTest, AnEmptyListOrAMalformedEndpointIsRefusedBeforeAnyCall) {
  ClientOptions o;
  o.endpoints = {};
  auto none = Client::Connect(o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(), "no holdfastd endpoint given");
  for (const std::string& bad : std::vector<std::string>{"", "127.0.0.1:7420 ", "a:1,b:2",
                                                         std::string("x\0:1", 4)}) {
    o.endpoints = {"127.0.0.1:7420", bad};
    auto c = Client::Connect(o);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("is not host:port"), std::string::npos) << c.status();
  }
  o.endpoints = {"127.0.0.1:7420", " "};
  EXPECT_EQ(Client::Connect(o).status().message(),
            "holdfastd endpoint \" \" is not host:port (an empty one, or spaces, commas or "
            "control characters in it)");
}

// Without a CA bundle, only loopback endpoints: holdfastd serves plaintext only
// there, so whatever answers plaintext elsewhere is not it.
// Options that would make every call fail, or the client misbehave, are refused
// where they are given, before anything is sent.
TEST(EndpointListTest, NonsenseOptionsAreRefusedBeforeAnyCall) {
  static_assert(!std::is_copy_constructible_v<Client> && !std::is_copy_assignable_v<Client>,
                "a copy of a Client would stop the other's renewals when destroyed");
  static_assert(!std::is_copy_constructible_v<Session> && !std::is_move_constructible_v<Session>,
                "a copy of a Session would close it when destroyed");
  ClientOptions o;
  o.endpoints = {"127.0.0.1:1"};  // nothing listens: a call would wait its rpc timeout
  for (auto bad : {std::chrono::milliseconds(0), std::chrono::milliseconds(-1),
                   std::chrono::milliseconds(std::chrono::hours(25))}) {
    o.rpc_timeout = bad;
    EXPECT_EQ(Client::Connect(o).status().message(),
              absl::StrCat("rpc_timeout ", bad.count(), "ms is outside (0, 24h]"));
  }
  o.rpc_timeout = std::chrono::seconds(10);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const auto started = std::chrono::steady_clock::now();
  for (double margin : {-0.1, 0.9, std::numeric_limits<double>::quiet_NaN()}) {
    auto s = (*client)->OpenSession("default", {.safety_margin = margin});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << margin;
    EXPECT_NE(s.status().message().find("is outside [0, 0.5]"), std::string::npos)
        << s.status();
  }
  const std::string not_utf8 = "jobs/\xff";
  EXPECT_EQ((*client)->Describe("default", not_utf8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->CheckToken("default", not_utf8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->CheckToken("Default", "jobs/a", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // All refused here: none waited for the endpoint where nothing listens.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

TEST(EndpointListTest, PlaintextGoesOnlyToLoopbackUnlessAllowed) {
  ClientOptions o;
  for (const std::string& remote :
       {"10.0.0.5:7420", "holdfast.example.org:7420", "127.example.org:7420"}) {
    o.endpoints = {"127.0.0.1:7420", remote};
    auto c = Client::Connect(o);
    ASSERT_FALSE(c.ok()) << remote;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(absl::StrCat(
                  "holdfastd endpoint ", remote,
                  " is not a loopback address and no CA bundle is given")),
              std::string::npos)
        << c.status();
  }
  o.allow_plaintext = true;
  EXPECT_TRUE(Client::Connect(o).ok());
  o.allow_plaintext = false;
  o.endpoints = {"127.0.0.1:1", "127.3.2.1:1", "localhost:1", "[::1]:1", "dns:///localhost:1"};
  EXPECT_TRUE(Client::Connect(o).ok()) << Client::Connect(o).status();
}

// The mTLS files are read at Connect: one that is there must be what it is named
// for, and files that are all there must be usable together (refused with the
// field, the path and the reason, not left to gRPC's watcher to log while every
// call fails as if holdfastd were unreachable); one not there yet is waited for,
// as an SVID agent may write it after the start.
TEST(EndpointListTest, MtlsFilesThatCannotBeUsedAreRefusedAtConnect) {
  std::string dir = ::testing::TempDir() + "/hf-client-pem-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto ca = dev::MakeCa("client-pem-test");
  ASSERT_TRUE(ca.ok()) << ca.status();
  dev::LeafOptions leaf;
  leaf.uris = {"spiffe://test.holdfast/client"};
  auto svid = dev::MakeLeaf(*ca, leaf), other = dev::MakeLeaf(*ca, leaf);
  ASSERT_TRUE(svid.ok() && other.ok());
  ASSERT_TRUE(dev::WritePem(dir, "ca", *ca).ok());
  ASSERT_TRUE(dev::WritePem(dir, "svid", *svid).ok());
  const std::string bundle = dir + "/ca.pem", cert = dir + "/svid.pem",
                    key = dir + "/svid_key.pem";
  ClientOptions o;
  o.endpoints = {"127.0.0.1:7420"};
  o.ca_file = bundle;
  o.cert_file = cert;
  o.key_file = key;
  EXPECT_TRUE(Client::Connect(o).ok()) << Client::Connect(o).status();
  o.key_file = cert;  // swapped with the certificate
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "key_file " + cert + " holds no PEM private key (no \"-----BEGIN PRIVATE KEY-----\" line)");
  o.key_file = key;
  o.ca_file = dir;
  EXPECT_EQ(Client::Connect(o).status().message(), "ca_file " + dir + " is a directory");
  o.ca_file = dir + "/bundle.pem";  // not written yet
  EXPECT_TRUE(Client::Connect(o).ok()) << Client::Connect(o).status();
  o.ca_file = bundle;
  o.key_file = "";
  EXPECT_EQ(Client::Connect(o).status().message(), "cert_file and key_file go together");
  o.key_file = key;
  o.ca_file = "";
  EXPECT_NE(Client::Connect(o).status().message().find("cert_file and key_file need ca_file"),
            std::string::npos);
  o.ca_file = bundle;

  // All there, and not usable together: a certificate renewed without its key,
  // a CA bundle cut off mid-write, a certificate block that is not one.
  const std::string renewed = dir + "/renewed.pem";
  std::ofstream(renewed) << other->cert;
  o.cert_file = renewed;
  EXPECT_EQ(Client::Connect(o).status().message(),
            "cert_file and key_file do not belong together: " + key +
                " is not the key of the certificate in " + renewed +
                " (a certificate renewed without its key, or the other way round?)");
  o.cert_file = cert;
  const std::string cut = dir + "/cut.pem";
  std::ofstream(cut) << (ca->cert + other->cert).substr(0, ca->cert.size() + 100);
  o.ca_file = cut;
  EXPECT_EQ(Client::Connect(o).status().message(),
            "ca_file " + cut +
                " holds no PEM certificate, or a block that is not a whole certificate");
  const std::string fake = dir + "/fake.pem";
  std::ofstream(fake) << "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  o.ca_file = bundle;
  o.cert_file = fake;
  EXPECT_EQ(Client::Connect(o).status().message().rfind(
                "cert_file " + fake + ": its first certificate cannot be read: ", 0),
            0u)
      << Client::Connect(o).status();
  o.cert_file = o.key_file = "";  // the server checked, no client certificate
  EXPECT_TRUE(Client::Connect(o).ok()) << Client::Connect(o).status();
  std::filesystem::remove_all(dir);
}

// A replica that stops answering, its connection still up (paused, say): the
// renewals of a Client of several endpoints go on through another replica before
// the session's local deadline. One that still answers a health check is left.
class SilentReplicaTest : public EndpointOrderTest {
 protected:
  void SetUp() override {
    EndpointOrderTest::SetUp();
    // TTL 3 s: renewals every second, a local deadline 2.7 s after the last one
    // confirmed, a renewal unanswered for 500 ms checked with a 300 ms health check.
    for (auto* r : {&a_, &b_}) r->sessions.ttl_ms = 3000;
    b_.sessions.first_id = 1000;  // the same ids on both would hide which one answers
    client_ = ConnectAsListed({a_.endpoint, b_.endpoint});
    ASSERT_NE(client_, nullptr);
    auto s = client_->OpenSession("default", {.ttl = std::chrono::seconds(3)});
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    // Renewed through the first replica.
    WaitFor([&] { return a_.sessions.renewals_answered() >= 1; });
    ASSERT_GE(a_.sessions.renewals_answered(), 1);
  }
  void TearDown() override {
    a_.health.silent = false;  // let a waiting check end
    if (session_) (void)session_->Close(std::chrono::milliseconds(200));
    session_.reset();
    client_.reset();
    EndpointOrderTest::TearDown();
  }
  static void WaitFor(const std::function<bool()>& done,
                      std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(SilentReplicaTest, RenewalsMoveOffAReplicaThatStopsAnswering) {
  a_.sessions.silent_renewals = true;
  a_.health.silent = true;
  WaitFor([&] { return b_.sessions.renewals_answered() >= 3; });
  EXPECT_GE(b_.sessions.renewals_answered(), 3);
  EXPECT_EQ(b_.sessions.keepalive_streams(), 1);
  EXPECT_GE(a_.health.checks.load(), 1);
  EXPECT_FALSE(session_->lost()) << session_->lost_reason();
  // And the Client's calls go there too from now on.
  auto other = client_->OpenSession("default");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(b_.sessions.opened(), 1);
  EXPECT_EQ(a_.sessions.opened(), 1);
  (void)(*other)->Close();
}

TEST_F(SilentReplicaTest, AReplicaThatAnswersItsCheckKeepsTheRenewals) {
  // Renewals wait (for etcd, say) but the replica answers: no reason to move.
  a_.sessions.silent_renewals = true;
  WaitFor([&] { return a_.health.checks.load() >= 1; });
  EXPECT_GE(a_.health.checks.load(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(b_.sessions.keepalive_streams(), 0);
  EXPECT_EQ(a_.sessions.keepalive_streams(), 1);
}

// A replica that is stopping says so (UNAVAILABLE, holdfast-stopping) while its
// connection is still up: the Client goes to its next endpoint at once, for the
// renewals and for the call, rather than asking the stopping one again.
TEST_F(SilentReplicaTest, RenewalsLeaveAReplicaThatSaysItIsStopping) {
  a_.sessions.stopping = true;
  WaitFor([&] { return b_.sessions.renewals_answered() >= 1; });
  EXPECT_GE(b_.sessions.renewals_answered(), 1);
  EXPECT_EQ(b_.sessions.keepalive_streams(), 1);
  EXPECT_EQ(a_.sessions.keepalive_streams(), 1);  // not asked again
  EXPECT_FALSE(session_->lost()) << session_->lost_reason();
}

TEST_F(SilentReplicaTest, AnAcquireAnsweredByAStoppingReplicaIsAskedAgainOnTheNext) {
  a_.lock.stopping = true;
  b_.lock.token = 7;
  auto hold = session_->Acquire("k", {.wait = std::chrono::seconds(5)});
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_EQ(hold->token(), 7);  // granted by b
  EXPECT_EQ(a_.lock.acquires.load(), 1);
  EXPECT_EQ(b_.lock.acquires.load(), 1);
}

TEST_F(SilentReplicaTest, ACloseAnsweredByAStoppingReplicaIsAskedAgainOnTheNext) {
  a_.sessions.stopping = true;
  absl::Status closed = session_->Close();
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_EQ(a_.sessions.closes.load(), 1);
  EXPECT_EQ(b_.sessions.closes.load(), 1);
}

}  // namespace
}  // namespace holdfast
