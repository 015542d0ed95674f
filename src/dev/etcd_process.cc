#include "dev/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"

namespace holdfast::dev {

std::string EtcdBinary() {
  if (const char* env = std::getenv("HOLDFAST_ETCD_BIN"); env && *env) return env;
  if (std::filesystem::exists("/usr/bin/etcd")) return "/usr/bin/etcd";
  return "etcd";
}

bool EtcdHealthy(int client_port) { return EtcdHealthy("127.0.0.1", client_port); }

bool EtcdHealthy(const std::string& host, int client_port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(client_port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return false;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = absl::StrCat("GET /health HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      std::string resp;
      char buf[512];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, n);
      ok = resp.find("\"health\":\"true\"") != std::string::npos;
    }
  }
  ::close(fd);
  return ok;
}

// A port picked free may be taken by another process (a test running beside
// this one) before etcd binds it: etcd then exits at start saying so, and is
// started again on other ports, up to 5 times in all. Ports the caller chose
// are not changed.
absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(EtcdOptions options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("etcd: data_dir is required");
  if (options.log_file.empty()) options.log_file = options.data_dir + ".log";
  const bool pick_client = options.client_port == 0, pick_peer = options.peer_port == 0;
  for (int attempt = 1;; ++attempt) {
    EtcdOptions o = options;
    if (pick_client) {
      auto p = PickFreePort();
      if (!p.ok()) return p.status();
      o.client_port = *p;
    }
    if (pick_peer) {
      auto p = PickFreePort();
      if (!p.ok()) return p.status();
      o.peer_port = *p;
    }
    std::error_code ec;
    const std::uintmax_t log_size = std::filesystem::exists(o.log_file, ec)
                                        ? std::filesystem::file_size(o.log_file, ec)
                                        : 0;
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(std::move(o)));
    auto s = etcd->Launch(etcd->options_.wait_healthy);
    if (s.ok()) return etcd;
    const bool port_taken =
        ReadFileFrom(etcd->options_.log_file, ec ? 0 : log_size).find("address already in use") !=
        std::string::npos;
    if (!port_taken || !(pick_client || pick_peer) || attempt == 5) return s;
  }
}

EtcdProcess::~EtcdProcess() { Stop(); }

std::string EtcdProcess::endpoint() const {
  return absl::StrCat(options_.host, ":", options_.client_port);
}

std::string EtcdProcess::peer_url() const {
  return absl::StrCat("http://", options_.host, ":", options_.peer_port);
}

absl::Status EtcdProcess::Launch(bool wait_healthy) {
  std::string bin = EtcdBinary();
  if (bin == "etcd" && std::system("command -v etcd >/dev/null 2>&1") != 0) {
    return absl::NotFoundError("etcd binary not found: run scripts/setup.sh (package etcd-server)");
  }
  std::string client_url =
      absl::StrCat(options_.client_scheme, "://", options_.host, ":", options_.client_port);
  std::string initial_cluster = options_.initial_cluster.empty()
                                    ? absl::StrCat(options_.name, "=", peer_url())
                                    : options_.initial_cluster;
  SpawnOptions so;
  so.argv = {bin,
             "--name", options_.name,
             "--data-dir", options_.data_dir,
             "--listen-client-urls", client_url,
             "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url(),
             "--initial-advertise-peer-urls", peer_url(),
             "--initial-cluster", initial_cluster,
             "--initial-cluster-state", options_.initial_cluster_state,
             "--initial-cluster-token", "holdfast",
             // holdfast owns compaction (it never compacts past the audit cursor).
             "--auto-compaction-retention", "0",
             "--logger", "zap",
             "--log-level", "warn"};
  so.argv.insert(so.argv.begin(), options_.command_prefix.begin(),
                 options_.command_prefix.end());
  if (options_.pre_vote) so.argv.push_back("--pre-vote");
  for (const auto& a : options_.extra_args) so.argv.push_back(a);
  // etcd 3.4 reads ETCD_* variables as flags: keep the caller's out, but for
  // ETCD_UNSUPPORTED_ARCH, which etcd needs to start at all on some machines
  // (arm64, say) and which no flag replaces.
  so.drop_env_prefixes = {"ETCD_"};
  if (const char* arch = std::getenv("ETCD_UNSUPPORTED_ARCH"); arch != nullptr) {
    so.env.emplace_back("ETCD_UNSUPPORTED_ARCH", arch);
  }
  so.kill_with_parent = options_.kill_with_parent;
  so.log_file = options_.log_file;
  auto p = Subprocess::Spawn(std::move(so));
  if (!p.ok()) return p.status();
  process_ = std::move(*p);
  if (!wait_healthy) return absl::OkStatus();
  return WaitHealthy();
}

absl::Status EtcdProcess::WaitHealthy() {
  auto until = std::chrono::steady_clock::now() + options_.start_timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (!process_->Running()) {
      return absl::InternalError(absl::StrCat("etcd exited at start; see ", options_.log_file));
    }
    if (options_.client_scheme != "http") {
      // Health over TLS needs a client certificate: settle for an open port.
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(options_.client_port);
      inet_pton(AF_INET, options_.host.c_str(), &addr.sin_addr);
      bool open = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(fd);
      if (open) return absl::OkStatus();
    } else if (EtcdHealthy(options_.host, options_.client_port)) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not become healthy in time; see ", options_.log_file));
}

void EtcdProcess::Stop() {
  if (process_) {
    process_->Stop(std::chrono::seconds(5));
    process_.reset();
  }
}

absl::Status EtcdProcess::Restart(bool wait_healthy) {
  Stop();
  options_.initial_cluster_state = "existing";
  return Launch(wait_healthy);
}

absl::Status EtcdProcess::RestartOn(const std::string& data_dir) {
  Stop();
  options_.data_dir = data_dir;
  options_.initial_cluster_state = "existing";
  return Launch(/*wait_healthy=*/true);
}

absl::StatusOr<std::vector<EtcdOptions>> ClusterMembers(int members,
                                                         const std::string& dir_prefix) {
  std::vector<EtcdOptions> out(members);
  std::string initial_cluster;
  for (int m = 0; m < members; ++m) {
    EtcdOptions& eo = out[m];
    eo.name = absl::StrCat("m", m);
    eo.data_dir = absl::StrCat(dir_prefix, "-", m);
    auto client_port = PickFreePort();
    auto peer_port = PickFreePort();
    if (!client_port.ok() || !peer_port.ok()) return absl::InternalError("no free ports");
    eo.client_port = *client_port;
    eo.peer_port = *peer_port;
    eo.wait_healthy = members == 1;
    absl::StrAppend(&initial_cluster, m == 0 ? "" : ",", eo.name, "=http://127.0.0.1:",
                    eo.peer_port);
  }
  if (members > 1) {
    for (auto& eo : out) eo.initial_cluster = initial_cluster;
  }
  return out;
}

}  // namespace holdfast::dev
