#include "server/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <sys/stat.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "common/duration.h"
#include "common/loopback.h"
#include "common/openssl_error.h"
#include "common/names.h"
#include "common/pem_file.h"
#include "common/spiffe.h"

namespace holdfast::server {

namespace {

// Every key of `map` is one of `known`, and none is given twice (yaml-cpp keeps
// both and reads the first, so a second `listen:` further down would be ignored).
absl::Status Unknown(const YAML::Node& map, const std::string& where,
                     const std::set<std::string>& known) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: a key ", where.empty() ? "at the top level" : "under " + where.substr(0, where.size() - 1),
          " is not a name"));
    }
    std::string k = kv.first.as<std::string>();
    if (!known.count(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: unknown key \"", where, k, "\" (known: ", absl::StrJoin(known, ", "), ")"));
    }
    if (!seen.insert(k).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: key \"", where, k, "\" is given twice"));
    }
  }
  return absl::OkStatus();
}

// A section: a map, or empty (`sessions:` with nothing under it keeps the defaults).
absl::Status RequireMap(const YAML::Node& n, const std::string& name) {
  if (n.IsMap() || n.IsNull()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be a map"));
}

// A list of strings: `name` must be a list, each item a string (not a map, a list
// or empty); errors name the item, e.g. etcd.endpoints[1].
absl::Status ReadStringList(const YAML::Node& n, const std::string& name, const std::string& what,
                            std::vector<std::string>* out) {
  if (!n) return absl::OkStatus();
  if (!n.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be a list of ", what));
  }
  std::vector<std::string> items;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: ", name, "[", i, "] must be a string (", what, ")"));
    }
    items.push_back(n[i].as<std::string>());
  }
  *out = std::move(items);
  return absl::OkStatus();
}

absl::Status ReadDuration(const YAML::Node& n, const std::string& name,
                          std::chrono::milliseconds* out) {
  if (!n) return absl::OkStatus();
  if (!n.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be a duration"));
  }
  auto d = ParseDuration(n.as<std::string>());
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("config: ", name, ": ", d.status().message()));
  *out = *d;
  return absl::OkStatus();
}

// The bounds of each integer setting. The file's value is checked against them
// as it is read, so that one past int's range is named with them too, and
// ValidateConfig checks them again for a Config built otherwise.
struct IntRange {
  int lo;
  int hi;
};
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr IntRange kMaxMessageBytesRange{4096, 16 * 1024 * 1024};
constexpr IntRange kMaxConcurrentStreamsRange{1, 100'000};
// A queue is read whole when a call or a release decides on etcd's answer: at
// the largest waiter records (a 512-byte key, 2 KiB identity, 1 KiB holder_meta:
// about 4 KiB each), 10,000 make a read of some 40 MiB, within the etcd client's
// 64 MiB receive limit; a longer queue could no longer be read at all, and its
// key would be stuck.
constexpr IntRange kMaxWaitersPerKeyRange{1, 10'000};
constexpr IntRange kMaxHoldsPerSessionRange{1, 100'000};
constexpr IntRange kUnknownSessionLookupsRange{0, 1'000'000};
constexpr IntRange kCompactionKeepRevisionsRange{100, kIntMax};
constexpr IntRange kLagWarnRevisionsRange{1, kIntMax};
// Fewer would end the auditor's watch at every small burst while the store lags;
// more than ten million is gigabytes of holdfastd's memory.
constexpr IntRange kMaxBufferedEventsRange{1000, 10'000'000};

// "config: NAME must be between LO and HI, not VALUE".
absl::Status OutOfRange(const std::string& name, IntRange range, const std::string& value) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be between ", range.lo,
                                                 " and ", range.hi, ", not ", value));
}

absl::Status CheckRange(const std::string& name, int value, IntRange range) {
  if (value >= range.lo && value <= range.hi) return absl::OkStatus();
  return OutOfRange(name, range, absl::StrCat(value));
}

// Decimal digits only, with an optional minus sign: yaml-cpp would read 010000 as
// octal (4096) and 0x10 as hex, which nobody writing a limit means. In `range`.
absl::Status ReadInt(const YAML::Node& n, const std::string& name, IntRange range, int* out) {
  if (!n) return absl::OkStatus();
  if (!n.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be an integer"));
  }
  const std::string v = n.as<std::string>();
  const size_t digits = v.starts_with('-') ? 1 : 0;
  if (v.size() == digits ||
      !std::all_of(v.begin() + digits, v.end(), [](unsigned char ch) { return isdigit(ch); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", name, " must be an integer, not \"", v, "\""));
  }
  if (v.size() > digits + 1 && v[digits] == '0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: ", name, " \"", v, "\" has a leading zero (write it without: YAML 1.1 reads it "
        "as octal)"));
  }
  int value = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
  if (ec != std::errc() || end != v.data() + v.size() || value < range.lo || value > range.hi) {
    return OutOfRange(name, range, v);
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadBool(const YAML::Node& n, const std::string& name, bool* out) {
  if (!n) return absl::OkStatus();
  try {
    *out = n.as<bool>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be true or false"));
  }
  return absl::OkStatus();
}

absl::Status ReadString(const YAML::Node& n, const std::string& name, std::string* out) {
  if (!n) return absl::OkStatus();
  if (!n.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, " must be a string"));
  }
  *out = n.as<std::string>();
  return absl::OkStatus();
}

// The schemes gRPC takes before an etcd endpoint's host:port.
constexpr std::string_view kGrpcSchemes[] = {"dns:///", "ipv4:", "ipv6:"};

// An etcd endpoint as compared for duplicates: without its gRPC scheme, lower
// case (dns:///H:2379 and h:2379 are one member).
std::string EndpointKey(std::string_view e) {
  for (std::string_view scheme : kGrpcSchemes) {
    if (e.starts_with(scheme)) e.remove_prefix(scheme.size());
  }
  return absl::AsciiStrToLower(std::string(e));
}

// host:port, the port 1..65535; an etcd endpoint (`etcd_target`) may carry a
// gRPC scheme (dns:///, ipv4:, ipv6:), a listen address none. An etcd URL
// (etcdctl's http://h:2379) is refused by name: gRPC cannot resolve it, and
// whether TLS is spoken is the tls settings' to say. Errors name `what`
// ("config: listen", "--etcd").
absl::Status CheckHostPort(const std::string& what, const std::string& v, bool etcd_target) {
  if (v.starts_with("http://") || v.starts_with("https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", v, "\": give host:port without http:// or https:// (TLS is set by the tls "
        "settings)"));
  }
  std::string_view host_port = v;
  for (std::string_view scheme : kGrpcSchemes) {
    if (!host_port.starts_with(scheme)) continue;
    if (!etcd_target) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", v, "\": give host:port without a scheme"));
    }
    host_port.remove_prefix(scheme.size());
  }
  if (host_port.find("://") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", v, "\": give host:port", etcd_target ? " (or dns:///host:port)" : "",
        " without a scheme"));
  }
  auto colon = v.rfind(':');
  if (v.empty() || colon == std::string::npos || colon + 1 == v.size() || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", v, "\" is not host:port"));
  }
  for (size_t i = colon + 1; i < v.size(); ++i) {
    if (!isdigit(static_cast<unsigned char>(v[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " \"", v, "\" has a bad port"));
    }
  }
  if (v.size() - colon - 1 > 5 || std::stoi(v.substr(colon + 1)) < 1 ||
      std::stoi(v.substr(colon + 1)) > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", v, "\" has a bad port (1..65535)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> FromYaml(const YAML::Node& root) {
  Config c;
  if (!root || root.IsNull()) return c;
  if (!root.IsMap()) return absl::InvalidArgumentError("config: the top level must be a map");
  if (auto s = Unknown(root, "", {"listen", "etcd", "clusters", "sessions", "acquire",
                                  "dev_identity", "limits",
                                  "tls", "admin_ids", "insecure", "audit", "epochs", "metrics",
                                  "shutdown_grace"});
      !s.ok()) {
    return s;
  }
  if (auto s = ReadString(root["listen"], "listen", &c.listen); !s.ok()) return s;
  if (auto s = ReadString(root["dev_identity"], "dev_identity", &c.dev_identity); !s.ok()) return s;
  if (auto s = ReadDuration(root["shutdown_grace"], "shutdown_grace", &c.shutdown_grace); !s.ok()) {
    return s;
  }
  if (c.shutdown_grace < std::chrono::milliseconds(0) || c.shutdown_grace > std::chrono::minutes(10)) {
    return absl::InvalidArgumentError("config: shutdown_grace must be between 0s and 10m");
  }
  if (auto etcd = root["etcd"]) {
    if (auto s = RequireMap(etcd, "etcd"); !s.ok()) return s;
    if (auto s = Unknown(etcd, "etcd.", {"endpoints", "timeout", "tls", "plaintext"}); !s.ok()) {
      return s;
    }
    if (auto s = ReadBool(etcd["plaintext"], "etcd.plaintext", &c.etcd_plaintext); !s.ok()) {
      return s;
    }
    if (auto tls = etcd["tls"]) {
      if (auto s = RequireMap(tls, "etcd.tls"); !s.ok()) return s;
      if (etcd["plaintext"] && c.etcd_plaintext) {
        return absl::InvalidArgumentError(
            "config: etcd.tls and etcd.plaintext: true contradict each other; keep one");
      }
      if (auto s = Unknown(tls, "etcd.tls.", {"ca_file", "cert_file", "key_file"}); !s.ok()) {
        return s;
      }
      if (auto s = ReadString(tls["ca_file"], "etcd.tls.ca_file", &c.etcd_ca_file); !s.ok()) return s;
      if (auto s = ReadString(tls["cert_file"], "etcd.tls.cert_file", &c.etcd_cert_file); !s.ok()) return s;
      if (auto s = ReadString(tls["key_file"], "etcd.tls.key_file", &c.etcd_key_file); !s.ok()) return s;
      if (c.etcd_ca_file.empty() || c.etcd_cert_file.empty() != c.etcd_key_file.empty()) {
        return absl::InvalidArgumentError(
            "config: etcd.tls needs ca_file, and cert_file with key_file");
      }
    }
    if (auto s = ReadStringList(etcd["endpoints"], "etcd.endpoints", "host:port",
                                &c.etcd_endpoints);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadDuration(etcd["timeout"], "etcd.timeout", &c.etcd_timeout); !s.ok()) return s;
  }
  if (auto clusters = root["clusters"]) {
    if (root["etcd"]) {
      return absl::InvalidArgumentError(
          "config: give either etcd (one cluster) or clusters (several), not both");
    }
    if (!clusters.IsSequence() || clusters.size() == 0) {
      return absl::InvalidArgumentError("config: clusters must be a non-empty list");
    }
    for (const auto& n : clusters) {
      if (!n.IsMap()) return absl::InvalidArgumentError("config: each of clusters must be a map");
      const std::string where = absl::StrCat("clusters[", c.clusters.size(), "].");
      if (auto s = Unknown(n, where,
                           {"name", "tier", "control", "endpoints", "timeout", "tls", "plaintext"});
          !s.ok()) {
        return s;
      }
      ClusterConfig cc;
      cc.name.clear();
      if (auto s = ReadBool(n["plaintext"], where + "plaintext", &cc.plaintext); !s.ok()) return s;
      if (!n["name"]) {
        return absl::InvalidArgumentError(absl::StrCat("config: ", where, "name is required"));
      }
      if (auto s = ReadString(n["name"], where + "name", &cc.name); !s.ok()) return s;
      if (auto s = ReadString(n["tier"], where + "tier", &cc.tier); !s.ok()) return s;
      if (auto ctl = n["control"]) {
        try {
          cc.control = ctl.as<bool>();
        } catch (const YAML::Exception&) {
          return absl::InvalidArgumentError(
              absl::StrCat("config: ", where, "control must be true or false"));
        }
      }
      if (auto s = ReadStringList(n["endpoints"], where + "endpoints", "host:port",
                                  &cc.endpoints);
          !s.ok()) {
        return s;
      }
      if (auto s = ReadDuration(n["timeout"], where + "timeout", &cc.timeout); !s.ok()) return s;
      if (auto tls = n["tls"]) {
        if (auto s = RequireMap(tls, where + "tls"); !s.ok()) return s;
        if (cc.plaintext) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config: ", where, "tls and ", where, "plaintext: true contradict each other; "
              "keep one"));
        }
        if (auto s = Unknown(tls, where + "tls.", {"ca_file", "cert_file", "key_file"}); !s.ok()) {
          return s;
        }
        for (auto [field, out] : {std::pair{"ca_file", &cc.ca_file},
                                  std::pair{"cert_file", &cc.cert_file},
                                  std::pair{"key_file", &cc.key_file}}) {
          if (auto s = ReadString(tls[field], where + "tls." + field, out); !s.ok()) return s;
        }
        if (cc.ca_file.empty() || cc.cert_file.empty() != cc.key_file.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config: ", where, "tls needs ca_file, and cert_file with key_file"));
        }
      }
      c.clusters.push_back(std::move(cc));
    }
  }
  if (auto sessions = root["sessions"]) {
    if (auto s = RequireMap(sessions, "sessions"); !s.ok()) return s;
    if (auto s = Unknown(sessions, "sessions.", {"ttl_min", "ttl_max"}); !s.ok()) return s;
    if (auto s = ReadDuration(sessions["ttl_min"], "sessions.ttl_min", &c.session_ttl_min); !s.ok()) return s;
    if (auto s = ReadDuration(sessions["ttl_max"], "sessions.ttl_max", &c.session_ttl_max); !s.ok()) return s;
  }
  if (auto acquire = root["acquire"]) {
    if (auto s = RequireMap(acquire, "acquire"); !s.ok()) return s;
    if (auto s = Unknown(acquire, "acquire.", {"max_wait", "ride_with_release"}); !s.ok()) return s;
    if (auto s = ReadDuration(acquire["max_wait"], "acquire.max_wait", &c.max_wait); !s.ok()) return s;
    if (c.max_wait < std::chrono::milliseconds(0) || c.max_wait > std::chrono::hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: acquire.max_wait must be between 0s and 24h, not ", c.max_wait.count(), "ms"));
    }
    if (auto s = ReadDuration(acquire["ride_with_release"], "acquire.ride_with_release",
                              &c.ride_with_release);
        !s.ok()) {
      return s;
    }
    if (c.ride_with_release < std::chrono::milliseconds(0) ||
        c.ride_with_release > std::chrono::seconds(1)) {
      return absl::InvalidArgumentError(
          "config: acquire.ride_with_release must be between 0s and 1s");
    }
  }
  if (auto insecure = root["insecure"]) {
    try {
      c.insecure = insecure.as<bool>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError("config: insecure must be true or false");
    }
  }
  if (auto s = ReadStringList(root["admin_ids"], "admin_ids", "SPIFFE ID patterns",
                              &c.admin_ids);
      !s.ok()) {
    return s;
  }
  if (auto tls = root["tls"]) {
    if (auto s = RequireMap(tls, "tls"); !s.ok()) return s;
    if (auto s = Unknown(tls, "tls.", {"ca_file", "cert_file", "key_file", "trust_domains",
                                       "trust_bundles", "refresh"});
        !s.ok()) {
      return s;
    }
    if (auto bundles = tls["trust_bundles"]) {
      if (!bundles.IsMap()) {
        return absl::InvalidArgumentError(
            "config: tls.trust_bundles must map each trust domain to a PEM file");
      }
      for (const auto& kv : bundles) {
        const std::string domain = kv.first.as<std::string>();
        if (c.trust_bundles.contains(domain)) {
          return absl::InvalidArgumentError(
              absl::StrCat("config: key \"tls.trust_bundles.", domain, "\" is given twice"));
        }
        std::string file;
        if (auto s = ReadString(kv.second, "tls.trust_bundles." + domain, &file); !s.ok()) return s;
        c.trust_bundles[domain] = file;
      }
    }
    if (auto s = ReadString(tls["ca_file"], "tls.ca_file", &c.tls_ca_file); !s.ok()) return s;
    if (auto s = ReadString(tls["cert_file"], "tls.cert_file", &c.tls_cert_file); !s.ok()) return s;
    if (auto s = ReadString(tls["key_file"], "tls.key_file", &c.tls_key_file); !s.ok()) return s;
    if (auto s = ReadDuration(tls["refresh"], "tls.refresh", &c.tls_refresh); !s.ok()) return s;
    if (auto s = ReadStringList(tls["trust_domains"], "tls.trust_domains", "trust domains",
                                &c.trust_domains);
        !s.ok()) {
      return s;
    }
  }
  if (auto epochs = root["epochs"]) {
    if (auto s = RequireMap(epochs, "epochs"); !s.ok()) return s;
    if (auto s = Unknown(epochs, "epochs.", {"auto_advance_on_restore", "check_interval"});
        !s.ok()) {
      return s;
    }
    if (auto a = epochs["auto_advance_on_restore"]) {
      try {
        c.auto_advance_on_restore = a.as<bool>();
      } catch (const YAML::Exception&) {
        return absl::InvalidArgumentError(
            "config: epochs.auto_advance_on_restore must be true or false");
      }
    }
    if (auto s = ReadDuration(epochs["check_interval"], "epochs.check_interval",
                              &c.epoch_check_interval);
        !s.ok()) {
      return s;
    }
    // Longer leaves a restored cluster granting old tokens that long.
    if (c.epoch_check_interval < std::chrono::milliseconds(100) ||
        c.epoch_check_interval > std::chrono::minutes(1)) {
      return absl::InvalidArgumentError(
          "config: epochs.check_interval must be between 100ms and 1m");
    }
  }
  if (auto audit = root["audit"]) {
    if (auto s = RequireMap(audit, "audit"); !s.ok()) return s;
    if (auto s = Unknown(audit, "audit.",
                         {"store", "compaction_interval", "compaction_keep_revisions",
                          "lag_warn_revisions", "leader_ttl", "force_request_ttl",
                          "flush_interval", "max_buffered_events", "retention"});
        !s.ok()) {
      return s;
    }
    if (auto s = ReadString(audit["store"], "audit.store", &c.audit_store); !s.ok()) return s;
    if (auto s = ReadDuration(audit["compaction_interval"], "audit.compaction_interval",
                              &c.audit_compaction_interval);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(audit["compaction_keep_revisions"], "audit.compaction_keep_revisions",
                         kCompactionKeepRevisionsRange, &c.audit_compaction_keep_revisions);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(audit["lag_warn_revisions"], "audit.lag_warn_revisions",
                         kLagWarnRevisionsRange, &c.audit_lag_warn_revisions);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadDuration(audit["leader_ttl"], "audit.leader_ttl", &c.audit_leader_ttl); !s.ok()) {
      return s;
    }
    if (auto s = ReadDuration(audit["force_request_ttl"], "audit.force_request_ttl",
                              &c.force_request_ttl);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadDuration(audit["flush_interval"], "audit.flush_interval",
                              &c.audit_flush_interval);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(audit["max_buffered_events"], "audit.max_buffered_events",
                         kMaxBufferedEventsRange, &c.audit_max_buffered_events);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadDuration(audit["retention"], "audit.retention", &c.audit_retention); !s.ok()) {
      return s;
    }
  }
  if (auto metrics = root["metrics"]) {
    if (auto s = RequireMap(metrics, "metrics"); !s.ok()) return s;
    if (auto s = Unknown(metrics, "metrics.", {"listen", "readers", "plaintext"}); !s.ok()) {
      return s;
    }
    if (auto s = ReadString(metrics["listen"], "metrics.listen", &c.metrics_listen); !s.ok()) {
      return s;
    }
    if (auto s = ReadStringList(metrics["readers"], "metrics.readers", "SPIFFE ID patterns",
                                &c.metrics_readers);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadBool(metrics["plaintext"], "metrics.plaintext", &c.metrics_plaintext);
        !s.ok()) {
      return s;
    }
  }
  if (auto limits = root["limits"]) {
    if (auto s = RequireMap(limits, "limits"); !s.ok()) return s;
    if (auto s = Unknown(limits, "limits.",
                         {"max_message_bytes", "max_concurrent_streams", "max_waiters_per_key",
                          "max_holds_per_session", "unknown_session_lookups_per_second"});
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(limits["max_message_bytes"], "limits.max_message_bytes",
                         kMaxMessageBytesRange, &c.max_message_bytes);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(limits["max_concurrent_streams"], "limits.max_concurrent_streams",
                         kMaxConcurrentStreamsRange, &c.max_concurrent_streams);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(limits["max_waiters_per_key"], "limits.max_waiters_per_key",
                         kMaxWaitersPerKeyRange, &c.max_waiters_per_key);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(limits["max_holds_per_session"], "limits.max_holds_per_session",
                         kMaxHoldsPerSessionRange, &c.max_holds_per_session);
        !s.ok()) {
      return s;
    }
    if (auto s = ReadInt(limits["unknown_session_lookups_per_second"],
                         "limits.unknown_session_lookups_per_second",
                         kUnknownSessionLookupsRange, &c.unknown_session_lookups_per_second);
        !s.ok()) {
      return s;
    }
  }
  return c;
}

}  // namespace

namespace {

// The fields of the text, each checked on its own (types, units, its own bounds);
// the rules across fields are ValidateConfig's.
absl::StatusOr<Config> ParseFields(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: not valid YAML: ", e.what()));
  }
  try {
    return FromYaml(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text) {
  auto c = ParseFields(yaml_text);
  if (!c.ok()) return c;
  if (auto s = ValidateConfig(*c); !s.ok()) return s;
  return c;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    auto message = absl::StrCat("config: cannot read ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  // A pipe is fine (--config <(envsubst < holdfast.yaml.in)); a directory reads as
  // empty, which would be the defaults.
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", path, " is a directory"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseFields(ss.str());
}

absl::StatusOr<Config> LoadConfig(const std::string& path, const ConfigFlags& flags) {
  Config config;
  if (!path.empty()) {
    auto loaded = LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  // A flag's own value is checked under its name; the whole, below, in the
  // file's terms.
  if (flags.listen) {
    if (auto s = CheckHostPort("--listen", *flags.listen, false); !s.ok()) return s;
    config.listen = *flags.listen;
  }
  if (flags.insecure) config.insecure = true;
  if (flags.audit_store) {
    if (flags.audit_store->empty()) {
      return absl::InvalidArgumentError(
          "--audit-store is empty: give sqlite:PATH, postgresql://... or none");
    }
    config.audit_store = *flags.audit_store;
  }
  if (flags.metrics_listen) {
    if (!flags.metrics_listen->empty()) {
      if (auto s = CheckHostPort("--metrics-listen", *flags.metrics_listen, false); !s.ok()) {
        return s;
      }
    }
    config.metrics_listen = *flags.metrics_listen;
  }
  if (flags.etcd) {
    std::vector<std::string> endpoints;
    for (absl::string_view e : absl::StrSplit(*flags.etcd, ',')) {
      e = absl::StripAsciiWhitespace(e);
      if (e.empty()) continue;
      if (auto s = CheckHostPort("--etcd", std::string(e), true); !s.ok()) return s;
      endpoints.emplace_back(e);
    }
    if (endpoints.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd \"", *flags.etcd, "\" names no endpoint (host:port,...)"));
    }
    SetControlEndpoints(&config, std::move(endpoints));
  }
  if (flags.etcd_plaintext) SetControlPlaintext(&config);
  if (auto s = ValidateConfig(config); !s.ok()) return s;
  if (auto s = CheckConfigFiles(config); !s.ok()) return s;
  return config;
}

absl::Status CheckKeyPairPem(const std::string& where, const std::string& cert_path,
                             const std::string& key_path, const std::string& cert_pem,
                             const std::string& key_pem) {
  absl::Status s =
      holdfast::CheckKeyPairPem(where, cert_path, key_path, cert_pem, key_pem, "holdfastd");
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("config: ", s.message()));
}

namespace {

// The certificate and the key of one TLS setting belong together, and the key
// can be read without a passphrase (holdfastd has none to give). Checked at
// start: otherwise holdfastd would serve with them and every handshake would fail.
absl::Status CheckKeyPair(const std::string& where, const std::string& cert_path,
                          const std::string& key_path) {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  return CheckKeyPairPem(where, cert_path, key_path, read(cert_path), read(key_path));
}

}  // namespace

absl::Status CheckConfigFiles(const Config& c) {
  struct File {
    std::string key;
    std::string path;
    PemKind kind;
  };
  std::vector<File> files;
  auto add_tls = [&files](const std::string& where, const std::string& ca,
                          const std::string& cert, const std::string& key) {
    files.push_back({where + "ca_file", ca, PemKind::kCertificates});
    files.push_back({where + "cert_file", cert, PemKind::kCertificates});
    files.push_back({where + "key_file", key, PemKind::kPrivateKey});
  };
  if (!c.insecure) {
    add_tls("tls.", c.tls_ca_file, c.tls_cert_file, c.tls_key_file);
    for (const auto& [td, path] : c.trust_bundles) {
      files.push_back({"tls.trust_bundles." + td, path, PemKind::kCertificates});
    }
  }
  if (c.clusters.empty()) add_tls("etcd.tls.", c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file);
  for (size_t i = 0; i < c.clusters.size(); ++i) {
    const auto& cc = c.clusters[i];
    add_tls(absl::StrCat("clusters[", i, "].tls."), cc.ca_file, cc.cert_file, cc.key_file);
  }
  for (const auto& [what, path, kind] : files) {
    if (path.empty()) continue;
    if (auto s = CheckPemFile(path, kind); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", what, " ", s.message()));
    }
  }
  // Each certificate with its key (the files are there and hold PEM blocks).
  // (add_tls puts each key_file right after its cert_file.)
  for (size_t i = 1; i < files.size(); ++i) {
    const auto& f = files[i];
    if (f.kind != PemKind::kPrivateKey || f.path.empty()) continue;
    const auto& cert = files[i - 1];
    if (cert.path.empty()) continue;
    const std::string where = f.key.substr(0, f.key.size() - std::string("key_file").size());
    if (auto s = CheckKeyPair(where, cert.path, f.path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const Config& c) {
  auto host_port = [](const std::string& what, const std::string& v, bool etcd_target = false) {
    return CheckHostPort(absl::StrCat("config: ", what), v, etcd_target);
  };
  if (auto s = host_port("listen", c.listen); !s.ok()) return s;
  if (!c.metrics_listen.empty()) {
    if (auto s = host_port("metrics.listen", c.metrics_listen); !s.ok()) return s;
  }
  if (c.etcd_endpoints.empty()) {
    return absl::InvalidArgumentError("config: etcd.endpoints is empty");
  }
  for (size_t i = 0; i < c.etcd_endpoints.size(); ++i) {
    if (auto s = host_port(absl::StrCat("etcd.endpoints[", i, "]"), c.etcd_endpoints[i], true);
        !s.ok()) {
      return s;
    }
    if (std::any_of(c.etcd_endpoints.begin(), c.etcd_endpoints.begin() + i,
                    [&](const std::string& e) {
                      return EndpointKey(e) == EndpointKey(c.etcd_endpoints[i]);
                    })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: etcd.endpoints[", i, "] \"", c.etcd_endpoints[i], "\" is listed twice"));
    }
  }
  // Upper bounds below: past them a value is more likely a mistaken unit than a
  // wish, and each costs something real (a call stalled that long, a crashed
  // holder's locks held that long, a message or a stream count that much memory).
  if (c.auto_advance_on_restore && c.audit_store == "none") {
    // Without the epoch history, an advance after a restore starts from the
    // restored record, which may be older than epochs already used: an operator
    // must name the floor (holdfast epoch advance --min-epoch).
    return absl::InvalidArgumentError(
        "config: epochs.auto_advance_on_restore needs an audit store (audit.store is none): "
        "without the epoch history an advance after a restore could reuse an epoch, and "
        "tokens would repeat; advance by hand with --min-epoch");
  }
  if (c.etcd_timeout < std::chrono::milliseconds(100) || c.etcd_timeout > std::chrono::minutes(1)) {
    return absl::InvalidArgumentError("config: etcd.timeout must be between 100ms and 1m");
  }
  if (c.session_ttl_min < std::chrono::seconds(1) || c.session_ttl_min > c.session_ttl_max) {
    return absl::InvalidArgumentError(
        "config: need 1s <= sessions.ttl_min <= sessions.ttl_max");
  }
  if (c.session_ttl_max > std::chrono::hours(7 * 24)) {
    return absl::InvalidArgumentError(
        "config: sessions.ttl_max must be at most 7d (a crashed holder keeps its locks that "
        "long)");
  }
  for (const auto& [name, value, range] : {
           std::tuple{"limits.max_message_bytes", c.max_message_bytes, kMaxMessageBytesRange},
           std::tuple{"limits.max_concurrent_streams", c.max_concurrent_streams,
                      kMaxConcurrentStreamsRange},
           std::tuple{"limits.max_waiters_per_key", c.max_waiters_per_key, kMaxWaitersPerKeyRange},
           std::tuple{"limits.max_holds_per_session", c.max_holds_per_session,
                      kMaxHoldsPerSessionRange},
           std::tuple{"limits.unknown_session_lookups_per_second",
                      c.unknown_session_lookups_per_second, kUnknownSessionLookupsRange},
           std::tuple{"audit.compaction_keep_revisions", c.audit_compaction_keep_revisions,
                      kCompactionKeepRevisionsRange},
           std::tuple{"audit.lag_warn_revisions", c.audit_lag_warn_revisions,
                      kLagWarnRevisionsRange},
           std::tuple{"audit.max_buffered_events", c.audit_max_buffered_events,
                      kMaxBufferedEventsRange}}) {
    if (auto s = CheckRange(name, value, range); !s.ok()) return s;
  }
  // Rotated SVIDs (an hour's lifetime is common) must be picked up well before the
  // old ones expire; the files are read at most once a second anyway.
  if (c.tls_refresh < std::chrono::seconds(1) || c.tls_refresh > std::chrono::minutes(10)) {
    return absl::InvalidArgumentError("config: tls.refresh must be between 1s and 10m");
  }
  if (c.audit_flush_interval < std::chrono::milliseconds(0) ||
      c.audit_flush_interval > std::chrono::seconds(1)) {
    return absl::InvalidArgumentError("config: audit.flush_interval must be between 0s and 1s");
  }
  // Under an hour would prune events the auditor has barely written (more likely a
  // mistaken unit, "30m" for "30d", than a wish): refuse it rather than lose the trail.
  if (c.audit_retention != std::chrono::milliseconds(0) && c.audit_retention < std::chrono::hours(1)) {
    return absl::InvalidArgumentError(
        "config: audit.retention must be 0s (keep every event) or at least 1h");
  }
  if (c.audit_leader_ttl < std::chrono::seconds(2) ||
      c.audit_compaction_interval < std::chrono::seconds(1) ||
      c.force_request_ttl < std::chrono::seconds(10)) {
    return absl::InvalidArgumentError(
        "config: audit.leader_ttl must be >= 2s, compaction_interval >= 1s, "
        "force_request_ttl >= 10s");
  }
  // A dead auditor's lease outlives it this long (no audit meanwhile); etcd's
  // history grows this long between compactions; a force-release request stays
  // approvable this long (an old request approved by a second admin who no longer
  // knows its context).
  if (c.audit_leader_ttl > std::chrono::minutes(5) ||
      c.audit_compaction_interval > std::chrono::hours(24) ||
      c.force_request_ttl > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(
        "config: audit.leader_ttl must be at most 5m, compaction_interval at most 24h, "
        "force_request_ttl at most 24h");
  }
  // etcd leases count whole seconds, and gRPC's certificate watcher too: 2500ms
  // would act as 2s.
  for (auto [name, d] : {std::pair{"audit.leader_ttl", c.audit_leader_ttl},
                         std::pair{"audit.force_request_ttl", c.force_request_ttl},
                         std::pair{"tls.refresh", c.tls_refresh}}) {
    if (d % std::chrono::seconds(1) != std::chrono::milliseconds(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: ", name, " must be whole seconds, not ", d.count(), "ms"));
    }
  }
  if (!c.clusters.empty()) {
    std::set<std::string> seen;
    std::map<std::string, std::string> endpoint_owner;  // endpoint -> cluster
    int controls = 0;
    for (const auto& cc : c.clusters) {
      if (auto s = names::ValidateNamespaceName(cc.name); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config: cluster name \"", cc.name, "\" is invalid: use [a-z0-9][a-z0-9._-]{0,62}"));
      }
      if (!seen.insert(cc.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: cluster \"", cc.name, "\" is listed twice"));
      }
      if (cc.endpoints.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: cluster \"", cc.name, "\" has no endpoints"));
      }
      for (const auto& e : cc.endpoints) {
        if (auto s = host_port(absl::StrCat("cluster \"", cc.name, "\" endpoint"), e, true);
            !s.ok()) {
          return s;
        }
        // One etcd under two names: a rehome between them would delete the
        // namespace (its copy clears the target, its end removes the old home).
        if (auto [it, fresh] = endpoint_owner.emplace(EndpointKey(e), cc.name); !fresh) {
          if (it->second == cc.name) {
            return absl::InvalidArgumentError(absl::StrCat(
                "config: cluster \"", cc.name, "\" lists endpoint ", e, " twice"));
          }
          return absl::InvalidArgumentError(absl::StrCat(
              "config: endpoint ", e, " is listed by clusters \"", it->second, "\" and \"",
              cc.name, "\": each cluster must be its own etcd cluster"));
        }
      }
      if (cc.timeout < std::chrono::milliseconds(100) || cc.timeout > std::chrono::minutes(1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: cluster \"", cc.name, "\": timeout must be between 100ms and 1m"));
      }
      if (cc.control) ++controls;
    }
    if (controls != 1 && !(controls == 0 && c.clusters.size() == 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: exactly one of clusters must have control: true (found ", controls, ")"));
    }
  }
  // etcd holds every lock, session and policy: plaintext to it only where nobody
  // else is on the path, unless the operator says the path is protected.
  for (const auto& cc : EffectiveClusters(c)) {
    if (!cc.ca_file.empty() || cc.plaintext) continue;
    for (const auto& e : cc.endpoints) {
      if (net::IsLoopbackEndpoint(e)) continue;
      const std::string what = c.clusters.empty() ? "etcd" : absl::StrCat("cluster \"", cc.name, "\"");
      const std::string key = c.clusters.empty() ? "etcd." : "clusters[].";
      return absl::InvalidArgumentError(absl::StrCat(
          "config: ", what, " endpoint ", e, " is not a loopback address and ", key,
          "tls is not set: holdfastd would speak plaintext to etcd, where anyone on the path "
          "could read and rewrite every lock; set ", key, "tls (or ", key,
          "plaintext: true where the path is protected otherwise)"));
    }
  }
  if (auto id = spiffe::Parse(c.dev_identity); !id.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: dev_identity: ", id.status().message()));
  }
  for (const auto& a : c.admin_ids) {
    if (auto s = spiffe::ValidatePattern(a); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: admin_ids: ", s.message()));
    }
  }
  for (const auto& r : c.metrics_readers) {
    if (auto s = spiffe::ValidatePattern(r); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: metrics.readers: ", s.message()));
    }
  }
  // readers would be ignored where metrics are served over plain HTTP to anyone.
  if (!c.metrics_readers.empty() && (c.insecure || c.metrics_plaintext)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: metrics.readers needs metrics over HTTPS, but ",
        c.insecure ? "insecure: true" : "metrics.plaintext: true",
        " serves them over plain HTTP to anyone; remove one or the other"));
  }
  if (c.insecure) {
    if (!net::IsLoopbackEndpoint(c.listen)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: insecure (no TLS) is allowed only on a loopback address, not ", c.listen));
    }
    // Its metrics are plain HTTP as well: the namespaces' and classes' names to
    // anyone who can reach the address, unless the operator says so.
    if (!c.metrics_listen.empty() && !c.metrics_plaintext &&
        !net::IsLoopbackEndpoint(c.metrics_listen)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: insecure (no TLS) serves metrics over plain HTTP: metrics.listen must be a "
          "loopback address too, not ", c.metrics_listen,
          " (or set metrics.plaintext: true to serve them to anyone)"));
    }
  } else {
    if (c.tls_ca_file.empty() || c.tls_cert_file.empty() || c.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "config: tls.ca_file, tls.cert_file and tls.key_file are required (or insecure: true "
          "on a loopback address, for development)");
    }
    if (c.trust_domains.empty()) {
      return absl::InvalidArgumentError("config: tls.trust_domains is empty");
    }
    for (const auto& td : c.trust_domains) {
      if (auto id = spiffe::Parse("spiffe://" + td); !id.ok() || !id->path.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: tls.trust_domains: \"", td, "\" is not a trust domain"));
      }
    }
    // A pattern in a trust domain holdfastd does not accept admits nobody: a
    // caller from there is refused before any pattern is looked at.
    for (const auto& [key, patterns] : {std::pair{"admin_ids", &c.admin_ids},
                                        std::pair{"metrics.readers", &c.metrics_readers}}) {
      for (const auto& p : *patterns) {
        auto parsed = spiffe::ParsePattern(p);  // valid: checked above
        if (parsed.ok() && std::find(c.trust_domains.begin(), c.trust_domains.end(),
                                     parsed->trust_domain) == c.trust_domains.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config: ", key, ": \"", p, "\" is in trust domain \"", parsed->trust_domain,
              "\", which is not in tls.trust_domains (", absl::StrJoin(c.trust_domains, ", "),
              "): it would admit nobody"));
        }
      }
    }
    for (const auto& [td, file] : c.trust_bundles) {
      if (std::find(c.trust_domains.begin(), c.trust_domains.end(), td) == c.trust_domains.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config: tls.trust_bundles names \"", td, "\", which is not in tls.trust_domains"));
      }
      if (file.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: tls.trust_bundles.", td, " is empty"));
      }
    }
    // One ca_file for several domains would let any of their CAs sign an ID of
    // any of them (another domain's admins among them): each needs its own.
    if (c.trust_domains.size() > 1) {
      for (const auto& td : c.trust_domains) {
        if (!c.trust_bundles.contains(td)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config: with more than one trust domain, tls.trust_bundles must give each its "
              "own CAs; \"", td, "\" has none (with one ca_file, a CA of one domain could "
              "sign IDs of another)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

std::vector<ClusterConfig> EffectiveClusters(const Config& c) {
  if (!c.clusters.empty()) {
    std::vector<ClusterConfig> out = c.clusters;
    if (out.size() == 1) out[0].control = true;
    return out;
  }
  ClusterConfig one;
  one.name = "default";
  one.control = true;
  one.endpoints = c.etcd_endpoints;
  one.timeout = c.etcd_timeout;
  one.ca_file = c.etcd_ca_file;
  one.cert_file = c.etcd_cert_file;
  one.key_file = c.etcd_key_file;
  one.plaintext = c.etcd_plaintext;
  return {one};
}

void SetControlPlaintext(Config* c) {
  for (auto& cc : c->clusters) {
    if (cc.control || c->clusters.size() == 1) {
      cc.plaintext = true;
      return;
    }
  }
  c->etcd_plaintext = true;
}

void SetControlEndpoints(Config* c, std::vector<std::string> endpoints) {
  for (auto& cc : c->clusters) {
    if (cc.control || c->clusters.size() == 1) {
      cc.endpoints = endpoints;
      return;
    }
  }
  c->etcd_endpoints = std::move(endpoints);
}

}  // namespace holdfast::server
