// Group commit against a real etcd-server process: batches share a revision,
// a failed batch falls back to each member alone (with its own else branch), and
// members that share a lock key or a session never share a batch, and a compare
// several members make is made once, so it counts once against --max-txn-ops.
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

TEST_F(GroupCommitTest, ACompareSeveralMembersMakeCountsOnceAgainstTheBound) {
  // Each member: three compares every member makes (records that exist, as a
  // grant compares its epoch, namespace and class records), one of its own, and
  // one put. With 8 operations at most, merged without sharing the three a batch
  // could take two members; sharing them, five (3 + 5 compares).
  for (const char* shared : {"/rec/epoch", "/rec/ns", "/rec/class"}) {
    pb::PutRequest put;
    put.set_key(shared);
    put.set_value("v");
    ASSERT_TRUE(client_->PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  }
  std::vector<int> batches;
  absl::Mutex batches_mu;
  GroupCommitOptions g;
  g.max_in_flight = 1;
  g.max_txn_ops = 8;
  GroupCommit commits(client_.get(), g, [&](int members) {
    absl::MutexLock l(&batches_mu);
    batches.push_back(members);
  });
  auto member = [&](int i) {
    const std::string key = absl::StrCat("/s/", i);
    pb::TxnRequest txn;
    for (const char* shared : {"/rec/epoch", "/rec/ns", "/rec/class"}) {
      AddCompare(&txn, shared, pb::Compare::VERSION, pb::Compare::EQUAL)->set_version(1);
    }
    AddCompare(&txn, key, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value("x");
    txn.add_failure()->mutable_request_range()->set_key(key);
    return txn;
  };
  constexpr int kMembers = 11;
  std::vector<Result> results;
  for (int i = 0; i < kMembers; ++i) {
    auto p = std::make_shared<std::promise<absl::StatusOr<pb::TxnResponse>>>();
    results.push_back(p->get_future());
    commits.Txn({"ns", absl::StrCat("k", i), 100 + i}, member(i), etcd::DeadlineIn(seconds(10)),
                [p](absl::StatusOr<pb::TxnResponse> t) { p->set_value(std::move(t)); });
  }
  std::set<int64_t> revisions;
  for (int i = 0; i < kMembers; ++i) {
    auto t = results[i].get();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->succeeded()) << "member " << i;
    EXPECT_EQ(CreateRevision(absl::StrCat("/s/", i)), t->header().revision());
    revisions.insert(t->header().revision());
  }
  absl::MutexLock l(&batches_mu);
  // The first went alone; the ten queued behind it (as long as they were all
  // queued before it came back) as two batches of five.
  int total = 0, largest = 0;
  for (int b : batches) {
    total += b;
    largest = std::max(largest, b);
  }
  EXPECT_EQ(total, kMembers);
  EXPECT_LE(largest, 5) << "the bound holds in distinct compares";
  EXPECT_GE(largest, 3) << "two members at most if the shared compares counted per member";
  EXPECT_EQ(revisions.size(), batches.size());
}

TEST_F(GroupCommitTest, ASharedCompareThatFailsFailsTheBatchAndEachMemberAlone) {
  // Two members compare the same record with different expectations: made once
  // each (they differ), the batch fails and each member gets its own answer.
  pb::PutRequest put;
  put.set_key("/rec/epoch");
  put.set_value("v");
  ASSERT_TRUE(client_->PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  auto txn = [](const std::string& key, int64_t version) {
    pb::TxnRequest t;
    AddCompare(&t, "/rec/epoch", pb::Compare::VERSION, pb::Compare::EQUAL)->set_version(version);
    auto* p = t.add_success()->mutable_request_put();
    p->set_key(key);
    p->set_value("x");
    return t;
  };
  auto first = Submit("ns", "first", 1, txn("/f/first", 1));
  auto right = Submit("ns", "right", 2, txn("/f/right", 1));
  auto wrong = Submit("ns", "wrong", 3, txn("/f/wrong", 2));
  auto r1 = first.get(), r2 = right.get(), r3 = wrong.get();
  ASSERT_TRUE(r1.ok() && r2.ok() && r3.ok());
  EXPECT_TRUE(r1->succeeded());
  EXPECT_TRUE(r2->succeeded());
  EXPECT_FALSE(r3->succeeded());
  EXPECT_GT(CreateRevision("/f/right"), 0);
  EXPECT_EQ(CreateRevision("/f/wrong"), 0);
}

}  // namespace
}  // namespace holdfast::lock
