#include "audit/auditor.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "audit/classify.h"
#include "audit/prev_values.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::audit {
namespace {

namespace pb = ::etcdserverpb;
using Clock = std::chrono::steady_clock;

// What the watch delivered, handed from gRPC threads to the auditor's thread. One
// per leadership term, so a late batch of an old term never reaches a new one.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<mvccpb::Event>> batches;
  size_t events = 0;   // in batches
  size_t taken = 0;    // events taken out of batches by the auditor, not yet recorded
  absl::Status error;  // the watch ended
  int64_t wakeups = 0;  // notifications sent to the auditor thread
  int64_t responses = 0;  // watch responses with events, taken in or dropped
  bool closed = false;  // the watch was paused: what it still sends is dropped
  // The inbox reached max_buffered_events: closed, and what it holds is kept
  // (the next watch starts after it).
  bool full = false;
};

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

Auditor::Auditor(etcd::Client* etcd, AuditStore* store, AuditorOptions options)
    : etcd_(etcd), store_(store), options_(std::move(options)) {}

Auditor::~Auditor() { Stop(); }

void Auditor::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Auditor::Stop() {
  {
    std::lock_guard l(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

AuditorStatus Auditor::status() const {
  std::lock_guard l(mu_);
  return status_;
}

void Auditor::SetError(std::string e) {
  std::lock_guard l(mu_);
  status_.last_error = std::move(e);
}

bool Auditor::Sleep(std::chrono::milliseconds d) {
  std::unique_lock l(stop_mu_);
  return !stop_cv_.wait_for(l, d, [this] { return stop_.load(); });
}

void Auditor::Run() {
  while (!stop_) {
    int64_t lease = 0;
    if (Campaign(&lease)) {
      std::fprintf(stderr, "holdfastd: auditor: %s leads the audit\n",
                   options_.replica_id.c_str());
      Lead(lease);
      {
        std::lock_guard l(mu_);
        status_.leader = false;
        status_.buffered_events = 0;  // what the term held is gone with it
      }
      Resign(lease);
      if (stop_) break;
      std::fprintf(stderr, "holdfastd: auditor: %s no longer leads the audit\n",
                   options_.replica_id.c_str());
    }
    if (!Sleep(options_.campaign_interval)) break;
  }
}

bool Auditor::Campaign(int64_t* lease) {
  auto d = etcd::DeadlineIn(options_.etcd_timeout);
  pb::RangeRequest probe;
  probe.set_key(keyspace::AuditorKey());
  auto held = etcd_->RangeSync(probe, d);
  if (!held.ok() || held->kvs_size() > 0) return false;  // unreachable, or someone leads
  pb::LeaseGrantRequest g;
  g.set_ttl(options_.lease_ttl.count());
  auto granted = etcd_->LeaseGrantSync(g, d);
  if (!granted.ok() || !granted->error().empty()) return false;
  pb::TxnRequest txn;
  auto* c = txn.add_compare();
  c->set_key(keyspace::AuditorKey());
  c->set_target(pb::Compare::CREATE);
  c->set_result(pb::Compare::EQUAL);
  c->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::AuditorKey());
  put->set_value(options_.replica_id);
  put->set_lease(granted->id());
  auto t = etcd_->TxnSync(txn, d);
  if (!t.ok() || !t->succeeded()) {
    Resign(granted->id());
    return false;
  }
  *lease = granted->id();
  return true;
}

void Auditor::Resign(int64_t lease) {
  pb::LeaseRevokeRequest r;
  r.set_id(lease);
  etcd::Await<pb::LeaseRevokeResponse>([&](etcd::Callback<pb::LeaseRevokeResponse> cb) {
    etcd_->LeaseRevoke(r, etcd::DeadlineIn(options_.etcd_timeout), std::move(cb));
  }).IgnoreError();
}

bool Auditor::StillLeader(int64_t lease, uint64_t cluster_id) {
  auto renewed = etcd::Await<pb::LeaseKeepAliveResponse>(
      [&](etcd::Callback<pb::LeaseKeepAliveResponse> cb) {
        etcd_->KeepAlive(lease, etcd::DeadlineIn(options_.etcd_timeout), std::move(cb));
      });
  if (!renewed.ok() || renewed->ttl() <= 0) return false;
  pb::RangeRequest r;
  r.set_key(keyspace::AuditorKey());
  auto key = etcd_->RangeSync(r, etcd::DeadlineIn(options_.etcd_timeout));
  if (!key.ok()) return false;
  if (key->header().cluster_id() != cluster_id) {
    std::fprintf(stderr,
                 "holdfastd: auditor: etcd's cluster id changed (%llu -> %llu): restarting the "
                 "audit on the new cluster's cursor\n",
                 static_cast<unsigned long long>(cluster_id),
                 static_cast<unsigned long long>(key->header().cluster_id()));
    return false;
  }
  return key->kvs_size() == 1 && key->kvs(0).lease() == lease;
}

absl::StatusOr<int64_t> Auditor::StartRevision(uint64_t cluster_id) {
  auto cursor = store_->Cursor(cluster_id);
  if (!cursor.ok()) return cursor.status();
  if (*cursor) return **cursor + 1;
  // Never audited: from holdfast's first write on this cluster.
  pb::RangeRequest r;
  r.set_key(keyspace::EpochKey());
  auto epoch = etcd_->RangeSync(r, etcd::DeadlineIn(options_.etcd_timeout));
  if (!epoch.ok()) return epoch.status();
  if (epoch->kvs_size() == 0) return epoch->header().revision() + 1;
  records::EpochRecord rec;
  if (!rec.ParseFromString(epoch->kvs(0).value()) || rec.etcd_cluster_id() != cluster_id) {
    // A cluster restored (or copied) from another's snapshot: its history up to
    // now was recorded under the other cluster id. Audit what happens from now.
    return epoch->header().revision() + 1;
  }
  if (rec.reason() == "restore") {
    // The record was advanced onto this cluster id after a restore (with a new
    // cluster token, before this auditor recorded anything on it): the history
    // below the advance came from the snapshot and was recorded under the old
    // id, so it starts at the advance rather than at the record's creation (which
    // would record that history again under this id, past a compaction that
    // reads as a gap). No grant was made on it before the advance; a restored
    // hold that expired in that moment is not recorded.
    return epoch->kvs(0).mod_revision();
  }
  return epoch->kvs(0).create_revision();
}

void Auditor::MaybeCompact(Clock::time_point* last) {
  if (Clock::now() - *last < options_.compaction_interval) return;
  *last = Clock::now();
  int64_t cursor, compacted;
  {
    std::lock_guard l(mu_);
    cursor = status_.cursor;
    compacted = status_.compacted_revision;
  }
  const int64_t target = cursor - options_.compaction_keep_revisions;
  if (target <= 0 || target <= compacted) return;
  pb::CompactionRequest c;
  c.set_revision(target);
  auto r = etcd::Await<pb::CompactionResponse>([&](etcd::Callback<pb::CompactionResponse> cb) {
    etcd_->Compact(c, etcd::DeadlineIn(options_.etcd_timeout), std::move(cb));
  });
  if (!r.ok() && r.status().code() != absl::StatusCode::kOutOfRange) {
    SetError(absl::StrCat("compaction at ", target, " failed: ", r.status().message()));
    return;
  }
  std::lock_guard l(mu_);
  status_.compacted_revision = target;
}

void Auditor::MaybePrune(Clock::time_point* due) {
  if (options_.retention <= std::chrono::milliseconds(0) || Clock::now() < *due) return;
  *due = Clock::now() + options_.prune_interval;
  auto pruned = store_->Prune(NowMs() - options_.retention.count(), options_.prune_batch);
  if (!pruned.ok()) {
    // Loud: a store that refuses deletions (a role without DELETE) would otherwise
    // grow unnoticed; last_error alone is cleared by the next recording.
    SetError(absl::StrCat("pruning the audit store (will retry): ", pruned.status().message()));
    if (Clock::now() - last_prune_warning_ >= options_.lag_warn_interval) {
      last_prune_warning_ = Clock::now();
      std::fprintf(stderr,
                   "holdfastd: AUDIT RETENTION: cannot delete events older than "
                   "audit.retention (will retry every minute): %s\n",
                   std::string(pruned.status().message()).c_str());
    }
    return;
  }
  std::lock_guard l(mu_);
  status_.pruned_events += pruned->events;
  // A full transaction: there may be more; the next goes on the next turn.
  if (pruned->events >= options_.prune_batch) *due = Clock::now();
}

void Auditor::Lead(int64_t lease) {
  pb::RangeRequest probe;
  probe.set_key(keyspace::AuditorKey());
  auto first = etcd_->RangeSync(probe, etcd::DeadlineIn(options_.etcd_timeout));
  if (!first.ok()) return;
  const uint64_t cluster_id = first->header().cluster_id();
  auto start = StartRevision(cluster_id);
  if (!start.ok()) {
    SetError(absl::StrCat("audit store: ", start.status().message()));
    return;
  }
  {
    std::lock_guard l(mu_);
    status_.leader = true;
    status_.cluster_id = cluster_id;
    status_.cursor = *start - 1;
    status_.last_seen_revision = *start - 1;  // not the last term's
    status_.last_error.clear();
  }

  std::shared_ptr<Inbox> inbox;
  int64_t wakeups_before = 0, responses_before = 0;  // counts of inboxes before it
  // The auditor's watch has a stream of its own, ended to pause it (below): etcd
  // 3.4 keeps, until its stream ends, a response it had queued for a watch that
  // was cancelled. A new stream goes to the client's current endpoint. Each watch
  // fills an inbox of its own.
  std::unique_ptr<etcd::WatchHub> hub;
  size_t hub_endpoint = 0;
  std::vector<mvccpb::Event> pending;  // whole revisions, not yet recorded
  auto watch = [&](int64_t from) {
    if (inbox) {
      std::lock_guard l(inbox->mu);
      wakeups_before += inbox->wakeups;
      responses_before += inbox->responses;
    }
    inbox = std::make_shared<Inbox>();
    inbox->taken = pending.size();
    hub = std::make_unique<etcd::WatchHub>(etcd_);
    hub_endpoint = etcd_->current_endpoint();
    etcd::WatchSpec spec;
    spec.key = std::string(keyspace::kRoot);
    spec.range_end = keyspace::PrefixEnd(keyspace::kRoot);
    spec.start_revision = from;
    // No previous values from etcd: it would read one per event, for every key
    // under the root; PrevValues gives deletions theirs (audit/prev_values.h).
    spec.prev_kv = false;
    // The auditor thread is woken only when it has something to do: the first
    // batch after it drained the inbox, a full batch, or an error. While it
    // lingers it sleeps until its deadline; a wake-up per watch response (two per
    // lock cycle at one caller) would only re-check the deadline, each one a
    // context switch taken from the lock calls on a small machine.
    hub->Watch(spec, [inbox, full = options_.max_batch_events,
                      bound = options_.max_buffered_events](
                         absl::StatusOr<etcd::WatchBatch> b) {
      std::lock_guard l(inbox->mu);
      if (b.ok() && !b->events.empty()) ++inbox->responses;
      if (inbox->closed) return;  // paused: the next watch starts at these
      bool wake = !inbox->error.ok() || inbox->batches.empty();
      if (!b.ok()) {
        inbox->error = b.status();
        wake = true;
      } else if (!b->events.empty()) {
        inbox->events += b->events.size();
        inbox->batches.push_back(std::move(b->events));
        wake = wake || inbox->events >= full;
        if (inbox->events + inbox->taken >= bound) {
          // Held in memory up to the bound; what etcd sends after it is dropped,
          // and the watch is ended (the auditor thread, woken now).
          inbox->full = true;
          inbox->closed = true;
          wake = true;
        }
      } else {
        wake = false;  // nothing new
      }
      if (wake) {
        ++inbox->wakeups;
        inbox->cv.notify_all();
      }
    });
  };
  watch(*start);
  // What the audit needs of live holds and closing sessions, as of the events filled.
  PrevValues prev;
  const PrevValues::Lookup lookup = [this](const std::string& key, int64_t revision)
      -> absl::StatusOr<std::optional<mvccpb::KeyValue>> {
    pb::RangeRequest r;
    r.set_key(key);
    r.set_revision(revision);
    auto got = etcd_->RangeSync(r, etcd::DeadlineIn(options_.etcd_timeout));
    if (!got.ok()) return got.status();
    if (got->kvs_size() == 0) return std::optional<mvccpb::KeyValue>();
    return std::optional<mvccpb::KeyValue>(got->kvs(0));
  };

  const auto renew_every = std::chrono::duration_cast<std::chrono::milliseconds>(options_.lease_ttl) / 3;
  auto last_renew = Clock::now();
  auto last_compaction = Clock::now();
  auto next_prune = Clock::now();  // a new term prunes at once
  auto last_lag_warning = Clock::now() - options_.lag_warn_interval;
  auto last_record = Clock::now() - options_.flush_interval;

  // The watch is paused from the first response after a record until the next
  // record (header comment, "Pausing").
  bool paused = false;
  bool record_failed = false;  // the last record (or its previous values) failed
  int64_t taken_through = 0;   // the highest revision taken out of an inbox
  // The newest revision of an event the watch brought (what the lag counts from,
  // but while the buffer is full; below).
  int64_t seen_events = *start - 1;
  auto last_full_warning = Clock::now() - options_.lag_warn_interval;
  while (!stop_) {
    absl::Status watch_error;
    {
      std::unique_lock l(inbox->mu);
      if (!paused) {
        inbox->cv.wait_for(l, std::chrono::milliseconds(200), [&] {
          return !inbox->batches.empty() || !inbox->error.ok();
        });
        // A response of etcd's catch-up of a watch behind holds at most 1,000
        // revisions, one pass per 100 ms. After one of half that, the watch
        // stays live: more is likely waiting, and a live watch gets it in
        // etcd's next passes, and then as it comes, without a record and a new
        // stream between each; a watch paused after every response could not
        // follow etcd beyond about 10,000 revisions a second.
        constexpr int64_t kStayLiveRevisions = 500;
        int64_t revisions = 0;
        if (!inbox->batches.empty()) {
          int64_t last = 0;
          for (const auto& e : inbox->batches.back()) {
            if (e.kv().mod_revision() != last) ++revisions;
            last = e.kv().mod_revision();
          }
        }
        const bool moved = etcd_->current_endpoint() != hub_endpoint;
        if (inbox->error.ok() && !inbox->full &&
            ((options_.flush_interval.count() > 0 && !inbox->batches.empty() &&
              revisions < kStayLiveRevisions && !record_failed) ||
             moved)) {
          // Pause: etcd sends each revision in a response of its own while the
          // watch is live (two per lock cycle at one caller, each a message
          // for etcd to send and for holdfastd to take in, on the cores the
          // lock calls need). Until the record, nothing is needed from it; the
          // watch started again from the cursor gets what came meanwhile as
          // one response (etcd's catch-up of a watch behind, every 100 ms).
          // With no flush interval the watch stays live: the trail follows
          // etcd as closely as it can. The client moved to another endpoint (a
          // member that answers nothing ends no stream): pause, so that the
          // watch starts again there.
          inbox->closed = true;
          paused = true;
          l.unlock();
          hub.reset();  // no callback runs after this
          l.lock();
        }
      }
      // Linger: one SQL transaction per flush_interval at most, unless a full
      // batch is waiting. Each commit rewrites the index pages it touched and
      // syncs; under load this takes ~24x fewer commits (docs/audit.md) for up to
      // flush_interval more lag.
      if (!inbox->batches.empty() && inbox->error.ok()) {
        inbox->cv.wait_until(l, last_record + options_.flush_interval, [&] {
          return stop_ || !inbox->error.ok() ||
                 pending.size() + inbox->events >= options_.max_batch_events;
        });
      }
      while (!inbox->batches.empty() && pending.size() < options_.max_batch_events) {
        auto& b = inbox->batches.front();
        if (!b.empty()) taken_through = std::max(taken_through, b.back().kv().mod_revision());
        inbox->events -= b.size();
        pending.insert(pending.end(), std::make_move_iterator(b.begin()),
                       std::make_move_iterator(b.end()));
        inbox->batches.pop_front();
      }
      inbox->taken = pending.size();
      if (inbox->batches.empty()) watch_error = inbox->error;
    }

    if (!pending.empty()) {
      int64_t cursor;
      {
        std::lock_guard l(mu_);
        cursor = status_.cursor;
        // Seen before the record is tried: one that fails may take the store's
        // whole busy timeout, and the lag should show meanwhile.
        status_.last_seen_revision =
            std::max(status_.last_seen_revision, pending.back().kv().mod_revision());
      }
      // A revision at or below the cursor is already recorded (a replay after a
      // reconnect, or etcd going backwards): never record it twice.
      std::erase_if(pending, [&](const mvccpb::Event& e) { return e.kv().mod_revision() <= cursor; });
    }
    bool filled = true;
    if (!pending.empty()) {
      if (auto s = prev.Fill(&pending, lookup); !s.ok()) {
        // Recording a deletion without its hold would lose its holder and token
        // for good: wait for etcd instead.
        SetError(absl::StrCat("reading a deleted key's previous value (will retry): ",
                              s.message()));
        filled = false;
        record_failed = true;
        if (!Sleep(std::chrono::milliseconds(500))) break;
      }
    }
    if (!pending.empty() && filled) {
      Classified c = Classify(cluster_id, pending, NowMs());
      auto s = store_->Record(cluster_id, c.last_revision, c.events, c.forces);
      if (IsCursorRegression(s)) {
        // Another auditor recorded past us: it leads now. (Any other refusal,
        // a file turned read-only say, is retried below like an outage.)
        SetError(absl::StrCat("audit store: ", s.message()));
        break;
      }
      if (!s.ok()) {
        SetError(absl::StrCat("recording revisions up to ", c.last_revision,
                              " failed (will retry): ", s.message()));
        if (Clock::now() - last_lag_warning >= options_.lag_warn_interval) {
          last_lag_warning = Clock::now();
          std::fprintf(stderr, "holdfastd: AUDIT BEHIND: cannot write the audit store: %s\n",
                       std::string(s.message()).c_str());
        }
        record_failed = true;
        if (!Sleep(std::chrono::milliseconds(500))) break;
      } else {
        if (c.malformed > 0) {
          std::fprintf(stderr,
                       "holdfastd: auditor: %d hold events up to revision %lld had no readable "
                       "record; recorded without holder/token\n",
                       c.malformed, static_cast<long long>(c.last_revision));
        }
        pending.clear();
        {
          std::lock_guard l(inbox->mu);
          inbox->taken = 0;
        }
        record_failed = false;
        last_record = Clock::now();
        std::lock_guard l(mu_);
        status_.cursor = c.last_revision;
        status_.recorded_events += static_cast<int64_t>(c.events.size());
        ++status_.store_commits;
        status_.last_error.clear();
      }
    }

    if (!watch_error.ok() && pending.empty()) {
      int64_t cursor;
      {
        std::lock_guard l(mu_);
        cursor = status_.cursor;
      }
      int64_t resume = cursor + 1;
      if (watch_error.code() == absl::StatusCode::kOutOfRange) {
        // The history from the cursor is gone: say exactly what was lost.
        // The error names the compact revision; without it, fall back to now.
        int64_t compacted = etcd::CompactRevisionOf(watch_error);
        if (compacted <= cursor) {
          auto now = etcd_->StatusSync(etcd::DeadlineIn(options_.etcd_timeout));
          compacted = now.ok() ? now->header().revision() : cursor + 1;
        }
        std::fprintf(stderr,
                     "holdfastd: AUDIT GAP: etcd compacted revisions %lld..%lld before they were "
                     "recorded (is etcd's auto-compaction on, or was it compacted by hand?); "
                     "their events are lost; auditing goes on from %lld\n",
                     static_cast<long long>(cursor + 1), static_cast<long long>(compacted - 1),
                     static_cast<long long>(compacted));
        auto s = store_->Record(cluster_id, compacted - 1, {}, {});
        if (!s.ok()) break;
        std::lock_guard l(mu_);
        status_.cursor = compacted - 1;
        ++status_.gaps;
        status_.last_error = absl::StrCat("audit gap: revisions ", cursor + 1, "..", compacted - 1,
                                          " were compacted before they were recorded");
        resume = compacted;
        prev.Clear();  // what was deleted in the gap is unknown
      }
      watch(resume);
      if (!Sleep(std::chrono::milliseconds(100))) break;
    }

    // A full buffer (the store down or not keeping up) ends the watch, before the
    // lag of this turn is published; it starts again once what it held is
    // recorded (below).
    if (!paused) {
      bool full;
      {
        std::lock_guard l(inbox->mu);
        full = inbox->full;
      }
      if (full) {
        paused = true;
        hub.reset();  // no callback runs after this
      }
    }

    // Recorded all that the paused watch sent: start it again after the cursor.
    // A record that failed starts it again too, after what it holds: while the
    // store is down the watch stays live, so the backlog shows (lag, AUDIT
    // BEHIND) as it grows, and arrives as it comes; until the buffer is full,
    // then the watch waits until the store has taken what the buffer holds.
    if (paused && (pending.empty() || record_failed)) {
      bool drained;
      {
        std::lock_guard l(inbox->mu);
        if (record_failed && !inbox->full) {
          // What is left of the paused watch's responses lies past what was
          // taken: the next watch brings it again.
          inbox->batches.clear();
          inbox->events = 0;
        }
        // A watch ended for a full buffer starts again once all it held is
        // recorded, not as soon as the auditor has taken it.
        drained = inbox->batches.empty() && (!inbox->full || pending.empty());
      }
      if (drained) {
        int64_t cursor;
        {
          std::lock_guard l(mu_);
          cursor = status_.cursor;
        }
        watch(std::max(cursor, taken_through) + 1);
        paused = false;
      }
    }

    // Backlog: events seen but not yet recorded.
    {
      int64_t seen = 0, wakeups = 0, responses = 0;
      size_t buffered = pending.size();
      bool full = false;
      {
        std::lock_guard l(inbox->mu);
        if (!inbox->batches.empty() && !inbox->batches.back().empty()) {
          seen = inbox->batches.back().back().kv().mod_revision();
        }
        if (!pending.empty()) seen = std::max(seen, pending.back().kv().mod_revision());
        wakeups = wakeups_before + inbox->wakeups;
        responses = responses_before + inbox->responses;
        buffered += inbox->events;
        full = inbox->full;
      }
      std::lock_guard l(mu_);
      seen_events = std::max({seen_events, seen, status_.cursor});
      // With the watch ended for a full buffer, etcd's newest revision that this
      // client has seen (its lock calls, sessions' renewals, the auditor's own
      // lease checks) stands for the newest event, so the lag keeps growing as it
      // does; only meanwhile: it may count writes outside holdfast's keys, which
      // no record would ever reach.
      status_.last_seen_revision =
          full ? std::max(seen_events, etcd_->last_revision()) : seen_events;
      status_.wakeups = wakeups;
      status_.watch_responses = responses;
      status_.buffered_events = static_cast<int64_t>(buffered);
      const int64_t lag = status_.last_seen_revision - status_.cursor;
      if (full && Clock::now() - last_full_warning >= options_.lag_warn_interval) {
        last_full_warning = Clock::now();
        std::fprintf(stderr,
                     "holdfastd: AUDIT BEHIND: %lld events held in memory "
                     "(audit.max_buffered_events); the watch waits until the store has "
                     "recorded them (%lld revisions behind)\n",
                     static_cast<long long>(buffered), static_cast<long long>(lag));
      }
      if (lag > options_.lag_warn_revisions &&
          Clock::now() - last_lag_warning >= options_.lag_warn_interval) {
        last_lag_warning = Clock::now();
        std::fprintf(stderr, "holdfastd: AUDIT BEHIND: %lld revisions seen but not yet recorded\n",
                     static_cast<long long>(lag));
      }
    }

    if (Clock::now() - last_renew >= renew_every) {
      last_renew = Clock::now();
      if (!StillLeader(lease, cluster_id)) break;
      // An epoch advance after a restore rewinds the stored cursor: start over
      // from it, so the restored cluster's new events are recorded.
      auto stored = store_->Cursor(cluster_id);
      int64_t mine;
      {
        std::lock_guard l(mu_);
        mine = status_.cursor;
      }
      if (stored.ok() && *stored && **stored < mine && pending.empty()) {
        std::fprintf(stderr,
                     "holdfastd: auditor: the audit cursor was rewound to %lld (an epoch "
                     "advance after a restore); resuming from there\n",
                     static_cast<long long>(**stored));
        break;
      }
    }
    MaybeCompact(&last_compaction);
    MaybePrune(&next_prune);
  }
  hub.reset();
}

}  // namespace holdfast::audit
