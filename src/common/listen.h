// Binding a listening TCP socket to "host:port" ("[v6]:port" too; an empty host
// or port 0 as bind(2) takes them), with the reason when it cannot be: the
// metrics endpoint listens so, and holdfastd asks it why gRPC could not listen
// (gRPC says only that it could not).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace holdfast::net {

struct Listener {
  int fd = -1;   // owned by the caller
  int port = 0;  // the port bound (the one chosen, for port 0)
};

// A socket bound and listening on the first address `listen` resolves to that
// takes it (SO_REUSEADDR, never SO_REUSEPORT: a port in use by a listener is
// refused), close-on-exec and non-blocking.
// INVALID_ARGUMENT when `listen` is not host:port; UNAVAILABLE naming the address
// and the system's reason ("Address already in use") otherwise.
absl::StatusOr<Listener> ListenTcp(const std::string& listen, int backlog);

// Whether no address `listen` resolves to is taken now (each bound and closed in
// turn): a name such as localhost resolves to 127.0.0.1 and ::1, and a server
// that binds all it can would start on one alone while something else holds the
// other. UNAVAILABLE naming the address when one is in use (EADDRINUSE) or not
// ours to bind (EACCES); an address this host cannot bind otherwise (::1 with
// IPv6 off) is skipped, as gRPC skips it. INVALID_ARGUMENT when `listen` is not
// host:port.
absl::Status CheckCanListen(const std::string& listen);

}  // namespace holdfast::net
