// `holdfast epoch show [--cluster NAME] [-o json]`: the cluster's current epoch
//   record, whether a restore was detected (grants then wait for an advance), the
//   history, and with several clusters (none named) every cluster's record.
// `holdfast epoch advance [--cluster NAME] --reason restore|rehome [--min-epoch N]
//   [-o json]`: new epoch = 1 + max(the record, the history's highest, N); admins
//   only. Without an audit store (no history), a restore needs --min-epoch.
// Runbook: docs/operations.md.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "cli/output.h"

namespace holdfast::cli {
namespace {

struct ShowFlags {
  std::string cluster;
  OutputFormat output = OutputFormat::kTable;
};

struct AdvanceFlags {
  std::string reason;
  std::string cluster;
  int min_epoch = 0;
  OutputFormat output = OutputFormat::kTable;
};

int RunShow(const GlobalOptions& global, const ShowFlags& flags) {
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto e = client->GetEpoch(flags.cluster);
  if (!e.ok()) return ReportError(e.status(), "epoch show");
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*e, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  PrintFields({{"cluster", e->cluster().empty() ? "default" : e->cluster()},
               {"epoch", absl::StrCat(e->epoch())},
               {"etcd_cluster_id", e->etcd_cluster_id()},
               {"observed_cluster_id", e->observed_cluster_id()},
               {"advanced_at", FormatUnixMillis(e->advanced_at_unix_ms())},
               {"reason", OrDash(e->reason())},
               {"grants", e->restore_detected().empty()
                              ? "allowed"
                              : "REFUSED: " + e->restore_detected()}},
              std::cout);
  if (e->clusters_size() > 0) {
    std::cout << "\nclusters:\n";
    Table table({"CLUSTER", "EPOCH", "ETCD_CLUSTER_ID", "REASON", "GRANTS"});
    for (const auto& c : e->clusters()) {
      table.AddRow({c.cluster(), absl::StrCat(c.epoch()), c.etcd_cluster_id(), OrDash(c.reason()),
                    c.restore_detected().empty() ? "allowed" : "REFUSED"});
    }
    table.Print(std::cout);
  }
  if (e->history_size() > 0) {
    std::cout << "\nhistory:\n";
    Table table({"EPOCH", "ETCD_CLUSTER_ID", "ADVANCED_AT", "REASON", "ACTOR"});
    for (const auto& h : e->history()) {
      table.AddRow({absl::StrCat(h.epoch()), h.etcd_cluster_id(),
                    FormatUnixMillis(h.advanced_at_unix_ms()), h.reason(), h.actor()});
    }
    table.Print(std::cout);
  }
  return kExitOk;
}

int RunAdvance(const GlobalOptions& global, const AdvanceFlags& flags) {
  if (flags.reason != "restore" && flags.reason != "rehome") {
    return ReportUsageError(absl::InvalidArgumentError(
        absl::StrCat("--reason \"", flags.reason, "\": use restore or rehome")));
  }
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  v1::AdvanceEpochRequest req;
  req.set_reason(flags.reason);
  req.set_cluster(flags.cluster);
  req.set_min_epoch(flags.min_epoch);
  auto e = client->AdvanceEpoch(req);
  if (!e.ok()) return ReportError(e.status(), "epoch advance");
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*e, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  std::cout << "epoch advanced to " << e->epoch() << " on etcd cluster " << e->etcd_cluster_id()
            << " (" << e->reason() << "); every new token is above every earlier one\n";
  return kExitOk;
}

}  // namespace

void RegisterEpochCommand(CLI::App& app, CommandContext& ctx) {
  CLI::App* epoch = app.add_subcommand("epoch", "Show or advance the token epoch");
  epoch->require_subcommand(1);
  auto sf = std::make_shared<ShowFlags>();
  CLI::App* show = epoch->add_subcommand("show", "The current epoch, restore state and history");
  show->add_option("--cluster", sf->cluster, "etcd cluster name (default: the control cluster)");
  AddOutputOption(show, &sf->output);
  SetAction(show, ctx, sf, RunShow);

  auto af = std::make_shared<AdvanceFlags>();
  CLI::App* advance =
      epoch->add_subcommand("advance", "Advance the epoch after a restore or for a rehome");
  advance->add_option("--reason", af->reason, "restore | rehome")->required();
  advance->add_option("--cluster", af->cluster,
                      "etcd cluster name (required with several; one cluster: leave out)");
  advance->add_option("--min-epoch", af->min_epoch,
                      "the highest epoch the cluster has had, if the server may not know it "
                      "(required for a restore without an audit store): the new one is above it")
      ->check(CLI::Range(0, 32766));
  AddOutputOption(advance, &af->output);
  SetAction(advance, ctx, af, RunAdvance);
}

}  // namespace holdfast::cli
