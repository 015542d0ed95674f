// The checker must be able to fail: hand-made histories with one violation of each
// kind, each reported under its item, and a clean history that passes.
#include "checker.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace holdfast::chaos {
namespace {

constexpr int64_t kT = int64_t{1} << 48;  // epoch 1: token = kT | revision
constexpr int64_t kMs = 1'000'000;

// Builds a history with increasing timestamps (1 ms apart).
class HistoryBuilder {
 public:
  HistoryBuilder& Add(Event e) {
    e.ts = (++step_) * kMs;
    events_.push_back(std::move(e));
    return *this;
  }
  HistoryBuilder& Invoke(const std::string& p, int64_t op, int64_t session,
                         const std::string& key, int64_t wait_ms = 1000, int64_t unix_ms = 0) {
    Event e;
    e.p = p;
    e.type = "acquire_invoke";
    e.op = op;
    e.session = session;
    e.key = key;
    e.wait_ms = wait_ms;
    e.unix_ms = unix_ms;
    return Add(e);
  }
  HistoryBuilder& Grant(const std::string& p, int64_t op, int64_t session,
                        const std::string& key, int64_t token, int64_t granted_unix_ms = 0) {
    Event e;
    e.p = p;
    e.type = "acquire_ok";
    e.op = op;
    e.session = session;
    e.key = key;
    e.token = token;
    e.granted_unix_ms = granted_unix_ms;
    return Add(e);
  }
  HistoryBuilder& Write(const std::string& writer, const std::string& key, int64_t token,
                        bool admitted, bool shared = false) {
    Event e;
    e.p = "register";
    e.type = "write";
    e.writer = writer;
    e.key = key;
    e.token = token;
    e.shared = shared;
    e.verdict = admitted ? "admitted" : "rejected";
    return Add(e);
  }
  HistoryBuilder& Lost(const std::string& p, int64_t session, const std::string& key,
                       int64_t token, bool session_lost) {
    Event e;
    e.p = p;
    e.type = "lost";
    e.session = session;
    e.key = key;
    e.token = token;
    e.session_lost = session_lost;
    return Add(e);
  }
  HistoryBuilder& Fault(const std::string& kind, const std::string& target,
                        const std::string& phase, const std::string& key = "") {
    Event e;
    e.p = "nemesis";
    e.type = "fault";
    e.kind = kind;
    e.target = target;
    e.phase = phase;
    e.key = key;
    return Add(e);
  }
  const std::vector<Event>& events() const { return events_; }

 private:
  int64_t step_ = 0;
  std::vector<Event> events_;
};

int Count(const CheckReport& r, char item) {
  int n = 0;
  for (const Violation& v : r.violations) n += v.item == item ? 1 : 0;
  return n;
}

// Two holders in turn, the first paused past its lease and fenced off.
HistoryBuilder CleanHistory() {
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Grant("c0.0", 1, 100, "k", kT | 10)
      .Write("c0.0", "k", kT | 10, true)
      .Fault("client_pause", "c0.0", "start", "k")
      .Invoke("c1.0", 1, 200, "k")
      .Grant("c1.0", 1, 200, "k", kT | 20)
      .Write("c1.0", "k", kT | 20, true)
      .Fault("client_pause", "c0.0", "end", "k")
      .Write("c0.0", "k", kT | 10, false)
      .Lost("c0.0", 100, "k", kT | 10, true)
      .Write("c1.0", "k", kT | 20, true);
  return h;
}

TEST(CheckerTest, CleanHistoryPassesAndIsCounted) {
  CheckReport r = CheckHistory(CleanHistory().events());
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
  EXPECT_EQ(r.grants, 2);
  EXPECT_EQ(r.stale_writes_rejected, 1);
  EXPECT_EQ(r.writes_admitted, 3);
  EXPECT_EQ(r.faults, 1);
  EXPECT_EQ(r.token_pairs_checked, 1);
  ASSERT_EQ(r.timings.count("client_pause"), 1u);
  EXPECT_EQ(r.timings["client_pause"].regrant_ms.size(), 1u);
  EXPECT_EQ(r.timings["client_pause"].notice_ms.size(), 1u);
}

TEST(CheckerTest, ReportsStaleWriteAdmitted) {  // (a)
  HistoryBuilder h;
  h.Write("c0.0", "k", kT | 20, true).Write("c1.0", "k", kT | 10, true);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'a'), 1) << r.Describe();
}

TEST(CheckerTest, SharedWritesMayComeInAnyOrderButNotBelowAWriter) {  // (a), shared
  HistoryBuilder ok;
  ok.Write("c0.0", "k", kT | 20, true, true).Write("c1.0", "k", kT | 10, true, true);
  EXPECT_TRUE(CheckHistory(ok.events()).violations.empty());
  HistoryBuilder bad;
  bad.Write("c0.0", "k", kT | 30, true).Write("c1.0", "k", kT | 10, true, true);
  EXPECT_EQ(Count(CheckHistory(bad.events()), 'a'), 1);
}

TEST(CheckerTest, ReportsInterleavedExclusiveWrites) {  // (b)
  HistoryBuilder h;
  // Without a fence: 10 writes, 20 writes, then 10 again (its token is lower, so
  // (a) fires too; (b) names the interleaving).
  h.Write("c0.0", "k", kT | 10, true)
      .Write("c1.0", "k", kT | 20, true)
      .Write("c0.0", "k", kT | 10, true);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'b'), 1) << r.Describe();
  EXPECT_EQ(Count(r, 'a'), 1) << r.Describe();
}

TEST(CheckerTest, ReportsTokensOutOfGrantOrder) {  // (c)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Grant("c0.0", 1, 100, "k", kT | 20)
      .Invoke("c1.0", 1, 200, "k")
      .Grant("c1.0", 1, 200, "k", kT | 15);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'c'), 1) << r.Describe();
}

TEST(CheckerTest, ReportsOneTokenGrantedToTwoSessions) {  // (c)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Invoke("c1.0", 1, 200, "k")
      .Grant("c0.0", 1, 100, "k", kT | 20)
      .Grant("c1.0", 1, 200, "k", kT | 20);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'c'), 1) << r.Describe();
}

TEST(CheckerTest, SharedWaitersGrantedTogetherShareAToken) {  // (c)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k").Invoke("c1.0", 1, 200, "k");
  Event a;
  a.p = "c0.0";
  a.type = "acquire_ok";
  a.op = 1;
  a.session = 100;
  a.key = "k";
  a.token = kT | 20;
  a.shared = true;
  Event b = a;
  b.p = "c1.0";
  b.session = 200;
  h.Add(a).Add(b);
  EXPECT_TRUE(CheckHistory(h.events()).violations.empty());
}

TEST(CheckerTest, OverlappingGrantsAreNotOrdered) {  // (c): concurrent acquires
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Invoke("c1.0", 1, 200, "k")
      .Grant("c1.0", 1, 200, "k", kT | 15)
      .Grant("c0.0", 1, 100, "k", kT | 20);
  EXPECT_TRUE(CheckHistory(h.events()).violations.empty());
}

TEST(CheckerTest, ReportsGrantPastTheWaitDeadline) {  // (d)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k", /*wait_ms=*/500, /*unix_ms=*/1'000'000)
      .Grant("c0.0", 1, 100, "k", kT | 20, /*granted_unix_ms=*/1'000'000 + 500 + 2500);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'd'), 1) << r.Describe();
  EXPECT_EQ(r.deadlines_checked, 1);
}

TEST(CheckerTest, DeadlineOfAPausedClientIsNotJudged) {  // (d) skipped
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k", 500, 1'000'000)
      .Fault("client_pause", "c0.0", "start")
      .Fault("client_pause", "c0.0", "end")
      .Grant("c0.0", 1, 100, "k", kT | 20, 1'000'000 + 500 + 2500);
  CheckReport r = CheckHistory(h.events());
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
  EXPECT_EQ(r.deadlines_skipped, 1);
}

TEST(CheckerTest, ReportsGrantOnALostSession) {  // (e)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Grant("c0.0", 1, 100, "k", kT | 10)
      .Lost("c0.0", 100, "k", kT | 10, /*session_lost=*/true)
      .Invoke("c0.0", 2, 100, "j")
      .Grant("c0.0", 2, 100, "j", kT | 30);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'e'), 1) << r.Describe();
}

TEST(CheckerTest, ReportsALostHoldReturnedAgain) {  // (e)
  HistoryBuilder h;
  h.Invoke("c0.0", 1, 100, "k")
      .Grant("c0.0", 1, 100, "k", kT | 10)
      .Lost("c0.0", 100, "k", kT | 10, /*session_lost=*/false)
      .Invoke("c0.0", 2, 100, "k")
      .Grant("c0.0", 2, 100, "k", kT | 10);
  CheckReport r = CheckHistory(h.events());
  EXPECT_EQ(Count(r, 'e'), 1) << r.Describe();
}

// --- (f) audit ----------------------------------------------------------------

// A run's audit: c0.0 (session 100) is granted k at revision 10 and releases it at
// 12; c1.0 (session 200), waiting, is handed k in that commit, and is killed: its
// lease expires at 15; c2.0 (session 300) gets an advisory key at 13 and closes
// its session at 14. etcd's history says the same, and the clients saw it.
struct AuditRun {
  HistoryBuilder history;
  AuditCapture capture;
};

AuditRow Row(int64_t revision, const std::string& key, int64_t session, const std::string& type,
             int64_t token, bool unprotected = false) {
  AuditRow r;
  r.revision = revision;
  r.ns = "default";
  r.key = key;
  r.session = session;
  r.type = type;
  r.token = token;
  r.unprotected = unprotected;
  return r;
}

EtcdHoldChange Change(int64_t revision, const std::string& key, int64_t session, bool created,
                      int64_t token, const std::string& cause = "") {
  EtcdHoldChange c;
  c.revision = revision;
  c.ns = "default";
  c.key = key;
  c.session = session;
  c.created = created;
  c.token = token;
  c.cause = cause;
  return c;
}

AuditRun CleanAuditRun() {
  AuditRun run;
  Event rel;
  rel.p = "c0.0";
  rel.type = "release_invoke";
  rel.op = 2;
  rel.session = 100;
  rel.key = "k";
  rel.token = kT | 10;
  Event rel_ok = rel;
  rel_ok.type = "release_ok";
  run.history.Invoke("c0.0", 1, 100, "k")
      .Grant("c0.0", 1, 100, "k", kT | 10)
      .Invoke("c1.0", 1, 200, "k")
      .Add(rel)
      .Add(rel_ok)
      .Grant("c1.0", 1, 200, "k", kT | 12)
      .Invoke("c2.0", 1, 300, "adv/1")
      .Grant("c2.0", 1, 300, "adv/1", kT | 13)
      .Fault("client_kill", "c1.0", "start", "k")
      .Fault("client_kill", "c1.0", "end", "k");
  AuditCapture& c = run.capture;
  c.present = true;
  c.cursor = 16;
  c.etcd_revision = 16;
  c.sessions_ended = true;
  c.advisory_prefixes = {"adv/"};
  c.rows = {Row(10, "k", 100, "grant", kT | 10),
            Row(12, "k", 100, "release", kT | 10),
            Row(12, "k", 200, "grant", kT | 12),
            Row(13, "adv/1", 300, "grant", kT | 13, true),
            Row(14, "adv/1", 300, "release", kT | 13, true),
            Row(15, "k", 200, "expire", kT | 12)};
  c.etcd_present = true;
  c.etcd = {Change(10, "k", 100, true, kT | 10),
            Change(12, "k", 100, false, kT | 10, "release"),
            Change(12, "k", 200, true, kT | 12),
            Change(13, "adv/1", 300, true, kT | 13),
            Change(14, "adv/1", 300, false, kT | 13, "close"),
            Change(15, "k", 200, false, kT | 12)};
  return run;
}

CheckReport CheckRun(const AuditRun& run) {
  CheckReport r = CheckHistory(run.history.events());
  CheckAudit(run.history.events(), run.capture, r);
  return r;
}

TEST(CheckerTest, AuditMatchingEtcdAndTheHistoryPasses) {  // (f)
  const CheckReport r = CheckRun(CleanAuditRun());
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
  EXPECT_TRUE(r.audit.checked);
  EXPECT_EQ(r.audit.audit_grants, 3);
  EXPECT_EQ(r.audit.audit_releases, 2);
  EXPECT_EQ(r.audit.audit_expiries, 1);
  EXPECT_EQ(r.audit.audit_forces, 0);
  EXPECT_EQ(r.audit.history_grants, 3);
  EXPECT_EQ(r.audit.history_releases, 1);
  EXPECT_EQ(r.audit.etcd_creations, 3);
  EXPECT_EQ(r.audit.etcd_deletions, 3);
  EXPECT_NE(r.Describe().find("audit_grants=3 audit_releases=2 audit_expiries=1 audit_forces=0"),
            std::string::npos)
      << r.Describe();
}

TEST(CheckerTest, AuditNotCapturedIsSaidAndNotJudged) {  // (f)
  CheckReport r = CheckHistory(CleanHistory().events());
  CheckAudit(CleanHistory().events(), AuditCapture{}, r);
  EXPECT_TRUE(r.violations.empty());
  EXPECT_FALSE(r.audit.checked);
  EXPECT_NE(r.Describe().find("audit: not checked"), std::string::npos) << r.Describe();
}

TEST(CheckerTest, ReportsAMissingGrant) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows.erase(run.capture.rows.begin() + 2);  // c1.0's grant at 12
  const CheckReport r = CheckRun(run);
  // The etcd creation, the client's grant, and the hold's end without a grant.
  EXPECT_EQ(Count(r, 'f'), 3) << r.Describe();
  // Without etcd's history, the client history still catches it.
  run.capture.etcd_present = false;
  run.capture.etcd.clear();
  EXPECT_EQ(Count(CheckRun(run), 'f'), 2) << CheckRun(run).Describe();
}

TEST(CheckerTest, ReportsADuplicatedRelease) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows.push_back(Row(16, "k", 100, "release", kT | 10));
  const CheckReport r = CheckRun(run);
  // Ended twice, and an extra row that etcd's history does not have.
  EXPECT_EQ(Count(r, 'f'), 2) << r.Describe();
  EXPECT_NE(r.Describe().find("ended default/k session 100 token"), std::string::npos)
      << r.Describe();
}

TEST(CheckerTest, ReportsAWrongToken) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows[1].token = kT | 11;  // c0.0's release
  const CheckReport r = CheckRun(run);
  EXPECT_GE(Count(r, 'f'), 1) << r.Describe();
  EXPECT_NE(r.Describe().find("the audit's release has token"), std::string::npos)
      << r.Describe();
  // Without etcd, the hold that never ended and the end without a grant show it.
  run.capture.etcd_present = false;
  EXPECT_GE(Count(CheckRun(run), 'f'), 2) << CheckRun(run).Describe();
}

TEST(CheckerTest, ReportsAnExtraRow) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows.push_back(Row(16, "k", 400, "grant", kT | 16));
  run.capture.rows.push_back(Row(16, "k", 400, "expire", kT | 16));
  const CheckReport r = CheckRun(run);
  EXPECT_NE(r.Describe().find("matches no change in etcd's history"), std::string::npos)
      << r.Describe();
  // Both rows are extra, and the expiry is not after its grant.
  EXPECT_EQ(Count(r, 'f'), 3) << r.Describe();
}

TEST(CheckerTest, ReportsAReleaseRecordedAsAnExpiry) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows[1].type = "expire";
  const CheckReport r = CheckRun(run);
  // etcd saw an audit mark; the client saw its release succeed.
  EXPECT_EQ(Count(r, 'f'), 2) << r.Describe();
  // An expiry recorded for a kill (no mark, no close) is right; a release is not.
  AuditRun expire = CleanAuditRun();
  expire.capture.rows[5].type = "release";
  EXPECT_EQ(Count(CheckRun(expire), 'f'), 1) << CheckRun(expire).Describe();
}

TEST(CheckerTest, AReleaseOnASessionSeenLostMayHaveExpired) {  // (f)
  // libholdfast answers OK for a release on a session it counts as lost: the
  // lease then expires. The client's history shows why; etcd agrees.
  AuditRun run = CleanAuditRun();
  run.capture.rows[1].type = "expire";
  run.capture.etcd[1].cause = "";
  Event notice;
  notice.p = "c0.0";
  notice.type = "lost_notice";
  run.history.Add(notice);
  const CheckReport r = CheckRun(run);
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
  EXPECT_EQ(r.audit.releases_seen_expired, 1);
}

TEST(CheckerTest, ASessionSeenLostLaterExcusesNothing) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows[1].type = "expire";
  run.capture.etcd[1].cause = "";
  // More than a second after the release's OK (1 ms a step): not its cause.
  Event idle;
  idle.p = "register";
  idle.type = "idle";
  for (int i = 0; i < 2000; ++i) run.history.Add(idle);
  Event notice;
  notice.p = "c0.0";
  notice.type = "lost_notice";
  run.history.Add(notice);
  const CheckReport r = CheckRun(run);
  EXPECT_EQ(Count(r, 'f'), 1) << r.Describe();
  EXPECT_EQ(r.audit.releases_seen_expired, 0);
}

TEST(CheckerTest, ReportsAHoldThatNeverEnded) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows.pop_back();  // c1.0's expiry
  EXPECT_EQ(Count(CheckRun(run), 'f'), 2) << CheckRun(run).Describe();  // etcd's deletion too
}

TEST(CheckerTest, ReportsTheAuditFallingBehind) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.cursor = 12;  // rows after 12 were not written yet
  run.capture.waited_ms = 60000;
  run.capture.rows.resize(3);
  const CheckReport r = CheckRun(run);
  EXPECT_EQ(Count(r, 'f'), 1) << r.Describe();  // only the lag: later revisions are not judged
  EXPECT_NE(r.Describe().find("the audit fell behind"), std::string::npos) << r.Describe();
}

TEST(CheckerTest, ReportsAWrongUnprotectedFlag) {  // (f)
  AuditRun run = CleanAuditRun();
  run.capture.rows[3].unprotected = false;  // adv/1's grant
  EXPECT_EQ(Count(CheckRun(run), 'f'), 1) << CheckRun(run).Describe();
}

// c1.0's hold of k (session 200, token kT|12), force-released by the nemesis at
// revision 15 instead of expiring; c1.0 then writes with its old token once
// (admitted: nobody newer wrote yet) and once after c3.0's newer write (rejected).
AuditRun ForcedAuditRun() {
  AuditRun run = CleanAuditRun();
  Event force;
  force.p = "nemesis";
  force.type = "force";
  force.target = "c1.0";
  force.key = "k";
  force.session = 200;
  force.token = kT | 12;
  force.revision = 15;
  run.history.Add(force)
      .Write("c1.0", "k", kT | 12, true)
      .Write("c3.0", "k", kT | 16, true)
      .Write("c1.0", "k", kT | 12, false);
  run.capture.rows[5].type = "force";
  run.capture.etcd[5].cause = "force";
  return run;
}

TEST(CheckerTest, AForceInTheAuditAtItsRevisionPasses) {  // (f)
  const CheckReport r = CheckRun(ForcedAuditRun());
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
  EXPECT_EQ(r.forces, 1);
  EXPECT_EQ(r.audit.history_forces, 1);
  EXPECT_EQ(r.forced_writes_admitted, 1);
  EXPECT_EQ(r.forced_writes_rejected, 1);
  const auto forced = ForcedAuditRun();  // (a temporary would end before the loop)
  for (const Event& e : forced.history.events()) {  // revision survives a file
    if (e.type != "force") continue;
    auto back = EventFromJson(EventToJson(e));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->revision, 15);
    EXPECT_EQ(back->session, 200);
  }
}

TEST(CheckerTest, ReportsAForceTheAuditRecordedOtherwise) {  // (f)
  AuditRun expired = ForcedAuditRun();  // the audit (and etcd) saw an expiry
  expired.capture.rows[5].type = "expire";
  expired.capture.etcd[5].cause = "";
  EXPECT_EQ(Count(CheckRun(expired), 'f'), 1) << CheckRun(expired).Describe();
  AuditRun elsewhere = ForcedAuditRun();  // a force, but not the nemesis's revision
  elsewhere.capture.rows[5].revision = 17;
  elsewhere.capture.etcd[5].revision = 17;
  elsewhere.capture.cursor = elsewhere.capture.etcd_revision = 17;
  EXPECT_EQ(Count(CheckRun(elsewhere), 'f'), 1) << CheckRun(elsewhere).Describe();
}

TEST(CheckerTest, ReportsAForcedHoldReturnedAgain) {  // (e)
  AuditRun run = ForcedAuditRun();
  run.history.Grant("c1.0", 2, 200, "k", kT | 12);
  EXPECT_EQ(Count(CheckRun(run), 'e'), 1) << CheckRun(run).Describe();
}

TEST(CheckerTest, ReportsAForcedHoldsWriteAfterANewerOne) {  // (a)
  AuditRun run = ForcedAuditRun();
  run.history.Write("c1.0", "k", kT | 12, true);  // admitted after kT|16: stale
  const CheckReport r = CheckRun(run);
  EXPECT_EQ(Count(r, 'a'), 1) << r.Describe();
}

TEST(CheckerTest, AuditCaptureRoundTrips) {
  const AuditCapture c = CleanAuditRun().capture;
  const std::string path = ::testing::TempDir() + "/audit_capture_test.jsonl";
  ASSERT_TRUE(WriteAuditCapture(path, c).ok());
  auto back = ReadAuditCapture(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rows.size(), c.rows.size());
  EXPECT_EQ(back->etcd.size(), c.etcd.size());
  EXPECT_EQ(back->cursor, c.cursor);
  EXPECT_EQ(back->etcd[1].cause, "release");
  EXPECT_EQ(back->rows[3].unprotected, true);
  const AuditRun run = CleanAuditRun();
  CheckReport r = CheckHistory(run.history.events());
  CheckAudit(run.history.events(), *back, r);
  EXPECT_TRUE(r.violations.empty()) << r.Describe();
}

TEST(CheckerTest, HistoryLinesRoundTrip) {
  const HistoryBuilder h = CleanHistory();
  for (const Event& e : h.events()) {
    auto back = EventFromJson(EventToJson(e));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(EventToJson(*back), EventToJson(e));
  }
  EXPECT_FALSE(EventFromJson("{\"ts\":1").ok());
}

}  // namespace
}  // namespace holdfast::chaos
