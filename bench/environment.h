// The processes a benchmark run talks to: an etcd and a holdfastd on loopback,
// started here (in a temporary directory) unless given by address.
//
// Thread-compatible. Every process started here is stopped when the Environment
// is destroyed, also when a run fails half-way; the temporary directory is then
// removed.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dev/dev_pki.h"
#include "dev/etcd_process.h"
#include "dev/subprocess.h"
#include "holdfast/client.h"

namespace holdfast::bench {

struct EnvironmentOptions {
  // host:port of a running etcd; empty: start one.
  std::string etcd_endpoint;
  // host:port of a running holdfastd (that uses `etcd_endpoint`); empty: start one.
  std::string holdfast_endpoint;
  // The holdfastd binary to start; empty: "holdfastd" next to this executable.
  std::string holdfastd_binary;
  // Serve and call holdfastd over mTLS, as deployed: a dev PKI (lib dev/dev_pki.h)
  // in the run's directory, holdfastd started with it, every client calling with
  // the dev CLI's identity (an admin). false: holdfastd --insecure (plaintext on
  // loopback). Needs a holdfastd started here. etcd stays plaintext either way.
  bool tls = false;
};

class Environment {
 public:
  // Errors: INVALID_ARGUMENT (an address that is not loopback, --endpoint
  // without --etcd, or tls with --endpoint), NOT_FOUND (no etcd or holdfastd binary), DEADLINE_EXCEEDED
  // (a process did not become ready; the message quotes its log), INTERNAL.
  static absl::StatusOr<std::unique_ptr<Environment>> Start(const EnvironmentOptions& options);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  const std::string& etcd_endpoint() const { return etcd_endpoint_; }
  const std::string& holdfast_endpoint() const { return holdfast_endpoint_; }
  // What a libholdfast client of this run connects with: the endpoint, and the
  // dev CLI's credentials under tls.
  ClientOptions client_options() const;
  bool tls() const { return tls_; }
  // Process ids of what this run started (nullopt for processes given by address).
  std::optional<pid_t> etcd_pid() const;
  std::optional<pid_t> holdfastd_pid() const;

  // Replaces the holdfastd this run started by a fresh one (on a new port), so
  // that a workload measures its memory from a clean start. FAILED_PRECONDITION
  // when holdfastd was given by address.
  absl::Status RestartHoldfastd();

  // Stops holdfastd, then etcd. Idempotent.
  void Stop();

 private:
  Environment() = default;
  absl::Status StartEtcd();
  absl::Status StartHoldfastd(const std::string& binary);

  std::string dir_;  // temporary directory; empty when nothing was started
  std::string holdfastd_binary_;
  bool tls_ = false;
  std::optional<dev::DevPki> pki_;  // under tls
  std::string etcd_endpoint_;
  std::string holdfast_endpoint_;
  std::unique_ptr<dev::EtcdProcess> etcd_;
  std::unique_ptr<dev::Subprocess> holdfastd_;
};

// True for 127.0.0.0/8, ::1 and "localhost" host:port strings.
bool IsLoopbackEndpoint(const std::string& endpoint);

// Waits until holdfastd at `options.endpoints[0]` accepts TCP connections and
// answers Admin.GetEpoch to a client made with `options`. Errors:
// DEADLINE_EXCEEDED with the last answer; FAILED_PRECONDITION when `process` (if
// given) exits first.
absl::Status WaitForHoldfastd(ClientOptions options, std::chrono::milliseconds timeout,
                              dev::Subprocess* process = nullptr);

}  // namespace holdfast::bench
