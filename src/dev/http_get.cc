#include "dev/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/openssl_error.h"

namespace holdfast::dev {
namespace {

std::string OpenSslError() { return TakeOpenSslErrors("no OpenSSL error (the peer closed)"); }

// Loads PEM text into the context: the client's certificate and key, or CAs.
bool UseCertAndKey(SSL_CTX* ctx, const std::string& cert_pem, const std::string& key_pem) {
  BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  BIO_free(cb);
  BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  const bool ok = cert != nullptr && key != nullptr && SSL_CTX_use_certificate(ctx, cert) == 1 &&
                  SSL_CTX_use_PrivateKey(ctx, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

bool TrustCas(SSL_CTX* ctx, const std::string& ca_pem) {
  BIO* b = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int n = 0;
  while (X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, ca) == 1) ++n;
    X509_free(ca);
  }
  ERR_clear_error();  // the end of the PEM text reads as an error
  BIO_free(b);
  return n > 0;
}

// Blocks SIGPIPE in this thread for its lifetime: a server that closes while
// this writes (SSL_write has no MSG_NOSIGNAL) makes the write fail instead of
// killing the test. A SIGPIPE raised meanwhile is taken before unblocking.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

using SslCtxPtr = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;
using SslPtr = std::unique_ptr<SSL, decltype(&SSL_free)>;

// The client's side of a TLS handshake on the connected `fd`; `server_cert`
// gets the server's certificate (PEM). With `alpn_h2`, offers HTTP/2 (a gRPC
// server's protocol).
absl::Status Handshake(int fd, const HttpsClient& tls, bool alpn_h2, SslCtxPtr* ctx, SslPtr* ssl,
                       std::string* server_cert) {
  ERR_clear_error();
  ctx->reset(SSL_CTX_new(TLS_client_method()));
  if (!*ctx || !TrustCas(ctx->get(), tls.ca_pem)) {
    return absl::InvalidArgumentError("TLS: no CA to trust: " + OpenSslError());
  }
  SSL_CTX_set_verify(ctx->get(), SSL_VERIFY_PEER, nullptr);
  if (!tls.cert_pem.empty() && !UseCertAndKey(ctx->get(), tls.cert_pem, tls.key_pem)) {
    return absl::InvalidArgumentError("TLS: bad client certificate or key: " + OpenSslError());
  }
  if (alpn_h2) {
    static const unsigned char kH2[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx->get(), kH2, sizeof kH2);
  }
  ssl->reset(SSL_new(ctx->get()));
  if (!*ssl || SSL_set_fd(ssl->get(), fd) != 1) return absl::InternalError("SSL_new");
  if (SSL_connect(ssl->get()) != 1) {
    return absl::UnavailableError("TLS handshake failed: " + OpenSslError());
  }
  if (X509* server = SSL_get1_peer_certificate(ssl->get()); server != nullptr) {
    BIO* b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, server);
    char* data = nullptr;
    const long n = BIO_get_mem_data(b, &data);
    server_cert->assign(data, static_cast<size_t>(n));
    BIO_free(b);
    X509_free(server);
  }
  return absl::OkStatus();
}

// A TCP connection to `ip` (IPv4, network order) and `port`, with 10 s bounds
// on each read and write; closed when the returned Fd goes. INTERNAL when no
// socket can be made, UNAVAILABLE when it cannot connect.
struct Fd {
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  int fd;
};
absl::StatusOr<Fd> Connect(in_addr ip, int port) {
  Fd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (c.fd < 0) return absl::InternalError("socket");
  timeval timeout{10, 0};  // a bound on a hung server, not a synchronisation
  setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr = ip;
  if (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    char host[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &ip, host, sizeof(host));
    return absl::UnavailableError(absl::StrCat("connect to ", host, ":", port, " failed"));
  }
  return c;
}

// To `ip` (IPv4, network order) and `port`.
absl::StatusOr<HttpAnswer> Exchange(in_addr ip, int port, const std::string& request,
                                    const std::optional<HttpsClient>& tls) {
  NoSigpipe no_sigpipe;
  auto conn = Connect(ip, port);
  if (!conn.ok()) return conn.status();
  const int fd = conn->fd;

  SslCtxPtr ctx(nullptr, SSL_CTX_free);
  SslPtr ssl(nullptr, SSL_free);
  HttpAnswer a;
  if (tls) {
    if (auto s = Handshake(fd, *tls, /*alpn_h2=*/false, &ctx, &ssl, &a.server_cert); !s.ok()) {
      return s;
    }
  }

  auto send_all = [&](const std::string& data) {
    if (ssl) return SSL_write(ssl.get(), data.data(), static_cast<int>(data.size())) > 0;
    return send(fd, data.data(), data.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(data.size());
  };
  // A server that answers before reading everything (an oversized head) may
  // close while this still writes: what it answered is read all the same.
  const bool sent = send_all(request);
  std::string raw;
  char buf[16384];
  std::string read_error;
  for (;;) {
    int n;
    if (ssl) {
      n = SSL_read(ssl.get(), buf, sizeof(buf));
      if (n <= 0) {
        if (SSL_get_error(ssl.get(), n) != SSL_ERROR_ZERO_RETURN) read_error = OpenSslError();
        break;
      }
    } else {
      n = static_cast<int>(read(fd, buf, sizeof(buf)));
      if (n <= 0) break;
    }
    raw.append(buf, static_cast<size_t>(n));
  }
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (raw.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "no answer", sent ? "" : " (the request could not be sent)",
          read_error.empty() ? "" : ": " + read_error));
    }
    return absl::DataLossError("no HTTP head in: " + raw.substr(0, 200));
  }
  a.headers = raw.substr(0, head_end);
  a.status_line = a.headers.substr(0, a.headers.find("\r\n"));
  a.body = raw.substr(head_end + 4);
  const auto space = a.status_line.find(' ');
  if (a.status_line.rfind("HTTP/1.", 0) != 0 || space == std::string::npos) {
    return absl::DataLossError("not an HTTP status line: " + a.status_line);
  }
  a.code = std::atoi(a.status_line.c_str() + space + 1);
  return a;
}

}  // namespace

absl::StatusOr<HttpAnswer> HttpExchange(int port, const std::string& request,
                                        const std::optional<HttpsClient>& tls) {
  in_addr loopback{};
  loopback.s_addr = htonl(INADDR_LOOPBACK);
  return Exchange(loopback, port, request, tls);
}

absl::StatusOr<std::string> TlsServerCertificate(int port, const HttpsClient& tls) {
  NoSigpipe no_sigpipe;
  in_addr loopback{};
  loopback.s_addr = htonl(INADDR_LOOPBACK);
  auto conn = Connect(loopback, port);
  if (!conn.ok()) return conn.status();
  SslCtxPtr ctx(nullptr, SSL_CTX_free);
  SslPtr ssl(nullptr, SSL_free);
  std::string cert;
  if (auto s = Handshake(conn->fd, tls, /*alpn_h2=*/true, &ctx, &ssl, &cert); !s.ok()) {
    return s;
  }
  SSL_shutdown(ssl.get());
  return cert;
}

absl::StatusOr<HttpAnswer> HttpGet(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  std::string host = host_port.substr(0, colon == std::string::npos ? 0 : colon);
  if (host == "localhost") host = "127.0.0.1";
  in_addr ip{};
  int port = 0;
  if (colon == std::string::npos || inet_pton(AF_INET, host.c_str(), &ip) != 1 ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 host:port: ", host_port));
  }
  return Exchange(ip, port,
                  absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", host_port,
                               "\r\nConnection: close\r\n\r\n"),
                  std::nullopt);
}

absl::StatusOr<HttpAnswer> HttpGet(int port, const std::string& path,
                                   const std::optional<HttpsClient>& tls) {
  return HttpExchange(
      port,
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                   "\r\nConnection: close\r\n\r\n"),
      tls);
}

}  // namespace holdfast::dev
