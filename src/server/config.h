// holdfastd configuration: a YAML file, then command-line flags over it.
//
//   listen: 127.0.0.1:7420          # gRPC API
//   etcd:                           # one etcd cluster (or `clusters:`, not both)
//     endpoints: [127.0.0.1:2379]   # members of the cluster
//     timeout: 5s                   # upper bound of one etcd round trip (100ms..1m)
//     tls:                          # holdfastd -> etcd over TLS with a client certificate
//       ca_file: /etc/holdfast/etcd-ca.pem
//       cert_file: /etc/holdfast/etcd-client.pem
//       key_file: /etc/holdfast/etcd-client-key.pem
//     plaintext: false              # without tls, endpoints must be loopback addresses
//                                   #   unless this says true (a path protected otherwise)
//   clusters:                       # several etcd clusters (instead of `etcd:`)
//     - name: main                  # [a-z0-9][a-z0-9._-]{0,62}, unique
//       tier: standard              # namespaces of this cluster_tier are homed here
//       control: true               # exactly one: placement of namespaces (keyspace.h)
//       endpoints: [10.0.0.1:2379]
//       timeout: 5s
//       tls: {ca_file: ..., cert_file: ..., key_file: ...}   # or plaintext: true, as above
//     - name: fast
//       tier: low-latency
//       endpoints: [10.0.1.1:2379]
//   sessions:
//     ttl_min: 1s                   # bounds on session TTLs (classes narrow them)
//     ttl_max: 24h                  # at most 7d
//   acquire:
//     max_wait: 1h                  # longest wait an Acquire may ask for (0s..24h; 0s:
//                                   #   none may wait, every Acquire is a try)
//     ride_with_release: 5ms        # an enqueue behind other waiters waits this long for
//                                   #   the key's next release here, to share its etcd
//                                   #   transaction (0s: never; at most 1s)
//   tls:                            # mTLS: required unless `insecure`
//     ca_file: /etc/holdfast/bundle.pem   # CAs that sign client SVIDs (re-read on change)
//     cert_file: /etc/holdfast/svid.pem   # this server's certificate chain
//     key_file: /etc/holdfast/svid_key.pem
//     trust_domains: [acme.org]     # accepted trust domains of client SPIFFE IDs
//     trust_bundles:                # each trust domain's own CAs (required with more than
//       acme.org: /etc/holdfast/acme-bundle.pem   # one domain): a client's chain must lead
//                                   #   to a CA of its SPIFFE ID's domain, not only to one
//                                   #   of ca_file (server/auth.h)
//     refresh: 10s                  # how often the files are checked for changes (1s..10m,
//                                   #   whole seconds)
//   admin_ids: [spiffe://acme.org/ops/*]   # may run the Admin API, use every namespace
//   insecure: false                 # plaintext, loopback only, every caller is dev_identity
//   shutdown_grace: 5s              # at SIGTERM, how long the calls in flight get to finish
//                                   #   before they are cancelled (0s..10m); waits and
//                                   #   renewal streams are sent to another replica at
//                                   #   once (server/server.h, Shutdown)
//   dev_identity: spiffe://holdfast.dev/dev   # identity of every caller while insecure
//   audit:                          # ARCHITECTURE §7-8
//     store: sqlite:holdfast-audit.db   # or postgresql://user@host/db; "none": no audit
//                                   #   (development only: nothing is recorded)
//     compaction_interval: 5m       # holdfastd compacts etcd (auto-compaction stays off;
//                                   #   1s..24h)
//     compaction_keep_revisions: 10000  # ... never past audit cursor - this
//     lag_warn_revisions: 100000    # backlog that is logged loudly
//     leader_ttl: 10s               # the auditor's lease: fail-over time (2s..5m, whole
//                                   #   seconds, as etcd leases)
//     force_request_ttl: 15m        # how long a force-release request waits for approval
//                                   #   (10s..24h, whole seconds)
//     flush_interval: 50ms          # one audit store transaction per this, at most,
//                                   #   while events keep coming (0s..1s; 0s: at once)
//     max_buffered_events: 50000    # events held in memory until recorded; beyond, the
//                                   #   watch waits for the store (1000..10000000)
//     retention: 0s                 # events older than this are deleted from the store
//                                   #   (0s: kept forever; else at least 1h, e.g. 90d)
//   epochs:                         # ARCHITECTURE §6, docs/operations.md
//     auto_advance_on_restore: false  # advance by itself when a restore is detected
//     check_interval: 2s            # how often the restore guard looks (100ms..1m)
//   metrics:
//     listen: 127.0.0.1:9420        # Prometheus text at GET /metrics (empty or absent:
//                                   #   off); flag --metrics-listen. With tls (not
//                                   #   insecure): HTTPS with the server's certificate,
//                                   #   a client certificate required and checked as the
//                                   #   API checks callers (tls.*), and read only by
//                                   #   readers and admin_ids (others get 403)
//     readers: [spiffe://acme.org/monitoring/prometheus]   # SPIFFE ID patterns
//     plaintext: false              # true: plain HTTP to anyone though holdfastd serves
//                                   #   mTLS (a scrape path protected otherwise); the
//                                   #   metrics name namespaces and classes
//   limits:
//     max_message_bytes: 65536      # 4096..16777216
//     max_concurrent_streams: 1000  # per connection (1..100000)
//     max_waiters_per_key: 1000     # a longer queue is refused (RESOURCE_EXHAUSTED; 1..100000)
//     max_holds_per_session: 1000   # lock keys one session holds or waits for at once;
//                                   #   one more is refused (RESOURCE_EXHAUSTED; 1..100000)
//     unknown_session_lookups_per_second: 100  # per identity and replica: KeepAlive's
//                                   #   reads of sessions that turn out not to exist (or
//                                   #   not the caller's), 10 s of it at once; past it
//                                   #   such reads wait (0: no bound; 0..1000000)
//
// Unknown keys are errors (a typo must not silently keep a default), and so is a
// key given twice. Integers are decimal; addresses are host:port (etcd's may carry
// a gRPC scheme, dns:///, but not http:// or https://); the files named are read
// at start and must be PEM certificates or keys as named (CheckConfigFiles): an
// SVID agent must have written them before holdfastd starts.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace holdfast::server {

// One etcd cluster holdfastd serves namespaces on.
struct ClusterConfig {
  std::string name = "default";
  // Namespaces whose cluster_tier is this are homed here (the first cluster of
  // the tier, in config order). A namespace with no tier is homed on the control
  // cluster; with one cluster, every namespace is.
  std::string tier;
  bool control = false;
  std::vector<std::string> endpoints;
  std::chrono::milliseconds timeout{5000};
  // TLS to etcd (empty ca: plaintext). Read at start.
  std::string ca_file, cert_file, key_file;
  // Plaintext to endpoints that are not loopback addresses (`plaintext: true`):
  // refused otherwise, since anyone on the path could read and rewrite every lock.
  bool plaintext = false;
};

struct Config {
  std::string listen = "127.0.0.1:7420";
  std::vector<std::string> etcd_endpoints = {"127.0.0.1:2379"};
  std::chrono::milliseconds etcd_timeout{5000};
  // TLS to etcd (empty ca: plaintext). Read at start.
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;
  bool etcd_plaintext = false;  // as ClusterConfig::plaintext
  std::chrono::milliseconds session_ttl_min{1000};
  std::chrono::milliseconds session_ttl_max{24 * 3600 * 1000};
  std::chrono::milliseconds max_wait{3600 * 1000};
  std::chrono::milliseconds ride_with_release{5};
  std::string dev_identity = "spiffe://holdfast.dev/dev";
  bool insecure = false;
  std::string tls_ca_file, tls_cert_file, tls_key_file;
  std::vector<std::string> trust_domains;
  std::map<std::string, std::string> trust_bundles;  // trust domain -> PEM bundle file
  std::chrono::milliseconds tls_refresh{10'000};
  std::vector<std::string> admin_ids;
  std::string audit_store = "sqlite:holdfast-audit.db";
  std::chrono::milliseconds audit_compaction_interval{5 * 60 * 1000};
  int audit_compaction_keep_revisions = 10000;
  int audit_lag_warn_revisions = 100000;
  std::chrono::milliseconds audit_leader_ttl{10'000};
  std::chrono::milliseconds force_request_ttl{15 * 60 * 1000};
  std::chrono::milliseconds audit_flush_interval{50};
  int audit_max_buffered_events = 50000;
  std::chrono::milliseconds audit_retention{0};
  bool auto_advance_on_restore = false;
  std::chrono::milliseconds epoch_check_interval{2000};
  int max_message_bytes = 64 * 1024;
  int max_concurrent_streams = 1000;
  int max_waiters_per_key = 1000;
  int max_holds_per_session = 1000;
  int unknown_session_lookups_per_second = 100;
  std::string metrics_listen;  // host:port; empty: no metrics endpoint
  std::vector<std::string> metrics_readers;  // SPIFFE ID patterns, besides admin_ids
  bool metrics_plaintext = false;            // plain HTTP though not insecure
  std::chrono::milliseconds shutdown_grace{5000};
  // `clusters:`; empty: the one cluster of the `etcd:` fields above.
  std::vector<ClusterConfig> clusters;
};

// The clusters holdfastd serves: `clusters`, or one cluster named "default" made
// of the etcd_* fields, which is the control cluster and homes every namespace.
std::vector<ClusterConfig> EffectiveClusters(const Config& c);
// --etcd: the endpoints of the control cluster.
void SetControlEndpoints(Config* c, std::vector<std::string> endpoints);
// --etcd-plaintext: the control cluster's `plaintext: true`.
void SetControlPlaintext(Config* c);

// holdfastd's flags that override the file; an absent one leaves the file's value.
struct ConfigFlags {
  std::optional<std::string> listen;
  std::optional<std::string> etcd;  // comma-separated host:port; spaces around each ignored
  std::optional<std::string> audit_store;
  std::optional<std::string> metrics_listen;  // "": no metrics endpoint
  bool insecure = false;
  bool etcd_plaintext = false;
};

// What holdfastd runs with: the file at `path` (none if empty), the flags over
// it, and then the whole checked once (ValidateConfig, CheckConfigFiles), so a
// flag can complete or correct the file (--insecure for a file without tls,
// --etcd for its endpoints). Errors: INVALID_ARGUMENT naming the key or flag and
// the problem (NOT_FOUND for a file that does not exist).
absl::StatusOr<Config> LoadConfig(const std::string& path, const ConfigFlags& flags);

// Parses YAML text and validates it. Errors: INVALID_ARGUMENT naming the key and
// the problem.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text);
// Reads and parses a file, each field checked on its own but not validated as a
// whole (flags may still change it: LoadConfig). Refuses what is not a regular
// file, with the OS's reason.
absl::StatusOr<Config> LoadConfigFile(const std::string& path);
// Checks cross-field rules (bounds, non-empty endpoints, listen address form).
absl::Status ValidateConfig(const Config& c);
// Every file the config names (tls.*, trust_bundles, etcd and cluster TLS) can be
// read and is PEM, so a typo in a path stops holdfastd at start with the key,
// path and reason, not as failed handshakes later. Reads the files.
absl::Status CheckConfigFiles(const Config& c);

// That `cert_pem` (its first certificate) and `key_pem` (a key without a
// passphrase) read and belong together; the error names `where` ("tls.",
// "etcd.") and the files' paths as CheckConfigFiles does. INVALID_ARGUMENT.
absl::Status CheckKeyPairPem(const std::string& where, const std::string& cert_path,
                             const std::string& key_path, const std::string& cert_pem,
                             const std::string& key_pem);

}  // namespace holdfast::server
