#include "bench/etcd_metrics.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dev/http_get.h"

namespace holdfast::bench {

namespace {

constexpr char kCounter[] = "grpc_server_msg_received_total{";
constexpr char kMethodLabel[] = "grpc_method=\"";
constexpr char kGcCount[] = "go_gc_duration_seconds_count ";

// GET http://<endpoint>/metrics.
absl::StatusOr<std::string> FetchMetrics(const std::string& endpoint) {
  auto a = dev::HttpGet(endpoint, "/metrics");
  if (!a.ok()) return a.status();
  if (a->code != 200) {
    return absl::UnavailableError(
        absl::StrCat("no metrics from ", endpoint, ": ", a->status_line));
  }
  return std::move(a->body);
}

}  // namespace

absl::StatusOr<EtcdCounters> ReadEtcdCounters(const std::string& endpoint) {
  auto page = FetchMetrics(endpoint);
  if (!page.ok()) return page.status();
  return ParseEtcdCounters(*page);
}

absl::StatusOr<EtcdCounters> ParseEtcdCounters(const std::string& page) {
  EtcdCounters out;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, kGcCount)) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) out.gc_cycles = value;
      continue;
    }
    if (!absl::StartsWith(line, kCounter)) continue;
    auto m = line.find(kMethodLabel);
    auto space = line.rfind(' ');
    if (m == absl::string_view::npos || space == absl::string_view::npos) continue;
    auto begin = m + sizeof(kMethodLabel) - 1;
    auto end = line.find('"', begin);
    double value = 0;
    if (end == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &value)) {
      continue;
    }
    out.requests[std::string(line.substr(begin, end - begin))] += value;
  }
  if (out.requests.empty()) {
    return absl::InternalError("no grpc_server_msg_received_total in /metrics");
  }
  return out;
}

}  // namespace holdfast::bench

