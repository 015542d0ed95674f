// holdfastd's Prometheus metrics (prometheus-cpp), served as text at GET
// /metrics (config `metrics.listen`, flag --metrics-listen): over HTTPS to the
// client certificates `metrics.readers` and `admin_ids` name when holdfastd
// serves mTLS, else over plain HTTP (server/metrics_endpoint.h). Every
// metric, its labels and what it counts is listed in the README (Operations,
// Metrics); this header says where each one is measured.
//
// Metrics implements the engine's and the etcd client's observer interfaces, so
// neither knows prometheus: the engine reports acquires, grants, releases,
// parked waiters, sessions and renewals (lock/observer.h); the etcd client
// reports each unary call (etcd/client.h). The auditor's progress and the live
// sessions are read at scrape time, on the HTTP server's thread.
//
// Labels are bounded: namespace and class names that etcd showed to exist, etcd
// method names, status-code names. Never lock keys, session ids or identities.
//
// Live sessions are counted per replica, from what this replica sees: a session
// is live here from its Open or a renewal on this replica until its TTL has run
// out without another renewal here, or until it is closed or found lost here.
// Summed over replicas this is the cluster's live sessions (a session that just
// moved to another replica counts on both for at most one TTL). The map behind
// it costs about 100 bytes per session.
//
// Thread-safe. Hooks never block and take no lock of the caller's.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <limits>
#include <map>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "audit/auditor.h"
#include "etcd/client.h"
#include "lock/observer.h"
#include "server/metrics_endpoint.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace holdfast::server {

class Metrics final : public lock::EngineObserver, public etcd::CallObserver {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // `now` is injected for tests (default: the steady clock).
  explicit Metrics(Clock now = nullptr);
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves GET /metrics on `listen` (host:port), on threads of its own: over TLS
  // to the peers `tls->authorize` admits, or over plain HTTP to anyone when `tls`
  // is none. Errors: UNAVAILABLE when it cannot listen there; INVALID_ARGUMENT
  // naming a TLS file that cannot be used.
  absl::Status Serve(const std::string& listen,
                     std::optional<MetricsEndpoint::Tls> tls = std::nullopt);
  // Stops serving; no scrape runs once it returns. Idempotent.
  void StopServing();
  // The port bound by Serve (0 when not serving).
  int port() const { return port_.load(); }

  // Where scrapes read the auditor's progress: called on the HTTP thread, so it
  // must not block for long. Adds the holdfast_audit_* gauges. Null: none.
  void SetAuditSource(std::function<audit::AuditorStatus()> source);

  // What this replica watches in etcd, over all its clusters.
  struct WatchCounts {
    int64_t watchers = 0;      // watchers inside holdfastd (a waiting acquire has up to 3)
    int64_t etcd_watches = 0;  // etcd watches behind them (a key's shared one counts once)
  };
  // Where scrapes read them (called on the HTTP thread; must not block for long).
  // Null: the holdfast_watchers and holdfast_etcd_watches gauges read 0.
  void SetWatchSource(std::function<WatchCounts()> source);

  // What a scrape answers, in Prometheus' text format.
  std::string Render();

  // lock::EngineObserver
  void OnAcquireDone(const lock::AcquireEnd& end) override;
  void OnGranted(std::string_view ns, std::string_view class_id, lock::GrantPath path,
                 int count) override;
  void OnReleased(std::string_view ns, int handed_over) override;
  void OnParked(std::string_view ns, std::string_view class_id, int delta) override;
  void OnSessionOpened(std::string_view ns, int64_t session,
                       std::chrono::milliseconds ttl) override;
  void OnSessionClosed(std::string_view ns, int64_t session) override;
  void OnRenewed(const lock::RenewEnd& end) override;
  void OnSessionLookup(lock::SessionLookup result, bool waited) override;
  // TLS files changed (`files`: "api", or "etcd" for a cluster's client TLS):
  // taken for new connections, or refused (common/tls_files.h).
  void OnTlsFiles(const std::string& files, bool taken);
  void OnCommitBatch(int members) override;
  void OnRide(lock::RideStep step) override;

  // etcd::CallObserver
  void OnEtcdCall(std::string_view method, const absl::Status& status,
                  std::chrono::steady_clock::duration latency) override;

 private:
  class Scrape;
  struct AuditGauges;
  // 24 bytes in a flat table: a live session costs no heap block of its own.
  struct SeenSession {
    const std::string* ns;  // in live_namespaces_, whose nodes never move
    std::chrono::steady_clock::time_point last;  // opened or last renewed here
    std::chrono::milliseconds ttl;
  };

  // Brings the scrape-time gauges up to date (live sessions, the auditor).
  void Refresh();
  // Forgets sessions whose TTL ran out since they were last seen here.
  void PruneLocked(std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock now_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Scrape> scrape_;

  prometheus::Family<prometheus::Histogram>* acquire_seconds_;
  prometheus::Family<prometheus::Histogram>* wait_seconds_;
  prometheus::Family<prometheus::Counter>* acquires_;
  prometheus::Family<prometheus::Counter>* grants_;
  prometheus::Family<prometheus::Counter>* releases_;
  prometheus::Family<prometheus::Histogram>* handover_batch_;
  prometheus::Histogram* commit_batch_;
  prometheus::Family<prometheus::Gauge>* parked_;
  prometheus::Family<prometheus::Counter>* sessions_opened_;
  prometheus::Family<prometheus::Counter>* sessions_closed_;
  prometheus::Family<prometheus::Counter>* sessions_lost_;
  prometheus::Family<prometheus::Gauge>* sessions_live_;
  prometheus::Family<prometheus::Counter>* keepalives_;
  prometheus::Family<prometheus::Counter>* session_lookups_;
  prometheus::Counter* session_lookups_waited_;
  prometheus::Family<prometheus::Counter>* tls_files_;
  prometheus::Histogram* keepalive_round_trip_;
  prometheus::Histogram* keepalive_interval_ratio_;
  prometheus::Family<prometheus::Histogram>* etcd_seconds_;
  // Made up front for etcd's methods, so a call's hook takes no family lock.
  std::map<std::string, prometheus::Histogram*, std::less<>> etcd_method_seconds_;
  prometheus::Family<prometheus::Counter>* etcd_errors_;
  // By outcome (MetricsEndpoint::Options::on_connection), made up front: the
  // endpoint's threads take no family lock.
  std::map<std::string, prometheus::Counter*, std::less<>> metrics_connections_;
  // Refused connections are logged at most once a minute (NoteRefused), with
  // the count since the last line.
  void NoteRefused();
  static constexpr int64_t kNeverSaid = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> refused_unsaid_{0};
  std::atomic<int64_t> refused_said_at_ms_{kNeverSaid};

  // Lock order: serve_mu_ before mu_.
  absl::Mutex serve_mu_;
  std::unique_ptr<MetricsEndpoint> endpoint_ ABSL_GUARDED_BY(serve_mu_);
  std::atomic<int> port_{0};

  absl::Mutex mu_;
  absl::flat_hash_map<int64_t, SeenSession> sessions_ ABSL_GUARDED_BY(mu_);
  std::set<std::string, std::less<>> live_namespaces_ ABSL_GUARDED_BY(mu_);  // ever had one
  std::chrono::steady_clock::time_point next_prune_ ABSL_GUARDED_BY(mu_);
  std::function<audit::AuditorStatus()> audit_source_ ABSL_GUARDED_BY(mu_);
  std::function<WatchCounts()> watch_source_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* watchers_;
  prometheus::Gauge* riding_;
  prometheus::Counter* rode_;
  prometheus::Counter* rode_alone_;
  prometheus::Gauge* etcd_watches_;
  std::unique_ptr<AuditGauges> audit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::server
