// `holdfast dev [--listen ADDR] [--data-dir DIR] [--insecure]`: a single-member
// etcd and one holdfastd in the foreground, for development, serving mTLS with a
// dev CA (dev/dev_pki.h). `holdfast dev issue-cert` mints more dev identities.
//
// Layout of DIR (kept between runs, so a second start keeps the data):
//   DIR/etcd/          etcd's data
//   DIR/ports          etcd's client and peer ports, reused on the next start so the
//                      member's stored URLs stay valid
//   DIR/ca/, server/, cli/   the dev CA, holdfastd's SVID, the CLI's SVID (dev_pki.h)
//   DIR/holdfastd.yaml holdfastd's config (TLS files, trust domain, dev admins);
//                      written on every start
//   DIR/insecure       present while the last start was --insecure (the CLI then
//                      speaks plaintext)
//   DIR/audit.db       the audit trail (SQLite; `holdfast audit` reads it)
//   DIR/etcd.log       etcd's output
//   DIR/holdfastd.log  holdfastd's output
//   DIR/dev.lock       flock()ed while a `holdfast dev` runs on DIR
//
// The main thread waits for Ctrl-C / SIGTERM and for a child's death through
// one SignalWaiter; it then stops holdfastd, then etcd.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/common.h"
#include "cli/signal_waiter.h"
#include "common/listen.h"
#include "common/loopback.h"
#include "common/spiffe.h"
#include "dev/certs.h"
#include "dev/dev_pki.h"
#include "dev/etcd_process.h"
#include "dev/subprocess.h"

namespace holdfast::cli {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kReadyTimeout = std::chrono::seconds(30);
constexpr milliseconds kReadyPollInterval{100};
constexpr milliseconds kHoldfastdStopGrace = std::chrono::seconds(5);
constexpr int kLogTailLines = 15;

struct DevFlags {
  std::string listen = kDefaultEndpoint;
  std::string data_dir = dev::kDefaultDevDir;
  bool insecure = false;
};

struct IssueCertFlags {
  std::string spiffe_id;
  std::string out_dir;
  std::string data_dir;  // empty: `holdfast dev`'s --data-dir (or its default)
};

struct EtcdPorts {
  int client = 0;
  int peer = 0;
};

// The last `lines` lines of a log file, indented, for error messages.
std::string LogTail(const fs::path& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back("    " + line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  if (tail.empty()) return "";
  return absl::StrCat("\n  last lines of ", path.string(), ":\n", absl::StrJoin(tail, "\n"));
}

// Reads DIR/ports ("client_port=N" and "peer_port=N" lines); nullopt if absent.
absl::StatusOr<std::optional<EtcdPorts>> LoadPorts(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::optional<EtcdPorts>();
  EtcdPorts ports;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    int value = 0;
    if (!absl::SimpleAtoi(kv.second, &value) || value < 1 || value > 65535) continue;
    if (kv.first == "client_port") ports.client = value;
    if (kv.first == "peer_port") ports.peer = value;
  }
  if (ports.client == 0 || ports.peer == 0) {
    return absl::DataLossError(absl::StrCat(file.string(),
                                            " is damaged: expected client_port=N and peer_port=N"));
  }
  return std::optional<EtcdPorts>(ports);
}

absl::Status SavePorts(const fs::path& file, const EtcdPorts& ports) {
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "# holdfast dev: etcd's ports for this data directory. etcd stores its\n"
           "# member URLs with the data, so they are reused on every start.\n"
        << "client_port=" << ports.client << "\npeer_port=" << ports.peer << "\n";
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot write ", file.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Whether nothing listens on 127.0.0.1:`port` (a bind of our own says so).
bool PortFree(int port) { return net::CheckCanListen(absl::StrCat("127.0.0.1:", port)).ok(); }

// The ports of DIR/ports, or two free ones (then saved there). A saved client
// port something else took since (PickFreePort's ports are the kernel's
// ephemeral ones, which outgoing connections use too) is picked anew: etcd
// publishes its client URL afresh at every start. The peer URL is kept with
// etcd's data, so a peer port in use is an error that says what to do.
absl::StatusOr<EtcdPorts> LoadOrPickPorts(const fs::path& dir) {
  fs::path file = dir / "ports";
  auto loaded = LoadPorts(file);
  if (!loaded.ok()) return loaded.status();
  if (*loaded) {
    EtcdPorts ports = **loaded;
    if (!PortFree(ports.peer)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd's peer port ", ports.peer, " (saved in ", file.string(),
          ") is in use by another program: stop it (an etcd left running by an earlier "
          "`holdfast dev`?), or start afresh with another --data-dir"));
    }
    if (!PortFree(ports.client)) {
      auto client = dev::PickFreePort();
      if (!client.ok()) return client.status();
      ports.client = *client;
      if (auto s = SavePorts(file, ports); !s.ok()) return s;
    }
    return ports;
  }
  EtcdPorts ports;
  auto client = dev::PickFreePort();
  if (!client.ok()) return client.status();
  auto peer = dev::PickFreePort();
  if (!peer.ok()) return peer.status();
  ports.client = *client;
  ports.peer = *peer;
  if (auto s = SavePorts(file, ports); !s.ok()) return s;
  return ports;
}

// Holds DIR/dev.lock for the life of the process (the fd is never closed).
absl::Status LockDataDir(const fs::path& dir) {
  fs::path file = dir / "dev.lock";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", file.string(), ": ",
                                            std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("another `holdfast dev` is running on ", dir.string()));
  }
  return absl::OkStatus();
}

// Where a client reaches a server listening on `listen` (wildcard hosts become
// loopback).
std::string ClientAddress(const std::string& listen) {
  size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat("127.0.0.1", listen.substr(colon));
  }
  return listen;
}

// The host part of HOST:PORT, without IPv6 brackets.
std::string ListenHost(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// DIR/insecure present exactly when this start is --insecure.
absl::Status MarkInsecure(const fs::path& dir, bool insecure) {
  fs::path marker = dir / dev::kInsecureMarker;
  if (insecure) {
    return dev::WriteFileAtomically(
        marker.string(),
        "holdfast dev runs --insecure on this directory: the CLI speaks plaintext.\n", 0644);
  }
  std::error_code ec;
  fs::remove(marker, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", marker.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// The running pair and where its files are. Confined to the main thread.
struct DevStack {
  fs::path dir;
  std::string endpoint;  // what clients dial
  std::unique_ptr<dev::EtcdProcess> etcd;
  std::unique_ptr<dev::Subprocess> holdfastd;
  std::optional<dev::DevPki> pki;  // unset: --insecure

  fs::path holdfastd_log() const { return dir / "holdfastd.log"; }
  fs::path etcd_log() const { return dir / "etcd.log"; }

  // holdfastd first (it may still be writing), then etcd.
  void Stop() {
    if (holdfastd) holdfastd->Stop(kHoldfastdStopGrace);
    if (etcd) etcd->Stop();
  }
};

absl::Status StartEtcd(DevStack& stack) {
  auto ports = LoadOrPickPorts(stack.dir);
  if (!ports.ok()) return ports.status();
  dev::EtcdOptions options;
  options.name = "holdfast-dev";
  options.data_dir = (stack.dir / "etcd").string();
  options.client_port = ports->client;
  options.peer_port = ports->peer;
  options.log_file = stack.etcd_log().string();
  // Neither etcd nor holdfastd outlives `holdfast dev`, even one SIGKILLed: a
  // stack left running would hold the ports and the data of the next start.
  options.kill_with_parent = true;
  auto etcd = dev::EtcdProcess::Start(std::move(options));
  if (!etcd.ok()) {
    return absl::Status(etcd.status().code(),
                        absl::StrCat("etcd (ports ", ports->client, ", ", ports->peer,
                                     ") did not start: ", etcd.status().message(),
                                     LogTail(stack.etcd_log(), kLogTailLines)));
  }
  stack.etcd = *std::move(etcd);
  return absl::OkStatus();
}

absl::Status StartHoldfastd(DevStack& stack, const std::string& listen) {
  std::string self_dir = dev::SelfDir();
  dev::SpawnOptions options;
  options.argv = {self_dir.empty() ? "holdfastd" : self_dir + "/holdfastd", "--listen", listen,
                  "--etcd", stack.etcd->endpoint(),
                  // The embedded audit store, kept with the rest of the data.
                  "--audit-store", "sqlite:" + (stack.dir / "audit.db").string()};
  if (stack.pki) {
    auto config = dev::WriteDevHoldfastdConfig(stack.dir.string(), *stack.pki);
    if (!config.ok()) return config.status();
    options.argv.push_back("--config");
    options.argv.push_back(*config);
  } else {
    // Plaintext on loopback (holdfastd refuses it elsewhere).
    options.argv.push_back("--insecure");
  }
  options.log_file = stack.holdfastd_log().string();
  options.kill_with_parent = true;  // as etcd (StartEtcd)
  auto process = dev::Subprocess::Spawn(std::move(options));
  if (!process.ok()) return process.status();
  stack.holdfastd = *std::move(process);
  return absl::OkStatus();
}

std::string ExitedMessage(const std::string& what, int code, const fs::path& log) {
  return absl::StrCat(what, " exited with code ", code, LogTail(log, kLogTailLines));
}

// What ended a wait on the stack: nothing (OK), a stop request, or a failure.
struct WaitEnd {
  absl::Status status;      // not OK: a child died or the wait failed
  bool stop_requested = false;
};

// A child that died on its own, as an error.
absl::Status CheckChildren(DevStack& stack) {
  if (!stack.holdfastd->Running()) {
    return absl::InternalError(
        ExitedMessage("holdfastd", *stack.holdfastd->Wait(), stack.holdfastd_log()));
  }
  if (!stack.etcd->process()->Running()) {
    return absl::InternalError(
        ExitedMessage("etcd", *stack.etcd->process()->Wait(), stack.etcd_log()));
  }
  return absl::OkStatus();
}

// Polls Admin.GetEpoch until holdfastd answers, while watching the children and
// the stop signals.
WaitEnd WaitUntilReady(DevStack& stack, Client& client, SignalWaiter& waiter) {
  auto until = std::chrono::steady_clock::now() + kReadyTimeout;
  absl::Status last;
  for (;;) {
    auto epoch = client.GetEpoch();
    if (epoch.ok()) return {};
    last = epoch.status();
    if (auto s = CheckChildren(stack); !s.ok()) return {s};
    if (std::chrono::steady_clock::now() >= until) {
      return {absl::DeadlineExceededError(
          absl::StrCat("holdfastd did not answer within ", kReadyTimeout.count() / 1000,
                       "s (last error: ", last.ToString(), ")",
                       LogTail(stack.holdfastd_log(), kLogTailLines)))};
    }
    auto event = waiter.Wait(kReadyPollInterval);
    if (event.kind == SignalWaiter::Event::Kind::kSignal && event.signal != SIGCHLD) {
      return {absl::OkStatus(), true};
    }
  }
}

// Namespace `default` with a catch-all class in which every lock works: mode S,
// fenced, closed on quorum loss, TTL 1s to 1h.
absl::Status CreateDefaultNamespace(Client& client) {
  v1::CreateNamespaceRequest request;
  request.mutable_namespace_()->set_name("default");
  v1::LockClass* cls = request.mutable_default_class();
  cls->set_mode(v1::LOCK_MODE_SHARED);
  cls->set_enforcement(v1::ENFORCEMENT_FENCED);
  cls->set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
  cls->set_ttl_min_ms(1000);
  cls->set_ttl_max_ms(3'600'000);
  auto ns = client.CreateNamespace(request);
  if (!ns.ok() && ns.status().code() != absl::StatusCode::kAlreadyExists) return ns.status();
  return absl::OkStatus();
}

// Where a shell finds `program` on the PATH ("" if nowhere).
fs::path FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) dir = ".";
    fs::path candidate = fs::path(std::string(dir)) / program;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) {
      return candidate;
    }
  }
  return {};
}

void PrintBanner(const DevStack& stack) {
  std::string flag =
      stack.endpoint == kDefaultEndpoint ? "" : absl::StrCat("--endpoint ", stack.endpoint, " ");
  // The command as it can be typed here: `holdfast` when the PATH finds this
  // binary, else its path (build/bin/holdfast after `make dev`).
  std::string cmd = "holdfast";
  if (const std::string self = dev::SelfDir(); !self.empty()) {
    const fs::path bin = fs::path(self) / "holdfast";
    std::error_code ec;
    const fs::path found = FindOnPath("holdfast");
    if (found.empty() || !fs::equivalent(found, bin, ec)) {
      const fs::path rel = fs::relative(bin, ec);
      cmd = !ec && !rel.empty() && *rel.begin() != ".." ? rel.string() : bin.string();
      // A bare name is looked up on the PATH, not here.
      if (cmd.find('/') == std::string::npos) cmd = "./" + cmd;
    }
  }
  std::cout << "holdfast dev is running\n"
            << "  endpoint:   " << stack.endpoint << "\n"
            << "  etcd:       " << stack.etcd->endpoint() << " (data in "
            << (stack.dir / "etcd").string() << ")\n"
            << "  logs:       " << stack.holdfastd_log().string() << ", "
            << stack.etcd_log().string() << "\n"
            << "  audit:      " << (stack.dir / "audit.db").string() << " (holdfast audit)\n";
  if (stack.pki) {
    std::cout << "  tls:        mTLS, trust domain " << dev::kDevTrustDomain << ", dev CA "
              << (fs::path(dev::DevCaDir(stack.dir.string())) / "ca.pem").string() << "\n"
              << "  identity:   " << dev::kDevCliId << " (a dev admin, as is "
              << dev::kDevOpsAdmins << ")\n"
              << "              in " << fs::path(stack.pki->cli.cert).parent_path().string()
              << "/; the CLI uses it when run here, or anywhere with\n"
              << "              HOLDFAST_DEV_DIR=" << stack.dir.string() << "\n";
  } else {
    std::cout << "  tls:        OFF (--insecure): every caller is spiffe://holdfast.dev/dev, an "
                 "admin\n";
  }
  std::cout << "Try, in another terminal:\n"
            << "  " << cmd << " " << flag << "lock default/demo -- echo hi\n"
            << "  " << cmd << " " << flag << "holders default/demo\n";
  if (stack.pki) {
    std::cout << "  " << cmd << " dev issue-cert --spiffe-id spiffe://holdfast.dev/ops/me --out me/"
              << (stack.dir == fs::absolute(dev::kDefaultDevDir)
                      ? std::string()
                      : " --data-dir " + stack.dir.string())
              << "\n";
  }
  std::cout
            << "Ctrl-C stops holdfastd and etcd; the data is kept for the next start."
            << std::endl;
}

// Blocks until a stop signal (OK) or a child's death (an error).
absl::Status Serve(DevStack& stack, SignalWaiter& waiter) {
  for (;;) {
    auto event = waiter.Wait(std::nullopt);
    if (event.kind == SignalWaiter::Event::Kind::kSignal && event.signal != SIGCHLD) {
      return absl::OkStatus();
    }
    if (auto s = CheckChildren(stack); !s.ok()) return s;
  }
}

// Stops the stack and turns the outcome into an exit code.
int Finish(DevStack& stack, const absl::Status& status, absl::string_view context) {
  if (status.ok()) {
    std::cout << "stopping holdfastd and etcd..." << std::endl;
  }
  stack.Stop();
  if (!status.ok()) return ReportError(status, context);
  std::cout << "stopped; data kept in " << stack.dir.string() << std::endl;
  return kExitOk;
}

int RunDev(const GlobalOptions& /*global*/, const DevFlags& flags) {
  auto listen = ParseEndpoints(flags.listen);
  if (!listen.ok() || listen->size() != 1) {
    return ReportUsageError(absl::InvalidArgumentError(
        absl::StrCat("invalid --listen \"", flags.listen, "\": expected HOST:PORT")));
  }
  // The rule holdfastd applies to insecure (server/config.cc), said before anything starts.
  if (flags.insecure && !net::IsLoopbackEndpoint(flags.listen)) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "--insecure (no TLS) is allowed only on a loopback address (127.0.0.0/8, localhost, "
        "[::1]), not \"", flags.listen, "\"")));
  }
  auto waiter = SignalWaiter::Create({SIGINT, SIGTERM, SIGHUP, SIGCHLD});
  if (!waiter.ok()) return ReportError(waiter.status());

  DevStack stack;
  std::error_code ec;
  stack.dir = fs::absolute(flags.data_dir, ec);
  if (!ec) fs::create_directories(stack.dir, ec);
  if (ec) {
    return ReportError(absl::InternalError(absl::StrCat("cannot create ", flags.data_dir,
                                                        ": ", ec.message())));
  }
  if (auto s = LockDataDir(stack.dir); !s.ok()) return ReportError(s);
  stack.endpoint = ClientAddress(flags.listen);
  if (flags.insecure) {
    PrintMessage(absl::StrCat(
        "WARNING: --insecure: holdfastd serves WITHOUT TLS on ", flags.listen,
        ". Nobody is authenticated: every caller is spiffe://holdfast.dev/dev, an admin. "
        "For loopback development only; never expose this port."));
  } else {
    auto pki = dev::PrepareDevPki(stack.dir.string(), ListenHost(flags.listen));
    if (!pki.ok()) return ReportError(pki.status(), "dev: certificates");
    for (const auto& what : pki->minted) std::cout << "made " << what << "\n";
    stack.pki = *std::move(pki);
  }
  if (auto s = MarkInsecure(stack.dir, flags.insecure); !s.ok()) return ReportError(s, "dev");
  // A port in use would make holdfastd exit at start, after etcd came up and
  // with its reason at the end of a log; and a client waiting for holdfastd to
  // answer there could be answered by whatever listens (another `holdfast dev`).
  if (auto probe = net::CheckCanListen(flags.listen); !probe.ok()) {
    return ReportError(
        absl::Status(probe.code(),
                     absl::StrCat(probe.message(),
                                  " (another `holdfast dev`, or another program, listens "
                                  "there? give another address with --listen HOST:PORT)")),
        "dev");
  }

  if (auto s = StartEtcd(stack); !s.ok()) return ReportError(s, "dev");
  if (auto s = StartHoldfastd(stack, flags.listen); !s.ok()) return Finish(stack, s, "dev");
  ClientOptions client_options;
  client_options.endpoints = {stack.endpoint};
  client_options.rpc_timeout = std::chrono::seconds(5);
  if (stack.pki) {
    client_options.ca_file = stack.pki->cli.bundle;
    client_options.cert_file = stack.pki->cli.cert;
    client_options.key_file = stack.pki->cli.key;
  }
  auto client = Client::Connect(client_options);
  if (!client.ok()) return Finish(stack, client.status(), "dev");
  WaitEnd ready = WaitUntilReady(stack, **client, **waiter);
  if (ready.stop_requested || !ready.status.ok()) {
    return Finish(stack, ready.status, "dev: start");
  }
  if (auto s = CreateDefaultNamespace(**client); !s.ok()) {
    return Finish(stack, s, "dev: create namespace default");
  }
  // Not needed any more; an open channel would only slow holdfastd's shutdown.
  client->reset();
  PrintBanner(stack);
  return Finish(stack, Serve(stack, **waiter), "dev");
}

// `holdfast dev issue-cert`: one more identity signed by the dev CA.
int RunIssueCert(const IssueCertFlags& flags) {
  auto id = spiffe::Parse(flags.spiffe_id);
  if (!id.ok()) {
    return ReportUsageError(
        absl::InvalidArgumentError(absl::StrCat("--spiffe-id: ", id.status().message())));
  }
  if (id->trust_domain != dev::kDevTrustDomain) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "--spiffe-id ", flags.spiffe_id, ": the dev CA signs only trust domain ",
        dev::kDevTrustDomain, ", not \"", id->trust_domain, "\"")));
  }
  if (id->path.empty()) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "--spiffe-id ", flags.spiffe_id,
        " names only the trust domain; a workload needs a path, for example "
        "spiffe://holdfast.dev/team/app")));
  }
  if (flags.out_dir.empty()) {
    return ReportUsageError(absl::InvalidArgumentError("--out DIR is required"));
  }
  auto ca = dev::LoadDevCa(flags.data_dir);
  if (!ca.ok()) return ReportError(ca.status(), "dev issue-cert");
  dev::SvidRequest request;
  request.spiffe_id = id->ToString();
  if (auto s = dev::IssueSvid(*ca, request, flags.out_dir); !s.ok()) {
    return ReportError(s, "dev issue-cert");
  }
  dev::SvidFiles files = dev::SvidFiles::In(flags.out_dir);
  const bool admin = request.spiffe_id == dev::kDevCliId ||
                     spiffe::Matches(request.spiffe_id, dev::kDevOpsAdmins);
  std::cout << "issued " << request.spiffe_id << (admin ? " (a dev admin)" : "")
            << ", signed by the dev CA of " << flags.data_dir << ":\n"
            << "  " << files.cert << "\n  " << files.key << "\n  " << files.bundle << "\n"
            << "use it with:\n"
            << "  holdfast --ca " << files.bundle << " --cert " << files.cert << " --key "
            << files.key << " ..." << std::endl;
  return kExitOk;
}

}  // namespace

void RegisterDevCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<DevFlags>();
  CLI::App* cmd = app.add_subcommand(
      "dev", "Run a single-member etcd and a holdfastd in the foreground (Ctrl-C stops both)");
  cmd->add_option("--listen", flags->listen, "address holdfastd serves on")
      ->capture_default_str();
  cmd->add_option("--data-dir", flags->data_dir,
                  "where etcd's data, the dev CA and the logs are kept")
      ->envname(dev::kDevDirEnv)
      ->capture_default_str();
  cmd->add_flag("--insecure", flags->insecure,
                "serve without TLS (loopback only): every caller is the dev identity");

  auto issue = std::make_shared<IssueCertFlags>();
  CLI::App* issue_cmd = cmd->add_subcommand(
      "issue-cert", "Mint a dev identity (SVID) of trust domain holdfast.dev, signed by the dev CA");
  issue_cmd->add_option("--spiffe-id", issue->spiffe_id,
                        "the identity, e.g. spiffe://holdfast.dev/ops/alice")
      ->required();
  issue_cmd->add_option("--out", issue->out_dir,
                        "directory for svid.pem, svid_key.pem, svid_bundle.pem")
      ->required();
  issue_cmd->add_option("--data-dir", issue->data_dir,
                        "the `holdfast dev` data directory with the dev CA (default: as `dev`)");
  issue_cmd->callback([&ctx, flags, issue] {
    ctx.action = [flags, issue] {
      IssueCertFlags f = *issue;
      if (f.data_dir.empty()) f.data_dir = flags->data_dir;
      return RunIssueCert(f);
    };
  });
  cmd->require_subcommand(0, 1);
  // CLI11 runs this after a subcommand's callback: only a bare `dev` serves.
  cmd->callback([&ctx, flags, cmd] {
    if (!cmd->get_subcommands().empty()) return;
    ctx.action = [&ctx, flags] { return RunDev(ctx.global, *flags); };
  });
}

}  // namespace holdfast::cli
