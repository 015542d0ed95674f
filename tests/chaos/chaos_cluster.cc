#include "chaos_cluster.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "dev/subprocess.h"
#include "holdfast/v1/admin.pb.h"

namespace holdfast::chaos {

absl::StatusOr<std::unique_ptr<ChaosCluster>> ChaosCluster::Start(Options options) {
  std::unique_ptr<ChaosCluster> c(new ChaosCluster());
  if (c->dir().empty()) return absl::InternalError("cannot make a temp dir");
  if (!options.member_namespaces) {
    c->partitions_skipped_ = "member namespaces were not asked for";
  } else {
    c->stale_removed_ = MemberNetwork::RemoveStale(c->dir());
    auto network = MemberNetwork::Create(options.etcd_members, c->dir());
    if (network.ok()) {
      c->network_ = *std::move(network);
      if (absl::Status s = c->StartMembers(options.etcd_members, options.pre_vote); !s.ok()) {
        c->network_.reset();
        c->partitions_skipped_ = absl::StrCat(
            "etcd members in network namespaces did not form a cluster: ", s.ToString());
      }
    } else {
      c->partitions_skipped_ =
          absl::StrCat("network namespaces not usable: ", network.status().ToString());
    }
  }
  if (c->network_ == nullptr) {
    if (absl::Status s = c->StartMembers(options.etcd_members, options.pre_vote); !s.ok()) return s;
  }

  std::vector<std::string> direct, proxied;
  for (const auto& member : c->etcd_) {
    direct.push_back(member->endpoint());
    auto proxy = TcpProxy::Start(member->options().client_port, member->options().host);
    if (!proxy.ok()) return proxy.status();
    proxied.push_back(absl::StrCat("127.0.0.1:", (*proxy)->port()));
    c->proxies_.push_back(*std::move(proxy));
  }
  for (int r = 0; r < 2; ++r) {
    auto replica = testing::HoldfastdProcess::Start(
        r == 0 ? direct : proxied, absl::StrCat(c->dir(), "/holdfastd-", r, ".log"));
    if (!replica.ok()) return replica.status();
    c->holdfastd_.push_back(*std::move(replica));
  }
  c->direct_ = direct;
  etcd::ClientOptions eo;
  eo.endpoints = direct;
  auto etcd_client = etcd::Client::Create(eo, c->timers_);
  if (!etcd_client.ok()) return etcd_client.status();
  c->etcd_client_ = *std::move(etcd_client);
  return c;
}

absl::Status ChaosCluster::StartMembers(int members, bool pre_vote) {
  std::vector<dev::EtcdOptions> options(members);
  std::string initial_cluster;
  for (int m = 0; m < members; ++m) {
    dev::EtcdOptions& o = options[m];
    o.name = absl::StrCat("m", m);
    o.data_dir = absl::StrCat(dir(), "/etcd-", m);
    if (network_ != nullptr) {
      o.host = network_->address(m);  // alone in its namespace: the usual ports
      o.client_port = 2379;
      o.peer_port = 2380;
      o.command_prefix = network_->ExecPrefix(m);
    } else {
      auto client_port = dev::PickFreePort();
      auto peer_port = dev::PickFreePort();
      if (!client_port.ok()) return client_port.status();
      if (!peer_port.ok()) return peer_port.status();
      o.client_port = *client_port;
      o.peer_port = *peer_port;
    }
    o.wait_healthy = false;  // no member is healthy before a quorum runs
    o.pre_vote = pre_vote;
    absl::StrAppend(&initial_cluster, m == 0 ? "" : ",", o.name, "=http://", o.host, ":",
                    o.peer_port);
  }
  absl::Status status;
  for (dev::EtcdOptions& o : options) {
    o.initial_cluster = initial_cluster;
    auto member = dev::EtcdProcess::Start(o);
    if (!member.ok()) {
      status = member.status();
      break;
    }
    etcd_.push_back(*std::move(member));
  }
  for (size_t m = 0; m < etcd_.size() && status.ok(); ++m) status = etcd_[m]->WaitHealthy();
  if (!status.ok()) {
    etcd_.clear();  // stops them; a second try starts a new cluster on fresh data
    for (const dev::EtcdOptions& o : options) {
      std::error_code ec;
      std::filesystem::remove_all(o.data_dir, ec);
    }
  }
  return status;
}

ChaosCluster::~ChaosCluster() {
  etcd_client_.reset();
  for (auto& replica : holdfastd_) {
    if (replica->process() != nullptr) replica->process()->Signal(SIGCONT);
  }
  holdfastd_.clear();
  proxies_.clear();
  for (auto& member : etcd_) {
    if (member->process() != nullptr) member->process()->Signal(SIGCONT);
  }
  etcd_.clear();
  network_.reset();  // after the members: their namespaces go with their last process
}

absl::StatusOr<std::unique_ptr<Client>> ChaosCluster::NewClient(int r) const {
  ClientOptions o;
  o.endpoints = {endpoint(r)};
  return Client::Connect(o);
}

absl::Status ChaosCluster::CreateNamespace(const std::string& ns) {
  auto client = NewClient(0);
  if (!client.ok()) return client.status();
  return (*client)->CreateNamespace(testing::TestNamespaceRequest(ns)).status();
}

absl::StatusOr<std::unique_ptr<testing::HoldfastdProcess>> ChaosCluster::StartAdminReplica(
    const std::string& identity) {
  const std::string config = dir() + "/admin-replica.yaml";
  {
    std::ofstream f(config, std::ios::trunc);
    f << "insecure: true\ndev_identity: " << identity << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", config));
  }
  return testing::HoldfastdProcess::Start(direct_, dir() + "/holdfastd-admin.log", 0,
                                          {"--config", config});
}

void ChaosCluster::CutReplica1(bool cut) {
  for (auto& proxy : proxies_) proxy->Cut(cut);
}

absl::Status ChaosCluster::CutMember(int m, bool cut) {
  if (network_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("members cannot be cut: ",
                                                      partitions_skipped_));
  }
  return network_->Cut(m, cut);
}

void ChaosCluster::HealAll() {
  CutReplica1(false);
  if (network_ == nullptr) return;
  for (int m = 0; m < network_->members(); ++m) {
    if (network_->cut(m)) (void)network_->Cut(m, false);
  }
}

}  // namespace holdfast::chaos
