// `holdfast holders NS/KEY [-o table|json]`: the current holds of a lock key.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "cli/output.h"

namespace holdfast::cli {

namespace {

constexpr size_t kMaxMetaShown = 40;

struct HoldersFlags {
  std::string lock;
  OutputFormat output = OutputFormat::kTable;
};

// holder_meta is opaque bytes: shown as text when printable, else by size.
std::string MetaText(const std::string& meta) {
  if (meta.empty()) return "-";
  for (unsigned char c : meta) {
    if (c < 0x20 || c == 0x7F) return absl::StrCat("<", meta.size(), " bytes>");
  }
  if (meta.size() <= kMaxMetaShown) return meta;
  return absl::StrCat(meta.substr(0, kMaxMetaShown - 3), "...");
}

void PrintHoldersTable(const LockRef& ref, const v1::DescribeResponse& response) {
  if (response.holders().empty()) {
    std::cout << "no holders of " << ref.ToString() << "\n";
    return;
  }
  Table table({"TOKEN", "SESSION", "IDENTITY", "SHARED", "CLASS", "GRANT_REV", "META"});
  for (const v1::HoldInfo& h : response.holders()) {
    table.AddRow({absl::StrCat(h.token()), absl::StrCat(h.session_id()), OrDash(h.identity()),
                  h.shared() ? "yes" : "no", OrDash(h.class_id()),
                  absl::StrCat(h.grant_revision()), MetaText(h.holder_meta())});
  }
  table.Print(std::cout);
}

int RunHolders(const GlobalOptions& global, const HoldersFlags& flags) {
  auto ref = ParseLockRef(flags.lock);
  if (!ref.ok()) return ReportUsageError(ref.status());
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto response = client->Describe(ref->ns, ref->key);
  if (!response.ok()) return ReportError(response.status(), "holders " + ref->ToString());
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*response, std::cout); !s.ok()) return ReportError(s);
  } else {
    PrintHoldersTable(*ref, *response);
  }
  return kExitOk;
}

}  // namespace

void RegisterHoldersCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<HoldersFlags>();
  CLI::App* cmd = app.add_subcommand("holders", "Show who holds a lock: holdfast holders NS/KEY");
  cmd->add_option("lock", flags->lock, "NS/KEY: namespace, '/', lock key")->required();
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunHolders);
}

}  // namespace holdfast::cli
