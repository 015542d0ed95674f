#include "server/server.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "lock/keyspace.h"

namespace holdfast::server {

Server::Server(Config config) : config_(std::move(config)) {}

Server::~Server() { Shutdown(std::chrono::milliseconds(0)); }

absl::Status Server::Start(std::chrono::milliseconds etcd_wait) {
  if (!config_.metrics_listen.empty()) {
    // First, so that the etcd calls of the start-up are seen too.
    metrics_ = std::make_unique<Metrics>();
    if (auto s = metrics_->Serve(config_.metrics_listen); !s.ok()) return s;
  }
  timers_ = std::make_shared<TimerQueue>();
  etcd::ClientOptions eo;
  eo.endpoints = config_.etcd_endpoints;
  eo.internal_timeout = config_.etcd_timeout;
  eo.observer = metrics_.get();
  if (!config_.etcd_ca_file.empty()) {
    auto creds = EtcdCredentials();
    if (!creds.ok()) return creds.status();
    eo.credentials = *creds;
  }
  auto etcd = etcd::Client::Create(eo, timers_);
  if (!etcd.ok()) return etcd.status();
  etcd_ = std::move(*etcd);

  lock::EngineOptions lo;
  lo.etcd_timeout = config_.etcd_timeout;
  lo.session_ttl_min = config_.session_ttl_min;
  lo.session_ttl_max = config_.session_ttl_max;
  lo.max_wait = config_.max_wait;
  lo.max_waiters_per_key = static_cast<size_t>(config_.max_waiters_per_key);
  lo.max_holds_per_session = static_cast<size_t>(config_.max_holds_per_session);
  lo.observer = metrics_.get();
  lock::EtcdHealth::Options ho;
  ho.probe_timeout = std::min<std::chrono::milliseconds>(config_.etcd_timeout, std::chrono::seconds(1));
  health_ = std::make_unique<lock::EtcdHealth>(
      etcd_.get(), ho, [this](bool healthy, const std::string& reason) {
        // grpc.health.v1 reports NOT_SERVING while etcd has no quorum.
        if (auto* h = health_service_.load()) h->SetServingStatus(healthy);
        std::fprintf(stderr, "holdfastd: etcd %s%s%s\n", healthy ? "healthy again" : "unhealthy",
                     healthy ? "" : ": ", healthy ? "" : reason.c_str());
      });
  lo.renew_timeout = ho.probe_timeout;
  engine_ = std::make_unique<lock::Engine>(etcd_.get(), lo, health_.get());
  registry_ = std::make_unique<lock::Registry>(etcd_.get());
  force_ = std::make_unique<lock::ForceReleases>(
      etcd_.get(), std::chrono::duration_cast<std::chrono::seconds>(config_.force_request_ttl));
  if (config_.audit_store != "none") {
    auto store = audit::OpenStore(config_.audit_store);
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("audit store: ", store.status().message()));
    }
    audit_store_ = std::move(*store);
  } else {
    std::fprintf(stderr,
                 "holdfastd: WARNING: audit.store is \"none\": grants, releases and forces are "
                 "NOT recorded, and etcd is never compacted by holdfastd.\n");
  }

  epochs_ = std::make_unique<audit::Epochs>(etcd_.get(), audit_store_.get());
  // A missing record is created above every epoch the history knows.
  auto first_epoch = epochs_->BootstrapEpoch();
  if (!first_epoch.ok()) return first_epoch.status();

  // etcd may come up after us (or be between leaders): retry the bootstrap. Short
  // attempts: a connection made while etcd is still starting can stall until its
  // deadline, and the next attempt gets a fresh one.
  auto until = std::chrono::steady_clock::now() + etcd_wait;
  auto attempt = std::min<std::chrono::milliseconds>(config_.etcd_timeout, std::chrono::seconds(1));
  absl::Status boot;
  do {
    boot = engine_->Bootstrap(etcd::DeadlineIn(attempt), *first_epoch);
    if (boot.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  if (!boot.ok()) {
    return absl::Status(boot.code(), absl::StrCat("epoch bootstrap failed: ", boot.message()));
  }
  if (auto s = epochs_->RecordCurrent(etcd::DeadlineIn(config_.etcd_timeout)); !s.ok()) {
    std::fprintf(stderr, "holdfastd: cannot write the epoch history (will not block): %s\n",
                 s.ToString().c_str());
  }

  Authenticator::Options ao;
  ao.insecure = config_.insecure;
  ao.dev_identity = config_.dev_identity;
  ao.trust_domains = config_.trust_domains;
  ao.admin_ids = config_.admin_ids;
  auth_ = std::make_unique<Authenticator>(ao);
  // op_rate_quota: this replica joins the replica set, through which replicas
  // share each namespace's quota by their published demand (rate_limit.h).
  rate_limiter_ = std::make_unique<RateLimiter>(RateLimiter::Options{});
  ReplicaSet::Options ro;
  ro.address = config_.listen;
  replicas_ = std::make_unique<ReplicaSet>(etcd_.get(), rate_limiter_.get(), ro);
  if (auto s = replicas_->Start(etcd::DeadlineIn(config_.etcd_timeout)); !s.ok()) {
    // Not fatal: it goes on trying; until then the others count this replica idle.
    std::fprintf(stderr, "holdfastd: joining the replica set failed (%s); retrying\n",
                 s.ToString().c_str());
  }
  op_quota_ = std::make_unique<OpQuota>(etcd_.get(), rate_limiter_.get());
  session_service_ =
      std::make_unique<SessionService>(engine_.get(), auth_.get(), op_quota_.get());
  lock_service_ = std::make_unique<LockService>(engine_.get(), auth_.get(), op_quota_.get());
  admin_service_ = std::make_unique<AdminService>(registry_.get(), auth_.get());
  admin_service_->SetAudit(audit_store_.get(), force_.get(), [this] { return AuditStatus(); });
  admin_service_->SetEpochs(
      epochs_.get(), [this] { return RestoreReason(); }, [this] { GuardEpochsOnce(); });

  // The restore guard looks once before the first call is served: a holdfastd
  // started on a restored cluster refuses grants from its first call on.
  GuardEpochsOnce();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config_.listen, Credentials(), &port);
  builder.RegisterService(session_service_.get());
  builder.RegisterService(lock_service_.get());
  builder.RegisterService(admin_service_.get());
  // gRPC 1.51 predates the HTTP/2 rapid-reset and HPACK fixes: bound what one
  // connection can ask of us (ARCHITECTURE §12).
  builder.SetMaxReceiveMessageSize(config_.max_message_bytes);
  builder.SetMaxSendMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config_.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 * 1024);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen));
  }
  health_service_.store(grpc_server_->GetHealthCheckService());
  if (!RestoreReason().empty()) {
    grpc_server_->GetHealthCheckService()->SetServingStatus("holdfast.v1.Lock", false);
  }
  health_->Start();
  auto colon = config_.listen.rfind(':');
  bound_address_ = absl::StrCat(config_.listen.substr(0, colon), ":", port);
  if (audit_store_) {
    audit::AuditorOptions ao;
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    ao.replica_id = absl::StrCat(host, "/", bound_address_, "/", getpid());
    ao.lease_ttl = std::chrono::duration_cast<std::chrono::seconds>(config_.audit_leader_ttl);
    ao.compaction_interval = config_.audit_compaction_interval;
    ao.compaction_keep_revisions = config_.audit_compaction_keep_revisions;
    ao.lag_warn_revisions = config_.audit_lag_warn_revisions;
    ao.etcd_timeout = config_.etcd_timeout;
    auditor_ = std::make_unique<audit::Auditor>(etcd_.get(), audit_store_.get(), ao);
    auditor_->Start();
    // Shutdown stops the metrics endpoint before the auditor goes.
    if (metrics_) metrics_->SetAuditSource([a = auditor_.get()] { return a->status(); });
  }
  epoch_guard_ = std::thread([this] { GuardEpochs(); });
  return absl::OkStatus();
}

void Server::GuardEpochsOnce() {
  auto state = epochs_->Read(etcd::DeadlineIn(config_.etcd_timeout));
  if (!state.ok()) return;  // etcd unreachable: the engine refuses on its own
  std::string reason = audit::Epochs::RestoreReason(*state);
  if (!reason.empty() && config_.auto_advance_on_restore) {
    // Once: the history row and the compare-and-swap make racing replicas agree.
    auto advanced = epochs_->Advance("restore", "holdfastd (auto_advance_on_restore)",
                                     etcd::DeadlineIn(config_.etcd_timeout));
    std::fprintf(stderr, "holdfastd: restore detected (%s); auto_advance_on_restore: %s\n",
                 reason.c_str(),
                 advanced.ok() ? absl::StrCat("advanced to epoch ", advanced->epoch()).c_str()
                               : advanced.status().ToString().c_str());
    state = epochs_->Read(etcd::DeadlineIn(config_.etcd_timeout));
    if (!state.ok()) return;
    reason = audit::Epochs::RestoreReason(*state);
  }
  std::lock_guard l(guard_mu_);
  if (reason != restore_reason_) {
    if (reason.empty()) {
      std::fprintf(stderr, "holdfastd: epoch %d is current; grants resume\n",
                   state->record.epoch());
    } else {
      std::fprintf(stderr, "holdfastd: RESTORE DETECTED: %s\n", reason.c_str());
    }
    restore_reason_ = reason;
    engine_->SetGrantBlock(reason);
    // grpc.health.v1: the Lock service is NOT_SERVING while grants are refused.
    if (auto* h = health_service_.load()) h->SetServingStatus("holdfast.v1.Lock", reason.empty());
  }
}

void Server::GuardEpochs() {
  std::unique_lock l(guard_stop_mu_);
  while (!guard_stop_cv_.wait_for(l, config_.epoch_check_interval, [this] { return guard_stop_; })) {
    l.unlock();
    GuardEpochsOnce();
    l.lock();
  }
}

std::string Server::RestoreReason() const {
  std::lock_guard l(guard_mu_);
  return restore_reason_;
}

namespace {
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Server::EtcdCredentials() const {
  grpc::SslCredentialsOptions o;
  auto ca = ReadFile(config_.etcd_ca_file);
  if (!ca.ok()) return ca.status();
  o.pem_root_certs = *ca;
  if (!config_.etcd_cert_file.empty()) {
    auto cert = ReadFile(config_.etcd_cert_file);
    auto key = ReadFile(config_.etcd_key_file);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  return grpc::SslCredentials(o);
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
  // effect for new handshakes without a restart, and open streams stay up.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config_.tls_key_file, config_.tls_cert_file, config_.tls_ca_file,
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(config_.tls_refresh).count()));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

v1::AuditStatus Server::AuditStatus() const {
  v1::AuditStatus out;
  out.set_enabled(audit_store_ != nullptr);
  if (audit_store_) {
    out.set_store(config_.audit_store.rfind("sqlite:", 0) == 0 ? "sqlite" : "postgresql");
  }
  if (auditor_) {
    auto st = auditor_->status();
    out.set_this_replica_leads(st.leader);
    out.set_cluster_id(absl::StrCat(st.cluster_id));
    out.set_cursor(st.cursor);
    out.set_compacted_revision(st.compacted_revision);
    out.set_last_error(st.last_error);
  }
  etcdserverpb::RangeRequest r;
  r.set_key(keyspace::AuditorKey());
  auto leader = etcd_->RangeSync(r, etcd::DeadlineIn(config_.etcd_timeout));
  if (leader.ok()) {
    out.set_etcd_revision(leader->header().revision());
    if (leader->kvs_size() > 0) out.set_leader(leader->kvs(0).value());
    if (out.cluster_id().empty() || out.cluster_id() == "0") {
      out.set_cluster_id(absl::StrCat(leader->header().cluster_id()));
    }
  }
  return out;
}

void Server::Shutdown(std::chrono::milliseconds grace) {
  // No scrape from here on: it would read the auditor that goes next.
  if (metrics_) metrics_->StopServing();
  {
    std::lock_guard l(guard_stop_mu_);
    guard_stop_ = true;
  }
  guard_stop_cv_.notify_all();
  if (epoch_guard_.joinable()) epoch_guard_.join();
  // The auditor first: it resigns, so another replica takes over at once.
  if (auditor_) auditor_->Stop();
  auditor_.reset();
  if (health_) health_->Stop();
  health_service_.store(nullptr);
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + grace);
    grpc_server_->Wait();
    grpc_server_.reset();
  }
  // Leave the replica set now, so the others take this replica's share at once.
  if (op_quota_) op_quota_->Stop();
  if (replicas_) replicas_->Stop();
  // The engine's pending callbacks end with the etcd client's streams.
  etcd_.reset();
  // Only now: the etcd client's last callbacks may still have reached these.
  op_quota_.reset();
  replicas_.reset();
  timers_.reset();
}

}  // namespace holdfast::server
