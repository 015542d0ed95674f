// SessionOwners' rules, without a server: an owner is answered only for the
// namespace it was seen in, a closed session is forgotten, and the table starts
// over when full. How the engine uses it is tested end to end: a keepalive or a
// release by another identity is refused (tests/identity_test.cc), one for a
// session that ended reports it lost (tests/lock_integration_test.cc).
#include "lock/session_owners.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace holdfast::lock {
namespace {

TEST(SessionOwnersTest, AnswersTheOwnerOnlyInTheNamespaceItWasSeenIn) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/billing");
  EXPECT_EQ(owners.OwnerIn(7, "payments"), "spiffe://example.org/billing");
  // Another namespace: unknown here, so the caller reads (and finds nothing).
  EXPECT_EQ(owners.OwnerIn(7, "ledger"), std::nullopt);
  EXPECT_EQ(owners.OwnerIn(8, "payments"), std::nullopt);
}

TEST(SessionOwnersTest, ARememberedSessionTakesItsLatestNamespaceAndOwner) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/a");
  owners.Remember(7, "ledger", "spiffe://example.org/b");
  EXPECT_EQ(owners.OwnerIn(7, "payments"), std::nullopt);
  EXPECT_EQ(owners.OwnerIn(7, "ledger"), "spiffe://example.org/b");
  EXPECT_EQ(owners.size(), 1u);
}

TEST(SessionOwnersTest, SessionsSharingAnIdentityAreEachAnswered) {
  SessionOwners owners;
  for (int64_t s = 1; s <= 1000; ++s) {
    owners.Remember(s, s % 2 ? "odd" : "even", absl::StrCat("spiffe://example.org/w", s % 3));
  }
  EXPECT_EQ(owners.size(), 1000u);
  for (int64_t s = 1; s <= 1000; ++s) {
    EXPECT_EQ(owners.OwnerIn(s, s % 2 ? "odd" : "even"),
              absl::StrCat("spiffe://example.org/w", s % 3));
  }
}

TEST(SessionOwnersTest, AClosedSessionIsForgotten) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/billing");
  owners.Remember(8, "payments", "spiffe://example.org/billing");
  owners.Forget(7);
  owners.Forget(9);  // never seen: nothing changes
  EXPECT_EQ(owners.OwnerIn(7, "payments"), std::nullopt);
  EXPECT_EQ(owners.OwnerIn(8, "payments"), "spiffe://example.org/billing");
  EXPECT_EQ(owners.size(), 1u);
}

TEST(SessionOwnersTest, StartsOverWhenFull) {
  SessionOwners owners;
  for (int64_t s = 0; s < static_cast<int64_t>(SessionOwners::kMaxEntries); ++s) {
    owners.Remember(s, "ns", "id");
  }
  EXPECT_EQ(owners.size(), SessionOwners::kMaxEntries);
  owners.Remember(-1, "ns", "id");
  EXPECT_EQ(owners.size(), 1u);
  EXPECT_EQ(owners.OwnerIn(-1, "ns"), "id");
  EXPECT_EQ(owners.OwnerIn(0, "ns"), std::nullopt);
}

TEST(SessionOwnersTest, StartsOverWhenItHoldsTooManyDistinctStrings) {
  SessionOwners owners;
  // Each session its own identity: two strings per session at most.
  int64_t s = 0;
  while (owners.size() == static_cast<size_t>(s)) {
    owners.Remember(s, "ns", absl::StrCat("spiffe://example.org/", s));
    ++s;
    ASSERT_LE(s, static_cast<int64_t>(SessionOwners::kMaxStrings));
  }
  // The table started over with the last one: the strings stay bounded.
  EXPECT_EQ(owners.size(), 1u);
  EXPECT_EQ(owners.OwnerIn(s - 1, "ns"), absl::StrCat("spiffe://example.org/", s - 1));
  EXPECT_EQ(owners.OwnerIn(0, "ns"), std::nullopt);
}

}  // namespace
}  // namespace holdfast::lock
