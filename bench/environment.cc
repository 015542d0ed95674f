#include "bench/environment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dev/temp_dir.h"
#include "holdfast/client.h"

namespace holdfast::bench {

namespace {

constexpr std::chrono::seconds kHoldfastdStartTimeout{20};
constexpr size_t kLogTailBytes = 1500;
constexpr std::chrono::seconds kHelpTimeout{5};

std::string HostOf(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  std::string host = colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// True once something accepts TCP connections on an IPv4 host:port.
bool PortOpen(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  std::string host = HostOf(endpoint);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::atoi(endpoint.c_str() + colon + 1));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return true;  // let gRPC try
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool open = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return open;
}

std::string LogTail(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  auto size = static_cast<size_t>(in.tellg());
  size_t from = size > kLogTailBytes ? size - kLogTailBytes : 0;
  in.seekg(static_cast<std::streamoff>(from));
  std::string tail(size - from, '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return tail;
}

// True when `binary --help` lists `flag`. --insecure: that holdfastd serves TLS
// unless told to serve plaintext (loopback only, every caller the dev identity).
// --audit-store: it records an audit trail (here in the run's directory).
bool HasFlag(const std::string& binary, const std::string& dir, const std::string& flag) {
  dev::SpawnOptions so;
  so.argv = {binary, "--help"};
  so.log_file = dir + "/holdfastd-help.txt";
  auto proc = dev::Subprocess::Spawn(std::move(so));
  if (!proc.ok()) return false;
  if (!(*proc)->Wait(kHelpTimeout)) (*proc)->Stop(std::chrono::seconds(1));
  std::ifstream in(dir + "/holdfastd-help.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StrContains(line, flag)) return true;
  }
  return false;
}

}  // namespace

bool IsLoopbackEndpoint(const std::string& endpoint) {
  std::string host = HostOf(endpoint);
  if (host == "localhost" || host == "::1") return true;
  in_addr a;
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

absl::Status WaitForHoldfastd(ClientOptions options, std::chrono::milliseconds timeout,
                              dev::Subprocess* process) {
  const std::string endpoint = options.endpoints.at(0);
  auto until = std::chrono::steady_clock::now() + timeout;
  auto exited = [process]() -> std::optional<absl::Status> {
    if (process == nullptr || process->Running()) return std::nullopt;
    return absl::FailedPreconditionError(
        absl::StrCat("holdfastd exited with status ", process->Wait().value_or(-1)));
  };
  // A gRPC channel whose first connection was refused backs off for seconds:
  // wait for the listener before making one.
  while (!PortOpen(endpoint) && std::chrono::steady_clock::now() < until) {
    if (auto gone = exited()) return *gone;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  options.rpc_timeout = std::chrono::seconds(1);
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  absl::Status last = absl::DeadlineExceededError("not tried");
  while (std::chrono::steady_clock::now() < until) {
    if (auto gone = exited()) return *gone;
    auto e = (*client)->GetEpoch();
    if (e.ok()) return absl::OkStatus();
    last = e.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("holdfastd at ", endpoint, " did not answer in time: ", last.ToString()));
}

absl::StatusOr<std::unique_ptr<Environment>> Environment::Start(
    const EnvironmentOptions& options) {
  for (const auto* e : {&options.etcd_endpoint, &options.holdfast_endpoint}) {
    if (!e->empty() && !IsLoopbackEndpoint(*e)) {
      return absl::InvalidArgumentError(
          absl::StrCat(*e, " is not a loopback address: the benchmark runs on this machine only"));
    }
  }
  if (options.tls && !options.holdfast_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--tls starts holdfastd with a dev PKI of its own: it cannot be combined with "
        "--endpoint");
  }
  if (!options.holdfast_endpoint.empty() && options.etcd_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--endpoint needs --etcd (the etcd that holdfastd uses): the baselines must run on "
        "the same etcd");
  }
  std::unique_ptr<Environment> env(new Environment());
  env->etcd_endpoint_ = options.etcd_endpoint;
  env->holdfast_endpoint_ = options.holdfast_endpoint;
  env->tls_ = options.tls;
  if (env->etcd_endpoint_.empty() || env->holdfast_endpoint_.empty()) {
    auto dir = dev::MakeTempDir("holdfast-bench");
    if (!dir.ok()) return dir.status();
    env->dir_ = *dir;
  }
  if (env->etcd_endpoint_.empty()) {
    if (auto s = env->StartEtcd(); !s.ok()) return s;
  }
  if (env->holdfast_endpoint_.empty()) {
    std::string binary = options.holdfastd_binary.empty()
                             ? dev::SelfDir() + "/holdfastd"
                             : options.holdfastd_binary;
    if (auto s = env->StartHoldfastd(binary); !s.ok()) return s;
  }
  return env;
}

Environment::~Environment() { Stop(); }

ClientOptions Environment::client_options() const {
  ClientOptions o;
  o.endpoints = {holdfast_endpoint_};
  if (pki_) {
    o.ca_file = pki_->cli.bundle;
    o.cert_file = pki_->cli.cert;
    o.key_file = pki_->cli.key;
  }
  return o;
}

std::optional<pid_t> Environment::etcd_pid() const {
  if (etcd_ && etcd_->process()) return etcd_->process()->pid();
  return std::nullopt;
}

std::optional<pid_t> Environment::holdfastd_pid() const {
  if (holdfastd_) return holdfastd_->pid();
  return std::nullopt;
}

absl::Status Environment::RestartHoldfastd() {
  if (!holdfastd_) return absl::FailedPreconditionError("holdfastd was not started by this run");
  holdfastd_->Stop(std::chrono::seconds(5));
  holdfastd_.reset();
  return StartHoldfastd(holdfastd_binary_);
}

void Environment::Stop() {
  if (holdfastd_) {
    holdfastd_->Stop(std::chrono::seconds(5));
    holdfastd_.reset();
  }
  if (etcd_) {
    etcd_->Stop();
    etcd_.reset();
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

absl::Status Environment::StartEtcd() {
  dev::EtcdOptions eo;
  eo.name = "holdfast-bench";
  eo.data_dir = dir_ + "/etcd";
  eo.log_file = dir_ + "/etcd.log";
  auto etcd = dev::EtcdProcess::Start(eo);
  if (!etcd.ok()) {
    return absl::Status(etcd.status().code(),
                        absl::StrCat(etcd.status().message(), "; etcd log ends with:\n",
                                     LogTail(eo.log_file)));
  }
  etcd_ = std::move(*etcd);
  etcd_endpoint_ = etcd_->endpoint();
  return absl::OkStatus();
}

absl::Status Environment::StartHoldfastd(const std::string& binary) {
  if (!std::filesystem::exists(binary)) {
    return absl::NotFoundError(absl::StrCat("no holdfastd at ", binary,
                                            ": build it, or pass --holdfastd or --endpoint"));
  }
  holdfastd_binary_ = binary;
  auto port = dev::PickFreePort();
  if (!port.ok()) return port.status();
  holdfast_endpoint_ = absl::StrCat("127.0.0.1:", *port);
  std::string log = absl::StrCat(dir_, "/holdfastd-", *port, ".log");
  dev::SpawnOptions so;
  so.argv = {binary, "--listen", holdfast_endpoint_, "--etcd", etcd_endpoint_};
  if (tls_) {
    if (!pki_) {
      auto pki = dev::PrepareDevPki(dir_, "127.0.0.1");
      if (!pki.ok()) return pki.status();
      pki_ = *std::move(pki);
    }
    auto config = dev::WriteDevHoldfastdConfig(dir_, *pki_);
    if (!config.ok()) return config.status();
    so.argv.push_back("--config");
    so.argv.push_back(*config);
  } else if (HasFlag(binary, dir_, "--insecure")) {
    so.argv.push_back("--insecure");
  }
  if (HasFlag(binary, dir_, "--audit-store")) {
    so.argv.push_back("--audit-store");
    so.argv.push_back(absl::StrCat("sqlite:", dir_, "/audit.db"));
  }
  so.log_file = log;
  auto proc = dev::Subprocess::Spawn(std::move(so));
  if (!proc.ok()) return proc.status();
  holdfastd_ = std::move(*proc);
  auto s = WaitForHoldfastd(client_options(), kHoldfastdStartTimeout, holdfastd_.get());
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; holdfastd log ends with:\n",
                                               LogTail(log)));
  }
  return absl::OkStatus();
}

}  // namespace holdfast::bench
