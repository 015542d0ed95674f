// Output of the read commands: aligned tables for people, one JSON document for
// scripts (`-o json`, the proto3 JSON mapping with the .proto field names, so
// 64-bit integers are strings and enums are their names).
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "holdfast/v1/types.pb.h"

namespace holdfast::cli {

enum class OutputFormat { kTable, kJson };

// Adds `-o,--output table|json` to `cmd` (default table).
void AddOutputOption(CLI::App* cmd, OutputFormat* format);

// Writes `message` as one JSON document and a newline.
absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out);

// Columns padded to their widest cell; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.size() == 1; }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
};

// "name:  value" lines with the values aligned.
void PrintFields(const std::vector<std::pair<std::string, std::string>>& fields,
                 std::ostream& out);

// In the form ParseDuration reads: 1500 -> "1s500ms", 3600000 -> "1h", 90000 -> "1m30s".
std::string FormatMillis(int64_t ms);
// A wall-clock time as RFC 3339 in UTC ("2026-11-29T16:17:37.964Z"); "-" for 0.
std::string FormatUnixMillis(int64_t unix_ms);
// "X" / "S", "fenced" / "advisory", "closed" / "open" ("-" when unspecified).
std::string ModeName(v1::LockMode mode);
std::string EnforcementName(v1::Enforcement enforcement);
std::string OnQuorumLossName(v1::OnQuorumLoss on_quorum_loss);
// "-" for an empty string, the text otherwise.
std::string OrDash(const std::string& text);

// Table and field views of the API objects.
void PrintNamespace(const v1::Namespace& ns, std::ostream& out);
void PrintClass(const v1::LockClass& cls, std::ostream& out);
Table ClassTable();
void AddClassRow(const v1::LockClass& cls, Table* table);

}  // namespace holdfast::cli
