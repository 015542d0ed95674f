#include "member_network.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dev/subprocess.h"

namespace holdfast::chaos {
namespace {

constexpr char kNamespacePrefix[] = "hfchaos-";  // hfchaos-<pid>-m<m>
constexpr char kLinkPrefix[] = "hfc";            // hfc<pid>b, hfc<pid>h<m>, hfc<pid>n<m>

// Runs `ip args...`, bounded by 10 s; its output (stdout and stderr) on exit 0.
absl::StatusOr<std::string> RunIp(const std::vector<std::string>& args,
                                  const std::string& scratch_dir) {
  const std::string ip = IpBinary();
  if (ip.empty()) return absl::FailedPreconditionError("no ip(8) (package iproute2)");
  const std::string out = scratch_dir + "/ip.out";
  std::error_code ec;
  std::filesystem::remove(out, ec);
  dev::SpawnOptions so;
  so.argv = {ip};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.log_file = out;
  const std::string command = absl::StrCat("ip ", absl::StrJoin(args, " "));
  auto p = dev::Subprocess::Spawn(so);
  if (!p.ok()) return p.status();
  std::optional<int> rc = (*p)->Wait(std::chrono::seconds(10));
  if (!rc.has_value()) {
    (*p)->Signal(SIGKILL);
    (*p)->Wait();
    return absl::DeadlineExceededError(absl::StrCat(command, ": no answer in 10 s"));
  }
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  if (*rc != 0) {
    return absl::InternalError(absl::StrCat(command, ": exit ", *rc, ": ",
                                            absl::StripAsciiWhitespace(text.str())));
  }
  return text.str();
}

bool ProcessAlive(int64_t pid) {
  return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The driver pid in a name of ours ("hfchaos-<pid>-m0", "hfc<pid>h0"), or -1.
int64_t OwnerPid(const std::string& name) {
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, kNamespacePrefix)) {
    rest = rest.substr(0, rest.find('-'));
  } else if (absl::ConsumePrefix(&rest, kLinkPrefix)) {
    const size_t end = rest.find_first_not_of("0123456789");
    if (end == absl::string_view::npos || end == 0) return -1;
    const char role = rest[end];
    if (role != 'b' && role != 'h' && role != 'n') return -1;
    if (rest.substr(end + 1).find_first_not_of("0123456789") != absl::string_view::npos) {
      return -1;
    }
    rest = rest.substr(0, end);
  } else {
    return -1;
  }
  int64_t pid = 0;
  return absl::SimpleAtoi(rest, &pid) ? pid : -1;
}

// A /24 of 10.213.0.0/16 that no address or route of the machine mentions yet,
// starting at one picked by `seed` (the pid), so concurrent runs tend to differ.
absl::StatusOr<int> FreeSubnet(int seed, const std::string& scratch_dir) {
  auto addrs = RunIp({"-4", "-o", "addr", "show"}, scratch_dir);
  if (!addrs.ok()) return addrs.status();
  auto routes = RunIp({"-4", "route", "show", "table", "all"}, scratch_dir);
  if (!routes.ok()) return routes.status();
  for (int i = 0; i < 250; ++i) {
    const int s = 1 + (seed + i) % 250;
    const std::string net = absl::StrCat("10.213.", s, ".");
    if (!absl::StrContains(*addrs, net) && !absl::StrContains(*routes, net)) return s;
  }
  return absl::ResourceExhaustedError("every 10.213.<s>.0/24 is in use");
}

}  // namespace

std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

MemberNetwork::MemberNetwork(int members, std::string scratch_dir, int subnet)
    : members_(members),
      scratch_dir_(std::move(scratch_dir)),
      subnet_(subnet),
      prefix_(absl::StrCat(kLinkPrefix, getpid())),
      namespace_made_(members, false),
      cut_(members, false) {}

absl::StatusOr<std::unique_ptr<MemberNetwork>> MemberNetwork::Create(
    int members, const std::string& scratch_dir) {
  if (geteuid() != 0) return absl::FailedPreconditionError("not root");
  if (IpBinary().empty()) {
    return absl::FailedPreconditionError("no ip(8) here (package iproute2, scripts/setup.sh)");
  }
  auto subnet = FreeSubnet(static_cast<int>(getpid()), scratch_dir);
  if (!subnet.ok()) return subnet.status();
  std::unique_ptr<MemberNetwork> n(new MemberNetwork(members, scratch_dir, *subnet));
  if (absl::Status s = n->Build(); !s.ok()) {
    n->Remove();
    return s;
  }
  return n;
}

MemberNetwork::~MemberNetwork() { Remove(); }

std::string MemberNetwork::address(int m) const {
  return absl::StrCat("10.213.", subnet_, ".", 11 + m);
}

std::string MemberNetwork::namespace_name(int m) const {
  return absl::StrCat(kNamespacePrefix, getpid(), "-m", m);
}

std::vector<std::string> MemberNetwork::ExecPrefix(int m) const {
  return {IpBinary(), "netns", "exec", namespace_name(m)};
}

absl::Status MemberNetwork::Build() {
  const std::string bridge = prefix_ + "b";
  auto ip = [&](std::vector<std::string> args) { return RunIp(args, scratch_dir_).status(); };
  if (absl::Status s = ip({"link", "add", bridge, "type", "bridge", "forward_delay", "0"});
      !s.ok()) {
    return s;
  }
  bridge_made_ = true;
  // Bridged packets must not meet the host's iptables rules (br_netfilter): a
  // FORWARD policy of DROP would cut every member off. Kernels without
  // br_netfilter refuse the option, and have nothing to skip.
  (void)ip({"link", "set", bridge, "type", "bridge", "nf_call_iptables", "0",
            "nf_call_ip6tables", "0", "nf_call_arptables", "0"});
  for (auto args : std::vector<std::vector<std::string>>{
           {"addr", "add", absl::StrCat("10.213.", subnet_, ".1/24"), "dev", bridge},
           {"link", "set", bridge, "up"}}) {
    if (absl::Status s = ip(args); !s.ok()) return s;
  }
  for (int m = 0; m < members_; ++m) {
    const std::string ns = namespace_name(m);
    const std::string host_side = absl::StrCat(prefix_, "h", m);
    const std::string member_side = absl::StrCat(prefix_, "n", m);
    if (absl::Status s = ip({"netns", "add", ns}); !s.ok()) return s;
    namespace_made_[m] = true;
    for (auto args : std::vector<std::vector<std::string>>{
             {"link", "add", host_side, "type", "veth", "peer", "name", member_side, "netns", ns},
             {"link", "set", host_side, "master", bridge},
             {"link", "set", host_side, "up"},
             {"-n", ns, "addr", "add", absl::StrCat(address(m), "/24"), "dev", member_side},
             {"-n", ns, "link", "set", member_side, "up"},
             {"-n", ns, "link", "set", "lo", "up"}}) {
      if (absl::Status s = ip(args); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status MemberNetwork::Cut(int m, bool cut) {
  absl::Status s = RunIp(
      {"link", "set", absl::StrCat(prefix_, "h", m), cut ? "down" : "up"}, scratch_dir_).status();
  if (s.ok()) cut_[m] = cut;
  return s;
}

void MemberNetwork::Remove() {
  // Deleting the host side of a veth pair deletes both ends; deleting a namespace
  // deletes what is in it once its last process is gone.
  for (int m = 0; m < members_; ++m) {
    if (!namespace_made_[m]) continue;
    (void)RunIp({"link", "del", absl::StrCat(prefix_, "h", m)}, scratch_dir_);
    (void)RunIp({"netns", "del", namespace_name(m)}, scratch_dir_);
    namespace_made_[m] = false;
    cut_[m] = false;
  }
  if (bridge_made_) {
    (void)RunIp({"link", "del", prefix_ + "b"}, scratch_dir_);
    bridge_made_ = false;
  }
}

std::vector<std::string> MemberNetwork::RemoveStale(const std::string& scratch_dir) {
  std::vector<std::string> removed;
  if (geteuid() != 0 || IpBinary().empty()) return removed;
  // Objects named for this pid are stale too: none is made before this runs.
  auto stale = [](int64_t pid) { return pid > 0 && (pid == getpid() || !ProcessAlive(pid)); };
  if (auto list = RunIp({"netns", "list"}, scratch_dir); list.ok()) {
    for (absl::string_view line : absl::StrSplit(*list, '\n', absl::SkipWhitespace())) {
      const std::string ns(line.substr(0, line.find(' ')));
      if (!absl::StartsWith(ns, kNamespacePrefix) || !stale(OwnerPid(ns))) continue;
      // Members a crashed driver left running in it.
      if (auto pids = RunIp({"netns", "pids", ns}, scratch_dir); pids.ok()) {
        for (absl::string_view p : absl::StrSplit(*pids, '\n', absl::SkipWhitespace())) {
          int64_t pid = 0;
          if (absl::SimpleAtoi(p, &pid) && pid > 1) kill(static_cast<pid_t>(pid), SIGKILL);
        }
      }
      if (RunIp({"netns", "del", ns}, scratch_dir).ok()) removed.push_back(ns);
    }
  }
  if (auto links = RunIp({"-o", "link", "show"}, scratch_dir); links.ok()) {
    // "12: hfc4242h0@if11: <BROADCAST,...": host sides and bridges (a host side's
    // peer goes with it).
    std::vector<std::string> names, bridges;  // bridges go last, once they are empty
    for (absl::string_view line : absl::StrSplit(*links, '\n', absl::SkipWhitespace())) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(": ", 2));
      if (fields.size() < 2) continue;
      std::string name(fields[1].substr(0, fields[1].find('@')));
      if (!stale(OwnerPid(name))) continue;
      (name.back() == 'b' ? bridges : names).push_back(std::move(name));
    }
    names.insert(names.end(), bridges.begin(), bridges.end());
    for (const std::string& name : names) {
      if (RunIp({"link", "del", name}, scratch_dir).ok()) removed.push_back(name);
    }
  }
  return removed;
}

}  // namespace holdfast::chaos
