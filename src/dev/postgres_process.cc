#include "dev/postgres_process.h"

#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::dev {
namespace {

constexpr const char* kServerUser = "postgres";

std::string DefaultBinDir() {
  if (const char* env = std::getenv("HOLDFAST_PG_BIN_DIR"); env && *env) return env;
  return "/usr/lib/postgresql/15/bin";
}

// The last `max_bytes` of a log file, for error messages.
std::string Tail(const std::string& path, size_t max_bytes = 1500) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() > max_bytes) all = "..." + all.substr(all.size() - max_bytes);
  return all;
}

bool ValidDatabaseName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostgresProcess>> PostgresProcess::Start(PostgresOptions options) {
  if (options.bin_dir.empty()) options.bin_dir = DefaultBinDir();
  for (const char* program : {"initdb", "postgres", "pg_isready", "createdb"}) {
    std::string path = absl::StrCat(options.bin_dir, "/", program);
    if (::access(path.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "PostgreSQL program ", path,
          " not found: run scripts/setup.sh (packages postgresql-15, postgresql-client-15)"));
    }
  }
  if (!ValidDatabaseName(options.database)) {
    return absl::InvalidArgumentError(
        absl::StrCat("postgres: database name \"", options.database, "\" is not [A-Za-z0-9_]+"));
  }
  if (options.port == 0) {
    auto p = PickFreePort();
    if (!p.ok()) return p.status();
    options.port = *p;
  }
  if (options.parent_dir.empty()) {
    std::error_code ec;
    options.parent_dir = std::filesystem::temp_directory_path(ec).string();
    if (ec) options.parent_dir = "/tmp";
  }

  std::unique_ptr<PostgresProcess> pg(new PostgresProcess(std::move(options)));
  uid_t uid = 0;
  gid_t gid = 0;
  if (::geteuid() == 0) {
    // The server refuses to run as root.
    const passwd* pw = ::getpwnam(kServerUser);
    if (pw == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("running as root, PostgreSQL needs the `", kServerUser,
                       "` user: run scripts/setup.sh (package postgresql-15)"));
    }
    uid = pw->pw_uid;
    gid = pw->pw_gid;
    if (std::system("command -v setpriv >/dev/null 2>&1") != 0) {
      return absl::FailedPreconditionError(
          "running as root, PostgreSQL is started through setpriv: run scripts/setup.sh "
          "(package util-linux)");
    }
    pg->as_postgres_user_ = true;
  }
  std::string tmpl = pg->options_.parent_dir + "/holdfast-pg-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("postgres: mkdtemp under ", pg->options_.parent_dir,
                                            ": ", std::strerror(errno)));
  }
  pg->dir_ = tmpl;
  std::string sock = pg->dir_ + "/sock";
  if (::mkdir(sock.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("postgres: mkdir ", sock, ": ", std::strerror(errno)));
  }
  if (pg->as_postgres_user_) {
    for (const std::string& d : {pg->dir_, sock}) {
      if (::chown(d.c_str(), uid, gid) != 0) {
        return absl::InternalError(absl::StrCat("postgres: chown ", d, ": ", std::strerror(errno)));
      }
    }
  }
  if (auto s = pg->InitDb(); !s.ok()) return s;
  if (auto s = pg->Launch(); !s.ok()) return s;
  if (auto s = pg->CreateDatabase(pg->options_.database); !s.ok()) return s;
  return pg;
}

PostgresProcess::~PostgresProcess() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string PostgresProcess::conninfo(const std::string& database) const {
  return absl::StrCat("host=127.0.0.1 port=", options_.port, " user=", kPostgresTestUser,
                      " dbname=", database, " connect_timeout=10");
}

std::string PostgresProcess::url(const std::string& database) const {
  return absl::StrCat("postgresql://", kPostgresTestUser, "@127.0.0.1:", options_.port, "/",
                      database);
}

std::vector<std::string> PostgresProcess::AsServerUser(std::vector<std::string> argv) const {
  if (!as_postgres_user_) return argv;
  std::vector<std::string> out = {"setpriv", absl::StrCat("--reuid=", kServerUser),
                                  absl::StrCat("--regid=", kServerUser), "--init-groups", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status PostgresProcess::RunToCompletion(std::vector<std::string> argv,
                                              const std::string& what) {
  SpawnOptions so;
  so.argv = std::move(argv);
  so.log_file = log_file();
  std::string command = absl::StrJoin(so.argv, " ");
  auto child = Subprocess::Spawn(std::move(so));
  if (!child.ok()) return child.status();
  std::optional<int> code = (*child)->Wait(options_.start_timeout);
  if (!code) {
    (*child)->Stop(std::chrono::seconds(1));
    return absl::DeadlineExceededError(
        absl::StrCat("postgres: ", what, " did not finish in time: ", command));
  }
  if (*code != 0) {
    return absl::InternalError(absl::StrCat("postgres: ", what, " failed (exit ", *code,
                                            "): ", command, "\n", Tail(log_file())));
  }
  return absl::OkStatus();
}

absl::Status PostgresProcess::InitDb() {
  return RunToCompletion(AsServerUser({options_.bin_dir + "/initdb", "-D", dir_ + "/data", "-U",
                                       kPostgresTestUser, "--auth=trust", "--encoding=UTF8",
                                       "--locale=C", "--no-sync", "--no-instructions"}),
                         "initdb");
}

absl::Status PostgresProcess::Launch() {
  SpawnOptions so;
  so.argv = AsServerUser({options_.bin_dir + "/postgres", "-D", dir_ + "/data", "-k",
                          dir_ + "/sock", "-h", "127.0.0.1", "-p", absl::StrCat(options_.port),
                          // Test data is thrown away: durability buys nothing here.
                          // (holdfastd raises synchronous_commit to on in its own
                          // transactions; with fsync off that costs nothing.)
                          "-c", "fsync=off", "-c", "synchronous_commit=off", "-c",
                          "full_page_writes=off", "-c", "shared_buffers=16MB", "-c",
                          "max_connections=50", "-c", "logging_collector=off"});
  for (const auto& a : options_.extra_args) so.argv.push_back(a);
  so.log_file = log_file();
  auto p = Subprocess::Spawn(std::move(so));
  if (!p.ok()) return p.status();
  server_ = std::move(*p);
  return WaitAccepting();
}

absl::Status PostgresProcess::WaitAccepting() {
  auto until = std::chrono::steady_clock::now() + options_.start_timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (!server_->Running()) {
      return absl::InternalError(
          absl::StrCat("postgres exited at start; log ", log_file(), ":\n", Tail(log_file())));
    }
    SpawnOptions so;
    so.argv = {options_.bin_dir + "/pg_isready", "-q", "-h", "127.0.0.1", "-p",
               absl::StrCat(options_.port),      "-t", "2"};
    so.log_file = log_file();
    auto probe = Subprocess::Spawn(std::move(so));
    if (!probe.ok()) return probe.status();
    std::optional<int> code = (*probe)->Wait(std::chrono::seconds(5));
    if (code && *code == 0) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "postgres did not accept connections in time; log ", log_file(), ":\n", Tail(log_file())));
}

absl::Status PostgresProcess::CreateDatabase(const std::string& name) {
  if (!ValidDatabaseName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("postgres: database name \"", name, "\" is not [A-Za-z0-9_]+"));
  }
  return RunToCompletion({options_.bin_dir + "/createdb", "-h", "127.0.0.1", "-p",
                          absl::StrCat(options_.port), "-U", kPostgresTestUser, std::string(name)},
                         absl::StrCat("createdb ", name));
}

void PostgresProcess::Stop() {
  if (!server_) return;
  if (server_->Running()) {
    // SIGINT to the postmaster alone is PostgreSQL's fast shutdown: it ends open
    // sessions and exits cleanly (SIGTERM would wait for every client to leave).
    ::kill(server_->pid(), SIGINT);
    if (!server_->Wait(std::chrono::seconds(15))) {
      server_->Stop(std::chrono::seconds(2));  // SIGTERM, then SIGKILL, to the group
    }
  }
  server_.reset();
}

absl::Status PostgresProcess::Restart() {
  Stop();
  return Launch();
}

}  // namespace holdfast::dev
