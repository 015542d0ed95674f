#include "bench/proc_stats.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace holdfast::bench {

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// utime + stime (fields 14 and 15 of /proc/PID/stat), in seconds. The fields are
// counted after the command name, which may itself hold spaces and parentheses.
absl::StatusOr<double> CpuSeconds(const std::string& stat) {
  auto close = stat.rfind(')');
  if (close == std::string::npos) return absl::InternalError("malformed /proc stat");
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state): utime is f[11], stime f[12].
  int64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return absl::InternalError("malformed /proc stat");
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

absl::StatusOr<int64_t> RssBytes(const std::string& status) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmRSS:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, " kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) {
      return absl::InternalError("malformed VmRSS line");
    }
    return kib * 1024;
  }
  return absl::InternalError("no VmRSS line");
}

// voluntary_ctxt_switches + nonvoluntary_ctxt_switches of one thread's status.
int64_t ContextSwitches(const std::string& status) {
  int64_t total = 0;
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "voluntary_ctxt_switches:") &&
        !absl::ConsumePrefix(&line, "nonvoluntary_ctxt_switches:")) {
      continue;
    }
    int64_t n = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &n)) total += n;
  }
  return total;
}

}  // namespace

absl::StatusOr<ProcSample> SampleProcess(pid_t pid) {
  auto dir = absl::StrCat("/proc/", pid, "/");
  auto stat = ReadFile(dir + "stat");
  if (!stat.ok()) return stat.status();
  auto status = ReadFile(dir + "status");
  if (!status.ok()) return status.status();
  ProcSample s;
  auto cpu = CpuSeconds(*stat);
  if (!cpu.ok()) return cpu.status();
  auto rss = RssBytes(*status);
  if (!rss.ok()) return rss.status();
  s.cpu_seconds = *cpu;
  s.rss_bytes = *rss;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(dir + "task", ec)) {
    // A thread that ends meanwhile is skipped.
    if (auto t = ReadFile(task.path().string() + "/status"); t.ok()) {
      s.context_switches += ContextSwitches(*t);
    }
  }
  return s;
}

}  // namespace holdfast::bench
