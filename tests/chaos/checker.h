// The chaos suite's offline checker: verifies a merged history (history.h) against
// the model of a fenced lock service and counts what it checked.
//
//   (a) fence: the register never admitted a write whose token is lower than one
//       it admitted before for the key (for shared writes: lower than an admitted
//       exclusive one).
//   (b) exclusion: admitted exclusive writes of one key never interleave: once a
//       newer holder's write is admitted, no write of an earlier holder is.
//   (c) token order: of two grants of one key where the first completed before the
//       second was invoked, the first has the lower token; no token is granted to
//       two sessions.
//   (d) deadlines: no acquire was granted (server clock, granted_unix_ms) later
//       than its wait deadline plus a slack. Acquires that overlap a fault of
//       their own client, of a holdfastd or of etcd are not judged (a stopped
//       process's clock is not comparable; a grant decided in time may commit
//       late) and are counted as skipped.
//   (e) lost is final: no acquire invoked after its session was seen lost (or
//       closed) succeeded, and no acquire returned a token whose hold was seen lost
//       or was force-released (a `force` event: lost from then on; its later
//       writes are counted, and (a) judges them against newer tokens).
//   (f) audit (CheckAudit): once every session ended and the auditor caught up,
//       the audit store holds exactly the grants and ends of etcd's history of
//       hold keys and of the client history:
//       - the store's cursor reached etcd's revision (else: the audit fell behind);
//       - per hold (namespace, key, session, token): one grant, at the revision
//         the token names, and (every session having ended) one end event
//         (release | expire | force) after it; `unprotected` exactly for keys of
//         advisory classes;
//       - etcd: one grant per hold-key creation and one end per hold-key deletion,
//         same revision, key, session and token; the end's type as etcd's revision
//         says (an audit mark: release or force; its session closed: release;
//         otherwise: expire); no row that etcd's history does not have;
//       - a hold the nemesis force-released ends in a `force` row at the release's
//         revision (a release its holder then saw succeed is excused);
//       - history: every grant a client saw is there exactly once; a release a
//         client saw succeed is a `release` (an `expire` only if the client saw
//         its session lost, or a holdfastd or etcd fault overlapped the release:
//         libholdfast answers OK for a release on a session it counts as lost).
//       What the history cannot know (an acquire whose answer was lost, a killed
//       holder) is judged against etcd only.
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "history.h"

namespace holdfast::chaos {

struct CheckerOptions {
  // Slack allowed between an acquire's wait deadline and its grant time.
  int64_t deadline_slack_ms = 1000;
};

struct Violation {
  char item;  // 'a'...'f'
  std::string message;
};

// What check (f) compared.
struct AuditCounters {
  bool checked = false;
  std::string note;                  // why it was not checked, or what was left out
  int64_t rows = 0;
  int64_t audit_grants = 0;          // rows of each type checked
  int64_t audit_releases = 0;
  int64_t audit_expiries = 0;
  int64_t audit_forces = 0;
  int64_t holds = 0;                 // distinct holds in the audit
  int64_t history_grants = 0;        // client-seen grants found in the audit
  int64_t history_releases = 0;      // client-seen releases recorded as `release`
  int64_t releases_seen_expired = 0; // client-seen releases recorded as `expire` (excused)
  int64_t history_forces = 0;        // the nemesis's forces found as `force` rows
  int64_t releases_seen_forced = 0;  // client-seen releases of a forced hold (excused)
  int64_t etcd_creations = 0;        // etcd hold creations matched by a grant row
  int64_t etcd_deletions = 0;        // etcd hold deletions matched by an end row
};

// Time-to-notice and time-to-regrant of one fault kind, in milliseconds.
struct FaultTimings {
  int count = 0;
  // Until a holder saw a hold lost: for client_pause from the resume (the victim
  // itself), for etcd and holdfastd faults from the start (any holder, until 2 s
  // after the heal). Faults nobody noticed add nothing.
  std::vector<int64_t> notice_ms;
  // From the start until the victim's key was granted to another client (client
  // faults), or until any grant (etcd and holdfastd faults).
  std::vector<int64_t> regrant_ms;
};

struct CheckReport {
  int64_t ops = 0;  // completed acquires, releases and register writes
  int64_t grants = 0;
  int64_t faults = 0;
  int64_t writes_admitted = 0;
  int64_t stale_writes_rejected = 0;
  int64_t token_pairs_checked = 0;
  int64_t deadlines_checked = 0;
  int64_t deadlines_skipped = 0;
  int64_t losts = 0;
  int64_t forces = 0;                  // holds the nemesis force-released
  int64_t forced_writes_rejected = 0;  // writes with a forced token after the force
  int64_t forced_writes_admitted = 0;  // the same, admitted (no newer token seen yet)
  AuditCounters audit;
  std::vector<Violation> violations;
  // By fault kind ("etcd_member_partition/leader": kind and the victim's role).
  std::map<std::string, FaultTimings> timings;

  // Counters, then one line per violation (at most `max_violations`), then timings.
  std::string Describe(int max_violations = 20) const;
};

CheckReport CheckHistory(const std::vector<Event>& events, const CheckerOptions& options = {});

// Check (f): compares `audit` (the store's rows and, when present, etcd's history
// of hold keys) with `events` and adds its counters and violations to `r`.
// Does nothing but say so when !audit.present.
void CheckAudit(const std::vector<Event>& events, const AuditCapture& audit, CheckReport& r);

}  // namespace holdfast::chaos
