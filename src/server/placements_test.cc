// The replica's view of the placement records (server/clusters.h, Placements)
// against a real etcd-server process: what it keeps of deleted namespaces.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "dev/scratch_etcd.h"
#include "lock/keyspace.h"
#include "server/clusters.h"

namespace holdfast::server {
namespace {

namespace pb = ::etcdserverpb;
using std::chrono::seconds;

class PlacementsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = dev::ScratchEtcd::Start("placements");
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    timers_ = std::make_shared<TimerQueue>();
    etcd::ClientOptions co;
    co.endpoints = {scratch_->etcd().endpoint()};
    auto c = etcd::Client::Create(co, timers_);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    placements_.reset();
    client_.reset();
    scratch_.reset();
  }

  static etcd::Deadline Soon() { return etcd::DeadlineIn(seconds(10)); }

  // Puts `ns`'s record homing it on `home`; returns the revision.
  int64_t Put(const std::string& ns, const std::string& home) {
    records::PlacementRecord rec;
    rec.set_home(home);
    pb::PutRequest put;
    put.set_key(keyspace::PlacementKey(ns));
    put.set_value(rec.SerializeAsString());
    auto r = client_->PutSync(put, Soon());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }
  int64_t Delete(const std::string& ns) {
    pb::DeleteRangeRequest del;
    del.set_key(keyspace::PlacementKey(ns));
    auto r = client_->DeleteRangeSync(del, Soon());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  }
  static records::PlacementRecord HomedOn(const std::string& home) {
    records::PlacementRecord rec;
    rec.set_home(home);
    return rec;
  }

  // Waits (for as long as the watch takes: no timing asserted) until `p` keeps
  // `n` entries; false after a minute.
  static bool KeepsEventually(const Placements& p, size_t n) {
    for (int i = 0; i < 600 && p.kept() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return p.kept() == n;
  }

  std::unique_ptr<dev::ScratchEtcd> scratch_;
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<etcd::Client> client_;
  std::unique_ptr<Placements> placements_;
};

// A control replica that sees many namespaces created and deleted keeps none of
// them once its watch has passed their deletion; while a deletion it noted itself
// is ahead of the watch, an older put of the record coming on the watch does not
// bring the namespace back; and a note the watch has passed changes nothing.
TEST_F(PlacementsTest, DeletedNamespacesAreForgottenOnceTheWatchPassesThem) {
  Put("keep", "b");
  const int64_t first = Put("gone", "b");
  placements_ = std::make_unique<Placements>(client_.get(), "a", std::set<std::string>{"a", "b", "c"});
  ASSERT_TRUE(placements_->Load(Soon()).ok());
  Placements& p = *placements_;
  ASSERT_EQ(p.HomeOf("gone"), "b");
  ASSERT_EQ(p.kept(), 2u);

  // Created and deleted, through this replica (noted) and through others (only
  // the watch): none stays.
  for (int i = 0; i < 50; ++i) {
    const std::string ns = "churn-" + std::to_string(i);
    const int64_t put = Put(ns, "b");
    if (i % 2 == 0) p.Note(ns, HomedOn("b"), put);
    const int64_t del = Delete(ns);
    if (i % 2 == 0) {
      p.Note(ns, std::nullopt, del);
      EXPECT_EQ(p.HomeOf(ns), "a") << ns;  // routed by the note at once
    }
  }
  const int64_t deleted = Delete("gone");
  p.Note("gone", std::nullopt, deleted);
  EXPECT_EQ(p.HomeOf("gone"), "a");
  ASSERT_TRUE(KeepsEventually(p, 1u)) << "kept " << p.kept() << " entries";
  EXPECT_EQ(p.HomeOf("keep"), "b");
  EXPECT_EQ(p.All().size(), 1u);

  // A note of the first put, which the watch has passed: nothing changes.
  p.Note("gone", HomedOn("b"), first);
  EXPECT_EQ(p.HomeOf("gone"), "a");
  EXPECT_EQ(p.kept(), 1u);

  // A deletion noted ahead of the watch (at a revision etcd has not reached) is
  // kept: the put that the watch then brings, older than the note, is not taken.
  auto status = client_->StatusSync(Soon());
  ASSERT_TRUE(status.ok()) << status.status();
  const int64_t ahead = status->header().revision() + 1000;
  p.Note("late", std::nullopt, ahead);
  Put("late", "b");
  Put("keep", "c");  // a later event on the watch, to know it got this far
  for (int i = 0; i < 600 && p.HomeOf("keep") != "c"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(p.HomeOf("keep"), "c");
  EXPECT_EQ(p.HomeOf("late"), "a");
  EXPECT_EQ(p.kept(), 2u);  // "keep", and the deletion of "late" not yet passed
}

}  // namespace
}  // namespace holdfast::server
