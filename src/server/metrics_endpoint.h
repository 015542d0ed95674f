// The HTTP endpoint Prometheus scrapes: GET (or HEAD) /metrics, answered with
// what `render` returns, over plain TCP or over TLS with a client certificate
// required and checked by `authorize`.
//
// Why a server of its own: the metrics carry namespace and class names, which a
// caller outside a namespace may not learn through the API (docs/errors.md), so
// a holdfastd that serves mTLS serves them to authenticated readers only. The
// civetweb that prometheus-cpp's Exposer runs on, as Debian 12 packages it, loads
// OpenSSL by names OpenSSL 3 no longer exports and crashes on the first client
// certificate; and a scrape needs nothing of HTTP but one request per connection.
//
// What it does:
// - One request per connection, answered with `Connection: close` (then what the
//   client still sends is read and dropped for up to 1 s, so that closing does not
//   reset the connection under the answer): 200 with the
//   text format (version 0.0.4), 404 for another path, 405 for another method,
//   400 for a request it cannot read, 431 for a head over 8 KiB, 403 with the
//   reason when `authorize` refuses the peer.
// - TLS 1.2 or later; the handshake fails without a client certificate that
//   chains to `ca_file`. No session resumption: every connection shows its
//   certificate. The three files are read at Start (an error names the file) and
//   again, for new connections, when one of them has changed (checked at most once
//   per `refresh`); a rotated set that cannot be loaded is logged and the last
//   good one kept.
// - Bounded: `workers` threads serve connections one at a time each; at most
//   `max_pending` accepted connections wait for one (more are closed at once);
//   each connection is done `io_deadline` after a worker takes it, handshake,
//   request and answer all counted, however slowly the client sends.
// - Not held back by clients that connect and say nothing (anyone who can reach
//   the port can, no certificate needed): a connection gets a worker only once
//   its client has sent something, and is closed `io_deadline` after it was
//   accepted if it has not. One source (an IPv4 address, an IPv6 /64) holds at
//   most 8 connections at once (more are closed at once), and a worker goes
//   first to a connection whose source no other worker serves, so a client that
//   trickles its bytes holds one worker at most: with two workers or more, a
//   scrape from another source is answered meanwhile. Clients sharing a source
//   (one host, one NAT) share its 8 places and its worker.
// - Listens on the first address `listen` resolves to (a name that resolves to
//   both IPv4 and IPv6 gets one of them; give an address to choose).
//
// Thread-safe. Stop (and the destructor) end every connection and join the threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace holdfast::server {

class MetricsEndpoint {
 public:
  struct Tls {
    std::string ca_file;    // CAs a client certificate must chain to
    std::string cert_file;  // this server's certificate chain (PEM)
    std::string key_file;   // its private key (PEM)
    std::chrono::milliseconds refresh{10'000};
    // Called with the verified peer's certificate and the chain it presented,
    // leaf first (PEM). OK: it may read. Otherwise the message is the 403's body.
    std::function<absl::Status(const std::string& leaf_pem, const std::string& chain_pem)>
        authorize;
  };
  struct Options {
    std::string listen;  // host:port (port 0: any free one; see port())
    std::optional<Tls> tls;  // none: plain HTTP, anyone may read
    std::function<std::string()> render;  // the body of a 200
    int workers = 2;
    int max_pending = 64;
    std::chrono::milliseconds io_deadline{5000};
    // Called once per accepted connection with how it ended, from the endpoint's
    // threads (never under its locks): "scraped" (200), "forbidden" (403),
    // "bad_request" (400, 404, 405, 431), "handshake_failed" (TLS), "no_request"
    // (gone, or past its deadline, before a whole request), "silent" (closed
    // having sent nothing), "refused" (closed at once: its source's places or the
    // queue were full).
    std::function<void(const char* outcome)> on_connection;
  };

  // Binds and starts serving. Errors: UNAVAILABLE when it cannot listen there,
  // INVALID_ARGUMENT when a TLS file cannot be read or used (naming it).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(Options options);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;
  // Ends the connections in progress and joins the threads; no render or
  // authorize runs once it returns. Idempotent; a call while another runs
  // returns when that one is done. Not from inside render or authorize.
  void Stop();

 private:
  class Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace holdfast::server
