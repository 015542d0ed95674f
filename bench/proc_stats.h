// CPU time, resident memory and context switches of a process on this machine,
// from /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace holdfast::bench {

struct ProcSample {
  double cpu_seconds = 0;  // user + system time since the process started
  int64_t rss_bytes = 0;   // VmRSS
  // Voluntary and involuntary context switches of the threads alive now, summed
  // (a thread that has ended no longer counts: compare samples of a process whose
  // threads live on, as the servers' pools do).
  int64_t context_switches = 0;
};

// Reads /proc/<pid>/stat, /proc/<pid>/status and /proc/<pid>/task/*/status.
// Errors: NOT_FOUND (no such process), INTERNAL (unexpected format). Thread-safe.
absl::StatusOr<ProcSample> SampleProcess(pid_t pid);

}  // namespace holdfast::bench
