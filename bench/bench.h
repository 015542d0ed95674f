// holdfast-bench: one run of the benchmark matrix, holdfast side by side with
// its baselines on the same etcd.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/runner.h"

namespace holdfast::bench {

struct BenchOptions {
  bool short_run = false;
  // Length of each cell's measured window (default: 5 s, --short 1 s).
  std::optional<std::chrono::milliseconds> duration;
  std::string json_path;          // write every figure here when set
  std::string etcd_endpoint;      // use this etcd instead of starting one
  std::string holdfast_endpoint;  // use this holdfastd instead of starting one
  std::string holdfastd_binary;   // default: holdfastd next to holdfast-bench
  // Serve and call holdfastd over mTLS (--tls), as deployed; default plaintext on
  // loopback (holdfastd --insecure). See EnvironmentOptions::tls.
  bool tls = false;
  // Callers of the uncontended and baseline cells (--concurrency); empty: the
  // matrix's (1, 8, 64, 256; --short 1, 8).
  std::vector<int> concurrency;
  std::optional<int64_t> sessions;  // sessions workload size (default 10,000, --short 1,000)
  // TTL of the sessions workload: libholdfast's default.
  std::chrono::milliseconds session_ttl{10'000};
  std::string command_line;       // recorded in the JSON
  // Workloads to run (--only): any of baselines, uncontended, contended, shared,
  // sessions, connect. Empty: all. Ratios whose cells were not run are not printed.
  std::vector<std::string> only;
  // Rounds of the matrix (--rounds): the figures are each cell's median round and
  // each ratio's median over the rounds (Report::Combine). The keepalive
  // baselines and the sessions and connect workloads run once, in the last round.
  int rounds = 1;
};

// What one run measures.
struct Plan {
  std::vector<int> concurrency;     // uncontended and baselines
  std::vector<int> contended;       // clients on one key
  std::vector<int> shared_readers;  // readers on one key (plus one writer)
  std::vector<int> connect;         // clients connecting at once (0: the probe alone)
  int v3lock_contended = 8;
  int keepalive_max_callers = 64;
  int64_t sessions = 10'000;
  Timing timing;
  std::chrono::milliseconds acquire_wait{5000};  // bound of every waiting acquire
  std::chrono::milliseconds writer_period{100};  // the shared workload's writer
  std::vector<std::string> only;                 // BenchOptions::only
  bool Runs(const std::string& workload) const;
};

Plan MakePlan(const BenchOptions& options);

// Runs the matrix and prints the tables and the `bench:` line to stdout
// (progress to stderr). Returns the process exit code: 0 when every cell ran,
// 1 when the run could not start or a cell failed, 130 when stopped by a signal.
int RunBenchmark(const BenchOptions& options, const StopFlag& stop);

}  // namespace holdfast::bench
