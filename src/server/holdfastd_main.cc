// holdfastd: the lock server. Everything but flag parsing lives in server/.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include "server/config.h"
#include "server/allocator.h"
#include "server/server.h"

int main(int argc, char** argv) {
  holdfast::server::SetUpAllocator();  // before any thread: server/allocator.h
  // Debian's Abseil is built with Mutex deadlock detection on: every lock taken
  // while another is held updates a global lock graph (~3% of holdfastd's CPU
  // under load, docs/performance.md). The unit tests keep it; the server does
  // not pay for it unless HOLDFAST_MUTEX_DEADLOCK_DETECTION=1.
  if (const char* v = std::getenv("HOLDFAST_MUTEX_DEADLOCK_DETECTION"); v == nullptr ||
                                                                          std::string(v) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  CLI::App app{"holdfastd: the holdfast lock server"};
  std::string config_path, listen, etcd;
  app.add_option("--config", config_path, "YAML config file");
  app.add_option("--listen", listen, "gRPC listen address host:port (default 127.0.0.1:7420)");
  app.add_option("--etcd", etcd, "etcd endpoints, comma-separated host:port");
  bool etcd_plaintext = false;
  app.add_flag("--etcd-plaintext", etcd_plaintext,
               "plaintext to etcd endpoints that are not loopback addresses, without etcd TLS "
               "(as etcd.plaintext: a network path protected otherwise)");
  std::string audit_store;
  app.add_option("--audit-store", audit_store,
                 "audit store URL: sqlite:PATH or postgresql://... (\"none\": no audit)");
  std::string metrics_listen;
  auto* metrics_flag = app.add_option(
      "--metrics-listen", metrics_listen,
      "serve Prometheus metrics at host:port/metrics: HTTPS to metrics.readers and "
      "admin_ids when serving mTLS, else (insecure, metrics.plaintext) HTTP (\"\": off)");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "serve without TLS (loopback addresses only; every caller is the dev identity)");
  CLI11_PARSE(app, argc, argv);

  holdfast::server::ConfigFlags flags;
  auto given = [&app](const char* name) { return app.count(name) > 0; };
  if (given("--listen")) flags.listen = listen;
  if (given("--etcd")) flags.etcd = etcd;
  if (given("--audit-store")) flags.audit_store = audit_store;
  if (metrics_flag->count() > 0) flags.metrics_listen = metrics_listen;
  flags.insecure = insecure;
  flags.etcd_plaintext = etcd_plaintext;
  auto loaded = holdfast::server::LoadConfig(config_path, flags);
  if (!loaded.ok()) {
    std::fprintf(stderr, "holdfastd: %s\n", std::string(loaded.status().message()).c_str());
    return 2;
  }
  holdfast::server::Config config = *std::move(loaded);

  // Signals are taken by sigwait on the main thread, never by a handler.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  holdfast::server::Server server(config);
  if (auto s = server.Start(); !s.ok()) {
    std::fprintf(stderr, "holdfastd: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "holdfastd: serving on %s (etcd %s; %s)\n", server.bound_address().c_str(),
               holdfast::server::EffectiveClusters(config).front().endpoints.front().c_str(),
               holdfast::server::AllocatorInUse().c_str());
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "holdfastd: signal %d, shutting down\n", sig);
  server.Shutdown();
  return 0;
}
