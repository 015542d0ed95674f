// holdfast-bench: measures holdfast through libholdfast side by side with
// baselines straight on the same etcd. See docs/performance.md.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/str_join.h"
#include "bench/bench.h"
#include "common/duration.h"

namespace {

// SIGINT and SIGTERM stop the run (processes are still stopped at the end);
// SIGUSR1 ends this waiter. Blocked in every thread, taken by sigwait only.
sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

void WaitForSignals(holdfast::bench::StopFlag* stop) {
  sigset_t set = HandledSignals();
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0 || sig == SIGUSR1) return;
    std::fprintf(stderr, "holdfast-bench: signal %d: stopping after the current cell\n", sig);
    stop->Stop();
  }
}

// Parses --duration / --session-ttl text; prints the error and returns false.
bool ParseDurationFlag(const std::string& name, const std::string& text,
                       std::chrono::milliseconds* out) {
  auto d = holdfast::ParseDuration(text);
  if (!d.ok() || d->count() <= 0) {
    std::fprintf(stderr, "holdfast-bench: %s: %s\n", name.c_str(),
                 d.ok() ? "must be positive" : std::string(d.status().message()).c_str());
    return false;
  }
  *out = *d;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  holdfast::bench::BenchOptions o;
  CLI::App app{"holdfast-bench: holdfast against etcd baselines, side by side, in one run"};
  std::string duration, session_ttl;
  int64_t sessions = 0;
  app.add_flag("--short", o.short_run, "the short matrix (~1 s per cell, 1,000 sessions)");
  app.add_option("--duration", duration, "measured time per cell, e.g. 5s or 500ms");
  app.add_option("--json", o.json_path, "write every figure to this file");
  app.add_option("--etcd", o.etcd_endpoint, "use this etcd (loopback host:port)");
  app.add_option("--endpoint", o.holdfast_endpoint,
                 "use this holdfastd (loopback host:port; needs --etcd)");
  app.add_option("--holdfastd", o.holdfastd_binary, "holdfastd binary to start");
  app.add_flag("--tls", o.tls,
               "serve and call holdfastd over mTLS with a dev PKI, as deployed (default: "
               "plaintext on loopback); etcd stays plaintext");
  app.add_option("--sessions", sessions, "sessions in the sessions workload")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  app.add_option("--session-ttl", session_ttl, "TTL of the sessions workload (default 10s, as libholdfast)");
  app.add_option("--rounds", o.rounds,
                 "run the matrix this many times; report each cell's median round and each "
                 "ratio's median (default 1)")
      ->check(CLI::Range(1, 20));
  app.add_option("--concurrency", o.concurrency,
                 "callers of the uncontended and baseline cells, e.g. 1 or 1,8 (default 1,8,64,256; "
                 "--short 1,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  app.add_option("--only", o.only,
                 "run only these workloads (baselines, uncontended, contended, shared, sessions, "
                 "connect)")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"baselines", "uncontended", "contended", "shared", "sessions", "connect"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!duration.empty()) {
    std::chrono::milliseconds d;
    if (!ParseDurationFlag("--duration", duration, &d)) return 2;
    o.duration = d;
  }
  if (!session_ttl.empty() && !ParseDurationFlag("--session-ttl", session_ttl, &o.session_ttl)) {
    return 2;
  }
  if (sessions > 0) o.sessions = sessions;
  o.command_line = absl::StrJoin(argv, argv + argc, " ");

  sigset_t set = HandledSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts
  signal(SIGPIPE, SIG_IGN);
  holdfast::bench::StopFlag stop;
  std::thread waiter(WaitForSignals, &stop);
  int code = 1;
  try {
    code = holdfast::bench::RunBenchmark(o, stop);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "holdfast-bench: %s\n", e.what());
  }
  pthread_kill(waiter.native_handle(), SIGUSR1);
  waiter.join();
  return code;
}
