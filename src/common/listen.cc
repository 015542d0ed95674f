#include "common/listen.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace holdfast::net {

namespace {

// The addresses `listen` ("host:port") resolves to, for a passive socket; the
// caller frees them.
absl::StatusOr<addrinfo*> Resolve(const std::string& listen) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("listen \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", gai_strerror(rc)));
  }
  return found;
}

// A socket for `a`, bound (SO_REUSEADDR), or -1 with errno set.
int BindOne(const addrinfo* a) {
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace

absl::Status CheckCanListen(const std::string& listen) {
  auto found = Resolve(listen);
  if (!found.ok()) return found.status();
  absl::Status out;
  for (addrinfo* a = *found; a != nullptr && out.ok(); a = a->ai_next) {
    const int fd = BindOne(a);
    // An address this host cannot have (::1 with IPv6 off, a name's address of
    // another machine) is skipped, as gRPC skips it: only a port taken, or one
    // not ours to bind, is refused.
    if (fd < 0 && errno != EADDRINUSE && errno != EACCES) continue;
    if (fd < 0) {
      char host[NI_MAXHOST] = "?";
      getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
      out = absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ",
                                                strerror(errno), " (on ", host, ")"));
    } else {
      close(fd);
    }
  }
  freeaddrinfo(*found);
  return out;
}

absl::StatusOr<Listener> ListenTcp(const std::string& listen, int backlog) {
  auto resolved = Resolve(listen);
  if (!resolved.ok()) return resolved.status();
  addrinfo* found = *resolved;
  std::string error = "no address";
  Listener out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = BindOne(a);
    if (fd < 0) {
      error = strerror(errno);
      continue;
    }
    if (::listen(fd, backlog) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      out.port = ntohs(bound.ss_family == AF_INET6
                           ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      out.fd = fd;
      break;
    }
    error = strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (out.fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", error));
  }
  return out;
}

}  // namespace holdfast::net
