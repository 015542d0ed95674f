// The auditor (ARCHITECTURE §7): exactly one holdfastd at a time records every
// grant, release, expire and force of etcd's history into the audit store, and
// owns etcd's compaction so that no event is compacted away before it is recorded.
//
// Leader election: the auditor key (/holdfast/audit/leader) is created, on the
// auditor's own lease, only if absent. The leader renews its lease every third of
// its TTL and re-reads the key each time (etcd 3.4.23 can confirm a renewal of a
// revoked lease, so the key, not the renewal, proves leadership). Followers try
// again every `campaign_interval`; when a leader dies, its lease expires and
// another replica takes over from the durable cursor.
//
// Recording: a watch on /holdfast/ after the cursor, without previous values (a
// deletion gets its own from PrevValues, prev_values.h). Each
// watch response holds whole revisions; the loop drains what has arrived,
// classifies it (classify.h) and writes the rows and the new cursor in ONE SQL
// transaction (AuditStore::Record), at most one per `flush_interval`.
//
// Pausing: a live etcd watch sends every revision in a response of its own (a
// message for etcd to send and holdfastd to take in, two per lock cycle at one
// caller), while one started behind gets what it missed together, from etcd's
// catch-up of lagging watches (every 100 ms, at most 1,000 revisions a
// response). So the watch is paused from its first response after a record
// until the record is done, then started again after the last revision taken.
// Under steady writes the trail lags by up to `flush_interval`, plus that
// 100 ms, plus the record's time, and the auditor takes in about one response
// per record. The watch runs on a gRPC stream of its own, and a pause ends the
// stream: etcd 3.4 keeps a response it had queued for a cancelled watch until
// its stream ends. Nothing is lost or doubled: what the ended stream still
// carried is dropped, and the next watch brings it again. The watch stays live
// after a response of 500 revisions or more (more is likely waiting; paused
// after each, it could not follow etcd beyond about 10,000 revisions a second),
// while records fail (the backlog keeps arriving and shows as lag), and with a
// `flush_interval` of 0; it is paused when the etcd client moved to another
// endpoint, so that it starts again there.
//
// Memory: what the watch brought and is not yet recorded is held in memory, up
// to `max_buffered_events` (plus the rest of the response that reached it: at
// most 1,000 revisions). It fills while records fail (the watch then stays
// live, above) or lag behind etcd. At the bound the watch is ended and what etcd
// sends after is dropped (it is still in etcd: the auditor never compacts past
// its cursor); meanwhile the lag is counted from the newest revision the etcd
// client has seen, and AUDIT BEHIND is logged (at most once per
// `lag_warn_interval`). Once what is held is recorded, the watch starts again
// after it.
//
// A cluster never audited before is read from the creation of its epoch record
// (holdfast's first write there). If etcd compacted past the cursor (someone
// compacted by hand, or auto-compaction was turned on), the events in between are
// gone: the auditor logs an AUDIT GAP loudly, names the revisions, and goes on.
//
// Compaction: every `compaction_interval`, the leader compacts etcd at
// cursor − `compaction_keep_revisions` (never past the cursor), so watchers and
// a new leader always find the history they need. etcd's own auto-compaction
// must stay off.
//
// Retention: with `retention` set, the leader deletes the events (and force-release
// rows) older than that from the store, except the trail of holds that may still be
// live (AuditStore::Prune): at the start of its term, then every
// `prune_interval`, oldest first, one transaction of at most `prune_batch` events
// per turn of its loop: while a transaction comes back full, the next goes on the
// next turn, after what the watch brought is recorded, so a backlog of old rows never
// holds up recording for more than one transaction (docs/audit.md has its cost).
// The store is shared by every replica and cluster: holdfastd gives a retention to
// its control cluster's auditor only, and each replica that leads prunes all of it
// by the same rule, so the shortest retention configured wins. A failed prune is
// logged (AUDIT RETENTION) at most once per `lag_warn_interval`.
// Epochs and cursors are never pruned. Off (0) by default: the trail is kept forever.
//
// Lag: when the backlog (revisions seen but not yet recorded) exceeds
// `lag_warn_revisions`, or recording fails, the auditor logs loudly at most once
// per `lag_warn_interval` and reports it in status().
//
// Thread-safe. One thread of its own; Stop() joins it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "audit/store.h"
#include "etcd/client.h"
#include "etcd/watch_hub.h"

namespace holdfast::audit {

struct AuditorOptions {
  std::string replica_id;                              // shown in the leader key
  std::chrono::seconds lease_ttl{10};
  std::chrono::milliseconds campaign_interval{2000};
  std::chrono::milliseconds compaction_interval{std::chrono::minutes(5)};
  int64_t compaction_keep_revisions = 10000;
  int64_t lag_warn_revisions = 100000;
  std::chrono::milliseconds lag_warn_interval{std::chrono::minutes(1)};
  std::chrono::milliseconds etcd_timeout{5000};
  size_t max_batch_events = 5000;                      // rows per SQL transaction
  // Events taken from the watch and held in memory until recorded: reached (the
  // store down or slower than etcd), the watch ends until they are recorded
  // (header comment, "Memory").
  size_t max_buffered_events = 50000;
  // At most one SQL transaction per interval while events keep coming (a full
  // batch goes at once): the trail lags by up to this much.
  std::chrono::milliseconds flush_interval{50};
  // Events older than this are deleted from the store; 0 keeps them forever.
  std::chrono::milliseconds retention{0};
  std::chrono::milliseconds prune_interval{std::chrono::minutes(1)};
  int prune_batch = 1000;                              // events per SQL transaction
};

struct AuditorStatus {
  bool leader = false;
  uint64_t cluster_id = 0;
  int64_t cursor = 0;
  int64_t last_seen_revision = 0;
  int64_t compacted_revision = 0;
  int64_t recorded_events = 0;
  int64_t store_commits = 0;  // audit store transactions that recorded revisions
  int64_t wakeups = 0;        // times the watch woke the auditor thread (this term)
  int64_t watch_responses = 0;  // etcd watch responses with events sent to it (this term)
  int64_t buffered_events = 0;  // taken from the watch, held in memory, not yet recorded
  int64_t gaps = 0;
  int64_t pruned_events = 0;          // deleted for retention, by this replica
  std::string last_error;
};

class Auditor {
 public:
  Auditor(etcd::Client* etcd, AuditStore* store, AuditorOptions options);
  ~Auditor();

  void Start();
  // Stops the thread; a leader resigns (revokes its lease) so another replica
  // takes over at once.
  void Stop();

  AuditorStatus status() const;

 private:
  void Run();
  // One leadership term: returns when leadership is lost or Stop() is called.
  void Lead(int64_t lease);
  bool Campaign(int64_t* lease);
  // Renews the lease and checks the key is still ours (and the cluster the same).
  bool StillLeader(int64_t lease, uint64_t cluster_id);
  absl::StatusOr<int64_t> StartRevision(uint64_t cluster_id);
  void MaybeCompact(std::chrono::steady_clock::time_point* last);
  // One pruning transaction when one is due; `due` moves to the next.
  void MaybePrune(std::chrono::steady_clock::time_point* due);
  void Resign(int64_t lease);
  void SetError(std::string e);
  bool Sleep(std::chrono::milliseconds d);  // false when stopping

  etcd::Client* const etcd_;
  AuditStore* const store_;
  const AuditorOptions options_;

  std::atomic<bool> stop_{false};
  // The auditor thread's own: when it last logged a failed prune.
  std::chrono::steady_clock::time_point last_prune_warning_{};
  std::thread thread_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;  // wakes Sleep() on Stop()

  mutable std::mutex mu_;
  AuditorStatus status_;
};

}  // namespace holdfast::audit
