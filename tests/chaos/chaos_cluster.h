// The chaos suite's cluster: a 3-member etcd cluster and 2 holdfastd replicas, real
// processes, in a temporary directory removed afterwards (with the SQLite audit
// store both replicas share, audit.db).
//
// Where the machine allows network namespaces (MemberNetwork: root and ip(8)), each
// etcd member runs in its own namespace behind a veth link that the nemesis can take
// down (CutMember: etcd_member_partition); otherwise, or when that setup fails, the
// members run on 127.0.0.1 and partitions_skipped() says why. Either way replica 0
// reaches the members directly and replica 1 through TcpProxy's that the nemesis can
// cut (CutReplica1: holdfastd_partition); both list every member, member 0 first.
//
// Thread-compatible. The destructor kills every process (SIGCONT first, for what a
// fault left stopped) and then removes the namespaces and links.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/timer_queue.h"
#include "dev/etcd_process.h"
#include "etcd/client.h"
#include "harness/cluster.h"
#include "holdfast/client.h"
#include "member_network.h"
#include "tcp_proxy.h"

namespace holdfast::chaos {

class ChaosCluster {
 public:
  struct Options {
    int etcd_members = 3;
    // Try network namespaces for the members (else loopback from the start).
    bool member_namespaces = true;
    // Members run with --pre-vote (dev::EtcdOptions::pre_vote); false: etcd 3.4's
    // default, for comparison (holdfast-chaos --no-pre-vote).
    bool pre_vote = true;
  };
  // Errors: those of starting etcd, a proxy or holdfastd (the harness's).
  static absl::StatusOr<std::unique_ptr<ChaosCluster>> Start(Options options);
  ~ChaosCluster();

  dev::EtcdProcess& etcd(int m) { return *etcd_[m]; }
  int etcd_members() const { return static_cast<int>(etcd_.size()); }
  testing::HoldfastdProcess& holdfastd(int r) { return *holdfastd_[r]; }
  std::string endpoint(int r) const { return holdfastd_[r]->endpoint(); }
  const std::string& dir() const { return dir_.path(); }
  // Every member, for checks that must not trust holdfast.
  etcd::Client& etcd_client() { return *etcd_client_; }
  // A client of replica r.
  absl::StatusOr<std::unique_ptr<Client>> NewClient(int r) const;
  // Namespace `ns` with a catch-all class (mode S, fenced, closed, TTL 1 s to 1 h).
  absl::Status CreateNamespace(const std::string& ns = "default");

  // Replica 1 cut off from every member (its clients still reach it), or healed.
  void CutReplica1(bool cut);
  // True when members run in namespaces and CutMember works.
  bool members_cuttable() const { return network_ != nullptr; }
  // Why they do not ("" when they do).
  const std::string& partitions_skipped() const { return partitions_skipped_; }
  // Member m cut off from its peers and every client (its link down), or healed.
  // FAILED_PRECONDITION when !members_cuttable().
  absl::Status CutMember(int m, bool cut);
  // A third replica, on the direct endpoints, whose every caller is `identity`
  // (insecure, dev_identity): the second admin of a two-person force-release
  // (replicas 0 and 1 answer as spiffe://holdfast.dev/dev). The caller stops it.
  absl::StatusOr<std::unique_ptr<testing::HoldfastdProcess>> StartAdminReplica(
      const std::string& identity);
  // Heals every cut (proxies and links).
  void HealAll();
  // Namespaces and links of an earlier run that died, removed at the start.
  const std::vector<std::string>& stale_removed() const { return stale_removed_; }

 private:
  ChaosCluster() = default;
  // Starts the members (in namespaces when network_ is set) and waits until all
  // are healthy; on error, stops what it started.
  absl::Status StartMembers(int members, bool pre_vote);

  testing::TempDir dir_;
  std::unique_ptr<MemberNetwork> network_;  // null: members on loopback
  std::string partitions_skipped_;
  std::vector<std::string> stale_removed_;
  std::vector<std::unique_ptr<dev::EtcdProcess>> etcd_;
  std::vector<std::unique_ptr<TcpProxy>> proxies_;  // replica 1's way to each member
  std::vector<std::unique_ptr<testing::HoldfastdProcess>> holdfastd_;
  std::shared_ptr<TimerQueue> timers_ = std::make_shared<TimerQueue>();
  std::unique_ptr<etcd::Client> etcd_client_;
  std::vector<std::string> direct_;  // every member's endpoint
};

}  // namespace holdfast::chaos
