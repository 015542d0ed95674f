// holdfast: the command-line client of holdfast (docs/cli.md).
//
//   holdfast dev                           etcd + holdfastd in the foreground
//   holdfast lock NS/KEY -- CMD [ARGS...]  run CMD while holding a lock
//   holdfast holders NS/KEY                who holds a lock
//   holdfast ns|class create|get|list|delete
//   holdfast audit [--ns NS] [--key KEY] [--type T] [--follow]   the audit trail
//   holdfast force request|approve|list    two-person force-release
//   holdfast epoch show|advance            token epochs (restore, rehome)
//
// Exit codes: 0 ok (or CMD's code for `lock`), 1 error, 2 usage, 74 hold lost,
// 75 not acquired, 126 CMD not runnable, 127 CMD not found.
#include <signal.h>

#include <exception>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/common.h"

namespace {

using holdfast::cli::CommandContext;

void BuildApp(CLI::App& app, CommandContext& ctx) {
  app.add_option("--endpoint", ctx.global.endpoint,
                 "holdfastd address HOST:PORT (several: comma separated)")
      ->envname(holdfast::cli::kEndpointEnv)
      ->capture_default_str();
  app.add_option("--ca", ctx.global.ca_file, "mTLS: CA bundle that signed holdfastd (PEM)")
      ->envname("HOLDFAST_CA");
  app.add_option("--cert", ctx.global.cert_file, "mTLS: this client's SVID (PEM)")
      ->envname("HOLDFAST_CERT");
  app.add_option("--key", ctx.global.key_file, "mTLS: the SVID's private key (PEM)")
      ->envname("HOLDFAST_KEY");
  app.require_subcommand(1);
  // Subcommands inherit this: `holdfast lock --endpoint X ...` works too.
  app.fallthrough();
  holdfast::cli::RegisterDevCommand(app, ctx);
  holdfast::cli::RegisterLockCommand(app, ctx);
  holdfast::cli::RegisterHoldersCommand(app, ctx);
  holdfast::cli::RegisterNamespaceCommand(app, ctx);
  holdfast::cli::RegisterClassCommand(app, ctx);
  holdfast::cli::RegisterAuditCommand(app, ctx);
  holdfast::cli::RegisterForceCommand(app, ctx);
  holdfast::cli::RegisterEpochCommand(app, ctx);
}

// CLI11 reports parse problems by throwing: turn them into exit codes here.
int Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    holdfast::cli::PrintMessage(
        absl::StrCat(e.what(), "\n  (run `holdfast --help` or `holdfast COMMAND --help`)"));
    return holdfast::cli::kExitUsage;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed stdout or stderr (a pipe whose reader went away) must not kill
  // holdfast: `holdfast lock` would die with its command still running, without
  // the lock. Writes then fail with EPIPE, which the streams ignore. Children
  // started through dev::Subprocess get the default disposition back.
  ::signal(SIGPIPE, SIG_IGN);
  CommandContext ctx;
  ctx.args.assign(argv + 1, argv + argc);
  CLI::App app("holdfast: distributed locks with fencing tokens, on etcd", "holdfast");
  BuildApp(app, ctx);
  if (int code = Parse(app, argc, argv); code >= 0) return code;
  if (!ctx.action) return holdfast::cli::kExitUsage;
  try {
    return holdfast::cli::CheckOutput(ctx.action());
  } catch (const std::exception& e) {
    holdfast::cli::PrintMessage(absl::StrCat("INTERNAL: ", e.what()));
    return holdfast::cli::kExitError;
  }
}
