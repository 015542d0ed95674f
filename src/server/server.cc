#include "server/server.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/loopback.h"
#include "common/spiffe.h"
#include "lock/keyspace.h"

namespace holdfast::server {

namespace {

// How holdfastd's connections to the audit store behave. A record waiting on
// another connection's lock (the other clusters' auditors, the server's own
// connection, another replica's) gives up within a quarter of the auditor
// lease's TTL and is retried, so the lease is renewed in time: the auditor
// renews it every third of the TTL, between store calls, on the same thread.
audit::StoreOptions AuditStoreOptions(const Config& config) {
  audit::StoreOptions so;
  so.lock_wait = std::clamp<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(config.audit_leader_ttl) / 4,
      std::chrono::milliseconds(250), std::chrono::milliseconds(10'000));
  return so;
}

// How long the restore guard waits before it reads again to confirm a refusal
// that would be new (GuardClusterOnce): longer than an epoch advance takes from
// its history row to its record on a healthy etcd, short enough to add little to
// the time a restore that kept the cluster id goes unseen.
constexpr std::chrono::milliseconds kConfirmRefusalAfter{250};

// Admin calls that run at once (server/async_rpc.h, ServeBlocking); more wait
// their turn. Each brief one blocks a thread for a few etcd round trips or an
// audit query (30 s at most); each waiting one (a rehome) for its drain, up to
// its deadline. A cluster move rehomes namespaces side by side: eight at once
// wait for their holds while the rest queue, and no other admin call waits
// behind them.
constexpr int kBriefAdminThreads = 8;
constexpr int kWaitingAdminThreads = 8;

}  // namespace

Server::Server(Config config) : config_(std::move(config)) {}

Server::~Server() { Shutdown(std::chrono::milliseconds(0)); }

absl::StatusOr<std::unique_ptr<Cluster>> Server::StartCluster(
    const ClusterConfig& cc, std::chrono::milliseconds etcd_wait) {
  auto c = std::make_unique<Cluster>();
  c->config = cc;
  etcd::ClientOptions eo;
  eo.endpoints = cc.endpoints;
  eo.internal_timeout = cc.timeout;
  eo.observer = metrics_.get();
  eo.loop = loop_.get();
  if (!cc.ca_file.empty()) {
    auto creds = EtcdCredentials(cc);
    if (!creds.ok()) return creds.status();
    eo.credentials = *creds;
  }
  auto etcd = etcd::Client::Create(eo, timers_);
  if (!etcd.ok()) return etcd.status();
  c->etcd = std::move(*etcd);

  lock::EngineOptions lo;
  lo.etcd_timeout = cc.timeout;
  lo.session_ttl_min = config_.session_ttl_min;
  lo.session_ttl_max = config_.session_ttl_max;
  lo.max_wait = config_.max_wait;
  lo.ride_at_most = config_.ride_with_release;
  lo.max_waiters_per_key = static_cast<size_t>(config_.max_waiters_per_key);
  lo.max_holds_per_session = static_cast<size_t>(config_.max_holds_per_session);
  lo.observer = metrics_.get();
  lock::EtcdHealth::Options ho;
  ho.probe_timeout = std::min<std::chrono::milliseconds>(cc.timeout, std::chrono::seconds(1));
  Cluster* raw = c.get();
  // Named in logs and errors only when there are several.
  const std::string where = config_.clusters.size() > 1 ? " (cluster " + cc.name + ")" : "";
  c->health = std::make_unique<lock::EtcdHealth>(
      c->etcd.get(), ho, [this, raw, where](bool healthy, const std::string& reason) {
        raw->healthy.store(healthy);
        // grpc.health.v1 reports NOT_SERVING while an etcd cluster has no quorum.
        UpdateHealth();
        std::fprintf(stderr, "holdfastd: etcd%s %s%s%s\n", where.c_str(),
                     healthy ? "healthy again" : "unhealthy", healthy ? "" : ": ",
                     healthy ? "" : reason.c_str());
      });
  lo.renew_timeout = ho.probe_timeout;
  c->engine = std::make_unique<lock::Engine>(c->etcd.get(), lo, c->health.get());
  c->registry = std::make_unique<lock::Registry>(c->etcd.get());
  c->force = std::make_unique<lock::ForceReleases>(
      c->etcd.get(), std::chrono::duration_cast<std::chrono::seconds>(config_.force_request_ttl));
  c->epochs = std::make_unique<audit::Epochs>(c->etcd.get(), audit_store_.get());
  // A missing record is created above every epoch the history knows.
  auto first_epoch = c->epochs->BootstrapEpoch();
  if (!first_epoch.ok()) return first_epoch.status();

  // etcd may come up after us (or be between leaders): retry the bootstrap. Short
  // attempts: a connection made while etcd is still starting can stall until its
  // deadline, and the next attempt gets a fresh one.
  auto until = std::chrono::steady_clock::now() + etcd_wait;
  auto attempt = std::min<std::chrono::milliseconds>(cc.timeout, std::chrono::seconds(1));
  absl::Status boot;
  do {
    boot = c->engine->Bootstrap(etcd::DeadlineIn(attempt), *first_epoch);
    if (boot.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  if (!boot.ok()) {
    return absl::Status(boot.code(),
                        absl::StrCat("epoch bootstrap failed", where, ": ", boot.message()));
  }
  if (auto s = c->epochs->RecordCurrent(etcd::DeadlineIn(cc.timeout)); !s.ok()) {
    std::fprintf(stderr, "holdfastd: cannot write the epoch history (will not block): %s\n",
                 s.ToString().c_str());
  }
  return c;
}

absl::Status Server::Start(std::chrono::milliseconds etcd_wait) {
  Authenticator::Options ao;
  ao.insecure = config_.insecure;
  ao.dev_identity = config_.dev_identity;
  ao.trust_domains = config_.trust_domains;
  ao.admin_ids = config_.admin_ids;
  ao.trust_bundles = config_.trust_bundles;
  auth_ = std::make_unique<Authenticator>(ao);
  if (auto s = auth_->Load(); !s.ok()) return s;
  if (config_.metrics_listen.empty() &&
      (!config_.metrics_readers.empty() || config_.metrics_plaintext)) {
    std::fprintf(stderr,
                 "holdfastd: WARNING: metrics.readers and metrics.plaintext do nothing without "
                 "metrics.listen (or --metrics-listen): no metrics are served\n");
  }
  if (!config_.metrics_listen.empty()) {
    // First, so that the etcd calls of the start-up are seen too.
    metrics_ = std::make_unique<Metrics>();
    if (auto s = metrics_->Serve(config_.metrics_listen, MetricsTls()); !s.ok()) return s;
  }
  timers_ = std::make_shared<TimerQueue>();
  // The server's queue is made first: the etcd clients run on its loop from their
  // first call, before the server is built at the end.
  grpc::ServerBuilder builder;
  loop_ = std::make_unique<EventLoop>(builder.AddCompletionQueue(), "holdfastd-loop");
  rpc_ = std::make_unique<RpcServer>(loop_.get(), kBriefAdminThreads, kWaitingAdminThreads);
  if (config_.audit_store != "none") {
    auto store = audit::OpenStore(config_.audit_store, AuditStoreOptions(config_));
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("audit store: ", store.status().message()));
    }
    audit_store_ = std::move(*store);
    if (auto d = audit_store_->CommitDurability(); d.ok() && !d->raised_from.empty()) {
      std::fprintf(stderr,
                   "holdfastd: WARNING: the audit store's %s would let a crash of PostgreSQL "
                   "lose events holdfastd saw committed; holdfastd runs its transactions with "
                   "%s.\n",
                   d->raised_from.c_str(), d->setting.c_str());
    }
  } else {
    std::fprintf(stderr,
                 "holdfastd: WARNING: audit.store is \"none\": grants, releases and forces are "
                 "NOT recorded, and etcd is never compacted by holdfastd.\n");
  }

  std::vector<std::unique_ptr<Cluster>> clusters;
  for (const auto& cc : EffectiveClusters(config_)) {
    auto c = StartCluster(cc, etcd_wait);
    if (!c.ok()) return c.status();
    clusters.push_back(std::move(*c));
  }
  std::unique_ptr<Placements> placements;
  if (clusters.size() > 1) {
    Cluster* control = nullptr;
    for (auto& c : clusters) {
      if (c->config.control) control = c.get();
    }
    std::set<std::string> names;
    for (auto& c : clusters) names.insert(c->name());
    placements = std::make_unique<Placements>(control->etcd.get(), control->name(), names);
    if (auto s = placements->Load(etcd::DeadlineIn(control->config.timeout)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("reading the placement of namespaces: ",
                                                 s.message()));
    }
  }
  clusters_ = std::make_unique<ClusterSet>(std::move(clusters), std::move(placements));
  Cluster& control = clusters_->control();

  // op_rate_quota: this replica joins the replica set (on the control cluster),
  // through which replicas share each namespace's quota by their published
  // demand (rate_limit.h). Each cluster's quota cache reads the namespaces it homes.
  rate_limiter_ = std::make_unique<RateLimiter>(RateLimiter::Options{});
  ReplicaSet::Options ro;
  ro.address = config_.listen;
  replicas_ = std::make_unique<ReplicaSet>(control.etcd.get(), rate_limiter_.get(), ro);
  if (auto s = replicas_->Start(etcd::DeadlineIn(control.config.timeout)); !s.ok()) {
    // Not fatal: it goes on trying; until then the others count this replica idle.
    std::fprintf(stderr, "holdfastd: joining the replica set failed (%s); retrying\n",
                 s.ToString().c_str());
  }
  for (const auto& c : clusters_->all()) {
    c->op_quota = std::make_unique<OpQuota>(c->etcd.get(), rate_limiter_.get());
  }
  const double lookups = config_.unknown_session_lookups_per_second;
  session_service_ = std::make_unique<SessionService>(
      clusters_.get(), auth_.get(),
      LookupPacer::Options{.per_second = lookups, .burst = std::max(1.0, 10 * lookups)}, timers_);
  lock_service_ = std::make_unique<LockService>(clusters_.get(), auth_.get());
  admin_service_ = std::make_unique<AdminService>(clusters_.get(), auth_.get());
  admin_service_->SetAudit(audit_store_.get(), [this](const v1::GetAuditStatusRequest& req) {
    return AuditStatus(req);
  });
  admin_service_->SetEpochs([this](const std::string& cluster) { return RestoreReason(cluster); },
                            [this] { GuardEpochsOnce(); });
  Rehomer::Options rh;
  if (const char* after = std::getenv("HOLDFAST_TEST_REHOME_EXIT_AFTER"); after && *after) {
    rh.exit_after_phase = std::atoi(after);
  }
  rehomer_ = std::make_unique<Rehomer>(clusters_.get(), audit_store_.get(), rh);
  admin_service_->SetRehomer(rehomer_.get());

  // The restore guard looks once before the first call is served: a holdfastd
  // started on a restored cluster refuses grants from its first call on.
  GuardEpochsOnce();

  if (audit_store_) {
    // Each cluster's auditor records on a connection of its own. On one shared
    // connection a record would wait, on the connection's mutex, for whatever runs
    // on it: the other clusters' records (each up to the lock wait), an operator's
    // audit query, the epoch guard; enough of those and the auditor's lease lapses
    // between renewals. Opened before the first call is served, so a store that
    // refuses the connection fails the start-up instead of a serving holdfastd.
    for (const auto& c : clusters_->all()) {
      auto own = audit::OpenStore(config_.audit_store, AuditStoreOptions(config_));
      if (!own.ok()) {
        return absl::Status(own.status().code(),
                            absl::StrCat("audit store (the auditor's connection for cluster \"",
                                         c->name(), "\"): ", own.status().message()));
      }
      c->audit_connection = std::move(*own);
    }
  }

  health_ = std::make_unique<HealthService>();
  // Every address the listen name resolves to must be free: gRPC starts when it
  // binds any of them, so with 127.0.0.1:7420 taken, `localhost:7420` would
  // serve on ::1 alone, beside whatever holds the other.
  if (auto s = net::CheckCanListen(config_.listen);
      !s.ok() && s.code() == absl::StatusCode::kUnavailable) {
    return s;
  }
  if (!config_.insecure) {
    TlsFiles::Options to;
    to.configured = {config_.tls_key_file, config_.tls_cert_file, config_.tls_ca_file};
    // Read as often as gRPC reads what it is given, so a rotation is served
    // within twice tls.refresh.
    to.check = config_.tls_refresh;
    Metrics* metrics = metrics_.get();
    to.told = [metrics](TlsFiles::Outcome outcome, const std::string& reason) {
      const bool taken = outcome == TlsFiles::Outcome::kTaken;
      if (taken) {
        std::fprintf(stderr, "holdfastd: TLS: new certificate files taken for new connections\n");
      } else {
        std::fprintf(stderr,
                     "holdfastd: TLS: ERROR: the certificate files changed and cannot be served, "
                     "serving the previous ones until they are fixed: %s\n",
                     reason.c_str());
      }
      if (metrics) metrics->OnTlsFiles("api", taken);
    };
    auto files = TlsFiles::Start(std::move(to));
    if (!files.ok()) return files.status();
    tls_files_ = *std::move(files);
  }
  int port = 0;
  builder.AddListeningPort(config_.listen, Credentials(), &port);
  builder.RegisterService(session_service_->grpc_service());
  builder.RegisterService(lock_service_->grpc_service());
  builder.RegisterService(admin_service_->grpc_service());
  builder.RegisterService(health_->grpc_service());
  // gRPC 1.51 predates the HTTP/2 rapid-reset and HPACK fixes: bound what one
  // connection can ask of us (ARCHITECTURE §12).
  builder.SetMaxReceiveMessageSize(config_.max_message_bytes);
  builder.SetMaxSendMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config_.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 * 1024);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC sets SO_REUSEPORT on Linux unless told not to: a second holdfastd (or
  // anything else) started on a port in use would then share it, the kernel
  // spreading the connections between the two, and two holdfastds on one port
  // with different etcds would each grant the same lock key. A port in use
  // fails the start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port == 0) {
    // gRPC logs why, but answers only that it could not: a bind of our own says
    // why (the port is in use, the address is not this host's).
    std::string why;
    if (auto probe = net::ListenTcp(config_.listen, 1); probe.ok()) {
      close(probe->fd);
    } else if (probe.status().code() == absl::StatusCode::kUnavailable) {
      why = std::string(probe.status().message());
    }
    if (why.empty()) why = absl::StrCat("cannot listen on ", config_.listen);
    return absl::UnavailableError(why);
  }
  session_service_->Serve(rpc_.get());
  lock_service_->Serve(rpc_.get());
  admin_service_->Serve(rpc_.get());
  health_->Serve(rpc_.get());
  health_service_.store(health_.get());
  UpdateHealth();
  for (const auto& c : clusters_->all()) c->health->Start();
  auto colon = config_.listen.rfind(':');
  bound_address_ = absl::StrCat(config_.listen.substr(0, colon), ":", port);
  if (audit_store_) {
    // One auditor per cluster (each elected on its own cluster), all writing to
    // the one audit store: its rows carry the cluster id.
    for (const auto& c : clusters_->all()) {
      audit::AuditorOptions ao;
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      ao.replica_id = absl::StrCat(host, "/", bound_address_, "/", getpid());
      ao.lease_ttl = std::chrono::duration_cast<std::chrono::seconds>(config_.audit_leader_ttl);
      ao.compaction_interval = config_.audit_compaction_interval;
      ao.compaction_keep_revisions = config_.audit_compaction_keep_revisions;
      ao.lag_warn_revisions = config_.audit_lag_warn_revisions;
      ao.flush_interval = config_.audit_flush_interval;
      ao.max_buffered_events = static_cast<size_t>(config_.audit_max_buffered_events);
      // The store is shared by every cluster's auditor: one of them prunes it (two
      // would delete the same rows, and a SQLite store serialises them all).
      if (c.get() == &control) ao.retention = config_.audit_retention;
      ao.etcd_timeout = c->config.timeout;
      c->auditor = std::make_unique<audit::Auditor>(c->etcd.get(), c->audit_connection.get(), ao);
      c->auditor->Start();
      if (c.get() == &control) control_auditor_.store(c->auditor.get());
    }
    // Shutdown stops the metrics endpoint before the auditors go.
    if (metrics_) {
      metrics_->SetAuditSource([a = control.auditor.get()] { return a->status(); });
    }
  }
  if (metrics_) {
    // Shutdown stops the metrics endpoint before the etcd clients go.
    metrics_->SetWatchSource([clusters = clusters_.get()] {
      Metrics::WatchCounts n;
      for (const auto& c : clusters->all()) {
        if (!c->etcd) continue;
        n.watchers += static_cast<int64_t>(c->etcd->watches().size());
        n.etcd_watches += static_cast<int64_t>(c->etcd->watches().etcd_watches());
      }
      return n;
    });
  }
  epoch_guard_ = std::thread([this] { GuardEpochs(); });
  return absl::OkStatus();
}

void Server::UpdateHealth() {
  auto* h = health_service_.load();
  if (h == nullptr || !clusters_) return;
  bool healthy = true, grants = true;
  for (const auto& c : clusters_->all()) {
    healthy = healthy && c->healthy.load();
    grants = grants && c->restore_reason().empty();
  }
  // The Lock service is NOT_SERVING also while grants are refused on a cluster.
  h->SetServingStatus(healthy, {{"holdfast.v1.Lock", healthy && grants}});
}

void Server::GuardEpochsOnce() {
  if (auto* p = clusters_->placements(); p != nullptr && p->stale()) {
    auto s = p->Load(etcd::DeadlineIn(clusters_->control().config.timeout));
    if (!s.ok()) {
      std::fprintf(stderr, "holdfastd: reloading placements: %s\n", s.ToString().c_str());
    }
  }
  for (const auto& c : clusters_->all()) GuardClusterOnce(*c);
}

void Server::GuardClusterOnce(Cluster& c) {
  const auto timeout = c.config.timeout;
  // A store that cannot be read leaves rules 2 and 3 unchecked this time (said
  // once in the log), not the rest: the cluster id and a noted refusal need etcd
  // only, and an audit store outage does not stop grants.
  auto state = c.epochs->Read(etcd::DeadlineIn(timeout), /*store_optional=*/true);
  if (!state.ok()) return;  // etcd unreachable: the engine refuses on its own
  const std::string where = clusters_->single() ? "" : " (cluster " + c.name() + ")";
  if (c.guard_store_ok.exchange(state->store_error.ok()) != state->store_error.ok()) {
    if (state->store_error.ok()) {
      std::fprintf(stderr, "holdfastd: restore guard%s: the audit store can be read again\n",
                   where.c_str());
    } else {
      std::fprintf(stderr,
                   "holdfastd: restore guard%s: the audit store cannot be read (%s): a restore "
                   "that kept etcd's cluster id is not looked for until it can\n",
                   where.c_str(), state->store_error.ToString().c_str());
    }
  }
  std::string reason = audit::Epochs::RestoreReason(*state);
  // Detected now, before any advance (which may follow at once, and then no
  // refusal is ever set): the views read before the restore go, and the
  // placements are read again when the control cluster was restored.
  if (!reason.empty() && c.restore_reason().empty()) {
    c.engine->ForgetHistory();
    if (auto* p = clusters_->placements(); p != nullptr && &c == &clusters_->control()) {
      p->MarkStale();  // kept until a load succeeds (GuardEpochsOnce tries again)
      if (auto s = p->Load(etcd::DeadlineIn(timeout)); !s.ok()) {
        std::fprintf(stderr, "holdfastd: reloading placements: %s\n", s.ToString().c_str());
      }
    }
  }
  // A history row above the record is also what an epoch advance shows between
  // its two writes (the row, then the record). A refusal that would be new is
  // confirmed by a second read a moment later, so an advance in flight neither
  // blocks grants (failing the waiters it would reach) nor, with
  // auto_advance_on_restore, gets advanced past again. A cluster id that changed
  // needs no confirming: no advance in flight shows one.
  if (!reason.empty() && c.restore_reason().empty() &&
      state->record.etcd_cluster_id() == state->observed_cluster_id) {
    {
      std::unique_lock l(guard_stop_mu_);
      if (guard_stop_cv_.wait_for(l, kConfirmRefusalAfter, [this] { return guard_stop_; })) return;
    }
    state = c.epochs->Read(etcd::DeadlineIn(timeout), /*store_optional=*/true);
    if (!state.ok()) return;
    reason = audit::Epochs::RestoreReason(*state);
  }
  if (!reason.empty() && config_.auto_advance_on_restore) {
    // Once: the history row and the compare-and-swap make racing replicas agree.
    auto advanced = c.epochs->Advance("restore", "holdfastd (auto_advance_on_restore)",
                                      etcd::DeadlineIn(timeout));
    std::fprintf(stderr, "holdfastd: restore detected (%s); auto_advance_on_restore: %s\n",
                 reason.c_str(),
                 advanced.ok() ? absl::StrCat("advanced to epoch ", advanced->epoch()).c_str()
                               : advanced.status().ToString().c_str());
    state = c.epochs->Read(etcd::DeadlineIn(timeout), /*store_optional=*/true);
    if (!state.ok()) return;
    reason = audit::Epochs::RestoreReason(*state);
  }
  if (!reason.empty()) {
    // Noted in etcd, the refusal stands until an advance (audit/epochs.h).
    if (auto s = c.epochs->NoteRefusal(*state, reason, etcd::DeadlineIn(timeout)); !s.ok()) {
      std::fprintf(stderr, "holdfastd: noting the restore refusal in etcd: %s\n",
                   s.ToString().c_str());
    }
  }
  if (reason == c.restore_reason()) return;
  if (reason.empty()) {
    std::fprintf(stderr, "holdfastd: epoch %d is current%s; grants resume\n",
                 state->record.epoch(), where.c_str());
  } else {
    std::fprintf(stderr, "holdfastd: RESTORE DETECTED%s: %s\n", where.c_str(), reason.c_str());
  }
  c.set_restore_reason(reason);
  c.engine->SetGrantBlock(reason);
  UpdateHealth();
}

void Server::GuardEpochs() {
  std::unique_lock l(guard_stop_mu_);
  while (!guard_stop_cv_.wait_for(l, config_.epoch_check_interval, [this] { return guard_stop_; })) {
    l.unlock();
    GuardEpochsOnce();
    l.lock();
  }
}

std::string Server::RestoreReason(const std::string& cluster) const {
  Cluster* c = cluster.empty() ? &clusters_->control() : clusters_->Named(cluster);
  return c == nullptr ? "" : c->restore_reason();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Server::EtcdCredentials(
    const ClusterConfig& cc) {
  // As the API's files (Start): re-read every tls.refresh, so a rotated client
  // certificate or CA is used for the next connection to etcd without a
  // restart, and only a set that passes the start's checks is used.
  TlsFiles::Options to;
  to.configured = {cc.key_file, cc.cert_file, cc.ca_file};
  // Named in messages as the config names it (clusters[i] by index).
  to.where = "etcd.tls.";
  for (size_t i = 0; i < config_.clusters.size(); ++i) {
    if (config_.clusters[i].name == cc.name) to.where = absl::StrCat("clusters[", i, "].tls.");
  }
  to.check = config_.tls_refresh;
  Metrics* metrics = metrics_.get();
  const std::string what = config_.clusters.empty() ? "etcd" : "etcd cluster " + cc.name;
  to.told = [metrics, what](TlsFiles::Outcome outcome, const std::string& reason) {
    const bool taken = outcome == TlsFiles::Outcome::kTaken;
    if (taken) {
      std::fprintf(stderr, "holdfastd: TLS to %s: new certificate files taken for new connections\n",
                   what.c_str());
    } else {
      std::fprintf(stderr,
                   "holdfastd: TLS to %s: ERROR: the certificate files changed and cannot be used, "
                   "using the previous ones until they are fixed: %s\n",
                   what.c_str(), reason.c_str());
    }
    if (metrics) metrics->OnTlsFiles("etcd", taken);
  };
  auto files = TlsFiles::Start(std::move(to));
  if (!files.ok()) return files.status();
  const TlsFiles::Paths& served = (*files)->served();
  const auto refresh = static_cast<unsigned>(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(config_.tls_refresh).count()));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (served.cert.empty()) {
    provider =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(served.ca, refresh);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        served.key, served.cert, served.ca, refresh);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!served.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The server's certificate must name the endpoint's host, as SslCredentials
  // checked (gRPC 1.51 adds this verifier when none is given; said here).
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  // Kept until ~Server, also when the cluster's start fails after this: Start
  // is not tried again, and its checking thread only reads files.
  etcd_tls_files_.push_back(*std::move(files));
  return grpc::experimental::TlsCredentials(options);
}

std::optional<MetricsEndpoint::Tls> Server::MetricsTls() const {
  if (config_.insecure || config_.metrics_plaintext) {
    // (Insecure on loopback says enough; off loopback, metrics.plaintext said so.)
    if (!config_.insecure || !net::IsLoopbackEndpoint(config_.metrics_listen)) {
      std::fprintf(stderr,
                   "holdfastd: WARNING: metrics.plaintext: serving metrics on %s over plain "
                   "HTTP to anyone who can reach it; they name namespaces and classes\n",
                   config_.metrics_listen.c_str());
    }
    return std::nullopt;
  }
  if (config_.metrics_readers.empty()) {
    // Before metrics.readers existed, metrics were plain HTTP to anyone: a
    // Prometheus set up then is refused now, and this says why.
    std::fprintf(stderr,
                 "holdfastd: metrics: HTTPS on %s with a client certificate required; "
                 "metrics.readers is empty, so only admin_ids may read them\n",
                 config_.metrics_listen.c_str());
  }
  MetricsEndpoint::Tls tls;
  tls.ca_file = config_.tls_ca_file;
  tls.cert_file = config_.tls_cert_file;
  tls.key_file = config_.tls_key_file;
  tls.refresh = config_.tls_refresh;
  // The reader is authenticated as an API caller is (trust domains, bundles),
  // then must be one of metrics.readers or an admin.
  tls.authorize = [auth = auth_.get(), readers = config_.metrics_readers](
                      const std::string& leaf, const std::string& chain) -> absl::Status {
    auto caller = auth->CallerOfCertificate(leaf, chain);
    if (!caller.ok()) return caller.status();
    if (auth->IsAdmin(caller->identity)) return absl::OkStatus();
    for (const auto& pattern : readers) {
      if (spiffe::Matches(caller->identity, pattern)) return absl::OkStatus();
    }
    return absl::PermissionDeniedError(
        absl::StrCat(caller->identity, " may not read metrics: it matches neither "
                     "metrics.readers nor admin_ids"));
  };
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> Server::Credentials() const {
  if (config_.insecure) {
    std::fprintf(stderr,
                 "holdfastd: WARNING: serving WITHOUT TLS on %s: every caller is %s, an admin. "
                 "For loopback development only.\n",
                 config_.listen.c_str(), config_.dev_identity.c_str());
    return grpc::InsecureServerCredentials();
  }
  // The files are re-read every `tls_refresh`: rotated SVIDs and bundles take
  // effect for new handshakes without a restart, and open streams stay up. gRPC
  // reads them through tls_files_, which lets only a whole set through.
  const TlsFiles::Paths& served = tls_files_->served();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      served.key, served.cert, served.ca,
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(config_.tls_refresh).count()));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

v1::AuditStatus Server::AuditStatus(const v1::GetAuditStatusRequest& req) const {
  v1::AuditStatus out;
  out.set_enabled(audit_store_ != nullptr);
  if (audit_store_) {
    out.set_store(config_.audit_store.rfind("sqlite:", 0) == 0 ? "sqlite" : "postgresql");
    out.set_retention_ms(config_.audit_retention.count());
    // A follower of the trail keeps its place per cluster (revisions of two
    // clusters are unrelated); a failed read leaves the list empty and says so.
    if (auto ids = audit_store_->Clusters(); ids.ok()) {
      for (uint64_t id : *ids) out.add_audited_cluster_ids(absl::StrCat(id));
    } else {
      out.set_last_error(absl::StrCat("listing audited clusters: ", ids.status().message()));
    }
    if (req.clusters_only()) return out;  // (with retention_ms, and last_error if any)
    if (auto d = audit_store_->CommitDurability(); d.ok()) {
      out.set_store_durability(d->setting);
      out.set_store_durability_raised_from(d->raised_from);
    } else if (out.last_error().empty()) {
      out.set_last_error(absl::StrCat("reading the store's durability: ", d.status().message()));
    }
  }
  if (req.clusters_only()) return out;  // audit off: `enabled` says all
  const Cluster& control = clusters_->control();
  if (const audit::Auditor* auditor = control_auditor_.load()) {
    auto st = auditor->status();
    out.set_this_replica_leads(st.leader);
    out.set_cluster_id(absl::StrCat(st.cluster_id));
    out.set_cursor(st.cursor);
    out.set_compacted_revision(st.compacted_revision);
    out.set_pruned_events(st.pruned_events);
    if (!st.last_error.empty()) out.set_last_error(st.last_error);
  }
  etcdserverpb::RangeRequest r;
  r.set_key(keyspace::AuditorKey());
  auto leader = control.etcd->RangeSync(r, etcd::DeadlineIn(control.config.timeout));
  if (leader.ok()) {
    out.set_etcd_revision(leader->header().revision());
    if (leader->kvs_size() > 0) out.set_leader(leader->kvs(0).value());
    if (out.cluster_id().empty() || out.cluster_id() == "0") {
      out.set_cluster_id(absl::StrCat(leader->header().cluster_id()));
    }
  }
  return out;
}

void Server::Shutdown(std::optional<std::chrono::milliseconds> grace_or_config) {
  const auto grace = grace_or_config.value_or(config_.shutdown_grace);
  const auto until = std::chrono::steady_clock::now() + grace;
  // No scrape from here on: it would read the auditors that go next.
  if (metrics_) metrics_->StopServing();
  {
    std::lock_guard l(guard_stop_mu_);
    guard_stop_ = true;
  }
  guard_stop_cv_.notify_all();
  if (epoch_guard_.joinable()) epoch_guard_.join();
  if (clusters_) {
    // The auditors first: each resigns, so another replica takes over at once.
    // Stopped, not destroyed: the AuditStatus RPC still reads them until the
    // gRPC server below has finished its last call.
    for (const auto& c : clusters_->all()) {
      if (c->auditor) c->auditor->Stop();
      c->health->Stop();
    }
  }
  health_service_.store(nullptr);
  if (health_) health_->Shutdown();  // NOT_SERVING, and every Watch ends
  if (rpc_) rpc_->Stop();
  // Before the gRPC server's Shutdown, which would wait for them: the waits and
  // the renewal streams go to another replica now.
  if (lock_service_) lock_service_->MoveWaits();
  if (session_service_) session_service_->EndStreams();
  if (grpc_server_) {
    // The loop runs on: the calls in flight are answered (or cancelled after
    // `grace`) there.
    grpc_server_->Shutdown(std::chrono::system_clock::now() + grace);
    grpc_server_->Wait();
  }
  if (rpc_) rpc_->StopWorkers();
  if (clusters_) {
    control_auditor_.store(nullptr);
    for (const auto& c : clusters_->all()) {
      c->auditor.reset();
      c->audit_connection.reset();
    }
    // Leave the replica set now, so the others take this replica's share at once.
    for (const auto& c : clusters_->all()) {
      if (c->op_quota) c->op_quota->Stop();
    }
    if (replicas_) replicas_->Stop();
    if (auto* p = clusters_->placements()) p->Stop();
    // The waits moved or cancelled above take their waiters out if no call asked
    // again took them over (AcquireOp::Leave: kCancelGrace), within the grace.
    for (const auto& c : clusters_->all()) {
      if (c->engine && !c->engine->WaitForLeavers(until)) {
        std::fprintf(stderr,
                     "holdfastd: shutdown_grace ended before every moved wait had ended; their "
                     "waiters stay queued until taken over or past their deadlines\n");
      }
    }
    // The engines' pending callbacks end with the etcd clients' streams. Stopped
    // first, an engine runs no timer of its calls any more (a moved wait's grace
    // when shutdown_grace ran out before it, a deadline): one would otherwise run
    // on an etcd client that is gone. (The timer queue itself runs on: the etcd
    // clients' own reconnects end on it as they are destroyed.)
    for (const auto& c : clusters_->all()) {
      if (c->engine) c->engine->Stop();
      c->etcd.reset();
    }
    // Only now: the etcd clients' last callbacks may still have reached these.
    for (const auto& c : clusters_->all()) c->op_quota.reset();
  }
  replicas_.reset();
  timers_.reset();
  // Last: nothing is left on the loop. The gRPC server goes with its queue.
  if (loop_) loop_->Shutdown();
  grpc_server_.reset();
  rpc_.reset();
  health_.reset();
  loop_.reset();
}

}  // namespace holdfast::server
