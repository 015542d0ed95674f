// The checker must be able to fail: hand-made histories with one violation of each
// kind, each reported under its item, and a clean history that passes.
#include "checker.h"

#include <gtest/gtest.h>

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
