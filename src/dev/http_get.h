// A one-request HTTP/1.1 client over plain TCP or TLS, for tests of holdfastd's
// metrics endpoint (and of the certificate a TLS server presents) and for holdfast-bench's reads of etcd's: it sends the
// request, reads to the server's close, and splits the answer. Never used by
// holdfastd.
//
// Thread-safe (no shared state).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace holdfast::dev {

struct HttpAnswer {
  int code = 0;             // from the status line
  std::string status_line;  // "HTTP/1.1 200 OK"
  std::string headers;      // the head, status line included
  std::string body;
  std::string server_cert;  // TLS: the server's certificate (PEM)
};

// TLS as a client: the server's certificate must chain to `ca_pem`; `cert_pem`
// and `key_pem` (both or neither) are the client certificate it presents.
struct HttpsClient {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

// Sends `request` (a whole request, head and all) to 127.0.0.1:port and reads
// the answer to the end. Errors: UNAVAILABLE when it cannot connect, the TLS
// handshake fails or the connection breaks before a whole head came (the message
// says which, with OpenSSL's reason); DATA_LOSS when what came is not HTTP.
absl::StatusOr<HttpAnswer> HttpExchange(int port, const std::string& request,
                                        const std::optional<HttpsClient>& tls = std::nullopt);

// The certificate (PEM) a TLS server on 127.0.0.1:port presents in a handshake
// that offers HTTP/2 (so a gRPC server's too), which must chain to `tls.ca_pem`.
// Nothing is sent after the handshake. Errors: as HttpExchange's.
absl::StatusOr<std::string> TlsServerCertificate(int port, const HttpsClient& tls);

// GET `path` (with Host and Connection: close).
absl::StatusOr<HttpAnswer> HttpGet(int port, const std::string& path,
                                   const std::optional<HttpsClient>& tls = std::nullopt);

// GET `path` over plain HTTP from `host_port`: an IPv4 address (or localhost)
// and a port, as etcd's --listen-metrics-urls gives them. INVALID_ARGUMENT for
// anything else.
absl::StatusOr<HttpAnswer> HttpGet(const std::string& host_port, const std::string& path);

}  // namespace holdfast::dev
