// Network namespaces for the chaos suite's etcd members, so that the nemesis can cut
// one member off from its peers and from every client (etcd_member_partition).
//
//   host namespace  bridge hfc<pid>b with 10.213.<s>.1/24; holdfastd, the chaos
//                   clients and the driver stay here and reach the members by address
//   member m        namespace hfchaos-<pid>-m<m>, joined to the bridge by a veth pair:
//                   hfc<pid>h<m> (host side, a port of the bridge) and hfc<pid>n<m>
//                   (in the namespace) with 10.213.<s>.<11 + m>/24
//
// <pid> is the driver's, so names are unique per run and RemoveStale() tells the
// objects of a run that died (its pid is gone) from those of a run still going; <s>
// is a /24 that no address or route of the machine uses yet. Cut(m, true) takes the
// member's host-side link down: every packet to and from it is dropped (connections
// stall and retransmit, nothing is closed), as behind a dead link; Cut(m, false)
// brings it up again.
//
// Needs root and ip(8) (iproute2). Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace holdfast::chaos {

class MemberNetwork {
 public:
  // Makes the bridge, the namespaces and their links; `scratch_dir` holds ip(8)'s
  // output. Errors: FAILED_PRECONDITION (not root, or no ip(8)), INTERNAL or
  // DEADLINE_EXCEEDED naming the ip command that failed and what it printed.
  // Whatever was made is removed before an error is returned.
  static absl::StatusOr<std::unique_ptr<MemberNetwork>> Create(int members,
                                                               const std::string& scratch_dir);
  // Remove().
  ~MemberNetwork();
  MemberNetwork(const MemberNetwork&) = delete;
  MemberNetwork& operator=(const MemberNetwork&) = delete;

  int members() const { return members_; }
  // Member m's address (10.213.<s>.<11 + m>) and namespace.
  std::string address(int m) const;
  std::string namespace_name(int m) const;
  // The command prefix that runs a program in member m's namespace. `ip netns exec`
  // execs the program in place: its pid is the program's own.
  std::vector<std::string> ExecPrefix(int m) const;

  // Takes member m's link down (cut) or up (heal). Errors as Create.
  absl::Status Cut(int m, bool cut);
  bool cut(int m) const { return cut_[m]; }

  // Removes every link and namespace this object made; idempotent. Call it after
  // the processes in the namespaces have exited (a namespace lives as long as a
  // process in it does, though without its link once this ran).
  void Remove();

  // Removes the namespaces and links of earlier runs whose driver is gone (a crash
  // or SIGKILL left them), killing the processes left in those namespaces. Returns
  // the names removed. Does nothing without root or ip(8).
  static std::vector<std::string> RemoveStale(const std::string& scratch_dir);

 private:
  MemberNetwork(int members, std::string scratch_dir, int subnet);
  absl::Status Build();

  const int members_;
  const std::string scratch_dir_;
  const int subnet_;  // <s> of 10.213.<s>.0/24
  const std::string prefix_;  // hfc<pid>
  bool bridge_made_ = false;
  std::vector<bool> namespace_made_;
  std::vector<bool> cut_;
};

// ip(8) of iproute2, or "" when there is none.
std::string IpBinary();

}  // namespace holdfast::chaos
