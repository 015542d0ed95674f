// The figures of one benchmark run: tables with ratios to the baselines, the
// one-line summary and the JSON document.
//
// Thread-compatible: filled by the run's main thread.
#pragma once

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/holdfast_workloads.h"
#include "bench/runner.h"

namespace holdfast::bench {

// Cell ids (stable: they are the JSON's keys).
inline constexpr char kGuardedTxn[] = "etcd_guarded_txn";
inline constexpr char kRawCycle[] = "etcd_grant_release";
inline constexpr char kV3Lock[] = "etcd_v3lock";
inline constexpr char kV3LockContended[] = "etcd_v3lock_contended";
inline constexpr char kKeepAliveMax[] = "etcd_keepalive_max";
inline constexpr char kKeepAlivePaced[] = "etcd_keepalive_paced";
inline constexpr char kUncontended[] = "holdfast_uncontended";
inline constexpr char kContended[] = "holdfast_contended";
inline constexpr char kSharedRead[] = "holdfast_shared_read";
inline constexpr char kSharedWrite[] = "holdfast_shared_write";
// New clients connecting (concurrency: how many at once), and the paced caller
// beside them (concurrency: the same; 0 is the caller alone, the reference).
inline constexpr char kConnect[] = "holdfast_connect";
inline constexpr char kConnectProbe[] = "holdfast_connect_probe";

struct Cell {
  std::string id;
  int concurrency = 0;
  SeriesResult result;
  std::string setup_error;  // the cell could not run
  // etcd requests received during the cell (from etcd's /metrics) per operation
  // completed, by gRPC method; all series of the cell together.
  std::map<std::string, double> etcd_requests_per_op;
  // CPU time (user + system, ms) per operation completed, by process: "etcd" and
  // "holdfastd" when this run started them, "bench" (the benchmark's own callers
  // and client libraries) always; over the same window as etcd_requests_per_op.
  // On a machine whose cores the processes share, it tells what bounds a cell.
  std::map<std::string, double> cpu_ms_per_op;
  // Context switches (voluntary and involuntary, of all threads) per operation,
  // by process as cpu_ms_per_op: how often a process's threads hand work to
  // each other or wait, which at one caller is latency.
  std::map<std::string, double> switches_per_op;
  // etcd's garbage collections per second over the cell (warm-up included). At
  // one caller the slowest cycles are the ones a collection overlaps, so this
  // rate explains much of a cell's p99 (docs/performance.md, "One caller's p99").
  std::optional<double> etcd_gc_per_sec;
};

// The four figures of the `bench:` line; nullopt when a cell is missing.
struct Headline {
  std::optional<double> uncontended_vs_raw_cycle;  // R1, at the highest concurrency
  int r1_concurrency = 0;
  std::optional<double> contended_vs_etcd_lock;    // R2, 8 clients
  std::optional<double> p99_uncontended_vs_raw;    // R3, concurrency 1
  std::optional<double> keepalive_vs_raw;          // R4
};

class Report {
 public:
  void AddCell(Cell cell) { cells_.push_back(std::move(cell)); }
  void SetSessions(SessionsResult sessions) { sessions_ = std::move(sessions); }
  // Free-form facts about the run for the JSON ("command", load, ...).
  void SetRunInfo(nlohmann::json info) { run_info_ = std::move(info); }

  const Cell* Find(const std::string& id, int concurrency) const;
  // Ratios of one cell to its baselines, by name (see kRatioRules in report.cc).
  std::map<std::string, double> RatiosOf(const Cell& cell) const;
  // holdfast session renewals/s against the raw LeaseKeepAlive cells, by name
  // ("vs_keepalive_paced", "vs_keepalive_max").
  std::map<std::string, double> SessionRatios() const;
  // The headline of this report's own cells; for a combined report, each ratio
  // is the median of its values over the rounds (see Combine).
  Headline ComputeHeadline() const;
  // Several rounds of the matrix in one run (--rounds): each cell is the round
  // whose ops/s is the median for that cell (the lower of the middle two for an
  // even count), and each headline ratio the median of the ratios computed within
  // each round, so that a ratio always compares cells measured minutes apart at
  // most, never the best holdfast round with the worst baseline round. The
  // sessions figures are the last round's that has them.
  static Report Combine(const std::vector<Report>& rounds);
  // The headline of each round of a combined report (empty otherwise).
  const std::vector<Headline>& rounds() const { return rounds_; }
  // Problems that make the run a failure: cells that could not run or finished
  // no operation. Empty when the harness worked.
  std::vector<std::string> Problems(bool sessions_planned = true) const;

  void PrintTables(std::FILE* out) const;
  // "bench: uncontended_vs_raw_cycle=R1 contended_vs_etcd_lock=R2 ..."
  std::string BenchLine() const;
  nlohmann::json ToJson() const;

 private:
  void PrintCellTable(std::FILE* out, const std::string& title,
                      const std::vector<std::string>& ids) const;
  void PrintSessions(std::FILE* out) const;

  Headline OwnHeadline() const;

  std::vector<Cell> cells_;
  std::optional<SessionsResult> sessions_;
  std::vector<Headline> rounds_;
  std::vector<std::vector<Cell>> round_cells_;  // every round's own cells
  nlohmann::json run_info_ = nlohmann::json::object();
};

}  // namespace holdfast::bench
