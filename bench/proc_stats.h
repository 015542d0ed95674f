// CPU time and resident memory of a process on this machine, from /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace holdfast::bench {

struct ProcSample {
  double cpu_seconds = 0;  // user + system time since the process started
  int64_t rss_bytes = 0;   // VmRSS
};

// Reads /proc/<pid>/stat and /proc/<pid>/status. Errors: NOT_FOUND (no such
// process), INTERNAL (unexpected format). Thread-safe.
absl::StatusOr<ProcSample> SampleProcess(pid_t pid);

}  // namespace holdfast::bench
