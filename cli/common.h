// Shared pieces of the `holdfast` command line: global flags, exit codes, the
// parsing and validation of user input, and error reporting.
//
// Every subcommand lives in its own file and registers itself on the root
// CLI::App through a Register*Command function. Parsing only records which
// action to run; main() runs it afterwards, so no work happens inside CLI11.
//
// Thread-compatible: the CLI runs its commands on the main thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "holdfast/client.h"
#include "holdfast/v1/types.pb.h"

namespace holdfast::cli {

// Exit codes (docs/cli.md). `holdfast lock` also exits with its command's code.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // the server or the system refused
inline constexpr int kExitUsage = 2;         // bad command line
inline constexpr int kExitHoldLost = 74;     // lock: the hold was lost while CMD ran
inline constexpr int kExitNotAcquired = 75;  // lock: not acquired before --wait ended
// lock: CMD could not be run, the codes a shell uses.
inline constexpr int kExitCommandNotRunnable = 126;  // found, but exec failed
inline constexpr int kExitCommandNotFound = 127;

inline constexpr char kDefaultEndpoint[] = "127.0.0.1:7420";
inline constexpr char kEndpointEnv[] = "HOLDFAST_ENDPOINT";

// Flags of the root command, shared by every subcommand.
struct GlobalOptions {
  // One or more holdfastd endpoints, comma separated.
  std::string endpoint = kDefaultEndpoint;
  // mTLS: CA bundle, this client's SVID and key (PEM files). Empty: the
  // credentials of a local `holdfast dev` ($HOLDFAST_DEV_DIR/cli/, see
  // dev/dev_pki.h) if there are any, else plaintext (holdfastd accepts that only
  // when it runs --insecure on loopback; to any other endpoint it is refused,
  // exit 2).
  std::string ca_file, cert_file, key_file;
};

// What the parsed command line asks for: the root flags and the action of the
// subcommand that was parsed (set by that subcommand's CLI11 callback).
struct CommandContext {
  GlobalOptions global;
  std::function<int()> action;
  // The arguments as given (argv[1..]), for what CLI11 does not tell: whether
  // `--` was among them.
  std::vector<std::string> args;
};

// Each adds one subcommand (with its own subcommands) to `app`. `ctx` must
// outlive the parse and the run of the action.
void RegisterDevCommand(CLI::App& app, CommandContext& ctx);
void RegisterLockCommand(CLI::App& app, CommandContext& ctx);
void RegisterHoldersCommand(CLI::App& app, CommandContext& ctx);
void RegisterNamespaceCommand(CLI::App& app, CommandContext& ctx);
void RegisterClassCommand(CLI::App& app, CommandContext& ctx);
void RegisterAuditCommand(CLI::App& app, CommandContext& ctx);
void RegisterForceCommand(CLI::App& app, CommandContext& ctx);
void RegisterEpochCommand(CLI::App& app, CommandContext& ctx);

// Runs `run(*options)` as the action when `cmd` is the parsed subcommand.
// `options` holds the values CLI11 fills in.
// `run` is callable as int(const GlobalOptions&, const Options&).
template <typename Options, typename Run>
void SetAction(CLI::App* cmd, CommandContext& ctx, std::shared_ptr<Options> options, Run run) {
  cmd->callback([&ctx, options, run] {
    ctx.action = [&ctx, options, run] { return run(ctx.global, *options); };
  });
}

// ---- Errors ----

// Prints "holdfast: [<context>: ]<CODE>: <message>" on stderr, with a hint for
// UNAVAILABLE, and returns kExitError.
int ReportError(const absl::Status& status, absl::string_view context = "");
// Prints "holdfast: <message>" on stderr and returns kExitUsage.
int ReportUsageError(const absl::Status& status);
// Prints "holdfast: <message>" on stderr.
void PrintMessage(absl::string_view message);
// Flushes stdout. If anything written to it was lost (its reader went away: a
// pipe to `head`; a full disk), says so and returns kExitError: a script must
// not take a cut-off listing for a whole one. Otherwise returns `code`.
int CheckOutput(int code);

// ---- Input validation (INVALID_ARGUMENT with a message meant for users) ----

// Names and lock keys follow common/names.h (the rules the server enforces).

// "NS/KEY": the namespace, then everything after the first '/' as the key.
struct LockRef {
  std::string ns;
  std::string key;
  std::string ToString() const { return ns + "/" + key; }
};
absl::StatusOr<LockRef> ParseLockRef(absl::string_view text);

// A duration flag value ("500ms", "10s", "1h30m"); `flag` names it in errors.
absl::StatusOr<std::chrono::milliseconds> ParseDurationFlag(absl::string_view flag,
                                                            absl::string_view text);

// One or more comma-separated host:port endpoints.
absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view text);

// Enum flags. Accepted spellings (case-insensitive):
//   mode: X|exclusive, S|shared;  enforcement: fenced|advisory;
//   on-quorum-loss: closed|open.
absl::StatusOr<v1::LockMode> ParseMode(absl::string_view text);
absl::StatusOr<v1::Enforcement> ParseEnforcement(absl::string_view text);
absl::StatusOr<v1::OnQuorumLoss> ParseOnQuorumLoss(absl::string_view text);

// The settings of a lock class as given by flags (--mode, --enforcement,
// --on-quorum-loss, --ttl-min, --ttl-max); empty strings are "not given".
struct ClassFlags {
  std::string mode;
  std::string enforcement;
  std::string on_quorum_loss;
  std::string ttl_min;
  std::string ttl_max;
  bool AnyGiven() const;
};
// Adds the five flags to `cmd`, storing into `flags`.
void AddClassFlags(CLI::App* cmd, ClassFlags* flags);
// Fills the policy fields of `cls` from `flags`; flags not given take the
// defaults of the Admin API (X, fenced, closed, TTL 1s to 1h).
absl::Status ApplyClassFlags(const ClassFlags& flags, v1::LockClass* cls);

// ---- Server access ----

// A client of the endpoints in `global`, or null after reporting why not and
// setting *exit_code (kExitUsage for a malformed endpoint, else kExitError).
std::unique_ptr<Client> ConnectOrReport(const GlobalOptions& global, int* exit_code);

}  // namespace holdfast::cli
