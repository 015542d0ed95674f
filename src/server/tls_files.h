// The TLS files holdfastd serves its API with (and presents to etcd), as gRPC
// reads them.
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
// certificate and the key read and belong together, every block of the chain
// and of the CA bundle is a whole certificate) and only then puts the three in
// place of the copies. A set that fails the check is not taken: the previous
// one goes on serving. Found the same at the next pass (so not a rotation
// caught between its writes), it is refused, and told once (Options::told:
// holdfastd logs and counts it). The next change of the files is checked again.
//
// The copies are anonymous memory files (memfd) that gRPC opens by their
// /proc/self/fd path: no file is written, and nothing is left behind when
// holdfastd ends, however it ends. A replacement is an atomic dup3 per file,
// the key and the certificate back to back. gRPC reads the two files one after
// the other and compares their modification times (whole seconds) around its
// reads; a read that falls between the two dup3s can still take the new key
// with the old certificate, and then new handshakes fail until gRPC's next
// re-read, one tls.refresh later. That window is two system calls wide.
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
  // Of one pass: the files are the ones served (or the ones refused already);
  // a changed set was taken; a changed set does not pass, seen for the first
  // time (it may be a rotation caught between its writes: still served from the
  // previous set, and refused if the next pass finds it the same); refused.
  enum class Outcome { kUnchanged, kTaken, kPending, kRefused };
  struct Options {
    // key and cert both or neither (a CA alone: a client without a certificate).
    Paths configured;
    // How the messages name the setting: "tls." (the API's), "etcd.tls.", ...
    std::string where = "tls.";
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

  // The paths to give gRPC (/proc/self/fd/N; key and cert empty for a CA alone).
  const Paths& served() const { return served_; }

  // One pass of the checking thread: reads the configured files and, when they
  // changed, takes them or (at the second pass that finds them) refuses them.
  Outcome Check();

 private:
  explicit TlsFiles(Options options) : options_(std::move(options)) {}
  // Puts the set in place of the served one (the first: makes the served one).
  absl::Status Serve(const std::string& key, const std::string& cert, const std::string& ca);

  const Options options_;
  Paths served_;
  bool started_ = false;  // Serve made the served descriptors
  int key_fd_ = -1, cert_fd_ = -1, ca_fd_ = -1;

  // Held for a whole pass of Check, so a pass's dup3s are not interleaved.
  absl::Mutex mu_;
  // The text of the files (key, cert and CA) served; "" after a failed swap.
  std::string served_text_ ABSL_GUARDED_BY(mu_);
  std::string pending_ ABSL_GUARDED_BY(mu_);  // a set that failed once, not yet told
  std::string refused_ ABSL_GUARDED_BY(mu_);  // the last set told refused
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;
};

}  // namespace holdfast::server
