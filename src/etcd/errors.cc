#include "etcd/errors.h"

#include <string>

namespace holdfast::etcd {

absl::Status FromEtcd(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (msg.rfind("etcdserver: ", 0) == 0) msg = msg.substr(12);
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), "etcd: " + msg);
}

}  // namespace holdfast::etcd
