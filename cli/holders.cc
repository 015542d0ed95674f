// `holdfast holders NS/KEY [-o table|json]`: the current holds of a lock key and
// its waiters in queue order.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// Milliseconds from now until a Unix-ms time, as "12s" (or "passed").
std::string Until(int64_t unix_ms) {
  int64_t now = absl::ToUnixMillis(absl::Now());
  if (unix_ms <= now) return "passed";
  return FormatMillis(unix_ms - now);
}

void PrintHoldersTable(const LockRef& ref, const v1::DescribeResponse& response) {
  if (response.holders().empty()) {
    std::cout << "no holders of " << ref.ToString() << "\n";
  } else {
    Table table({"TOKEN", "SESSION", "IDENTITY", "MODE", "CLASS", "GRANT_REV", "META"});
    for (const v1::HoldInfo& h : response.holders()) {
      table.AddRow({absl::StrCat(h.token()), absl::StrCat(h.session_id()), OrDash(h.identity()),
                    h.shared() ? "shared" : "exclusive", OrDash(h.class_id()),
                    absl::StrCat(h.grant_revision()), MetaText(h.holder_meta())});
    }
    table.Print(std::cout);
  }
  if (response.waiters().empty()) return;
  std::cout << "\nwaiters, in queue order:\n";
  Table waiters({"#", "SESSION", "IDENTITY", "MODE", "DEADLINE_IN", "QUEUE_REV"});
  int position = 1;
  for (const v1::WaiterInfo& w : response.waiters()) {
    waiters.AddRow({absl::StrCat(position++), absl::StrCat(w.session_id()), OrDash(w.identity()),
                    w.shared() ? "shared" : "exclusive", Until(w.deadline_unix_ms()),
                    absl::StrCat(w.create_revision())});
  }
  waiters.Print(std::cout);
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
