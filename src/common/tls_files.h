// The TLS files a gRPC channel or server uses, as gRPC reads them: holdfastd's
// API and its client TLS to etcd, and libholdfast's (and so the CLI's) client
// certificate.
//
// gRPC re-reads the files it is given every refresh and takes whatever it
// finds: a certificate renewed without its key (a rotation that writes the two
// files one at a time and is caught between them, or one that went wrong) is
// loaded as it is, and from then on every new handshake fails until the files
// are right again. For a service that must stay reachable while its SVIDs
// rotate, and for a client whose SVID rotates under it, that is an outage of new
// connections.
//
// So gRPC is not given the configured files: it is given copies that this class
// replaces only with a set that is whole. Every `check` interval it reads the
// configured key, certificate and CA; when they changed, it checks them (the
// certificate and the key read and belong together, every block of the chain
// and of the CA bundle is a whole certificate) and only then puts them in place
// of the copies. A set that fails the check is not taken: the previous one goes
// on serving. Found the same at the next pass (so not a rotation caught between
// its writes), it is refused, and told once (Options::told: holdfastd logs and
// counts it, libholdfast tells ClientOptions::on_tls_files). The next change of
// the files is checked again.
//
// The copies are anonymous memory files (memfd) that gRPC opens by their
// /proc/self/fd path: no file is written, and nothing is left behind when the
// process ends, however it ends. The certificate chain and its key are one
// copy, the key followed by the chain, served as both the key file and the
// certificate file (OpenSSL's PEM readers pass over the blocks of the other
// kind), so the pair is replaced by one atomic dup3 and no read can see the new
// key with the old certificate. gRPC reads the key and then the certificate and
// compares the files' modification times (whole seconds) around its reads; each
// copy is given a modification time one second past the one it replaces at
// least, so a read that the replacement falls inside is seen, and read again.
// Each copy is sealed (memfd seals): nothing can write to it once it is made.
//
// gRPC may read a provider's paths for a while after the channels that used it
// are gone; so a descriptor number once served is not closed when its TlsFiles
// ends: it is left pointing at an empty memory file, and the next TlsFiles of
// the process serves a file of the same kind under it (a process holds two for each TlsFiles live at once, at most).
//
// Thread-safe. The checking thread runs from Start until destruction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace holdfast {

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
    // How the messages name the setting: "config: " + "tls." (the API's),
    // "etcd.tls.", ...; "" + "" for a client's options ("cert_file PATH ...").
    std::string prefix = "config: ";
    std::string where = "tls.";
    // Who reads the key, for the message of an encrypted one.
    std::string reader = "holdfastd";
    // Files that cannot be read at start are not an error: empty copies are
    // served (no handshake succeeds) until the first whole set is found, as a
    // client waits for an SVID agent that writes its files after the process
    // starts. Otherwise Start refuses them. Files that are read and do not pass
    // the check are refused at start either way.
    bool wait_for_files = false;
    // How often the configured files are read (0: only when Check is called).
    std::chrono::milliseconds check{std::chrono::seconds(5)};
    // Told of each set taken (reason "") or refused, with the reason (for logs
    // and metrics); called by the pass after it, outside the class's lock.
    std::function<void(Outcome outcome, const std::string& reason)> told;
  };

  // Reads and checks the configured files and serves copies of them.
  // INVALID_ARGUMENT when they do not pass the check (as holdfastd's
  // CheckConfigFiles says at start; with wait_for_files, only if they are read
  // again kRecheckAtStart later and still do not: unreadable files are then
  // waited for), INTERNAL when the memory files cannot be made or read back
  // through /proc.
  static constexpr std::chrono::milliseconds kRecheckAtStart{500};
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Start(Options options);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  // The paths to give gRPC (/proc/self/fd/N; key and cert empty for a CA alone,
  // and otherwise the same file: the key followed by the chain).
  const Paths& served() const { return served_; }

  // One pass of the checking thread: reads the configured files and, when they
  // changed, takes them or (at the second pass that finds them) refuses them.
  Outcome Check();

 private:
  explicit TlsFiles(Options options) : options_(std::move(options)) {}
  // Check without the telling: the outcome, and the reason of a refusal.
  Outcome Pass(std::string* reason);
  // Puts the set in place of the served one (the first: makes the served one).
  absl::Status Serve(const std::string& key, const std::string& cert, const std::string& ca);

  const Options options_;
  Paths served_;
  bool started_ = false;  // Serve made the served descriptors
  int pair_fd_ = -1, ca_fd_ = -1;
  // The modification time (seconds) of the copies served last: the next are
  // given a later one.
  int64_t pair_mtime_ = 0, ca_mtime_ = 0;

  // Held for a whole pass of Check, so a pass's dup3s are not interleaved.
  absl::Mutex mu_;
  // The text of the files (key, cert and CA) served; "" after a failed swap.
  std::string served_text_ ABSL_GUARDED_BY(mu_);
  std::string pending_ ABSL_GUARDED_BY(mu_);  // a set that failed once, not yet told
  std::string refused_ ABSL_GUARDED_BY(mu_);  // the last set told refused
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;
};

}  // namespace holdfast
