#include "audit/classify.h"

#include <gtest/gtest.h>

#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/token.h"

namespace holdfast::audit {
namespace {

constexpr uint64_t kCluster = 0xfeedfacecafebeefULL;

mvccpb::Event HoldPut(const std::string& ns, const std::string& key, int64_t lease, int64_t rev,
                      const std::string& who, bool advisory = false, int32_t epoch = 1) {
  records::HoldRecord rec;
  rec.set_identity(who);
  rec.set_epoch(epoch);
  rec.set_advisory(advisory);
  rec.set_granted_at_unix_ms(1000 + rev);
  mvccpb::Event e;
  e.set_type(mvccpb::Event::PUT);
  e.mutable_kv()->set_key(keyspace::HoldKey(ns, key, lease));
  e.mutable_kv()->set_value(rec.SerializeAsString());
  e.mutable_kv()->set_create_revision(rev);
  e.mutable_kv()->set_mod_revision(rev);
  return e;
}

mvccpb::Event HoldDelete(const std::string& ns, const std::string& key, int64_t lease,
                         int64_t grant_rev, int64_t rev, const std::string& who,
                         bool advisory = false) {
  mvccpb::Event e = HoldPut(ns, key, lease, grant_rev, who, advisory);
  *e.mutable_prev_kv() = e.kv();
  e.set_type(mvccpb::Event::DELETE);
  e.mutable_kv()->clear_value();
  e.mutable_kv()->set_create_revision(0);
  e.mutable_kv()->set_mod_revision(rev);
  return e;
}

mvccpb::Event Mark(int64_t rev, records::AuditMark mark) {
  mvccpb::Event e;
  e.set_type(mvccpb::Event::PUT);
  e.mutable_kv()->set_key(keyspace::AuditMarkKey());
  e.mutable_kv()->set_value(mark.SerializeAsString());
  e.mutable_kv()->set_mod_revision(rev);
  return e;
}

mvccpb::Event SessionDelete(const std::string& ns, int64_t lease, int64_t rev, bool closing) {
  records::SessionRecord rec;
  rec.set_identity("spiffe://t/a");
  rec.set_closing(closing);
  mvccpb::Event e;
  e.set_type(mvccpb::Event::DELETE);
  e.mutable_kv()->set_key(keyspace::SessionKey(ns, lease));
  e.mutable_kv()->set_mod_revision(rev);
  e.mutable_prev_kv()->set_key(keyspace::SessionKey(ns, lease));
  e.mutable_prev_kv()->set_value(rec.SerializeAsString());
  return e;
}

int64_t Token(int64_t rev) { return token::Make(1, rev).value(); }

TEST(ClassifyTest, CreatedHoldIsAGrantWithItsToken) {
  auto c = Classify(kCluster, {HoldPut("ns", "db", 7, 10, "spiffe://t/a")}, 5);
  ASSERT_EQ(c.events.size(), 1u);
  const AuditEvent& e = c.events[0];
  EXPECT_EQ(e.type, EventType::kGrant);
  EXPECT_EQ(e.cluster_id, kCluster);
  EXPECT_EQ(e.revision, 10);
  EXPECT_EQ(e.ns, "ns");
  EXPECT_EQ(e.lock_key, "db");
  EXPECT_EQ(e.session_id, 7);
  EXPECT_EQ(e.spiffe_id, "spiffe://t/a");
  EXPECT_EQ(e.token, Token(10));
  EXPECT_FALSE(e.unprotected);
  EXPECT_EQ(e.time_unix_ms, 1010);
  EXPECT_EQ(c.last_revision, 10);
}

TEST(ClassifyTest, DeletionWithAReleaseMarkIsARelease_MarkMayComeAfter) {
  records::AuditMark mark;
  mark.set_kind("release");
  mark.set_at_unix_ms(777);
  auto c = Classify(kCluster, {HoldDelete("ns", "db", 7, 10, 12, "spiffe://t/a"), Mark(12, mark)},
                    5);
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].type, EventType::kRelease);
  EXPECT_EQ(c.events[0].token, Token(10));
  EXPECT_EQ(c.events[0].revision, 12);
  EXPECT_EQ(c.events[0].time_unix_ms, 777);
  EXPECT_TRUE(c.forces.empty());
}

TEST(ClassifyTest, HandOverIsAReleaseAndAGrantInOneRevision) {
  records::AuditMark mark;
  mark.set_kind("release");
  auto c = Classify(kCluster,
                    {HoldDelete("ns", "db", 7, 10, 20, "spiffe://t/a"),
                     HoldPut("ns", "db", 8, 20, "spiffe://t/b"), Mark(20, mark)},
                    5);
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[0].type, EventType::kRelease);
  EXPECT_EQ(c.events[0].session_id, 7);
  EXPECT_EQ(c.events[1].type, EventType::kGrant);
  EXPECT_EQ(c.events[1].session_id, 8);
  EXPECT_EQ(c.events[1].token, Token(20));
}

TEST(ClassifyTest, BareDeletionIsAnExpiryAndOneRevisionCanEndManyHolds) {
  auto c = Classify(kCluster,
                    {SessionDelete("ns", 7, 30, false), HoldDelete("ns", "a", 7, 10, 30, "x"),
                     HoldDelete("ns", "b", 7, 11, 30, "x")},
                    999);
  ASSERT_EQ(c.events.size(), 2u);
  for (const auto& e : c.events) {
    EXPECT_EQ(e.type, EventType::kExpire);
    EXPECT_EQ(e.revision, 30);
    EXPECT_EQ(e.time_unix_ms, 999);
  }
  EXPECT_EQ(c.events[0].lock_key, "a");
  EXPECT_EQ(c.events[1].lock_key, "b");
}

TEST(ClassifyTest, HoldsEndedByAClosingSessionAreReleases) {
  auto c = Classify(kCluster,
                    {SessionDelete("ns", 7, 30, true), HoldDelete("ns", "a", 7, 10, 30, "x"),
                     // another session's hold in the same revision is not covered
                     HoldDelete("ns", "b", 9, 11, 30, "y")},
                    5);
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[0].type, EventType::kRelease);
  EXPECT_EQ(c.events[1].type, EventType::kExpire);
}

TEST(ClassifyTest, ForceMarkMakesAForceEventAndAForceReleaseRow) {
  records::AuditMark mark;
  mark.set_kind("force");
  mark.set_request_id("00000000000000ab");
  mark.set_requester("spiffe://t/ops/alice");
  mark.set_approver("spiffe://t/ops/bob");
  mark.set_reason("stuck job");
  mark.set_class_was_fenced(false);
  mark.set_at_unix_ms(4242);
  auto c = Classify(kCluster, {HoldDelete("ns", "db", 7, 10, 40, "x", /*advisory=*/true),
                               Mark(40, mark)},
                    5);
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].type, EventType::kForce);
  EXPECT_TRUE(c.events[0].unprotected);
  ASSERT_EQ(c.forces.size(), 1u);
  const ForceReleaseRow& f = c.forces[0];
  EXPECT_EQ(f.request_id, "00000000000000ab");
  EXPECT_EQ(f.revision, 40);
  EXPECT_EQ(f.cluster_id, kCluster);
  EXPECT_EQ(f.requester, "spiffe://t/ops/alice");
  EXPECT_EQ(f.approver, "spiffe://t/ops/bob");
  EXPECT_EQ(f.reason, "stuck job");
  EXPECT_FALSE(f.class_was_fenced);
  EXPECT_EQ(f.token, Token(10));
  EXPECT_EQ(f.approved_at_unix_ms, 4242);
}

TEST(ClassifyTest, MarkOfOneRevisionDoesNotCoverAnother) {
  records::AuditMark mark;
  mark.set_kind("release");
  auto c = Classify(kCluster,
                    {Mark(50, mark), HoldDelete("ns", "a", 7, 10, 50, "x"),
                     HoldDelete("ns", "b", 8, 11, 51, "y")},
                    5);
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[0].type, EventType::kRelease);
  EXPECT_EQ(c.events[1].type, EventType::kExpire);
  EXPECT_EQ(c.last_revision, 51);
}

TEST(ClassifyTest, OtherKeysAndWaitersAreIgnored) {
  mvccpb::Event waiter = HoldPut("ns", "db", 7, 10, "x");
  waiter.mutable_kv()->set_key(keyspace::WaitKey("ns", "db", 7));
  auto c = Classify(kCluster, {waiter, SessionDelete("ns", 7, 11, false)}, 5);
  EXPECT_TRUE(c.events.empty());
  EXPECT_EQ(c.last_revision, 11);
}

TEST(ClassifyTest, DeletionWithoutPreviousValueIsStillRecorded) {
  mvccpb::Event e = HoldDelete("ns", "db", 7, 10, 12, "x");
  e.clear_prev_kv();
  auto c = Classify(kCluster, {e}, 5);
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].type, EventType::kExpire);
  EXPECT_EQ(c.events[0].token, 0);
  EXPECT_EQ(c.malformed, 1);
}

// A created hold whose record does not parse is a grant all the same: the trail
// has it, without holder or token, at the auditor's time.
TEST(ClassifyTest, AGrantWithAnUnreadableRecordIsStillRecorded) {
  mvccpb::Event e = HoldPut("ns", "db", 7, 10, "x");
  e.mutable_kv()->set_value("\xff\xff not a record");
  auto c = Classify(kCluster, {e}, 5);
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].type, EventType::kGrant);
  EXPECT_EQ(c.events[0].revision, 10);
  EXPECT_EQ(c.events[0].lock_key, "db");
  EXPECT_EQ(c.events[0].session_id, 7);
  EXPECT_EQ(c.events[0].token, 0);
  EXPECT_EQ(c.events[0].spiffe_id, "");
  EXPECT_EQ(c.events[0].time_unix_ms, 5);
  EXPECT_EQ(c.malformed, 1);
}

}  // namespace
}  // namespace holdfast::audit
