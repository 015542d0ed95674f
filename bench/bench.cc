#include "bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/environment.h"
#include "bench/etcd_metrics.h"
#include "bench/etcd_workloads.h"
#include "bench/holdfast_workloads.h"
#include "bench/proc_stats.h"
#include "bench/report.h"
#include "holdfast/client.h"

namespace holdfast::bench {

namespace {

constexpr char kNamespace[] = "bench";
// Worker sessions per Client in the cycle workloads (each Client has one
// keepalive stream); sessions per Client in the sessions workload.
constexpr int kSessionsPerClient = 32;
constexpr int kSessionsPerClientMany = 250;
constexpr std::chrono::milliseconds kWorkerSessionTtl{10'000};
// Leases of baseline workers: long enough to outlive a cell without renewal.
constexpr int64_t kBaselineLeaseTtlSeconds = 60;
constexpr std::chrono::seconds kSetupBudget{60};
// The connect workload's paced caller: a cycle every 20 ms, few enough that its
// own cost hardly counts in the cell's, enough for a p99 over a window.
constexpr std::chrono::milliseconds kProbePeriod{20};

using WorkerFactory = std::function<std::vector<std::unique_ptr<Worker>>()>;
using LeaseWorkerFactory =
    std::function<std::vector<std::unique_ptr<Worker>>(const std::vector<int64_t>&)>;
using FleetWorkerFactory = std::function<std::vector<std::unique_ptr<Worker>>(SessionFleet&)>;

std::string RunId() {
  std::random_device rd;
  return absl::StrFormat("%08x", rd());
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

absl::Status CreateBenchNamespace(const ClientOptions& o) {
  auto client = Client::Connect(o);
  if (!client.ok()) return client.status();
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name(kNamespace);
  auto* cls = req.mutable_default_class();
  cls->set_mode(v1::LOCK_MODE_SHARED);
  cls->set_enforcement(v1::ENFORCEMENT_FENCED);
  cls->set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
  cls->set_ttl_min_ms(1000);
  cls->set_ttl_max_ms(3'600'000);
  auto r = (*client)->CreateNamespace(req);
  if (r.ok() || r.status().code() == absl::StatusCode::kAlreadyExists) return absl::OkStatus();
  return r.status();
}

// Runs the cells of one benchmark run and files their figures in a Report.
// Thread-compatible: driven by the run's main thread.
class Matrix {
 public:
  // `round` (1, 2, ...) names the keys of the round apart from other rounds'.
  Matrix(const Plan& plan, const BenchOptions& options, Environment& env, EtcdPool& pool,
         const std::string& run_id, int round, const StopFlag& stop, Report* report)
      : plan_(plan),
        options_(options),
        env_(env),
        pool_(pool),
        run_id_(round == 1 ? run_id : absl::StrCat(run_id, "r", round)),
        round_(round == 1 ? "" : absl::StrCat("r", round)),
        stop_(stop),
        report_(report) {}

  // One round of the matrix; the keepalive and sessions cells only when `last`.
  void Run(bool last) {
    const bool baselines = plan_.Runs("baselines");
    for (int c : plan_.concurrency) {
      if (baselines) {
        EtcdCell(kGuardedTxn, c, GuardedTxnPrefix(Tag("c", c)),
                 [&] { return GuardedTxnWorkers(pool_, c, Tag("c", c)); });
        LeaseCell(kRawCycle, c, [&](const auto& leases) {
          return RawCycleWorkers(pool_, leases, Tag("c", c));
        });
        LeaseCell(kV3Lock, c, [&](const auto& leases) {
          return V3LockWorkers(pool_, leases, Tag("u", c), false, plan_.acquire_wait);
        });
      }
      if (!plan_.Runs("uncontended")) continue;
      FleetCell(kUncontended, c, c, [&](SessionFleet& f) {
        return UncontendedWorkers(f, HoldfastKey("u", c));
      });
    }
    if (baselines) {
      LeaseCell(kV3LockContended, plan_.v3lock_contended, [&](const auto& leases) {
        return V3LockWorkers(pool_, leases, Tag("k", plan_.v3lock_contended), true,
                             plan_.acquire_wait);
      });
    }
    for (int c : plan_.contended) {
      if (!plan_.Runs("contended")) break;
      FleetCell(kContended, c, c, [&](SessionFleet& f) {
        return ContendedWorkers(f, HoldfastKey("k", c), plan_.acquire_wait);
      });
    }
    for (int r : plan_.shared_readers) {
      if (!plan_.Runs("shared")) break;
      FleetCell(kSharedRead, r, r + 1, [&](SessionFleet& f) {
        return SharedWorkers(f, HoldfastKey("s", r), plan_.acquire_wait, plan_.writer_period);
      });
    }
    if (!last) return;
    if (baselines) {
      LeaseCell(kKeepAliveMax, plan_.keepalive_max_callers,
                [&](const auto& leases) { return KeepAliveWorkers(pool_, leases); });
      PacedKeepAliveCell();
    }
    if (plan_.Runs("sessions")) SessionsCell();
    if (plan_.Runs("connect")) {
      for (int c : plan_.connect) ConnectCell(c);
    }
  }

 private:
  std::string Tag(const char* kind, int c) const { return absl::StrCat(kind, c, round_); }
  std::string HoldfastKey(const char* kind, int c) const {
    return absl::StrCat(run_id_, "/", kind, c);
  }
  // Timing of the keepalive cells, in renewal periods (TTL/3, the TTL in whole
  // seconds as holdfastd grants it). Warm-up: at least one period, so every
  // session is in its renewal cycle. Window: a whole number of periods, because
  // sessions opened in a burst renew in bursts.
  Timing SessionTiming() const {
    Timing t = plan_.timing;
    auto period = std::chrono::milliseconds(
        std::chrono::ceil<std::chrono::seconds>(options_.session_ttl)) / 3;
    t.warmup = std::max(t.warmup, period);
    auto periods = std::max<int64_t>(1, (t.measure + period / 2) / period);
    t.measure = period * periods;
    return t;
  }

  void Starting(const char* id, int c) const {
    std::fprintf(stderr, "holdfast-bench: %s c=%d ...\n", id, c);
  }

  // What one cell's operations cost: etcd requests, CPU time and context
  // switches per operation, and etcd's garbage collections per second.
  struct Costs {
    std::map<std::string, double> requests_per_op;
    std::map<std::string, double> cpu_ms_per_op;
    std::map<std::string, double> switches_per_op;
    std::optional<double> etcd_gc_per_sec;
    // The series the per-op figures are of; unset: all series together.
    std::optional<std::string> series;
  };

  // /proc samples so far of etcd and holdfastd (when this run started them) and
  // of the benchmark itself; a process that cannot be read is left out.
  std::map<std::string, ProcSample> ProcNow() const {
    std::map<std::string, ProcSample> now;
    auto add = [&](const char* who, std::optional<pid_t> pid) {
      if (!pid) return;
      if (auto s = SampleProcess(*pid); s.ok()) now[who] = *s;
    };
    add("etcd", env_.etcd_pid());
    add("holdfastd", env_.holdfastd_pid());
    add("bench", getpid());
    return now;
  }

  // Runs the workers, counting the etcd requests, CPU time, context switches and
  // etcd garbage collections they cause, per operation of every series, or of
  // `costs->series` alone when set.
  std::map<std::string, SeriesResult> Measure(std::vector<std::unique_ptr<Worker>>& workers,
                                              Costs* costs) {
    pool_.Settle();
    auto before = ReadEtcdCounters(env_.etcd_endpoint());
    auto proc_before = ProcNow();
    const auto started = SteadyClock::now();
    auto series = RunWorkers(workers, plan_.timing, stop_);
    const auto ended = SteadyClock::now();
    auto proc_after = ProcNow();
    auto after = ReadEtcdCounters(env_.etcd_endpoint());
    int64_t ops = 0;
    for (const auto& [name, r] : series) {
      if (!costs->series || name == *costs->series) ops += r.all_ops;
    }
    if (ops <= 0) return series;
    const double n = static_cast<double>(ops);
    if (before.ok() && after.ok()) {
      for (const auto& [method, count] : after->requests) {
        auto it = before->requests.find(method);
        double delta = count - (it == before->requests.end() ? 0 : it->second);
        if (delta > 0) costs->requests_per_op[method] = delta / n;
      }
      const double seconds = std::chrono::duration<double>(ended - started).count();
      if (before->gc_cycles && after->gc_cycles && seconds > 0) {
        costs->etcd_gc_per_sec = (*after->gc_cycles - *before->gc_cycles) / seconds;
      }
    }
    for (const auto& [who, sample] : proc_after) {
      auto it = proc_before.find(who);
      if (it == proc_before.end()) continue;  // restarted or unreadable meanwhile
      costs->cpu_ms_per_op[who] = (sample.cpu_seconds - it->second.cpu_seconds) * 1000.0 / n;
      costs->switches_per_op[who] =
          static_cast<double>(sample.context_switches - it->second.context_switches) / n;
    }
    return series;
  }

  // Files a cell's figures; a cell cut short by a signal is left out.
  void File(const char* id, int c, const std::map<std::string, SeriesResult>& series,
            const Costs& costs = {}) {
    if (stop_.stopped()) return;
    for (const auto& [name, r] : series) {
      std::string cell_id = id;
      if (name == "write") cell_id = kSharedWrite;
      if (name == "probe") cell_id = kConnectProbe;
      Cell cell;
      cell.id = cell_id;
      cell.concurrency = c;
      cell.result = r;
      if (!costs.series || *costs.series == name) {
        cell.etcd_requests_per_op = costs.requests_per_op;
        cell.cpu_ms_per_op = costs.cpu_ms_per_op;
        cell.switches_per_op = costs.switches_per_op;
      }
      cell.etcd_gc_per_sec = costs.etcd_gc_per_sec;
      report_->AddCell(std::move(cell));
      std::fprintf(stderr, "holdfast-bench:   %s c=%d: %.1f ops/s, p99 %.2f ms, %lld errors\n",
                   cell_id.c_str(), c, r.ops_per_sec, r.latency.p99_ms,
                   static_cast<long long>(r.errors));
    }
  }

  void SetupFailed(const char* id, int c, const absl::Status& s) {
    Cell cell;
    cell.id = id;
    cell.concurrency = c;
    cell.setup_error = s.ToString();
    report_->AddCell(std::move(cell));
    std::fprintf(stderr, "holdfast-bench:   %s c=%d could not run: %s\n", id, c,
                 s.ToString().c_str());
  }

  // A cell straight on etcd whose workers write keys under `written` (below the
  // pool's prefix). They are deleted when the cell ends, as a lease cell's leases
  // are revoked: the tens of thousands of keys a cell writes would otherwise stay
  // in etcd's index through every later cell, and etcd's garbage collector scans
  // that index (docs/performance.md, "What the baseline cells left behind").
  // holdfastd's compaction then takes them out of the index.
  void EtcdCell(const char* id, int c, const std::string& written, const WorkerFactory& make) {
    if (stop_.stopped()) return;
    Starting(id, c);
    {
      auto workers = make();
      Costs costs;
      auto series = Measure(workers, &costs);
      File(id, c, series, costs);
    }
    pool_.DeletePrefix(written);
  }

  void LeaseCell(const char* id, int c, const LeaseWorkerFactory& make) {
    if (stop_.stopped()) return;
    Starting(id, c);
    auto leases = pool_.GrantLeases(c, kBaselineLeaseTtlSeconds,
                                    SteadyClock::now() + kSetupBudget, stop_);
    if (!leases.ok()) return SetupFailed(id, c, leases.status());
    {
      auto workers = make(*leases);
      Costs costs;
      auto series = Measure(workers, &costs);
      File(id, c, series, costs);
    }
    pool_.RevokeLeases(*leases, SteadyClock::now() + kSetupBudget);
  }

  void FleetCell(const char* id, int c, int64_t sessions, const FleetWorkerFactory& make) {
    if (stop_.stopped()) return;
    Starting(id, c);
    auto fleet = SessionFleet::Open(env_.client_options(), kNamespace, sessions,
                                    kSessionsPerClient, kWorkerSessionTtl,
                                    SteadyClock::now() + kSetupBudget, stop_);
    if (!fleet.ok()) return SetupFailed(id, c, fleet.status());
    auto workers = make(**fleet);
    Costs costs;
    auto series = Measure(workers, &costs);
    File(id, c, series, costs);
  }

  // Clients connecting anew, `c` at once, each for one session, with a paced
  // caller beside them on a session of its own; c = 0: the caller alone. The
  // per-op costs are per connection (the caller's few cycles included).
  void ConnectCell(int c) {
    if (stop_.stopped()) return;
    Starting(kConnect, c);
    auto fleet = SessionFleet::Open(env_.client_options(), kNamespace, 1, 1, kWorkerSessionTtl,
                                    SteadyClock::now() + kSetupBudget, stop_);
    if (!fleet.ok()) return SetupFailed(kConnect, c, fleet.status());
    auto workers = ConnectWorkers(env_.client_options(), kNamespace, c);
    workers.push_back(ProbeWorker((*fleet)->session(0), HoldfastKey("p", c), kProbePeriod));
    Costs costs;
    if (c > 0) costs.series = "";
    auto series = Measure(workers, &costs);
    File(kConnect, c, series, costs);
  }

  // The same number of leases as the sessions workload has sessions, renewed on
  // the same schedule (every session TTL / 3). The leases themselves live
  // longer, so that granting 10,000 of them cannot outrun the first renewal.
  void PacedKeepAliveCell() {
    if (stop_.stopped()) return;
    int n = static_cast<int>(plan_.sessions);
    Starting(kKeepAlivePaced, n);
    auto leases = pool_.GrantLeases(n, kBaselineLeaseTtlSeconds,
                                    SteadyClock::now() + kSetupBudget * 2, stop_);
    if (!leases.ok()) return SetupFailed(kKeepAlivePaced, n, leases.status());
    auto granted_ttl = std::chrono::milliseconds(
        std::chrono::ceil<std::chrono::seconds>(options_.session_ttl));
    auto r = RunPacedKeepAlive(pool_.client(0), *leases, granted_ttl, SessionTiming(), stop_);
    File(kKeepAlivePaced, n, {{"", r}});
    pool_.RevokeLeases(*leases, SteadyClock::now() + kSetupBudget * 2);
  }

  // On a fresh holdfastd when this run started it, so that its RSS before the
  // sessions holds no memory freed by earlier cells (which the sessions would
  // reuse, hiding their cost).
  void SessionsCell() {
    if (stop_.stopped()) return;
    Starting("holdfast_sessions", static_cast<int>(plan_.sessions));
    bool fresh = false;
    if (env_.holdfastd_pid()) {
      if (auto s = env_.RestartHoldfastd(); !s.ok()) {
        SessionsResult failed;
        failed.requested = plan_.sessions;
        failed.error = absl::StrCat("restarting holdfastd: ", s.ToString());
        report_->SetSessions(std::move(failed));
        return;
      }
      fresh = true;
    }
    auto r = RunSessionsCell(env_.client_options(), kNamespace, plan_.sessions,
                             kSessionsPerClientMany, options_.session_ttl, SessionTiming(),
                             env_.holdfastd_pid(), env_.etcd_pid(), stop_);
    if (stop_.stopped()) return;  // cut short: its figures would mislead
    r.fresh_holdfastd = fresh;
    std::fprintf(stderr, "holdfast-bench:   sessions: %lld open, %.1f renewals/s %s\n",
                 static_cast<long long>(r.opened), r.renewals_per_sec, r.error.c_str());
    report_->SetSessions(std::move(r));
  }

  const Plan& plan_;
  const BenchOptions& options_;
  Environment& env_;
  EtcdPool& pool_;
  const std::string run_id_;
  const std::string round_;
  const StopFlag& stop_;
  Report* const report_;
};

nlohmann::json RunInfo(const BenchOptions& options, const Plan& plan, const Environment& env,
                       const std::string& load_before) {
  return {{"command", options.command_line},
          {"short", options.short_run},
          {"warmup_ms", plan.timing.warmup.count()},
          {"measure_ms", plan.timing.measure.count()},
          {"concurrency", plan.concurrency},
          {"contended", plan.contended},
          {"shared_readers", plan.shared_readers},
          {"connect", plan.connect},
          {"sessions", plan.sessions},
          {"session_ttl_ms", options.session_ttl.count()},
          {"etcd", env.etcd_endpoint()},
          {"holdfastd", env.holdfast_endpoint()},
          {"holdfastd_tls", env.tls()},
          {"started_etcd", env.etcd_pid().has_value()},
          {"started_holdfastd", env.holdfastd_pid().has_value()},
          {"cores", std::thread::hardware_concurrency()},
          {"loadavg_before", load_before},
          {"loadavg_after", LoadAverage()}};
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

bool Plan::Runs(const std::string& workload) const {
  return only.empty() || std::find(only.begin(), only.end(), workload) != only.end();
}

Plan MakePlan(const BenchOptions& options) {
  Plan p;
  p.only = options.only;
  if (options.short_run) {
    p.concurrency = {1, 8};
    p.contended = {8};
    p.shared_readers = {8};
    p.connect = {0, 8};
    p.sessions = 1'000;
    p.timing = {.warmup = std::chrono::milliseconds(250), .measure = std::chrono::seconds(1)};
  } else {
    p.concurrency = {1, 8, 64, 256};
    p.contended = {8, 64, 256};
    p.shared_readers = {8, 64};
    p.connect = {0, 8, 64};
    p.sessions = 10'000;
    p.timing = {.warmup = std::chrono::seconds(1), .measure = std::chrono::seconds(5)};
  }
  if (options.duration) {
    p.timing.measure = *options.duration;
    p.timing.warmup = std::min<std::chrono::milliseconds>(std::chrono::seconds(1),
                                                          *options.duration / 5);
  }
  if (!options.concurrency.empty()) p.concurrency = options.concurrency;
  if (options.sessions) p.sessions = *options.sessions;
  p.acquire_wait = std::max<std::chrono::milliseconds>(p.timing.measure, std::chrono::seconds(2));
  return p;
}

int RunBenchmark(const BenchOptions& options, const StopFlag& stop) {
  Plan plan = MakePlan(options);
  std::string load_before = LoadAverage();
  auto env = Environment::Start({.etcd_endpoint = options.etcd_endpoint,
                                 .holdfast_endpoint = options.holdfast_endpoint,
                                 .holdfastd_binary = options.holdfastd_binary,
                                 .tls = options.tls});
  if (!env.ok()) {
    std::fprintf(stderr, "holdfast-bench: %s\n", env.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "holdfast-bench: etcd %s, holdfastd %s (%s), load %s\n",
               (*env)->etcd_endpoint().c_str(), (*env)->holdfast_endpoint().c_str(),
               (*env)->tls() ? "mTLS" : "plaintext", load_before.c_str());
  if (auto s = CreateBenchNamespace((*env)->client_options()); !s.ok()) {
    std::fprintf(stderr, "holdfast-bench: cannot create namespace %s: %s\n", kNamespace,
                 s.ToString().c_str());
    return 1;
  }
  std::string run_id = RunId();
  int max_workers = std::max({*std::max_element(plan.concurrency.begin(), plan.concurrency.end()),
                              plan.v3lock_contended, plan.keepalive_max_callers});
  auto pool = EtcdPool::Create((*env)->etcd_endpoint(), max_workers,
                               absl::StrCat("/holdfast-bench/", run_id, "/"));
  if (!pool.ok()) {
    std::fprintf(stderr, "holdfast-bench: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  std::vector<Report> rounds(std::max(1, options.rounds));
  for (size_t i = 0; i < rounds.size() && !stop.stopped(); ++i) {
    if (rounds.size() > 1) {
      std::fprintf(stderr, "holdfast-bench: round %zu of %zu\n", i + 1, rounds.size());
    }
    Matrix(plan, options, **env, **pool, run_id, static_cast<int>(i) + 1, stop, &rounds[i])
        .Run(i + 1 == rounds.size());
  }
  Report report = rounds.size() > 1 ? Report::Combine(rounds) : std::move(rounds[0]);
  (*pool)->DeletePrefix();
  report.SetRunInfo(RunInfo(options, plan, **env, load_before));
  pool->reset();
  (*env)->Stop();

  report.PrintTables(stdout);
  std::printf("\n%s\n", report.BenchLine().c_str());
  std::fflush(stdout);
  int code = 0;
  if (!options.json_path.empty()) {
    if (auto s = WriteJson(options.json_path, report.ToJson()); !s.ok()) {
      std::fprintf(stderr, "holdfast-bench: %s\n", s.ToString().c_str());
      code = 1;
    }
  }
  for (const auto& p : report.Problems(plan.Runs("sessions"))) {
    std::fprintf(stderr, "holdfast-bench: problem: %s\n", p.c_str());
    code = 1;
  }
  if (stop.stopped()) return 130;
  return code;
}

}  // namespace holdfast::bench
