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
//       closed) succeeded, and no acquire returned a token whose hold was seen lost.
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
  char item;  // 'a'...'e'
  std::string message;
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
  std::vector<Violation> violations;
  std::map<std::string, FaultTimings> timings;  // by fault kind

  // Counters, then one line per violation (at most `max_violations`), then timings.
  std::string Describe(int max_violations = 20) const;
};

CheckReport CheckHistory(const std::vector<Event>& events, const CheckerOptions& options = {});

}  // namespace holdfast::chaos
