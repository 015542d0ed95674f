// `holdfast ns create|get|set|list|delete|rehome`: namespaces (Admin API).
// `holdfast ns rehome NS --to CLUSTER [--deadline D] [--abort]`: moves a
//   namespace to another etcd cluster (server/rehome.h; runbook:
//   docs/operations.md "Rehome"). It never forces a hold open: that is `holdfast
//   force`, two admins.
#include <iostream>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "common/spiffe.h"
#include "cli/output.h"
#include "common/names.h"

namespace holdfast::cli {

namespace {

struct CreateFlags {
  std::string name;
  std::string tenant;
  int64_t held_lease_quota = 0;
  int64_t op_rate_quota = 0;
  std::string tier;
  std::vector<std::string> members;
  ClassFlags default_class;
  OutputFormat output = OutputFormat::kTable;
};

struct NameFlags {
  std::string name;
  OutputFormat output = OutputFormat::kTable;
};

struct ListFlags {
  OutputFormat output = OutputFormat::kTable;
};

// Prints a namespace as asked; returns the exit code.
int PrintOne(const v1::Namespace& ns, OutputFormat output) {
  if (output == OutputFormat::kJson) {
    if (auto s = PrintJson(ns, std::cout); !s.ok()) return ReportError(s);
  } else {
    PrintNamespace(ns, std::cout);
  }
  return kExitOk;
}

absl::StatusOr<v1::CreateNamespaceRequest> BuildCreateRequest(const CreateFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.name); !s.ok()) return s;
  v1::CreateNamespaceRequest request;
  v1::Namespace* ns = request.mutable_namespace_();
  ns->set_name(flags.name);
  ns->set_tenant_id(flags.tenant);
  ns->set_held_lease_quota(flags.held_lease_quota);
  ns->set_op_rate_quota(flags.op_rate_quota);
  ns->set_cluster_tier(flags.tier);
  for (const auto& m : flags.members) {
    if (auto s = spiffe::ValidatePattern(m); !s.ok()) return s;
    ns->add_members(m);
  }
  // Without class flags the server's documented defaults apply.
  if (flags.default_class.AnyGiven()) {
    if (auto s = ApplyClassFlags(flags.default_class, request.mutable_default_class()); !s.ok()) {
      return s;
    }
  }
  return request;
}

int RunCreate(const GlobalOptions& global, const CreateFlags& flags) {
  auto request = BuildCreateRequest(flags);
  if (!request.ok()) return ReportUsageError(request.status());
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto ns = client->CreateNamespace(*request);
  if (!ns.ok()) return ReportError(ns.status(), "ns create " + flags.name);
  return PrintOne(*ns, flags.output);
}

struct SetFlags {
  std::string name;
  std::optional<int64_t> held_lease_quota;
  std::optional<int64_t> op_rate_quota;
  std::vector<std::string> members;
  bool clear_members = false;
  bool end_sessions_of_removed = false;
  OutputFormat output = OutputFormat::kTable;
};

int RunSet(const GlobalOptions& global, const SetFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.name); !s.ok()) return ReportUsageError(s);
  v1::UpdateNamespaceRequest request;
  request.set_name(flags.name);
  if (flags.held_lease_quota) request.set_held_lease_quota(*flags.held_lease_quota);
  if (flags.op_rate_quota) request.set_op_rate_quota(*flags.op_rate_quota);
  if (flags.clear_members && !flags.members.empty()) {
    return ReportUsageError(absl::InvalidArgumentError("--member and --clear-members conflict"));
  }
  if (flags.clear_members || !flags.members.empty()) request.set_set_members(true);
  if (flags.end_sessions_of_removed) {
    if (!request.set_members()) {
      return ReportUsageError(absl::InvalidArgumentError(
          "--end-sessions-of-removed goes with --member or --clear-members"));
    }
    request.set_end_sessions_of_removed(true);
  }
  if (!flags.held_lease_quota && !flags.op_rate_quota && !request.set_members()) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "ns set ", flags.name, ": nothing to change (give --held-lease-quota, --op-rate-quota, "
        "--member or --clear-members)")));
  }
  for (const auto& m : flags.members) {
    if (auto s = spiffe::ValidatePattern(m); !s.ok()) return ReportUsageError(s);
    request.add_members(m);
  }
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto ns = client->UpdateNamespace(request);
  if (!ns.ok()) return ReportError(ns.status(), "ns set " + flags.name);
  return PrintOne(*ns, flags.output);
}

void AddSet(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<SetFlags>();
  CLI::App* cmd = ns->add_subcommand("set", "Change a namespace's quotas and members live");
  cmd->add_option("name", flags->name, "namespace name")->required();
  cmd->add_option("--held-lease-quota", flags->held_lease_quota, "live sessions; 0 = unlimited")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--op-rate-quota", flags->op_rate_quota, "operations per second; 0 = unlimited")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--member", flags->members, "replace the members with these patterns");
  cmd->add_flag("--clear-members", flags->clear_members,
                "remove every member (every authenticated identity may use it)");
  cmd->add_flag("--end-sessions-of-removed", flags->end_sessions_of_removed,
                "end the live sessions of identities the new members leave out (without it, "
                "such sessions make the change fail); a session that holds a lock still makes "
                "it fail: force-release its holds first (two admins)");
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunSet);
}

int RunGet(const GlobalOptions& global, const NameFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.name); !s.ok()) return ReportUsageError(s);
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto ns = client->GetNamespace(flags.name);
  if (!ns.ok()) return ReportError(ns.status(), "ns get " + flags.name);
  return PrintOne(*ns, flags.output);
}

int RunList(const GlobalOptions& global, const ListFlags& flags) {
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto list = client->ListNamespaces();
  if (!list.ok()) return ReportError(list.status(), "ns list");
  if (flags.output == OutputFormat::kJson) {
    v1::ListNamespacesResponse response;
    for (auto& ns : *list) *response.add_namespaces() = std::move(ns);
    if (auto s = PrintJson(response, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  Table table({"NAME", "TENANT", "HELD_LEASE_QUOTA", "OP_RATE_QUOTA", "TIER", "HOME",
               "CREATE_REV"});
  for (const auto& ns : *list) {
    std::string home = OrDash(ns.home_cluster());
    if (!ns.rehoming_to().empty()) absl::StrAppend(&home, " -> ", ns.rehoming_to());
    table.AddRow({ns.name(), OrDash(ns.tenant_id()), absl::StrCat(ns.held_lease_quota()),
                  absl::StrCat(ns.op_rate_quota()), OrDash(ns.cluster_tier()), home,
                  absl::StrCat(ns.create_revision())});
  }
  table.Print(std::cout);
  return kExitOk;
}

int RunDelete(const GlobalOptions& global, const NameFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.name); !s.ok()) return ReportUsageError(s);
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  if (auto s = client->DeleteNamespace(flags.name); !s.ok()) {
    return ReportError(s, "ns delete " + flags.name);
  }
  std::cout << "deleted namespace " << flags.name << "\n";
  return kExitOk;
}

void AddCreate(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<CreateFlags>();
  CLI::App* cmd = ns->add_subcommand("create", "Create a namespace and its catch-all class");
  cmd->add_option("name", flags->name, "namespace name: [a-z0-9][a-z0-9._-]{0,62}")->required();
  cmd->add_option("--tenant", flags->tenant, "tenant id");
  cmd->add_option("--held-lease-quota", flags->held_lease_quota,
                  "live sessions the namespace may hold at once; 0 = unlimited")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--op-rate-quota", flags->op_rate_quota,
                  "operations per second across all replicas; 0 = unlimited")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tier", flags->tier, "etcd cluster tier; empty = the default cluster");
  cmd->add_option("--member", flags->members,
                  "SPIFFE ID (or prefix ending in /*) that may use it; repeat for more; "
                  "none: every authenticated identity");
  AddClassFlags(cmd, &flags->default_class);
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunCreate);
}

void AddGet(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<NameFlags>();
  CLI::App* cmd = ns->add_subcommand("get", "Show a namespace");
  cmd->add_option("name", flags->name, "namespace name")->required();
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunGet);
}

void AddList(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<ListFlags>();
  CLI::App* cmd = ns->add_subcommand("list", "List the namespaces");
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunList);
}

void AddDelete(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<NameFlags>();
  CLI::App* cmd = ns->add_subcommand(
      "delete", "Delete a namespace and its classes (refused while it has live sessions)");
  cmd->add_option("name", flags->name, "namespace name")->required();
  SetAction(cmd, ctx, flags, RunDelete);
}

struct RehomeFlags {
  std::string name;
  std::string to;
  std::string deadline = "60s";
  bool abort = false;
  OutputFormat output = OutputFormat::kTable;
};

int RunRehome(const GlobalOptions& global, const RehomeFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.name); !s.ok()) return ReportUsageError(s);
  if (flags.to.empty()) {
    return ReportUsageError(absl::InvalidArgumentError("--to CLUSTER is required"));
  }
  auto deadline = ParseDurationFlag("--deadline", flags.deadline);
  if (!deadline.ok()) return ReportUsageError(deadline.status());
  // 0 would be the server's default (60s), not "no wait": said rather than guessed.
  if (deadline->count() <= 0 || *deadline > std::chrono::hours(24)) {
    return ReportUsageError(absl::InvalidArgumentError(absl::StrCat(
        "--deadline ", flags.deadline, " is out of range: more than 0, at most 24h (how long "
        "the move waits for the namespace's holds to end)")));
  }
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  v1::RehomeNamespaceRequest req;
  req.set_name(flags.name);
  req.set_to(flags.to);
  req.set_deadline_ms(deadline->count());
  req.set_abort(flags.abort);
  auto r = client->RehomeNamespace(req);
  if (!r.ok()) return ReportError(r.status(), "ns rehome " + flags.name);
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*r, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  if (r->aborted()) {
    std::cout << "rehome of " << flags.name << " to " << r->to() << " rolled back; it stays on "
              << r->from() << "\n";
    return kExitOk;
  }
  std::cout << (r->resumed() ? "resumed and finished: " : "") << "namespace " << flags.name
            << " moved from " << r->from() << " to " << r->to() << " (epoch " << r->epoch()
            << (r->epoch_advanced() ? ", advanced" : "") << ")";
  std::cout << "\n";
  return kExitOk;
}

void AddRehome(CLI::App* ns, CommandContext& ctx) {
  auto flags = std::make_shared<RehomeFlags>();
  CLI::App* cmd = ns->add_subcommand(
      "rehome", "Move a namespace to another etcd cluster (run again to resume)");
  cmd->add_option("name", flags->name, "namespace name")->required();
  cmd->add_option("--to", flags->to, "target cluster name (holdfastd's config)")->required();
  cmd->add_option("--deadline", flags->deadline,
                  "how long to wait for holds to end (default 60s); then fail and change "
                  "nothing (a hold that will not end: `holdfast force request`)");
  cmd->add_flag("--abort", flags->abort, "roll back an unfinished rehome instead");
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunRehome);
}

}  // namespace

void RegisterNamespaceCommand(CLI::App& app, CommandContext& ctx) {
  CLI::App* ns =
      app.add_subcommand("ns", "Manage namespaces: create, get, set, list, delete, rehome");
  ns->require_subcommand(1);
  AddCreate(ns, ctx);
  AddGet(ns, ctx);
  AddSet(ns, ctx);
  AddList(ns, ctx);
  AddDelete(ns, ctx);
  AddRehome(ns, ctx);
}

}  // namespace holdfast::cli
