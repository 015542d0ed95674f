#include "bench/report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace holdfast::bench {

namespace {

enum class Metric { kThroughput, kP99 };
constexpr int kSameConcurrency = -1;

// holdfast (and v3lock) cells against the baselines they are read against.
struct RatioRule {
  const char* cell;
  const char* name;
  const char* baseline;
  int baseline_concurrency;  // kSameConcurrency: the cell's own
  Metric metric;
};

constexpr RatioRule kRatioRules[] = {
    {kUncontended, "vs_raw_cycle", kRawCycle, kSameConcurrency, Metric::kThroughput},
    {kUncontended, "vs_guarded_txn", kGuardedTxn, kSameConcurrency, Metric::kThroughput},
    {kUncontended, "vs_v3lock", kV3Lock, kSameConcurrency, Metric::kThroughput},
    {kUncontended, "p99_vs_raw_cycle", kRawCycle, kSameConcurrency, Metric::kP99},
    {kContended, "vs_v3lock_contended_8", kV3LockContended, 8, Metric::kThroughput},
    {kContended, "vs_raw_cycle_1", kRawCycle, 1, Metric::kThroughput},
    {kSharedRead, "vs_raw_cycle", kRawCycle, kSameConcurrency, Metric::kThroughput},
    {kSharedRead, "p99_vs_raw_cycle", kRawCycle, kSameConcurrency, Metric::kP99},
    {kV3Lock, "vs_raw_cycle", kRawCycle, kSameConcurrency, Metric::kThroughput},
    {kV3LockContended, "vs_raw_cycle_1", kRawCycle, 1, Metric::kThroughput},
    {kConnectProbe, "p99_vs_alone", kConnectProbe, 0, Metric::kP99},
};

const char* Label(const std::string& id) {
  static const std::map<std::string, const char*> kLabels = {
      {kGuardedTxn, "etcd guarded txn (put if absent)"},
      {kRawCycle, "etcd grant+release (2 guarded txns)"},
      {kV3Lock, "etcd v3lock Lock+Unlock"},
      {kV3LockContended, "etcd v3lock, one name"},
      {kKeepAliveMax, "etcd LeaseKeepAlive, max rate"},
      {kKeepAlivePaced, "etcd LeaseKeepAlive, every ttl/3"},
      {kUncontended, "holdfast acquire+release"},
      {kContended, "holdfast, one key (hand-overs)"},
      {kSharedRead, "holdfast shared readers"},
      {kSharedWrite, "holdfast writer (every 100 ms)"},
      {kConnect, "holdfast new client+session"},
      {kConnectProbe, "holdfast caller beside them"},
  };
  auto it = kLabels.find(id);
  return it == kLabels.end() ? "?" : it->second;
}

std::optional<double> Ratio(double num, double den) {
  if (den <= 0 || num < 0) return std::nullopt;
  return num / den;
}

std::string Fixed(std::optional<double> v, int digits = 2) {
  return v ? absl::StrFormat("%.*f", digits, *v) : "n/a";
}

// "Txn 3.0, Range 1.0": methods with at least 0.05 requests per op.
std::string RequestsText(const std::map<std::string, double>& per_op) {
  std::string out;
  for (const auto& [method, n] : per_op) {
    if (n < 0.05) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", method, absl::StrFormat(" %.1f", n));
  }
  return out.empty() ? "-" : out;
}

// "2.10 1.40 0.45": etcd, holdfastd and the benchmark, "-" for a process not
// measured; `decimals` after the point.
std::string PerProcessText(const std::map<std::string, double>& per_op, int decimals = 2) {
  std::string out;
  for (const char* who : {"etcd", "holdfastd", "bench"}) {
    auto it = per_op.find(who);
    absl::StrAppend(&out, out.empty() ? "" : " ",
                    it == per_op.end() ? std::string("-")
                                       : absl::StrFormat("%.*f", decimals, it->second));
  }
  return out;
}

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

nlohmann::json SeriesJson(const SeriesResult& r) {
  return {{"workers", r.workers},
          {"ops", r.ops},
          {"all_ops", r.all_ops},
          {"errors", r.errors},
          {"timeouts", r.timeouts},
          {"seconds", r.seconds},
          {"ops_per_sec", r.ops_per_sec},
          {"latency_ms",
           {{"mean", r.latency.mean_ms},
            {"p50", r.latency.p50_ms},
            {"p99", r.latency.p99_ms},
            {"max", r.latency.max_ms}}},
          {"first_error", r.first_error}};
}

template <class T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

const Cell* Report::Find(const std::string& id, int concurrency) const {
  for (const auto& c : cells_) {
    if (c.id == id && c.concurrency == concurrency && c.setup_error.empty()) return &c;
  }
  return nullptr;
}

std::map<std::string, double> Report::RatiosOf(const Cell& cell) const {
  std::map<std::string, double> out;
  for (const auto& rule : kRatioRules) {
    if (cell.id != rule.cell) continue;
    int conc = rule.baseline_concurrency == kSameConcurrency ? cell.concurrency
                                                              : rule.baseline_concurrency;
    const Cell* base = Find(rule.baseline, conc);
    if (!base || !cell.setup_error.empty()) continue;
    auto r = rule.metric == Metric::kThroughput
                 ? Ratio(cell.result.ops_per_sec, base->result.ops_per_sec)
                 : Ratio(cell.result.latency.p99_ms, base->result.latency.p99_ms);
    if (r) out[rule.name] = *r;
  }
  return out;
}

std::map<std::string, double> Report::SessionRatios() const {
  std::map<std::string, double> out;
  if (!sessions_ || !sessions_->error.empty()) return out;
  for (const auto& c : cells_) {
    if (!c.setup_error.empty()) continue;
    const char* name = c.id == kKeepAlivePaced ? "vs_keepalive_paced"
                       : c.id == kKeepAliveMax ? "vs_keepalive_max"
                                               : nullptr;
    if (!name) continue;
    if (auto r = Ratio(sessions_->renewals_per_sec, c.result.ops_per_sec)) out[name] = *r;
  }
  return out;
}

namespace {

// The median of the values present (the lower middle one of an even count).
std::optional<double> MedianOf(std::vector<std::optional<double>> values) {
  std::vector<double> v;
  for (const auto& x : values) {
    if (x) v.push_back(*x);
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

Report Report::Combine(const std::vector<Report>& rounds) {
  Report out;
  if (rounds.empty()) return out;
  // Cells in the order of the first round that has each (id, concurrency).
  std::vector<std::pair<std::string, int>> order;
  for (const auto& r : rounds) {
    for (const auto& c : r.cells_) {
      std::pair<std::string, int> k{c.id, c.concurrency};
      if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
    }
  }
  for (const auto& [id, conc] : order) {
    std::vector<const Cell*> ran, failed;
    for (const auto& r : rounds) {
      for (const auto& c : r.cells_) {
        if (c.id != id || c.concurrency != conc) continue;
        (c.setup_error.empty() ? ran : failed).push_back(&c);
      }
    }
    // A cell that could not run in some round stays visible (Problems).
    for (const Cell* c : failed) out.cells_.push_back(*c);
    if (ran.empty()) continue;
    std::sort(ran.begin(), ran.end(), [](const Cell* a, const Cell* b) {
      return a->result.ops_per_sec < b->result.ops_per_sec;
    });
    out.cells_.push_back(*ran[(ran.size() - 1) / 2]);
  }
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    if (it->sessions_) {
      out.sessions_ = it->sessions_;
      break;
    }
  }
  for (const auto& r : rounds) {
    out.rounds_.push_back(r.OwnHeadline());
    out.round_cells_.push_back(r.cells_);
  }
  return out;
}

Headline Report::ComputeHeadline() const {
  if (rounds_.empty()) return OwnHeadline();
  Headline h;
  std::vector<std::optional<double>> r1, r2, r3, r4;
  for (const auto& r : rounds_) {
    r1.push_back(r.uncontended_vs_raw_cycle);
    r2.push_back(r.contended_vs_etcd_lock);
    r3.push_back(r.p99_uncontended_vs_raw);
    r4.push_back(r.keepalive_vs_raw);
    h.r1_concurrency = std::max(h.r1_concurrency, r.r1_concurrency);
  }
  h.uncontended_vs_raw_cycle = MedianOf(r1);
  h.contended_vs_etcd_lock = MedianOf(r2);
  h.p99_uncontended_vs_raw = MedianOf(r3);
  h.keepalive_vs_raw = MedianOf(r4);
  return h;
}

Headline Report::OwnHeadline() const {
  Headline h;
  for (const auto& c : cells_) {
    if (c.id != kUncontended || c.concurrency < h.r1_concurrency) continue;
    auto ratios = RatiosOf(c);
    if (auto it = ratios.find("vs_raw_cycle"); it != ratios.end()) {
      h.uncontended_vs_raw_cycle = it->second;
      h.r1_concurrency = c.concurrency;
    }
  }
  if (const Cell* c = Find(kContended, 8)) {
    auto ratios = RatiosOf(*c);
    if (auto it = ratios.find("vs_v3lock_contended_8"); it != ratios.end()) {
      h.contended_vs_etcd_lock = it->second;
    }
  }
  if (const Cell* c = Find(kUncontended, 1)) {
    auto ratios = RatiosOf(*c);
    if (auto it = ratios.find("p99_vs_raw_cycle"); it != ratios.end()) {
      h.p99_uncontended_vs_raw = it->second;
    }
  }
  auto sessions = SessionRatios();
  if (auto it = sessions.find("vs_keepalive_paced"); it != sessions.end()) {
    h.keepalive_vs_raw = it->second;
  }
  return h;
}

std::vector<std::string> Report::Problems(bool sessions_planned) const {
  std::vector<std::string> out;
  for (const auto& c : cells_) {
    std::string name = absl::StrCat(c.id, " c=", c.concurrency);
    if (!c.setup_error.empty()) {
      out.push_back(absl::StrCat(name, ": could not run: ", c.setup_error));
    } else if (c.result.ops == 0) {
      out.push_back(absl::StrCat(name, ": no operation completed (errors ", c.result.errors,
                                 ", timeouts ", c.result.timeouts, ") ", c.result.first_error));
    }
  }
  if (!sessions_) {
    if (sessions_planned) out.push_back("sessions: not run");
  } else if (!sessions_->error.empty()) {
    out.push_back(absl::StrCat("sessions: ", sessions_->error));
  } else if (sessions_->renewals_per_sec <= 0) {
    out.push_back("sessions: no renewal confirmed in the window");
  }
  return out;
}

void Report::PrintCellTable(std::FILE* out, const std::string& title,
                            const std::vector<std::string>& ids) const {
  std::vector<std::string> ratio_names;
  for (const auto& rule : kRatioRules) {
    if (std::find(ids.begin(), ids.end(), rule.cell) != ids.end() &&
        std::find(ratio_names.begin(), ratio_names.end(), rule.name) == ratio_names.end()) {
      ratio_names.push_back(rule.name);
    }
  }
  std::fprintf(out, "\n== %s ==\n", title.c_str());
  std::string header = absl::StrFormat("%-36s %5s %10s %8s %8s %8s %7s %8s", "workload", "conc",
                                       "ops/s", "p50 ms", "p99 ms", "max ms", "errors", "timeouts");
  for (const auto& n : ratio_names) absl::StrAppend(&header, absl::StrFormat(" %22s", n));
  absl::StrAppend(&header, absl::StrFormat(" %25s", "CPU ms/op etcd hfd bench"));
  absl::StrAppend(&header, absl::StrFormat(" %26s", "switches/op etcd hfd bench"));
  absl::StrAppend(&header, absl::StrFormat(" %10s", "etcd GC/s"));
  absl::StrAppend(&header, "  etcd requests per op");
  std::fprintf(out, "%s\n", header.c_str());
  for (const auto& c : cells_) {
    if (std::find(ids.begin(), ids.end(), c.id) == ids.end()) continue;
    if (!c.setup_error.empty()) {
      std::fprintf(out, "%-36s %5d  could not run: %s\n", Label(c.id), c.concurrency,
                   c.setup_error.c_str());
      continue;
    }
    const auto& r = c.result;
    std::string row = absl::StrFormat(
        "%-36s %5d %10.1f %8.2f %8.2f %8.2f %7d %8d", Label(c.id), c.concurrency, r.ops_per_sec,
        r.latency.p50_ms, r.latency.p99_ms, r.latency.max_ms, r.errors, r.timeouts);
    auto ratios = RatiosOf(c);
    for (const auto& n : ratio_names) {
      auto it = ratios.find(n);
      absl::StrAppend(&row, absl::StrFormat(" %22s", it == ratios.end() ? "-" : Fixed(it->second)));
    }
    absl::StrAppend(&row, absl::StrFormat(" %25s", PerProcessText(c.cpu_ms_per_op)));
    absl::StrAppend(&row, absl::StrFormat(" %26s", PerProcessText(c.switches_per_op, 1)));
    absl::StrAppend(&row, absl::StrFormat(
                              " %10s", c.etcd_gc_per_sec ? Fixed(*c.etcd_gc_per_sec, 1) : "-"));
    absl::StrAppend(&row, "  ", RequestsText(c.etcd_requests_per_op));
    std::fprintf(out, "%s\n", row.c_str());
    if (!r.first_error.empty()) std::fprintf(out, "    first error: %s\n", r.first_error.c_str());
  }
}

void Report::PrintSessions(std::FILE* out) const {
  if (!sessions_) return;
  const auto& s = *sessions_;
  std::fprintf(out, "\n== sessions: %lld holdfast sessions kept alive ==\n",
               static_cast<long long>(s.requested));
  if (!s.error.empty()) {
    std::fprintf(out, "could not run: %s\n", s.error.c_str());
    return;
  }
  std::fprintf(out, "%-28s %lld in %.1f s (%.0f/s); lost by the end: %lld\n", "opened",
               static_cast<long long>(s.opened), s.open_seconds,
               s.open_seconds > 0 ? static_cast<double>(s.opened) / s.open_seconds : 0.0,
               static_cast<long long>(s.lost));
  auto ratios = SessionRatios();
  auto ratio = [&](const char* name) {
    auto it = ratios.find(name);
    return it == ratios.end() ? std::optional<double>() : std::optional<double>(it->second);
  };
  std::fprintf(out, "%-28s %.1f (offered %.1f); vs etcd keepalive paced %s, vs max rate %s\n",
               "renewals/s", s.renewals_per_sec, s.offered_renewals_per_sec,
               Fixed(ratio("vs_keepalive_paced")).c_str(),
               Fixed(ratio("vs_keepalive_max")).c_str());
  if (s.cpu_cores) {
    std::fprintf(out, "%-28s %.2f cores; %s us CPU per renewal\n", "holdfastd CPU", *s.cpu_cores,
                 Fixed(s.cpu_us_per_renewal, 1).c_str());
  }
  if (s.rss_before_bytes && s.rss_after_bytes) {
    std::fprintf(out, "%-28s %s before%s, %s with the sessions: %s bytes per session\n",
                 "holdfastd RSS", MiB(*s.rss_before_bytes).c_str(),
                 s.fresh_holdfastd ? " (fresh process)" : "", MiB(*s.rss_after_bytes).c_str(),
                 Fixed(s.rss_bytes_per_session, 0).c_str());
  }
  if (s.etcd_cpu_cores) std::fprintf(out, "%-28s %.2f cores\n", "etcd CPU", *s.etcd_cpu_cores);
  if (s.client_cpu_cores) {
    std::fprintf(out, "%-28s %.2f cores\n", "client CPU (libholdfast)", *s.client_cpu_cores);
  }
}

void Report::PrintTables(std::FILE* out) const {
  if (!rounds_.empty()) {
    std::fprintf(out, "\n== %zu rounds: each cell below is its median round; the bench: line "
                      "gives each ratio's median over the rounds ==\n", rounds_.size());
    for (size_t i = 0; i < rounds_.size(); ++i) {
      const Headline& h = rounds_[i];
      std::fprintf(out, "round %zu: uncontended_vs_raw_cycle=%s contended_vs_etcd_lock=%s "
                        "p99_uncontended_vs_raw=%s keepalive_vs_raw=%s\n", i + 1,
                   Fixed(h.uncontended_vs_raw_cycle).c_str(),
                   Fixed(h.contended_vs_etcd_lock).c_str(),
                   Fixed(h.p99_uncontended_vs_raw).c_str(), Fixed(h.keepalive_vs_raw).c_str());
    }
  }
  PrintCellTable(out, "baselines: straight on etcd",
                 {kGuardedTxn, kRawCycle, kV3Lock, kV3LockContended, kKeepAliveMax,
                  kKeepAlivePaced});
  PrintCellTable(out, "uncontended: acquire+release cycles on distinct keys", {kUncontended});
  PrintCellTable(out,
                 "contended: clients on one key, waiting acquires (ops/s = hand-overs/s; "
                 "latency = the acquire, wait included; the release follows unmeasured)",
                 {kContended});
  PrintCellTable(out, "shared: readers on one key, one occasional writer",
                 {kSharedRead, kSharedWrite});
  PrintCellTable(out,
                 "connect: clients connecting anew for every session (conc = how many at "
                 "once), and one caller beside them doing a cycle every 20 ms (conc 0: alone)",
                 {kConnect, kConnectProbe});
  PrintSessions(out);
}

std::string Report::BenchLine() const {
  Headline h = ComputeHeadline();
  return absl::StrCat("bench: uncontended_vs_raw_cycle=", Fixed(h.uncontended_vs_raw_cycle),
                      " contended_vs_etcd_lock=", Fixed(h.contended_vs_etcd_lock),
                      " p99_uncontended_vs_raw=", Fixed(h.p99_uncontended_vs_raw),
                      " keepalive_vs_raw=", Fixed(h.keepalive_vs_raw));
}

nlohmann::json Report::ToJson() const {
  // Ratios of a round's own cells are those of that round: `of` answers them.
  auto cells_json = [](const std::vector<Cell>& list, const Report& of) {
    nlohmann::json cells = nlohmann::json::array();
    for (const auto& c : list) {
      nlohmann::json j = {{"id", c.id}, {"label", Label(c.id)}, {"concurrency", c.concurrency}};
      if (!c.setup_error.empty()) {
        j["setup_error"] = c.setup_error;
      } else {
        j.update(SeriesJson(c.result));
        j["ratios"] = of.RatiosOf(c);
        j["etcd_requests_per_op"] = c.etcd_requests_per_op;
        j["cpu_ms_per_op"] = c.cpu_ms_per_op;
        j["switches_per_op"] = c.switches_per_op;
        if (c.etcd_gc_per_sec) j["etcd_gc_per_sec"] = *c.etcd_gc_per_sec;
      }
      cells.push_back(std::move(j));
    }
    return cells;
  };
  nlohmann::json cells = cells_json(cells_, *this);
  nlohmann::json sessions = nullptr;
  if (sessions_) {
    const auto& s = *sessions_;
    sessions = {{"requested", s.requested},
                {"opened", s.opened},
                {"lost", s.lost},
                {"open_seconds", s.open_seconds},
                {"seconds", s.seconds},
                {"renewals_per_sec", s.renewals_per_sec},
                {"offered_renewals_per_sec", s.offered_renewals_per_sec},
                {"holdfastd_cpu_cores", OrNull(s.cpu_cores)},
                {"holdfastd_cpu_us_per_renewal", OrNull(s.cpu_us_per_renewal)},
                {"holdfastd_rss_before_bytes", OrNull(s.rss_before_bytes)},
                {"holdfastd_rss_after_bytes", OrNull(s.rss_after_bytes)},
                {"holdfastd_rss_bytes_per_session", OrNull(s.rss_bytes_per_session)},
                {"etcd_cpu_cores", OrNull(s.etcd_cpu_cores)},
                {"client_cpu_cores", OrNull(s.client_cpu_cores)},
                {"fresh_holdfastd", s.fresh_holdfastd},
                {"ratios", SessionRatios()},
                {"error", s.error}};
  }
  Headline h = ComputeHeadline();
  nlohmann::json headline = {
      {"uncontended_vs_raw_cycle", OrNull(h.uncontended_vs_raw_cycle)},
      {"uncontended_vs_raw_cycle_concurrency", h.r1_concurrency},
      {"contended_vs_etcd_lock", OrNull(h.contended_vs_etcd_lock)},
      {"p99_uncontended_vs_raw", OrNull(h.p99_uncontended_vs_raw)},
      {"keepalive_vs_raw", OrNull(h.keepalive_vs_raw)}};
  nlohmann::json rounds = nlohmann::json::array();
  for (size_t i = 0; i < rounds_.size(); ++i) {
    const Headline& r = rounds_[i];
    Report round;
    round.cells_ = round_cells_[i];
    rounds.push_back({{"uncontended_vs_raw_cycle", OrNull(r.uncontended_vs_raw_cycle)},
                      {"contended_vs_etcd_lock", OrNull(r.contended_vs_etcd_lock)},
                      {"p99_uncontended_vs_raw", OrNull(r.p99_uncontended_vs_raw)},
                      {"keepalive_vs_raw", OrNull(r.keepalive_vs_raw)},
                      {"cells", cells_json(round.cells_, round)}});
  }
  return {{"run", run_info_},
          {"rounds", rounds},
          {"cells", cells},
          {"sessions", sessions},
          {"headline", headline},
          {"bench_line", BenchLine()},
          {"problems", Problems()}};
}

}  // namespace holdfast::bench
