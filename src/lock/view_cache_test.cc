// The key views of ViewCache: what a release may plan on without a read.
#include "lock/view_cache.h"

#include <gtest/gtest.h>

namespace holdfast::lock {
namespace {

HoldEntry Hold(int64_t lease, int64_t rev) {
  HoldEntry h;
  h.lease = lease;
  h.create_revision = rev;
  return h;
}

WaiterEntry Waiter(int64_t lease, int64_t rev) {
  WaiterEntry w;
  w.lease = lease;
  w.create_revision = rev;
  w.mod_revision = rev;
  return w;
}

KeySnapshot Read(int64_t revision, std::vector<HoldEntry> holds,
                 std::vector<WaiterEntry> waiters) {
  KeySnapshot s;
  s.revision = revision;
  s.namespace_exists = true;
  s.holds = std::move(holds);
  s.waiters = std::move(waiters);
  return s;
}

std::vector<int64_t> Leases(const std::vector<WaiterEntry>& ws) {
  std::vector<int64_t> out;
  for (const auto& w : ws) out.push_back(w.lease);
  return out;
}

TEST(KeyViewTest, AReadIsCompleteAtItsRevisionAndAFreeKeyIsForgotten) {
  ViewCache c;
  c.ObserveKey("ns", "k", Read(10, {Hold(1, 5)}, {Waiter(2, 7), Waiter(3, 9)}), 0);
  auto v = c.Key("ns", "k");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->holds_revision, 10);
  EXPECT_EQ(v->waiters_revision, 10);
  EXPECT_EQ(Leases(v->waiters), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(c.Key("ns", "other"));
  EXPECT_FALSE(c.Key("other", "k"));

  // An older read (answered late) does not replace a newer one.
  c.ObserveKey("ns", "k", Read(8, {Hold(1, 5)}, {Waiter(2, 7)}), 0);
  EXPECT_EQ(c.Key("ns", "k")->holds_revision, 10);

  c.ObserveKey("ns", "k", Read(12, {}, {}), 0);
  EXPECT_FALSE(c.Key("ns", "k"));
}

// etcd restored: its revisions go back. A read from a restored cluster with a
// new id replaces the views whatever their revisions; under the same id, only
// Clear (a restore detected) lets the restored reads in.
TEST(KeyViewTest, AReadOfAnotherClusterReplacesTheViewsAndClearForgetsThemAll) {
  ViewCache c;
  KeySnapshot before = Read(110, {Hold(1, 90)}, {Waiter(3, 92)});
  before.cluster_id = 7;
  before.session = records::SessionRecord();
  before.session_claims = 1;
  c.ObserveKey("ns", "k", before, 0);
  c.Observe("ns", 1, before, 0);

  KeySnapshot restored = Read(96, {Hold(1, 90), Hold(2, 91)}, {Waiter(3, 92)});
  restored.cluster_id = 7;  // the same id: an older read, kept out
  restored.session = records::SessionRecord();
  restored.session_claims = 2;
  c.ObserveKey("ns", "k", restored, 0);
  c.Observe("ns", 1, restored, 0);
  EXPECT_EQ(c.Key("ns", "k")->holds_revision, 110);
  EXPECT_EQ(c.Key("ns", "k")->holds.size(), 1u);
  EXPECT_EQ(c.Session(1)->claims, 1);

  restored.cluster_id = 8;  // a new id: the restored cluster's read replaces
  c.ObserveKey("ns", "k", restored, 0);
  c.Observe("ns", 1, restored, 0);
  auto v = c.Key("ns", "k");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->holds_revision, 96);
  EXPECT_EQ(v->cluster_id, 8u);
  EXPECT_EQ(v->holds.size(), 2u);
  EXPECT_EQ(c.Session(1)->claims, 2);
  EXPECT_EQ(c.Session(1)->cluster_id, 8u);
  EXPECT_EQ(c.Namespace("ns")->cluster_id, 8u);

  // A release planned on the old cluster's view and committed on the restored
  // one leaves no view to plan on.
  KeyView old_base{110, 110, {Hold(1, 90), Hold(5, 95)}, {}, 7};
  c.Released("ns", "k", old_base, 1, {}, {}, 120, /*cluster_id=*/8, 0);
  EXPECT_FALSE(c.Key("ns", "k"));

  c.ObserveKey("ns", "k", restored, 0);
  c.Clear();
  EXPECT_FALSE(c.Key("ns", "k"));
  EXPECT_FALSE(c.Session(1));
  EXPECT_FALSE(c.Namespace("ns"));
  // After a clear, a read sent under the new generation is taken at any revision.
  restored.cluster_id = 7;
  c.ObserveKey("ns", "k", restored, c.Generation());
  EXPECT_EQ(c.Key("ns", "k")->holds_revision, 96);
}

// A restore under the same cluster id, found and cleared: answers to requests
// sent before the clear (reads and commits of the history the restore took back,
// at revisions above any the restored cluster has) arrive after it. None of
// them may put a view back, or change one read since: such a view would outrank
// every read of the restored data, with compares against it that nothing fails.
TEST(KeyViewTest, AnswersToRequestsSentBeforeAClearChangeNothing) {
  ViewCache c;
  const uint64_t before = c.Generation();
  KeySnapshot lost = Read(110, {Hold(1, 90)}, {Waiter(3, 92)});
  lost.cluster_id = 7;
  lost.session = records::SessionRecord();
  lost.session_claims = 1;
  c.ObserveKey("ns", "k", lost, before);
  c.Observe("ns", 1, lost, before);
  ASSERT_TRUE(c.Key("ns", "k"));

  c.Clear();
  const uint64_t after = c.Generation();
  EXPECT_NE(after, before);

  // Late reads of the lost history: nothing comes back.
  c.ObserveKey("ns", "k", lost, before);
  c.Observe("ns", 1, lost, before);
  EXPECT_FALSE(c.Key("ns", "k"));
  EXPECT_FALSE(c.Session(1));
  EXPECT_FALSE(c.Namespace("ns"));

  // The restored cluster's reads, sent after the clear, are taken.
  KeySnapshot restored = Read(96, {Hold(1, 90), Hold(2, 91)}, {Waiter(3, 92)});
  restored.cluster_id = 7;
  restored.session = records::SessionRecord();
  restored.session_claims = 2;
  c.ObserveKey("ns", "k", restored, after);
  c.Observe("ns", 1, restored, after);
  ASSERT_EQ(c.Key("ns", "k")->holds_revision, 96);
  ASSERT_EQ(c.Session(1)->claims, 2);

  // A late read of the lost history at a higher revision does not replace them.
  c.ObserveKey("ns", "k", lost, before);
  c.Observe("ns", 1, lost, before);
  EXPECT_EQ(c.Key("ns", "k")->holds_revision, 96);
  EXPECT_EQ(c.Key("ns", "k")->holds.size(), 2u);
  EXPECT_EQ(c.Session(1)->claims, 2);
  EXPECT_EQ(c.Session(1)->claims_revision, 96);
  EXPECT_EQ(c.Namespace("ns")->classes_revision, 96);

  // A claim counted on the lost history: the session's view is forgotten (it
  // may have committed on the restored cluster after the read above).
  c.ClaimAdded(1, /*claims_before=*/1, 111, before);
  EXPECT_FALSE(c.Session(1));

  // A waiter put planned before the clear: the key's view is forgotten.
  c.WaiterPut("ns", "k", Waiter(4, 112), before);
  EXPECT_FALSE(c.Key("ns", "k"));
  // So is it by a waiter's removal sent before the clear (the restored queue
  // may still have that waiter).
  c.ObserveKey("ns", "k", restored, after);
  c.WaiterGone("ns", "k", 3, 92, before);
  EXPECT_FALSE(c.Key("ns", "k"));

  // A release planned on a view of the lost history leaves no view.
  c.ObserveKey("ns", "k", restored, after);
  KeyView old_base{110, 110, {Hold(1, 90)}, {Waiter(3, 92)}, 7};
  c.Released("ns", "k", old_base, 1, {3}, {Hold(3, 113)}, 113, 7, before);
  EXPECT_FALSE(c.Key("ns", "k"));

  // The same changes under the current generation do change the views.
  c.ObserveKey("ns", "k", restored, after);
  c.Observe("ns", 1, restored, after);
  c.ClaimAdded(1, 2, 97, after);
  EXPECT_EQ(c.Session(1)->claims, 3);
  c.WaiterPut("ns", "k", Waiter(4, 98), after);
  EXPECT_EQ(c.Key("ns", "k")->waiters.size(), 2u);
}

// A waiter put after the read is kept in queue order but stays above
// waiters_revision: a release never hands it the key from the view, because
// another replica may have queued one ahead of it that the view does not know.
TEST(KeyViewTest, WaitersPutAfterTheReadAreKnownButNotComplete) {
  ViewCache c;
  c.ObserveKey("ns", "k", Read(10, {Hold(1, 5)}, {Waiter(2, 7)}), 0);
  c.WaiterPut("ns", "k", Waiter(4, 14), 0);
  c.WaiterPut("ns", "k", Waiter(3, 12), 0);  // its answer came later
  auto v = c.Key("ns", "k");
  EXPECT_EQ(Leases(v->waiters), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(v->waiters_revision, 10);

  // At or below the read's revision the read saw it, or saw it gone already.
  c.WaiterPut("ns", "k", Waiter(5, 9), 0);
  EXPECT_EQ(Leases(c.Key("ns", "k")->waiters), (std::vector<int64_t>{2, 3, 4}));

  // A re-put of a known waiter (a later deadline) keeps its place.
  WaiterEntry again = Waiter(2, 7);
  again.mod_revision = 15;
  again.record.set_deadline_unix_ms(99);
  again.record.set_shared(true);
  c.WaiterPut("ns", "k", again, 0);
  v = c.Key("ns", "k");
  EXPECT_EQ(Leases(v->waiters), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(v->waiters[0].record.deadline_unix_ms(), 99);
  EXPECT_EQ(v->waiters[0].mod_revision, 15);  // what a hand-over compares
  // An older put answered late does not undo it.
  WaiterEntry late = Waiter(2, 7);
  late.mod_revision = 11;
  c.WaiterPut("ns", "k", late, 0);
  EXPECT_TRUE(c.Key("ns", "k")->waiters[0].record.shared());

  c.WaiterGone("ns", "k", 3, 12, 0);
  c.WaiterGone("ns", "k", 4, 999, 0);  // another incarnation: not this one
  EXPECT_EQ(Leases(c.Key("ns", "k")->waiters), (std::vector<int64_t>{2, 4}));
}

TEST(KeyViewTest, AReleaseMovesTheHoldsToItsRevision) {
  ViewCache c;
  c.ObserveKey("ns", "k", Read(10, {Hold(1, 5)}, {Waiter(2, 7), Waiter(3, 9)}), 0);
  auto base = *c.Key("ns", "k");
  c.Released("ns", "k", base, /*releasing=*/1, /*gone=*/{2}, {Hold(2, 20)}, 20, 0, 0);
  auto v = c.Key("ns", "k");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->holds_revision, 20);  // no hold was created in (10, 20): compared
  EXPECT_EQ(v->waiters_revision, 10);
  ASSERT_EQ(v->holds.size(), 1u);
  EXPECT_EQ(v->holds[0].lease, 2);
  EXPECT_EQ(v->holds[0].create_revision, 20);
  EXPECT_EQ(Leases(v->waiters), (std::vector<int64_t>{3}));

  // The next release, planned on that view.
  base = *v;
  c.Released("ns", "k", base, 2, {3}, {Hold(3, 25)}, 25, 0, 0);
  v = c.Key("ns", "k");
  EXPECT_EQ(v->holds_revision, 25);
  EXPECT_TRUE(v->waiters.empty());

  // A read after the release is not overwritten by the release's view.
  c.ObserveKey("ns", "k", Read(30, {Hold(3, 25)}, {Waiter(6, 28)}), 0);
  c.Released("ns", "k", base, 2, {3}, {Hold(3, 25)}, 25, 0, 0);
  EXPECT_EQ(c.Key("ns", "k")->holds_revision, 30);
  // Nor one read at the release's own revision (it shows the new hold already).
  c.ObserveKey("ns", "k", Read(40, {Hold(3, 25), Hold(7, 40)}, {}), 0);
  base = *c.Key("ns", "k");
  c.Released("ns", "k", base, 3, {}, {Hold(7, 40)}, 40, 0, 0);
  ASSERT_EQ(c.Key("ns", "k")->holds.size(), 2u);
  EXPECT_EQ(c.Key("ns", "k")->holds[0].lease, 3);  // untouched, not [7, 7]
  EXPECT_EQ(c.Key("ns", "k")->holds[1].lease, 7);

  // The last holders leave with nobody handed the key: forgotten.
  c.ObserveKey("ns", "k", Read(41, {Hold(3, 25)}, {}), 0);
  base = *c.Key("ns", "k");
  c.Released("ns", "k", base, 3, {}, {}, 42, 0, 0);
  EXPECT_FALSE(c.Key("ns", "k"));
}

TEST(KeyViewTest, SharedHoldsStayInKeyOrder) {
  ViewCache c;
  c.ObserveKey("ns", "k", Read(10, {Hold(1, 5), Hold(9, 6)}, {Waiter(4, 7), Waiter(6, 8)}), 0);
  auto base = *c.Key("ns", "k");
  c.Released("ns", "k", base, 1, {4, 6}, {Hold(4, 11), Hold(6, 11)}, 11, 0, 0);
  auto v = c.Key("ns", "k");
  ASSERT_EQ(v->holds.size(), 3u);
  EXPECT_EQ(v->holds[0].lease, 4);
  EXPECT_EQ(v->holds[1].lease, 6);
  EXPECT_EQ(v->holds[2].lease, 9);
}

// An acquire from the views glances at the key's view: who holds it, whether the
// session is there already, how many wait, and whom it may join behind (the view
// complete through three live waiters), with who blocks it.
TEST(KeyViewTest, AGlanceShowsWhomANewcomerMayJoinBehind) {
  const int64_t now = 1'000'000;
  auto waiter = [&](int64_t lease, int64_t rev, bool shared = false) {
    WaiterEntry w = Waiter(lease, rev);
    w.record.set_deadline_unix_ms(now + 10'000);
    w.record.set_shared(shared);
    return w;
  };
  ViewCache c;
  EXPECT_FALSE(c.GlanceKey("ns", "k", 9, false, now));
  c.ObserveKey("ns", "k", Read(10, {Hold(1, 5)}, {waiter(2, 6), waiter(3, 7, true)}), 0);
  auto g = c.GlanceKey("ns", "k", 9, false, now);
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->held_by_other);
  EXPECT_FALSE(g->mine);
  EXPECT_EQ(g->waiters, 2u);
  EXPECT_FALSE(g->behind) << "two live waiters: under the margin";
  EXPECT_TRUE(c.GlanceKey("ns", "k", 3, false, now)->mine);
  EXPECT_TRUE(c.GlanceKey("ns", "k", 1, false, now)->mine);
  EXPECT_FALSE(c.GlanceKey("ns", "k", 1, false, now)->held_by_other);

  c.ObserveKey("ns", "k",
               Read(12, {Hold(1, 5)}, {waiter(2, 6), waiter(3, 7, true), waiter(4, 11)}), 0);
  g = c.GlanceKey("ns", "k", 9, false, now);
  ASSERT_TRUE(g && g->behind);
  EXPECT_EQ(g->behind->lease, 4);
  EXPECT_EQ(g->blocking, 3);
  ASSERT_EQ(g->holds.size(), 1u);
  EXPECT_EQ(g->holds[0].lease, 1);
  // A reader is not blocked by the shared waiter.
  EXPECT_EQ(c.GlanceKey("ns", "k", 9, true, now)->blocking, 2);
  // A waiter put after the read is the last one, and the view is still complete
  // through three: the next newcomer joins behind it.
  c.WaiterPut("ns", "k", waiter(5, 13), 0);
  g = c.GlanceKey("ns", "k", 9, false, now);
  ASSERT_TRUE(g && g->behind);
  EXPECT_EQ(g->behind->lease, 5);
  EXPECT_EQ(g->waiters, 4u);
}

}  // namespace
}  // namespace holdfast::lock
