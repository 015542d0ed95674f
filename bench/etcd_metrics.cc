#include "bench/etcd_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace holdfast::bench {

namespace {

constexpr char kCounter[] = "grpc_server_msg_received_total{";
constexpr char kMethodLabel[] = "grpc_method=\"";
constexpr char kGcCount[] = "go_gc_duration_seconds_count ";
constexpr size_t kMaxPageBytes = 8 << 20;

// GET http://<endpoint>/metrics (HTTP/1.0: the server closes when done).
absl::StatusOr<std::string> FetchMetrics(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::atoi(endpoint.c_str() + colon + 1));
  if (colon == std::string::npos || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 host:port: ", endpoint));
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("socket failed");
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string page;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req = absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      ssize_t n;
      while (page.size() < kMaxPageBytes && (n = ::read(fd, buf, sizeof buf)) > 0) {
        page.append(buf, n);
      }
    }
  }
  ::close(fd);
  if (page.empty()) return absl::UnavailableError(absl::StrCat("no metrics from ", endpoint));
  return page;
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

