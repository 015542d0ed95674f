// The dev PKI of `holdfast dev`: one CA for trust domain holdfast.dev kept in the
// dev data directory, holdfastd's certificate, and the CLI's identity, so that
// development runs mTLS with SPIFFE IDs like production (ARCHITECTURE §9).
// holdfast-bench --tls makes the same in its own temporary directory.
//
// Layout under the data directory DIR (key files mode 0600, directories 0700):
//   DIR/ca/ca.pem, DIR/ca/ca_key.pem        the dev CA (valid 10 years)
//   DIR/server/svid.pem, svid_key.pem,      holdfastd: spiffe://holdfast.dev/holdfastd,
//              svid_bundle.pem              DNS localhost, IP 127.0.0.1 (+ the listen host)
//   DIR/cli/svid.pem, svid_key.pem,         the CLI: spiffe://holdfast.dev/dev/cli
//           svid_bundle.pem
//   DIR/holdfastd.yaml                      holdfastd's config for them (written
//                                           on every start)
// svid_bundle.pem is the dev CA (the trust bundle to verify peers with); the
// file names are the ones SPIRE's helper writes. Leaves are valid for a year.
// Everything is reused on later starts and minted again when missing, expiring
// within a day, not signed by the current CA, or not naming what it must.
//
// Thread-compatible: one process at a time may write a DIR (`holdfast dev` holds
// DIR/dev.lock; holdfast-bench writes only its own temporary directory); reading
// is safe meanwhile (files are replaced by rename).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dev/certs.h"

namespace holdfast::dev {

inline constexpr char kDevTrustDomain[] = "holdfast.dev";
inline constexpr char kDevServerId[] = "spiffe://holdfast.dev/holdfastd";
inline constexpr char kDevCliId[] = "spiffe://holdfast.dev/dev/cli";
// The dev admins: the CLI's identity, and every identity under /ops/.
inline constexpr char kDevOpsAdmins[] = "spiffe://holdfast.dev/ops/*";
// The CLI looks for dev credentials in $HOLDFAST_DEV_DIR, else ./.holdfast-dev.
inline constexpr char kDevDirEnv[] = "HOLDFAST_DEV_DIR";
inline constexpr char kDefaultDevDir[] = ".holdfast-dev";
// DIR/insecure exists while the last `holdfast dev` on DIR serves without TLS
// (--insecure): the CLI then speaks plaintext although DIR/cli/ exists.
inline constexpr char kInsecureMarker[] = "insecure";

inline constexpr std::chrono::seconds kDevCaValidity = std::chrono::hours(24 * 3653);
inline constexpr std::chrono::seconds kDevSvidValidity = std::chrono::hours(24 * 365);
// A certificate expiring sooner than this is minted again.
inline constexpr std::chrono::seconds kRenewBefore = std::chrono::hours(24);

// The three files of one SVID in `dir`.
struct SvidFiles {
  std::string cert;    // dir/svid.pem
  std::string key;     // dir/svid_key.pem
  std::string bundle;  // dir/svid_bundle.pem
  static SvidFiles In(const std::string& dir);
  // All three exist.
  bool Exist() const;
};

std::string DevCaDir(const std::string& data_dir);      // DIR/ca
std::string DevServerDir(const std::string& data_dir);  // DIR/server
std::string DevCliDir(const std::string& data_dir);     // DIR/cli

// $HOLDFAST_DEV_DIR, else kDefaultDevDir.
std::string DevDirFromEnv();
// The CLI's dev credentials in `data_dir`, when they exist and the last
// `holdfast dev` there serves mTLS.
std::optional<SvidFiles> FindDevCliCredentials(const std::string& data_dir);

struct DevCa {
  Pem pem;
  bool minted = false;  // made now (none was there, or it had expired)
};
// The dev CA of `data_dir`, made (and written) when there is none usable.
absl::StatusOr<DevCa> LoadOrCreateDevCa(const std::string& data_dir);
// The dev CA of `data_dir`, never made. FAILED_PRECONDITION saying to run
// `holdfast dev` when it is missing, damaged or expired.
absl::StatusOr<Pem> LoadDevCa(const std::string& data_dir);

struct SvidRequest {
  std::string spiffe_id;  // the one URI SAN
  std::vector<std::string> dns;
  std::vector<std::string> ips;
};
// Mints an SVID for `req` signed by `ca` and writes its three files into
// `out_dir` (created, mode 0700, when missing).
absl::Status IssueSvid(const Pem& ca, const SvidRequest& req, const std::string& out_dir);
// Keeps the SVID in `out_dir` when it is valid for longer than kRenewBefore,
// signed by `ca`, matches its key, names exactly req.spiffe_id and covers every
// DNS name and IP of `req`; otherwise issues a new one. True when it issued.
absl::StatusOr<bool> EnsureSvid(const Pem& ca, const SvidRequest& req,
                                const std::string& out_dir);

// The dev PKI of `data_dir` made ready for a start of holdfastd: the CA (made on
// the first start, or when expired), holdfastd's SVID for `listen_host` (besides
// localhost and 127.0.0.1), the CLI's SVID. `holdfast dev` and holdfast-bench
// --tls use it.
struct DevPki {
  SvidFiles server;
  SvidFiles cli;
  std::vector<std::string> minted;  // what was (re)made now, for a banner
};
absl::StatusOr<DevPki> PrepareDevPki(const std::string& data_dir, const std::string& listen_host);

// Writes data_dir/holdfastd.yaml: mTLS with `pki`, trust domain holdfast.dev,
// the dev admins (the CLI's identity and kDevOpsAdmins). --listen and --etcd are
// left to flags. Returns the file's path.
absl::StatusOr<std::string> WriteDevHoldfastdConfig(const std::string& data_dir,
                                                    const DevPki& pki);

}  // namespace holdfast::dev
