#include "bench/holdfast_workloads.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/proc_stats.h"

namespace holdfast::bench {

namespace {

constexpr std::chrono::seconds kRpcTimeout{5};
constexpr int kOpenThreads = 32;
constexpr int kCloseThreads = 32;
constexpr std::chrono::seconds kCloseBudget{120};
// Opening sessions may take this long per session (plus a fixed margin).
constexpr std::chrono::milliseconds kOpenBudgetPerSession{10};
constexpr std::chrono::seconds kOpenBudgetMargin{30};

// Acquire then Release of one key; optionally paced to one cycle per `period`.
class AcquireReleaseWorker : public Worker {
 public:
  AcquireReleaseWorker(Session* session, std::string key, AcquireOptions options,
                       std::string series, std::chrono::milliseconds period)
      : session_(session),
        key_(std::move(key)),
        options_(std::move(options)),
        series_(std::move(series)),
        period_(period) {}

  absl::Status Op() override {
    auto hold = session_->Acquire(key_, options_);
    if (!hold.ok()) return hold.status();
    return hold->Release();
  }

  void Pace(SteadyClock::time_point window_end, const StopFlag& stop) override {
    if (period_.count() == 0) return;
    stop.SleepUntil(std::min(next_, window_end));
    next_ = SteadyClock::now() + period_;
  }

  std::string series() const override { return series_; }

 private:
  Session* const session_;
  const std::string key_;
  const AcquireOptions options_;
  const std::string series_;
  const std::chrono::milliseconds period_;
  SteadyClock::time_point next_{};
};

// Acquire (measured: the wait for the hand-over) then Release (not measured).
class AcquireThenReleaseWorker : public Worker {
 public:
  AcquireThenReleaseWorker(Session* session, std::string key, AcquireOptions options)
      : session_(session), key_(std::move(key)), options_(std::move(options)) {}

  absl::Status Op() override {
    auto hold = session_->Acquire(key_, options_);
    if (!hold.ok()) return hold.status();
    hold_.emplace(std::move(*hold));
    return absl::OkStatus();
  }

  absl::Status AfterOp() override {
    if (!hold_) return absl::OkStatus();
    absl::Status s = hold_->Release();
    hold_.reset();
    return s;
  }

 private:
  Session* const session_;
  const std::string key_;
  const AcquireOptions options_;
  std::optional<Hold> hold_;
};

// A new Client per operation (ConnectWorkers); its channel, and so its
// connection, closes when the Client is dropped.
class ConnectWorker : public Worker {
 public:
  ConnectWorker(ClientOptions options, std::string ns)
      : options_(std::move(options)), ns_(std::move(ns)) {}

  absl::Status Op() override {
    auto client = Client::Connect(options_);
    if (!client.ok()) return client.status();
    SessionOptions so;
    so.ttl = kConnectSessionTtl;
    auto session = (*client)->OpenSession(ns_, so);
    if (!session.ok()) return session.status();
    return (*session)->Close();
  }

 private:
  // The shortest TTL the bench namespace allows: a session a failed Close
  // leaves behind ends soon.
  static constexpr std::chrono::milliseconds kConnectSessionTtl{1000};
  const ClientOptions options_;
  const std::string ns_;
};

AcquireOptions Waiting(std::chrono::milliseconds wait, bool shared) {
  AcquireOptions o;
  o.wait = wait;
  o.shared = shared;
  return o;
}

std::optional<ProcSample> Sample(std::optional<pid_t> pid) {
  if (!pid) return std::nullopt;
  auto s = SampleProcess(*pid);
  if (!s.ok()) return std::nullopt;
  return *s;
}

std::chrono::milliseconds WholeSeconds(std::chrono::milliseconds ttl) {
  return std::chrono::ceil<std::chrono::seconds>(ttl);
}

// /proc samples of holdfastd (h) and etcd (e) around the sessions window.
struct WindowSamples {
  std::optional<ProcSample> before_open;  // holdfastd, before any session opened
  std::optional<ProcSample> h0, h1, e0, e1;
  std::optional<ProcSample> c0, c1;  // this process: the sessions' clients
};

// Fills the process figures of `r` from the samples.
void FillProcessFigures(const WindowSamples& w, double seconds, int64_t renewals,
                        SessionsResult* r) {
  if (w.h0 && w.h1 && seconds > 0) {
    double cpu = w.h1->cpu_seconds - w.h0->cpu_seconds;
    r->cpu_cores = cpu / seconds;
    if (renewals > 0) r->cpu_us_per_renewal = cpu * 1e6 / static_cast<double>(renewals);
  }
  if (w.before_open && w.h1) {
    r->rss_before_bytes = w.before_open->rss_bytes;
    r->rss_after_bytes = w.h1->rss_bytes;
    if (r->opened > 0) {
      r->rss_bytes_per_session =
          static_cast<double>(w.h1->rss_bytes - w.before_open->rss_bytes) /
          static_cast<double>(r->opened);
    }
  }
  if (w.e0 && w.e1 && seconds > 0) {
    r->etcd_cpu_cores = (w.e1->cpu_seconds - w.e0->cpu_seconds) / seconds;
  }
  if (w.c0 && w.c1 && seconds > 0) {
    r->client_cpu_cores = (w.c1->cpu_seconds - w.c0->cpu_seconds) / seconds;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionFleet>> SessionFleet::Open(
    const ClientOptions& client, const std::string& ns, int64_t n, int per_client,
    std::chrono::milliseconds ttl, SteadyClock::time_point deadline, const StopFlag& stop) {
  std::unique_ptr<SessionFleet> fleet(new SessionFleet());
  per_client = std::max(per_client, 1);
  ClientOptions o = client;
  o.rpc_timeout = kRpcTimeout;
  for (int64_t i = 0; i < n; i += per_client) {
    auto c = Client::Connect(o);
    if (!c.ok()) return c.status();
    fleet->clients_.push_back(std::move(*c));
  }
  fleet->sessions_.resize(n);
  absl::Mutex mu;
  absl::Status first_error;
  int64_t ran = ParallelFor(n, kOpenThreads, deadline, stop, [&](int64_t i) {
    SessionOptions options;
    options.ttl = ttl;
    auto s = fleet->clients_[i / per_client]->OpenSession(ns, options);
    if (s.ok()) {
      fleet->sessions_[i] = std::move(*s);
      return;
    }
    absl::MutexLock l(&mu);
    if (first_error.ok()) first_error = s.status();
  });
  if (!first_error.ok()) return first_error;  // ~SessionFleet closes what opened
  if (ran < n) {
    if (stop.stopped()) return absl::CancelledError("stopped");
    return absl::DeadlineExceededError(absl::StrCat("opened ", ran, " of ", n, " sessions in time"));
  }
  return fleet;
}

SessionFleet::~SessionFleet() {
  std::atomic<bool> unreachable{false};
  StopFlag never;
  ParallelFor(size(), kCloseThreads, SteadyClock::now() + kCloseBudget, never, [&](int64_t i) {
    auto& s = sessions_[i];
    if (!s || unreachable.load()) return;
    auto st = s->Close();
    if (st.code() == absl::StatusCode::kUnavailable ||
        st.code() == absl::StatusCode::kDeadlineExceeded) {
      unreachable = true;
    }
    s.reset();
  });
  // Sessions not closed now would each block in ~Session on a holdfastd that
  // does not answer: abandon them to their leases, which etcd expires.
  for (auto& s : sessions_) (void)s.release();
  clients_.clear();
}

int64_t SessionFleet::TotalRenewals() const {
  int64_t total = 0;
  for (const auto& s : sessions_) total += s ? s->renewals() : 0;
  return total;
}

int64_t SessionFleet::LostSessions() const {
  int64_t lost = 0;
  for (const auto& s : sessions_) lost += (s && s->lost()) ? 1 : 0;
  return lost;
}

std::vector<std::unique_ptr<Worker>> UncontendedWorkers(SessionFleet& fleet,
                                                        const std::string& cell) {
  std::vector<std::unique_ptr<Worker>> out;
  for (int64_t i = 0; i < fleet.size(); ++i) {
    out.push_back(std::make_unique<AcquireReleaseWorker>(
        &fleet.session(i), absl::StrCat(cell, "/", i), AcquireOptions{}, "",
        std::chrono::milliseconds(0)));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> ContendedWorkers(SessionFleet& fleet,
                                                      const std::string& cell,
                                                      std::chrono::milliseconds wait) {
  std::vector<std::unique_ptr<Worker>> out;
  for (int64_t i = 0; i < fleet.size(); ++i) {
    out.push_back(
        std::make_unique<AcquireThenReleaseWorker>(&fleet.session(i), cell, Waiting(wait, false)));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> SharedWorkers(SessionFleet& fleet, const std::string& cell,
                                                   std::chrono::milliseconds wait,
                                                   std::chrono::milliseconds writer_period) {
  std::vector<std::unique_ptr<Worker>> out;
  for (int64_t i = 0; i + 1 < fleet.size(); ++i) {
    out.push_back(std::make_unique<AcquireReleaseWorker>(
        &fleet.session(i), cell, Waiting(wait, true), "read",
        std::chrono::milliseconds(0)));
  }
  if (fleet.size() > 0) {
    out.push_back(std::make_unique<AcquireReleaseWorker>(&fleet.session(fleet.size() - 1), cell,
                                                         Waiting(wait, false), "write",
                                                         writer_period));
  }
  return out;
}

std::vector<std::unique_ptr<Worker>> ConnectWorkers(const ClientOptions& client,
                                                    const std::string& ns, int n) {
  ClientOptions o = client;
  o.rpc_timeout = kRpcTimeout;
  std::vector<std::unique_ptr<Worker>> out;
  for (int i = 0; i < n; ++i) {
    // gRPC shares one connection among a process's channels whose arguments
    // and credentials compare equal, as plaintext ones do: a name of its own
    // (which plaintext does not check) gives each worker its own. Under mTLS
    // every Client's credentials are its own already, and the name is checked.
    if (o.ca_file.empty()) o.server_name = absl::StrCat("holdfast-bench-connect-", i);
    out.push_back(std::make_unique<ConnectWorker>(o, ns));
  }
  return out;
}

std::unique_ptr<Worker> ProbeWorker(Session& session, const std::string& key,
                                    std::chrono::milliseconds period) {
  return std::make_unique<AcquireReleaseWorker>(&session, key, AcquireOptions{}, "probe",
                                                period);
}

SessionsResult RunSessionsCell(const ClientOptions& client, const std::string& ns, int64_t n,
                               int per_client, std::chrono::milliseconds ttl,
                               const Timing& timing, std::optional<pid_t> holdfastd_pid,
                               std::optional<pid_t> etcd_pid, const StopFlag& stop) {
  SessionsResult r;
  r.requested = n;
  WindowSamples w;
  w.before_open = Sample(holdfastd_pid);
  auto open_start = SteadyClock::now();
  auto fleet = SessionFleet::Open(client, ns, n, per_client, ttl,
                                  open_start + kOpenBudgetPerSession * n + kOpenBudgetMargin,
                                  stop);
  r.open_seconds = std::chrono::duration<double>(SteadyClock::now() - open_start).count();
  if (!fleet.ok()) {
    r.error = fleet.status().ToString();
    return r;
  }
  r.opened = (*fleet)->size();
  r.offered_renewals_per_sec = static_cast<double>(r.opened) * 3.0 /
                               std::chrono::duration<double>(WholeSeconds(ttl)).count();
  stop.SleepUntil(SteadyClock::now() + timing.warmup);
  int64_t renewals0 = (*fleet)->TotalRenewals();
  w.h0 = Sample(holdfastd_pid);
  w.e0 = Sample(etcd_pid);
  w.c0 = Sample(::getpid());
  auto t0 = SteadyClock::now();
  stop.SleepUntil(t0 + timing.measure);
  int64_t renewals1 = (*fleet)->TotalRenewals();
  w.h1 = Sample(holdfastd_pid);
  w.e1 = Sample(etcd_pid);
  w.c1 = Sample(::getpid());
  r.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  r.lost = (*fleet)->LostSessions();
  int64_t renewals = renewals1 - renewals0;
  r.renewals_per_sec = r.seconds > 0 ? static_cast<double>(renewals) / r.seconds : 0;
  FillProcessFigures(w, r.seconds, renewals, &r);
  return r;
}

}  // namespace holdfast::bench
