#include "lock/keyspace.h"

#include <gtest/gtest.h>

#include "common/names.h"

namespace holdfast::keyspace {
namespace {

using std::string_literals::operator""s;

// Golden: these bytes are persisted. A change here needs a migration.
TEST(KeyspaceTest, GoldenEncoding) {
  EXPECT_EQ(EpochKey(), "/holdfast/epoch");
  EXPECT_EQ(RestoreRefusalKey(), "/holdfast/restore-refusal");
  EXPECT_EQ(AuditMarkKey(), "/holdfast/audit/mark");
  EXPECT_EQ(AuditorKey(), "/holdfast/audit/leader");
  EXPECT_EQ(ForceRequestKey("00ab"), "/holdfast/force/00ab");
  EXPECT_EQ(ReplicaKey(0x694d7f2a1b3c4d5e), "/holdfast/replica/694d7f2a1b3c4d5e");
  EXPECT_EQ(ReplicaPrefix(), "/holdfast/replica/");
  EXPECT_EQ(ParseReplicaKey(ReplicaKey(0x7fffffffffffffff)), 0x7fffffffffffffff);
  EXPECT_FALSE(ParseReplicaKey("/holdfast/replica/xyz").has_value());
  EXPECT_FALSE(ParseReplicaKey(SessionKey("n", 1)).has_value());
  EXPECT_EQ(PlacementKey("payments"), "/holdfast/placement/payments");
  EXPECT_EQ(PlacementPrefix(), "/holdfast/placement/");
  EXPECT_EQ(WaitPrefix("payments"), "/holdfast/ns/payments/wait/");
  EXPECT_EQ(ParsePlacementKey(PlacementKey("a.b-c")), "a.b-c");
  EXPECT_FALSE(ParsePlacementKey("/holdfast/placement/A/b").has_value());
  EXPECT_FALSE(ParsePlacementKey(NamespaceKey("n")).has_value());
  EXPECT_EQ(NamespaceKey("payments"), "/holdfast/ns/payments");
  EXPECT_EQ(ClassKey("payments", "db"), "/holdfast/ns/payments/class/db");
  EXPECT_EQ(SessionKey("payments", 0x694d7f2a1b3c4d5e), "/holdfast/ns/payments/session/694d7f2a1b3c4d5e");
  EXPECT_EQ(HoldKey("payments", "db/primary", 0x1f),
            "/holdfast/ns/payments/hold/db/primary"s + '\0' + "000000000000001f");
  EXPECT_EQ(HoldRangeBegin("p", "a"), "/holdfast/ns/p/hold/a\0"s);
  EXPECT_EQ(HoldRangeEnd("p", "a"), "/holdfast/ns/p/hold/a\1"s);
  EXPECT_EQ(WaitKey("p", "a", 2), "/holdfast/ns/p/wait/a"s + '\0' + "0000000000000002");
  EXPECT_EQ(SlotKey("p", 7), "/holdfast/ns/p/slot/00000007");
  EXPECT_EQ(ParseSlotKey(SlotKey("p", 123), "p"), 123);
  EXPECT_EQ(ClaimKey("p", "db/primary", 0x1f), "/holdfast/ns/p/claim/000000000000001f/db/primary");
  EXPECT_EQ(ClaimPrefix("p", 0x1f), "/holdfast/ns/p/claim/000000000000001f/");
  // A claim is none of the keys the engine and the auditor parse.
  EXPECT_FALSE(ParseHoldKey(ClaimKey("p", "a", 2)).has_value());
  EXPECT_FALSE(ParseWaitKey(ClaimKey("p", "a", 2)).has_value());
  EXPECT_FALSE(ParseSessionKey(ClaimKey("p", "a", 2), "p").has_value());
}

bool InRange(const std::string& k, const std::string& begin, const std::string& end) {
  return k >= begin && k < end;
}

TEST(KeyspaceTest, LockKeyAAndABNeverShareARange) {
  const std::string a_begin = HoldRangeBegin("ns", "a"), a_end = HoldRangeEnd("ns", "a");
  for (const char* other : {"a/b", "a0", "a ", "ab", "a\x7e", "a\xc3\xa9", "b"}) {
    EXPECT_FALSE(InRange(HoldKey("ns", other, 1), a_begin, a_end)) << other;
    EXPECT_FALSE(InRange(HoldKey("ns", "a", 1), HoldRangeBegin("ns", other),
                         HoldRangeEnd("ns", other)))
        << other;
  }
  EXPECT_TRUE(InRange(HoldKey("ns", "a", 1), a_begin, a_end));
  EXPECT_TRUE(InRange(HoldKey("ns", "a", -1), a_begin, a_end));  // any lease
}

TEST(KeyspaceTest, HoldKeysRoundTripWithOddBytes) {
  for (std::string key : {"a", "a/b", "with space", "日本/ロック", "%00", "semi;colon", "x\xf0\x9f\x94\x92"}) {
    auto parsed = ParseHoldKey(HoldKey("t-1", key, 0x7fffffffffffffff));
    ASSERT_TRUE(parsed.has_value()) << key;
    EXPECT_EQ(parsed->ns, "t-1");
    EXPECT_EQ(parsed->lock_key, key);
    EXPECT_EQ(parsed->lease, 0x7fffffffffffffff);
  }
}

TEST(KeyspaceTest, ValidatesLockKeys) {
  EXPECT_TRUE(ValidateLockKey("jobs/nightly").ok());
  EXPECT_TRUE(ValidateLockKey("日本").ok());
  EXPECT_TRUE(ValidateLockKey(std::string(kMaxLockKeyBytes, 'k')).ok());
  struct Case {
    std::string key;
    std::string reason;
  } cases[] = {
      {"", "lock key is empty"},
      {std::string(kMaxLockKeyBytes + 1, 'k'), "lock key is 513 bytes; at most 512"},
      {"a\0b"s, "control character (U+0000) at byte 1"},
      {"a\nb", "control character (U+000A)"},
      {"a\x7f", "control character (U+007F)"},
      {"\xc2\x85", "control character (U+0085)"},
      {"\xff", "not valid UTF-8 at byte 0"},
      {"ok\xc3", "not valid UTF-8 at byte 2"},
      {"\xc0\xaf", "not valid UTF-8"},       // overlong '/'
      {"\xed\xa0\x80", "not valid UTF-8"},   // surrogate
  };
  for (const auto& c : cases) {
    auto s = ValidateLockKey(c.key);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.reason;
    EXPECT_NE(s.message().find(c.reason), std::string::npos) << s.message();
  }
}

TEST(KeyspaceTest, ValidatesNames) {
  EXPECT_TRUE(ValidateNamespaceName("default").ok());
  EXPECT_TRUE(ValidateNamespaceName("team-a.prod_1").ok());
  for (const char* bad : {"", "Upper", "-lead", "has/slash", "sp ace", "a\n"}) {
    auto s = ValidateNamespaceName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ValidateNamespaceName(std::string(64, 'a')).message().find("at most 63"),
            std::string::npos);
  EXPECT_TRUE(ValidateKeyPrefix("").ok());
  EXPECT_FALSE(ValidateKeyPrefix("\x01").ok());
}

// Free text (a tenant id, a force reason) is any UTF-8 a table can show.
TEST(KeyspaceTest, PlainTextIsUtf8WithoutControlCharacters) {
  EXPECT_TRUE(names::ValidatePlainText("tenant_id", "").ok());
  EXPECT_TRUE(names::ValidatePlainText("tenant_id", "Team Ä, 日本 (prod)").ok());
  EXPECT_EQ(names::ValidatePlainText("tenant_id", "a\x1b[2J").message(),
            "tenant_id contains control character U+001B at byte 1: use plain text");
  EXPECT_EQ(names::ValidatePlainText("the reason", "\0"s).message(),
            "the reason contains control character U+0000 at byte 0: use plain text");
  EXPECT_EQ(names::ValidatePlainText("the reason", "ok\x7f").message(),
            "the reason contains control character U+007F at byte 2: use plain text");
  // C1: U+009B is a one-character CSI to terminals that take 8-bit controls.
  EXPECT_EQ(names::ValidatePlainText("tenant_id", "ab\xc2\x9b" "2J").message(),
            "tenant_id contains control character U+009B at byte 2: use plain text");
  EXPECT_EQ(names::ValidatePlainText("tenant_id", "ok\xff").message(),
            "tenant_id is not valid UTF-8 at byte 2");
}

TEST(KeyspaceTest, PrefixEnd) {
  EXPECT_EQ(PrefixEnd("/holdfast/ns/"), "/holdfast/ns0");
  EXPECT_EQ(PrefixEnd("a\xff"), "b");
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

TEST(KeyspaceTest, ParsesSessionAndClassKeys) {
  EXPECT_EQ(ParseSessionKey(SessionKey("n", 42), "n"), 42);
  EXPECT_FALSE(ParseSessionKey("/holdfast/ns/n/session/xyz", "n").has_value());
  EXPECT_EQ(ParseClassKey(ClassKey("n", "db"), "n"), "db");
  EXPECT_EQ(NamespaceOfKey("/holdfast/ns/n/hold/x"), "n");
  EXPECT_FALSE(NamespaceOfKey("/holdfast/epoch").has_value());
}

}  // namespace
}  // namespace holdfast::keyspace
