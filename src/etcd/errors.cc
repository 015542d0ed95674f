#include "etcd/errors.h"

#include <string>
#include <string_view>

namespace holdfast::etcd {

absl::Status FromEtcd(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (msg.rfind("etcdserver: ", 0) == 0) msg = msg.substr(12);
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), "etcd: " + msg);
}

bool ClusterWideUnavailable(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kUnavailable) return false;
  // etcd's own answers, as FromEtcd words them (rpctypes/error.go in etcd 3.4).
  static constexpr std::string_view kClusterWide[] = {
      "etcd: leader changed",
      "etcd: request timed out, possibly due to previous leader failure",
      "etcd: unhealthy cluster",
      "etcd: not capable",
  };
  const std::string_view message(s.message().data(), s.message().size());
  for (std::string_view m : kClusterWide) {
    if (message == m) return true;
  }
  return false;
}

}  // namespace holdfast::etcd
