#include "server/metrics_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/listen.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/openssl_error.h"

namespace holdfast::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeadBytes = 8 * 1024;

std::string OpenSslError() { return TakeOpenSslErrors("unknown OpenSSL error"); }

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using SslCtx = std::shared_ptr<SSL_CTX>;

// What identifies a version of a file: a rename of a new file over it (as
// rotation does) changes the inode; an edit in place, the time or size.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = -1;
  timespec mtime{};
  timespec ctime{};
  bool operator==(const FileStamp& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime.tv_sec == o.mtime.tv_sec &&
           mtime.tv_nsec == o.mtime.tv_nsec && ctime.tv_sec == o.ctime.tv_sec &&
           ctime.tv_nsec == o.ctime.tv_nsec;
  }
};
FileStamp StampOf(const std::string& path) {
  struct stat st {};
  FileStamp s;
  if (stat(path.c_str(), &st) != 0) return s;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = st.st_size;
  s.mtime = st.st_mtim;
  s.ctime = st.st_ctim;
  return s;
}

absl::StatusOr<SslCtx> LoadContext(const MetricsEndpoint::Tls& tls) {
  ERR_clear_error();
  SslCtx ctx(SSL_CTX_new(TLS_server_method()), SslCtxFree{});
  if (!ctx) return absl::InternalError("metrics: SSL_CTX_new: " + OpenSslError());
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(c, 0);  // TLS 1.3 sends tickets unless told not to
  auto bad = [](const std::string& what, const std::string& file) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: cannot use ", what, " ", file, ": ", OpenSslError()));
  };
  if (SSL_CTX_use_certificate_chain_file(c, tls.cert_file.c_str()) != 1) {
    return bad("the certificate chain", tls.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(c, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return bad("the private key", tls.key_file);
  }
  if (SSL_CTX_check_private_key(c) != 1) {
    return bad("the private key (it is not the certificate's)", tls.key_file);
  }
  if (SSL_CTX_load_verify_locations(c, tls.ca_file.c_str(), nullptr) != 1) {
    return bad("the CA bundle", tls.ca_file);
  }
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

std::string PemOf(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return {};
  std::string out;
  if (PEM_write_bio_X509(bio, cert) == 1) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    if (n > 0) out.assign(data, static_cast<size_t>(n));
  }
  BIO_free(bio);
  return out;
}

// Where a connection comes from, the unit of the per-source bounds: an IPv4
// address (also one an IPv6 socket shows as ::ffff:a.b.c.d), or an IPv6 /64,
// the least one host is given, so that a host cannot pass the bounds by
// connecting from many addresses of its own prefix.
std::string SourceOf(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, text, sizeof(text));
    return text;
  }
  if (a.ss_family != AF_INET6) return text;
  in6_addr addr = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&addr)) {
    inet_ntop(AF_INET, &addr.s6_addr[12], text, sizeof(text));
    return text;
  }
  std::fill(addr.s6_addr + 8, addr.s6_addr + 16, 0);
  inet_ntop(AF_INET6, &addr, text, sizeof(text));
  return absl::StrCat(text, "/64");
}

const char* Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    default: return "Internal Server Error";
  }
}

}  // namespace

class MetricsEndpoint::Impl {
 public:
  // The most connections one source address holds at once.
  static constexpr int kMaxPerSource = 8;

  explicit Impl(Options options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  absl::Status Start() {
    if (options_.tls) {
      absl::MutexLock l(&ctx_mu_);  // no other thread yet; for the annotations
      // Stamped before reading: a change made while loading shows at the next check.
      stamps_ = Stamps();
      checked_ = Clock::now();
      auto ctx = LoadContext(*options_.tls);
      if (!ctx.ok()) return ctx.status();
      ctx_ = *std::move(ctx);
    }
    if (auto s = Listen(); !s.ok()) return s;
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::InternalError(absl::StrCat("metrics: pipe: ", strerror(errno)));
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
    for (int i = 0; i < std::max(1, options_.workers); ++i) {
      workers_.emplace_back([this] { WorkLoop(); });
    }
    return absl::OkStatus();
  }

  // A second Stop, concurrent or later, returns when the first is done.
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        mu_.Await(absl::Condition(&stopped_));
        return;
      }
      stopping_ = true;
      // Wakes the workers waiting on a connection: their reads and writes end.
      for (int fd : active_) shutdown(fd, SHUT_RDWR);
    }
    if (wake_[1] >= 0) {
      const char b = 0;
      (void)!write(wake_[1], &b, 1);
    }
    if (acceptor_.joinable()) acceptor_.join();
    for (auto& w : workers_) {
      if (w.joinable()) w.join();
    }
    absl::MutexLock l(&mu_);
    for (const Queued& q : pending_) close(q.fd);
    pending_.clear();
    held_.clear();
    serving_.clear();
    stopped_ = true;
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) close(fd);
    }
    listen_fd_ = wake_[0] = wake_[1] = -1;
  }

  int port() const { return port_; }

 private:
  // Non-blocking (ListenTcp): a connection gone between poll and accept must not
  // leave the acceptor in accept, where Stop's wake cannot reach it.
  absl::Status Listen() {
    auto l = net::ListenTcp(options_.listen, 64);
    if (!l.ok()) {
      return absl::Status(l.status().code(), absl::StrCat("metrics: ", l.status().message()));
    }
    listen_fd_ = l->fd;
    port_ = l->port;
    return absl::OkStatus();
  }

  // Accepts until Stop. Out of descriptors or memory (or with the listening
  // socket in error) it pauses 100 ms rather than spin; what waits in the
  // backlog is taken when it can be.
  //
  // A connection goes to a worker only once its client has sent something (a
  // TLS ClientHello, a request line): until then it waits here, in `quiet`, and
  // is closed `io_deadline` after it was accepted. So clients that connect and
  // say nothing (anyone who can reach the port, no certificate needed) take no
  // worker from a scrape. One source address holds at most kMaxPerSource
  // connections at once (quiet, queued or served); more are closed at once.
  void AcceptLoop() {
    std::vector<Queued> quiet;
    absl::Cleanup close_quiet = [&quiet] {  // on Stop, or a pause cut short by it
      for (const Queued& q : quiet) close(q.fd);
    };
    for (;;) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      for (const Queued& q : quiet) fds.push_back({q.fd, POLLIN, 0});
      int timeout_ms = -1;
      if (!quiet.empty()) {
        const auto first = std::min_element(quiet.begin(), quiet.end(), [](auto& x, auto& y) {
                             return x.accepted < y.accepted;
                           })->accepted;
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::ceil<std::chrono::milliseconds>(first + options_.io_deadline -
                                                         Clock::now())
                .count(),
            0, 60'000));
      }
      if (poll(fds.data(), fds.size(), timeout_ms) < 0) continue;  // EINTR
      if (fds[1].revents != 0) return;  // Stop
      // Spoken (or closed, or in error: a worker's first read says which):
      // queued for a worker. Silent past the deadline: closed.
      int silent = 0;
      {
        const auto now = Clock::now();
        absl::MutexLock l(&mu_);
        std::vector<Queued> still;
        for (size_t i = 0; i < quiet.size(); ++i) {
          if (fds[2 + i].revents != 0) {
            pending_.push_back(quiet[i]);
          } else if (now - quiet[i].accepted >= options_.io_deadline) {
            close(quiet[i].fd);
            if (--held_[quiet[i].source] == 0) held_.erase(quiet[i].source);
            ++silent;
          } else {
            still.push_back(quiet[i]);
          }
        }
        quiet = std::move(still);
      }
      for (int i = 0; i < silent; ++i) Report("silent");
      if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) {
        if (!Pause()) return;
        continue;
      }
      if ((fds[0].revents & POLLIN) == 0) continue;
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if ((errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) &&
            !Pause()) {
          return;
        }
        continue;
      }
      Queued q{fd, SourceOf(peer), Clock::now()};
      bool refused = false;
      {
        absl::MutexLock l(&mu_);
        refused = stopping_ ||
                  static_cast<int>(quiet.size() + pending_.size()) >= options_.max_pending ||
                  held_[q.source] >= kMaxPerSource;
        if (refused) {
          if (held_[q.source] == 0) held_.erase(q.source);
          close(fd);
        } else {
          ++held_[q.source];
          quiet.push_back(std::move(q));
        }
      }
      if (refused) Report("refused");
    }
  }

  void Report(const char* outcome) const {
    if (options_.on_connection) options_.on_connection(outcome);
  }

  // 100 ms, or until Stop (false).
  bool Pause() {
    pollfd wake{wake_[0], POLLIN, 0};
    return poll(&wake, 1, 100) <= 0 || wake.revents == 0;
  }

  void WorkLoop() {
    // A peer that closes first makes a write raise SIGPIPE; here it is only an
    // error (holdfastd ignores the signal too, but a library must not rely on it).
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    for (;;) {
      Queued q;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(this, &Impl::WorkOrStop));
        if (stopping_) return;
        // The first connection in line whose source no other worker serves: a
        // client that trickles its bytes holds one worker at most, not all.
        auto it = std::find_if(pending_.begin(), pending_.end(), [this](const Queued& p) {
          mu_.AssertReaderHeld();
          return serving_.count(p.source) == 0;
        });
        q = *it;
        pending_.erase(it);
        active_.insert(q.fd);
        ++serving_[q.source];
      }
      const Clock::time_point deadline = Clock::now() + options_.io_deadline;
      Serve(q.fd, deadline);
      Linger(q.fd, deadline);
      {
        absl::MutexLock l(&mu_);
        active_.erase(q.fd);
        if (--serving_[q.source] == 0) serving_.erase(q.source);
        if (--held_[q.source] == 0) held_.erase(q.source);
      }
      close(q.fd);
    }
  }

  // Closing with unread bytes (the rest of an oversized head, a body) makes the
  // kernel reset the connection and drop the answer still in flight; so the
  // answer is ended with a FIN and what the client still sends is read and
  // dropped, up to 1 MiB, its close, or 1 s (within the deadline).
  static void Linger(int fd, Clock::time_point deadline) {
    shutdown(fd, SHUT_WR);
    const Conn c{fd, std::min(deadline, Clock::now() + std::chrono::seconds(1)), nullptr};
    char buf[4096];
    for (size_t drained = 0; drained < (1 << 20);) {
      const ssize_t n = Read(c, buf, sizeof(buf));
      if (n <= 0) return;
      drained += static_cast<size_t>(n);
    }
  }

  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || std::any_of(pending_.begin(), pending_.end(), [this](const Queued& p) {
             mu_.AssertReaderHeld();
             return serving_.count(p.source) == 0;
           });
  }

  // An accepted connection.
  struct Queued {
    int fd = -1;
    std::string source;
    Clock::time_point accepted;
  };

  // One connection, from the handshake to the answer, by `deadline`. (The time it
  // waited for a worker does not count: a client that gave up meanwhile has
  // closed, which the first read sees at once.)
  void Serve(int fd, Clock::time_point deadline) {
    Conn conn{fd, deadline, nullptr};
    SslCtx ctx;
    if (options_.tls) {
      ctx = CurrentContext();
      conn.ssl = SSL_new(ctx.get());
      if (conn.ssl == nullptr || SSL_set_fd(conn.ssl, fd) != 1 || !Handshake(conn)) {
        if (conn.ssl != nullptr) SSL_free(conn.ssl);
        ERR_clear_error();
        Report("handshake_failed");
        return;  // no HTTP can be spoken: the client sees the TLS alert
      }
    }
    int code = 0;
    const bool answered = Answer(conn, &code);
    Report(code == 0     ? "no_request"
           : code == 200 ? "scraped"
           : code == 403 ? "forbidden"
                         : "bad_request");
    if (conn.ssl != nullptr) {
      // Our close_notify, sent once without waiting for theirs, and only after a
      // whole answer with time left: otherwise the connection just ends.
      ERR_clear_error();
      if (answered && Clock::now() < deadline) {
        SSL_shutdown(conn.ssl);
      } else {
        SSL_set_quiet_shutdown(conn.ssl, 1);
      }
      SSL_free(conn.ssl);
      ERR_clear_error();
    }
  }

  struct Conn {
    int fd;  // non-blocking
    Clock::time_point deadline;
    SSL* ssl;
  };

  // Waits until the socket is ready for `events` or the deadline passes (false).
  // Every read, write and handshake step waits here, so the deadline bounds the
  // whole connection however slowly the peer trickles bytes.
  static bool Wait(const Conn& c, short events) {
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(c.deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{c.fd, events, 0};
      const int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, 60'000)));
      if (n > 0) return true;  // ready, or in error: the next call says which
      if (n < 0 && errno != EINTR) return false;
    }
  }

  // After an SSL call returned `ret` <= 0: waits for what it wants; false when it
  // failed for good or the deadline passed.
  static bool WaitForSsl(const Conn& c, int ret) {
    switch (SSL_get_error(c.ssl, ret)) {
      case SSL_ERROR_WANT_READ: return Wait(c, POLLIN);
      case SSL_ERROR_WANT_WRITE: return Wait(c, POLLOUT);
      default: return false;
    }
  }

  static bool Handshake(const Conn& c) {
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(c.ssl);
      if (r == 1) return true;
      if (!WaitForSsl(c, r)) return false;
    }
  }

  // Bytes read (> 0), or <= 0 at the end, an error or the deadline.
  static ssize_t Read(const Conn& c, char* buf, size_t n) {
    for (;;) {
      if (c.ssl == nullptr) {
        const ssize_t r = recv(c.fd, buf, n, 0);
        if (r >= 0) return r;
        if (errno == EINTR) continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(c, POLLIN)) return -1;
        continue;
      }
      ERR_clear_error();
      const int r = SSL_read(c.ssl, buf, static_cast<int>(n));
      if (r > 0) return r;
      if (!WaitForSsl(c, r)) return -1;
    }
  }

  static bool WriteAll(const Conn& c, absl::string_view data) {
    while (!data.empty()) {
      if (Clock::now() >= c.deadline) return false;
      if (c.ssl == nullptr) {
        const ssize_t r = send(c.fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (r > 0) {
          data.remove_prefix(static_cast<size_t>(r));
        } else if (r < 0 && errno == EINTR) {
          continue;
        } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(c, POLLOUT)) {
          return false;
        }
        continue;
      }
      ERR_clear_error();
      const int r = SSL_write(c.ssl, data.data(), static_cast<int>(data.size()));
      if (r > 0) {
        data.remove_prefix(static_cast<size_t>(r));
      } else if (!WaitForSsl(c, r)) {
        return false;
      }
    }
    return true;
  }

  // True when the whole answer went out.
  static bool Reply(const Conn& c, int code, absl::string_view body, bool head_only = false,
                    absl::string_view content_type = "text/plain; charset=utf-8",
                    absl::string_view extra_headers = "") {
    std::string out = absl::StrCat("HTTP/1.1 ", code, " ", Reason(code), "\r\nContent-Type: ",
                                   content_type, "\r\nContent-Length: ", body.size(),
                                   "\r\nConnection: close\r\n", extra_headers, "\r\n");
    if (!head_only) out.append(body.data(), body.size());
    return WriteAll(c, out);
  }

  // Reads the request and answers it; true when a whole answer went out.
  // `*code`: the status answered, 0 when there was no request to answer.
  bool Answer(const Conn& c, int* code) {
    auto reply = [&c, code](int status, absl::string_view body, bool head_only = false,
                            absl::string_view content_type = "text/plain; charset=utf-8",
                            absl::string_view extra_headers = "") {
      *code = status;
      return Reply(c, status, body, head_only, content_type, extra_headers);
    };
    // The head: up to its blank line (lines may end in a bare LF, as RFC 9112
    // allows). A body (there should be none) is ignored.
    std::string head;
    char buf[2048];
    size_t end;
    auto head_end = [&head] { return std::min(head.find("\r\n\r\n"), head.find("\n\n")); };
    while ((end = head_end()) == std::string::npos) {
      if (head.size() > kMaxHeadBytes) return reply(431, "request head over 8 KiB\n");
      const ssize_t n = Read(c, buf, sizeof(buf));
      if (n <= 0) return false;  // gone, or silent past the deadline: nothing to answer
      head.append(buf, static_cast<size_t>(n));
    }
    if (end > kMaxHeadBytes) return reply(431, "request head over 8 KiB\n");
    std::string line = head.substr(0, head.find('\n'));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
        parts[1][0] != '/') {
      return reply(400, "not an HTTP/1.x request line\n");
    }
    // A HEAD is answered as its GET would be, without the body, errors included.
    const bool head_only = parts[0] == "HEAD";
    // Who asks, before anything about what is there.
    if (c.ssl != nullptr) {
      if (auto s = Authorize(c.ssl); !s.ok()) {
        return reply(403, absl::StrCat(s.message(), "\n"), head_only);
      }
    }
    const std::string path = parts[1].substr(0, parts[1].find('?'));
    if (path != "/metrics") return reply(404, "only /metrics is served here\n", head_only);
    if (parts[0] != "GET" && !head_only) {
      return reply(405, "GET or HEAD only\n", false, "text/plain; charset=utf-8",
                   "Allow: GET, HEAD\r\n");
    }
    return reply(200, options_.render(), head_only, "text/plain; version=0.0.4; charset=utf-8");
  }

  absl::Status Authorize(SSL* ssl) {
    X509* leaf = SSL_get1_peer_certificate(ssl);
    if (leaf == nullptr) return absl::UnauthenticatedError("no client certificate");
    const std::string leaf_pem = PemOf(leaf);
    X509_free(leaf);
    // The server side's peer chain leaves the leaf out; gRPC's, which the
    // authenticator reads otherwise, has it first.
    std::string chain_pem = leaf_pem;
    if (STACK_OF(X509)* chain = SSL_get_peer_cert_chain(ssl); chain != nullptr) {
      for (int i = 0; i < sk_X509_num(chain); ++i) chain_pem += PemOf(sk_X509_value(chain, i));
    }
    return options_.tls->authorize(leaf_pem, chain_pem);
  }

  std::vector<FileStamp> Stamps() const {
    const auto& t = *options_.tls;
    return {StampOf(t.ca_file), StampOf(t.cert_file), StampOf(t.key_file)};
  }

  // The context for a new connection: reloaded first when a file changed.
  SslCtx CurrentContext() {
    absl::MutexLock l(&ctx_mu_);
    const auto now = Clock::now();
    if (now - checked_ < options_.tls->refresh) return ctx_;
    checked_ = now;
    auto stamps = Stamps();
    if (stamps == stamps_) return ctx_;
    // Kept as they were when a load fails, so the next check tries again (a
    // rotation that wrote the certificate but not yet its key, say).
    if (auto fresh = LoadContext(*options_.tls); fresh.ok()) {
      ctx_ = *std::move(fresh);
      stamps_ = std::move(stamps);
      std::fprintf(stderr, "holdfastd: metrics: TLS files reloaded\n");
    } else {
      std::fprintf(stderr, "holdfastd: metrics: keeping the previous TLS files: %s\n",
                   fresh.status().ToString().c_str());
    }
    return ctx_;
  }

  const Options options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> workers_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the threads are joined
  // Spoken, waiting for a worker.
  std::deque<Queued> pending_ ABSL_GUARDED_BY(mu_);
  std::set<int> active_ ABSL_GUARDED_BY(mu_);  // being served: Stop shuts them down
  // Per source address: its connections held (quiet, pending or served), and
  // those being served.
  std::map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> serving_ ABSL_GUARDED_BY(mu_);

  absl::Mutex ctx_mu_;
  SslCtx ctx_ ABSL_GUARDED_BY(ctx_mu_);
  std::vector<FileStamp> stamps_ ABSL_GUARDED_BY(ctx_mu_);  // of the files ctx_ was made of
  Clock::time_point checked_ ABSL_GUARDED_BY(ctx_mu_);
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(Options options) {
  if (!options.render) return absl::InvalidArgumentError("metrics: no render function");
  if (options.tls && !options.tls->authorize) {
    return absl::InvalidArgumentError("metrics: TLS without an authorize function");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (auto s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsEndpoint::~MetricsEndpoint() { Stop(); }
int MetricsEndpoint::port() const { return impl_->port(); }
void MetricsEndpoint::Stop() { impl_->Stop(); }

}  // namespace holdfast::server
