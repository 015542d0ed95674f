#include "history.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace holdfast::chaos {

using nlohmann::json;

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EventToJson(const Event& e) {
  json j;
  j["ts"] = e.ts;
  j["p"] = e.p;
  if (e.pid != 0) j["pid"] = e.pid;
  j["type"] = e.type;
  if (e.op != 0) j["op"] = e.op;
  if (e.session != 0) j["session"] = e.session;
  if (!e.key.empty()) j["key"] = e.key;
  if (e.token != 0) j["token"] = e.token;
  if (e.shared) j["shared"] = true;
  if (e.session_lost) j["session_lost"] = true;
  if (e.wait_ms >= 0) j["wait_ms"] = e.wait_ms;
  if (e.unix_ms != 0) j["unix_ms"] = e.unix_ms;
  if (e.granted_unix_ms != 0) j["granted_unix_ms"] = e.granted_unix_ms;
  if (!e.verdict.empty()) j["verdict"] = e.verdict;
  if (!e.writer.empty()) j["writer"] = e.writer;
  if (!e.kind.empty()) j["kind"] = e.kind;
  if (!e.target.empty()) j["target"] = e.target;
  if (!e.phase.empty()) j["phase"] = e.phase;
  if (!e.detail.empty()) j["detail"] = e.detail;
  if (e.revision != 0) j["revision"] = e.revision;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<Event> EventFromJson(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("not a JSON object: ", line));
  }
  Event e;
  auto i64 = [&](const char* name, int64_t& out) {
    auto it = j.find(name);
    if (it != j.end() && it->is_number_integer()) out = it->get<int64_t>();
  };
  auto str = [&](const char* name, std::string& out) {
    auto it = j.find(name);
    if (it != j.end() && it->is_string()) out = it->get<std::string>();
  };
  auto boolean = [&](const char* name, bool& out) {
    auto it = j.find(name);
    if (it != j.end() && it->is_boolean()) out = it->get<bool>();
  };
  i64("ts", e.ts);
  str("p", e.p);
  i64("pid", e.pid);
  str("type", e.type);
  i64("op", e.op);
  i64("session", e.session);
  str("key", e.key);
  i64("token", e.token);
  boolean("shared", e.shared);
  boolean("session_lost", e.session_lost);
  i64("wait_ms", e.wait_ms);
  i64("unix_ms", e.unix_ms);
  i64("granted_unix_ms", e.granted_unix_ms);
  str("verdict", e.verdict);
  str("writer", e.writer);
  str("kind", e.kind);
  str("target", e.target);
  str("phase", e.phase);
  str("detail", e.detail);
  i64("revision", e.revision);
  if (e.type.empty()) return absl::InvalidArgumentError(absl::StrCat("no type: ", line));
  return e;
}

absl::StatusOr<std::unique_ptr<HistoryWriter>> HistoryWriter::Open(const std::string& path,
                                                                   std::string process) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", path));
  return std::unique_ptr<HistoryWriter>(new HistoryWriter(f, std::move(process)));
}

HistoryWriter::~HistoryWriter() { std::fclose(file_); }

void HistoryWriter::Record(Event e) {
  if (e.p.empty()) e.p = process_;
  e.pid = getpid();
  absl::MutexLock lock(&mu_);
  if (e.ts == 0) e.ts = MonotonicNanos();
  const std::string line = EventToJson(e) + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

absl::StatusOr<std::vector<Event>> ReadHistories(const std::vector<std::string>& paths) {
  std::vector<Event> events;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
    std::string line;
    int64_t bad = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto e = EventFromJson(line);
      if (!e.ok()) {
        // A writer killed mid-line leaves at most one torn line, at the end.
        if (++bad > 1) return e.status();
        continue;
      }
      events.push_back(*std::move(e));
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.ts < b.ts; });
  return events;
}

absl::Status WriteHistory(const std::string& path, const std::vector<Event>& events) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  for (const Event& e : events) out << EventToJson(e) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write failed: ", path));
  return absl::OkStatus();
}


// audit.jsonl: one "capture" line with the scalars, then one line per audit row
// ("row") and per etcd hold change ("etcd").
absl::Status WriteAuditCapture(const std::string& path, const AuditCapture& c) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  json head;
  head["line"] = "capture";
  head["present"] = c.present;
  head["ns"] = c.ns;
  head["cursor"] = c.cursor;
  head["etcd_revision"] = c.etcd_revision;
  head["waited_ms"] = c.waited_ms;
  head["sessions_ended"] = c.sessions_ended;
  head["advisory_prefixes"] = c.advisory_prefixes;
  head["problems"] = c.problems;
  head["etcd_present"] = c.etcd_present;
  head["etcd_from_revision"] = c.etcd_from_revision;
  head["etcd_note"] = c.etcd_note;
  const auto dump = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  out << dump(head) << "\n";
  for (const AuditRow& r : c.rows) {
    out << dump(json{{"line", "row"}, {"revision", r.revision}, {"ns", r.ns}, {"key", r.key},
                     {"session", r.session}, {"type", r.type}, {"token", r.token},
                     {"unprotected", r.unprotected}})
        << "\n";
  }
  for (const EtcdHoldChange& e : c.etcd) {
    out << dump(json{{"line", "etcd"}, {"revision", e.revision}, {"ns", e.ns}, {"key", e.key},
                     {"session", e.session}, {"created", e.created}, {"token", e.token},
                     {"cause", e.cause}})
        << "\n";
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write failed: ", path));
  return absl::OkStatus();
}

absl::StatusOr<AuditCapture> ReadAuditCapture(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  AuditCapture c;
  bool have_head = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("line")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not an audit capture line: ", line));
    }
    const std::string kind = j.value("line", "");
    if (kind == "capture") {
      have_head = true;
      c.present = j.value("present", false);
      c.ns = j.value("ns", "default");
      c.cursor = j.value("cursor", int64_t{0});
      c.etcd_revision = j.value("etcd_revision", int64_t{0});
      c.waited_ms = j.value("waited_ms", int64_t{0});
      c.sessions_ended = j.value("sessions_ended", false);
      c.advisory_prefixes = j.value("advisory_prefixes", std::vector<std::string>{});
      c.problems = j.value("problems", std::vector<std::string>{});
      c.etcd_present = j.value("etcd_present", false);
      c.etcd_from_revision = j.value("etcd_from_revision", int64_t{1});
      c.etcd_note = j.value("etcd_note", "");
    } else if (kind == "row") {
      AuditRow r;
      r.revision = j.value("revision", int64_t{0});
      r.ns = j.value("ns", "");
      r.key = j.value("key", "");
      r.session = j.value("session", int64_t{0});
      r.type = j.value("type", "");
      r.token = j.value("token", int64_t{0});
      r.unprotected = j.value("unprotected", false);
      c.rows.push_back(std::move(r));
    } else if (kind == "etcd") {
      EtcdHoldChange e;
      e.revision = j.value("revision", int64_t{0});
      e.ns = j.value("ns", "");
      e.key = j.value("key", "");
      e.session = j.value("session", int64_t{0});
      e.created = j.value("created", false);
      e.token = j.value("token", int64_t{0});
      e.cause = j.value("cause", "");
      c.etcd.push_back(std::move(e));
    }
  }
  if (!have_head) return absl::InvalidArgumentError(absl::StrCat(path, ": no capture line"));
  return c;
}

}  // namespace holdfast::chaos
