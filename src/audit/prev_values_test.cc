// PrevValues without a server: deletions get the value of the put the walk saw,
// else one lookup at the revision before; a retried walk changes nothing; a
// compacted value is counted and left out, any other lookup error stops the walk.
// End to end: tests/audit_test.cc (a hold granted before a new auditor's term and
// released in it) and the chaos suite's audit check.
#include "audit/prev_values.h"

#include <gtest/gtest.h>

#include "audit/classify.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/token.h"

namespace holdfast::audit {
namespace {

mvccpb::Event Put(const std::string& key, int64_t create_rev, int64_t rev, std::string value) {
  mvccpb::Event e;
  e.set_type(mvccpb::Event::PUT);
  e.mutable_kv()->set_key(key);
  e.mutable_kv()->set_value(std::move(value));
  e.mutable_kv()->set_create_revision(create_rev);
  e.mutable_kv()->set_mod_revision(rev);
  return e;
}

mvccpb::Event Delete(const std::string& key, int64_t rev) {
  mvccpb::Event e;
  e.set_type(mvccpb::Event::DELETE);
  e.mutable_kv()->set_key(key);
  e.mutable_kv()->set_mod_revision(rev);
  return e;
}

std::string HoldValue(const std::string& who) {
  records::HoldRecord rec;
  rec.set_identity(who);
  rec.set_epoch(1);
  return rec.SerializeAsString();
}

struct CountingLookup {
  std::vector<std::pair<std::string, int64_t>> asked;
  absl::StatusOr<std::optional<mvccpb::KeyValue>> answer = std::optional<mvccpb::KeyValue>();
  PrevValues::Lookup fn() {
    return [this](const std::string& key, int64_t rev) {
      asked.emplace_back(key, rev);
      return answer;
    };
  }
};

const std::string kHold = keyspace::HoldKey("ns", "db", 7);
const std::string kSession = keyspace::SessionKey("ns", 7);
const std::string kWaiter = keyspace::WaitKey("ns", "db", 7);

TEST(PrevValuesTest, ADeletionGetsTheValueOfThePutSeenWithoutALookup) {
  PrevValues prev;
  CountingLookup lookup;
  std::vector<mvccpb::Event> events = {Put(kHold, 10, 10, HoldValue("spiffe://t/a")),
                                       Put(kWaiter, 11, 11, "w"), Delete(kWaiter, 12)};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  EXPECT_EQ(prev.size(), 1u);  // the hold; waiters are not kept
  std::vector<mvccpb::Event> later = {Delete(kHold, 20)};
  ASSERT_TRUE(prev.Fill(&later, lookup.fn()).ok());
  EXPECT_TRUE(lookup.asked.empty());
  ASSERT_TRUE(later[0].has_prev_kv());
  EXPECT_EQ(later[0].prev_kv().create_revision(), 10);
  EXPECT_EQ(prev.size(), 0u);
  EXPECT_FALSE(events[2].has_prev_kv());  // a waiter's deletion needs none

  // Classify reads the token and holder from it, as from etcd's prev_kv.
  Classified c = Classify(1, later, 5000);
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.malformed, 0);
  EXPECT_EQ(c.events[0].token, *token::Make(1, 10));
  EXPECT_EQ(c.events[0].spiffe_id, "spiffe://t/a");
}

TEST(PrevValuesTest, AKeyPutBeforeTheWalkIsLookedUpAtTheRevisionBeforeItsDeletion) {
  PrevValues prev;
  CountingLookup lookup;
  mvccpb::KeyValue old = Put(kHold, 4, 4, HoldValue("spiffe://t/b")).kv();
  lookup.answer = std::optional<mvccpb::KeyValue>(old);
  std::vector<mvccpb::Event> events = {Delete(kHold, 30), Delete(kSession, 30)};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  ASSERT_EQ(lookup.asked.size(), 2u);
  EXPECT_EQ(lookup.asked[0], std::make_pair(kHold, int64_t{29}));
  EXPECT_EQ(lookup.asked[1], std::make_pair(kSession, int64_t{29}));
  EXPECT_EQ(events[0].prev_kv().create_revision(), 4);
  EXPECT_EQ(prev.lookups(), 2);
}

TEST(PrevValuesTest, AWalkRetriedOnTheSameEventsChangesNothingMore) {
  PrevValues prev;
  CountingLookup lookup;
  lookup.answer = std::optional<mvccpb::KeyValue>(Put(kHold, 4, 4, HoldValue("x")).kv());
  std::vector<mvccpb::Event> events = {Delete(kHold, 8), Put(kHold, 9, 9, HoldValue("y")),
                                       Put(kSession, 9, 9, "s")};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  EXPECT_EQ(lookup.asked.size(), 1u);
  EXPECT_EQ(events[0].prev_kv().create_revision(), 4);
  EXPECT_EQ(prev.size(), 1u);  // the hold (the session is not closing)
  std::vector<mvccpb::Event> later = {Delete(kHold, 12)};
  ASSERT_TRUE(prev.Fill(&later, lookup.fn()).ok());
  EXPECT_EQ(later[0].prev_kv().create_revision(), 9);
  EXPECT_EQ(lookup.asked.size(), 1u);
}

TEST(PrevValuesTest, ACompactedValueIsLeftOutAndAnyOtherErrorStopsTheWalk) {
  PrevValues prev;
  CountingLookup lookup;
  lookup.answer = absl::OutOfRangeError("mvcc: required revision has been compacted");
  std::vector<mvccpb::Event> events = {Delete(kHold, 8)};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  EXPECT_FALSE(events[0].has_prev_kv());
  EXPECT_EQ(prev.lost(), 1);

  lookup.answer = absl::UnavailableError("etcd down");
  std::vector<mvccpb::Event> more = {Delete(keyspace::HoldKey("ns", "q", 9), 20),
                                     Put(kHold, 21, 21, HoldValue("z"))};
  auto s = prev.Fill(&more, lookup.fn());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(more[0].has_prev_kv());
  EXPECT_EQ(prev.size(), 0u);  // stopped before the put
  lookup.answer = std::optional<mvccpb::KeyValue>(Put(keyspace::HoldKey("ns", "q", 9), 3, 3,
                                                       HoldValue("q")).kv());
  ASSERT_TRUE(prev.Fill(&more, lookup.fn()).ok());
  EXPECT_EQ(more[0].prev_kv().create_revision(), 3);
  EXPECT_EQ(prev.size(), 1u);
}

std::string SessionValue(bool closing) {
  records::SessionRecord rec;
  rec.set_identity("spiffe://t/a");
  rec.set_closing(closing);
  return rec.SerializeAsString();
}

// A session closed on purpose deletes its holds with its key, whose last value
// says `closing`: Classify records those as releases, the others as expiries.
TEST(PrevValuesTest, ASessionsClosingFlagDecidesReleaseOrExpiry) {
  PrevValues prev;
  CountingLookup lookup;
  const std::string other_hold = keyspace::HoldKey("ns", "db2", 8);
  const std::string other_session = keyspace::SessionKey("ns", 8);
  std::vector<mvccpb::Event> events = {
      Put(kSession, 5, 5, SessionValue(false)),       Put(other_session, 6, 6, SessionValue(false)),
      Put(kHold, 10, 10, HoldValue("spiffe://t/a")),  Put(other_hold, 11, 11, HoldValue("b")),
      Put(kSession, 5, 12, SessionValue(true)),  // marked closing
      Delete(kHold, 13),  Delete(kSession, 13),  // closed
      Delete(other_hold, 14), Delete(other_session, 14)};  // expired
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  // Only the expired session is read (sessions not closing are not kept).
  ASSERT_EQ(lookup.asked.size(), 1u);
  EXPECT_EQ(lookup.asked[0], std::make_pair(other_session, int64_t{13}));
  EXPECT_EQ(prev.size(), 0u);
  Classified c = Classify(1, events, 5000);
  ASSERT_EQ(c.events.size(), 4u);
  EXPECT_EQ(c.malformed, 0);
  EXPECT_EQ(c.events[2].type, EventType::kRelease);
  EXPECT_EQ(c.events[2].token, *token::Make(1, 10));
  EXPECT_EQ(c.events[3].type, EventType::kExpire);
  EXPECT_EQ(c.events[3].token, *token::Make(1, 11));
}

TEST(PrevValuesTest, ASessionDeletionThatEndsNoHoldNeedsNoValue) {
  PrevValues prev;
  CountingLookup lookup;
  std::vector<mvccpb::Event> events = {Put(kSession, 5, 5, SessionValue(false)),
                                       Delete(kSession, 9),
                                       Delete(keyspace::SessionKey("ns", 8), 9)};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  EXPECT_TRUE(lookup.asked.empty());
  EXPECT_FALSE(events[1].has_prev_kv());
  EXPECT_FALSE(events[2].has_prev_kv());
  EXPECT_EQ(prev.size(), 0u);
}

TEST(PrevValuesTest, AHoldsMetadataIsNotKept) {
  PrevValues prev;
  CountingLookup lookup;
  records::HoldRecord rec;
  rec.set_identity("spiffe://t/a");
  rec.set_epoch(3);
  rec.set_advisory(true);
  rec.set_holder_meta(std::string(1000, 'm'));
  std::vector<mvccpb::Event> events = {Put(kHold, 10, 10, rec.SerializeAsString()),
                                       Delete(kHold, 11)};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  records::HoldRecord kept;
  ASSERT_TRUE(kept.ParseFromString(events[1].prev_kv().value()));
  EXPECT_EQ(kept.identity(), "spiffe://t/a");
  EXPECT_EQ(kept.epoch(), 3);
  EXPECT_TRUE(kept.advisory());
  EXPECT_TRUE(kept.holder_meta().empty());
}

TEST(PrevValuesTest, ClearForgetsWhatWasSeen) {
  PrevValues prev;
  CountingLookup lookup;
  std::vector<mvccpb::Event> events = {Put(kHold, 10, 10, HoldValue("a"))};
  ASSERT_TRUE(prev.Fill(&events, lookup.fn()).ok());
  prev.Clear();
  std::vector<mvccpb::Event> later = {Delete(kHold, 20)};
  ASSERT_TRUE(prev.Fill(&later, lookup.fn()).ok());
  EXPECT_EQ(lookup.asked.size(), 1u);
}

}  // namespace
}  // namespace holdfast::audit
