// What etcd's gRPC server has received, by method, and how often its Go runtime
// has collected garbage, read from its Prometheus endpoint (/metrics on the
// client URL). Used to count the etcd requests behind one operation of a cell,
// and the collections during it: each collection's concurrent mark takes CPU
// from the requests in flight, and at one caller the slowest cycles are the
// ones it overlaps (docs/performance.md, "One caller's p99").
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace holdfast::bench {

struct EtcdCounters {
  // grpc_server_msg_received_total summed per grpc_method ("Txn", "Range",
  // "LeaseKeepAlive", "Watch", ...): one per unary call, one per stream message.
  // Requests from etcd's in-process clients (its v3lock service) are not counted.
  std::map<std::string, double> requests;
  // Garbage collections completed since etcd started (go_gc_duration_seconds's
  // count); nullopt when the page does not show it.
  std::optional<double> gc_cycles;
};

// Errors: UNAVAILABLE (no answer within 2 s), INTERNAL (not a metrics page: no
// request counter). Thread-safe.
absl::StatusOr<EtcdCounters> ReadEtcdCounters(const std::string& endpoint);

// The counters of one /metrics page (exposed for tests).
absl::StatusOr<EtcdCounters> ParseEtcdCounters(const std::string& page);

}  // namespace holdfast::bench
