#include "dev/dev_pki.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace holdfast::dev {

namespace {

namespace fs = std::filesystem;

// Creates `dir` (and its parents) when missing; a directory made here is mode
// 0700, since it will hold private keys. An existing one is left as it is.
absl::Status MakePrivateDir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return absl::OkStatus();
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot chmod ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

// True when the certificate is valid for longer than kRenewBefore.
bool FreshEnough(const CertInfo& info) {
  return info.not_after > std::chrono::system_clock::now() + kRenewBefore;
}

absl::StatusOr<std::string> ReadFileText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A numeric IPv4 or IPv6 address (not a name).
bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// A YAML double-quoted scalar.
std::string YamlQuote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

SvidFiles SvidFiles::In(const std::string& dir) {
  return {dir + "/svid.pem", dir + "/svid_key.pem", dir + "/svid_bundle.pem"};
}

bool SvidFiles::Exist() const {
  std::error_code ec;
  return fs::is_regular_file(cert, ec) && fs::is_regular_file(key, ec) &&
         fs::is_regular_file(bundle, ec);
}

std::string DevCaDir(const std::string& data_dir) { return data_dir + "/ca"; }
std::string DevServerDir(const std::string& data_dir) { return data_dir + "/server"; }
std::string DevCliDir(const std::string& data_dir) { return data_dir + "/cli"; }

std::string DevDirFromEnv() {
  const char* env = std::getenv(kDevDirEnv);
  return env != nullptr && *env != '\0' ? env : kDefaultDevDir;
}

std::optional<SvidFiles> FindDevCliCredentials(const std::string& data_dir) {
  std::error_code ec;
  if (fs::exists(fs::path(data_dir) / kInsecureMarker, ec)) return std::nullopt;
  SvidFiles files = SvidFiles::In(DevCliDir(data_dir));
  if (!files.Exist()) return std::nullopt;
  return files;
}

absl::StatusOr<Pem> LoadDevCa(const std::string& data_dir) {
  const std::string dir = DevCaDir(data_dir);
  auto run_dev = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        why, "; run `holdfast dev --data-dir ", data_dir,
        "` first: it creates the dev CA (trust domain ", kDevTrustDomain, ")"));
  };
  auto pem = ReadPem(dir, "ca");
  if (!pem.ok()) return run_dev(absl::StrCat("no dev CA in ", dir));
  auto info = InspectCert(pem->cert);
  if (!info.ok() || !KeyMatches(pem->cert, pem->key)) {
    return run_dev(absl::StrCat("the dev CA in ", dir, " is damaged"));
  }
  if (info->not_after <= std::chrono::system_clock::now()) {
    return run_dev(absl::StrCat("the dev CA in ", dir, " has expired"));
  }
  return *std::move(pem);
}

absl::StatusOr<DevCa> LoadOrCreateDevCa(const std::string& data_dir) {
  const std::string dir = DevCaDir(data_dir);
  if (auto pem = ReadPem(dir, "ca"); pem.ok()) {
    auto info = InspectCert(pem->cert);
    if (info.ok() && FreshEnough(*info) && KeyMatches(pem->cert, pem->key)) {
      return DevCa{*std::move(pem), false};
    }
  }
  if (auto s = MakePrivateDir(dir); !s.ok()) return s;
  CaOptions o;
  o.common_name = absl::StrCat("holdfast dev CA (", kDevTrustDomain, ")");
  o.validity = kDevCaValidity;
  auto ca = MakeCa(o);
  if (!ca.ok()) return ca.status();
  if (auto s = WritePem(dir, "ca", *ca); !s.ok()) return s;
  return DevCa{*std::move(ca), true};
}

absl::Status IssueSvid(const Pem& ca, const SvidRequest& req, const std::string& out_dir) {
  LeafOptions o;
  o.common_name = req.spiffe_id;
  o.uris = {req.spiffe_id};
  o.dns = req.dns;
  o.ips = req.ips;
  o.validity = kDevSvidValidity;
  auto leaf = MakeLeaf(ca, o);
  if (!leaf.ok()) return leaf.status();
  if (auto s = MakePrivateDir(out_dir); !s.ok()) return s;
  SvidFiles files = SvidFiles::In(out_dir);
  if (auto s = WriteFileAtomically(files.bundle, ca.cert, 0644); !s.ok()) return s;
  if (auto s = WriteFileAtomically(files.key, leaf->key, 0600); !s.ok()) return s;
  return WriteFileAtomically(files.cert, leaf->cert, 0644);
}

absl::StatusOr<bool> EnsureSvid(const Pem& ca, const SvidRequest& req,
                                const std::string& out_dir) {
  auto usable = [&]() -> bool {
    SvidFiles files = SvidFiles::In(out_dir);
    if (!files.Exist()) return false;
    auto pem = ReadPem(out_dir, "svid");
    if (!pem.ok()) return false;
    auto info = InspectCert(pem->cert);
    if (!info.ok() || !FreshEnough(*info)) return false;
    if (info->uris.size() != 1 || info->uris[0] != req.spiffe_id) return false;
    if (!IsSignedBy(pem->cert, ca.cert) || !KeyMatches(pem->cert, pem->key)) return false;
    for (const auto& host : req.dns) {
      if (!CoversHost(pem->cert, host)) return false;
    }
    for (const auto& host : req.ips) {
      if (!CoversHost(pem->cert, host)) return false;
    }
    // The bundle must be this CA (a CA minted again replaces it).
    auto bundle = ReadFileText(files.bundle);
    return bundle.ok() && *bundle == ca.cert;
  };
  if (usable()) return false;
  if (auto s = IssueSvid(ca, req, out_dir); !s.ok()) return s;
  return true;
}

absl::StatusOr<DevPki> PrepareDevPki(const std::string& data_dir,
                                     const std::string& listen_host) {
  auto ca = LoadOrCreateDevCa(data_dir);
  if (!ca.ok()) return ca.status();
  DevPki pki;
  if (ca->minted) pki.minted.push_back("the dev CA");
  SvidRequest server;
  server.spiffe_id = kDevServerId;
  server.dns = {"localhost"};
  server.ips = {"127.0.0.1"};
  // A specific listen address is in the certificate too (wildcards are reached
  // through 127.0.0.1).
  if (listen_host != "0.0.0.0" && listen_host != "::" && !listen_host.empty()) {
    auto& list = IsIpLiteral(listen_host) ? server.ips : server.dns;
    if (std::find(list.begin(), list.end(), listen_host) == list.end()) {
      list.push_back(listen_host);
    }
  }
  auto server_minted = EnsureSvid(ca->pem, server, DevServerDir(data_dir));
  if (!server_minted.ok()) return server_minted.status();
  if (*server_minted) pki.minted.push_back("holdfastd's certificate");
  SvidRequest cli;
  cli.spiffe_id = kDevCliId;
  auto cli_minted = EnsureSvid(ca->pem, cli, DevCliDir(data_dir));
  if (!cli_minted.ok()) return cli_minted.status();
  if (*cli_minted) pki.minted.push_back(absl::StrCat("the CLI's identity ", kDevCliId));
  pki.server = SvidFiles::In(DevServerDir(data_dir));
  pki.cli = SvidFiles::In(DevCliDir(data_dir));
  return pki;
}

absl::StatusOr<std::string> WriteDevHoldfastdConfig(const std::string& data_dir,
                                                    const DevPki& pki) {
  std::string yaml = absl::StrCat(
      "# Written on every start (holdfast dev, holdfast-bench --tls): edits here are lost.\n",
      "tls:\n",
      "  ca_file: ", YamlQuote(pki.server.bundle), "\n",
      "  cert_file: ", YamlQuote(pki.server.cert), "\n",
      "  key_file: ", YamlQuote(pki.server.key), "\n",
      "  trust_domains: [", kDevTrustDomain, "]\n",
      "  refresh: 10s\n",
      "admin_ids: [", YamlQuote(kDevCliId), ", ", YamlQuote(kDevOpsAdmins), "]\n");
  std::string file = data_dir + "/holdfastd.yaml";
  if (auto s = WriteFileAtomically(file, yaml, 0644); !s.ok()) return s;
  return file;
}

}  // namespace holdfast::dev
