// `holdfast force request NS/KEY --reason TEXT [--session ID]`: asks for a hold to
//   be released by force; prints the request id (pending requests expire after
//   the server's audit.force_request_ttl).
// `holdfast force approve REQUEST_ID [--ack-unfenced]`: a second admin (not the
//   requester) releases the hold named at request time. `--ack-unfenced` is needed
//   for a hold of an advisory class, whose holder is not fenced off.
// `holdfast force list`: pending requests.
// All three are admin calls (ARCHITECTURE §8); the release is audited as `force`.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "cli/output.h"

namespace holdfast::cli {
namespace {

struct RequestFlags {
  std::string ref;
  std::string reason;
  int64_t session = 0;
  OutputFormat output = OutputFormat::kTable;
};

struct ApproveFlags {
  std::string request_id;
  bool ack_unfenced = false;
  OutputFormat output = OutputFormat::kTable;
};

struct ListFlags {
  OutputFormat output = OutputFormat::kTable;
};

void PrintRequest(const v1::ForceRequest& r, std::ostream& out) {
  PrintFields({{"request_id", r.request_id()},
               {"lock", absl::StrCat(r.namespace_(), "/", r.lock_key())},
               {"session", absl::StrCat(r.session_id())},
               {"token", absl::StrCat(r.token())},
               {"holder", OrDash(r.holder())},
               {"requester", r.requester()},
               {"reason", r.reason()},
               {"class", r.class_is_fenced() ? "fenced" : "advisory (holder NOT fenced off)"},
               {"expires", FormatUnixMillis(r.expires_at_unix_ms())}},
              out);
}

int RunRequest(const GlobalOptions& global, const RequestFlags& flags) {
  auto ref = ParseLockRef(flags.ref);
  if (!ref.ok()) return ReportUsageError(ref.status());
  if (flags.reason.empty()) {
    return ReportUsageError(absl::InvalidArgumentError("--reason is required"));
  }
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  v1::RequestForceReleaseRequest req;
  req.set_namespace_(ref->ns);
  req.set_lock_key(ref->key);
  req.set_session_id(flags.session);
  req.set_reason(flags.reason);
  auto r = client->RequestForceRelease(req);
  if (!r.ok()) return ReportError(r.status(), "force request " + ref->ToString());
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*r, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  PrintRequest(*r, std::cout);
  std::cout << "\nAnother admin approves it with:  holdfast force approve " << r->request_id()
            << (r->class_is_fenced() ? "" : " --ack-unfenced") << "\n";
  return kExitOk;
}

int RunApprove(const GlobalOptions& global, const ApproveFlags& flags) {
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  v1::ApproveForceReleaseRequest req;
  req.set_request_id(flags.request_id);
  req.set_ack_unfenced(flags.ack_unfenced);
  auto r = client->ApproveForceRelease(req);
  if (!r.ok()) return ReportError(r.status(), "force approve " + flags.request_id);
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*r, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  std::cout << "released " << r->request().namespace_() << "/" << r->request().lock_key()
            << " (session " << r->request().session_id() << ", token " << r->request().token()
            << ") at revision " << r->revision() << "\n";
  return kExitOk;
}

int RunList(const GlobalOptions& global, const ListFlags& flags) {
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto r = client->ListForceRequests();
  if (!r.ok()) return ReportError(r.status(), "force list");
  if (flags.output == OutputFormat::kJson) {
    if (auto s = PrintJson(*r, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  Table table({"REQUEST", "LOCK", "SESSION", "TOKEN", "REQUESTER", "CLASS", "EXPIRES", "REASON"});
  for (const auto& f : r->requests()) {
    table.AddRow({f.request_id(), absl::StrCat(f.namespace_(), "/", f.lock_key()),
                  absl::StrCat(f.session_id()), absl::StrCat(f.token()), f.requester(),
                  f.class_is_fenced() ? "fenced" : "advisory", FormatUnixMillis(f.expires_at_unix_ms()),
                  f.reason()});
  }
  table.Print(std::cout);
  return kExitOk;
}

}  // namespace

void RegisterForceCommand(CLI::App& app, CommandContext& ctx) {
  CLI::App* force = app.add_subcommand("force", "Force-release a hold (two admins)");
  force->require_subcommand(1);

  auto rf = std::make_shared<RequestFlags>();
  CLI::App* request = force->add_subcommand("request", "Ask for a hold to be released by force");
  request->add_option("lock", rf->ref, "NS/KEY")->required();
  request->add_option("--reason", rf->reason, "why (recorded in the audit trail)")->required();
  request->add_option("--session", rf->session, "which holder of a shared lock");
  AddOutputOption(request, &rf->output);
  SetAction(request, ctx, rf, RunRequest);

  auto af = std::make_shared<ApproveFlags>();
  CLI::App* approve = force->add_subcommand("approve", "Approve another admin's request");
  approve->add_option("request_id", af->request_id, "from `holdfast force request`")->required();
  approve->add_flag("--ack-unfenced", af->ack_unfenced,
                    "release a hold of an advisory class (its holder is NOT fenced off)");
  AddOutputOption(approve, &af->output);
  SetAction(approve, ctx, af, RunApprove);

  auto lf = std::make_shared<ListFlags>();
  CLI::App* list = force->add_subcommand("list", "Pending force-release requests");
  AddOutputOption(list, &lf->output);
  SetAction(list, ctx, lf, RunList);
}

}  // namespace holdfast::cli
