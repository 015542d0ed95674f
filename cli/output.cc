#include "cli/output.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace holdfast::cli {

void AddOutputOption(CLI::App* cmd, OutputFormat* format) {
  // CLI11 stores enums through their integer value: map the names to it.
  auto to_enum = [](std::string& value) -> std::string {
    std::string lower = absl::AsciiStrToLower(value);
    if (lower == "table") {
      value = std::to_string(static_cast<int>(OutputFormat::kTable));
    } else if (lower == "json") {
      value = std::to_string(static_cast<int>(OutputFormat::kJson));
    } else {
      return absl::StrCat("expected table or json, not \"", value, "\"");
    }
    return "";
  };
  cmd->add_option("-o,--output", *format, "output format: table (default) or json")
      ->type_name("table|json")
      ->transform(CLI::Validator(to_enum, ""));
}

absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.message().as_string()));
  }
  out << json;
  if (json.empty() || json.back() != '\n') out << '\n';
  return absl::OkStatus();
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << '\n';
  }
}

void PrintFields(const std::vector<std::pair<std::string, std::string>>& fields,
                 std::ostream& out) {
  size_t width = 0;
  for (const auto& [name, value] : fields) width = std::max(width, name.size());
  for (const auto& [name, value] : fields) {
    out << name << ':' << std::string(width - name.size() + 2, ' ') << value << '\n';
  }
}

std::string FormatUnixMillis(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string FormatMillis(int64_t ms) {
  if (ms == 0) return "0";
  std::string text = ms < 0 ? "-" : "";
  if (ms < 0) ms = -ms;
  const std::pair<int64_t, const char*> kUnits[] = {
      {3'600'000, "h"}, {60'000, "m"}, {1000, "s"}, {1, "ms"}};
  for (const auto& [scale, unit] : kUnits) {
    if (ms >= scale) {
      absl::StrAppend(&text, ms / scale, unit);
      ms %= scale;
    }
  }
  return text;
}

std::string ModeName(v1::LockMode mode) {
  switch (mode) {
    case v1::LOCK_MODE_EXCLUSIVE: return "X";
    case v1::LOCK_MODE_SHARED: return "S";
    default: return "-";
  }
}

std::string EnforcementName(v1::Enforcement enforcement) {
  switch (enforcement) {
    case v1::ENFORCEMENT_FENCED: return "fenced";
    case v1::ENFORCEMENT_ADVISORY: return "advisory";
    default: return "-";
  }
}

std::string OnQuorumLossName(v1::OnQuorumLoss on_quorum_loss) {
  switch (on_quorum_loss) {
    case v1::ON_QUORUM_LOSS_CLOSED: return "closed";
    case v1::ON_QUORUM_LOSS_OPEN: return "open";
    default: return "-";
  }
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

namespace {
std::string Quota(int64_t n) { return n == 0 ? "unlimited" : absl::StrCat(n); }
}  // namespace

void PrintNamespace(const v1::Namespace& ns, std::ostream& out) {
  PrintFields({{"name", ns.name()},
               {"tenant", OrDash(ns.tenant_id())},
               {"held lease quota", Quota(ns.held_lease_quota())},
               {"op rate quota", Quota(ns.op_rate_quota())},
               {"cluster tier", ns.cluster_tier().empty() ? "default" : ns.cluster_tier()},
               {"home cluster", OrDash(ns.home_cluster())},
               {"rehoming to", OrDash(ns.rehoming_to())},
               // Who may use it: the field that says the most about a namespace.
               {"members", ns.members().empty()
                               ? "- (any authenticated caller)"
                               : absl::StrJoin(ns.members(), ", ")},
               {"create revision", absl::StrCat(ns.create_revision())}},
              out);
}

void PrintClass(const v1::LockClass& cls, std::ostream& out) {
  PrintFields({{"namespace", cls.namespace_()},
               {"class", cls.class_id()},
               {"key prefix", cls.key_prefix().empty() ? "\"\" (catch-all)"
                                                       : absl::StrCat("\"", cls.key_prefix(), "\"")},
               {"mode", ModeName(cls.mode())},
               {"enforcement", EnforcementName(cls.enforcement())},
               {"on quorum loss", OnQuorumLossName(cls.on_quorum_loss())},
               {"ttl min", FormatMillis(cls.ttl_min_ms())},
               {"ttl max", FormatMillis(cls.ttl_max_ms())},
               {"create revision", absl::StrCat(cls.create_revision())}},
              out);
}

Table ClassTable() {
  return Table({"CLASS", "PREFIX", "MODE", "ENFORCEMENT", "ON_QUORUM_LOSS", "TTL_MIN",
                "TTL_MAX"});
}

void AddClassRow(const v1::LockClass& cls, Table* table) {
  table->AddRow({cls.class_id(),
                 cls.key_prefix().empty() ? "\"\"" : absl::StrCat("\"", cls.key_prefix(), "\""),
                 ModeName(cls.mode()), EnforcementName(cls.enforcement()),
                 OnQuorumLossName(cls.on_quorum_loss()), FormatMillis(cls.ttl_min_ms()),
                 FormatMillis(cls.ttl_max_ms())});
}

}  // namespace holdfast::cli
