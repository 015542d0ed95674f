// A real etcd-server process (the Debian binary) on loopback (or on an address in
// a network namespace: EtcdOptions::host), for `holdfast dev` and the tests. Single
// member by default; several EtcdProcess objects that share `initial_cluster` form
// a multi-member cluster.
//
// Thread-compatible.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dev/subprocess.h"

namespace holdfast::dev {

struct EtcdOptions {
  std::string name = "holdfast";
  std::string data_dir;       // required
  int client_port = 0;        // 0: pick a free one
  int peer_port = 0;          // 0: pick a free one
  // "name=http://127.0.0.1:port,..." for a cluster; empty: this member alone.
  std::string initial_cluster;
  std::string initial_cluster_state = "new";
  std::string log_file;       // default: <data_dir>.log
  std::vector<std::string> extra_args;  // e.g. TLS flags
  std::string client_scheme = "http";   // "https" with TLS flags in extra_args
  std::chrono::milliseconds start_timeout{20000};
  // Wait in Start() until the member reports healthy. A member of a new cluster
  // cannot be healthy before a quorum of its peers runs: start them all with
  // false, then WaitHealthy() on each.
  bool wait_healthy = true;
  // The IPv4 address the member listens on and advertises (client and peer URLs).
  std::string host = "127.0.0.1";
  // Put before the etcd command line, e.g. {"ip", "netns", "exec", "<ns>"} to run
  // the member in a network namespace. It must exec etcd in place, so that the
  // process signalled (SIGSTOP, SIGKILL) is etcd itself.
  std::vector<std::string> command_prefix;
  // --pre-vote: a member asks its peers whether it could win before it starts an
  // election, so one cut off and back (or paused) does not depose a healthy leader
  // by its higher term when it returns. Off by default in etcd 3.4; holdfast
  // recommends it (docs/operations.md).
  bool pre_vote = true;
  // SpawnOptions::kill_with_parent for the etcd process (`holdfast dev`: etcd
  // must not outlive it, even when it is SIGKILLed). Start() must then be called
  // from a thread that lives as long as etcd is to run.
  bool kill_with_parent = false;
};

class EtcdProcess {
 public:
  // Starts etcd and waits until it answers /health (or start_timeout passes).
  // Errors: NOT_FOUND (no etcd binary: run scripts/setup.sh), DEADLINE_EXCEEDED
  // (not healthy in time; the message names the log file), INTERNAL.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(EtcdOptions options);
  ~EtcdProcess();

  // host:port for gRPC clients.
  std::string endpoint() const;
  std::string peer_url() const;
  const EtcdOptions& options() const { return options_; }
  Subprocess* process() { return process_.get(); }

  // Waits until /health answers true (or the start timeout passes).
  absl::Status WaitHealthy();
  // Stops etcd (SIGTERM, then SIGKILL) and keeps its data.
  void Stop();
  // Starts it again on the same ports and data. Waits for health only when the
  // member can form a quorum alone (`wait_healthy`).
  absl::Status Restart(bool wait_healthy = true);
  // Stops etcd and starts it on another data dir (e.g. one `etcdctl snapshot
  // restore` made), same name and ports.
  absl::Status RestartOn(const std::string& data_dir);

 private:
  explicit EtcdProcess(EtcdOptions options) : options_(std::move(options)) {}
  absl::Status Launch(bool wait_healthy);

  EtcdOptions options_;
  std::unique_ptr<Subprocess> process_;
};

// Options for the `members` members of one new cluster on loopback: names m0,
// m1, ..., data directories <dir_prefix>-0, -1, ..., free client and peer ports,
// and, with several members, their shared initial_cluster and wait_healthy off
// (start them all, then WaitHealthy() on each). INTERNAL without free ports.
absl::StatusOr<std::vector<EtcdOptions>> ClusterMembers(int members,
                                                         const std::string& dir_prefix);

// The etcd binary: $HOLDFAST_ETCD_BIN, else /usr/bin/etcd, else "etcd" on PATH.
std::string EtcdBinary();

// True if GET http://127.0.0.1:<port>/health answers {"health":"true"}.
bool EtcdHealthy(int client_port);
// The same at http://<host>:<port> (an IPv4 address).
bool EtcdHealthy(const std::string& host, int client_port);

}  // namespace holdfast::dev
