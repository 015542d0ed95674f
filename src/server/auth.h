// Who is calling: the boundary where holdfastd turns a connection into an
// identity. Until mTLS lands (the identity issue), holdfastd serves loopback
// development only and every caller is the configured dev identity.
//
// Thread-safe (immutable after construction).
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

#include "lock/engine.h"

namespace holdfast::server {

class Authenticator {
 public:
  explicit Authenticator(std::string dev_identity) : dev_identity_(std::move(dev_identity)) {}
  lock::Caller CallerOf(const grpc::ServerContextBase& ctx) const {
    return lock::Caller{dev_identity_};
  }

 private:
  const std::string dev_identity_;
};

}  // namespace holdfast::server
