// SessionOwners' rules, without a server: an owner is answered only for the
// namespace it was seen in, a forgotten session is unknown, and a full table
// drops its least recently used half. How the engine uses it is tested end to
// end in tests/identity_test.cc: a keepalive or a release by another identity is
// refused; a keepalive naming another namespace, or a session that was closed,
// is answered lost.
#include "lock/session_owners.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace holdfast::lock {
namespace {

constexpr int64_t kMax = static_cast<int64_t>(SessionOwners::kMaxEntries);

TEST(SessionOwnersTest, AnswersOnlyInTheNamespaceTheSessionWasSeenIn) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/billing");
  EXPECT_EQ(owners.IsOwner(7, "payments", "spiffe://example.org/billing"), true);
  EXPECT_EQ(owners.IsOwner(7, "payments", "spiffe://example.org/intruder"), false);
  // Another namespace, or another session: unknown here, so the caller reads.
  EXPECT_EQ(owners.IsOwner(7, "ledger", "spiffe://example.org/billing"), std::nullopt);
  EXPECT_EQ(owners.IsOwner(8, "payments", "spiffe://example.org/billing"), std::nullopt);
}

TEST(SessionOwnersTest, ARememberedSessionTakesItsLatestNamespaceAndOwner) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/a");
  owners.Remember(7, "ledger", "spiffe://example.org/b");
  EXPECT_EQ(owners.IsOwner(7, "payments", "spiffe://example.org/a"), std::nullopt);
  EXPECT_EQ(owners.IsOwner(7, "ledger", "spiffe://example.org/b"), true);
  EXPECT_EQ(owners.size(), 1u);
}

TEST(SessionOwnersTest, SessionsSharingAnIdentityAreEachAnswered) {
  SessionOwners owners;
  for (int64_t s = 1; s <= 1000; ++s) {
    owners.Remember(s, s % 2 ? "odd" : "even", absl::StrCat("spiffe://example.org/w", s % 3));
  }
  EXPECT_EQ(owners.size(), 1000u);
  for (int64_t s = 1; s <= 1000; ++s) {
    const std::string ns = s % 2 ? "odd" : "even";
    EXPECT_EQ(owners.IsOwner(s, ns, absl::StrCat("spiffe://example.org/w", s % 3)), true);
    EXPECT_EQ(owners.IsOwner(s, ns, absl::StrCat("spiffe://example.org/w", (s + 1) % 3)), false);
  }
}

TEST(SessionOwnersTest, AForgottenSessionIsUnknown) {
  SessionOwners owners;
  owners.Remember(7, "payments", "spiffe://example.org/billing");
  owners.Remember(8, "payments", "spiffe://example.org/billing");
  owners.Forget(7);
  owners.Forget(9);  // never seen: nothing changes
  EXPECT_EQ(owners.IsOwner(7, "payments", "spiffe://example.org/billing"), std::nullopt);
  EXPECT_EQ(owners.IsOwner(8, "payments", "spiffe://example.org/billing"), true);
  EXPECT_EQ(owners.size(), 1u);
}

TEST(SessionOwnersTest, AFullTableDropsItsLeastRecentlyUsedHalf) {
  SessionOwners owners;
  for (int64_t s = 0; s < kMax; ++s) owners.Remember(s, "ns", absl::StrCat("id", s % 7));
  // The first tenth renew through this replica again: used most recently.
  for (int64_t s = 0; s < kMax / 10; ++s) {
    ASSERT_EQ(owners.IsOwner(s, "ns", absl::StrCat("id", s % 7)), true);
  }
  // Remembering a session already there changes nothing in size.
  owners.Remember(kMax - 1, "ns", absl::StrCat("id", (kMax - 1) % 7));
  EXPECT_EQ(owners.size(), SessionOwners::kMaxEntries);

  owners.Remember(-1, "ns", "newcomer");
  EXPECT_EQ(owners.size(), SessionOwners::kMaxEntries / 2 + 1);
  EXPECT_EQ(owners.IsOwner(-1, "ns", "newcomer"), true);
  // Kept: the ones used again and the newest; dropped: the oldest not used since.
  EXPECT_EQ(owners.IsOwner(0, "ns", "id0"), true);
  EXPECT_EQ(owners.IsOwner(kMax / 10 - 1, "ns", absl::StrCat("id", (kMax / 10 - 1) % 7)), true);
  EXPECT_EQ(owners.IsOwner(kMax - 1, "ns", absl::StrCat("id", (kMax - 1) % 7)), true);
  EXPECT_EQ(owners.IsOwner(kMax / 10, "ns", absl::StrCat("id", (kMax / 10) % 7)), std::nullopt);
  // The kept entries still answer with their own strings after the strings moved.
  EXPECT_EQ(owners.IsOwner(3, "ns", "id3"), true);
  EXPECT_EQ(owners.IsOwner(3, "ns", "id4"), false);
}

TEST(SessionOwnersTest, ManyDistinctIdentitiesStayBounded) {
  SessionOwners owners;
  // Each session its own identity, twice the table's size: the table keeps
  // dropping its older half and never grows past its bound.
  for (int64_t s = 0; s < 2 * kMax; ++s) {
    owners.Remember(s, "ns", absl::StrCat("spiffe://example.org/", s));
    ASSERT_LE(owners.size(), SessionOwners::kMaxEntries);
  }
  EXPECT_EQ(owners.IsOwner(2 * kMax - 1, "ns", absl::StrCat("spiffe://example.org/", 2 * kMax - 1)),
            true);
  EXPECT_EQ(owners.IsOwner(0, "ns", "spiffe://example.org/0"), std::nullopt);
}

}  // namespace
}  // namespace holdfast::lock
