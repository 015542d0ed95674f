// The auditor against a real etcd-server process and a SQLite store whose
// records can be made to fail.
#include "audit/auditor.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "dev/scratch_etcd.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::audit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

// A store whose first `fail_records` Record calls fail with `failure`; counts the
// auditor's terms by its reads of the cursor (each term starts with one).
class FlakyStore : public AuditStore {
 public:
  FlakyStore(std::unique_ptr<AuditStore> inner, int fail_records, absl::Status failure)
      : inner_(std::move(inner)), fail_left_(fail_records), failure_(std::move(failure)) {}

  absl::Status Record(uint64_t cluster_id, int64_t cursor_revision,
                      const std::vector<AuditEvent>& events,
                      const std::vector<ForceReleaseRow>& forces) override {
    if (!events.empty() && fail_left_.fetch_sub(1) > 0) {
      failed_.fetch_add(1);
      return failure_;
    }
    return inner_->Record(cluster_id, cursor_revision, events, forces);
  }
  absl::StatusOr<std::optional<int64_t>> Cursor(uint64_t cluster_id) override {
    cursor_reads_.fetch_add(1);
    return inner_->Cursor(cluster_id);
  }
  absl::StatusOr<std::vector<uint64_t>> Clusters() override { return inner_->Clusters(); }
  absl::Status RewindCursor(uint64_t cluster_id, int64_t revision) override {
    return inner_->RewindCursor(cluster_id, revision);
  }
  absl::StatusOr<Pruned> Prune(int64_t before_unix_ms, int max_events) override {
    return inner_->Prune(before_unix_ms, max_events);
  }
  absl::StatusOr<std::vector<AuditEvent>> Query(const AuditQuery& q) override {
    return inner_->Query(q);
  }
  absl::StatusOr<std::vector<ForceReleaseRow>> ForceReleases(int limit) override {
    return inner_->ForceReleases(limit);
  }
  absl::Status AppendEpoch(const EpochRow& row) override { return inner_->AppendEpoch(row); }
  absl::StatusOr<int32_t> MaxEpoch() override { return inner_->MaxEpoch(); }
  absl::StatusOr<std::vector<EpochRow>> Epochs() override { return inner_->Epochs(); }
  absl::StatusOr<int> SchemaVersion() override { return inner_->SchemaVersion(); }
  absl::StatusOr<Durability> CommitDurability() override { return inner_->CommitDurability(); }

  int failed() const { return failed_.load(); }
  int cursor_reads() const { return cursor_reads_.load(); }

 private:
  std::unique_ptr<AuditStore> inner_;
  std::atomic<int> fail_left_;
  const absl::Status failure_;
  std::atomic<int> failed_{0};
  std::atomic<int> cursor_reads_{0};
};

class AuditorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = dev::ScratchEtcd::Start("auditor");
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    timers_ = std::make_shared<TimerQueue>();
    etcd::ClientOptions co;
    co.endpoints = {scratch_->etcd().endpoint()};
    auto c = etcd::Client::Create(co, timers_);
    ASSERT_TRUE(c.ok()) << c.status();
    etcd_ = std::move(*c);
  }
  void TearDown() override {
    etcd_.reset();
    scratch_.reset();
  }

  std::unique_ptr<AuditStore> OpenSqlite() {
    auto store = OpenStore(absl::StrCat("sqlite://", (scratch_->dir() / "audit.db").string()));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // Puts a hold of `lock_key` in namespace "ns" (a grant to the auditor).
  void PutHold(const std::string& lock_key) {
    records::HoldRecord rec;
    rec.set_class_id("default");
    rec.set_identity("spiffe://test.holdfast/app");
    rec.set_epoch(1);
    pb::PutRequest put;
    put.set_key(keyspace::HoldKey("ns", lock_key, 42));
    put.set_value(rec.SerializeAsString());
    ASSERT_TRUE(etcd_->PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  }

  std::unique_ptr<dev::ScratchEtcd> scratch_;
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<etcd::Client> etcd_;
};

// A record refused with FAILED_PRECONDITION that is not the cursor's regression
// (SQLite's "attempt to write a readonly database", as for a file turned
// read-only) is retried within the term, like an outage of the store; before,
// any FAILED_PRECONDITION was taken for another auditor ahead, and the auditor
// resigned and campaigned again for each try.
TEST_F(AuditorTest, ARecordRefusedForAnotherReasonThanTheCursorIsRetriedInTheSameTerm) {
  auto inner = OpenSqlite();
  ASSERT_NE(inner, nullptr);
  FlakyStore store(std::move(inner), 3,
                   absl::FailedPreconditionError("sqlite audit store: COMMIT: attempt to write a "
                                                 "readonly database"));
  AuditorOptions o;
  o.replica_id = "test";
  o.campaign_interval = milliseconds(200);
  Auditor auditor(etcd_.get(), &store, o);
  auditor.Start();
  for (int i = 0; i < 100 && !auditor.status().leader; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(auditor.status().leader);
  PutHold("k");
  for (int i = 0; i < 150 && auditor.status().recorded_events < 1; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  const AuditorStatus st = auditor.status();
  EXPECT_EQ(st.recorded_events, 1);
  EXPECT_EQ(store.failed(), 3);
  EXPECT_EQ(store.cursor_reads(), 1) << "the auditor began a term per failed record";
  EXPECT_TRUE(st.leader);
  auditor.Stop();
}

TEST_F(AuditorTest, OnlyTheCursorsRefusalIsTakenForAnotherAuditorAhead) {
  auto store = OpenSqlite();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Record(7, 10, {}, {}).ok());
  const absl::Status back = store->Record(7, 5, {}, {});
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition) << back;
  EXPECT_TRUE(IsCursorRegression(back)) << back;
  EXPECT_FALSE(IsCursorRegression(absl::FailedPreconditionError("readonly database")));
  EXPECT_FALSE(IsCursorRegression(absl::OkStatus()));
}

}  // namespace
}  // namespace holdfast::audit
