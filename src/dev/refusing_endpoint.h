// A loopback port where nothing answers and nothing else can start to: a socket
// bound to it that does not listen. A connect is refused at once (a reset), as
// on a port nobody holds; unlike a port picked free and closed again
// (PickFreePort), no other process (an etcd or holdfastd of a test running
// beside) can bind it while this lives, with or without SO_REUSEADDR or
// SO_REUSEPORT. For tests of what a client says when no server is there.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace holdfast::dev {

class RefusingEndpoint {
 public:
  RefusingEndpoint() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;  // port() stays 0
    }
    port_ = ntohs(a.sin_port);
  }
  ~RefusingEndpoint() {
    if (fd_ >= 0) ::close(fd_);
  }
  RefusingEndpoint(const RefusingEndpoint&) = delete;
  RefusingEndpoint& operator=(const RefusingEndpoint&) = delete;

  // The port; 0 if the socket could not be set up.
  int port() const { return port_; }
  // "127.0.0.1:PORT"; empty if the socket could not be set up.
  std::string address() const {
    return port_ == 0 ? std::string() : "127.0.0.1:" + std::to_string(port_);
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace holdfast::dev
