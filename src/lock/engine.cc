#include "lock/engine.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/spiffe.h"
#include "lock/keyspace.h"
#include "lock/txn_util.h"
#include "lock/records.pb.h"
#include "lock/queue.h"
#include "lock/snapshot.h"
#include "lock/token.h"

namespace holdfast::lock {

namespace pb = ::etcdserverpb;
using std::chrono::milliseconds;

absl::Status ValidateSessionRef(const std::string& ns, int64_t session) {
  if (auto s = keyspace::ValidateNamespaceName(ns); !s.ok()) return s;
  if (session <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("session id ", session, " is invalid"));
  }
  return absl::OkStatus();
}

namespace {

std::string FormatMs(int64_t ms) {
  if (ms % 3'600'000 == 0) return absl::StrCat(ms / 3'600'000, "h");
  if (ms % 60'000 == 0) return absl::StrCat(ms / 60'000, "m");
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, "s");
  return absl::StrCat(ms, "ms");
}

// The holds a release transaction creates for the waiters it hands the key to
// (the puts under the key's hold range; the release itself only deletes), and
// their class.
// The holds a release transaction puts: its hand-overs (hold key, record).
std::vector<std::pair<std::string, records::HoldRecord>> HandOverGrants(
    const pb::TxnRequest& txn, const std::string& ns, const std::string& key) {
  const std::string begin = keyspace::HoldRangeBegin(ns, key);
  std::vector<std::pair<std::string, records::HoldRecord>> out;
  for (const auto& op : txn.success()) {
    if (!op.has_request_put() || op.request_put().key().rfind(begin, 0) != 0) continue;
    records::HoldRecord rec;
    rec.ParseFromString(op.request_put().value());
    out.emplace_back(op.request_put().key(), std::move(rec));
  }
  return out;
}

void ReportRenewal(EngineObserver& observer, std::string_view ns,
                   const v1::KeepAliveResponse& answer,
                   std::chrono::steady_clock::duration round_trip) {
  RenewEnd end;
  end.ns = ns;
  end.session = answer.session_id();
  end.ttl = milliseconds(answer.ttl_ms());
  end.lost = answer.lost();
  end.etcd_unavailable = answer.etcd_unavailable();
  end.renewed = !end.lost && !end.etcd_unavailable && answer.ttl_ms() > 0;
  end.round_trip = round_trip;
  observer.OnRenewed(end);
}

// One answer for "not a member" and "no such namespace", so that a caller learns
// nothing of namespaces it may not use, not even whether they exist.
absl::Status NotUsable(const Caller& caller, const std::string& ns) {
  return absl::PermissionDeniedError(
      absl::StrCat(caller.identity, " may not use namespace \"", ns,
                   "\": it does not exist, or it does not list this identity as a member"));
}
}  // namespace

absl::Status CheckMember(const Caller& caller, const std::string& ns,
                         const google::protobuf::RepeatedPtrField<std::string>& members) {
  if (caller.admin || members.empty()) return absl::OkStatus();
  for (const auto& pattern : members) {
    if (spiffe::Matches(caller.identity, pattern)) return absl::OkStatus();
  }
  return NotUsable(caller, ns);
}

absl::Status NoSuchNamespace(const Caller& caller, const std::string& ns) {
  if (!caller.admin) return NotUsable(caller, ns);
  return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist"));
}

namespace {
absl::Status NotOwner(const Caller& caller, int64_t session) {
  return absl::PermissionDeniedError(absl::StrCat(
      "session ", session, " belongs to another identity; ", caller.identity,
      " may not use it"));
}
}  // namespace

absl::Status Engine::CheckOwner(const Caller& caller, int64_t session, const std::string& owner) {
  if (owner == caller.identity) return absl::OkStatus();
  return NotOwner(caller, session);
}

Engine::Engine(etcd::Client* etcd, EngineOptions options, EtcdHealth* health)
    : etcd_(etcd),
      options_(std::move(options)),
      health_(health),
      commits_(
          etcd, options_.group_commit,
          [this](int members) { observer().OnCommitBatch(members); },
          [this](RideStep step) { observer().OnRide(step); }),
      forced_(etcd) {}

absl::Status Engine::EtcdStatus() const {
  return health_ ? health_->status() : absl::OkStatus();
}

Deadline Engine::EtcdDeadline(Deadline d) const {
  return std::min(d, etcd::DeadlineIn(options_.etcd_timeout));
}

void Engine::Stop() {
  forced_.Stop();
  commits_.Stop();
  absl::WriterMutexLock l(&stop_mu_);  // after a timer's work running now
  stopped_ = true;
}

TimerQueue::TimerId Engine::After(std::chrono::steady_clock::duration d,
                                  std::function<void()> fn) {
  return etcd_->timers().ScheduleAfter(d, [this, fn = std::move(fn)] {
    absl::ReaderMutexLock l(&stop_mu_);
    if (!stopped_) fn();
  });
}

void Engine::ForgetHistory() {
  views_.Clear();
  local_waiters_.ForgetRecent();
}

void Engine::SetGrantBlock(std::string reason) {
  if (!reason.empty()) ForgetHistory();
  absl::MutexLock l(&block_mu_);
  block_reason_ = std::move(reason);
}

absl::Status Engine::GrantBlock() const {
  absl::MutexLock l(&block_mu_);
  if (block_reason_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(block_reason_);
}

absl::Status Engine::Bootstrap(Deadline d, int32_t epoch) {
  // Learn the cluster id from any answer, then create the record only if absent.
  auto status = etcd_->StatusSync(d);
  if (!status.ok()) return status.status();
  uint64_t cluster_id = status->header().cluster_id();
  records::EpochRecord rec;
  rec.set_epoch(epoch);
  rec.set_etcd_cluster_id(cluster_id);
  rec.set_advanced_at_unix_ms(NowUnixMs());
  rec.set_reason(epoch == 1 ? "init" : "restore");
  pb::TxnRequest txn;
  AddCompare(&txn, keyspace::EpochKey(), pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::EpochKey());
  put->set_value(rec.SerializeAsString());
  auto resp = etcd_->TxnSync(std::move(txn), d);
  return resp.status();
}

// --- sessions ---------------------------------------------------------------

void Engine::OpenSession(const Caller& caller, const v1::OpenSessionRequest& req, Deadline d,
                         Done<v1::OpenSessionResponse> done, std::function<bool()> caller_gone) {
  if (caller_gone && caller_gone()) {
    return done(absl::CancelledError("the call ended before the session was opened"));
  }
  OpenSessionAttempt(caller, req, /*reads_left=*/4, d, std::move(done));
}

void Engine::AbandonSession(const std::string& ns, int64_t session) {
  owners_.Forget(session);
  views_.Forget(session);
  observer().OnSessionClosed(ns, session);
  RevokeQuietly(session, /*attempts_left=*/3);
}

void Engine::RevokeQuietly(int64_t lease, int attempts_left) {
  pb::LeaseRevokeRequest r;
  r.set_id(lease);
  etcd_->LeaseRevoke(r, etcd::DeadlineIn(options_.etcd_timeout),
                     [this, lease, attempts_left](absl::StatusOr<pb::LeaseRevokeResponse> x) {
                       if (x.ok() || x.status().code() == absl::StatusCode::kNotFound ||
                           attempts_left <= 1) {
                         return;
                       }
                       After(std::chrono::seconds(1), [this, lease, attempts_left] {
                         RevokeQuietly(lease, attempts_left - 1);
                       });
                     });
}

void Engine::OpenSessionAttempt(const Caller& caller, const v1::OpenSessionRequest& req,
                                int reads_left, Deadline d, Done<v1::OpenSessionResponse> done) {
  if (auto s = keyspace::ValidateNamespaceName(req.namespace_()); !s.ok()) return done(s);
  const int64_t min_ms = options_.session_ttl_min.count(), max_ms = options_.session_ttl_max.count();
  if (req.ttl_ms() < min_ms || req.ttl_ms() > max_ms) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "session ttl ", req.ttl_ms(), "ms is outside [", FormatMs(min_ms), ", ",
        FormatMs(max_ms), "]")));
  }
  const int64_t ttl_s = (req.ttl_ms() + 999) / 1000;
  // The namespace, its policy and its quota first: a refused caller gets no lease.
  pb::TxnRequest read;
  read.add_success()->mutable_request_range()->set_key(keyspace::NamespaceKey(req.namespace_()));
  auto* slots = read.add_success()->mutable_request_range();
  slots->set_key(keyspace::SlotPrefix(req.namespace_()));
  slots->set_range_end(keyspace::PrefixEnd(keyspace::SlotPrefix(req.namespace_())));
  slots->set_count_only(true);
  etcd_->Txn(std::move(read), EtcdDeadline(d), [this, caller, req, ns = req.namespace_(), ttl_s,
                                               reads_left, d,
                                               done](absl::StatusOr<pb::TxnResponse> r) {
    if (!r.ok()) return done(r.status());
    const auto& ns_range = r->responses(0).response_range();
    if (ns_range.kvs_size() == 0) return done(NoSuchNamespace(caller, ns));
    records::NamespaceRecord rec;
    if (!rec.ParseFromString(ns_range.kvs(0).value())) {
      return done(absl::DataLossError("corrupt namespace record in etcd"));
    }
    if (auto s = CheckMember(caller, ns, rec.members()); !s.ok()) return done(s);
    if (!rec.draining_to().empty()) return done(Rehoming(ns, rec.draining_to(), rec.moved()));
    const int64_t quota = rec.held_lease_quota();
    if (quota > 0 && r->responses(1).response_range().count() >= quota) {
      return done(QuotaExhausted(ns, quota));
    }
    GrantSession(SessionOpen{caller, req, ttl_s, quota, ns_range.kvs(0).mod_revision(), reads_left},
                 d, done);
  });
}

absl::Status Engine::QuotaExhausted(const std::string& ns, int64_t quota) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "namespace \"", ns, "\" has ", quota, " live sessions, its held_lease_quota; close one, "
      "wait for one to expire, or ask an admin to raise the quota"));
}

absl::Status Engine::Rehoming(const std::string& ns, const std::string& to, bool moved) {
  if (moved) {
    return absl::UnavailableError(absl::StrCat(
        "namespace \"", ns, "\" has moved to etcd cluster \"", to,
        "\"; open a new session (retry after 1000 ms)"));
  }
  return absl::UnavailableError(absl::StrCat(
      "namespace \"", ns, "\" is being moved to etcd cluster \"", to,
      "\" (holdfast ns rehome): no new sessions or grants until it is; retry after 1000 ms"));
}

void Engine::GrantSession(SessionOpen open, Deadline d, Done<v1::OpenSessionResponse> done) {
  pb::LeaseGrantRequest grant;
  grant.set_ttl(open.ttl_s);
  etcd_->LeaseGrant(grant, EtcdDeadline(d), [this, open = std::move(open), d,
                                            done](absl::StatusOr<pb::LeaseGrantResponse> g) mutable {
    if (!g.ok()) return done(g.status());
    if (!g->error().empty()) return done(absl::UnavailableError("etcd: " + g->error()));
    // etcd raises a TTL below its minimum (1.5 election timeouts, in whole
    // seconds: 2 s with its defaults) to that minimum: the session lives as long
    // as the lease does, so that is its TTL, in the record (the classes' bounds
    // are checked against it) and in the answer.
    if (g->ttl() > open.ttl_s) open.ttl_s = g->ttl();
    CommitSession(open, g->id(), /*attempts_left=*/8, d, done);
  });
}

// Writes the session record on its lease; with a quota, also one free slot key,
// guarded by "this slot is free", so concurrent opens can never exceed the quota.
// Every commit is also guarded by "the namespace record is the one read", so a
// quota or policy changed since is never applied by an open that read the old
// one (the open reads it again). Live sessions without a slot below the quota
// (opened before the quota was set, or holding one above a quota lowered since)
// count against it too; while there are any, the commit is also guarded by "no
// session was opened since the count", so racing opens cannot each count the
// same number (the losers count again).
void Engine::CommitSession(const SessionOpen& open, int64_t lease, int attempts_left, Deadline d,
                           Done<v1::OpenSessionResponse> done) {
  const std::string& ns = open.req.namespace_();
  auto commit = [this, open, lease, attempts_left, d, done](std::optional<int64_t> slot,
                                                            int64_t no_session_since) {
    const std::string& ns = open.req.namespace_();
    records::SessionRecord rec;
    rec.set_identity(open.caller.identity);
    rec.set_ttl_ms(open.ttl_s * 1000);
    rec.set_opened_at_unix_ms(NowUnixMs());
    pb::TxnRequest txn;
    // The session record exists only inside the namespace as it was read.
    AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(open.ns_mod_revision);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::SessionKey(ns, lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    if (slot) {
      AddCompare(&txn, keyspace::SlotKey(ns, *slot), pb::Compare::CREATE, pb::Compare::EQUAL)
          ->set_create_revision(0);
      auto* take = txn.add_success()->mutable_request_put();
      take->set_key(keyspace::SlotKey(ns, *slot));
      take->set_value(absl::StrCat(lease));
      take->set_lease(lease);
    }
    if (no_session_since > 0) {
      auto* c = AddCompare(&txn, keyspace::SessionPrefix(ns), pb::Compare::CREATE,
                           pb::Compare::LESS);
      c->set_range_end(keyspace::PrefixEnd(keyspace::SessionPrefix(ns)));
      c->set_create_revision(no_session_since + 1);
    }
    auto* probe = txn.add_failure()->mutable_request_range();
    probe->set_key(keyspace::NamespaceKey(ns));
    probe->set_keys_only(true);
    etcd_->Txn(std::move(txn), EtcdDeadline(d), [this, open, lease, attempts_left, d, slot,
                                                 done](absl::StatusOr<pb::TxnResponse> t) {
      const std::string& ns = open.req.namespace_();
      if (!t.ok()) {
        RevokeQuietly(lease);  // best effort; the lease expires by itself otherwise
        return done(t.status());
      }
      if (!t->succeeded()) {
        const auto& now = t->responses(0).response_range();
        if (now.kvs_size() == 0) {
          RevokeQuietly(lease);
          return done(NoSuchNamespace(open.caller, ns));
        }
        if (now.kvs(0).mod_revision() != open.ns_mod_revision) {
          // Its quota, policy or home changed: start again from the new record.
          RevokeQuietly(lease);
          if (open.reads_left > 1) {
            return OpenSessionAttempt(open.caller, open.req, open.reads_left - 1, d, done);
          }
          return done(absl::AbortedError(absl::StrCat(
              "namespace \"", ns, "\" kept changing while the session was opened; try again")));
        }
        if (attempts_left > 1) {  // another open took that slot, or counted first: again
          return CommitSession(open, lease, attempts_left - 1, d, done);
        }
        RevokeQuietly(lease);
        return done(absl::AbortedError("too many concurrent session opens; try again"));
      }
      owners_.Remember(lease, ns, open.caller.identity);
      v1::OpenSessionResponse out;
      out.set_session_id(lease);
      out.set_ttl_ms(open.ttl_s * 1000);
      out.set_opened_revision(t->header().revision());
      observer().OnSessionOpened(ns, lease, milliseconds(open.ttl_s * 1000));
      done(std::move(out));
    });
  };
  const int64_t quota = open.quota;
  if (quota <= 0) return commit(std::nullopt, 0);
  PickSlot(ns, quota, lease, d,
           [commit](int64_t slot, int64_t no_session_since) { commit(slot, no_session_since); },
           std::move(done));
}

namespace {

// The slots `taken` shows free, one of them at random: `taken` lists the taken
// slot keys from index `lo` on, below `end`, in index order, cut short when
// more(). It shows [lo, end) whole, or, cut short, [lo, its last index]; the
// first index it does not show comes back in `*shown_end`. A random one rather
// than the first: opens racing for a nearly used-up quota then rarely pick the
// same slot (the first free one after a run of taken ones would draw them all).
// Keys that are not holdfast's slot keys are stepped over.
std::optional<int64_t> RandomFreeSlot(const pb::RangeResponse& taken, const std::string& ns,
                                      int64_t lo, int64_t end, int64_t* shown_end) {
  std::vector<int64_t> listed;
  for (const auto& kv : taken.kvs()) {
    auto index = keyspace::ParseSlotKey(kv.key(), ns);
    if (!index || *index < lo || *index >= end || kv.key() != keyspace::SlotKey(ns, *index)) {
      continue;
    }
    listed.push_back(*index);
  }
  std::sort(listed.begin(), listed.end());
  listed.erase(std::unique(listed.begin(), listed.end()), listed.end());
  *shown_end = !taken.more() ? end : listed.empty() ? lo : listed.back() + 1;
  const int64_t free = *shown_end - lo - static_cast<int64_t>(listed.size());
  if (free <= 0) return std::nullopt;
  // The rank-th free index: step over the taken ones at or below it.
  int64_t slot = lo + absl::Uniform<int64_t>(absl::BitGen(), 0, free);
  for (int64_t index : listed) {
    if (index > slot) break;
    ++slot;
  }
  return slot;
}

}  // namespace

// A free slot of a namespace with `quota`: one read of the slots taken below the
// quota and of the live sessions, both counted (which costs etcd the keys' index,
// never their values), with a window of 256 taken slots from a random index. The
// slot is a random free one of those the window shows. Only when it shows none
// (a quota nearly used up) do more reads follow, pages of taken slots on from the
// window and round from 0. So an open's reads stay small at any number of live
// sessions: one read of every slot key would pass the client's 64 MiB receive
// limit near 545,000 of them.
void Engine::PickSlot(const std::string& ns, int64_t quota, int64_t lease, Deadline d,
                      std::function<void(int64_t, int64_t)> commit,
                      Done<v1::OpenSessionResponse> done) {
  constexpr int64_t kWindow = 256;
  const int64_t from = absl::Uniform<int64_t>(absl::BitGen(), 0, quota);
  pb::TxnRequest read;
  auto* slotted = read.add_success()->mutable_request_range();
  slotted->set_key(keyspace::SlotKey(ns, 0));
  slotted->set_range_end(keyspace::SlotKey(ns, quota));
  slotted->set_count_only(true);
  auto* sessions = read.add_success()->mutable_request_range();
  sessions->set_key(keyspace::SessionPrefix(ns));
  sessions->set_range_end(keyspace::PrefixEnd(keyspace::SessionPrefix(ns)));
  sessions->set_count_only(true);
  auto* window = read.add_success()->mutable_request_range();
  window->set_key(keyspace::SlotKey(ns, from));
  window->set_range_end(keyspace::SlotKey(ns, quota));
  window->set_keys_only(true);
  window->set_limit(kWindow);
  etcd_->Txn(std::move(read), EtcdDeadline(d), [this, ns, lease, quota, d, from,
                                                commit = std::move(commit),
                                                done](absl::StatusOr<pb::TxnResponse> t) {
    if (!t.ok()) {
      RevokeQuietly(lease);
      return done(t.status());
    }
    // This open's own lease holds no session key yet.
    const int64_t slotted = t->responses(0).response_range().count();
    const int64_t live = t->responses(1).response_range().count();
    if (live >= quota || slotted >= quota) {
      RevokeQuietly(lease);
      return done(QuotaExhausted(ns, quota));
    }
    // The live sessions the slot compares account for: the others (opened
    // before the quota, or on a slot above one lowered since) are counted, and
    // the commit is then guarded by "no session opened since this read".
    const int64_t no_session_since = live > slotted ? t->header().revision() : 0;
    const auto& taken = t->responses(2).response_range();
    int64_t shown_end = from;
    if (auto slot = RandomFreeSlot(taken, ns, from, quota, &shown_end)) {
      return commit(*slot, no_session_since);
    }
    const std::string next = taken.kvs_size() > 0
                                 ? taken.kvs(taken.kvs_size() - 1).key() + '\0'
                                 : keyspace::SlotKey(ns, quota);
    ScanForSlot(ns, quota, lease, d, next, shown_end, from, /*round=*/false, no_session_since,
                commit, done);
  });
}

// Pages of the taken slots, from the key `start` (index `lo`) on to the quota,
// then round from 0 to `from` (where the window began), until a page shows a
// free one. Each page is read as it is then: a slot freed meanwhile may be
// found or not, and the commit's compares decide. Past `from` with none found,
// the quota is taken.
void Engine::ScanForSlot(const std::string& ns, int64_t quota, int64_t lease, Deadline d,
                         std::string start, int64_t lo, int64_t from, bool round,
                         int64_t no_session_since,
                         std::function<void(int64_t, int64_t)> commit,
                         Done<v1::OpenSessionResponse> done) {
  constexpr int64_t kPage = 10'000;
  const int64_t end = round ? from : quota;
  const std::string end_key = keyspace::SlotKey(ns, end);
  if (lo >= end || start >= end_key) {
    if (!round && from > 0) {
      return ScanForSlot(ns, quota, lease, d, keyspace::SlotKey(ns, 0), 0, from,
                         /*round=*/true, no_session_since, commit, done);
    }
    RevokeQuietly(lease);
    return done(QuotaExhausted(ns, quota));
  }
  pb::RangeRequest r;
  r.set_key(start);
  r.set_range_end(end_key);
  r.set_keys_only(true);
  r.set_limit(kPage);
  etcd_->Range(r, EtcdDeadline(d), [this, ns, quota, lease, d, lo, from, round, end, end_key,
                                     no_session_since, commit = std::move(commit),
                                     done](absl::StatusOr<pb::RangeResponse> page) {
    if (!page.ok()) {
      RevokeQuietly(lease);
      return done(page.status());
    }
    int64_t shown_end = lo;
    if (auto slot = RandomFreeSlot(*page, ns, lo, end, &shown_end)) {
      return commit(*slot, no_session_since);
    }
    // On with the next page, or (none left) round from 0, or none is free.
    const std::string next = page->more() && page->kvs_size() > 0
                                 ? page->kvs(page->kvs_size() - 1).key() + '\0'
                                 : end_key;
    ScanForSlot(ns, quota, lease, d, next, page->more() ? shown_end : end, from, round,
                no_session_since, commit, done);
  });
}

bool Engine::IsKnownOwnSession(const Caller& caller, const std::string& ns, int64_t session) {
  // Seen here in this namespace (opened here, most often). A session that ended
  // since is told so by what follows: its renewal finds the lease gone.
  auto owner = owners_.IsOwner(session, ns, caller.identity);
  return owner && *owner;
}

void Engine::AnswerIfMember(const Caller& caller, const std::string& ns, absl::Status answer,
                            Deadline d, std::function<void(absl::Status)> done) {
  if (caller.admin) return done(std::move(answer));
  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey(ns));
  etcd_->Range(r, EtcdDeadline(d), [caller, ns, answer = std::move(answer),
                                     done = std::move(done)](absl::StatusOr<pb::RangeResponse> resp) {
    if (!resp.ok()) return done(resp.status());
    if (resp->kvs_size() == 0) return done(NoSuchNamespace(caller, ns));
    records::NamespaceRecord rec;
    if (!rec.ParseFromString(resp->kvs(0).value())) {
      return done(absl::DataLossError("corrupt namespace record in etcd"));
    }
    if (auto s = CheckMember(caller, ns, rec.members()); !s.ok()) return done(s);
    done(answer);
  });
}

void Engine::VerifySession(const Caller& caller, const std::string& ns, int64_t session,
                           Deadline d, Done<bool> done) {
  if (auto s = ValidateSessionRef(ns, session); !s.ok()) return done(s);
  if (IsKnownOwnSession(caller, ns, session)) return done(true);
  pb::RangeRequest r;
  r.set_key(keyspace::SessionKey(ns, session));
  etcd_->Range(r, EtcdDeadline(d), [this, caller, ns, session, d,
                                     done](absl::StatusOr<pb::RangeResponse> resp) {
    if (!resp.ok()) return done(resp.status());
    auto refuse = [&](absl::Status why) {
      AnswerIfMember(caller, ns, std::move(why), d, [done](absl::Status s) { done(s); });
    };
    if (resp->kvs_size() == 0) {
      return refuse(absl::NotFoundError(
          absl::StrCat("session ", session, " not found in namespace \"", ns,
                       "\" (it expired or was closed)")));
    }
    records::SessionRecord rec;
    if (!rec.ParseFromString(resp->kvs(0).value())) {
      return done(absl::DataLossError("corrupt session record in etcd"));
    }
    owners_.Remember(session, ns, rec.identity());
    if (auto s = CheckOwner(caller, session, rec.identity()); !s.ok()) return refuse(s);
    done(true);
  });
}

void Engine::Renew(const v1::KeepAliveRequest& req, Deadline d, Done<v1::KeepAliveResponse> done) {
  v1::KeepAliveResponse base;
  base.set_session_id(req.session_id());
  base.set_sequence(req.sequence());
  if (auto health = EtcdStatus(); !health.ok()) {
    // Say so at once: a renewal cannot be confirmed without a quorum.
    base.set_etcd_unavailable(true);
    base.set_reason(std::string(health.message()));
    ReportRenewal(observer(), req.namespace_(), base, {});
    return done(std::move(base));
  }
  RenewAttempt(req, d, /*again=*/false, std::chrono::steady_clock::now(), std::move(base),
               std::move(done));
}

// One renewal over the client's keepalive stream. A renewal that failed on a
// member the etcd client then moved off (silent or gone: etcd/client.h) is sent
// once more, on the next member, when the caller's deadline leaves time for it,
// so one member cut off costs the holder a late answer, not an "etcd
// unavailable". Without a move (no quorum) the failure is answered at once.
void Engine::RenewAttempt(const v1::KeepAliveRequest& req, Deadline d, bool again,
                          std::chrono::steady_clock::time_point started,
                          v1::KeepAliveResponse base, Done<v1::KeepAliveResponse> done) {
  const size_t asked = etcd_->PickEndpoint().second;
  etcd_->KeepAlive(req.session_id(), std::min(EtcdDeadline(d), etcd::DeadlineIn(options_.renew_timeout)),
                   [this, req, d, again, asked, ns = req.namespace_(), started, base,
                    done](absl::StatusOr<pb::LeaseKeepAliveResponse> r) mutable {
                     const auto code = r.status().code();
                     if (!r.ok() && !again && etcd_->PickEndpoint().second != asked &&
                         (code == absl::StatusCode::kDeadlineExceeded ||
                          code == absl::StatusCode::kUnavailable) &&
                         EtcdDeadline(d) - std::chrono::system_clock::now() >=
                             options_.renew_timeout / 2) {
                       return RenewAttempt(req, d, /*again=*/true, started, std::move(base),
                                           std::move(done));
                     }
                     if (!r.ok()) {
                       bool gone = r.status().code() == absl::StatusCode::kNotFound;
                       base.set_lost(gone);
                       base.set_etcd_unavailable(!gone);
                       base.set_reason(std::string(r.status().message()));
                     } else if (r->ttl() <= 0) {
                       base.set_lost(true);
                       base.set_reason("session expired: its etcd lease no longer exists");
                     } else {
                       base.set_ttl_ms(r->ttl() * 1000);
                       for (auto& e : forced_.For(ns, req.session_id())) {
                         *base.add_ended() = std::move(e);
                       }
                     }
                     if (base.lost()) owners_.Forget(req.session_id());
                     ReportRenewal(observer(), ns, base, std::chrono::steady_clock::now() - started);
                     done(std::move(base));
                   });
}

// Marks the session record `closing` (so the auditor records the holds the
// revocation ends as released, not expired), then revokes its lease: the session,
// its holds, waiters and quota slot go in one revision. A mark that fails does not
// stop the revoke (its holds are then recorded as expired). Closing a session that
// is already gone succeeds.
void Engine::CloseSession(const Caller& caller, const v1::CloseSessionRequest& req, Deadline d,
                          Done<v1::CloseSessionResponse> done) {
  const std::string ns = req.namespace_();
  const int64_t lease = req.session_id();
  if (auto s = ValidateSessionRef(ns, lease); !s.ok()) return done(s);
  pb::RangeRequest r;
  r.set_key(keyspace::SessionKey(ns, lease));
  etcd_->Range(r, EtcdDeadline(d), [this, caller, ns, lease, d,
                                     done](absl::StatusOr<pb::RangeResponse> resp) {
    if (!resp.ok()) return done(resp.status());
    // A session gone, or another identity's: told as such only to a caller who
    // may use the namespace (AnswerIfMember).
    auto answer = [done](absl::Status s) {
      if (!s.ok()) return done(s);
      done(v1::CloseSessionResponse());  // already gone
    };
    if (resp->kvs_size() == 0) return AnswerIfMember(caller, ns, absl::OkStatus(), d, answer);
    records::SessionRecord rec;
    if (!rec.ParseFromString(resp->kvs(0).value())) {
      return done(absl::DataLossError("corrupt session record in etcd"));
    }
    if (auto s = CheckOwner(caller, lease, rec.identity()); !s.ok()) {
      return AnswerIfMember(caller, ns, s, d, answer);
    }
    auto revoke = [this, ns, lease, d, done] {
      views_.Forget(lease);
      pb::LeaseRevokeRequest rr;
      rr.set_id(lease);
      etcd_->LeaseRevoke(rr, EtcdDeadline(d), [this, ns, lease,
                                               done](absl::StatusOr<pb::LeaseRevokeResponse> x) {
        if (!x.ok() && x.status().code() != absl::StatusCode::kNotFound) return done(x.status());
        owners_.Forget(lease);
        observer().OnSessionClosed(ns, lease);
        done(v1::CloseSessionResponse());
      });
    };
    if (rec.closing()) return revoke();  // a retried close
    rec.set_closing(true);
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::SessionKey(ns, lease), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(resp->kvs(0).mod_revision());
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::SessionKey(ns, lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(lease);
    // Whatever the mark's outcome, revoke: the lease may be expiring right now,
    // and the mark only tells the audit trail that the holds ended with a close
    // rather than by expiry. A mark etcd refused (past its space quota etcd
    // refuses every put, but not a revoke, which frees space) or did not answer
    // must not keep the session's holds for its whole TTL; etcd unreachable
    // fails the revoke too, and the call says so.
    etcd_->Txn(std::move(txn), EtcdDeadline(d),
               [revoke](absl::StatusOr<pb::TxnResponse>) { revoke(); });
  });
}

// --- release, check, describe -----------------------------------------------

void Engine::Release(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
                     Done<v1::ReleaseResponse> done) {
  if (auto s = ValidateSessionRef(req.namespace_(), req.session_id()); !s.ok()) return done(s);
  if (auto s = keyspace::ValidateLockKey(req.lock_key()); !s.ok()) return done(s);
  if (req.token() <= 0) {
    return done(absl::InvalidArgumentError(absl::StrCat("token ", req.token(), " is invalid")));
  }
  // Only the session's owner may release its holds.
  if (IsKnownOwnSession(caller, req.namespace_(), req.session_id())) {
    return ReleaseAttempt(caller, req, d, /*attempts_left=*/5, std::move(done));
  }
  VerifySession(caller, req.namespace_(), req.session_id(), d,
                [this, caller, req, d, done](absl::StatusOr<bool> ok) {
                  if (!ok.ok() && ok.status().code() != absl::StatusCode::kNotFound) {
                    return done(ok.status());
                  }
                  // A session that is gone holds nothing: the release explains.
                  ReleaseAttempt(caller, req, d, /*attempts_left=*/5, done);
                });
}

// Release, in at most a few transactions:
//  1. the fast path: delete the hold if it is the token's and no waiter is queued;
//     or, when this replica's view of the key (lock/view_cache.h) shows waiters to
//     hand the key to, the transaction of 2 planned on that view, guarded also by
//     "the namespace record and the classes unchanged since the view's read";
//  2. otherwise, with the else branch's snapshot, one transaction that deletes the
//     hold and hands the key to the head of the queue (the head alone, or the run
//     of shared waiters at the head) in the same commit, so the new holders'
//     grant revision is the release's revision (no thundering herd, one commit per
//     transfer). Its compares (the token's hold, the epoch, no new hold, each
//     granted waiter still queued, the namespace record and the deciding class
//     as planned) make a double grant impossible; if they fail, the next attempt
//     decides on the new else branch. A waiter the deciding class or the
//     namespace's members would now refuse is not handed the key.
// A release planned on a view never removes dead waiters (their records may be
// stale there) and hands the key only to waiters the view's read saw, so it grants
// exactly what the same plan on a fresh read would.
void Engine::ReleaseAttempt(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
                            int attempts_left, Done<v1::ReleaseResponse> done) {
  ReleasePlan plan;
  plan.now_ms = NowUnixMs();
  plan.views_generation = views_.Generation();
  if (PlanOnViews(req, &plan)) {
    return ReleaseTxn(caller, req, d, attempts_left, std::move(plan), done);
  }
  ReleaseTxn(caller, req, d, attempts_left, std::nullopt, std::move(done));
}

bool Engine::PlanOnViews(const v1::ReleaseRequest& req, ReleasePlan* plan) {
  const std::string& ns = req.namespace_();
  auto kv = views_.Key(ns, req.lock_key());
  if (!kv) return false;
  auto nsv = views_.Namespace(ns);
  auto epoch = epochs_.Get();
  if (!nsv || !epoch || !nsv->record.draining_to().empty() || nsv->record.moved()) return false;
  const int64_t session = req.session_id();
  const int64_t rev = token::RevisionOf(req.token());
  if (std::none_of(kv->holds.begin(), kv->holds.end(), [&](const HoldEntry& h) {
        return h.lease == session && h.create_revision == rev;
      })) {
    return false;
  }
  KeySnapshot& s = plan->snap;
  s.revision = kv->holds_revision;
  s.cluster_id = nsv->cluster_id;
  s.namespace_exists = true;
  s.ns_record = nsv->record;
  s.ns_mod_revision = nsv->mod_revision;
  s.epoch = epoch;
  s.classes = nsv->classes;
  s.holds = std::move(kv->holds);  // the plan's snapshot takes the view over, not a copy
  s.waiters = std::move(kv->waiters);
  // A view read from another cluster than the one answering now (etcd restored
  // under a new cluster id, and this replica's views not read since) could pass
  // every compare of a hand-over on the restored keys: the read path's header
  // decides instead. (A hand-over that lands on another cluster all the same is
  // refused by its waiter after the commit: AcquireOp::HandedOver.)
  if (!GrantBlock().ok() || nsv->cluster_id != etcd_->last_cluster_id() ||
      kv->cluster_id != nsv->cluster_id || !CheckEpoch(epoch, nsv->cluster_id).ok() ||
      ResolveClass(s.classes, req.lock_key()) == nullptr) {
    return false;
  }
  auto handover = queue::PlanHandOver(s, session, plan->now_ms);
  if (handover.grant.empty() || !handover.dead.empty() || !handover.stray.empty()) return false;
  for (const WaiterEntry* w : handover.grant) {
    if (w->create_revision > kv->waiters_revision) return false;  // maybe not the head
  }
  plan->classes_revision = nsv->classes_revision;
  plan->key.holds_revision = kv->holds_revision;
  plan->key.waiters_revision = kv->waiters_revision;
  return true;
}

void Engine::ReleaseTxn(const Caller& caller, const v1::ReleaseRequest& req, Deadline d,
                        int attempts_left,
                        std::optional<ReleasePlan> plan, Done<v1::ReleaseResponse> done) {
  const std::string ns = req.namespace_(), key = req.lock_key();
  const int64_t session = req.session_id(), tok = req.token();
  const std::string hold_key = keyspace::HoldKey(ns, key, session);
  const KeySnapshot* snap = plan ? &plan->snap : nullptr;
  const uint64_t views_gen = plan ? plan->views_generation : views_.Generation();
  const uint64_t waiters_gen = local_waiters_.Generation();  // before the send
  pb::TxnRequest txn;
  AddCompare(&txn, hold_key, pb::Compare::CREATE, pb::Compare::EQUAL)
      ->set_create_revision(token::RevisionOf(tok));
  // The hold is the token's: its create revision, and its epoch. A restore can
  // reuse revisions, but every grant of the current epoch came after the epoch
  // record was written, so for a token of the current epoch naming a later
  // revision, the create revision is proof enough while the record is unchanged.
  // Any other token (a hold granted before an advance keeps its epoch and can be
  // released, ARCHITECTURE §6; or a token never issued) is proven by the very
  // version of the hold that a fresh read showed to carry the token's epoch.
  // Without such a read the compare fails, and the failure branch's read decides.
  // The epoch record is compared either way: a hand-over grants at the current one.
  std::optional<EpochEntry> epoch = snap ? snap->epoch : epochs_.Get();
  // (A record that is missing compares as mod revision 0: the release needs none,
  // and a hand-over grants nothing without one.)
  AddCompare(&txn, keyspace::EpochKey(), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(epoch ? epoch->mod_revision : 0);
  if (!epoch || epoch->record.epoch() != token::EpochOf(tok) ||
      token::RevisionOf(tok) <= epoch->mod_revision) {
    int64_t proven = -1;
    if (snap != nullptr) {
      for (const HoldEntry& h : snap->holds) {
        if (h.lease == session && h.create_revision == token::RevisionOf(tok) &&
            h.record.epoch() == token::EpochOf(tok) && h.mod_revision > 0) {
          proven = h.mod_revision;
        }
      }
    }
    AddCompare(&txn, hold_key, pb::Compare::MOD, pb::Compare::EQUAL)->set_mod_revision(proven);
  }
  txn.add_success()->mutable_request_delete_range()->set_key(hold_key);
  txn.add_success()->mutable_request_delete_range()->set_key(keyspace::ClaimKey(ns, key, session));
  AddAuditMark(&txn);  // a release, not an expiry
  HandOverResult handover;
  if (!plan) {
    auto* no_waiters = AddCompare(&txn, keyspace::WaitRangeBegin(ns, key), pb::Compare::CREATE,
                                  pb::Compare::EQUAL);
    no_waiters->set_range_end(keyspace::WaitRangeEnd(ns, key));
    no_waiters->set_create_revision(0);
  } else {
    if (plan->classes_revision > 0) {
      // Planned on views: what a fresh read would have shown of the namespace.
      AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
          ->set_mod_revision(snap->ns_mod_revision);
      AddNoClassChangedSince(&txn, ns, plan->classes_revision);
    }
    // A namespace being rehomed hands nothing over: its holds must drain.
    handover = AddHandOver(*snap, ns, key, session,
                           GrantBlock().ok() && snap->ns_record.draining_to().empty(),
                           /*on_read=*/plan->classes_revision == 0, plan->now_ms, &txn);
  }
  AddSnapshotReads(ns, session, key, txn.mutable_failure());
  auto handed = HandOverGrants(txn, ns, key);
  // What the release's commit leaves of the key, from the plan's snapshot (which
  // nothing needs after this).
  std::optional<KeyView> base;
  if (plan && handover.guarded) {
    KeySnapshot& planned = plan->snap;
    const bool on_views = plan->classes_revision > 0;
    base = KeyView{on_views ? plan->key.holds_revision : planned.revision,
                   on_views ? plan->key.waiters_revision : planned.revision,
                   std::move(planned.holds), std::move(planned.waiters), planned.cluster_id};
  }
  commits_.Txn({ns, key, session, /*release=*/true}, std::move(txn), EtcdDeadline(d),
             [this, caller, req, d, attempts_left, ns, key, session, tok, views_gen, waiters_gen,
              handed = std::move(handed),
              handover = std::move(handover), base = std::move(base),
              done](absl::StatusOr<pb::TxnResponse> t) {
               if (!t.ok()) return done(t.status());
               if (t->succeeded()) {
                 const int64_t rev = t->header().revision();
                 const int handed_over = static_cast<int>(handed.size());
                 for (const auto& [hold_key, rec] : handed) {
                   local_waiters_.HandedOver(hold_key, rev, rec, t->header().cluster_id(),
                                             waiters_gen);
                 }
                 if (base) {
                   std::vector<HoldEntry> granted;
                   for (size_t i = 0; i < handed.size() && i < handover.granted.size(); ++i) {
                     granted.push_back(HoldEntry{handover.granted[i], rev, handed[i].second});
                   }
                   views_.Released(ns, key, *base, session, handover.gone, granted, rev,
                                   t->header().cluster_id(), views_gen);
                 } else {
                   views_.ForgetKey(ns, key);
                 }
                 if (handed_over > 0) {
                   observer().OnGranted(ns, handed.front().second.class_id(),
                                        GrantPath::kHandOver, handed_over);
                 }
                 observer().OnReleased(ns, handed_over);
                 return done(v1::ReleaseResponse());
               }
               auto snap = ParseSnapshot(t->header(), t->responses());
               if (!snap.ok()) return done(snap.status());
               epochs_.Observe(snap->epoch);
               views_.ObserveKey(ns, key, *snap, views_gen);
               if (!snap->namespace_exists) return done(NoSuchNamespace(caller, ns));
               std::optional<int64_t> current_token;  // the session's hold of the key
               for (const auto& h : snap->holds) {
                 if (h.lease != session) continue;
                 auto current = token::Make(h.record.epoch(), h.create_revision);
                 current_token = current.ok() ? *current : 0;
               }
               if (current_token == tok) {
                 // Still ours: waiters are queued, or the views, the epoch cache or
                 // the queue changed under us. Decide on this snapshot.
                 if (attempts_left <= 1) {
                   return done(absl::AbortedError(absl::StrCat(
                       "release of \"", key, "\" kept racing with the queue; try again")));
                 }
                 ReleasePlan next;
                 next.snap = std::move(*snap);
                 next.now_ms = NowUnixMs();
                 next.views_generation = views_gen;
                 return ReleaseTxn(caller, req, d, attempts_left - 1, std::move(next), done);
               }
               // Why nothing was released is told to members only (the session may
               // be gone: then nothing showed the caller to be one).
               if (auto s = CheckMember(caller, ns, snap->ns_record.members()); !s.ok()) {
                 return done(s);
               }
               if (current_token) {
                 return done(absl::FailedPreconditionError(absl::StrCat(
                     "stale token ", tok, ": the current hold of \"", key, "\" by session ",
                     session, " has token ", *current_token, "; nothing released")));
               }
               done(absl::FailedPreconditionError(
                   absl::StrCat("stale token ", tok, ": session ", session,
                                " holds no lock on \"", key, "\"; nothing released")));
             });
}

Engine::HandOverResult Engine::AddHandOver(const KeySnapshot& snap, const std::string& ns,
                                           const std::string& key, int64_t releasing,
                                           bool grants_allowed, bool on_read, int64_t now_ms,
                                           pb::TxnRequest* txn) {
  HandOverResult out;
  auto plan = queue::PlanHandOver(snap, releasing, now_ms);
  if (on_read) {
    // Each guarded by its record as read: a retried acquire may have taken the
    // waiter over in place with a later deadline since (then it is not dead, and
    // the compare failing sends the release to a re-read).
    for (const WaiterEntry* dead : plan.dead) {
      RemoveDeadWaiter(snap, ns, key, *dead, txn);
      out.gone.push_back(dead->lease);
    }
    // Guarded: a waiter the session put after the read, once it no longer held
    // the key, is a real one (the compare failing sends the release to a re-read).
    for (const WaiterEntry* stray : plan.stray) {
      const std::string wait_key = keyspace::WaitKey(ns, key, stray->lease);
      AddCompare(txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
          ->set_create_revision(stray->create_revision);
      txn->add_success()->mutable_request_delete_range()->set_key(wait_key);
      out.gone.push_back(stray->lease);
    }
  }
  const ClassEntry* cls = ResolveClass(snap.classes, key);
  // Grants need a usable epoch for this cluster and a class; the release itself
  // never does.
  if (!grants_allowed || cls == nullptr || !CheckEpoch(snap.epoch, snap.cluster_id).ok()) {
    return out;
  }
  if (plan.grant.empty()) return out;  // a plain release: nothing else to guard
  // A class of mode X now decides the key (one created or changed while shared
  // waiters queued under another): a shared waiter is not handed it, alone or in
  // a run. The release goes alone; the waiters decide on their own read, where a
  // shared ask of an exclusive class is refused and leaves the queue.
  if (cls->record.mode() != v1::LOCK_MODE_SHARED &&
      std::any_of(plan.grant.begin(), plan.grant.end(),
                  [](const WaiterEntry* w) { return w->record.shared(); })) {
    return out;
  }
  // The same for the class's TTL bounds: a waiter whose session's TTL is outside
  // them is not handed the key; on its own read it is refused as a new ask would
  // be ("session ttl ... is outside the bounds of class") and leaves the queue.
  // (A waiter record without the TTL, put by an older holdfastd, is not checked.)
  const int64_t ttl_min = cls->record.ttl_min_ms(), ttl_max = cls->record.ttl_max_ms();
  if (std::any_of(plan.grant.begin(), plan.grant.end(), [&](const WaiterEntry* w) {
        const int64_t ttl = w->record.session_ttl_ms();
        return ttl != 0 && (ttl < ttl_min || ttl > ttl_max);
      })) {
    return out;
  }
  // And the namespace's members as the snapshot shows them (guarded below): a
  // waiter whose identity they leave out (the list changed since it queued: a
  // member removed with end_sessions_of_removed, before its waits are
  // withdrawn) is not handed the key; on its own read it is refused as a new
  // ask would be ("... may not use namespace") and leaves the queue. Admins may
  // use every namespace.
  const auto& members = snap.ns_record.members();
  if (!members.empty() &&
      std::any_of(plan.grant.begin(), plan.grant.end(), [&](const WaiterEntry* w) {
        return !w->record.admin() &&
               std::none_of(members.begin(), members.end(), [&](const std::string& pattern) {
                 return spiffe::Matches(w->record.identity(), pattern);
               });
      })) {
    return out;
  }
  // The namespace record (its members) is still the one planned with (a
  // release planned on the views compares it already).
  if (on_read) {
    AddCompare(txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(snap.ns_mod_revision);
  }
  // No hold was created since the snapshot: the holds it shows are all there is.
  auto* no_new = AddCompare(txn, keyspace::HoldRangeBegin(ns, key), pb::Compare::CREATE,
                            pb::Compare::LESS);
  no_new->set_range_end(keyspace::HoldRangeEnd(ns, key));
  no_new->set_create_revision(snap.revision + 1);
  // The class that decides the holds' policy is still the one planned with.
  AddCompare(txn, keyspace::ClassKey(ns, cls->class_id), pb::Compare::MOD, pb::Compare::EQUAL)
      ->set_mod_revision(cls->mod_revision);
  if (on_read) {
    // And no class was created or changed since the read: one of a longer prefix
    // would now decide the key (its mode, TTL bounds and enforcement).
    AddNoClassChangedSince(txn, ns, snap.revision);
  }
  out.guarded = true;
  for (const WaiterEntry* w : plan.grant) {
    const std::string wait_key = keyspace::WaitKey(ns, key, w->lease);
    // Still queued, same incarnation (so its session's lease is alive), and the
    // same record (a retried acquire re-puts it in place, maybe in another mode).
    // Its claim on the key stays: the waiter becomes a holder.
    AddCompare(txn, wait_key, pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(w->create_revision);
    AddCompare(txn, wait_key, pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(w->mod_revision);
    txn->add_success()->mutable_request_delete_range()->set_key(wait_key);
    // A new hold key, so its create revision is this commit's (a waiter told
    // from the commit, lock/local_waiters.h, gets its token from that).
    AddCompare(txn, keyspace::HoldKey(ns, key, w->lease), pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(0);
    records::HoldRecord rec;
    rec.set_class_id(cls->class_id);
    rec.set_shared(w->record.shared());
    rec.set_holder_meta(w->record.holder_meta());
    rec.set_identity(w->record.identity());
    rec.set_epoch(snap.epoch->record.epoch());
    rec.set_etcd_cluster_id(snap.epoch->record.etcd_cluster_id());
    rec.set_granted_at_unix_ms(now_ms);
    rec.set_advisory(cls->record.enforcement() == v1::ENFORCEMENT_ADVISORY);
    auto* put = txn->add_success()->mutable_request_put();
    put->set_key(keyspace::HoldKey(ns, key, w->lease));
    put->set_value(rec.SerializeAsString());
    put->set_lease(w->lease);
    out.gone.push_back(w->lease);
    out.granted.push_back(w->lease);
  }
  return out;
}

namespace {
// Reads every hold of a key (and the namespace and epoch) at one revision.
// Refused (and told nothing of the namespace) unless `caller` may use it.
void ReadHolds(Engine* engine, const Caller& caller, const std::string& ns,
               const std::string& key, Deadline d, Done<KeySnapshot> done) {
  pb::TxnRequest txn;
  AddSnapshotReads(ns, /*session=*/0, key, txn.mutable_success());
  engine->etcd().Txn(std::move(txn), engine->EtcdDeadline(d),
                     [caller, ns, done](absl::StatusOr<pb::TxnResponse> t) {
                       if (!t.ok()) return done(t.status());
                       auto snap = ParseSnapshot(t->header(), t->responses());
                       if (!snap.ok()) return done(snap.status());
                       if (!snap->namespace_exists) return done(NoSuchNamespace(caller, ns));
                       if (auto s = CheckMember(caller, ns, snap->ns_record.members());
                           !s.ok()) {
                         return done(s);
                       }
                       done(std::move(*snap));
                     });
}
}  // namespace

void Engine::CheckToken(const Caller& caller, const v1::CheckTokenRequest& req, Deadline d,
                        Done<v1::CheckTokenResponse> done) {
  if (auto s = keyspace::ValidateNamespaceName(req.namespace_()); !s.ok()) return done(s);
  if (auto s = keyspace::ValidateLockKey(req.lock_key()); !s.ok()) return done(s);
  if (req.token() <= 0) {
    return done(absl::InvalidArgumentError(absl::StrCat("token ", req.token(), " is invalid")));
  }
  ReadHolds(this, caller, req.namespace_(), req.lock_key(), d,
            [this, tok = req.token(), key = req.lock_key(),
             done](absl::StatusOr<KeySnapshot> snap) {
              if (!snap.ok()) return done(snap.status());
              // On a restored (or replaced) etcd, before the epoch is advanced, the
              // holds read are of the backup: one may have been released, and its
              // key granted to a higher token, before the restore. Grants are
              // refused then; so is confirming a hold.
              if (auto s = CheckEpoch(snap->epoch, snap->cluster_id); !s.ok()) return done(s);
              if (auto s = GrantBlock(); !s.ok()) return done(s);
              v1::CheckTokenResponse out;
              for (const auto& h : snap->holds) {
                int64_t t = MakeHoldInfo(key, h).token();
                out.set_current_token(std::max(out.current_token(), t));
                if (t == tok) out.set_current(true);
              }
              done(std::move(out));
            });
}

void Engine::Describe(const Caller& caller, const v1::DescribeRequest& req, Deadline d,
                      Done<v1::DescribeResponse> done) {
  if (auto s = keyspace::ValidateNamespaceName(req.namespace_()); !s.ok()) return done(s);
  if (auto s = keyspace::ValidateLockKey(req.lock_key()); !s.ok()) return done(s);
  ReadHolds(this, caller, req.namespace_(), req.lock_key(), d,
            [key = req.lock_key(), done](absl::StatusOr<KeySnapshot> snap) {
              if (!snap.ok()) return done(snap.status());
              v1::DescribeResponse out;
              for (const auto& h : snap->holds) {
                *out.add_holders() = MakeHoldInfo(key, h, snap->classes);
              }
              for (const auto& w : snap->waiters) *out.add_waiters() = MakeWaiterInfo(key, w);
              if (snap->epoch) out.set_epoch(snap->epoch->record.epoch());
              out.set_revision(snap->revision);
              done(std::move(out));
            });
}

}  // namespace holdfast::lock
