#include "cli/common.h"

#include <cstdio>
#include <iostream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/duration.h"
#include "common/names.h"
#include "common/pem_file.h"
#include "dev/dev_pki.h"
#include "holdfast/client.h"

namespace holdfast::cli {

namespace {

absl::Status InvalidFlag(absl::string_view flag, absl::string_view text,
                         absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid ", flag, " \"", text, "\": expected ", expected));
}

}  // namespace

// ---- Errors ----

void PrintMessage(absl::string_view message) {
  std::cout.flush();
  std::cerr << "holdfast: " << message << std::endl;
}

int ReportError(const absl::Status& status, absl::string_view context) {
  std::string text = absl::StrCat(context, context.empty() ? "" : ": ",
                                  absl::StatusCodeToString(status.code()), ": ",
                                  status.message());
  // Only when no holdfastd answered: holdfastd's own UNAVAILABLE (etcd out of
  // reach, a store lock timeout) says what went wrong by itself.
  if (Unreachable(status)) {
    absl::StrAppend(&text,
                    "\n  (is holdfastd running at the endpoint? set it with --endpoint or ",
                    kEndpointEnv, "; `holdfast dev` starts one locally. With mTLS, give "
                    "--ca/--cert/--key, or run where `holdfast dev` keeps its data, or set ",
                    dev::kDevDirEnv, ")");
  }
  PrintMessage(text);
  return kExitError;
}

int CheckOutput(int code) {
  std::cout.flush();
  if (!std::cout.fail()) return code;
  PrintMessage("writing the output failed (stdout closed or full): it is incomplete");
  return kExitError;
}

int ReportUsageError(const absl::Status& status) {
  PrintMessage(status.message());
  return kExitUsage;
}

// ---- Input validation ----

absl::StatusOr<LockRef> ParseLockRef(absl::string_view text) {
  size_t slash = text.find('/');
  if (slash == absl::string_view::npos || slash == 0 || slash + 1 == text.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid lock \"", text, "\": expected NS/KEY, for example default/jobs/nightly"));
  }
  LockRef ref{std::string(text.substr(0, slash)), std::string(text.substr(slash + 1))};
  if (auto s = names::ValidateNamespaceName(ref.ns); !s.ok()) return s;
  if (auto s = names::ValidateLockKey(ref.key); !s.ok()) return s;
  return ref;
}

absl::StatusOr<std::chrono::milliseconds> ParseDurationFlag(absl::string_view flag,
                                                            absl::string_view text) {
  auto d = ParseDuration(text);
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", d.status().message()));
  }
  return *d;
}

absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view text) {
  std::vector<std::string> endpoints;
  for (absl::string_view e : absl::StrSplit(text, ',')) {
    e = absl::StripAsciiWhitespace(e);
    size_t colon = e.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return InvalidFlag("endpoint", e, "HOST:PORT, for example 127.0.0.1:7420");
    }
    endpoints.emplace_back(e);
  }
  return endpoints;
}

absl::StatusOr<v1::LockMode> ParseMode(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "x" || t == "exclusive") return v1::LOCK_MODE_EXCLUSIVE;
  if (t == "s" || t == "shared") return v1::LOCK_MODE_SHARED;
  return InvalidFlag("--mode", text, "X (exclusive) or S (shared)");
}

absl::StatusOr<v1::Enforcement> ParseEnforcement(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "fenced") return v1::ENFORCEMENT_FENCED;
  if (t == "advisory") return v1::ENFORCEMENT_ADVISORY;
  return InvalidFlag("--enforcement", text, "fenced or advisory");
}

absl::StatusOr<v1::OnQuorumLoss> ParseOnQuorumLoss(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "closed") return v1::ON_QUORUM_LOSS_CLOSED;
  if (t == "open") return v1::ON_QUORUM_LOSS_OPEN;
  return InvalidFlag("--on-quorum-loss", text, "closed or open");
}

// ---- Class flags ----

bool ClassFlags::AnyGiven() const {
  return !mode.empty() || !enforcement.empty() || !on_quorum_loss.empty() ||
         !ttl_min.empty() || !ttl_max.empty();
}

void AddClassFlags(CLI::App* cmd, ClassFlags* flags) {
  cmd->add_option("--mode", flags->mode, "X (exclusive holds) or S (shared allowed); default X");
  cmd->add_option("--enforcement", flags->enforcement, "fenced or advisory; default fenced");
  cmd->add_option("--on-quorum-loss", flags->on_quorum_loss,
                  "closed (holds are lost) or open; default closed");
  cmd->add_option("--ttl-min", flags->ttl_min, "shortest session TTL allowed; default 1s");
  cmd->add_option("--ttl-max", flags->ttl_max, "longest session TTL allowed; default 1h");
}

absl::Status ApplyClassFlags(const ClassFlags& flags, v1::LockClass* cls) {
  cls->set_mode(v1::LOCK_MODE_EXCLUSIVE);
  cls->set_enforcement(v1::ENFORCEMENT_FENCED);
  cls->set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
  std::chrono::milliseconds ttl_min = std::chrono::seconds(1);
  std::chrono::milliseconds ttl_max = std::chrono::hours(1);
  if (!flags.mode.empty()) {
    auto v = ParseMode(flags.mode);
    if (!v.ok()) return v.status();
    cls->set_mode(*v);
  }
  if (!flags.enforcement.empty()) {
    auto v = ParseEnforcement(flags.enforcement);
    if (!v.ok()) return v.status();
    cls->set_enforcement(*v);
  }
  if (!flags.on_quorum_loss.empty()) {
    auto v = ParseOnQuorumLoss(flags.on_quorum_loss);
    if (!v.ok()) return v.status();
    cls->set_on_quorum_loss(*v);
  }
  if (!flags.ttl_min.empty()) {
    auto v = ParseDurationFlag("--ttl-min", flags.ttl_min);
    if (!v.ok()) return v.status();
    ttl_min = *v;
  }
  if (!flags.ttl_max.empty()) {
    auto v = ParseDurationFlag("--ttl-max", flags.ttl_max);
    if (!v.ok()) return v.status();
    ttl_max = *v;
  }
  if (ttl_min.count() <= 0) return absl::InvalidArgumentError("--ttl-min must be positive");
  if (ttl_min > ttl_max) {
    // Name the values: one of them may be a default the caller did not give.
    auto given = [](const std::string& flag, std::chrono::milliseconds v, bool by_default) {
      return absl::StrCat(flag, " ", v.count(), "ms", by_default ? " (the default)" : "");
    };
    return absl::InvalidArgumentError(absl::StrCat(
        "--ttl-min must not be larger than --ttl-max: ",
        given("--ttl-min", ttl_min, flags.ttl_min.empty()), " > ",
        given("--ttl-max", ttl_max, flags.ttl_max.empty())));
  }
  cls->set_ttl_min_ms(ttl_min.count());
  cls->set_ttl_max_ms(ttl_max.count());
  return absl::OkStatus();
}

namespace {
// libholdfast names the mTLS files by its options (cert_file, key_file,
// ca_file) in what Connect refuses; here they were given as --cert, --key, --ca.
absl::Status NamedByFlags(const absl::Status& s) {
  std::string m(s.message());
  for (const auto& [field, flag] :
       {std::pair<std::string, std::string>{"cert_file and key_file ", "--cert and --key "},
        {"cert_file ", "--cert "}, {"key_file ", "--key "}, {"ca_file ", "--ca "}}) {
    if (m.rfind(field, 0) == 0) return absl::Status(s.code(), flag + m.substr(field.size()));
  }
  return s;
}
}  // namespace

// ---- Server access ----

std::unique_ptr<Client> ConnectOrReport(const GlobalOptions& global, int* exit_code) {
  auto endpoints = ParseEndpoints(global.endpoint);
  if (!endpoints.ok()) {
    *exit_code = ReportUsageError(endpoints.status());
    return nullptr;
  }
  ClientOptions options;
  options.endpoints = *std::move(endpoints);
  if (global.ca_file.empty() != global.cert_file.empty() ||
      global.cert_file.empty() != global.key_file.empty()) {
    *exit_code = ReportUsageError(absl::InvalidArgumentError(
        "--ca, --cert and --key go together (or set HOLDFAST_CA, HOLDFAST_CERT, HOLDFAST_KEY)"));
    return nullptr;
  }
  // Named by the flag (or its variable). Stricter than libholdfast, which waits
  // for a file not there yet: here that is a typo, not an agent yet to write it.
  for (auto [flag, path, kind] :
       {std::tuple{"--ca", &global.ca_file, PemKind::kCertificates},
        std::tuple{"--cert", &global.cert_file, PemKind::kCertificates},
        std::tuple{"--key", &global.key_file, PemKind::kPrivateKey}}) {
    if (path->empty()) continue;
    if (auto s = CheckPemFile(*path, kind); !s.ok()) {
      *exit_code = ReportUsageError(absl::InvalidArgumentError(absl::StrCat(flag, " ", s.message())));
      return nullptr;
    }
  }
  options.ca_file = global.ca_file;
  options.cert_file = global.cert_file;
  options.key_file = global.key_file;
  // No credentials given: those of a local `holdfast dev`, if there are any.
  if (options.ca_file.empty()) {
    if (auto dev = dev::FindDevCliCredentials(dev::DevDirFromEnv())) {
      options.ca_file = dev->bundle;
      options.cert_file = dev->cert;
      options.key_file = dev->key;
    }
  }
  // A long `holdfast lock -- cmd` outlives rotations of its certificate: say
  // when one cannot be used (the previous files go on being used).
  options.on_tls_files = [](const absl::Status& s) {
    if (s.ok()) return;
    std::fprintf(stderr,
                 "holdfast: TLS: ERROR: the certificate files changed and cannot be used, "
                 "using the previous ones until they are fixed: %s\n",
                 std::string(s.message()).c_str());
  };
  const bool files_by_flag = !global.ca_file.empty();
  auto client = Client::Connect(std::move(options));
  if (!client.ok()) {
    // Refused before any call (a malformed endpoint, plaintext off loopback,
    // mTLS files that cannot be used together): the flags are wrong.
    *exit_code = client.status().code() == absl::StatusCode::kInvalidArgument
                     ? ReportUsageError(files_by_flag ? NamedByFlags(client.status())
                                                      : client.status())
                     : ReportError(client.status(), "connect");
    return nullptr;
  }
  return *std::move(client);
}

}  // namespace holdfast::cli
