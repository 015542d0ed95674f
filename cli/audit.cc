// `holdfast audit [--ns NS] [--key KEY] [--type T] [--identity ID] [--since TIME]
//  [--cluster ID] [--limit N] [--follow] [-o json]`: the audit trail (Admin API,
// admins only), cluster by cluster, each in revision order (ties by namespace,
// key, session), fetched `--limit` events a page. `-o json` prints JSON lines with cluster_id,
// revision, type, namespace, lock_key, session_id, spiffe_id, token, unprotected
// and time (RFC 3339, UTC).
// `--since` takes an RFC 3339 time (2026-11-29T10:00:00Z) or a duration back from
// now (15m, 2h). `--follow` keeps printing new events (polling every second) until
// interrupted, each etcd cluster's in its own revision order. JSON gives 64-bit
// integers as decimal strings.
//
// `holdfast audit status`: where the auditor is (leader, cursor, lag, compaction).
#include <chrono>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/common.h"
#include "cli/output.h"
#include "common/duration.h"
#include "common/names.h"
#include "common/spiffe.h"
#include "nlohmann/json.hpp"

namespace holdfast::cli {
namespace {

struct AuditFlags {
  std::string ns;
  std::string key;
  std::string type;
  std::string identity;
  std::string since;
  std::string cluster;
  bool follow = false;
  int limit = 1000;
  OutputFormat output = OutputFormat::kTable;
};


absl::StatusOr<int64_t> ParseSince(const std::string& text) {
  if (text.empty()) return 0;
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &err)) return absl::ToUnixMillis(t);
  auto d = ParseDuration(text);
  if (d.ok()) return absl::ToUnixMillis(absl::Now()) - d->count();
  return absl::InvalidArgumentError(absl::StrCat(
      "--since \"", text, "\" is neither an RFC 3339 time (2026-11-29T10:00:00Z) nor a duration "
      "(15m, 2h)"));
}

// 64-bit integers as decimal strings, as every other `-o json` (the proto3 JSON
// mapping): session IDs and tokens pass 2^53, past which JSON readers that use
// doubles (JavaScript, jq before 1.7) round them.
void PrintJsonLine(const v1::AuditEvent& e) {
  nlohmann::json j = {
      {"cluster_id", e.cluster_id()},
      {"revision", absl::StrCat(e.revision())},
      {"type", e.type()},
      {"namespace", e.namespace_()},
      {"lock_key", e.lock_key()},
      {"session_id", absl::StrCat(e.session_id())},
      {"spiffe_id", e.spiffe_id()},
      {"token", absl::StrCat(e.token())},
      {"unprotected", e.unprotected()},
      {"time", FormatUnixMillis(e.time_unix_ms())},
  };
  if (e.has_force()) {
    j["force"] = {{"request_id", e.force().request_id()},
                  {"requester", e.force().requester()},
                  {"approver", e.force().approver()},
                  {"reason", e.force().reason()},
                  {"class_was_fenced", e.force().class_was_fenced()}};
  }
  std::cout << j.dump() << "\n";
}

int RunAudit(const GlobalOptions& global, const AuditFlags& flags) {
  v1::QueryAuditRequest req;
  // A filter no event can match (a namespace name with capitals, a name for a
  // SPIFFE ID) is a mistake, said as such rather than answered with nothing.
  if (!flags.ns.empty()) {
    if (auto s = names::ValidateNamespaceName(flags.ns); !s.ok()) {
      return ReportUsageError(absl::InvalidArgumentError(absl::StrCat("--ns: ", s.message())));
    }
  }
  if (!flags.key.empty()) {
    if (auto s = names::ValidateLockKey(flags.key); !s.ok()) {
      return ReportUsageError(absl::InvalidArgumentError(absl::StrCat("--key: ", s.message())));
    }
  }
  if (!flags.identity.empty()) {
    if (auto id = spiffe::Parse(flags.identity); !id.ok()) {
      return ReportUsageError(
          absl::InvalidArgumentError(absl::StrCat("--identity: ", id.status().message())));
    }
  }
  req.set_namespace_(flags.ns);
  req.set_lock_key(flags.key);
  req.set_type(flags.type);
  req.set_spiffe_id(flags.identity);
  if (uint64_t id = 0; !flags.cluster.empty()) {
    if (!absl::SimpleAtoi(flags.cluster, &id)) {
      return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
          "--cluster \"", flags.cluster,
          "\" is not a decimal etcd cluster id (`holdfast audit status` lists them)")));
    }
    // As the server writes it (042 or +42 is 42): events are followed by this id.
    req.set_cluster_id(absl::StrCat(id));
  }
  if (flags.limit < 1 || flags.limit > 10000) {
    return ReportUsageError(absl::InvalidArgumentError("--limit must be 1..10000"));
  }
  req.set_limit(flags.limit);
  if (!flags.type.empty() && flags.type != "grant" && flags.type != "release" &&
      flags.type != "expire" && flags.type != "force") {
    return ReportUsageError(absl::InvalidArgumentError(
        absl::StrCat("--type \"", flags.type, "\": use grant, release, expire or force")));
  }
  auto since = ParseSince(flags.since);
  if (!since.ok()) return ReportUsageError(since.status());
  req.set_since_unix_ms(*since);
  // After `audit`, --key is its lock-key filter: a client key given there (with
  // --ca and --cert given, and no key) was meant for mTLS.
  if (!flags.key.empty() && global.key_file.empty() && !global.ca_file.empty() &&
      !global.cert_file.empty()) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "--key \"", flags.key, "\" after `audit` is its lock-key filter, and --ca/--cert came "
        "without a client key: put --ca, --cert and --key before `audit`")));
  }
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;

  // The revisions of two etcd clusters are unrelated (after a cluster move the
  // trail holds both, and REVISION starts again lower), so the table names each
  // row's cluster unless --cluster chose one.
  const bool cluster_column = req.cluster_id().empty();
  // FORCED_BY: for a force, who asked, who approved, and why.
  std::vector<std::string> header = {"REVISION", "TYPE",     "NAMESPACE", "KEY",      "SESSION",
                                     "IDENTITY", "TOKEN",    "TIME",      "FORCED_BY"};
  if (cluster_column) header.insert(header.begin(), "CLUSTER");
  Table table(header);
  bool header_printed = false;
  // Prints the rows gathered so far (the header only once).
  auto flush_table = [&] {
    if (flags.output == OutputFormat::kJson) return;
    if (table.empty() && header_printed) return;
    std::ostringstream out;
    table.Print(out);
    std::string text = out.str();
    std::cout << (header_printed ? text.substr(text.find('\n') + 1) : text);
    header_printed = true;
    table = Table(header);
  };
  auto print = [&](const v1::AuditEvent& e) {
    if (flags.output == OutputFormat::kJson) {
      PrintJsonLine(e);
    } else {
      std::vector<std::string> row = {absl::StrCat(e.revision()),
                                      e.type() + (e.unprotected() ? " (unprotected)" : ""),
                                      e.namespace_(), e.lock_key(), absl::StrCat(e.session_id()),
                                      e.spiffe_id(), absl::StrCat(e.token()),
                                      FormatUnixMillis(e.time_unix_ms()),
                                      e.has_force()
                                          ? absl::StrCat(e.force().requester(), ", approved by ",
                                                         e.force().approver(), ": ",
                                                         e.force().reason())
                                          : "-"};
      if (cluster_column) row.insert(row.begin(), e.cluster_id());
      table.AddRow(std::move(row));
    }
  };
  // The last event printed of each cluster: where following it goes on.
  std::map<std::string, v1::AuditEvent> last_of;
  // Prints every event `q` matches, a page at a time: each page starts after the
  // last event of the one before, so a revision with more events than a page
  // is printed whole and nothing twice.
  auto drain = [&](v1::QueryAuditRequest q) -> absl::Status {
    while (true) {
      auto r = client->QueryAudit(q);
      if (!r.ok()) return r.status();
      for (const auto& e : r->events()) {
        print(e);
        last_of[e.cluster_id()] = e;
      }
      // A page ends short of the limit at the end of what matches, or, saying
      // `more`, at the answer's size bound.
      if (r->events_size() < q.limit() && !r->more()) return absl::OkStatus();
      if (r->events_size() == 0) return absl::OkStatus();
      *q.mutable_after() = r->events(r->events_size() - 1);
    }
  };
  // Without --cluster, each cluster the trail holds is read on its own, in
  // turn (its id's order), each in its revision order: the revisions of two
  // clusters are unrelated, so one order across them means nothing, and
  //  - read together, a page could pass revisions of one cluster that its
  //    auditor had not recorded yet: --follow, going on from each cluster's last
  //    event printed, would skip them for good (and a one-shot read could show a
  //    release without its grant);
  //  - each page of a read of one cluster seeks the store's primary key
  //    (cluster, revision, ...), where a read across clusters has no index in
  //    revision order: every page would scan and sort the whole trail.
  // A store with no cluster yet (or audit off) is asked as it is, for its answer.
  std::vector<std::string> clusters;
  if (req.cluster_id().empty()) {
    v1::GetAuditStatusRequest just_clusters;
    just_clusters.set_clusters_only(true);
    auto st = client->GetAuditStatus(just_clusters);
    if (!st.ok()) return ReportError(st.status(), "audit");
    clusters.assign(st->audited_cluster_ids().begin(), st->audited_cluster_ids().end());
  }
  if (clusters.empty()) {
    if (auto s = drain(req); !s.ok()) return ReportError(s, "audit");
  }
  for (const std::string& id : clusters) {
    v1::QueryAuditRequest q = req;
    q.set_cluster_id(id);
    if (auto s = drain(q); !s.ok()) return ReportError(s, "audit");
  }
  flush_table();
  std::cout.flush();
  if (!flags.follow) return kExitOk;
  // Following: each etcd cluster's events are recorded in its own revision
  // order, unrelated to another's, so each cluster is followed from its own
  // last event. Clusters are those the server has audited (asked on every
  // poll, so one audited later is picked up) and those already seen. A
  // holdfastd that cannot be reached or is stopping (a restart, a rolling
  // upgrade) is waited out, said once on stderr; any other error ends it.
  bool retrying = false;
  while (true) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::set<std::string> clusters;
    if (!req.cluster_id().empty()) {
      clusters.insert(req.cluster_id());
    } else {
      for (const auto& [id, e] : last_of) clusters.insert(id);
      v1::GetAuditStatusRequest just_clusters;
      just_clusters.set_clusters_only(true);
      if (auto st = client->GetAuditStatus(just_clusters); st.ok()) {
        clusters.insert(st->audited_cluster_ids().begin(), st->audited_cluster_ids().end());
      }
    }
    absl::Status polled;
    for (const std::string& id : clusters) {
      v1::QueryAuditRequest q = req;
      q.set_cluster_id(id);
      if (auto it = last_of.find(id); it != last_of.end()) *q.mutable_after() = it->second;
      polled = drain(q);
      if (!polled.ok()) break;
    }
    if (!polled.ok()) {
      if (!Unreachable(polled) && polled.code() != absl::StatusCode::kUnavailable) {
        return ReportError(polled, "audit");
      }
      if (!retrying) {
        flush_table();
        PrintMessage(absl::StrCat("audit: ", polled.message(), "; retrying every second"));
      }
      retrying = true;
      continue;
    }
    if (retrying) PrintMessage("audit: following again");
    retrying = false;
    flush_table();
    // Nobody reads any more (`audit -f | grep -m1 force`): the follow ends.
    if (int code = CheckOutput(kExitOk); code != kExitOk) return code;
  }
}

struct StatusFlags {
  OutputFormat output = OutputFormat::kTable;
};

int RunStatus(const GlobalOptions& global, const StatusFlags& flags) {
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto st = client->GetAuditStatus();
  if (!st.ok()) return ReportError(st.status(), "audit status");
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*st, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  PrintFields({{"enabled", st->enabled() ? "yes" : "no (audit.store: none)"},
               {"store", OrDash(st->store())},
               {"durability", st->store_durability_raised_from().empty()
                                  ? OrDash(st->store_durability())
                                  : absl::StrCat(st->store_durability(), " (raised by holdfastd from ",
                                                 st->store_durability_raised_from(), ")")},
               {"auditor", OrDash(st->leader())},
               {"cluster_id", OrDash(st->cluster_id())},
               {"cursor", st->this_replica_leads() ? absl::StrCat(st->cursor()) : "- (another replica leads)"},
               {"etcd_revision", absl::StrCat(st->etcd_revision())},
               {"compacted_revision", absl::StrCat(st->compacted_revision())},
               {"retention", st->retention_ms() == 0
                                 ? std::string("forever")
                             : st->retention_ms() % 86'400'000 == 0
                                 ? absl::StrCat(st->retention_ms() / 86'400'000, "d")
                                 : FormatMillis(st->retention_ms())},
               {"pruned_events", absl::StrCat(st->pruned_events())},
               {"audited_clusters", st->audited_cluster_ids().empty()
                                        ? std::string("-")
                                        : absl::StrJoin(st->audited_cluster_ids(), ", ")},
               {"last_error", OrDash(st->last_error())}},
              std::cout);
  return kExitOk;
}

}  // namespace

void RegisterAuditCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<AuditFlags>();
  CLI::App* cmd = app.add_subcommand("audit", "The audit trail: grants, releases, expiries, forces");
  cmd->add_option("--ns", flags->ns, "only this namespace");
  cmd->add_option("--key", flags->key, "only this lock key");
  cmd->add_option("--type", flags->type, "grant | release | expire | force");
  cmd->add_option("--identity", flags->identity, "only holds of this SPIFFE ID");
  cmd->add_option("--since", flags->since, "RFC 3339 time, or a duration back from now (15m)");
  cmd->add_option("--cluster", flags->cluster, "only this etcd cluster (decimal id)");
  cmd->add_flag("--follow,-f", flags->follow, "keep printing new events");
  cmd->add_option("--limit", flags->limit, "rows per page (1..10000)")->capture_default_str();
  AddOutputOption(cmd, &flags->output);
  // `audit` runs only when `audit status` was not asked for (CLI11 runs the
  // parent's callback after the subcommand's).
  cmd->callback([&ctx, flags, cmd] {
    if (!cmd->get_subcommands().empty()) return;
    ctx.action = [&ctx, flags] { return RunAudit(ctx.global, *flags); };
  });

  auto status_flags = std::make_shared<StatusFlags>();
  CLI::App* status = cmd->add_subcommand("status", "Where the auditor is");
  AddOutputOption(status, &status_flags->output);
  SetAction(status, ctx, status_flags, RunStatus);
}

}  // namespace holdfast::cli
