// What etcd's gRPC server has received, by method, read from its Prometheus
// endpoint (/metrics on the client URL). Used to count the etcd requests behind
// one operation of a cell.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace holdfast::bench {

// grpc_server_msg_received_total summed per grpc_method ("Txn", "Range",
// "LeaseKeepAlive", "Watch", ...): one per unary call, one per stream message.
// Errors: UNAVAILABLE (no answer within 2 s), INTERNAL (not a metrics page).
// Thread-safe. Requests from etcd's in-process clients (its v3lock service) are
// not counted.
absl::StatusOr<std::map<std::string, double>> EtcdRequestCounts(const std::string& endpoint);

}  // namespace holdfast::bench
