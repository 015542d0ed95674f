// The metrics endpoint on loopback, plain and over TLS with client certificates
// made by a test CA: what each request is answered, who may read, that a silent
// client holds a worker only until its deadline, and that rotated files are used.
#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dev/certs.h"
#include "dev/http_get.h"
#include "dev/temp_dir.h"

namespace holdfast::server {
namespace {

using std::chrono::milliseconds;

constexpr char kBody[] = "# TYPE holdfast_test counter\nholdfast_test 7\n";

// A connected socket that sends nothing, from `source` (any 127.0.0.0/8
// address is this host's loopback).
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  EXPECT_EQ(inet_pton(AF_INET, source, &from.sin_addr), 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0) << strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval bound{20, 0};  // a bound on a hung server, not a synchronisation
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  return fd;
}

// What the server sent before it closed (empty: closed without a word; an error
// reads as "<error>").
std::string ReadToClose(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return out;
    if (n < 0) return "<error>";
    out.append(buf, static_cast<size_t>(n));
  }
}

class PlainEndpointTest : public ::testing::Test {
 protected:
  void Start(MetricsEndpoint::Options o = {}) {
    o.listen = "127.0.0.1:0";
    o.render = [this] {
      ++renders_;
      return std::string(kBody);
    };
    o.on_connection = [this](const char* outcome) {
      std::lock_guard l(outcomes_mu_);
      ++outcomes_[outcome];
    };
    auto e = MetricsEndpoint::Start(std::move(o));
    ASSERT_TRUE(e.ok()) << e.status();
    endpoint_ = std::move(*e);
    ASSERT_GT(endpoint_->port(), 0);
  }
  absl::StatusOr<dev::HttpAnswer> Send(const std::string& request) {
    return dev::HttpExchange(endpoint_->port(), request);
  }

  // How many connections ended with `outcome`, once at least `at_least` have
  // (each is counted just after its connection closes), or after 10 s.
  int Outcomes(const std::string& outcome, int at_least = 0) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard l(outcomes_mu_);
        if (outcomes_[outcome] >= at_least) return outcomes_[outcome];
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    std::lock_guard l(outcomes_mu_);
    return outcomes_[outcome];
  }

  std::atomic<int> renders_{0};
  std::unique_ptr<MetricsEndpoint> endpoint_;
  std::mutex outcomes_mu_;
  std::map<std::string, int> outcomes_;
};

TEST_F(PlainEndpointTest, AnswersGetAndHeadOfMetricsAndRefusesEverythingElse) {
  Start();
  auto get = dev::HttpGet(endpoint_->port(), "/metrics");
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(get->code, 200) << get->status_line;
  EXPECT_EQ(get->body, kBody);
  EXPECT_TRUE(absl::StrContains(get->headers, "Content-Type: text/plain; version=0.0.4"))
      << get->headers;
  EXPECT_TRUE(absl::StrContains(get->headers, absl::StrCat("Content-Length: ", strlen(kBody))));
  EXPECT_TRUE(absl::StrContains(get->headers, "Connection: close"));
  EXPECT_EQ(renders_.load(), 1);

  // What Prometheus sends, with a query string.
  auto prom = Send(
      "GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: Prometheus/2.45\r\nAccept: "
      "text/plain;version=0.0.4\r\nAccept-Encoding: gzip\r\n"
      "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n");
  ASSERT_TRUE(prom.ok()) << prom.status();
  EXPECT_EQ(prom->code, 200);
  EXPECT_EQ(prom->body, kBody);

  auto head = Send("HEAD /metrics HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->code, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_TRUE(absl::StrContains(head->headers, absl::StrCat("Content-Length: ", strlen(kBody))));

  // Lines ended by a bare LF, as RFC 9112 lets a server accept.
  auto lf = Send("GET /metrics HTTP/1.0\nHost: h\n\n");
  ASSERT_TRUE(lf.ok()) << lf.status();
  EXPECT_EQ(lf->code, 200);
  EXPECT_EQ(lf->body, kBody);
  EXPECT_EQ(renders_.load(), 4);

  struct Case {
    std::string request;
    int code;
    std::string body;
  };
  const Case refused[] = {
      {"GET / HTTP/1.1\r\n\r\n", 404, "only /metrics is served here\n"},
      {"GET /metrics/x HTTP/1.1\r\n\r\n", 404, "only /metrics is served here\n"},
      {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "GET or HEAD only\n"},
      {"GET /metrics\r\n\r\n", 400, "not an HTTP/1.x request line\n"},
      {"GET metrics HTTP/1.1\r\n\r\n", 400, "not an HTTP/1.x request line\n"},
      {"\x16\x03\x01 hello\r\n\r\n", 400, "not an HTTP/1.x request line\n"},
      {absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(9000, 'a'), "\r\n\r\n"), 431,
       "request head over 8 KiB\n"},
      {absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(60'000, 'a'), "\r\n\r\n"),
       431, "request head over 8 KiB\n"},
      {absl::StrCat("POST /metrics HTTP/1.1\r\nContent-Length: 50000\r\n\r\n",
                    std::string(50'000, 'b')),
       405, "GET or HEAD only\n"},
  };
  for (const Case& c : refused) {
    auto a = Send(c.request);
    ASSERT_TRUE(a.ok()) << a.status() << " for " << c.request.substr(0, 40);
    EXPECT_EQ(a->code, c.code) << c.request.substr(0, 40);
    EXPECT_EQ(a->body, c.body) << c.request.substr(0, 40);
    if (c.code == 405) {
      EXPECT_TRUE(absl::StrContains(a->headers, "Allow: GET, HEAD"));
    }
  }
  EXPECT_EQ(renders_.load(), 4) << "a refused request renders nothing";

  // What holdfast-bench scrapes etcd with: an IPv4 host:port, or localhost.
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    auto by_host = dev::HttpGet(absl::StrCat(host, ":", endpoint_->port()), "/metrics");
    ASSERT_TRUE(by_host.ok()) << by_host.status();
    EXPECT_EQ(by_host->body, kBody);
  }
  for (const std::string bad : {"example.org:80", "127.0.0.1", "127.0.0.1:x", "[::1]:80"}) {
    auto refused = dev::HttpGet(bad, "/metrics");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().message(), "not an IPv4 host:port: " + bad);
  }
  EXPECT_EQ(renders_.load(), 6);
}

// Whether the server has closed `fd` (its FIN has arrived), without waiting.
bool ClosedByServer(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A client that connects and says nothing takes no worker: a scrape is answered
// by the only one while it waits, and it is closed at its deadline.
TEST_F(PlainEndpointTest, ASilentClientTakesNoWorkerAndIsClosedAtItsDeadline) {
  MetricsEndpoint::Options o;
  o.workers = 1;
  o.io_deadline = milliseconds(2000);
  Start(o);
  const auto start = std::chrono::steady_clock::now();
  const int silent = Connect(endpoint_->port());
  auto a = dev::HttpGet(endpoint_->port(), "/metrics");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, 200);
  EXPECT_FALSE(ClosedByServer(silent)) << "the scrape waited for the silent client's deadline";
  EXPECT_EQ(ReadToClose(silent), "") << "closed without an answer";
  // Not before its deadline (a slow machine only makes this longer).
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(2000));
  close(silent);
  EXPECT_EQ(Outcomes("silent", 1), 1);
  EXPECT_EQ(Outcomes("scraped", 1), 1);
}

// Each connection is counted once by how it ended
// (holdfast_metrics_connections_total).
TEST_F(PlainEndpointTest, EachConnectionIsCountedByHowItEnded) {
  Start();
  auto bad = Send("BOGUS\r\n\r\n");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->code, 400);
  auto missing = dev::HttpGet(endpoint_->port(), "/nothing");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->code, 404);
  const int gone = Connect(endpoint_->port());
  ASSERT_EQ(write(gone, "GET /met", 8), 8);
  close(gone);  // before its request was whole
  EXPECT_EQ(Outcomes("bad_request", 2), 2);
  EXPECT_EQ(Outcomes("no_request", 1), 1);
  EXPECT_EQ(Outcomes("scraped"), 0);
}

// One address opening connections that say nothing, or trickle a request,
// cannot keep a scrape from another address waiting: it holds 8 connections
// (more are closed at once) and one worker at most.
TEST_F(PlainEndpointTest, OneSourceCannotHoldBackAScrapeFromAnother) {
  MetricsEndpoint::Options o;
  o.workers = 2;
  o.io_deadline = std::chrono::seconds(20);
  Start(o);
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) {
    const int fd = Connect(endpoint_->port(), "127.0.0.2");
    // Half of them trickle: a request begun, never ended, waits for a worker.
    if (i % 2 == 1) EXPECT_EQ(write(fd, "GET /met", 8), 8);
    held.push_back(fd);
  }
  auto a = dev::HttpGet(endpoint_->port(), "/metrics");  // from 127.0.0.1
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, 200);
  EXPECT_EQ(a->body, kBody);
  // Accepted in order before the scrape: the first 8 are held, the rest closed.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(ClosedByServer(held[i]), i >= 8) << "connection " << i;
  }
  EXPECT_EQ(Outcomes("refused", 12), 12);
  endpoint_->Stop();
  for (int fd : held) close(fd);
}

TEST_F(PlainEndpointTest, StopEndsTheConnectionsInProgress) {
  MetricsEndpoint::Options o;
  o.io_deadline = std::chrono::minutes(10);
  Start(o);
  // From another address than the scrape's below, which a worker serves
  // alongside it.
  const int silent = Connect(endpoint_->port(), "127.0.0.2");
  // Wait until a worker has it: a partial request keeps it reading.
  ASSERT_EQ(write(silent, "GET /met", 8), 8);
  auto a = dev::HttpGet(endpoint_->port(), "/metrics");  // the other worker
  ASSERT_TRUE(a.ok()) << a.status();
  endpoint_->Stop();  // returns though the silent client's deadline is 10 min away
  EXPECT_EQ(ReadToClose(silent), "");
  close(silent);
  EXPECT_FALSE(dev::HttpGet(endpoint_->port(), "/metrics").ok()) << "no longer listening";
  endpoint_->Stop();  // idempotent
}

// A request with bytes after its head (which nothing reads) and a long answer:
// closing on the unread bytes would make the kernel reset the connection and
// drop the part of the answer still queued. The whole answer arrives.
TEST(MetricsEndpointCloseTest, UnreadBytesAfterTheRequestDoNotCutTheAnswerShort) {
  const std::string big(8 << 20, 'x');
  MetricsEndpoint::Options o;
  o.listen = "127.0.0.1:0";
  o.render = [&big] { return big; };
  auto e = MetricsEndpoint::Start(std::move(o));
  ASSERT_TRUE(e.ok()) << e.status();
  for (int i = 0; i < 3; ++i) {
    auto a = dev::HttpExchange((*e)->port(), absl::StrCat("GET /metrics HTTP/1.1\r\n\r\n",
                                                          std::string(100'000, 'j')));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->code, 200);
    EXPECT_EQ(a->body.size(), big.size());
  }
}

TEST(MetricsEndpointStartTest, APortInUseIsRefused) {
  MetricsEndpoint::Options o;
  o.listen = "127.0.0.1:0";
  o.render = [] { return std::string(); };
  auto first = MetricsEndpoint::Start(o);
  ASSERT_TRUE(first.ok()) << first.status();
  o.listen = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = MetricsEndpoint::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                absl::StrCat("cannot listen on ", o.listen)))
      << second.status();
}

// A test CA, the server's certificate, and clients: a reader, an identity that
// may not read, and one of another CA.
class TlsEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = dev::MakeTempDir("metrics-endpoint-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    auto ca = dev::MakeCa("metrics test CA");
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    auto other_ca = dev::MakeCa("another CA");
    ASSERT_TRUE(other_ca.ok());
    server_ = Leaf(ca_, "spiffe://test.holdfast/holdfastd");
    reader_ = Leaf(ca_, "spiffe://test.holdfast/monitoring/prometheus");
    app_ = Leaf(ca_, "spiffe://test.holdfast/app");
    stranger_ = Leaf(*other_ca, "spiffe://test.holdfast/monitoring/prometheus");
    ASSERT_TRUE(dev::WritePem(dir_, "server", server_).ok());
    ASSERT_TRUE(dev::WriteFileAtomically(dir_ + "/ca.pem", ca_.cert, 0644).ok());
  }
  void TearDown() override {
    endpoint_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static dev::Pem Leaf(const dev::Pem& ca, const std::string& uri) {
    dev::LeafOptions o;
    o.ips = {"127.0.0.1"};
    o.uris = {uri};
    auto leaf = dev::MakeLeaf(ca, o);
    EXPECT_TRUE(leaf.ok()) << leaf.status();
    return leaf.ok() ? *leaf : dev::Pem{};
  }

  MetricsEndpoint::Options Tls(milliseconds refresh = milliseconds(10'000)) {
    MetricsEndpoint::Tls t;
    t.ca_file = dir_ + "/ca.pem";
    t.cert_file = dir_ + "/server.pem";
    t.key_file = dir_ + "/server_key.pem";
    t.refresh = refresh;
    // The reader by its URI SAN; the chain must begin with the leaf.
    t.authorize = [this](const std::string& leaf, const std::string& chain) -> absl::Status {
      ++authorized_;
      auto info = dev::InspectCert(leaf);
      if (!info.ok()) return info.status();
      if (!absl::StartsWith(chain, leaf)) return absl::InternalError("chain without the leaf");
      const std::string id = info->uris.empty() ? "" : info->uris.front();
      if (id == "spiffe://test.holdfast/monitoring/prometheus") return absl::OkStatus();
      return absl::PermissionDeniedError(id + " may not read metrics");
    };
    MetricsEndpoint::Options o;
    o.listen = "127.0.0.1:0";
    o.tls = std::move(t);
    o.render = [this] {
      ++renders_;
      return std::string(kBody);
    };
    return o;
  }

  void Start(MetricsEndpoint::Options o) {
    auto e = MetricsEndpoint::Start(std::move(o));
    ASSERT_TRUE(e.ok()) << e.status();
    endpoint_ = std::move(*e);
  }

  absl::StatusOr<dev::HttpAnswer> GetAs(const dev::Pem* client) {
    dev::HttpsClient c;
    c.ca_pem = ca_.cert;
    if (client != nullptr) {
      c.cert_pem = client->cert;
      c.key_pem = client->key;
    }
    return dev::HttpGet(endpoint_->port(), "/metrics", c);
  }

  std::string dir_;
  dev::Pem ca_, server_, reader_, app_, stranger_;
  std::atomic<int> renders_{0}, authorized_{0};
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

TEST_F(TlsEndpointTest, OnlyAClientCertificateThatAuthorizeAdmitsReads) {
  Start(Tls());
  auto reader = GetAs(&reader_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->code, 200) << reader->status_line;
  EXPECT_EQ(reader->body, kBody);
  EXPECT_EQ(reader->server_cert, server_.cert);

  auto app = GetAs(&app_);
  ASSERT_TRUE(app.ok()) << app.status();
  EXPECT_EQ(app->code, 403);
  EXPECT_EQ(app->body, "spiffe://test.holdfast/app may not read metrics\n");
  EXPECT_EQ(authorized_.load(), 2);

  // No certificate, or one of another CA: the handshake fails, nothing is asked.
  auto none = GetAs(nullptr);
  ASSERT_FALSE(none.ok()) << none->status_line << none->body;
  EXPECT_TRUE(absl::StrContains(none.status().message(), "certificate required"))
      << none.status();
  auto stranger = GetAs(&stranger_);
  ASSERT_FALSE(stranger.ok()) << stranger->status_line << stranger->body;
  EXPECT_TRUE(absl::StrContains(stranger.status().message(), "unknown ca")) << stranger.status();
  // Plain HTTP to the TLS port: no HTTP answer.
  auto plain = dev::HttpGet(endpoint_->port(), "/metrics");
  EXPECT_FALSE(plain.ok() && plain->code == 200) << plain->body;
  EXPECT_EQ(authorized_.load(), 2);
  EXPECT_EQ(renders_.load(), 1) << "only the reader's request rendered";
}

// The deadline bounds the whole connection, not each read: a client that
// trickles its ClientHello a byte at a time is cut off, and the only worker
// serves the next client.
TEST_F(TlsEndpointTest, AClientTricklingItsHandshakeIsCutOffAtTheDeadline) {
  auto o = Tls();
  o.workers = 1;
  o.io_deadline = milliseconds(1000);
  Start(std::move(o));
  const auto start = std::chrono::steady_clock::now();
  const int slow = Connect(endpoint_->port());
  // A handshake record header announcing 16,000 bytes, then one byte every
  // 20 ms for up to 20 s: far more than the deadline, far less than the record.
  const unsigned char header[] = {0x16, 0x03, 0x01, 0x3e, 0x80};
  ASSERT_EQ(send(slow, header, sizeof(header), MSG_NOSIGNAL), 5);
  bool cut_off = false;
  for (int i = 0; i < 1000 && !cut_off; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    char b;
    const ssize_t r = recv(slow, &b, 1, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      cut_off = true;
      break;
    }
    if (send(slow, "\x01", 1, MSG_NOSIGNAL) != 1) cut_off = true;
  }
  const auto cut_after = std::chrono::steady_clock::now() - start;
  close(slow);
  EXPECT_TRUE(cut_off) << "the server still waited for the handshake after 20 s";
  EXPECT_GE(cut_after, milliseconds(1000)) << "cut off before its deadline";
  auto reader = GetAs(&reader_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->code, 200);
  EXPECT_EQ(authorized_.load(), 1) << "the trickler never got as far as authorize";
}

TEST_F(TlsEndpointTest, RotatedFilesAreUsedAndABrokenRotationKeepsTheLastGoodOnes) {
  Start(Tls(milliseconds(0)));  // checked on every connection
  auto first = GetAs(&reader_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->server_cert, server_.cert);

  const dev::Pem rotated = Leaf(ca_, "spiffe://test.holdfast/holdfastd");
  ASSERT_TRUE(dev::WritePem(dir_, "server", rotated).ok());
  auto second = GetAs(&reader_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->code, 200);
  EXPECT_EQ(second->server_cert, rotated.cert);

  // A key that is not the certificate's: the rotated pair stays in use.
  ASSERT_TRUE(dev::WriteFileAtomically(dir_ + "/server_key.pem", app_.key, 0600).ok());
  auto third = GetAs(&reader_);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->code, 200);
  EXPECT_EQ(third->server_cert, rotated.cert);
}

TEST_F(TlsEndpointTest, FilesThatCannotBeUsedAreNamedAtStart) {
  {
    auto o = Tls();
    o.tls->cert_file = dir_ + "/missing.pem";
    auto e = MetricsEndpoint::Start(std::move(o));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(e.status().message(), "the certificate chain " + dir_ +
                                                            "/missing.pem"))
        << e.status();
  }
  {
    ASSERT_TRUE(dev::WriteFileAtomically(dir_ + "/other_key.pem", app_.key, 0600).ok());
    auto o = Tls();
    o.tls->key_file = dir_ + "/other_key.pem";
    auto e = MetricsEndpoint::Start(std::move(o));
    ASSERT_FALSE(e.ok());
    EXPECT_TRUE(absl::StrContains(e.status().message(),
                                  "the private key " + dir_ + "/other_key.pem"))
        << e.status();
  }
  {
    ASSERT_TRUE(dev::WriteFileAtomically(dir_ + "/empty.pem", "", 0644).ok());
    auto o = Tls();
    o.tls->ca_file = dir_ + "/empty.pem";
    auto e = MetricsEndpoint::Start(std::move(o));
    ASSERT_FALSE(e.ok());
    EXPECT_TRUE(absl::StrContains(e.status().message(), "the CA bundle " + dir_))
        << e.status();
  }
}

}  // namespace
}  // namespace holdfast::server
