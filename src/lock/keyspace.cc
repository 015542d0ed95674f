#include "lock/keyspace.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace holdfast::keyspace {

namespace {

constexpr absl::string_view kNsDir = "/holdfast/ns/";

std::string LeaseHex(int64_t lease) {
  return absl::StrFormat("%016x", static_cast<uint64_t>(lease));
}

std::optional<int64_t> ParseLeaseHex(absl::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(v);
}

}  // namespace

std::string EpochKey() { return "/holdfast/epoch"; }
std::string RestoreRefusalKey() { return "/holdfast/restore-refusal"; }
std::string AuditMarkKey() { return "/holdfast/audit/mark"; }
std::string AuditorKey() { return "/holdfast/audit/leader"; }
std::string ForceRequestPrefix() { return "/holdfast/force/"; }
std::string ForceRequestKey(absl::string_view request_id) {
  return absl::StrCat(ForceRequestPrefix(), request_id);
}
std::string ReplicaPrefix() { return "/holdfast/replica/"; }
std::string ReplicaKey(int64_t lease) { return absl::StrCat(ReplicaPrefix(), LeaseHex(lease)); }
std::optional<int64_t> ParseReplicaKey(absl::string_view key) {
  const std::string dir = ReplicaPrefix();
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  return ParseLeaseHex(key.substr(dir.size()));
}
std::string PlacementPrefix() { return "/holdfast/placement/"; }
std::string PlacementKey(absl::string_view ns) { return absl::StrCat(PlacementPrefix(), ns); }
std::optional<std::string> ParsePlacementKey(absl::string_view key) {
  const std::string dir = PlacementPrefix();
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  std::string ns(key.substr(dir.size()));
  if (!ValidateNamespaceName(ns).ok()) return std::nullopt;
  return ns;
}
std::string NamespaceKey(absl::string_view ns) { return absl::StrCat(kNsDir, ns); }
std::string NamespacePrefix(absl::string_view ns) { return absl::StrCat(kNsDir, ns, "/"); }
std::string NamespacesBegin() { return std::string(kNsDir); }
std::string NamespacesEnd() { return PrefixEnd(kNsDir); }
std::string ClassKey(absl::string_view ns, absl::string_view id) {
  return absl::StrCat(kNsDir, ns, "/class/", id);
}
std::string ClassPrefix(absl::string_view ns) { return absl::StrCat(kNsDir, ns, "/class/"); }
std::string SessionKey(absl::string_view ns, int64_t lease) {
  return absl::StrCat(kNsDir, ns, "/session/", LeaseHex(lease));
}
std::string SessionPrefix(absl::string_view ns) { return absl::StrCat(kNsDir, ns, "/session/"); }
std::string ClaimKey(absl::string_view ns, absl::string_view lock_key, int64_t lease) {
  return absl::StrCat(ClaimPrefix(ns, lease), lock_key);
}
std::string ClaimPrefix(absl::string_view ns, int64_t lease) {
  return absl::StrCat(kNsDir, ns, "/claim/", LeaseHex(lease), "/");
}
std::string SlotKey(absl::string_view ns, int64_t index) {
  return absl::StrFormat("%s%s/slot/%08d", kNsDir, ns, index);
}
std::string SlotPrefix(absl::string_view ns) { return absl::StrCat(kNsDir, ns, "/slot/"); }
std::optional<int64_t> ParseSlotKey(absl::string_view key, absl::string_view ns) {
  std::string dir = SlotPrefix(ns);
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  int64_t index = 0;
  for (char ch : key.substr(dir.size())) {
    if (ch < '0' || ch > '9') return std::nullopt;
    index = index * 10 + (ch - '0');
  }
  return index;
}

namespace {
// [<ns>/<kind>/<lock_key>\0, <ns>/<kind>/<lock_key>\1): every lease's key of one
// lock key, and nothing of any other lock key (K1).
std::string LeasedRangeBegin(absl::string_view ns, absl::string_view kind,
                             absl::string_view lock_key) {
  std::string k = absl::StrCat(kNsDir, ns, "/", kind, "/", lock_key);
  k.push_back(kLeaseSeparator);
  return k;
}
std::string LeasedRangeEnd(absl::string_view ns, absl::string_view kind,
                           absl::string_view lock_key) {
  std::string k = absl::StrCat(kNsDir, ns, "/", kind, "/", lock_key);
  k.push_back(static_cast<char>(kLeaseSeparator + 1));
  return k;
}
}  // namespace

std::string HoldKey(absl::string_view ns, absl::string_view lock_key, int64_t lease) {
  return LeasedRangeBegin(ns, "hold", lock_key) + LeaseHex(lease);
}
std::string HoldRangeBegin(absl::string_view ns, absl::string_view lock_key) {
  return LeasedRangeBegin(ns, "hold", lock_key);
}
std::string HoldRangeEnd(absl::string_view ns, absl::string_view lock_key) {
  return LeasedRangeEnd(ns, "hold", lock_key);
}
std::string WaitKey(absl::string_view ns, absl::string_view lock_key, int64_t lease) {
  return LeasedRangeBegin(ns, "wait", lock_key) + LeaseHex(lease);
}
std::string WaitRangeBegin(absl::string_view ns, absl::string_view lock_key) {
  return LeasedRangeBegin(ns, "wait", lock_key);
}
std::string WaitRangeEnd(absl::string_view ns, absl::string_view lock_key) {
  return LeasedRangeEnd(ns, "wait", lock_key);
}

std::string HoldPrefix(absl::string_view ns, absl::string_view key_prefix) {
  return absl::StrCat(kNsDir, ns, "/hold/", key_prefix);
}

std::string WaitPrefix(absl::string_view ns) { return absl::StrCat(kNsDir, ns, "/wait/"); }

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xFF) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: "\0" means every key >= begin
}

std::optional<std::string> NamespaceOfKey(absl::string_view key) {
  if (key.substr(0, kNsDir.size()) != kNsDir) return std::nullopt;
  key.remove_prefix(kNsDir.size());
  size_t slash = key.find('/');
  std::string ns(key.substr(0, slash));
  if (!ValidateNamespaceName(ns).ok()) return std::nullopt;
  return ns;
}

namespace {
std::optional<ParsedHoldKey> ParseLeasedKey(absl::string_view key, absl::string_view kind) {
  auto ns = NamespaceOfKey(key);
  if (!ns) return std::nullopt;
  std::string dir = absl::StrCat(kNsDir, *ns, "/", kind, "/");
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  key.remove_prefix(dir.size());
  size_t sep = key.rfind(kLeaseSeparator);
  if (sep == absl::string_view::npos) return std::nullopt;
  auto lease = ParseLeaseHex(key.substr(sep + 1));
  if (!lease) return std::nullopt;
  return ParsedHoldKey{*ns, std::string(key.substr(0, sep)), *lease};
}
}  // namespace

std::optional<ParsedHoldKey> ParseHoldKey(absl::string_view key) {
  return ParseLeasedKey(key, "hold");
}

std::optional<ParsedHoldKey> ParseWaitKey(absl::string_view key) {
  return ParseLeasedKey(key, "wait");
}

std::optional<int64_t> ParseSessionKey(absl::string_view key, absl::string_view ns) {
  std::string dir = SessionPrefix(ns);
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  return ParseLeaseHex(key.substr(dir.size()));
}

std::optional<std::string> ParseClassKey(absl::string_view key, absl::string_view ns) {
  std::string dir = ClassPrefix(ns);
  if (key.substr(0, dir.size()) != dir) return std::nullopt;
  return std::string(key.substr(dir.size()));
}

}  // namespace holdfast::keyspace
