// `holdfast audit [--ns NS] [--key KEY] [--type T] [--identity ID] [--since TIME]
//  [--follow] [-o json]`: the audit trail (Admin API, admins only), in revision
// order. `-o json` prints JSON lines with cluster_id, revision, type, namespace,
// lock_key, session_id, spiffe_id, token, unprotected and time (RFC 3339, UTC).
// `--since` takes an RFC 3339 time (2026-11-29T10:00:00Z) or a duration back from
// now (15m, 2h). `--follow` keeps printing new events (polling every second) until
// interrupted.
//
// `holdfast audit status`: where the auditor is (leader, cursor, lag, compaction).
#include <chrono>
#include <climits>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/common.h"
#include "cli/output.h"
#include "common/duration.h"
#include "nlohmann/json.hpp"

namespace holdfast::cli {
namespace {

struct AuditFlags {
  std::string ns;
  std::string key;
  std::string type;
  std::string identity;
  std::string since;
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

void PrintJsonLine(const v1::AuditEvent& e) {
  nlohmann::json j = {
      {"cluster_id", e.cluster_id()}, {"revision", e.revision()},
      {"type", e.type()},             {"namespace", e.namespace_()},
      {"lock_key", e.lock_key()},     {"session_id", e.session_id()},
      {"spiffe_id", e.spiffe_id()},   {"token", e.token()},
      {"unprotected", e.unprotected()}, {"time", FormatUnixMillis(e.time_unix_ms())},
  };
  std::cout << j.dump() << "\n";
}

int RunAudit(const GlobalOptions& global, const AuditFlags& flags) {
  v1::QueryAuditRequest req;
  req.set_namespace_(flags.ns);
  req.set_lock_key(flags.key);
  req.set_type(flags.type);
  req.set_spiffe_id(flags.identity);
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
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;

  const std::vector<std::string> header = {"REVISION", "TYPE",     "NAMESPACE", "KEY",
                                           "SESSION",  "IDENTITY", "TOKEN",     "TIME"};
  Table table(header);
  bool header_printed = false;
  // Prints the rows gathered so far (the header only once).
  auto flush_table = [&] {
    if (table.empty() && header_printed) return;
    std::ostringstream out;
    table.Print(out);
    std::string text = out.str();
    std::cout << (header_printed ? text.substr(text.find('\n') + 1) : text);
    header_printed = true;
    table = Table(header);
  };
  while (true) {
    auto r = client->QueryAudit(req);
    if (!r.ok()) return ReportError(r.status(), "audit");
    const auto& events = r->events();
    const bool full = events.size() == static_cast<int>(req.limit());
    // Pages end on whole revisions: on a full page the last revision's events
    // are held back and fetched whole with the next page (unless the page is
    // one revision only).
    int64_t stop_at = INT64_MAX;
    if (full && events[0].revision() != events[events.size() - 1].revision()) {
      stop_at = events[events.size() - 1].revision();
    }
    for (const auto& e : events) {
      if (e.revision() >= stop_at) break;
      req.set_after_revision(std::max(req.after_revision(), e.revision()));
      if (flags.output == OutputFormat::kJson) {
        PrintJsonLine(e);
      } else {
        table.AddRow({absl::StrCat(e.revision()),
                      e.type() + (e.unprotected() ? " (unprotected)" : ""), e.namespace_(),
                      e.lock_key(), absl::StrCat(e.session_id()), e.spiffe_id(),
                      absl::StrCat(e.token()), FormatUnixMillis(e.time_unix_ms())});
      }
    }
    if (full) continue;
    if (flags.output != OutputFormat::kJson) flush_table();
    std::cout.flush();
    if (!flags.follow) return kExitOk;
    std::this_thread::sleep_for(std::chrono::seconds(1));
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
    std::cout << "\n";
    return kExitOk;
  }
  PrintFields({{"enabled", st->enabled() ? "yes" : "no (audit.store: none)"},
               {"store", OrDash(st->store())},
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
