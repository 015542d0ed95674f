// The etcd clusters one holdfastd serves, and which of them homes each namespace.
//
// Every cluster in the config gets its own etcd client, health probe, lock
// engine, registry, force-release store, epochs (restore guard), auditor and
// op_rate_quota cache: a cluster is a whole holdfast key space (lock/keyspace.h).
// One of them is the control cluster; its /holdfast/placement/ records say where
// each namespace lives (absent: on the control cluster). Requests carry their
// namespace, and are routed by it (RouteFor); session ids are lease ids, unique
// per cluster only, so they never decide a route.
//
// With one cluster (the default config) there are no placements at all: every
// namespace is on it, and nothing is read or watched for routing.
//
// Thread-safety: ClusterSet is thread-safe once Start()ed; the Cluster objects it
// hands out live as long as it does. Placements is thread-safe; its watch
// callback runs on a gRPC thread and takes only its own lock.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "audit/auditor.h"
#include "audit/epochs.h"
#include "etcd/client.h"
#include "lock/engine.h"
#include "lock/etcd_health.h"
#include "lock/force_release.h"
#include "lock/records.pb.h"
#include "lock/registry.h"
#include "server/config.h"
#include "server/op_quota.h"

namespace holdfast::server {

// One etcd cluster and what this replica runs on it. Filled by the server at
// start; the pointers do not change while it serves (Shutdown resets them).
// Thread-safe: healthy and the restore reason may be read and set from any thread.
struct Cluster {
  ClusterConfig config;
  std::unique_ptr<etcd::Client> etcd;
  std::unique_ptr<lock::EtcdHealth> health;
  std::unique_ptr<lock::Engine> engine;
  std::unique_ptr<lock::Registry> registry;
  std::unique_ptr<lock::ForceReleases> force;
  std::unique_ptr<audit::Epochs> epochs;
  // The auditor's own connection to the audit store (null without one): its
  // records never queue behind another cluster's records, an operator's query or
  // the epoch guard on the server's connection (Server::Start). Declared before
  // the auditor, which uses it, so that it goes after it.
  std::unique_ptr<audit::AuditStore> audit_connection;
  std::unique_ptr<audit::Auditor> auditor;  // null without an audit store
  std::unique_ptr<OpQuota> op_quota;
  std::atomic<bool> healthy{true};
  // Whether the restore guard's last look could read the audit store (logged when
  // it changes).
  std::atomic<bool> guard_store_ok{true};

  const std::string& name() const { return config.name; }
  // Why grants are refused on this cluster ("" while they are not).
  std::string restore_reason() const {
    absl::MutexLock l(&guard_mu_);
    return restore_reason_;
  }
  void set_restore_reason(std::string r) {
    absl::MutexLock l(&guard_mu_);
    restore_reason_ = std::move(r);
  }

 private:
  mutable absl::Mutex guard_mu_;
  std::string restore_reason_ ABSL_GUARDED_BY(guard_mu_);
};

// What a namespace-scoped call needs: the engine and the quota of its home.
struct Route {
  lock::Engine* engine = nullptr;
  OpQuota* quota = nullptr;  // may be null
};

// The routing the gRPC services use (implemented by ClusterSet).
class Router {
 public:
  virtual ~Router() = default;
  virtual Route RouteFor(const std::string& ns) const = 0;
};

// The placement records of the control cluster, cached and kept current by a
// watch on /holdfast/placement/. A replica that writes a record itself notes it
// at once (Note), so its own next call already routes by it; every other
// replica follows within a watch delivery (a stale route reaches the old home,
// which refuses: the namespace there is draining, moved, or gone).
class Placements {
 public:
  // `known`: the names of the clusters this holdfastd's config lists. A record
  // naming another home is warned of (the namespace's calls then reach the
  // control cluster, which does not have it: "does not exist").
  Placements(etcd::Client* control, std::string control_name, std::set<std::string> known)
      : etcd_(control), control_name_(std::move(control_name)), known_(std::move(known)) {}
  ~Placements() { Stop(); }

  // Reads every record and watches from the next revision. Blocking.
  absl::Status Load(etcd::Deadline d);
  // True once the watch ended (compacted or cancelled), or answered from
  // another cluster than the one read (etcd restored): Load again.
  bool stale() const;
  // Makes stale() true: the control cluster was found restored. Its revisions
  // went back, so the watch, resumed past the restored ones, misses the
  // changes made after the restore until etcd's revision catches up, and
  // entries noted at revisions the restore took back would outrank them.
  void MarkStale();
  void Stop();

  // The namespace's home cluster (the control cluster when it has no record).
  std::string HomeOf(const std::string& ns) const;
  std::optional<records::PlacementRecord> Get(const std::string& ns) const;
  std::map<std::string, records::PlacementRecord> All() const;
  // A record this replica wrote (nullopt: deleted) at `revision`.
  void Note(const std::string& ns, std::optional<records::PlacementRecord> rec,
            int64_t revision);
  // The entries kept, deletions not yet seen on the watch included.
  size_t kept() const;

 private:
  // A deletion this replica noted is kept (rec nullopt) until the watch has
  // passed its revision: until then an older put of the record may still come on
  // the watch and must not bring it back. After, nothing older can come (the
  // watch delivers in revision order, and a note at or below `watched_` is
  // dropped), so the entry goes: a replica seeing many namespaces created and
  // deleted keeps none of them.
  struct Entry {
    std::optional<records::PlacementRecord> rec;  // nullopt: deleted
    int64_t revision = 0;
  };
  void OnWatch(uint64_t generation, absl::StatusOr<etcd::WatchBatch> batch);
  void ApplyLocked(const std::string& ns, std::optional<records::PlacementRecord> rec,
                   int64_t revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  etcd::Client* const etcd_;
  const std::string control_name_;
  const std::set<std::string> known_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  etcd::WatchId watch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t cluster_id_ ABSL_GUARDED_BY(mu_) = 0;  // the cluster Load read
  // Every change up to this revision has been applied (Load's read, then the
  // watch's events).
  int64_t watched_ ABSL_GUARDED_BY(mu_) = 0;
  // The deletions kept, by revision (some may have been put again since).
  std::multimap<int64_t, std::string> deletions_ ABSL_GUARDED_BY(mu_);
};

class ClusterSet final : public Router {
 public:
  // Takes the clusters, the control one among them. With several clusters,
  // `placements` is set (and loaded) by the caller.
  ClusterSet(std::vector<std::unique_ptr<Cluster>> clusters,
             std::unique_ptr<Placements> placements);

  Route RouteFor(const std::string& ns) const override;

  Cluster& control() const { return *control_; }
  // nullptr when no cluster has that name.
  Cluster* Named(const std::string& name) const;
  Cluster& Home(const std::string& ns) const;
  const std::vector<std::unique_ptr<Cluster>>& all() const { return clusters_; }
  bool single() const { return clusters_.size() == 1; }
  // Null with a single cluster.
  Placements* placements() const { return placements_.get(); }

  // Where a new namespace of `tier` is homed: the first cluster of that tier;
  // with no tier, the control cluster. INVALID_ARGUMENT when no cluster has the
  // tier (with one cluster too).
  absl::StatusOr<Cluster*> ForTier(const std::string& tier) const;
  // "a, b, c" for messages.
  std::string Names() const;

 private:
  std::vector<std::unique_ptr<Cluster>> clusters_;
  Cluster* control_ = nullptr;
  std::unique_ptr<Placements> placements_;
};

}  // namespace holdfast::server
