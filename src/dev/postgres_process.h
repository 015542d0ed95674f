// A real PostgreSQL 15 server (the Debian binaries) on loopback, for the tests of
// the audit store. Start() runs initdb into a fresh temporary directory and starts
// `postgres` on 127.0.0.1 and a free port, tuned for tests (fsync off, small
// buffers: the data is thrown away); the destructor stops it and removes the
// directory.
//
// PostgreSQL refuses to run as root: when the test runs as root, initdb and
// postgres run as the `postgres` system user (from the postgresql-15 package) via
// setpriv, and the directory belongs to that user.
//
// Thread-compatible. Client programs (pg_isready, createdb) are run as children;
// this class does not link libpq.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dev/subprocess.h"

namespace holdfast::dev {

struct PostgresOptions {
  // Where initdb, postgres, pg_isready and createdb are; default:
  // $HOLDFAST_PG_BIN_DIR, else /usr/lib/postgresql/15/bin.
  std::string bin_dir;
  // The temporary directory is made under this one; default: the system's
  // temporary directory. When running as root, the `postgres` user must be able to
  // reach it.
  std::string parent_dir;
  int port = 0;                       // 0: pick a free one
  std::string database = "holdfast";  // created by Start(); conninfo() names it
  std::chrono::milliseconds start_timeout{60000};
  std::vector<std::string> extra_args;  // more `postgres` flags, e.g. {"-c", "x=y"}
};

class PostgresProcess {
 public:
  // initdb, start, wait until the server accepts connections, create the database.
  // Errors: NOT_FOUND (no PostgreSQL binaries: run scripts/setup.sh, package
  // postgresql-15), FAILED_PRECONDITION (running as root without a `postgres`
  // user or setpriv), DEADLINE_EXCEEDED (not accepting connections in time),
  // INTERNAL (initdb, postgres or createdb failed: the message quotes its log).
  static absl::StatusOr<std::unique_ptr<PostgresProcess>> Start(PostgresOptions options = {});
  // Stops the server and removes its directory.
  ~PostgresProcess();
  PostgresProcess(const PostgresProcess&) = delete;
  PostgresProcess& operator=(const PostgresProcess&) = delete;

  // A libpq connection string for options().database, e.g.
  // "host=127.0.0.1 port=41234 user=holdfast dbname=holdfast".
  std::string conninfo() const { return conninfo(options_.database); }
  // The same for another database of this server.
  std::string conninfo(const std::string& database) const;
  // The same as a URL: "postgresql://holdfast@127.0.0.1:41234/<database>".
  std::string url(const std::string& database) const;

  // Creates another (empty) database; names are [A-Za-z0-9_]+.
  // Errors: INVALID_ARGUMENT (name), INTERNAL (createdb failed).
  absl::Status CreateDatabase(const std::string& name);

  int port() const { return options_.port; }
  const std::string& dir() const { return dir_; }
  std::string log_file() const { return dir_ + "/postgres.log"; }
  const PostgresOptions& options() const { return options_; }

  // Stops the server (fast shutdown: open sessions are ended), keeping its data.
  void Stop();
  // Starts it again on the same port and data; waits until it accepts connections.
  absl::Status Restart();

 private:
  explicit PostgresProcess(PostgresOptions options) : options_(std::move(options)) {}
  absl::Status InitDb();
  absl::Status Launch();
  absl::Status WaitAccepting();
  // argv prefixed to run as the `postgres` user when we are root.
  std::vector<std::string> AsServerUser(std::vector<std::string> argv) const;
  // Runs a short-lived program to completion, appending its output to the log.
  // INTERNAL (with the log's tail) when it fails.
  absl::Status RunToCompletion(std::vector<std::string> argv, const std::string& what);

  PostgresOptions options_;
  std::string dir_;  // the temporary directory: data/, sock/, postgres.log
  bool as_postgres_user_ = false;
  std::unique_ptr<Subprocess> server_;
};

// The superuser initdb creates (trust authentication on loopback).
inline constexpr const char* kPostgresTestUser = "holdfast";

}  // namespace holdfast::dev
