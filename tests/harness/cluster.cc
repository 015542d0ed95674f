#include "harness/cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dev/certs.h"

namespace holdfast::testing {

using dev::LeafOptions;
using dev::MakeCa;
using dev::MakeLeaf;
using dev::Pem;
using dev::WritePem;

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/holdfast-test-XXXXXX");
  char* made = ::mkdtemp(tmpl.data());
  path_ = made ? made : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string BinDir() {
  if (const char* env = std::getenv("HOLDFAST_BIN_DIR"); env && *env) return env;
#ifdef HOLDFAST_BIN_DIR
  return HOLDFAST_BIN_DIR;
#else
  return dev::SelfDir();
#endif
}

namespace {
// True once something accepts TCP connections on host:port (IPv4 literal).
bool PortOpen(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::atoi(endpoint.c_str() + colon + 1));
  if (inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr) != 1) return true;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool open = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return open;
}
}  // namespace

absl::Status Etcdctl(const std::string& dir, std::vector<std::string> args) {
  dev::SpawnOptions so;
  so.argv = {"etcdctl"};
  for (auto& a : args) so.argv.push_back(std::move(a));
  so.env = {{"ETCDCTL_API", "3"}};
  so.log_file = dir + "/etcdctl.log";
  auto p = dev::Subprocess::Spawn(std::move(so));
  if (!p.ok()) return p.status();
  auto code = (*p)->Wait(std::chrono::seconds(60));
  if (!code || *code != 0) {
    return absl::InternalError(absl::StrCat("etcdctl failed; see ", dir, "/etcdctl.log"));
  }
  return absl::OkStatus();
}

absl::Status RestoreEtcd(dev::EtcdProcess& etcd, const std::string& dir,
                         const std::string& snapshot, const std::string& cluster_token) {
  const std::string restored = dir + "/restored-" + cluster_token;
  if (auto s = Etcdctl(dir, {"snapshot", "restore", snapshot, "--data-dir", restored, "--name",
                             etcd.options().name, "--initial-cluster",
                             absl::StrCat(etcd.options().name, "=", etcd.peer_url()),
                             "--initial-advertise-peer-urls", etcd.peer_url(),
                             "--initial-cluster-token", cluster_token});
      !s.ok()) {
    return s;
  }
  return etcd.RestartOn(restored);
}

absl::Status WaitForHoldfastd(const std::string& endpoint, std::chrono::milliseconds timeout,
                              bool plaintext, const std::function<bool()>& exited) {
  const auto gone = [&] { return exited && exited(); };
  const absl::Status exited_error = absl::FailedPreconditionError("holdfastd exited at start");
  // Wait for the listener before making a channel: a gRPC channel whose first
  // connection was refused backs off for seconds before it tries again.
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!PortOpen(endpoint) && std::chrono::steady_clock::now() < until) {
    if (gone()) return exited_error;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A TLS server (holdfastd listens only after it is ready) is up with its port.
  if (!plaintext) {
    if (gone()) return exited_error;
    return PortOpen(endpoint) ? absl::OkStatus()
                              : absl::DeadlineExceededError("holdfastd did not listen in time");
  }
  ClientOptions o;
  o.endpoints = {endpoint};
  o.rpc_timeout = std::chrono::milliseconds(500);
  auto client = Client::Connect(o);
  if (!client.ok()) return client.status();
  absl::Status last = absl::DeadlineExceededError("not tried");
  while (std::chrono::steady_clock::now() < until) {
    auto e = (*client)->GetEpoch();
    if (e.ok()) return absl::OkStatus();
    if (gone()) return exited_error;
    last = e.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("holdfastd at ", endpoint, " did not answer in time: ", last.ToString()));
}

absl::StatusOr<std::unique_ptr<HoldfastdProcess>> HoldfastdProcess::Start(
    std::vector<std::string> etcd_endpoints, const std::string& log_file, int port,
    std::vector<std::string> extra_args) {
  std::unique_ptr<HoldfastdProcess> p(new HoldfastdProcess());
  p->etcd_endpoints_ = std::move(etcd_endpoints);
  p->extra_args_ = std::move(extra_args);
  p->log_file_ = log_file;
  // A port picked free may be taken by a process of a test running beside this
  // one before holdfastd binds it: holdfastd then exits at start saying so, and
  // is started again on another port, up to 5 times in all. A port the caller
  // chose is not changed.
  const bool pick = port == 0;
  for (int attempt = 1;; ++attempt) {
    if (pick) {
      auto free = dev::PickFreePort();
      if (!free.ok()) return free.status();
      port = *free;
    }
    p->port_ = port;
    std::error_code ec;
    const std::uintmax_t log_size =
        std::filesystem::exists(log_file, ec) ? std::filesystem::file_size(log_file, ec) : 0;
    auto s = p->Launch();
    if (s.ok()) return p;
    const bool port_taken =
        s.code() == absl::StatusCode::kFailedPrecondition &&
        dev::ReadFileFrom(log_file, ec ? 0 : log_size).find("Address already in use") != std::string::npos;
    if (!port_taken || !pick || attempt == 5) return s;
    p->process_.reset();
  }
}

HoldfastdProcess::~HoldfastdProcess() { Kill(); }

std::string HoldfastdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status HoldfastdProcess::Launch() {
  dev::SpawnOptions so;
  so.argv = {BinDir() + "/holdfastd", "--listen", endpoint(), "--etcd",
             absl::StrJoin(etcd_endpoints_, ",")};
  if (std::find(extra_args_.begin(), extra_args_.end(), "--config") == extra_args_.end()) {
    so.argv.push_back("--insecure");  // tests without TLS: plaintext on loopback
  }
  // etcd members in network namespaces of their own (the chaos tool's) are not on
  // loopback: plaintext to them is asked for by name.
  if (std::any_of(etcd_endpoints_.begin(), etcd_endpoints_.end(),
                  [](const std::string& e) { return !absl::StartsWith(e, "127."); })) {
    so.argv.push_back("--etcd-plaintext");
  }
  if (std::find(extra_args_.begin(), extra_args_.end(), "--audit-store") == extra_args_.end()) {
    // Every replica of a test cluster shares one SQLite audit store in its dir.
    so.argv.push_back("--audit-store");
    so.argv.push_back(absl::StrCat(
        "sqlite:", std::filesystem::path(log_file_).parent_path().string(), "/audit.db"));
  }
  for (const auto& a : extra_args_) so.argv.push_back(a);
  so.log_file = log_file_;
  std::error_code ec;
  const std::uintmax_t log_size =
      std::filesystem::exists(log_file_, ec) ? std::filesystem::file_size(log_file_, ec) : 0;
  auto proc = dev::Subprocess::Spawn(std::move(so));
  if (!proc.ok()) return proc.status();
  process_ = std::move(*proc);
  const bool plaintext =
      std::find(extra_args_.begin(), extra_args_.end(), "--config") == extra_args_.end();
  auto s = WaitForHoldfastd(endpoint(), std::chrono::seconds(20), plaintext,
                            [this] { return process_->Exited(); });
  if (s.ok() && !plaintext) {
    // With TLS the open port is all WaitForHoldfastd sees, and it may be another
    // process's that took the port: holdfastd says when it serves.
    const std::string serving = "holdfastd: serving on " + endpoint() + " ";
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      if (dev::ReadFileFrom(log_file_, ec ? 0 : log_size).find(serving) != std::string::npos) break;
      if (process_->Exited()) {
        s = absl::FailedPreconditionError("holdfastd exited at start");
        break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        s = absl::DeadlineExceededError("holdfastd did not say it serves in time");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), "; see ", log_file_));
  return absl::OkStatus();
}

void HoldfastdProcess::Kill() {
  if (process_) {
    process_->Signal(SIGKILL);
    process_->Wait();
    process_.reset();
  }
}

void HoldfastdProcess::Stop() {
  if (process_) {
    process_->Stop(std::chrono::seconds(10));
    process_.reset();
  }
}

absl::Status HoldfastdProcess::Restart() {
  Stop();
  return Launch();
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(Options options) {
  std::unique_ptr<TestCluster> c(new TestCluster());
  if (c->dir_.path().empty()) return absl::InternalError("cannot make a temp dir");
  const int members = std::max(1, options.etcd_members);
  std::vector<std::string> etcd_tls_args;
  if (options.etcd_tls) {
    if (auto s = c->SetUpEtcdTls(&etcd_tls_args); !s.ok()) return s;
  }
  auto eos = dev::ClusterMembers(members, absl::StrCat(c->dir_.path(), "/etcd"));
  if (!eos.ok()) return eos.status();
  std::vector<std::string> endpoints;
  for (auto& eo : *eos) {
    if (options.etcd_tls) {
      eo.client_scheme = "https";
      eo.extra_args = etcd_tls_args;
    }
    auto etcd = dev::EtcdProcess::Start(eo);
    if (!etcd.ok()) return etcd.status();
    endpoints.push_back((*etcd)->endpoint());
    c->etcd_.push_back(std::move(*etcd));
  }
  for (auto& e : c->etcd_) {
    if (auto s = e->WaitHealthy(); !s.ok()) return s;
  }
  if (options.extra_etcd_clusters > 0) {
    std::string yaml = absl::StrCat("clusters:\n  - {name: a, tier: a, control: true, endpoints: [",
                                    endpoints.front(), "]}\n");
    for (int i = 0; i < options.extra_etcd_clusters; ++i) {
      dev::EtcdOptions eo;
      const std::string name(1, static_cast<char>('b' + i));
      eo.name = "m0";
      eo.data_dir = absl::StrCat(c->dir_.path(), "/etcd-", name);
      auto client_port = dev::PickFreePort();
      auto peer_port = dev::PickFreePort();
      if (!client_port.ok() || !peer_port.ok()) return absl::InternalError("no free ports");
      eo.client_port = *client_port;
      eo.peer_port = *peer_port;
      auto etcd = dev::EtcdProcess::Start(eo);
      if (!etcd.ok()) return etcd.status();
      absl::StrAppend(&yaml, "  - {name: ", name, ", tier: ", name, ", endpoints: [",
                      (*etcd)->endpoint(), "]}\n");
      c->extra_etcd_.push_back(std::move(*etcd));
    }
    options.extra_config = yaml + options.extra_config;
  }
  std::vector<std::string> holdfastd_args = options.holdfastd_args;
  if (options.etcd_tls) {
    const std::string config = c->certs_dir() + "/holdfastd-etcd-tls.yaml";
    std::ofstream f(config);
    f << "insecure: true\n"
      << "etcd:\n  tls:\n"
      << "    ca_file: " << c->certs_dir() << "/etcd-ca.pem\n"
      << "    cert_file: " << c->certs_dir() << "/etcd-client.pem\n"
      << "    key_file: " << c->certs_dir() << "/etcd-client_key.pem\n"
      << options.extra_config;
    holdfastd_args.push_back("--config");
    holdfastd_args.push_back(config);
  }
  if (options.tls) {
    c->tls_ = true;
    if (auto s = c->SetUpTls(&holdfastd_args, options.extra_config); !s.ok()) return s;
  }
  if (!options.tls && !options.etcd_tls && !options.extra_config.empty()) {
    const std::string config = c->dir() + "/holdfastd.yaml";
    std::ofstream f(config);
    f << "insecure: true\n" << options.extra_config;
    holdfastd_args.push_back("--config");
    holdfastd_args.push_back(config);
  }
  std::vector<std::string> holdfastd_etcd = endpoints;
  if (options.etcd_via_proxy) {
    if (endpoints.size() != 1 || options.etcd_tls) {
      return absl::InvalidArgumentError("etcd_via_proxy: one plaintext etcd member only");
    }
    auto proxy = StallProxy::Start(endpoints.front());
    if (!proxy.ok()) return proxy.status();
    c->etcd_proxy_ = std::move(*proxy);
    holdfastd_etcd = {c->etcd_proxy_->endpoint()};
  }
  for (int i = 0; i < options.replicas; ++i) {
    auto h = HoldfastdProcess::Start(holdfastd_etcd,
                                     absl::StrCat(c->dir_.path(), "/holdfastd-", i, ".log"), 0,
                                     holdfastd_args);
    if (!h.ok()) return h.status();
    c->holdfastd_.push_back(std::move(*h));
  }
  c->timers_ = std::make_shared<TimerQueue>();
  etcd::ClientOptions co;
  co.endpoints = endpoints;
  if (options.etcd_tls) {
    grpc::SslCredentialsOptions so;
    so.pem_root_certs = c->etcd_ca_pem_.cert;
    so.pem_cert_chain = c->etcd_client_pem_.cert;
    so.pem_private_key = c->etcd_client_pem_.key;
    co.credentials = grpc::SslCredentials(so);
  }
  auto ec = etcd::Client::Create(co, c->timers_);
  if (!ec.ok()) return ec.status();
  c->etcd_client_ = std::move(*ec);
  for (auto& e : c->extra_etcd_) {
    etcd::ClientOptions xo;
    xo.endpoints = {e->endpoint()};
    auto x = etcd::Client::Create(xo, c->timers_);
    if (!x.ok()) return x.status();
    c->extra_etcd_clients_.push_back(std::move(*x));
  }
  return c;
}

TestCluster::~TestCluster() {
  etcd_client_.reset();
  extra_etcd_clients_.clear();
  holdfastd_.clear();
  for (auto& e : etcd_) {
    if (e->process()) e->process()->Signal(SIGCONT);  // a test may have paused some
  }
  etcd_.clear();
  extra_etcd_.clear();
}

absl::Status TestCluster::SetUpEtcdTls(std::vector<std::string>* etcd_args) {
  std::filesystem::create_directories(certs_dir());
  auto ca = MakeCa("etcd test CA");
  if (!ca.ok()) return ca.status();
  etcd_ca_pem_ = *ca;
  LeafOptions server;
  server.common_name = "etcd";
  server.dns = {"localhost"};
  server.ips = {"127.0.0.1"};
  auto server_pem = MakeLeaf(*ca, server);
  LeafOptions client;
  client.common_name = "holdfastd";
  auto client_pem = MakeLeaf(*ca, client);
  if (!server_pem.ok() || !client_pem.ok()) return absl::InternalError("etcd certificates");
  etcd_client_pem_ = *client_pem;
  for (auto [name, pem] : {std::pair{"etcd-ca", *ca}, std::pair{"etcd-server", *server_pem},
                           std::pair{"etcd-client", *client_pem}}) {
    if (auto s = WritePem(certs_dir(), name, pem); !s.ok()) return s;
  }
  *etcd_args = {"--cert-file", certs_dir() + "/etcd-server.pem",
                "--key-file", certs_dir() + "/etcd-server_key.pem",
                "--trusted-ca-file", certs_dir() + "/etcd-ca.pem",
                "--client-cert-auth"};
  return absl::OkStatus();
}

absl::Status TestCluster::SetUpTls(std::vector<std::string>* args,
                                   const std::string& extra_config) {
  std::filesystem::create_directories(certs_dir());
  auto ca = MakeCa("holdfast test CA");
  auto other = MakeCa("another CA");
  if (!ca.ok() || !other.ok()) return absl::InternalError("cannot make test CAs");
  ca_cert_ = ca->cert;
  ca_key_ = ca->key;
  other_ca_cert_ = other->cert;
  other_ca_key_ = other->key;
  if (auto s = WritePem(certs_dir(), "ca", *ca); !s.ok()) return s;
  LeafOptions server;
  server.common_name = "holdfastd";
  server.dns = {"localhost"};
  server.ips = {"127.0.0.1"};
  server.uris = {"spiffe://test.holdfast/holdfastd"};
  auto server_pem = MakeLeaf(*ca, server);
  if (!server_pem.ok()) return server_pem.status();
  if (auto s = WritePem(certs_dir(), "server", *server_pem); !s.ok()) return s;
  if (auto s = MakeIdentity("admin", "spiffe://test.holdfast/ops/admin"); !s.ok()) return s;
  const std::string config = certs_dir() + "/holdfastd.yaml";
  std::ofstream f(config);
  f << "tls:\n"
    << "  ca_file: " << certs_dir() << "/ca.pem\n"
    << "  cert_file: " << certs_dir() << "/server.pem\n"
    << "  key_file: " << certs_dir() << "/server_key.pem\n"
    << "  trust_domains: [test.holdfast]\n"
    << "  refresh: 1s\n"
    << "admin_ids: [spiffe://test.holdfast/ops/*]\n"
    << extra_config;
  if (!f) return absl::InternalError("cannot write the holdfastd config");
  args->push_back("--config");
  args->push_back(config);
  return absl::OkStatus();
}

absl::Status TestCluster::MakeIdentity(const std::string& name, const std::string& spiffe_id,
                                       bool other_ca, bool expired) {
  LeafOptions o;
  o.common_name = name;
  if (!spiffe_id.empty()) o.uris = {spiffe_id};
  o.expired = expired;
  Pem ca = other_ca ? Pem{other_ca_cert_, other_ca_key_} : Pem{ca_cert_, ca_key_};
  auto pem = MakeLeaf(ca, o);
  if (!pem.ok()) return pem.status();
  return WritePem(certs_dir(), name, *pem);
}

absl::StatusOr<std::unique_ptr<Client>> TestCluster::NewClientAs(const std::string& name, int i,
                                                                std::chrono::milliseconds rpc_timeout) {
  ClientOptions o;
  o.endpoints = {endpoint(i)};
  o.ca_file = certs_dir() + "/ca.pem";
  if (!name.empty()) {
    o.cert_file = certs_dir() + "/" + name + ".pem";
    o.key_file = certs_dir() + "/" + name + "_key.pem";
  }
  o.rpc_timeout = rpc_timeout;
  return Client::Connect(o);
}

absl::StatusOr<std::unique_ptr<Client>> TestCluster::NewClient(int i) {
  if (tls_ && i >= 0) return NewClientAs("admin", i);
  ClientOptions o;
  o.endpoints.clear();
  if (i >= 0) {
    o.endpoints = {endpoint(i)};
  } else {
    for (const auto& h : holdfastd_) o.endpoints.push_back(h->endpoint());
    o.endpoint_order = EndpointOrder::kAsListed;  // replica 0 first, as tests expect
  }
  return Client::Connect(o);
}

absl::Status TestCluster::SpaceAlarm(bool on) {
  auto stub = etcdserverpb::Maintenance::NewStub(
      grpc::CreateChannel(etcd().endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext status_ctx;
  status_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  etcdserverpb::StatusResponse status;
  if (auto s = stub->Status(&status_ctx, etcdserverpb::StatusRequest(), &status); !s.ok()) {
    return absl::UnavailableError(s.error_message());
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  etcdserverpb::AlarmRequest req;
  req.set_action(on ? etcdserverpb::AlarmRequest::ACTIVATE
                    : etcdserverpb::AlarmRequest::DEACTIVATE);
  req.set_memberid(status.header().member_id());
  req.set_alarm(etcdserverpb::NOSPACE);
  etcdserverpb::AlarmResponse resp;
  if (auto s = stub->Alarm(&ctx, req, &resp); !s.ok()) {
    return absl::UnavailableError(s.error_message());
  }
  return absl::OkStatus();
}

absl::Status TestCluster::CreateNamespace(const std::string& ns) {
  auto client = NewClient();
  if (!client.ok()) return client.status();
  return (*client)->CreateNamespace(TestNamespaceRequest(ns)).status();
}

v1::CreateNamespaceRequest TestNamespaceRequest(const std::string& ns) {
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name(ns);
  auto* cls = req.mutable_default_class();
  cls->set_mode(v1::LOCK_MODE_SHARED);
  cls->set_enforcement(v1::ENFORCEMENT_FENCED);
  cls->set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
  cls->set_ttl_min_ms(1000);
  cls->set_ttl_max_ms(3'600'000);
  return req;
}

}  // namespace holdfast::testing
