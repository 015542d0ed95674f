// Test harness: real etcd and real holdfastd processes on free loopback ports,
// in a temporary directory that is removed afterwards. Every process is killed
// when its object goes away, also when a test fails.
//
// Thread-compatible.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dev/certs.h"
#include "dev/etcd_process.h"
#include "dev/subprocess.h"
#include "etcd/client.h"
#include "harness/stall_proxy.h"
#include "holdfast/client.h"

namespace holdfast::testing {

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Directory of the built binaries (holdfastd, holdfast).
std::string BinDir();

// Acquire options that wait up to `wait` (shared if asked).
inline AcquireOptions Waiting(std::chrono::milliseconds wait, bool shared = false) {
  AcquireOptions o;
  o.wait = wait;
  o.shared = shared;
  return o;
}

// The request that creates namespace `ns` with a catch-all class like `holdfast
// dev` makes it (mode S, fenced, closed, TTL 1 s to 1 h).
v1::CreateNamespaceRequest TestNamespaceRequest(const std::string& ns);

// One holdfastd process.
class HoldfastdProcess {
 public:
  // Starts build/bin/holdfastd against `etcd_endpoints` on a free port (or
  // `port`), and waits until it answers. Extra flags go after the defaults.
  static absl::StatusOr<std::unique_ptr<HoldfastdProcess>> Start(
      std::vector<std::string> etcd_endpoints, const std::string& log_file, int port = 0,
      std::vector<std::string> extra_args = {});
  ~HoldfastdProcess();

  std::string endpoint() const;
  int port() const { return port_; }
  dev::Subprocess* process() { return process_.get(); }
  // SIGKILL, no clean shutdown.
  void Kill();
  // SIGTERM and wait.
  void Stop();
  // Starts again on the same port with the same flags.
  absl::Status Restart();

 private:
  HoldfastdProcess() = default;
  absl::Status Launch();
  std::vector<std::string> etcd_endpoints_;
  std::vector<std::string> extra_args_;
  std::string log_file_;
  int port_ = 0;
  std::unique_ptr<dev::Subprocess> process_;
};

// Waits until a holdfastd at `endpoint` answers Admin.GetEpoch.
// With plaintext = false (TLS), waits for the port only. With `exited`, stops
// with FAILED_PRECONDITION once it says the process is gone.
absl::Status WaitForHoldfastd(const std::string& endpoint, std::chrono::milliseconds timeout,
                              bool plaintext = true,
                              const std::function<bool()>& exited = nullptr);

// One etcd member and `replicas` holdfastd processes sharing it.
// Runs the Debian package's etcdctl (API v3) with `args`; its output goes to
// DIR/etcdctl.log, which the error names.
absl::Status Etcdctl(const std::string& dir, std::vector<std::string> args);

// Restores `snapshot` (etcdctl snapshot save) into a fresh data dir under `dir`
// for `etcd`'s one member, with `cluster_token` (another token than the
// cluster's: a new cluster id), and starts `etcd` on it.
absl::Status RestoreEtcd(dev::EtcdProcess& etcd, const std::string& dir,
                         const std::string& snapshot, const std::string& cluster_token);

class TestCluster {
 public:
  struct Options {
    int replicas = 1;
    // Members of the etcd cluster (1 or 3, 5...). holdfastd gets every member's
    // endpoint, the first one first.
    int etcd_members = 1;
    std::vector<std::string> holdfastd_args;
    // Serve mTLS with a test CA; trust domain "test.holdfast", admins
    // "spiffe://test.holdfast/ops/*". Identities for NewClientAs() are made by
    // MakeIdentity(); "admin" exists from the start.
    bool tls = false;
    // etcd serves TLS and requires client certificates (--client-cert-auth);
    // holdfastd and etcd_client() present one (single member only).
    bool etcd_tls = false;
    // YAML appended to holdfastd's config (e.g. "audit: {leader_ttl: 2s}\n").
    std::string extra_config;
    // More etcd clusters (one member each, plaintext). holdfastd's config then
    // lists `clusters:` "a" (the first etcd, control, tier "a"), "b" (tier "b"),
    // "c" (tier "c")...; etcd() is cluster "a".
    int extra_etcd_clusters = 0;
    // holdfastd reaches the (single) etcd member through a StallProxy
    // (etcd_proxy()); etcd_client() goes straight to etcd.
    bool etcd_via_proxy = false;
  };
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(Options options);
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start() { return Start(Options{}); }
  ~TestCluster();

  dev::EtcdProcess& etcd(int member = 0) { return *etcd_[member]; }
  int etcd_members() const { return static_cast<int>(etcd_.size()); }
  HoldfastdProcess& holdfastd(int i = 0) { return *holdfastd_[i]; }
  std::string endpoint(int i = 0) const { return holdfastd_[i]->endpoint(); }
  const std::string& dir() const { return dir_.path(); }

  // A libholdfast client of replica i; with i < 0, of every replica, replica 0
  // first and the others in turn (fail-over).
  // With TLS, it authenticates as "admin".
  absl::StatusOr<std::unique_ptr<Client>> NewClient(int i = 0);
  // TLS: writes <dir>/certs/<name>.pem and _key.pem for `spiffe_id`, signed by
  // the test CA (or by another CA, or expired).
  absl::Status MakeIdentity(const std::string& name, const std::string& spiffe_id,
                            bool other_ca = false, bool expired = false);
  // TLS: a client presenting identity `name` ("" for none).
  absl::StatusOr<std::unique_ptr<Client>> NewClientAs(
      const std::string& name, int i = 0,
      std::chrono::milliseconds rpc_timeout = std::chrono::seconds(5));
  std::string certs_dir() const { return dir_.path() + "/certs"; }
  // Direct access to etcd, for checks that must not trust holdfast.
  etcd::Client& etcd_client() { return *etcd_client_; }
  // Options::etcd_via_proxy: the relay between holdfastd and etcd.
  StallProxy& etcd_proxy() { return *etcd_proxy_; }
  // The extra etcd clusters: i = 0 is cluster "b".
  dev::EtcdProcess& extra_etcd(int i) { return *extra_etcd_[i]; }
  etcd::Client& extra_etcd_client(int i) { return *extra_etcd_clients_[i]; }

  // Raises (or clears) etcd's NOSPACE alarm on member 0, as a backend past its
  // quota does: etcd then refuses every write but deletes and lease revokes, and
  // serves reads. Plaintext etcd only.
  absl::Status SpaceAlarm(bool on);

  // Namespace "default" with a catch-all class like `holdfast dev` makes it
  // (mode S, fenced, closed, TTL 1 s to 1 h).
  absl::Status CreateNamespace(const std::string& ns = "default");

 private:
  TestCluster() = default;
  absl::Status SetUpTls(std::vector<std::string>* holdfastd_args,
                        const std::string& extra_config);
  absl::Status SetUpEtcdTls(std::vector<std::string>* etcd_args);
  TempDir dir_;
  bool tls_ = false;
  std::string ca_cert_, ca_key_, other_ca_cert_, other_ca_key_;
  dev::Pem etcd_ca_pem_, etcd_client_pem_;
  std::shared_ptr<TimerQueue> timers_;
  std::vector<std::unique_ptr<dev::EtcdProcess>> etcd_;
  std::unique_ptr<StallProxy> etcd_proxy_;  // before holdfastd_: it goes after them
  std::vector<std::unique_ptr<HoldfastdProcess>> holdfastd_;
  std::unique_ptr<etcd::Client> etcd_client_;
  std::vector<std::unique_ptr<dev::EtcdProcess>> extra_etcd_;
  std::vector<std::unique_ptr<etcd::Client>> extra_etcd_clients_;
};

}  // namespace holdfast::testing
