#include "server/config.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "absl/strings/str_cat.h"
#include "dev/certs.h"

namespace holdfast::server {
namespace {

TEST(ConfigTest, EmptyIsDefaults) {
  auto c = ParseConfig("insecure: true");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "127.0.0.1:7420");
  EXPECT_EQ(c->etcd_endpoints, std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(c->metrics_listen, "");  // no metrics endpoint unless asked for
  EXPECT_EQ(c->audit_retention, std::chrono::milliseconds(0));  // the trail is kept forever
  EXPECT_EQ(c->shutdown_grace, std::chrono::seconds(5));
}

TEST(ConfigTest, ReadsEveryField) {
  auto c = ParseConfig(R"(
tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem, trust_domains: [acme.org]}
admin_ids: [spiffe://acme.org/ops/*]
listen: 0.0.0.0:9000
etcd:
  endpoints: [10.0.0.1:2379, 10.0.0.2:2379]
  timeout: 2s
  tls: {ca_file: /etcd-ca.pem, cert_file: /etcd.pem, key_file: /etcd-key.pem}
sessions: {ttl_min: 2s, ttl_max: 1h}
acquire: {max_wait: 10m, ride_with_release: 20ms}
limits: {max_message_bytes: 8192, max_concurrent_streams: 50}
audit: {store: "postgresql://h/db", compaction_interval: 30s, compaction_keep_revisions: 500,
        lag_warn_revisions: 7, leader_ttl: 4s, force_request_ttl: 5m, flush_interval: 200ms,
        max_buffered_events: 2000, retention: 90d}
metrics: {listen: 0.0.0.0:9420, readers: [spiffe://acme.org/monitoring/*]}
shutdown_grace: 30s
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "0.0.0.0:9000");
  EXPECT_EQ(c->etcd_endpoints.size(), 2u);
  EXPECT_EQ(c->etcd_timeout, std::chrono::seconds(2));
  EXPECT_EQ(c->etcd_ca_file, "/etcd-ca.pem");
  EXPECT_FALSE(c->etcd_plaintext);
  EXPECT_EQ(c->session_ttl_min, std::chrono::seconds(2));
  EXPECT_EQ(c->max_wait, std::chrono::minutes(10));
  EXPECT_EQ(c->ride_with_release, std::chrono::milliseconds(20));
  EXPECT_EQ(c->max_concurrent_streams, 50);
  EXPECT_EQ(c->audit_store, "postgresql://h/db");
  EXPECT_EQ(c->audit_compaction_interval, std::chrono::seconds(30));
  EXPECT_EQ(c->audit_compaction_keep_revisions, 500);
  EXPECT_EQ(c->audit_lag_warn_revisions, 7);
  EXPECT_EQ(c->audit_leader_ttl, std::chrono::seconds(4));
  EXPECT_EQ(c->force_request_ttl, std::chrono::minutes(5));
  EXPECT_EQ(c->audit_flush_interval, std::chrono::milliseconds(200));
  EXPECT_EQ(c->audit_max_buffered_events, 2000);
  EXPECT_EQ(c->audit_retention, std::chrono::hours(24 * 90));
  EXPECT_EQ(c->metrics_listen, "0.0.0.0:9420");
  EXPECT_EQ(c->metrics_readers, std::vector<std::string>{"spiffe://acme.org/monitoring/*"});
  EXPECT_FALSE(c->metrics_plaintext);
  EXPECT_EQ(c->shutdown_grace, std::chrono::seconds(30));
}

TEST(ConfigTest, ErrorsNameTheProblem) {
  struct Case {
    const char* yaml;
    const char* reason;
  } cases[] = {
      {"listen: [", "not valid YAML"},
      {"insecure: true\nlisen: 1.2.3.4:5", "unknown key \"lisen\""},
      {"insecure: true\netcd: {endpoint: [a:1]}", "unknown key \"etcd.endpoint\""},
      {"insecure: true\netcd: {timeout: 5}", "etcd.timeout: invalid duration"},
      {"insecure: true\netcd: {endpoints: []}", "etcd.endpoints is empty"},
      {"insecure: true\netcd: {endpoints: [nohost]}", "\"nohost\" is not host:port"},
      {"insecure: true\nlisten: localhost:http", "has a bad port"},
      {"insecure: true\nsessions: {ttl_min: 10s, ttl_max: 5s}", "ttl_min <= sessions.ttl_max"},
      {"insecure: true\nlimits: {max_message_bytes: many}", "must be an integer"},
      {"insecure: true\ndev_identity: bob", "not a SPIFFE ID"},
      {"- a\n- b", "top level must be a map"},
      {"listen: 0.0.0.0:7420\ninsecure: true", "only on a loopback address"},
      {"listen: 127.0.0.1:7420", "tls.ca_file, tls.cert_file and tls.key_file are required"},
      {"tls: {ca_file: a, cert_file: b, key_file: c}", "tls.trust_domains is empty"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [Acme]}", "not a trust domain"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org, partner.org]}",
       "with more than one trust domain, tls.trust_bundles must give each its own CAs; "
       "\"acme.org\" has none"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org],\n"
       "      trust_bundles: {partner.org: p.pem}}",
       "tls.trust_bundles names \"partner.org\", which is not in tls.trust_domains"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org],\n"
       "      trust_bundles: [a.pem]}",
       "tls.trust_bundles must map each trust domain to a PEM file"},
      {"insecure: true\nadmin_ids: [ops]", "admin_ids"},
      {"insecure: true\netcd: {tls: {cert_file: a}}", "etcd.tls needs ca_file"},
      {"insecure: true\naudit: {stor: x}", "unknown key \"audit.stor\""},
      {"insecure: true\nmetrics: {port: 9420}", "unknown key \"metrics.port\""},
      {"insecure: true\nmetrics: 9420", "metrics must be a map"},
      {"insecure: true\nmetrics: {listen: [a]}", "metrics.listen must be a string"},
      {"insecure: true\nmetrics: {listen: 9420}", "metrics.listen \"9420\" is not host:port"},
      {"insecure: true\nmetrics: {listen: \"localhost:metrics\"}", "has a bad port"},
      {"insecure: true\nmetrics: {readers: spiffe://a.org/x}", "metrics.readers must be a list"},
      {"insecure: true\nmetrics: {readers: [[a]]}", "metrics.readers[0] must be a string"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org]}\n"
       "metrics: {readers: [prometheus]}",
       "config: metrics.readers: "},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org]}\n"
       "metrics: {listen: 10.0.0.1:9420, readers: [spiffe://acme.prod/prometheus]}",
       "config: metrics.readers: \"spiffe://acme.prod/prometheus\" is in trust domain "
       "\"acme.prod\", which is not in tls.trust_domains (acme.org): it would admit nobody"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org]}\n"
       "admin_ids: [spiffe://acme.org/ops/*, spiffe://other.org/ops/*]",
       "config: admin_ids: \"spiffe://other.org/ops/*\" is in trust domain \"other.org\""},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org]}\n"
       "admin_ids: [spiffe://acme.org]",
       "config: admin_ids: \"spiffe://acme.org\" names a trust domain"},
      {"insecure: true\nmetrics: {plaintext: sometimes}", "metrics.plaintext must be true or false"},
      {"insecure: true\nmetrics: {listen: 127.0.0.1:9420, readers: [spiffe://a.org/p]}",
       "config: metrics.readers needs metrics over HTTPS, but insecure: true serves them over "
       "plain HTTP to anyone; remove one or the other"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org]}\n"
       "metrics: {listen: 10.0.0.1:9420, plaintext: true, readers: [spiffe://acme.org/p]}",
       "but metrics.plaintext: true serves them"},
      {"insecure: true\nepochs: {auto_advance_on_restore: maybe}", "true or false"},
      {"insecure: true\naudit: {store: none}\nepochs: {auto_advance_on_restore: true}",
       "config: epochs.auto_advance_on_restore needs an audit store (audit.store is none)"},
      {"insecure: true\nepochs: {check_interval: 1ms}", "check_interval must be between 100ms"},
      {"insecure: true\nlimits: {max_waiters_per_key: 0}",
       "max_waiters_per_key must be between 1 and 10000"},
      {"insecure: true\nlimits: {max_waiters_per_key: 10001}",
       "max_waiters_per_key must be between 1 and 10000"},
      {"insecure: true\nlimits: {max_holds_per_session: 0}",
       "max_holds_per_session must be between 1 and 100000"},
      {"insecure: true\nlimits: {max_holds_per_session: 1000000}",
       "max_holds_per_session must be between 1 and 100000"},
      {"insecure: true\nlimits: {unknown_session_lookups_per_second: -1}",
       "unknown_session_lookups_per_second must be between 0 and 1000000"},
      {"insecure: true\nlimits: {unknown_session_lookups_per_second: 1000001}",
       "unknown_session_lookups_per_second must be between 0 and 1000000"},
      {"insecure: true\nlimits: {max_message_bytes: 4095}",
       "limits.max_message_bytes must be between 4096 and 16777216"},
      {"insecure: true\nlimits: {max_message_bytes: 1073741824}",
       "limits.max_message_bytes must be between 4096 and 16777216"},
      {"insecure: true\nlimits: {max_concurrent_streams: 0}",
       "limits.max_concurrent_streams must be between 1 and 100000"},
      {"insecure: true\nlimits: {max_concurrent_streams: 1000000}",
       "limits.max_concurrent_streams must be between 1 and 100000"},
      {"insecure: true\nsessions: {ttl_max: 30d}", "sessions.ttl_max must be at most 7d"},
      {"insecure: true\netcd: {timeout: 10m}", "etcd.timeout must be between 100ms and 1m"},
      {"insecure: true\netcd: {timeout: 50ms}", "etcd.timeout must be between 100ms and 1m"},
      {"insecure: true\nepochs: {check_interval: 2h}",
       "epochs.check_interval must be between 100ms and 1m"},
      {"insecure: true\naudit: {force_request_ttl: 7d}", "force_request_ttl at most 24h"},
      {"insecure: true\naudit: {leader_ttl: 1h}", "audit.leader_ttl must be at most 5m"},
      {"insecure: true\naudit: {compaction_interval: 48h}", "compaction_interval at most 24h"},
      {"insecure: true\naudit: [x]", "audit must be a map"},
      {"insecure: true\naudit: {leader_ttl: 1s}", "audit.leader_ttl must be >= 2s"},
      {"insecure: true\naudit: {compaction_keep_revisions: 5}",
       "config: audit.compaction_keep_revisions must be between 100 and 2147483647, not 5"},
      {"insecure: true\naudit: {lag_warn_revisions: 0}",
       "config: audit.lag_warn_revisions must be between 1 and 2147483647, not 0"},
      {"insecure: true\naudit: {force_request_ttl: soon}", "audit.force_request_ttl: invalid duration"},
      {"insecure: true\naudit: {flush_interval: 2s}", "audit.flush_interval must be between 0s and 1s"},
      {"insecure: true\naudit: {max_buffered_events: 999}",
       "audit.max_buffered_events must be between 1000 and 10000000"},
      {"insecure: true\naudit: {max_buffered_events: many}", "audit.max_buffered_events"},
      {"insecure: true\nacquire: {max_wait: 25h}", "acquire.max_wait must be between 0s and 24h"},
      {"insecure: true\nacquire: {ride_with_release: 2s}",
       "acquire.ride_with_release must be between 0s and 1s"},
      {"insecure: true\nshutdown_grace: 11m", "shutdown_grace must be between 0s and 10m"},
      {"insecure: true\nshutdown_grace: soon", "shutdown_grace: invalid duration"},
      {"insecure: true\naudit: {flush_interval: -5ms}", "audit.flush_interval: invalid duration"},
      {"insecure: true\naudit: {retention: 30m}",
       "audit.retention must be 0s (keep every event) or at least 1h"},
      {"insecure: true\naudit: {retention: 3mo}", "audit.retention: invalid duration"},
      {"insecure: true\ntls: {refresh: 0s}", "config: tls.refresh must be between 1s and 10m"},
      {"insecure: true\ntls: {refresh: 2h}", "config: tls.refresh must be between 1s and 10m"},
      {"insecure: true\netcd: {timeout: 1s}\nclusters: [{name: a, endpoints: [h:1]}]",
       "either etcd (one cluster) or clusters"},
      {"insecure: true\nclusters: []", "clusters must be a non-empty list"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1], zone: x}]",
       "unknown key \"clusters[0].zone\""},
      {"insecure: true\nclusters: [{name: A, endpoints: [h:1]}]", "cluster name \"A\" is invalid"},
      {"insecure: true\nclusters: [{name: a}]", "cluster \"a\" has no endpoints"},
      {"insecure: true\nclusters: [{name: a, control: true, endpoints: [127.0.0.1:1], timeout: 2m}]",
       "cluster \"a\": timeout must be between 100ms and 1m"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h]}]", "is not host:port"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1]}, {name: a, endpoints: [h:2]}]",
       "cluster \"a\" is listed twice"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1]}, {name: b, endpoints: [h:2]}]",
       "exactly one of clusters must have control: true (found 0)"},
      {"insecure: true\nclusters: [{name: a, control: true, endpoints: [h:1, h:2]}, "
       "{name: b, endpoints: [h:3, h:2]}]",
       "config: endpoint h:2 is listed by clusters \"a\" and \"b\": each cluster must be its "
       "own etcd cluster"},
      // Plaintext to etcd off this machine only when asked for by name.
      {"insecure: true\netcd: {endpoints: [127.0.0.1:2379, 10.0.0.5:2379]}",
       "etcd endpoint 10.0.0.5:2379 is not a loopback address and etcd.tls is not set"},
      {"insecure: true\netcd: {endpoints: [127.example.org:2379]}",
       "etcd endpoint 127.example.org:2379 is not a loopback address"},
      {"insecure: true\netcd: {endpoints: [etcd.internal:2379]}",
       "set etcd.tls (or etcd.plaintext: true where the path is protected otherwise)"},
      {"insecure: true\nclusters: [{name: a, endpoints: [10.0.0.5:2379]}]",
       "cluster \"a\" endpoint 10.0.0.5:2379 is not a loopback address and clusters[].tls"},
      {"insecure: true\netcd: {endpoints: [10.0.0.5:2379], plaintext: yes please}",
       "etcd.plaintext must be true or false"},
      // A key given twice: yaml-cpp would read the first and drop the second.
      {"insecure: true\nlisten: 127.0.0.1:1\nlisten: 127.0.0.1:2", "key \"listen\" is given twice"},
      {"insecure: true\nsessions: {ttl_min: 1s, ttl_min: 2s}",
       "key \"sessions.ttl_min\" is given twice"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [acme.org],\n"
       "      trust_bundles: {acme.org: a.pem, acme.org: b.pem}}",
       "key \"tls.trust_bundles.acme.org\" is given twice"},
      // Sections that are not maps, and list items that are not strings.
      {"insecure: true\nlimits:\n  - max_message_bytes: 8192", "config: limits must be a map"},
      {"insecure: true\netcd: {tls: /etc/ca.pem}", "config: etcd.tls must be a map"},
      {"insecure: true\nsessions: []", "config: sessions must be a map"},
      {"insecure: true\nacquire: 5m", "config: acquire must be a map"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1], tls: x}]",
       "config: clusters[0].tls must be a map"},
      {"insecure: true\netcd: {endpoints: [{host: 10.0.0.1, port: 2379}]}",
       "config: etcd.endpoints[0] must be a string (host:port)"},
      {"insecure: true\netcd: {endpoints: [127.0.0.1:2379, ~]}",
       "config: etcd.endpoints[1] must be a string (host:port)"},
      {"insecure: true\nclusters: [{name: a, endpoints: [[h:1]]}]",
       "config: clusters[0].endpoints[0] must be a string"},
      {"insecure: true\nadmin_ids: [[spiffe://a.org/x]]", "config: admin_ids[0] must be a string"},
      {"tls: {ca_file: a, cert_file: b, key_file: c, trust_domains: [{acme: org}]}",
       "config: tls.trust_domains[0] must be a string"},
      {"insecure: true\n? [a, b]\n: 1", "config: a key at the top level is not a name"},
      // Integers: decimal, in range.
      {"insecure: true\nlimits: {max_message_bytes: 065536}",
       "config: limits.max_message_bytes \"065536\" has a leading zero"},
      {"insecure: true\nlimits: {max_message_bytes: 0x10000}",
       "config: limits.max_message_bytes must be an integer, not \"0x10000\""},
      {"insecure: true\nlimits: {max_message_bytes: [1]}",
       "config: limits.max_message_bytes must be an integer"},
      {"insecure: true\naudit: {max_buffered_events: 3000000000}",
       "config: audit.max_buffered_events must be between 1000 and 10000000, not 3000000000"},
      {"insecure: true\nlimits: {max_waiters_per_key: 99999999999999999999999}",
       "config: limits.max_waiters_per_key must be between 1 and 10000, not "
       "99999999999999999999999"},
      {"insecure: true\nlimits: {max_message_bytes: -1}",
       "config: limits.max_message_bytes must be between 4096 and 16777216, not -1"},
      // Addresses: no scheme, a port in range.
      {"insecure: true\netcd: {endpoints: [\"http://127.0.0.1:2379\"]}",
       "config: etcd.endpoints[0] \"http://127.0.0.1:2379\": give host:port without http:// or "
       "https://"},
      {"insecure: true\nclusters: [{name: a, endpoints: [\"https://10.0.0.1:2379\"], "
       "plaintext: true}]",
       "cluster \"a\" endpoint \"https://10.0.0.1:2379\": give host:port without http://"},
      {"insecure: true\nlisten: \"dns:///127.0.0.1:7420\"",
       "config: listen \"dns:///127.0.0.1:7420\": give host:port without a scheme"},
      {"insecure: true\nlisten: \"ipv4:127.0.0.1:7420\"", "give host:port without a scheme"},
      {"insecure: true\netcd: {endpoints: [\"etcd://127.0.0.1:2379\"]}",
       "config: etcd.endpoints[0] \"etcd://127.0.0.1:2379\": give host:port (or dns:///host:port) "
       "without a scheme"},
      {"insecure: true\netcd: {endpoints: [127.0.0.1:2379, \"dns:///127.0.0.1:2379\"]}",
       "config: etcd.endpoints[1] \"dns:///127.0.0.1:2379\" is listed twice"},
      {"insecure: true\nclusters: [{name: a, control: true, endpoints: [h:2379], plaintext: true},\n"
       "  {name: b, endpoints: [\"dns:///H:2379\"], plaintext: true}]",
       "config: endpoint dns:///H:2379 is listed by clusters \"a\" and \"b\""},
      {"insecure: true\nlisten: 127.0.0.1:74200", "listen \"127.0.0.1:74200\" has a bad port (1..65535)"},
      {"insecure: true\nlisten: 127.0.0.1:0", "listen \"127.0.0.1:0\" has a bad port (1..65535)"},
      {"insecure: true\netcd: {endpoints: [127.0.0.1:99999]}",
       "etcd.endpoints[0] \"127.0.0.1:99999\" has a bad port (1..65535)"},
      {"insecure: true\nmetrics: {listen: \"127.0.0.1:123456789012\"}",
       "metrics.listen \"127.0.0.1:123456789012\" has a bad port (1..65535)"},
      {"insecure: true\netcd: {endpoints: [127.0.0.1:2379, 127.0.0.1:2379]}",
       "config: etcd.endpoints[1] \"127.0.0.1:2379\" is listed twice"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1, h:1]}]",
       "config: cluster \"a\" lists endpoint h:1 twice"},
      // Settings that contradict each other, or are missing.
      {"insecure: true\netcd: {plaintext: true, tls: {ca_file: a}}",
       "config: etcd.tls and etcd.plaintext: true contradict each other; keep one"},
      {"insecure: true\nclusters: [{name: a, endpoints: [h:1], plaintext: true, tls: {ca_file: a}}]",
       "config: clusters[0].tls and clusters[0].plaintext: true contradict each other"},
      {"insecure: true\nclusters: [{endpoints: [h:1]}]", "config: clusters[0].name is required"},
      // Counted in whole seconds where they are used.
      {"insecure: true\naudit: {leader_ttl: 2500ms}",
       "config: audit.leader_ttl must be whole seconds, not 2500ms"},
      {"insecure: true\naudit: {force_request_ttl: 90500ms}",
       "config: audit.force_request_ttl must be whole seconds"},
      {"insecure: true\ntls: {refresh: 1500ms}", "config: tls.refresh must be whole seconds"},
  };
  for (const auto& c : cases) {
    auto r = ParseConfig(c.yaml);
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(r.status().message().find(c.reason), std::string::npos)
        << c.yaml << " -> " << r.status().message();
  }
}

TEST(ConfigTest, ClustersListSeveralEtcdClustersOneOfThemControl) {
  auto c = ParseConfig(R"(
insecure: true
clusters:
  - {name: main, tier: standard, endpoints: [10.0.0.1:2379], plaintext: true}
  - name: fast
    tier: low-latency
    control: true
    endpoints: [10.0.1.1:2379, 10.0.1.2:2379]
    timeout: 2s
    tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  auto clusters = EffectiveClusters(*c);
  ASSERT_EQ(clusters.size(), 2u);
  EXPECT_EQ(clusters[0].name, "main");
  EXPECT_FALSE(clusters[0].control);
  EXPECT_TRUE(clusters[0].plaintext);
  EXPECT_FALSE(clusters[1].plaintext);
  EXPECT_EQ(clusters[1].tier, "low-latency");
  EXPECT_TRUE(clusters[1].control);
  EXPECT_EQ(clusters[1].timeout, std::chrono::seconds(2));
  EXPECT_EQ(clusters[1].ca_file, "/ca.pem");
  SetControlEndpoints(&*c, {"127.0.0.1:1"});
  EXPECT_EQ(EffectiveClusters(*c)[1].endpoints, std::vector<std::string>{"127.0.0.1:1"});
  EXPECT_EQ(EffectiveClusters(*c)[0].endpoints, std::vector<std::string>{"10.0.0.1:2379"});
}

TEST(ConfigTest, TheEtcdSectionIsOneControlClusterNamedDefault) {
  auto c = ParseConfig(
      "insecure: true\netcd: {endpoints: [10.0.0.1:2379], timeout: 3s, plaintext: true}");
  ASSERT_TRUE(c.ok()) << c.status();
  auto clusters = EffectiveClusters(*c);
  ASSERT_EQ(clusters.size(), 1u);
  EXPECT_EQ(clusters[0].name, "default");
  EXPECT_TRUE(clusters[0].control);
  EXPECT_EQ(clusters[0].endpoints, std::vector<std::string>{"10.0.0.1:2379"});
  EXPECT_EQ(clusters[0].timeout, std::chrono::seconds(3));
  SetControlEndpoints(&*c, {"127.0.0.1:1"});
  EXPECT_EQ(EffectiveClusters(*c)[0].endpoints, std::vector<std::string>{"127.0.0.1:1"});
}

// --etcd 10.0.0.5:2379 needs --etcd-plaintext (or etcd.tls) to pass validation.
TEST(ConfigTest, EtcdPlaintextOptsTheControlClusterIn) {
  auto c = ParseConfig("insecure: true");
  ASSERT_TRUE(c.ok()) << c.status();
  SetControlEndpoints(&*c, {"10.0.0.5:2379"});
  EXPECT_EQ(ValidateConfig(*c).code(), absl::StatusCode::kInvalidArgument);
  SetControlPlaintext(&*c);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  EXPECT_TRUE(EffectiveClusters(*c)[0].plaintext);
}

// A Config built in code is held to the bounds the file is read with.
TEST(ConfigTest, IntegersSetInCodeAreCheckedAgainstTheFilesBounds) {
  auto c = ParseConfig("insecure: true");
  ASSERT_TRUE(c.ok()) << c.status();
  c->max_holds_per_session = 0;
  EXPECT_EQ(ValidateConfig(*c).message(),
            "config: limits.max_holds_per_session must be between 1 and 100000, not 0");
  c->max_holds_per_session = 1;
  c->audit_max_buffered_events = 10'000'001;
  EXPECT_EQ(ValidateConfig(*c).message(),
            "config: audit.max_buffered_events must be between 1000 and 10000000, not 10000001");
  c->audit_max_buffered_events = 10'000'000;
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
}

TEST(ConfigTest, PlaintextToEtcdOnLoopbackNeedsNoOptIn) {
  for (const char* e : {"127.0.0.1:2379", "127.0.0.5:2379", "localhost:2379", "[::1]:2379",
                        "dns:///localhost:2379", "ipv4:127.0.0.1:2379"}) {
    auto c = ParseConfig(absl::StrCat("insecure: true\netcd: {endpoints: [\"", e, "\"]}"));
    EXPECT_TRUE(c.ok()) << e << ": " << c.status();
  }
}

TEST(ConfigTest, SeveralTrustDomainsEachWithItsBundle) {
  auto c = ParseConfig(R"(
tls:
  ca_file: /all.pem
  cert_file: /c.pem
  key_file: /k.pem
  trust_domains: [acme.org, partner.org]
  trust_bundles: {acme.org: /acme.pem, partner.org: /partner.pem}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->trust_bundles.at("acme.org"), "/acme.pem");
  EXPECT_EQ(c->trust_bundles.at("partner.org"), "/partner.pem");
}

TEST(ConfigTest, EmptySectionsKeepTheDefaultsAndAnyLoopbackAddressMayBeInsecure) {
  auto c = ParseConfig("insecure: true\nlisten: 127.0.0.2:7420\nsessions:\nlimits:\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->session_ttl_max, std::chrono::hours(24));
  EXPECT_EQ(c->max_message_bytes, 64 * 1024);
  // acquire.max_wait: 0s is allowed: no Acquire may wait.
  c = ParseConfig("insecure: true\nacquire: {max_wait: 0s}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_wait, std::chrono::milliseconds(0));
}

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/holdfast-config-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigFileTest, MissingFileIsNotFoundWithTheReason) {
  auto r = LoadConfigFile(dir_ + "/holdfast.yaml");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(),
            "config: cannot read " + dir_ + "/holdfast.yaml: No such file or directory");
}

// A directory reads as empty (the defaults): refused. What is not a regular file
// but reads (a pipe: --config <(envsubst < holdfast.yaml.in)) is read.
TEST_F(ConfigFileTest, ADirectoryIsNotAConfigFile) {
  auto r = LoadConfigFile(dir_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "config: " + dir_ + " is a directory");
  EXPECT_TRUE(LoadConfigFile("/dev/null").ok());
}

// The file is checked with the flags over it: --insecure completes a file without
// tls, --etcd-plaintext one whose etcd is remote, --etcd replaces its endpoints.
TEST_F(ConfigFileTest, FlagsApplyBeforeTheWholeIsChecked) {
  const std::string path = Write("a.yaml", "listen: 127.0.0.1:7420\n");
  auto r = LoadConfig(path, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tls.ca_file, tls.cert_file and tls.key_file are required"),
            std::string::npos)
      << r.status();
  ConfigFlags insecure;
  insecure.insecure = true;
  r = LoadConfig(path, insecure);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->insecure);

  const std::string remote =
      Write("b.yaml", "insecure: true\netcd: {endpoints: [10.0.0.5:2379]}\n");
  r = LoadConfig(remote, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("10.0.0.5:2379 is not a loopback address"),
            std::string::npos)
      << r.status();
  ConfigFlags plaintext;
  plaintext.etcd_plaintext = true;
  EXPECT_TRUE(LoadConfig(remote, plaintext).ok());
  ConfigFlags local;
  local.etcd = " 127.0.0.1:2379 , 127.0.0.1:2380,";
  r = LoadConfig(remote, local);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->etcd_endpoints, (std::vector<std::string>{"127.0.0.1:2379", "127.0.0.1:2380"}));

  // The file's own errors still come first, and a flag that is wrong is named.
  const std::string bad = Write("c.yaml", "insecure: true\nlisten: [a]\n");
  EXPECT_EQ(LoadConfig(bad, insecure).status().message(), "config: listen must be a string");
  ConfigFlags no_etcd;
  no_etcd.etcd = " , ";
  EXPECT_EQ(LoadConfig(remote, no_etcd).status().message(),
            "--etcd \" , \" names no endpoint (host:port,...)");
  ConfigFlags no_store = insecure;
  no_store.audit_store = "";
  EXPECT_EQ(LoadConfig("", no_store).status().message(),
            "--audit-store is empty: give sqlite:PATH, postgresql://... or none");
  // A flag's own value is named by the flag.
  ConfigFlags url = insecure;
  url.etcd = "http://127.0.0.1:2379";
  EXPECT_EQ(LoadConfig("", url).status().message(),
            "--etcd \"http://127.0.0.1:2379\": give host:port without http:// or https:// (TLS is "
            "set by the tls settings)");
  ConfigFlags port = insecure;
  port.listen = "127.0.0.1:0";
  EXPECT_EQ(LoadConfig("", port).status().message(),
            "--listen \"127.0.0.1:0\" has a bad port (1..65535)");
  port.listen.reset();
  port.metrics_listen = "9420";
  EXPECT_EQ(LoadConfig("", port).status().message(), "--metrics-listen \"9420\" is not host:port");
  port.metrics_listen = "";  // "": no metrics endpoint
  EXPECT_TRUE(LoadConfig("", port).ok());
  ConfigFlags listen = insecure;
  listen.listen = "0.0.0.0:7420";
  EXPECT_EQ(LoadConfig("", listen).status().message(),
            "config: insecure (no TLS) is allowed only on a loopback address, not 0.0.0.0:7420");
  ConfigFlags metrics = insecure;
  metrics.metrics_listen = "0.0.0.0:9420";
  EXPECT_EQ(LoadConfig("", metrics).status().message(),
            "config: insecure (no TLS) serves metrics over plain HTTP: metrics.listen must be a "
            "loopback address too, not 0.0.0.0:9420 (or set metrics.plaintext: true to serve them "
            "to anyone)");
  metrics.metrics_listen = "127.0.0.1:9420";
  EXPECT_TRUE(LoadConfig("", metrics).ok());
}

// Every file named is read at start: a typo stops holdfastd with the key, the
// path and the reason, not as failed handshakes later.
TEST_F(ConfigFileTest, TheFilesNamedMustBeReadablePem) {
  auto ca_pem = dev::MakeCa("acme CA");
  ASSERT_TRUE(ca_pem.ok()) << ca_pem.status();
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org/holdfastd"};
  auto svid = dev::MakeLeaf(*ca_pem, o);
  auto other = dev::MakeLeaf(*ca_pem, o);
  ASSERT_TRUE(svid.ok() && other.ok());
  const std::string ca = Write("ca.pem", ca_pem->cert);
  const std::string cert = Write("svid.pem", svid->cert);
  std::string key = Write("key.pem", svid->key);
  const std::string der = Write("der.pem", std::string("\x30\x82\x01\x0a", 4));
  auto config = [&](const std::string& cert_file, const std::string& etcd_ca) {
    return absl::StrCat("tls: {ca_file: ", ca, ", cert_file: ", cert_file, ", key_file: ", key,
                        ", trust_domains: [acme.org]}\n",
                        etcd_ca.empty() ? "" : absl::StrCat("etcd: {tls: {ca_file: ", etcd_ca, "}}\n"));
  };
  EXPECT_TRUE(LoadConfig(Write("ok.yaml", config(cert, ca)), {}).ok());

  // PEM blocks that are not what their labels say, a key that is not the
  // certificate's, and a key holdfastd cannot read without a passphrase.
  const std::string junk =
      Write("junk.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  auto r = LoadConfig(Write("junk.yaml", config(junk, "")), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("config: tls.cert_file " + junk +
                                      ": its first certificate cannot be read: "),
            std::string::npos)
      << r.status();
  key = Write("other-key.pem", other->key);
  r = LoadConfig(Write("mismatch.yaml", config(cert, "")), {});
  EXPECT_EQ(r.status().message(),
            "config: tls.cert_file and tls.key_file do not belong together: " + key +
                " is not the key of the certificate in " + cert +
                " (a certificate renewed without its key, or the other way round?)");
  {
    std::unique_ptr<BIO, decltype(&BIO_free)> in(
        BIO_new_mem_buf(svid->key.data(), static_cast<int>(svid->key.size())), BIO_free);
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
        PEM_read_bio_PrivateKey(in.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
    ASSERT_TRUE(pkey);
    std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
    char pass[] = "secret";
    ASSERT_EQ(PEM_write_bio_PKCS8PrivateKey(out.get(), pkey.get(), EVP_aes_256_cbc(), pass, 6,
                                            nullptr, nullptr),
              1);
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    key = Write("encrypted-key.pem", std::string(data, static_cast<size_t>(n)));
  }
  r = LoadConfig(Write("encrypted.yaml", config(cert, "")), {});
  EXPECT_EQ(r.status().message(),
            "config: tls.key_file " + key +
                " is encrypted: holdfastd reads keys without a passphrase (write it out "
                "unencrypted, readable by holdfastd only: openssl pkey -in KEY -out KEY.plain)");
  key = Write("key.pem", svid->key);

  r = LoadConfig(Write("typo.yaml", config(dir_ + "/svdi.pem", "")), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "config: tls.cert_file " + dir_ + "/svdi.pem: cannot read: No such file or directory");

  r = LoadConfig(Write("der.yaml", config(der, "")), {});
  EXPECT_EQ(r.status().message(), "config: tls.cert_file " + der +
                                      " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)");
  // A certificate and its key swapped.
  r = LoadConfig(Write("swapped.yaml", config(key, "")), {});
  EXPECT_EQ(r.status().message(), "config: tls.cert_file " + key +
                                      " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)");

  r = LoadConfig(Write("etcd.yaml", config(cert, dir_ + "/etcd-ca.pem")), {});
  EXPECT_EQ(r.status().message(), "config: etcd.tls.ca_file " + dir_ +
                                      "/etcd-ca.pem: cannot read: No such file or directory");

  // A directory named as a file.
  r = LoadConfig(Write("dir.yaml", config(dir_, "")), {});
  EXPECT_EQ(r.status().message(), "config: tls.cert_file " + dir_ + " is a directory");
}

}  // namespace
}  // namespace holdfast::server
