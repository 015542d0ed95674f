#include "checker.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace holdfast::chaos {
namespace {

constexpr int64_t kNanosPerMilli = 1'000'000;

// Faults of one client process or of one of its holds (the others are faults of a
// holdfastd or of etcd: server faults).
bool ClientFault(const std::string& kind) {
  return kind == "client_pause" || kind == "client_kill" || kind == "force_release";
}

std::string Ms(int64_t ns) { return absl::StrFormat("%.3fs", static_cast<double>(ns) / 1e9); }

// (a) and (b): the register's admission order, key by key.
void CheckWrites(const std::vector<Event>& events, CheckReport& r) {
  struct KeyState {
    int64_t highest = 0;
    int64_t highest_exclusive = 0;
    int64_t current_exclusive = 0;
    absl::flat_hash_set<int64_t> superseded;  // exclusive tokens whose writes ended
  };
  absl::flat_hash_map<std::string, KeyState> keys;
  for (const Event& e : events) {
    if (e.type != "write") continue;
    ++r.ops;
    if (e.verdict != "admitted") {
      ++r.stale_writes_rejected;
      continue;
    }
    ++r.writes_admitted;
    KeyState& k = keys[e.key];
    const int64_t bound = e.shared ? k.highest_exclusive : k.highest;
    if (e.token < bound) {
      r.violations.push_back(
          {'a', absl::StrCat("register admitted ", e.shared ? "shared" : "exclusive",
                             " write of ", e.key, " by ", e.writer, " with token ", e.token,
                             " after token ", bound, " at ", Ms(e.ts))});
    }
    k.highest = std::max(k.highest, e.token);
    if (e.shared) continue;
    k.highest_exclusive = std::max(k.highest_exclusive, e.token);
    if (e.token == k.current_exclusive) continue;
    if (k.superseded.contains(e.token)) {
      r.violations.push_back(
          {'b', absl::StrCat("exclusive writes of ", e.key, " interleave: token ", e.token,
                             " (", e.writer, ") written again at ", Ms(e.ts),
                             " after token ", k.current_exclusive, " was written")});
    }
    if (k.current_exclusive != 0) k.superseded.insert(k.current_exclusive);
    k.current_exclusive = e.token;
  }
}

struct Grant {
  std::string p;
  int64_t session = 0;
  std::string key;
  int64_t token = 0;
  bool shared = false;
  int64_t invoke_ts = 0;
  int64_t ok_ts = 0;
};

// (c): real-time order of grants of one key versus their tokens.
void CheckTokenOrder(const std::vector<Grant>& grants, CheckReport& r) {
  absl::flat_hash_map<std::string, std::vector<const Grant*>> by_key;
  for (const Grant& g : grants) by_key[g.key].push_back(&g);
  for (auto& [key, list] : by_key) {
    // One transaction may grant several queued shared waiters at once: they share
    // a token. An exclusive token belongs to one session.
    absl::flat_hash_map<int64_t, const Grant*> first_of_token;
    for (const Grant* g : list) {
      auto [it, inserted] = first_of_token.try_emplace(g->token, g);
      if (!inserted && it->second->session != g->session &&
          !(it->second->shared && g->shared)) {
        r.violations.push_back({'c', absl::StrCat("token ", g->token, " of ", key,
                                                  " granted to sessions ", it->second->session, " and ",
                                                  g->session)});
      }
    }
    std::vector<const Grant*> by_invoke = list;
    std::vector<const Grant*> by_ok = list;
    std::sort(by_invoke.begin(), by_invoke.end(),
              [](const Grant* a, const Grant* b) { return a->invoke_ts < b->invoke_ts; });
    std::sort(by_ok.begin(), by_ok.end(),
              [](const Grant* a, const Grant* b) { return a->ok_ts < b->ok_ts; });
    size_t done = 0;
    const Grant* highest = nullptr;  // highest token among grants completed so far
    for (const Grant* g : by_invoke) {
      while (done < by_ok.size() && by_ok[done]->ok_ts < g->invoke_ts) {
        if (highest == nullptr || by_ok[done]->token > highest->token) highest = by_ok[done];
        ++done;
      }
      if (highest == nullptr) continue;
      ++r.token_pairs_checked;
      if (g->token < highest->token ||
          (g->token == highest->token && g->session != highest->session &&
           !(g->shared && highest->shared))) {
        r.violations.push_back(
            {'c', absl::StrCat("tokens of ", key, " out of grant order: ", highest->p,
                               " was granted ", highest->token, " (done at ",
                               Ms(highest->ok_ts), ") before ", g->p, " asked (at ",
                               Ms(g->invoke_ts), ") and got ", g->token)});
      }
    }
  }
}

// Writes with a forced hold's token after the force. The fence rejects them once
// the register has admitted a newer token of the key (check (a) judges that);
// before that, nothing at the resource tells them from the holder's own.
void CountForcedWrites(const std::vector<Event>& events, CheckReport& r) {
  std::set<std::pair<std::string, int64_t>> forced;  // key, token
  for (const Event& e : events) {
    if (e.type == "force") forced.insert({e.key, e.token});
    if (e.type != "write" || !forced.contains({e.key, e.token})) continue;
    ++(e.verdict == "admitted" ? r.forced_writes_admitted : r.forced_writes_rejected);
  }
}

struct Window {
  int64_t start = 0;
  int64_t end = std::numeric_limits<int64_t>::max();
};

}  // namespace

CheckReport CheckHistory(const std::vector<Event>& events, const CheckerOptions& options) {
  CheckReport r;
  CheckWrites(events, r);

  // Fault windows: an acquire that overlaps a fault of its own client, or of a
  // holdfastd or etcd member (a grant decided in time may commit late), is not
  // judged against its deadline.
  absl::flat_hash_map<std::string, std::vector<Window>> client_windows;  // by process
  std::vector<Window> server_windows;
  absl::flat_hash_map<std::string, int64_t> open_fault;  // kind/target -> start
  for (const Event& e : events) {
    if (e.type != "fault") continue;
    const std::string id = absl::StrCat(e.kind, "/", e.target);
    if (e.phase == "start") {
      ++r.faults;
      open_fault[id] = e.ts;
      continue;
    }
    auto it = open_fault.find(id);
    if (it == open_fault.end()) continue;
    Window w{it->second, e.ts};
    open_fault.erase(it);
    if (ClientFault(e.kind)) {
      client_windows[e.target].push_back(w);
    } else {
      server_windows.push_back(w);  // holdfastd and etcd faults
    }
  }
  for (const auto& [id, start] : open_fault) {  // never healed: to the end
    const std::string kind = id.substr(0, id.find('/'));
    const std::string target = id.substr(id.find('/') + 1);
    if (ClientFault(kind)) {
      client_windows[target].push_back({start});
    } else {
      server_windows.push_back({start});
    }
  }
  auto overlaps = [](const std::vector<Window>& ws, int64_t from, int64_t to) {
    for (const Window& w : ws) {
      if (w.start <= to && from <= w.end) return true;
    }
    return false;
  };

  // Pair acquire invocations with completions; follow lost sessions and holds.
  absl::flat_hash_map<std::string, Event> invokes;  // p/op -> acquire_invoke
  absl::flat_hash_map<int64_t, int64_t> session_ended_at;  // session -> ts seen lost/closed
  std::set<std::tuple<int64_t, std::string, int64_t>> lost_holds;  // session, key, token
  std::vector<Grant> grants;
  for (const Event& e : events) {
    const std::string op_id = absl::StrCat(e.p, "/", e.op);
    if (e.type == "acquire_invoke") {
      invokes[op_id] = e;
    } else if (e.type == "acquire_ok") {
      ++r.ops;
      ++r.grants;
      auto it = invokes.find(op_id);
      const int64_t invoke_ts = it == invokes.end() ? e.ts : it->second.ts;
      grants.push_back({e.p, e.session, e.key, e.token, e.shared, invoke_ts, e.ts});
      // (e)
      auto ended = session_ended_at.find(e.session);
      if (ended != session_ended_at.end() && ended->second < invoke_ts) {
        r.violations.push_back(
            {'e', absl::StrCat(e.p, " was granted ", e.key, " token ", e.token, " on session ",
                               e.session, ", seen lost or closed at ", Ms(ended->second),
                               " before the acquire began at ", Ms(invoke_ts))});
      }
      if (lost_holds.contains({e.session, e.key, e.token})) {
        r.violations.push_back({'e', absl::StrCat(e.p, " was granted ", e.key, " token ",
                                                  e.token, " again after that hold was lost")});
      }
      // (d)
      if (it != invokes.end() && it->second.wait_ms >= 0 && e.granted_unix_ms > 0 &&
          it->second.unix_ms > 0) {
        if (overlaps(client_windows[e.p], invoke_ts, e.ts) ||
            overlaps(server_windows, invoke_ts, e.ts)) {
          ++r.deadlines_skipped;
        } else {
          ++r.deadlines_checked;
          const int64_t late = e.granted_unix_ms - (it->second.unix_ms + it->second.wait_ms);
          if (late > options.deadline_slack_ms) {
            r.violations.push_back(
                {'d', absl::StrCat(e.p, " was granted ", e.key, " token ", e.token, " ", late,
                                   " ms after its wait deadline (wait ", it->second.wait_ms,
                                   " ms)")});
          }
        }
      }
      if (it != invokes.end()) invokes.erase(it);
    } else if (e.type == "acquire_fail") {
      ++r.ops;
      invokes.erase(op_id);
    } else if (e.type == "release_ok" || e.type == "release_fail") {
      ++r.ops;
    } else if (e.type == "lost") {
      ++r.losts;
      lost_holds.insert({e.session, e.key, e.token});
      if (e.session_lost) session_ended_at.try_emplace(e.session, e.ts);
    } else if (e.type == "session_close") {
      session_ended_at.try_emplace(e.session, e.ts);
    } else if (e.type == "force") {
      // The forced holder lost the hold at the force (its session lives on).
      ++r.forces;
      lost_holds.insert({e.session, e.key, e.token});
    }
  }
  CheckTokenOrder(grants, r);
  CountForcedWrites(events, r);

  // Timings: from each fault's start (client pauses: from the resume) to the
  // next lost hold (of the victim, for client faults) and the next grant of the
  // victim's key by another process (any grant, for server faults).
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& f = events[i];
    if (f.type != "fault" || f.phase != "start") continue;
    // A fault that names its victim's role (etcd_member_partition: "leader" or
    // "follower") is timed apart per role.
    FaultTimings& t = r.timings[f.detail.empty() ? f.kind : absl::StrCat(f.kind, "/", f.detail)];
    ++t.count;
    const bool client_fault = ClientFault(f.kind);
    // A forced hold is named by its session (the history's target is the process
    // that wrote with it last, which for a shared hold may be another holder).
    const bool forced = f.kind == "force_release";
    int64_t end_ts = f.ts;
    for (size_t j = i + 1; j < events.size(); ++j) {
      const Event& g = events[j];
      if (g.type == "fault" && g.phase == "end" && g.kind == f.kind && g.target == f.target) {
        end_ts = g.ts;
        break;
      }
    }
    // A paused client notices when it resumes; other faults are noticed (or not)
    // while they last, or soon after they heal.
    const int64_t notice_from = f.kind == "client_pause" ? end_ts : f.ts;
    const int64_t notice_until = end_ts + (client_fault ? 10'000 : 2'000) * kNanosPerMilli;
    bool noticed = f.kind == "client_kill", regranted = false;
    constexpr int64_t kHorizon = 30'000 * kNanosPerMilli;
    for (size_t j = i + 1; j < events.size() && events[j].ts < f.ts + kHorizon; ++j) {
      const Event& g = events[j];
      const bool victim = forced ? g.session == f.session && g.key == f.key : g.p == f.target;
      if (!noticed && g.ts >= notice_from && g.ts <= notice_until &&
          (g.type == "lost" || (g.type == "lost_notice" && !forced)) &&
          (!client_fault || victim)) {
        t.notice_ms.push_back((g.ts - notice_from) / kNanosPerMilli);
        noticed = true;
      }
      if (!regranted && g.type == "acquire_ok" &&
          (client_fault ? !victim && g.key == f.key && !f.key.empty() : true)) {
        t.regrant_ms.push_back((g.ts - f.ts) / kNanosPerMilli);
        regranted = true;
      }
      if (noticed && regranted) break;
    }
  }
  return r;
}

namespace {

constexpr int64_t kRevisionMask = (int64_t{1} << 48) - 1;

// A hold is named by where and by whom it was held, and its token (the grant).
using HoldId = std::tuple<std::string, std::string, int64_t, int64_t>;  // ns, key, session, token

struct HoldRows {
  std::vector<const AuditRow*> grants;
  std::vector<const AuditRow*> ends;
};

std::string Name(const std::string& ns, const std::string& key, int64_t session, int64_t token) {
  return absl::StrCat(ns, "/", key, " session ", session, " token ", token, " (grant revision ",
                      token & kRevisionMask, ")");
}

std::string Name(const HoldId& id) {
  return Name(std::get<0>(id), std::get<1>(id), std::get<2>(id), std::get<3>(id));
}

std::string Rows(const std::vector<const AuditRow*>& rows) {
  std::string out;
  for (const AuditRow* row : rows) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", row->type, " at revision ", row->revision);
  }
  return out;
}

// The end event etcd's revision calls for (EtcdHoldChange::cause).
std::string ExpectedEnd(const std::string& cause) {
  if (cause == "release" || cause == "close") return "release";
  if (cause == "force") return "force";
  return "expire";
}

}  // namespace

void CheckAudit(const std::vector<Event>& events, const AuditCapture& a, CheckReport& r) {
  AuditCounters& c = r.audit;
  if (!a.present) {
    c.note = "not checked: the run captured no audit";
    return;
  }
  c.checked = true;
  auto violation = [&r](std::string message) { r.violations.push_back({'f', std::move(message)}); };
  for (const std::string& p : a.problems) violation(p);
  // Rows after the cursor may be missing without a fault of their own: only
  // revisions up to the cursor are judged for presence.
  const int64_t judged_through = a.cursor;
  const bool complete = a.cursor >= a.etcd_revision && a.etcd_revision > 0;
  if (!complete && a.etcd_revision > 0) {
    violation(absl::StrCat("the audit fell behind: the store's cursor is at revision ", a.cursor,
                           ", etcd's revision is ", a.etcd_revision, " after waiting ",
                           a.waited_ms, " ms; revisions after ", a.cursor,
                           " are not judged"));
  }
  auto advisory = [&a](const std::string& ns, const std::string& key) {
    if (ns != a.ns) return false;
    for (const std::string& p : a.advisory_prefixes) {
      if (key.rfind(p, 0) == 0) return true;
    }
    return false;
  };

  // The rows by themselves: one grant and (all sessions over) one end per hold.
  std::map<HoldId, HoldRows> holds;
  for (const AuditRow& row : a.rows) {
    ++c.rows;
    const HoldId id{row.ns, row.key, row.session, row.token};
    if (row.type == "grant") {
      ++c.audit_grants;
      holds[id].grants.push_back(&row);
    } else if (row.type == "release" || row.type == "expire" || row.type == "force") {
      ++(row.type == "release" ? c.audit_releases
         : row.type == "expire" ? c.audit_expiries
                                : c.audit_forces);
      holds[id].ends.push_back(&row);
    } else {
      violation(absl::StrCat("audit row of unknown type \"", row.type, "\" at revision ",
                             row.revision, ": ", Name(id)));
      continue;
    }
    if (row.token <= 0) {
      violation(absl::StrCat("audit ", row.type, " at revision ", row.revision, " of ", row.ns,
                             "/", row.key, " session ", row.session,
                             " was recorded without a token"));
    }
    if (row.unprotected != advisory(row.ns, row.key)) {
      violation(absl::StrCat("audit ", row.type, " at revision ", row.revision, " of ", Name(id),
                             " is marked ", row.unprotected ? "unprotected" : "protected",
                             ", but the key's class is ",
                             advisory(row.ns, row.key) ? "advisory" : "fenced"));
    }
  }
  c.holds = static_cast<int64_t>(holds.size());
  for (const auto& [id, h] : holds) {
    const int64_t grant_revision = std::get<3>(id) & kRevisionMask;
    if (h.grants.empty()) {
      if (grant_revision <= judged_through) {
        violation(absl::StrCat("audit has ", Rows(h.ends), " of ", Name(id),
                               " but no grant of it"));
      }
    } else if (h.grants.size() > 1) {
      violation(absl::StrCat("audit granted ", Name(id), " ", h.grants.size(),
                             " times: ", Rows(h.grants)));
    }
    for (const AuditRow* g : h.grants) {
      if (g->revision != grant_revision) {
        violation(absl::StrCat("audit grant at revision ", g->revision, " of ", Name(id),
                               ": the token names revision ", grant_revision));
      }
    }
    if (h.ends.size() > 1) {
      violation(absl::StrCat("audit ended ", Name(id), " ", h.ends.size(), " times: ",
                             Rows(h.ends)));
    } else if (h.ends.empty() && !h.grants.empty() && a.sessions_ended && complete) {
      violation(absl::StrCat("audit never ended ", Name(id),
                             ", though every session had ended"));
    }
    for (const AuditRow* e : h.ends) {
      if (e->revision <= grant_revision) {
        violation(absl::StrCat("audit ", e->type, " at revision ", e->revision, " of ", Name(id),
                               " is not after its grant"));
      }
    }
  }

  // The client history: what a client saw granted or released must be there.
  std::vector<Window> server_faults;
  absl::flat_hash_map<std::string, int64_t> open_fault;
  for (const Event& e : events) {
    if (e.type != "fault" || ClientFault(e.kind)) continue;
    const std::string id = absl::StrCat(e.kind, "/", e.target);
    if (e.phase == "start") {
      open_fault[id] = e.ts;
    } else if (auto it = open_fault.find(id); it != open_fault.end()) {
      server_faults.push_back({it->second, e.ts});
      open_fault.erase(it);
    }
  }
  for (const auto& [id, start] : open_fault) server_faults.push_back({start});
  // Whether a client saw the session of a release lost between the hold's grant
  // and (allowing the on_lost callback a second to race the answer) the release's
  // OK: libholdfast answers OK without asking when the session counts as lost,
  // and after an unknown outcome when the hold is gone, which a lease expiry
  // explains only once the local deadline has passed. lost_notice names no
  // session; a process has one at a time.
  absl::flat_hash_map<std::string, std::vector<int64_t>> lost_notices;  // by process
  absl::flat_hash_map<int64_t, std::vector<int64_t>> session_lost_seen;
  for (const Event& e : events) {
    if (e.type == "lost_notice") lost_notices[e.p].push_back(e.ts);
    if (e.type == "lost" && e.session_lost) session_lost_seen[e.session].push_back(e.ts);
  }
  auto saw_lost = [&](const Event& release_ok, int64_t since) {
    const int64_t until = release_ok.ts + 1000 * kNanosPerMilli;
    for (int64_t ts : session_lost_seen[release_ok.session]) {
      if (ts >= since && ts <= until) return true;
    }
    for (int64_t ts : lost_notices[release_ok.p]) {
      if (ts >= since && ts <= until) return true;
    }
    return false;
  };
  // Holds the nemesis force-released: each must end in a `force` row at the
  // release's revision.
  std::set<HoldId> forced;
  for (const Event& e : events) {
    if (e.type != "force") continue;
    const HoldId id{a.ns, e.key, e.session, e.token};
    forced.insert(id);
    auto it = holds.find(id);
    const AuditRow* end =
        it == holds.end() || it->second.ends.size() != 1 ? nullptr : it->second.ends.front();
    if (end != nullptr && end->type == "force" && end->revision == e.revision) {
      ++c.history_forces;
    } else if (e.revision <= judged_through) {
      violation(absl::StrCat("the nemesis force-released ", Name(id), " at revision ",
                             e.revision, "; the audit has ",
                             end == nullptr ? "no single end of it"
                                            : absl::StrCat(end->type, " at revision ",
                                                           end->revision)));
    }
  }
  std::set<HoldId> history_grants;
  absl::flat_hash_map<std::string, int64_t> granted_at;  // p/session/key/token -> ts
  absl::flat_hash_map<std::string, int64_t> release_invoked;  // p/op -> ts
  for (const Event& e : events) {
    if (e.type == "acquire_ok") {
      const HoldId id{a.ns, e.key, e.session, e.token};
      granted_at.try_emplace(absl::StrCat(e.p, "/", e.session, "/", e.key, "/", e.token), e.ts);
      if (!history_grants.insert(id).second) continue;  // the same hold, asked again
      auto it = holds.find(id);
      if (it != holds.end() && !it->second.grants.empty()) {
        ++c.history_grants;
      } else if ((e.token & kRevisionMask) <= judged_through) {
        violation(absl::StrCat(e.p, " was granted ", Name(id), " at ", Ms(e.ts),
                               "; the audit has no grant of it"));
      }
    } else if (e.type == "release_invoke") {
      release_invoked[absl::StrCat(e.p, "/", e.op)] = e.ts;
    } else if (e.type == "release_ok") {
      const HoldId id{a.ns, e.key, e.session, e.token};
      auto it = holds.find(id);
      // A missing grant or end is reported above.
      if (it == holds.end() || it->second.ends.size() != 1) continue;
      const AuditRow& end = *it->second.ends.front();
      if (end.type == "release") {
        ++c.history_releases;
        continue;
      }
      if (end.type == "force" && forced.contains(id)) {  // the holder had not noticed yet
        ++c.releases_seen_forced;
        continue;
      }
      auto inv = release_invoked.find(absl::StrCat(e.p, "/", e.op));
      const int64_t from = inv == release_invoked.end() ? e.ts : inv->second;
      auto g = granted_at.find(absl::StrCat(e.p, "/", e.session, "/", e.key, "/", e.token));
      const int64_t since = g == granted_at.end() ? 0 : g->second;
      bool fault = false;
      for (const Window& w : server_faults) fault = fault || (w.start <= e.ts && from <= w.end);
      if (end.type == "expire" && (fault || saw_lost(e, since))) {
        ++c.releases_seen_expired;
        continue;
      }
      violation(absl::StrCat(e.p, " released ", Name(id), " at ", Ms(e.ts),
                             " (release_ok), but the audit recorded ", end.type, " at revision ",
                             end.revision));
    }
  }

  // etcd's own history: one row per change of a hold key, and nothing else.
  if (!a.etcd_present) {
    c.note = absl::StrCat("etcd's history not compared: ", a.etcd_note);
    return;
  }
  if (a.etcd_from_revision > 1) {
    c.note = absl::StrCat("etcd's history compared from revision ", a.etcd_from_revision, " (",
                          a.etcd_note, ")");
  }
  // revision, ns, key, session, is a grant
  using RowKey = std::tuple<int64_t, std::string, std::string, int64_t, bool>;
  std::map<RowKey, std::vector<const AuditRow*>> by_change;
  for (const AuditRow& row : a.rows) {
    by_change[{row.revision, row.ns, row.key, row.session, row.type == "grant"}].push_back(&row);
  }
  std::set<const AuditRow*> matched;
  for (const EtcdHoldChange& ch : a.etcd) {
    if (ch.revision > judged_through) continue;
    const std::string what = ch.created ? "grant" : "end event";
    const std::string change = absl::StrCat(
        "etcd ", ch.created ? "created" : "deleted", " hold key ", ch.ns, "/", ch.key,
        " of session ", ch.session, " at revision ", ch.revision, " (token ", ch.token, ")");
    auto it = by_change.find({ch.revision, ch.ns, ch.key, ch.session, ch.created});
    const AuditRow* row = nullptr;
    if (it != by_change.end()) {
      for (const AuditRow* candidate : it->second) {
        if (!matched.contains(candidate)) {
          row = candidate;
          break;
        }
      }
    }
    if (row == nullptr) {
      violation(absl::StrCat(change, "; the audit has no ", what, " for it"));
      continue;
    }
    matched.insert(row);
    bool ok = true;
    if (row->token != ch.token) {
      ok = false;
      violation(absl::StrCat(change, "; the audit's ", row->type, " has token ", row->token));
    }
    if (!ch.created && row->type != ExpectedEnd(ch.cause)) {
      ok = false;
      violation(absl::StrCat(change, ", ",
                             ch.cause.empty() ? "without an audit mark or a close"
                                              : absl::StrCat("by a ", ch.cause),
                             ": expected ", ExpectedEnd(ch.cause), ", the audit recorded ",
                             row->type));
    }
    if (ok) ++(ch.created ? c.etcd_creations : c.etcd_deletions);
  }
  for (const AuditRow& row : a.rows) {
    if (row.revision < a.etcd_from_revision || matched.contains(&row)) continue;
    violation(absl::StrCat("audit ", row.type, " at revision ", row.revision, " of ",
                           Name(row.ns, row.key, row.session, row.token),
                           " matches no change in etcd's history (an extra row)"));
  }
}

std::string CheckReport::Describe(int max_violations) const {
  std::string out = absl::StrCat(
      "checked: ops=", ops, " grants=", grants, " writes_admitted=", writes_admitted,
      " stale_writes_rejected=", stale_writes_rejected, " token_pairs=", token_pairs_checked,
      " deadlines_checked=", deadlines_checked, " deadlines_skipped=", deadlines_skipped,
      " losts=", losts, " faults=", faults, " forces=", forces,
      " forced_writes_rejected=", forced_writes_rejected,
      " forced_writes_admitted=", forced_writes_admitted, "\n");
  if (audit.checked) {
    absl::StrAppend(&out, "audit: rows=", audit.rows, " audit_grants=", audit.audit_grants,
                    " audit_releases=", audit.audit_releases,
                    " audit_expiries=", audit.audit_expiries, " audit_forces=", audit.audit_forces,
                    " holds=", audit.holds, " history_grants=", audit.history_grants,
                    " history_releases=", audit.history_releases,
                    " releases_seen_expired=", audit.releases_seen_expired,
                    " history_forces=", audit.history_forces,
                    " releases_seen_forced=", audit.releases_seen_forced,
                    " etcd_creations=", audit.etcd_creations,
                    " etcd_deletions=", audit.etcd_deletions, "\n");
  }
  if (!audit.note.empty()) absl::StrAppend(&out, "audit: ", audit.note, "\n");
  int counts[6] = {0, 0, 0, 0, 0, 0};
  for (const Violation& v : violations) {
    if (v.item >= 'a' && v.item <= 'f') ++counts[v.item - 'a'];
  }
  absl::StrAppend(&out, "violations: (a) fence=", counts[0], " (b) interleave=", counts[1],
                  " (c) token_order=", counts[2], " (d) deadline=", counts[3],
                  " (e) lost_is_final=", counts[4], " (f) audit=", counts[5], "\n");
  int shown = 0;
  for (const Violation& v : violations) {
    if (shown++ >= max_violations) {
      absl::StrAppend(&out, "  ... ", violations.size() - max_violations, " more\n");
      break;
    }
    absl::StrAppend(&out, "  VIOLATION (", std::string(1, v.item), ") ", v.message, "\n");
  }
  auto stats = [](std::vector<int64_t> v) -> std::string {
    if (v.empty()) return "-";
    std::sort(v.begin(), v.end());
    return absl::StrCat("p50=", v[v.size() / 2], "ms max=", v.back(), "ms n=", v.size());
  };
  for (const auto& [kind, t] : timings) {
    absl::StrAppend(&out, "timing: ", kind, " faults=", t.count,
                    " time_to_notice[", stats(t.notice_ms), "] time_to_regrant[",
                    stats(t.regrant_ms), "]\n");
  }
  return out;
}

}  // namespace holdfast::chaos
