#include "server/tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/auth.h"
#include "server/config.h"

namespace holdfast::server {
namespace {

// A file's text; NOT_FOUND-like errors as INVALID_ARGUMENT naming it.
absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status CheckSet(const std::string& where, const TlsFiles::Paths& paths,
                      const std::string& key, const std::string& cert, const std::string& ca) {
  if (!paths.cert.empty()) {
    if (auto s = CheckKeyPairPem(where, paths.cert, paths.key, cert, key); !s.ok()) return s;
    // Every block of the chain and of the CA bundle, not only the first: a file
    // cut off mid-write reads as far as its last whole block.
    if (CountWholeCertificates(cert) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", where, "cert_file ", paths.cert,
                                                     " holds a block that is not a whole certificate"));
    }
  }
  if (!paths.ca.empty() && CountWholeCertificates(ca) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: ", where, "ca_file ", paths.ca,
        " holds no PEM certificate, or a block that is not a whole certificate"));
  }
  return absl::OkStatus();
}

// The text of a file, or "" when `path` is "" (not configured).
absl::StatusOr<std::string> ReadIfNamed(const std::string& path) {
  if (path.empty()) return std::string();
  return ReadText(path);
}

// An anonymous memory file holding `text`; -1 and errno on failure.
int MemoryFile(const char* name, const std::string& text) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Start(Options options) {
  std::unique_ptr<TlsFiles> t(new TlsFiles(std::move(options)));
  const Paths& p = t->options_.configured;
  if (p.key.empty() != p.cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", t->options_.where,
                                                   "cert_file and key_file go together"));
  }
  auto key = ReadIfNamed(p.key);
  if (!key.ok()) return key.status();
  auto cert = ReadIfNamed(p.cert);
  if (!cert.ok()) return cert.status();
  auto ca = ReadIfNamed(p.ca);
  if (!ca.ok()) return ca.status();
  if (auto s = CheckSet(t->options_.where, p, *key, *cert, *ca); !s.ok()) return s;
  if (auto s = t->Serve(*key, *cert, *ca); !s.ok()) return s;
  {
    absl::MutexLock l(&t->mu_);
    t->served_text_ =
        absl::StrCat(*key, std::string(1, '\0'), *cert, std::string(1, '\0'), *ca);
  }
  if (t->options_.check.count() > 0) {
    TlsFiles* self = t.get();
    t->checker_ = std::thread([self] {
      for (;;) {
        {
          absl::MutexLock l(&self->mu_);
          auto stopping = [self]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_;
          };
          if (self->mu_.AwaitWithTimeout(absl::Condition(&stopping),
                                         absl::FromChrono(self->options_.check))) {
            return;
          }
        }
        self->Check();
      }
    });
  }
  return t;
}

TlsFiles::~TlsFiles() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (checker_.joinable()) checker_.join();
  for (int fd : {key_fd_, cert_fd_, ca_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

absl::Status TlsFiles::Serve(const std::string& key, const std::string& cert,
                             const std::string& ca) {
  const bool with_pair = !options_.configured.cert.empty();
  const bool with_ca = !options_.configured.ca.empty();
  const int k = with_pair ? MemoryFile("holdfast-tls-key", key) : -1;
  const int c = with_pair && k >= 0 ? MemoryFile("holdfast-tls-cert", cert) : -1;
  const int a = with_ca && (!with_pair || c >= 0) ? MemoryFile("holdfast-tls-ca", ca) : -1;
  if ((with_pair && (k < 0 || c < 0)) || (with_ca && a < 0)) {
    const int e = errno;
    for (int fd : {k, c, a}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(e)));
  }
  if (!started_) {
    // The first set: its descriptors are the ones served from now on.
    started_ = true;
    key_fd_ = k;
    cert_fd_ = c;
    ca_fd_ = a;
    if (with_pair) served_.key = absl::StrCat("/proc/self/fd/", key_fd_);
    if (with_pair) served_.cert = absl::StrCat("/proc/self/fd/", cert_fd_);
    if (with_ca) served_.ca = absl::StrCat("/proc/self/fd/", ca_fd_);
    return absl::OkStatus();
  }
  // A later set takes the served descriptors' places, one atomic dup3 each
  // (close-on-exec kept), the key and its certificate back to back.
  bool swapped = true;
  if (with_pair) {
    swapped = ::dup3(k, key_fd_, O_CLOEXEC) >= 0;
    swapped = ::dup3(c, cert_fd_, O_CLOEXEC) >= 0 && swapped;
  }
  if (with_ca) swapped = ::dup3(a, ca_fd_, O_CLOEXEC) >= 0 && swapped;
  const int e = errno;
  for (int fd : {k, c, a}) {
    if (fd >= 0) ::close(fd);
  }
  if (!swapped) return absl::InternalError(absl::StrCat("dup3: ", std::strerror(e)));
  return absl::OkStatus();
}

TlsFiles::Outcome TlsFiles::Check() {
  const Paths& p = options_.configured;
  absl::StatusOr<std::string> key = ReadIfNamed(p.key), cert = ReadIfNamed(p.cert);
  absl::StatusOr<std::string> ca = ReadIfNamed(p.ca);
  absl::Status s = !key.ok() ? key.status() : !cert.ok() ? cert.status() : ca.status();
  const std::string text =
      s.ok() ? absl::StrCat(*key, std::string(1, '\0'), *cert, std::string(1, '\0'), *ca)
             : absl::StrCat("unreadable: ", s.message());
  // One pass at a time, to its end (the thread's and a caller's).
  absl::MutexLock l(&mu_);
  auto tell = [&](Outcome outcome, const std::string& reason) {
    if (options_.told) options_.told(outcome, reason);
    return outcome;
  };
  if (text == served_text_) {
    pending_.clear();
    // Back to the set that serves after one was refused: said, so the error
    // logged is seen to be over.
    if (refused_.empty()) return Outcome::kUnchanged;
    refused_.clear();
    return tell(Outcome::kTaken, "");
  }
  if (text == refused_) return Outcome::kUnchanged;  // told already
  if (s.ok()) s = CheckSet(options_.where, p, *key, *cert, *ca);
  if (s.ok()) {
    if (auto served = Serve(*key, *cert, *ca); !served.ok()) {
      // Not taken (nor all of it, maybe): the next pass serves the set again.
      served_text_.clear();
      return tell(Outcome::kRefused, std::string(served.message()));
    }
    served_text_ = text;
    pending_.clear();
    refused_.clear();
    return tell(Outcome::kTaken, "");
  }
  // A rotation that writes its files one at a time can be caught between them:
  // a set that does not pass is refused (and told) only when the next pass
  // finds it the same.
  if (text != pending_) {
    pending_ = text;
    return Outcome::kPending;
  }
  pending_.clear();
  refused_ = text;
  return tell(Outcome::kRefused, std::string(s.message()));
}

}  // namespace holdfast::server
