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
//   fault           kind, target, key, phase ("start"|"end"): recorded by the nemesis
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
};

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
