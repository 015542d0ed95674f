// Chaos suite history: one JSON object per line, written by every process of a run
// (the driver, its fenced register, each chaos client) and merged by the driver.
//
//   {"ts":123456789,"p":"c3.1","pid":4242,"type":"acquire_ok","key":"x/0",...}
//
// ts is CLOCK_MONOTONIC (std::chrono::steady_clock) in nanoseconds: one clock for
// every process on the machine, so the lines of several files sort into one history.
// The event types and their fields are listed at Event; docs/safety.md describes them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::chaos {

// One history event. Unused fields keep their defaults and are not written.
//
// Types (p = the process that recorded it):
//   session_open    session                        a client opened a session
//   session_close   session                        a client closed it (holds released)
//   lost_notice     session, detail                on_lost callback ran (reason)
//   acquire_invoke  op, session, key, shared, wait_ms, unix_ms
//   acquire_ok      op, session, key, shared, token, granted_unix_ms
//   acquire_fail    op, session, key, detail (status code)
//   lost            session, key, token, session_lost, detail: the holder saw lost()
//   release_invoke  op, session, key, token
//   release_ok / release_fail   op, session, key, token, detail
//   write           key, token, shared, verdict ("admitted"|"rejected"), writer:
//                   recorded by the register in admission order
//   fault           kind, target, key, phase ("start"|"end"), session (force_release:
//                   the holder's), detail (etcd_member_partition: the member's role):
//                   recorded by the nemesis
//   force           key, session, token, revision: the nemesis force-released that
//                   hold (two admins); `revision` is the release's (the audit's force)
struct Event {
  int64_t ts = 0;  // steady_clock nanoseconds
  std::string p;   // logical process id ("c3.1", "nemesis", "register")
  int64_t pid = 0;
  std::string type;
  int64_t op = 0;
  int64_t session = 0;
  std::string key;
  int64_t token = 0;
  bool shared = false;
  bool session_lost = false;
  int64_t wait_ms = -1;
  int64_t unix_ms = 0;
  int64_t granted_unix_ms = 0;
  std::string verdict;
  std::string writer;
  std::string kind;
  std::string target;
  std::string phase;
  std::string detail;
  int64_t revision = 0;
};

// --- Check (f): what the driver reads at the end of a run -------------------

// One audit_event row (audit/store.h).
struct AuditRow {
  int64_t revision = 0;
  std::string ns;
  std::string key;       // the lock key
  int64_t session = 0;   // the holder's lease id
  std::string type;      // "grant" | "release" | "expire" | "force"
  int64_t token = 0;
  bool unprotected = false;
};

// One change of a hold key in etcd's own history: the ground truth the audit
// must match, read by the driver with a watch from etcd's first revision.
struct EtcdHoldChange {
  int64_t revision = 0;
  std::string ns;
  std::string key;
  int64_t session = 0;
  bool created = false;  // the hold key was created (else deleted)
  int64_t token = 0;     // epoch << 48 | the hold's create_revision (0: record unreadable)
  // For a deletion, what etcd's revision says ended the hold:
  //   "release" / "force": the revision carries an audit mark of that kind;
  //   "close": the session's key went in the same revision, its record `closing`;
  //   "": neither (the lease expired, or was revoked without a close).
  std::string cause;
};

// Everything check (f) judges, captured after the workload (and written to
// audit.jsonl beside the history, so `--check` replays it).
struct AuditCapture {
  bool present = false;        // false: the run captured no audit; (f) is not checked
  std::string ns = "default";  // the namespace the clients used
  int64_t cursor = 0;          // the store's cursor when the rows were read
  int64_t etcd_revision = 0;   // etcd's revision then
  int64_t waited_ms = 0;       // how long the driver waited for the cursor
  // Every session had ended when the rows were read, so every hold has ended.
  bool sessions_ended = false;
  // Lock keys under these prefixes are in an advisory class (grants unprotected).
  std::vector<std::string> advisory_prefixes;
  // What kept the driver from a full capture; each one is a violation.
  std::vector<std::string> problems;
  std::vector<AuditRow> rows;  // every row of the cluster, in store order
  // etcd's hold changes at revisions >= etcd_from_revision; absent when etcd's
  // history could not be read (etcd_note says why).
  bool etcd_present = false;
  int64_t etcd_from_revision = 1;
  std::string etcd_note;
  std::vector<EtcdHoldChange> etcd;
};

absl::Status WriteAuditCapture(const std::string& path, const AuditCapture& c);
absl::StatusOr<AuditCapture> ReadAuditCapture(const std::string& path);

// steady_clock now, in nanoseconds.
int64_t MonotonicNanos();
// system_clock now, in milliseconds since the Unix epoch.
int64_t UnixMillis();

std::string EventToJson(const Event& e);
absl::StatusOr<Event> EventFromJson(const std::string& line);

// Appends events to a file, one flushed line each (a process killed right after
// Record loses nothing it recorded). Fills ts (if 0) and pid.
//
// Thread-safe: lines of concurrent Record calls never interleave, and their ts
// follow the order of the lines.
class HistoryWriter {
 public:
  static absl::StatusOr<std::unique_ptr<HistoryWriter>> Open(const std::string& path,
                                                             std::string process);
  ~HistoryWriter();
  HistoryWriter(const HistoryWriter&) = delete;
  HistoryWriter& operator=(const HistoryWriter&) = delete;

  void Record(Event e);
  const std::string& process() const { return process_; }

 private:
  HistoryWriter(std::FILE* f, std::string process) : file_(f), process_(std::move(process)) {}
  absl::Mutex mu_;
  std::FILE* const file_ ABSL_PT_GUARDED_BY(mu_);
  const std::string process_;
};

// Reads every line of the files (skipping a torn last line of a killed writer) and
// returns the events sorted by ts (stable: file order breaks ties).
absl::StatusOr<std::vector<Event>> ReadHistories(const std::vector<std::string>& paths);

// Writes `events` to `path`, one line each.
absl::Status WriteHistory(const std::string& path, const std::vector<Event>& events);

}  // namespace holdfast::chaos
