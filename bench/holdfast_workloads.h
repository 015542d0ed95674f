// holdfast workloads through libholdfast: acquire+release cycles (uncontended,
// contended, shared) and many live sessions.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/runner.h"
#include "holdfast/client.h"

namespace holdfast::bench {

// Sessions for workers: one Client (one keepalive stream) per `per_client`
// sessions. Thread-safe once opened; session(i) is meant for one worker.
class SessionFleet {
 public:
  // Opens `n` sessions in `ns` with `ttl`, through Clients made with `client`
  // (endpoint and credentials). Errors: the first failed open, or
  // DEADLINE_EXCEEDED when not all were open by `deadline` (CANCELLED on stop).
  static absl::StatusOr<std::unique_ptr<SessionFleet>> Open(
      const ClientOptions& client, const std::string& ns, int64_t n, int per_client,
      std::chrono::milliseconds ttl, SteadyClock::time_point deadline, const StopFlag& stop);
  // Closes every session, in parallel, then the Clients. Once a close fails
  // (holdfastd unreachable) the remaining sessions are abandoned to their
  // leases instead of each waiting out its RPC deadline.
  ~SessionFleet();
  SessionFleet(const SessionFleet&) = delete;
  SessionFleet& operator=(const SessionFleet&) = delete;

  int64_t size() const { return static_cast<int64_t>(sessions_.size()); }
  Session& session(int64_t i) { return *sessions_[i]; }
  // Sums over all sessions (each locks its session's state briefly).
  int64_t TotalRenewals() const;
  int64_t LostSessions() const;

 private:
  SessionFleet() = default;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Session>> sessions_;
};

// One worker per session: Acquire(key i of `cell`, try) then Release.
std::vector<std::unique_ptr<Worker>> UncontendedWorkers(SessionFleet& fleet,
                                                        const std::string& cell);

// One worker per session, all on one key: Acquire (waiting up to `wait`; the
// measured op, one hand-over) then Release at once (not measured).
std::vector<std::unique_ptr<Worker>> ContendedWorkers(SessionFleet& fleet,
                                                      const std::string& cell,
                                                      std::chrono::milliseconds wait);

// All but the fleet's last session are readers (shared acquire + release,
// series "read"); the last is a writer (exclusive acquire + release, series
// "write") that starts one cycle every `writer_period`.
std::vector<std::unique_ptr<Worker>> SharedWorkers(SessionFleet& fleet, const std::string& cell,
                                                   std::chrono::milliseconds wait,
                                                   std::chrono::milliseconds writer_period);

// `n` workers that each connect anew for every operation: a new Client (its own
// credentials, so its own connection: TCP, HTTP/2 and, under mTLS, a TLS
// handshake), a session opened on it and closed, the Client dropped. What a fleet
// of restarting or failing-over client processes asks of holdfastd.
std::vector<std::unique_ptr<Worker>> ConnectWorkers(const ClientOptions& client,
                                                    const std::string& ns, int n);

// One acquire+release cycle of `key` every `period` on `session`, in series
// "probe": a caller that measures what the rest of a cell does to everyone else.
std::unique_ptr<Worker> ProbeWorker(Session& session, const std::string& key,
                                    std::chrono::milliseconds period);

struct SessionsResult {
  int64_t requested = 0;
  int64_t opened = 0;
  int64_t lost = 0;  // sessions lost by the end of the window
  double open_seconds = 0;
  double renewals_per_sec = 0;          // confirmed renewals inside the window
  double offered_renewals_per_sec = 0;  // opened * 3 / ttl
  double seconds = 0;
  std::string error;  // why the cell did not complete, if it did not
  bool fresh_holdfastd = false;  // holdfastd was restarted just before the cell
  // holdfastd figures; present when this run started holdfastd.
  std::optional<double> cpu_cores;           // CPU seconds per second in the window
  std::optional<double> cpu_us_per_renewal;  // CPU microseconds per renewal
  std::optional<int64_t> rss_before_bytes;   // before the sessions were opened
  std::optional<int64_t> rss_after_bytes;    // at the end of the window
  std::optional<double> rss_bytes_per_session;
  std::optional<double> etcd_cpu_cores;      // etcd's CPU in the window
  std::optional<double> client_cpu_cores;    // this process's (libholdfast's) CPU in the window
};

// Opens `n` sessions with `ttl`, waits `timing.warmup`, then measures renewals
// per second (from Session::renewals()) and the processes' CPU and RSS over
// `timing.measure`; closes the sessions afterwards.
SessionsResult RunSessionsCell(const ClientOptions& client, const std::string& ns, int64_t n,
                               int per_client, std::chrono::milliseconds ttl,
                               const Timing& timing, std::optional<pid_t> holdfastd_pid,
                               std::optional<pid_t> etcd_pid, const StopFlag& stop);

}  // namespace holdfast::bench
