#include "lock/snapshot.h"

#include <gtest/gtest.h>

#include "lock/keyspace.h"

namespace holdfast::lock {
namespace {

ClassEntry Class(std::string id, std::string prefix) {
  ClassEntry c;
  c.class_id = std::move(id);
  c.record.set_key_prefix(std::move(prefix));
  return c;
}

TEST(SnapshotTest, LongestPrefixWins) {
  std::vector<ClassEntry> classes = {Class("default", ""), Class("db", "db/"),
                                     Class("primary", "db/primary")};
  EXPECT_EQ(ResolveClass(classes, "jobs/x")->class_id, "default");
  EXPECT_EQ(ResolveClass(classes, "db/replica")->class_id, "db");
  EXPECT_EQ(ResolveClass(classes, "db/primary-2")->class_id, "primary");
  EXPECT_EQ(ResolveClass({Class("db", "db/")}, "jobs"), nullptr);
}

TEST(SnapshotTest, EpochMustMatchTheAnsweringCluster) {
  EpochEntry e;
  e.record.set_epoch(3);
  e.record.set_etcd_cluster_id(1234);
  EXPECT_TRUE(CheckEpoch(e, 1234).ok());
  auto other = CheckEpoch(e, 999);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("holdfast epoch advance"), std::string::npos);
  EXPECT_EQ(CheckEpoch(std::nullopt, 1234).code(), absl::StatusCode::kFailedPrecondition);
  e.record.set_epoch(1 << 15);
  EXPECT_EQ(CheckEpoch(e, 1234).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SnapshotTest, HoldInfoCarriesTheToken) {
  HoldEntry h;
  h.lease = 77;
  h.create_revision = 1000;
  h.record.set_epoch(2);
  h.record.set_identity("spiffe://example.org/svc");
  auto info = MakeHoldInfo("k", h);
  EXPECT_EQ(info.token(), (int64_t{2} << 48) | 1000);
  EXPECT_EQ(info.session_id(), 77);
  EXPECT_EQ(info.identity(), "spiffe://example.org/svc");
}

// A dead waiter's claim goes with it, guarded by "its session holds no hold of
// the key"; not when the snapshot shows that session holding the key (a waiter
// put from a stale view): then the claim is the hold's.
TEST(SnapshotTest, ADeadWaitersClaimGoesUnlessItsSessionHoldsTheKey) {
  KeySnapshot snap;
  HoldEntry h;
  h.lease = 7;
  h.create_revision = 100;
  snap.holds.push_back(h);
  etcdserverpb::TxnRequest holder;
  DeleteClaimOfDeadWaiter(snap, "ns", "db", 7, &holder);
  EXPECT_EQ(holder.compare_size(), 0);
  EXPECT_EQ(holder.success_size(), 0);

  etcdserverpb::TxnRequest other;
  DeleteClaimOfDeadWaiter(snap, "ns", "db", 9, &other);
  ASSERT_EQ(other.compare_size(), 1);
  EXPECT_EQ(other.compare(0).key(), keyspace::HoldKey("ns", "db", 9));
  EXPECT_EQ(other.compare(0).target(), etcdserverpb::Compare::CREATE);
  EXPECT_EQ(other.compare(0).result(), etcdserverpb::Compare::EQUAL);
  EXPECT_EQ(other.compare(0).create_revision(), 0);
  ASSERT_EQ(other.success_size(), 1);
  EXPECT_EQ(other.success(0).request_delete_range().key(), keyspace::ClaimKey("ns", "db", 9));
}

}  // namespace
}  // namespace holdfast::lock
