// Whether a host, or the host of a host:port, is this machine: an address of
// 127.0.0.0/8, ::1 (bracketed or not), or localhost. Addresses are parsed as
// such, so a name such as 127.example.org is not loopback. Used where plaintext
// is allowed only when nobody else is on the path (holdfastd to etcd,
// libholdfast to holdfastd).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>
#include <string_view>

namespace holdfast::net {

inline bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, h.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// host:port, after an optional dns:///, ipv4: or ipv6: scheme.
inline bool IsLoopbackEndpoint(std::string_view endpoint) {
  for (std::string_view scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (endpoint.starts_with(scheme)) endpoint.remove_prefix(scheme.size());
  }
  return IsLoopbackHost(endpoint.substr(0, endpoint.rfind(':')));
}

}  // namespace holdfast::net
