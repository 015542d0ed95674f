// audit-store-bench: what one commit of the audit store costs as the store grows.
//
// The auditor records the events of one flush interval (audit.flush_interval, 50 ms)
// and its cursor in one AuditStore::Record call, one SQL transaction. This tool
// grows a store through the same call, in large batches, and at each size times
// `--commits` records of `--batch` events (a grant and a release per lock cycle,
// spread over `--keys` lock keys and 50 identities): 200 events per commit is a
// 50 ms flush at 2,000 lock cycles/s. Sizes: the empty store, then --events/16,
// /8, /4, /2 and --events. The store is the shipped one (schema, pragmas, SQL),
// SQLite by default in a temporary directory removed at the end, or any store URL
// holdfastd accepts (`--store postgresql://...`: its rows are left there).
//
// Prints one line per size: events in the store, the file's size (SQLite), and the
// commit's p50 / mean / p99. Then retention (audit.retention, AuditStore::Prune): the
// older half of the store is pruned in transactions of `--prune-batch` events, as the
// auditor does, with each transaction's p50 / mean / p99, and the commit is measured
// once more on the pruned store. Exit status 0 when every call succeeded, 1 otherwise.
// See docs/audit.md ("Size") and docs/performance.md.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "audit/store.h"
#include "dev/temp_dir.h"

namespace {

using holdfast::audit::AuditEvent;
using holdfast::audit::AuditStore;
using holdfast::audit::EventType;

constexpr uint64_t kCluster = 1;
constexpr int64_t kEpochMs = 1'700'000'000'000;

// Lock cycles as the auditor records them: a grant and its release, two revisions.
class Cycles {
 public:
  Cycles(int keys, uint32_t seed) : keys_(keys), rng_(seed) {}

  std::vector<AuditEvent> Next(int64_t events) {
    std::vector<AuditEvent> out;
    out.reserve(static_cast<size_t>(events));
    std::uniform_int_distribution<int> key(0, keys_ - 1), who(0, 49);
    std::uniform_int_distribution<int64_t> session(1, int64_t{1} << 40);
    for (int64_t i = 0; i + 1 < events; i += 2) {
      AuditEvent grant;
      grant.cluster_id = kCluster;
      grant.revision = next_revision_++;
      grant.ns = "bench";
      grant.lock_key = absl::StrFormat("bench/k%05d", key(rng_));
      grant.session_id = session(rng_);
      grant.type = EventType::kGrant;
      grant.spiffe_id = absl::StrFormat("spiffe://example.org/svc/%02d", who(rng_));
      grant.token = grant.revision;
      grant.time_unix_ms = kEpochMs + grant.revision;
      AuditEvent release = grant;
      release.revision = next_revision_++;
      release.type = EventType::kRelease;
      release.time_unix_ms = kEpochMs + release.revision;
      out.push_back(std::move(grant));
      out.push_back(std::move(release));
    }
    return out;
  }
  int64_t cursor() const { return next_revision_ - 1; }

 private:
  const int keys_;
  std::mt19937_64 rng_;
  int64_t next_revision_ = 1;
};

int64_t FileBytes(const std::string& path) {
  int64_t total = 0;
  for (const char* suffix : {"", "-wal"}) {
    struct stat st {};
    if (stat((path + suffix).c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"audit-store-bench: the audit store's commit cost as it grows"};
  std::string url;
  int keys = 10'000, batch = 200, commits = 100, prune_batch = 1'000;
  int64_t events = 8'000'000;
  app.add_option("--store", url, "a store URL (default: SQLite in a temporary directory)");
  app.add_option("--keys", keys, "distinct lock keys the events spread over")
      ->check(CLI::Range(1, 10'000'000));
  app.add_option("--events", events, "events in the store at the last size")
      ->check(CLI::Range(int64_t{1'600}, int64_t{1'000'000'000}));
  app.add_option("--batch", batch, "events per timed commit (even)")
      ->check(CLI::Range(2, 100'000));
  app.add_option("--commits", commits, "timed commits per size")->check(CLI::Range(1, 100'000));
  app.add_option("--prune-batch", prune_batch, "events per pruning transaction")
      ->check(CLI::Range(1, AuditStore::kMaxPruneEvents));
  CLI11_PARSE(app, argc, argv);
  batch -= batch % 2;

  std::string dir, sqlite_path;
  if (url.empty()) {
    auto made = holdfast::dev::MakeTempDir("audit-store-bench");
    if (!made.ok()) {
      std::fprintf(stderr, "audit-store-bench: %s\n", made.status().ToString().c_str());
      return 1;
    }
    dir = *made;
    sqlite_path = dir + "/audit.db";
    url = "sqlite:" + sqlite_path;
  }
  int rc = 0;
  {
    auto store = holdfast::audit::OpenStore(url);
    if (!store.ok()) {
      std::fprintf(stderr, "audit-store-bench: %s\n", store.status().ToString().c_str());
      rc = 1;
    } else {
      std::printf("store %s, %d keys, commits of %d events\n", url.c_str(), keys, batch);
      Cycles cycles(keys, 1);
      int64_t in_store = 0;
      auto record = [&](int64_t n, double* ms) {
        auto rows = cycles.Next(n);
        auto start = std::chrono::steady_clock::now();
        auto s = (*store)->Record(kCluster, cycles.cursor(), rows, {});
        if (ms) {
          *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                          start)
                    .count();
        }
        if (!s.ok()) {
          std::fprintf(stderr, "audit-store-bench: record: %s\n", s.ToString().c_str());
          return false;
        }
        in_store += static_cast<int64_t>(rows.size());
        return true;
      };
      // "p50 .. ms  mean .. ms  p99 .. ms" of a non-empty sample.
      auto spread = [](std::vector<double> ms) {
        std::sort(ms.begin(), ms.end());
        double mean = 0;
        for (double m : ms) mean += m / static_cast<double>(ms.size());
        auto at = [&](double q) { return ms[static_cast<size_t>(q * (ms.size() - 1))]; };
        return absl::StrFormat("p50 %6.2f ms  mean %6.2f ms  p99 %6.2f ms", at(0.5), mean, at(0.99));
      };
      auto size = [&] {
        return sqlite_path.empty()
                   ? std::string("-")
                   : absl::StrFormat("%.0f MiB", FileBytes(sqlite_path) / 1048576.0);
      };
      auto measure = [&]() {
        std::vector<double> ms(static_cast<size_t>(commits));
        for (auto& m : ms) {
          if (!record(batch, &m)) return false;
        }
        std::printf("%11lld events  %9s  commit: %s\n", static_cast<long long>(in_store),
                    size().c_str(), spread(ms).c_str());
        std::fflush(stdout);
        return true;
      };
      // Events carry time kEpochMs + revision: this cutoff is the older half.
      auto prune = [&]() {
        const int64_t before = kEpochMs + cycles.cursor() / 2;
        std::vector<double> ms;
        int64_t pruned = 0;
        while (true) {
          auto start = std::chrono::steady_clock::now();
          auto p = (*store)->Prune(before, prune_batch);
          if (!p.ok()) {
            std::fprintf(stderr, "audit-store-bench: prune: %s\n", p.status().ToString().c_str());
            return false;
          }
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                 start)
                           .count());
          pruned += p->events;
          if (p->events < prune_batch) break;
        }
        in_store -= pruned;
        std::printf("pruned %lld events in %zu transactions of up to %d: %s\n",
                    static_cast<long long>(pruned), ms.size(), prune_batch, spread(ms).c_str());
        std::fflush(stdout);
        return true;
      };
      bool ok = measure();
      for (int64_t size = events / 16; ok && size <= events; size *= 2) {
        const int64_t chunk = std::max<int64_t>(batch, 20'000);
        while (ok && in_store < size) ok = record(std::min(chunk, size - in_store + 1), nullptr);
        if (ok) ok = measure();
      }
      if (ok) ok = prune();
      if (ok) ok = measure();
      if (!ok) rc = 1;
    }
  }
  if (!dir.empty()) std::filesystem::remove_all(dir);
  return rc;
}
