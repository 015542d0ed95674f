#include "common/tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <algorithm>
#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/pem_file.h"

namespace holdfast {
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

absl::Status CheckSet(const TlsFiles::Options& o, const std::string& key, const std::string& cert,
                      const std::string& ca) {
  const TlsFiles::Paths& paths = o.configured;
  if (!paths.cert.empty()) {
    if (auto s = CheckKeyPairPem(o.where, paths.cert, paths.key, cert, key, o.reader); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(o.prefix, s.message()));
    }
    // Every block of the chain and of the CA bundle, not only the first: a file
    // cut off mid-write reads as far as its last whole block.
    if (CountWholeCertificates(cert) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(o.prefix, o.where, "cert_file ", paths.cert,
                                                     " holds a block that is not a whole certificate"));
    }
  }
  if (!paths.ca.empty() && CountWholeCertificates(ca) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.prefix, o.where, "ca_file ", paths.ca,
        " holds no PEM certificate, or a block that is not a whole certificate"));
  }
  return absl::OkStatus();
}

// The set's text as it is compared between passes.
std::string SetText(const std::string& key, const std::string& cert, const std::string& ca) {
  return absl::StrCat(key, std::string(1, '\0'), cert, std::string(1, '\0'), ca);
}

// The text of a file, or "" when `path` is "" (not configured).
absl::StatusOr<std::string> ReadIfNamed(const std::string& path) {
  if (path.empty()) return std::string();
  return ReadText(path);
}

// An anonymous memory file holding `text`, modified at a whole second past
// `*after` at least (and *after set to it), and sealed: nothing can change it
// any more (not through /proc either). -1 and errno on failure.
int MemoryFile(const char* name, const std::string& text, int64_t* after) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  auto fail = [fd] {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail();
    }
    done += static_cast<size_t>(n);
  }
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  const int64_t at = std::max(now, *after + 1);
  const struct timespec times[2] = {{at, 0}, {at, 0}};
  if (::futimens(fd, times) != 0) return fail();
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return fail();
  }
  *after = at;
  return fd;
}

// The PEM blocks of `text` whose label `keep` accepts, each whole line of
// them, in order.
template <class Keep>
std::string BlocksOf(const std::string& text, Keep keep) {
  std::string out;
  size_t at = 0;
  while ((at = text.find("-----BEGIN ", at)) != std::string::npos) {
    const size_t label_at = at + std::strlen("-----BEGIN ");
    const size_t label_end = text.find("-----", label_at);
    if (label_end == std::string::npos) break;
    const std::string label = text.substr(label_at, label_end - label_at);
    const std::string end_line = "-----END " + label + "-----";
    size_t end = text.find(end_line, label_end);
    if (end == std::string::npos) break;
    end += end_line.size();
    if (keep(label)) absl::StrAppend(&out, text.substr(at, end - at), "\n");
    at = end;
  }
  return out;
}

// The key followed by its certificate chain: one file for both, so the two are
// replaced at once. Only the key file's keys and the certificate file's
// certificates go in (a key file may hold a certificate too, a combined file
// both), so the first key and the first certificate gRPC finds are the ones
// CheckSet checked: OpenSSL's key reader takes the first key block of the file,
// its certificate readers pass over key blocks.
std::string Pair(const std::string& cert, const std::string& key) {
  return BlocksOf(key, [](const std::string& l) { return IsPemLabelOf(PemKind::kPrivateKey, l); }) +
         BlocksOf(cert, [](const std::string& l) { return IsPemLabelOf(PemKind::kCertificates, l); });
}

// The descriptor numbers of TlsFiles that ended, each holding an empty memory
// file, for the next TlsFiles to serve under. gRPC may read a certificate
// provider's paths for a while after the channels that used it are gone (a
// Client destroyed while its connections wind down): a number closed could be
// given to another file by then (a pipe, whose open would block the reader).
// So a number once served keeps pointing at a memory file, and is reused.
// One pool for the pairs' numbers, one for the CAs': a provider still reading
// an old number reads a file of the same kind.
enum Kind { kPair = 0, kCa = 1 };
absl::Mutex pool_mu;
std::vector<int>& Pool(Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu) {
  static auto* pools = new std::vector<int>[2];
  return pools[kind];
}

// `fd` (a fresh memory file) under a pooled number of its kind, if one is free:
// that number, and fd closed. Otherwise fd itself.
int UnderPooledNumber(Kind kind, int fd) {
  absl::MutexLock l(&pool_mu);
  while (!Pool(kind).empty()) {
    const int number = Pool(kind).back();
    Pool(kind).pop_back();
    if (::dup3(fd, number, O_CLOEXEC) >= 0) {
      ::close(fd);
      return number;
    }
    ::close(number);
  }
  return fd;
}

// Ends the serving of `fd`, of `kind`, whose copy was modified at `mtime`: an
// empty memory file, modified later, takes its place (a read it falls inside
// is seen), and the number goes to the pool (closed if none can be made).
void Retire(Kind kind, int fd, int64_t mtime) {
  if (fd < 0) return;
  const int empty = MemoryFile("holdfast-tls-retired", "", &mtime);
  if (empty < 0 || ::dup3(empty, fd, O_CLOEXEC) < 0) {
    if (empty >= 0) ::close(empty);
    ::close(fd);
    return;
  }
  ::close(empty);
  absl::MutexLock l(&pool_mu);
  Pool(kind).push_back(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Start(Options options) {
  std::unique_ptr<TlsFiles> t(new TlsFiles(std::move(options)));
  const Paths& p = t->options_.configured;
  if (p.key.empty() != p.cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(t->options_.prefix, t->options_.where,
                                                   "cert_file and key_file go together"));
  }
  auto key = ReadIfNamed(p.key);
  auto cert = ReadIfNamed(p.cert);
  auto ca = ReadIfNamed(p.ca);
  absl::Status checked = absl::OkStatus();
  if (key.ok() && cert.ok() && ca.ok()) checked = CheckSet(t->options_, *key, *cert, *ca);
  if (!checked.ok() && t->options_.wait_for_files) {
    // Maybe a rotation caught between its writes, at the client's start:
    // read once more a little later before refusing.
    std::this_thread::sleep_for(kRecheckAtStart);
    key = ReadIfNamed(p.key);
    cert = ReadIfNamed(p.cert);
    ca = ReadIfNamed(p.ca);
    if (key.ok() && cert.ok() && ca.ok()) checked = CheckSet(t->options_, *key, *cert, *ca);
  }
  if (key.ok() && cert.ok() && ca.ok()) {
    if (!checked.ok()) return checked;
    if (auto s = t->Serve(*key, *cert, *ca); !s.ok()) return s;
    absl::MutexLock l(&t->mu_);
    t->served_text_ = SetText(*key, *cert, *ca);
  } else if (t->options_.wait_for_files) {
    // A file not there yet: empty copies until a whole set is found
    // (served_text_ "" matches no set).
    if (auto s = t->Serve("", "", ""); !s.ok()) return s;
  } else {
    return !key.ok() ? key.status() : !cert.ok() ? cert.status() : ca.status();
  }
  // gRPC opens the copies by their /proc path: without /proc (a sandbox) every
  // handshake would fail with no word of why.
  for (const std::string* served : {&t->served_.key, &t->served_.ca}) {
    if (served->empty()) continue;
    if (auto read = ReadText(*served); !read.ok()) {
      return absl::InternalError(absl::StrCat("the memory copy of the TLS files cannot be read at ",
                                              *served, ": ", read.status().message(),
                                              " (is /proc mounted?)"));
    }
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
  Retire(kPair, pair_fd_, pair_mtime_);
  Retire(kCa, ca_fd_, ca_mtime_);
}

absl::Status TlsFiles::Serve(const std::string& key, const std::string& cert,
                             const std::string& ca) {
  const bool with_pair = !options_.configured.cert.empty();
  const bool with_ca = !options_.configured.ca.empty();
  int64_t pair_mtime = pair_mtime_, ca_mtime = ca_mtime_;
  const int k = with_pair ? MemoryFile("holdfast-tls-pair", Pair(cert, key), &pair_mtime) : -1;
  const int a = with_ca && (!with_pair || k >= 0) ? MemoryFile("holdfast-tls-ca", ca, &ca_mtime) : -1;
  if ((with_pair && k < 0) || (with_ca && a < 0)) {
    const int e = errno;
    for (int fd : {k, a}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::InternalError(
        absl::StrCat("cannot make the memory copy of the TLS files: ", std::strerror(e)));
  }
  if (!started_) {
    // The first set: its descriptors are the ones served from now on.
    started_ = true;
    pair_fd_ = k >= 0 ? UnderPooledNumber(kPair, k) : -1;
    ca_fd_ = a >= 0 ? UnderPooledNumber(kCa, a) : -1;
    pair_mtime_ = pair_mtime;
    ca_mtime_ = ca_mtime;
    if (with_pair) served_.key = served_.cert = absl::StrCat("/proc/self/fd/", pair_fd_);
    if (with_ca) served_.ca = absl::StrCat("/proc/self/fd/", ca_fd_);
    return absl::OkStatus();
  }
  // A later set takes the served descriptors' places, one atomic dup3 each
  // (close-on-exec kept): the pair at once, then the CA.
  bool swapped = true;
  if (with_pair) {
    swapped = ::dup3(k, pair_fd_, O_CLOEXEC) >= 0;
    if (swapped) pair_mtime_ = pair_mtime;
  }
  if (with_ca) {
    const bool ca_swapped = ::dup3(a, ca_fd_, O_CLOEXEC) >= 0;
    if (ca_swapped) ca_mtime_ = ca_mtime;
    swapped = ca_swapped && swapped;
  }
  const int e = errno;
  for (int fd : {k, a}) {
    if (fd >= 0) ::close(fd);
  }
  if (!swapped) {
    return absl::InternalError(
        absl::StrCat("cannot put the memory copy of the TLS files in place: ", std::strerror(e)));
  }
  return absl::OkStatus();
}

TlsFiles::Outcome TlsFiles::Check() {
  std::string reason;
  const Outcome outcome = Pass(&reason);
  // Told outside the lock: a `told` that blocks holds up no destructor.
  if (options_.told && (outcome == Outcome::kTaken || outcome == Outcome::kRefused)) {
    options_.told(outcome, reason);
  }
  return outcome;
}

TlsFiles::Outcome TlsFiles::Pass(std::string* reason) {
  const Paths& p = options_.configured;
  absl::StatusOr<std::string> key = ReadIfNamed(p.key), cert = ReadIfNamed(p.cert);
  absl::StatusOr<std::string> ca = ReadIfNamed(p.ca);
  absl::Status s = !key.ok() ? key.status() : !cert.ok() ? cert.status() : ca.status();
  const std::string text =
      s.ok() ? SetText(*key, *cert, *ca) : absl::StrCat("unreadable: ", s.message());
  // One pass at a time, to its end (the thread's and a caller's; the files are
  // read before: of two passes at once, the later may serve the earlier read).
  absl::MutexLock l(&mu_);
  if (text == served_text_) {
    pending_.clear();
    // Back to the set that serves after one was refused: said, so the error
    // logged is seen to be over.
    if (refused_.empty()) return Outcome::kUnchanged;
    refused_.clear();
    return Outcome::kTaken;
  }
  if (text == refused_) return Outcome::kUnchanged;  // told already
  if (s.ok()) s = CheckSet(options_, *key, *cert, *ca);
  if (s.ok()) {
    if (auto served = Serve(*key, *cert, *ca); !served.ok()) {
      // Not taken (nor all of it, maybe): the next pass serves the set again.
      served_text_.clear();
      *reason = std::string(served.message());
      return Outcome::kRefused;
    }
    served_text_ = text;
    pending_.clear();
    refused_.clear();
    return Outcome::kTaken;
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
  *reason = std::string(s.message());
  return Outcome::kRefused;
}

}  // namespace holdfast
