// The TLS files holdfastd's API serves with, as gRPC reads them.
//
// gRPC re-reads the files it is given every tls.refresh and takes whatever it
// finds: a certificate renewed without its key (a rotation that writes the two
// files one at a time and is caught between them, or one that went wrong) is
// loaded as it is, and from then on every new handshake fails until the files
// are right again. For a service that must stay reachable while its SVIDs
// rotate, that is an outage of new connections.
//
// So gRPC is not given the configured files: it is given copies that this class
// replaces only with a set that is whole. Every `check` interval it reads the
// configured key, certificate and CA; when they changed, it checks them (the
// certificate and the key read and belong together, the CA holds a
// certificate) and only then puts the three in place of the copies, together.
// A set that fails the check is not taken: the previous one goes on serving,
// and the reason is told once per set seen (Options::told: holdfastd logs and
// counts it). The next change of the files is checked again.
//
// The copies are anonymous memory files (memfd) that gRPC opens by their
// /proc/self/fd path: nothing is written to disk, and nothing is left behind
// when holdfastd ends, however it ends. A replacement is an atomic dup3 per
// file; gRPC's reader, which checks the files' modification times around its
// reads, rereads a pair that changed under it.
//
// Thread-safe. The checking thread runs from Start until destruction.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::server {

class TlsFiles {
 public:
  struct Paths {
    std::string key;
    std::string cert;
    std::string ca;
  };
  enum class Outcome { kUnchanged, kTaken, kRefused };
  struct Options {
    Paths configured;
    // How often the configured files are read (0: only when Check is called).
    std::chrono::milliseconds check{std::chrono::seconds(5)};
    // Told of each set taken (reason "") or refused, with the reason (for logs
    // and metrics); called from the pass, so it must not call Check.
    std::function<void(Outcome outcome, const std::string& reason)> told;
  };

  // Reads and checks the configured files and serves copies of them.
  // INVALID_ARGUMENT when they do not pass the check (as CheckConfigFiles
  // says at start), INTERNAL when the memory files cannot be made.
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Start(Options options);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  // The paths to give gRPC (/proc/self/fd/N).
  const Paths& served() const { return served_; }

  // One pass of the checking thread: reads the configured files and, when they
  // changed since the last pass, takes them or refuses them.
  Outcome Check();

 private:
  explicit TlsFiles(Options options) : options_(std::move(options)) {}
  // Puts the set in place of the served one (the first: makes the served one).
  absl::Status Serve(const std::string& key, const std::string& cert, const std::string& ca);

  const Options options_;
  Paths served_;
  int key_fd_ = -1, cert_fd_ = -1, ca_fd_ = -1;

  // Held for a whole pass of Check, so a pass's dup3s are not interleaved.
  absl::Mutex mu_;
  std::string seen_ ABSL_GUARDED_BY(mu_);  // the configured files' text at the last pass
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;
};

}  // namespace holdfast::server
