#include "server/metrics.h"

#include <string_view>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace holdfast::server {

namespace {

using Seconds = std::chrono::duration<double>;

// From 1 ms (an uncontended grant on a quiet etcd) to the longest wait (1 h).
const prometheus::Histogram::BucketBoundaries kAcquireBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1,     2.5,    5,     10,   30,    60,   300, 900,  3600};
// One etcd round trip: from 0.5 ms to the etcd timeout.
const prometheus::Histogram::BucketBoundaries kEtcdBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
// Waiters granted by one release (at most 32, engine.cc).
const prometheus::Histogram::BucketBoundaries kBatchBuckets = {1, 2, 4, 8, 16, 32};
// Time between two renewals of a session / its TTL: libholdfast renews every
// third of the TTL; near 1 the session was about to expire.
const prometheus::Histogram::BucketBoundaries kRatioBuckets = {0.1, 0.2, 0.3, 0.4, 0.5,
                                                               0.6, 0.7, 0.8, 0.9, 1.0};

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace

// What the HTTP server collects: the scrape-time gauges first, then everything.
class Metrics::Scrape : public prometheus::Collectable {
 public:
  explicit Scrape(Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->Refresh();
    return metrics_->registry_->Collect();
  }

 private:
  Metrics* const metrics_;
};

struct Metrics::AuditGauges {
  prometheus::Gauge* leader;
  prometheus::Gauge* cursor;
  prometheus::Gauge* last_seen;
  prometheus::Gauge* compacted;
  prometheus::Gauge* lag;
  prometheus::Gauge* gaps;
  prometheus::Gauge* recorded;
  prometheus::Gauge* commits;
  prometheus::Gauge* wakeups;
  prometheus::Gauge* watch_responses;
  prometheus::Gauge* buffered;
  prometheus::Gauge* pruned;
};

Metrics::Metrics(Clock now)
    : now_(now ? std::move(now) : Clock([] { return std::chrono::steady_clock::now(); })),
      registry_(std::make_shared<prometheus::Registry>()),
      scrape_(std::make_shared<Scrape>(this)) {
  auto& r = *registry_;
  acquire_seconds_ = &prometheus::BuildHistogram()
                          .Name("holdfast_acquire_duration_seconds")
                          .Help("Granted acquires: from the call reaching holdfastd to the grant, "
                                "waiting included")
                          .Register(r);
  wait_seconds_ = &prometheus::BuildHistogram()
                       .Name("holdfast_acquire_wait_seconds")
                       .Help("Granted acquires that queued: time from joining the queue to the "
                             "grant")
                       .Register(r);
  acquires_ = &prometheus::BuildCounter()
                   .Name("holdfast_acquires_total")
                   .Help("Acquire answers by status code (OK includes asking again for a "
                         "hold already held)")
                   .Register(r);
  grants_ = &prometheus::BuildCounter()
                 .Name("holdfast_grants_total")
                 .Help("Holds created by this replica's commits: path=acquire (an acquire's "
                       "own grant) or handover (a release granting queued waiters)")
                 .Register(r);
  releases_ = &prometheus::BuildCounter()
                   .Name("holdfast_releases_total")
                   .Help("Releases committed by this replica")
                   .Register(r);
  handover_batch_ = &prometheus::BuildHistogram()
                         .Name("holdfast_handover_batch_size")
                         .Help("Waiters granted in one releasing commit (releases that handed "
                               "the key over)")
                         .Register(r);
  commit_batch_ = &prometheus::BuildHistogram()
                       .Name("holdfast_commit_batch_size")
                       .Help("Grants and releases carried by one etcd transaction (1: sent "
                             "alone; more: a group commit)")
                       .Register(r)
                       .Add({}, kBatchBuckets);
  riding_ = &prometheus::BuildGauge()
                 .Name("holdfast_enqueues_riding")
                 .Help("Enqueues behind other waiters waiting now for a release of their key "
                       "on this replica to share its etcd transaction")
                 .Register(r)
                 .Add({});
  auto& rides = prometheus::BuildCounter()
                    .Name("holdfast_enqueue_rides_total")
                    .Help("Enqueues that waited for a release of their key: outcome=rode (in "
                          "the release's transaction) or alone (none came in time)")
                    .Register(r);
  rode_ = &rides.Add({{"outcome", "rode"}});
  rode_alone_ = &rides.Add({{"outcome", "alone"}});
  parked_ = &prometheus::BuildGauge()
                 .Name("holdfast_waiters_parked")
                 .Help("Acquires of this replica waiting in a queue now")
                 .Register(r);
  watchers_ = &prometheus::BuildGauge()
                   .Name("holdfast_watchers")
                   .Help("Watchers of this replica's waiting acquires and services (a waiting "
                         "acquire has up to three)")
                   .Register(r)
                   .Add({});
  etcd_watches_ = &prometheus::BuildGauge()
                       .Name("holdfast_etcd_watches")
                       .Help("etcd watches behind them: the waiters of one lock key on this "
                             "replica share one watch of its holds and one of its queue")
                       .Register(r)
                       .Add({});
  sessions_opened_ = &prometheus::BuildCounter()
                          .Name("holdfast_sessions_opened_total")
                          .Help("Sessions opened through this replica")
                          .Register(r);
  sessions_closed_ = &prometheus::BuildCounter()
                          .Name("holdfast_sessions_closed_total")
                          .Help("Sessions closed by their client through this replica")
                          .Register(r);
  sessions_lost_ = &prometheus::BuildCounter()
                        .Name("holdfast_sessions_lost_total")
                        .Help("Expiries: renewals on this replica that found the session's "
                              "lease gone")
                        .Register(r);
  sessions_live_ = &prometheus::BuildGauge()
                        .Name("holdfast_sessions_live")
                        .Help("Sessions opened or renewed on this replica within their TTL "
                              "and not closed or lost since")
                        .Register(r);
  keepalives_ = &prometheus::BuildCounter()
                     .Name("holdfast_keepalives_total")
                     .Help("Keepalive answers: result=renewed, lost or etcd_unavailable")
                     .Register(r);
  session_lookups_ = &prometheus::BuildCounter()
                         .Name("holdfast_keepalive_lookups_total")
                         .Help("Reads of sessions new to this replica for a renewal: "
                               "result=found, missed (none, or not the caller's), failed, or refused (not made: "
                               "too many of the identity's wait)")
                         .Register(r);
  session_lookups_waited_ = &prometheus::BuildCounter()
                                 .Name("holdfast_keepalive_lookups_waited_total")
                                 .Help("Of those, the ones that waited for their identity's "
                                       "pace (limits.unknown_session_lookups_per_second)")
                                 .Register(r)
                                 .Add({});
  tls_files_ = &prometheus::BuildCounter()
                    .Name("holdfast_tls_files_changes_total")
                    .Help("Changes of certificate files: files=api (tls.*) or etcd (the "
                          "client TLS to etcd); result=taken for new connections, or refused "
                          "(they do not pass the check; the previous ones serve on)")
                    .Register(r);
  keepalive_round_trip_ = &prometheus::BuildHistogram()
                               .Name("holdfast_keepalive_round_trip_seconds")
                               .Help("One renewal: from the request to etcd's answer on the "
                                     "LeaseKeepAlive stream")
                               .Register(r)
                               .Add({}, kEtcdBuckets);
  keepalive_interval_ratio_ = &prometheus::BuildHistogram()
                                   .Name("holdfast_keepalive_interval_ttl_ratio")
                                   .Help("Time since the session's previous renewal (or open) "
                                         "on this replica, divided by its TTL")
                                   .Register(r)
                                   .Add({}, kRatioBuckets);
  etcd_seconds_ = &prometheus::BuildHistogram()
                       .Name("holdfast_etcd_request_duration_seconds")
                       .Help("Unary etcd calls (each attempt), by method")
                       .Register(r);
  etcd_errors_ = &prometheus::BuildCounter()
                      .Name("holdfast_etcd_request_errors_total")
                      .Help("Unary etcd calls that failed, by method and status code")
                      .Register(r);
  auto& connections =
      prometheus::BuildCounter()
          .Name("holdfast_metrics_connections_total")
          .Help("Connections to this metrics endpoint, by how they ended: scraped, forbidden, "
                "bad_request, handshake_failed, no_request, silent (closed having sent "
                "nothing), refused (closed at once: its source's places or the queue full)")
          .Register(r);
  for (const char* outcome : {"scraped", "forbidden", "bad_request", "handshake_failed",
                              "no_request", "silent", "refused"}) {
    metrics_connections_[outcome] = &connections.Add({{"outcome", outcome}});
  }
  for (const char* method : {"Range", "Put", "DeleteRange", "Txn", "Compact", "LeaseGrant",
                             "LeaseRevoke", "LeaseTimeToLive", "Status"}) {
    etcd_method_seconds_[method] = &etcd_seconds_->Add({{"method", method}}, kEtcdBuckets);
  }
  next_prune_ = now_();
}

Metrics::~Metrics() { StopServing(); }

absl::Status Metrics::Serve(const std::string& listen,
                            std::optional<MetricsEndpoint::Tls> tls) {
  absl::MutexLock l(&serve_mu_);
  if (endpoint_) return absl::FailedPreconditionError("metrics: already serving");
  const bool https = tls.has_value();
  MetricsEndpoint::Options o;
  o.listen = listen;
  o.tls = std::move(tls);
  o.render = [this] { return Render(); };
  o.on_connection = [this](const char* outcome) {
    if (auto it = metrics_connections_.find(outcome); it != metrics_connections_.end()) {
      it->second->Increment();
    }
    if (std::string_view(outcome) == "refused") NoteRefused();
  };
  auto endpoint = MetricsEndpoint::Start(std::move(o));
  if (!endpoint.ok()) return endpoint.status();
  endpoint_ = *std::move(endpoint);
  port_ = endpoint_->port();
  std::fprintf(stderr, "holdfastd: metrics on %s://%s/metrics%s\n", https ? "https" : "http",
               listen.c_str(),
               https ? " (client certificates of metrics.readers and admin_ids)" : "");
  return absl::OkStatus();
}

void Metrics::NoteRefused() {
  // Said at most once a minute, with how many since it was said last: a client
  // stuck or flooding the port shows in the log, not only in the counter.
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now_().time_since_epoch()).count();
  refused_unsaid_.fetch_add(1);
  int64_t said = refused_said_at_ms_.load();
  if (said != kNeverSaid && now_ms - said < 60'000) return;
  if (!refused_said_at_ms_.compare_exchange_strong(said, now_ms)) return;
  const int64_t refused = refused_unsaid_.exchange(0);
  std::fprintf(stderr,
               "holdfastd: metrics: WARNING: %lld connection%s to the metrics endpoint refused%s "
               "(its 64 places taken, or 8 from one address: a client stuck or flooding the "
               "port?); holdfast_metrics_connections_total{outcome=\"refused\"} counts them\n",
               static_cast<long long>(refused), refused == 1 ? "" : "s",
               said == kNeverSaid ? "" : " in the last minute or more");
}

void Metrics::StopServing() {
  std::unique_ptr<MetricsEndpoint> endpoint;
  {
    absl::MutexLock l(&serve_mu_);
    endpoint = std::move(endpoint_);
    port_ = 0;
  }
  endpoint.reset();  // joins the HTTP threads: no scrape runs after this
}

void Metrics::SetWatchSource(std::function<WatchCounts()> source) {
  absl::MutexLock l(&mu_);
  watch_source_ = std::move(source);
}

void Metrics::SetAuditSource(std::function<audit::AuditorStatus()> source) {
  std::unique_ptr<AuditGauges> gauges;
  {
    absl::MutexLock l(&mu_);
    audit_source_ = std::move(source);
    if (!audit_source_ || audit_) return;
  }
  auto gauge = [this](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  };
  gauges = std::make_unique<AuditGauges>();
  gauges->leader = gauge("holdfast_audit_leader", "1 while this replica is the auditor");
  gauges->cursor = gauge("holdfast_audit_cursor_revision",
                         "Last etcd revision recorded in the audit store");
  gauges->last_seen = gauge("holdfast_audit_last_seen_revision",
                            "Highest etcd revision the auditor has seen");
  gauges->compacted = gauge("holdfast_audit_compacted_revision",
                            "Revision holdfastd last compacted etcd at");
  gauges->lag = gauge("holdfast_audit_lag_revisions",
                      "Revisions seen but not yet recorded (0 unless the auditor)");
  gauges->gaps = gauge("holdfast_audit_gaps",
                       "Audit gaps (history compacted away before it was recorded) since "
                       "start");
  gauges->recorded = gauge("holdfast_audit_recorded_events",
                           "Events recorded by this replica since start");
  gauges->commits = gauge("holdfast_audit_store_commits",
                          "Audit store transactions this replica committed since start");
  gauges->wakeups = gauge("holdfast_audit_wakeups",
                          "Times new events woke the auditor thread since it last became "
                          "the auditor (about one per store commit)");
  gauges->watch_responses = gauge("holdfast_audit_watch_responses",
                                  "etcd watch responses with events sent to the auditor since "
                                  "it last became the auditor (about one per store commit under "
                                  "steady writes: the watch is paused until each record)");
  gauges->buffered = gauge("holdfast_audit_buffered_events",
                           "etcd events the auditor holds in memory, not yet recorded (up to "
                           "audit.max_buffered_events; then its watch waits for the store)");
  gauges->pruned = gauge("holdfast_audit_pruned_events",
                         "Events this replica deleted from the audit store since start, "
                         "being older than audit.retention");
  absl::MutexLock l(&mu_);
  if (!audit_) audit_ = std::move(gauges);
}

std::string Metrics::Render() {
  return prometheus::TextSerializer().Serialize(scrape_->Collect());
}

void Metrics::Refresh() {
  const auto now = now_();
  std::map<std::string, int64_t> live;
  std::function<audit::AuditorStatus()> source;
  std::function<WatchCounts()> watches;
  AuditGauges* audit = nullptr;
  {
    absl::MutexLock l(&mu_);
    PruneLocked(now);
    for (const auto& [id, s] : sessions_) ++live[*s.ns];
    // Namespaces that had live sessions and have none now read 0.
    for (const auto& ns : live_namespaces_) live.emplace(ns, 0);
    source = audit_source_;
    watches = watch_source_;
    audit = audit_.get();  // lives as long as this object, once made
  }
  const WatchCounts w = watches ? watches() : WatchCounts{};
  watchers_->Set(static_cast<double>(w.watchers));
  etcd_watches_->Set(static_cast<double>(w.etcd_watches));
  for (const auto& [ns, n] : live) {
    sessions_live_->Add({{"namespace", ns}}).Set(static_cast<double>(n));
  }
  if (source && audit != nullptr) {
    const audit::AuditorStatus st = source();
    audit->leader->Set(st.leader ? 1 : 0);
    audit->cursor->Set(static_cast<double>(st.cursor));
    audit->last_seen->Set(static_cast<double>(st.last_seen_revision));
    audit->compacted->Set(static_cast<double>(st.compacted_revision));
    audit->lag->Set(st.leader ? static_cast<double>(std::max<int64_t>(
                                    0, st.last_seen_revision - st.cursor))
                              : 0.0);
    audit->gaps->Set(static_cast<double>(st.gaps));
    audit->recorded->Set(static_cast<double>(st.recorded_events));
    audit->commits->Set(static_cast<double>(st.store_commits));
    audit->wakeups->Set(static_cast<double>(st.wakeups));
    audit->watch_responses->Set(static_cast<double>(st.watch_responses));
    audit->buffered->Set(static_cast<double>(st.buffered_events));
    audit->pruned->Set(static_cast<double>(st.pruned_events));
  }
}

void Metrics::PruneLocked(std::chrono::steady_clock::time_point now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.last + it->second.ttl < now) {
      sessions_.erase(it++);  // the other iterators stay valid
    } else {
      ++it;
    }
  }
  next_prune_ = now + std::chrono::seconds(10);
}

// --- engine hooks --------------------------------------------------------------

void Metrics::OnAcquireDone(const lock::AcquireEnd& end) {
  const std::string ns(end.ns), cls(end.class_id);
  acquires_->Add({{"namespace", ns}, {"class", cls}, {"code", CodeName(end.code)}}).Increment();
  if (end.code != absl::StatusCode::kOk) return;
  acquire_seconds_->Add({{"namespace", ns}, {"class", cls}}, kAcquireBuckets)
      .Observe(Seconds(end.latency).count());
  if (end.waited) {
    wait_seconds_->Add({{"namespace", ns}, {"class", cls}}, kAcquireBuckets)
        .Observe(Seconds(*end.waited).count());
  }
}

void Metrics::OnGranted(std::string_view ns, std::string_view class_id, lock::GrantPath path,
                        int count) {
  const char* via = path == lock::GrantPath::kHandOver ? "handover" : "acquire";
  grants_->Add({{"namespace", std::string(ns)}, {"class", std::string(class_id)}, {"path", via}})
      .Increment(count);
}

void Metrics::OnReleased(std::string_view ns, int handed_over) {
  releases_->Add({{"namespace", std::string(ns)}}).Increment();
  if (handed_over > 0) {
    handover_batch_->Add({{"namespace", std::string(ns)}}, kBatchBuckets).Observe(handed_over);
  }
}

void Metrics::OnCommitBatch(int members) { commit_batch_->Observe(members); }

void Metrics::OnRide(lock::RideStep step) {
  switch (step) {
    case lock::RideStep::kWaiting:
      riding_->Increment();
      return;
    case lock::RideStep::kRode:
      riding_->Decrement();
      rode_->Increment();
      return;
    case lock::RideStep::kAlone:
      riding_->Decrement();
      rode_alone_->Increment();
      return;
  }
}

void Metrics::OnParked(std::string_view ns, std::string_view class_id, int delta) {
  auto& gauge = parked_->Add({{"namespace", std::string(ns)}, {"class", std::string(class_id)}});
  if (delta >= 0) {
    gauge.Increment(delta);
  } else {
    gauge.Decrement(-delta);
  }
}

void Metrics::OnSessionOpened(std::string_view ns, int64_t session,
                              std::chrono::milliseconds ttl) {
  sessions_opened_->Add({{"namespace", std::string(ns)}}).Increment();
  const auto now = now_();
  absl::MutexLock l(&mu_);
  const std::string* name = &*live_namespaces_.emplace(ns).first;
  sessions_[session] = SeenSession{name, now, ttl};
  if (now >= next_prune_) PruneLocked(now);
}

void Metrics::OnSessionClosed(std::string_view ns, int64_t session) {
  sessions_closed_->Add({{"namespace", std::string(ns)}}).Increment();
  absl::MutexLock l(&mu_);
  sessions_.erase(session);
}

void Metrics::OnSessionLookup(lock::SessionLookup result, bool waited) {
  const char* name = result == lock::SessionLookup::kFound     ? "found"
                     : result == lock::SessionLookup::kMissed  ? "missed"
                     : result == lock::SessionLookup::kRefused ? "refused"
                                                               : "failed";
  session_lookups_->Add({{"result", name}}).Increment();
  if (waited) session_lookups_waited_->Increment();
}

void Metrics::OnTlsFiles(const std::string& files, bool taken) {
  tls_files_->Add({{"files", files}, {"result", taken ? "taken" : "refused"}}).Increment();
}

void Metrics::OnRenewed(const lock::RenewEnd& end) {
  const std::string ns(end.ns);
  const char* result = end.renewed ? "renewed" : end.lost ? "lost" : "etcd_unavailable";
  keepalives_->Add({{"namespace", ns}, {"result", result}}).Increment();
  if (end.round_trip.count() > 0) {
    keepalive_round_trip_->Observe(Seconds(end.round_trip).count());
  }
  if (end.lost) {
    sessions_lost_->Add({{"namespace", ns}}).Increment();
    absl::MutexLock l(&mu_);
    sessions_.erase(end.session);
    return;
  }
  if (!end.renewed || end.ttl.count() <= 0) return;
  const auto now = now_();
  std::optional<double> ratio;
  {
    absl::MutexLock l(&mu_);
    auto [it, added] = sessions_.try_emplace(end.session, SeenSession{nullptr, now, end.ttl});
    if (added) {
      it->second.ns = &*live_namespaces_.insert(ns).first;  // came from another replica
    } else {
      // Against the TTL the session had until now: that is when it would have
      // expired.
      ratio = Seconds(now - it->second.last) / Seconds(it->second.ttl);
      it->second.last = now;
      it->second.ttl = end.ttl;
    }
    if (now >= next_prune_) PruneLocked(now);
  }
  if (ratio) keepalive_interval_ratio_->Observe(*ratio);
}

// --- etcd hook ---------------------------------------------------------------------

void Metrics::OnEtcdCall(std::string_view method, const absl::Status& status,
                         std::chrono::steady_clock::duration latency) {
  auto known = etcd_method_seconds_.find(method);
  auto& histogram = known != etcd_method_seconds_.end()
                        ? *known->second
                        : etcd_seconds_->Add({{"method", std::string(method)}}, kEtcdBuckets);
  histogram.Observe(Seconds(latency).count());
  if (!status.ok()) {
    etcd_errors_->Add({{"method", std::string(method)}, {"code", CodeName(status.code())}})
        .Increment();
  }
}

}  // namespace holdfast::server
