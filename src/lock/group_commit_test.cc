// Group commit against a real etcd-server process: batches share a revision,
// a failed batch falls back to each member alone (with its own else branch), and
// members that share a lock key or a session never share a batch.
#include "lock/group_commit.h"

#include <future>
#include <set>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dev/scratch_etcd.h"
#include "lock/txn_util.h"

namespace holdfast::lock {
namespace {

namespace pb = ::etcdserverpb;
using std::chrono::seconds;

class GroupCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = dev::ScratchEtcd::Start("gc");
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    etcd_ = &scratch_->etcd();
    timers_ = std::make_shared<TimerQueue>();
    etcd::ClientOptions co;
    co.endpoints = {etcd_->endpoint()};
    auto c = etcd::Client::Create(co, timers_);
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
    GroupCommitOptions g;
    g.max_in_flight = 1;  // everything behind the first transaction queues
    commits_ = std::make_unique<GroupCommit>(client_.get(), g, [this](int members) {
      absl::MutexLock l(&mu_);
      batches_.push_back(members);
    });
  }
  void TearDown() override {
    commits_.reset();
    client_.reset();
    etcd_ = nullptr;
    scratch_.reset();
  }

  // "if key is absent then put key (and the shared mark) else read key".
  static pb::TxnRequest PutIfAbsent(const std::string& key, const std::string& value) {
    pb::TxnRequest txn;
    AddCompare(&txn, key, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    auto* mark = txn.add_success()->mutable_request_put();
    mark->set_key("/mark");
    mark->set_value(value);
    txn.add_failure()->mutable_request_range()->set_key(key);
    return txn;
  }

  using Result = std::future<absl::StatusOr<pb::TxnResponse>>;
  Result Submit(const std::string& ns, const std::string& key, int64_t session,
                pb::TxnRequest txn) {
    auto p = std::make_shared<std::promise<absl::StatusOr<pb::TxnResponse>>>();
    auto f = p->get_future();
    commits_->Txn({ns, key, session}, std::move(txn), etcd::DeadlineIn(seconds(10)),
                  [p](absl::StatusOr<pb::TxnResponse> t) { p->set_value(std::move(t)); });
    return f;
  }

  int64_t CreateRevision(const std::string& key) {
    pb::RangeRequest r;
    r.set_key(key);
    auto got = client_->RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return got.ok() && got->kvs_size() > 0 ? got->kvs(0).create_revision() : 0;
  }

  std::vector<int> Batches() {
    absl::MutexLock l(&mu_);
    return batches_;
  }

  std::unique_ptr<dev::ScratchEtcd> scratch_;
  dev::EtcdProcess* etcd_ = nullptr;  // scratch_'s
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<etcd::Client> client_;
  std::unique_ptr<GroupCommit> commits_;
  absl::Mutex mu_;
  std::vector<int> batches_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GroupCommitTest, MembersOnDifferentKeysCommitTogetherInOneRevision) {
  constexpr int kMembers = 20;
  std::vector<Result> results;
  for (int i = 0; i < kMembers; ++i) {
    const std::string key = absl::StrCat("/k/", i);
    results.push_back(Submit("ns", key, 100 + i, PutIfAbsent(key, absl::StrCat(i))));
  }
  std::set<int64_t> revisions;
  for (int i = 0; i < kMembers; ++i) {
    auto t = results[i].get();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->succeeded());
    // Its own two success responses, and its key made in the answer's revision.
    EXPECT_EQ(t->responses_size(), 2);
    EXPECT_EQ(CreateRevision(absl::StrCat("/k/", i)), t->header().revision());
    revisions.insert(t->header().revision());
  }
  // The first went alone; the rest queued behind it and went merged (the mark,
  // put by all of them, once per batch).
  auto batches = Batches();
  int total = 0, largest = 0;
  for (int b : batches) {
    total += b;
    largest = std::max(largest, b);
  }
  EXPECT_EQ(total, kMembers);
  EXPECT_GT(largest, 1);
  EXPECT_EQ(revisions.size(), batches.size());
}

TEST_F(GroupCommitTest, AFailedCompareSendsEachMemberAloneWithItsElseBranch) {
  pb::PutRequest taken;
  taken.set_key("/k/taken");
  taken.set_value("already");
  ASSERT_TRUE(client_->PutSync(taken, etcd::DeadlineIn(seconds(5))).ok());

  auto first = Submit("ns", "/k/first", 1, PutIfAbsent("/k/first", "first"));
  auto a = Submit("ns", "/k/a", 2, PutIfAbsent("/k/a", "a"));
  auto b = Submit("ns", "/k/taken", 3, PutIfAbsent("/k/taken", "b"));  // its compare fails
  auto c = Submit("ns", "/k/c", 4, PutIfAbsent("/k/c", "c"));
  for (auto* r : {&first, &a, &c}) {
    auto t = r->get();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->succeeded());
  }
  auto tb = b.get();
  ASSERT_TRUE(tb.ok()) << tb.status();
  EXPECT_FALSE(tb->succeeded());
  ASSERT_EQ(tb->responses_size(), 1);  // its own else branch: the read of its key
  ASSERT_EQ(tb->responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(tb->responses(0).response_range().kvs(0).value(), "already");
  EXPECT_GT(CreateRevision("/k/a"), 0);
  EXPECT_GT(CreateRevision("/k/c"), 0);
  auto batches = Batches();
  EXPECT_NE(std::find(batches.begin(), batches.end(), 3), batches.end())
      << "a, taken and c queued behind the first and went as one batch";
}

TEST_F(GroupCommitTest, MembersSharingAKeyOrASessionNeverShareABatch) {
  auto first = Submit("ns", "/k/first", 1, PutIfAbsent("/k/first", "first"));
  // Same lock key, different sessions; then the same session, different keys.
  auto k1 = Submit("ns", "lock-x", 10, PutIfAbsent("/x/1", "1"));
  auto k2 = Submit("ns", "lock-x", 11, PutIfAbsent("/x/2", "2"));
  auto s1 = Submit("ns", "lock-y", 20, PutIfAbsent("/y/1", "1"));
  auto s2 = Submit("ns", "lock-z", 20, PutIfAbsent("/y/2", "2"));
  ASSERT_TRUE(first.get().ok());
  auto rk1 = k1.get(), rk2 = k2.get(), rs1 = s1.get(), rs2 = s2.get();
  for (auto* r : {&rk1, &rk2, &rs1, &rs2}) {
    ASSERT_TRUE(r->ok()) << r->status();
    EXPECT_TRUE((*r)->succeeded());
  }
  EXPECT_NE(rk1->header().revision(), rk2->header().revision());
  EXPECT_NE(rs1->header().revision(), rs2->header().revision());
}

}  // namespace
}  // namespace holdfast::lock
