// Group commit against a real etcd-server process: batches share a revision,
// a failed batch falls back to each member alone (with its own else branch, or
// etcd's refusal of that member's ops), and
// members that share a lock key or a session never share a batch, and a compare
// several members make is made once, so it counts once against --max-txn-ops.
// A rider waits for the next release of its key and goes in its transaction, its
// reads after the release's writes, or alone after its bound.
#include "lock/group_commit.h"

#include <csignal>
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
                pb::TxnRequest txn, etcd::Deadline d = etcd::DeadlineIn(seconds(10))) {
    auto p = std::make_shared<std::promise<absl::StatusOr<pb::TxnResponse>>>();
    auto f = p->get_future();
    commits_->Txn({ns, key, session}, std::move(txn), d,
                  [p](absl::StatusOr<pb::TxnResponse> t) { p->set_value(std::move(t)); });
    return f;
  }

  // A release of lock key "lk" by `session`: if `hold` exists, delete it and put
  // `next` (a hand-over); else read `hold`.
  Result Release(int64_t session, const std::string& hold, const std::string& next) {
    pb::TxnRequest txn;
    AddCompare(&txn, hold, pb::Compare::CREATE, pb::Compare::GREATER)->set_create_revision(0);
    txn.add_success()->mutable_request_delete_range()->set_key(hold);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(next);
    put->set_value("handed");
    txn.add_failure()->mutable_request_range()->set_key(hold);
    auto p = std::make_shared<std::promise<absl::StatusOr<pb::TxnResponse>>>();
    auto f = p->get_future();
    commits_->Txn({"ns", "lk", session, /*release=*/true}, std::move(txn),
                  etcd::DeadlineIn(seconds(10)),
                  [p](absl::StatusOr<pb::TxnResponse> t) { p->set_value(std::move(t)); });
    return f;
  }

  // An enqueue on lock key "lk" by `session`: if `waiter` is absent, put it and
  // then read /h/ (the holds, as the transaction leaves them); else read `waiter`.
  Result Rider(int64_t session, const std::string& waiter, std::chrono::milliseconds at_most) {
    pb::TxnRequest txn;
    AddCompare(&txn, waiter, pb::Compare::CREATE, pb::Compare::EQUAL)->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(waiter);
    put->set_value("waiting");
    auto* holds = txn.add_success()->mutable_request_range();
    holds->set_key("/h/");
    holds->set_range_end("/h0");
    txn.add_failure()->mutable_request_range()->set_key(waiter);
    auto p = std::make_shared<std::promise<absl::StatusOr<pb::TxnResponse>>>();
    auto f = p->get_future();
    commits_->Ride({"ns", "lk", session}, std::move(txn), etcd::DeadlineIn(seconds(30)),
                   [p](absl::StatusOr<pb::TxnResponse> t) { p->set_value(std::move(t)); },
                   at_most);
    return f;
  }

  void Put(const std::string& key) {
    pb::PutRequest put;
    put.set_key(key);
    put.set_value("v");
    ASSERT_TRUE(client_->PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  }

  static std::vector<std::string> Keys(const pb::RangeResponse& r) {
    std::vector<std::string> keys;
    for (const auto& kv : r.kvs()) keys.push_back(kv.key());
    return keys;
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

// etcd refuses a whole transaction that puts and deletes one key: a member that
// does so fails alone, and the batch's other members commit by themselves.
TEST_F(GroupCommitTest, AMemberEtcdRefusesFailsAloneAndTheOthersCommit) {
  auto first = Submit("ns", "/k/first", 1, PutIfAbsent("/k/first", "first"));
  auto a = Submit("ns", "/k/a", 2, PutIfAbsent("/k/a", "a"));
  pb::TxnRequest bad = PutIfAbsent("/k/bad", "bad");
  bad.add_success()->mutable_request_delete_range()->set_key("/k/bad");
  auto b = Submit("ns", "/k/bad", 3, std::move(bad));
  auto c = Submit("ns", "/k/c", 4, PutIfAbsent("/k/c", "c"));
  for (auto* r : {&first, &a, &c}) {
    auto t = r->get();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->succeeded());
  }
  auto tb = b.get();
  EXPECT_EQ(tb.status().code(), absl::StatusCode::kInvalidArgument) << tb.status();
  EXPECT_GT(CreateRevision("/k/a"), 0);
  EXPECT_GT(CreateRevision("/k/c"), 0);
  EXPECT_EQ(CreateRevision("/k/bad"), 0);
  auto batches = Batches();
  EXPECT_NE(std::find(batches.begin(), batches.end(), 3), batches.end())
      << "a, bad and c queued behind the first and went as one batch";
}

// A member whose call is about to end (here: its deadline has passed) does not
// share a batch with members that have time: the batch would go with its
// deadline, and every member would hear DEADLINE_EXCEEDED.
TEST_F(GroupCommitTest, AMemberNearItsDeadlineDoesNotCutTheOthersShort) {
  auto first = Submit("ns", "/k/first", 1, PutIfAbsent("/k/first", "first"));
  auto a = Submit("ns", "/k/a", 2, PutIfAbsent("/k/a", "a"));
  auto late = Submit("ns", "/k/late", 3, PutIfAbsent("/k/late", "late"),
                     std::chrono::system_clock::now() - std::chrono::milliseconds(1));
  auto c = Submit("ns", "/k/c", 4, PutIfAbsent("/k/c", "c"));
  ASSERT_TRUE(first.get().ok());
  auto ta = a.get(), tc = c.get(), tl = late.get();
  ASSERT_TRUE(ta.ok()) << ta.status();
  ASSERT_TRUE(tc.ok()) << tc.status();
  EXPECT_TRUE(ta->succeeded() && tc->succeeded());
  EXPECT_EQ(ta->header().revision(), tc->header().revision());  // together
  EXPECT_EQ(tl.status().code(), absl::StatusCode::kDeadlineExceeded) << tl.status();
  EXPECT_EQ(CreateRevision("/k/late"), 0);
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

TEST_F(GroupCommitTest, ARiderGoesInTheTransactionOfTheNextReleaseOfItsKey) {
  Put("/h/b");
  auto rider = Rider(2, "/w/a", seconds(20));
  // It waits for a release (its bound is far off).
  EXPECT_EQ(rider.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_EQ(CreateRevision("/w/a"), 0);
  auto release = Release(1, "/h/b", "/h/c");
  auto rr = release.get(), ra = rider.get();
  ASSERT_TRUE(rr.ok()) << rr.status();
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_TRUE(rr->succeeded());
  EXPECT_TRUE(ra->succeeded());
  // One transaction for both: one revision, one batch of two, each member
  // answered with its own responses.
  EXPECT_EQ(rr->header().revision(), ra->header().revision());
  EXPECT_EQ(CreateRevision("/w/a"), ra->header().revision());
  EXPECT_EQ(CreateRevision("/h/c"), ra->header().revision());
  EXPECT_EQ(Batches(), std::vector<int>{2});
  EXPECT_EQ(rr->responses_size(), 2);
  ASSERT_EQ(ra->responses_size(), 2);
  // The rider's read comes after the release's writes: the hand-over is seen.
  EXPECT_EQ(Keys(ra->responses(1).response_range()), std::vector<std::string>{"/h/c"});
}

// With max_in_flight transactions already in flight, a release waits in the queue,
// unsent: a rider of its key joins it there. etcd is paused (SIGSTOP) so that the
// first transaction stays in flight until the release and the rider are both in.
TEST_F(GroupCommitTest, ARiderJoinsAReleaseThatIsQueuedButNotYetSent) {
  Put("/h/b");
  etcd_->process()->Signal(SIGSTOP);
  auto blocker = Submit("ns", "other", 9, PutIfAbsent("/other", "x"));  // in flight
  auto release = Release(1, "/h/b", "/h/c");                            // queued behind it
  auto rider = Rider(2, "/w/a", seconds(20));
  EXPECT_EQ(release.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  etcd_->process()->Signal(SIGCONT);
  auto rb = blocker.get(), rr = release.get(), ra = rider.get();
  ASSERT_TRUE(rb.ok()) << rb.status();
  ASSERT_TRUE(rr.ok()) << rr.status();
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_TRUE(rr->succeeded());
  EXPECT_TRUE(ra->succeeded());
  EXPECT_EQ(rr->header().revision(), ra->header().revision());
  EXPECT_GT(rr->header().revision(), rb->header().revision());
  EXPECT_EQ(CreateRevision("/w/a"), CreateRevision("/h/c"));
  EXPECT_EQ(Batches(), (std::vector<int>{1, 2}));
  EXPECT_EQ(Keys(ra->responses(1).response_range()), std::vector<std::string>{"/h/c"});
}

// The pair must fit --max-txn-ops however it forms: a rider does not join a queued
// release when the two together would pass the bound (each alone fits).
TEST_F(GroupCommitTest, ARiderDoesNotJoinAQueuedReleaseWhenThePairPassesTheOpsBound) {
  GroupCommitOptions g;
  g.max_in_flight = 1;
  g.max_txn_ops = 3;  // a release and a rider have two success ops each
  commits_ = std::make_unique<GroupCommit>(client_.get(), g, [this](int members) {
    absl::MutexLock l(&mu_);
    batches_.push_back(members);
  });
  Put("/h/b");
  etcd_->process()->Signal(SIGSTOP);
  auto blocker = Submit("ns", "other", 9, PutIfAbsent("/other", "x"));
  auto release = Release(1, "/h/b", "/h/c");
  auto rider = Rider(2, "/w/a", std::chrono::milliseconds(300));
  etcd_->process()->Signal(SIGCONT);
  auto rb = blocker.get(), rr = release.get(), ra = rider.get();
  ASSERT_TRUE(rb.ok() && rr.ok() && ra.ok());
  EXPECT_TRUE(rr->succeeded());
  EXPECT_TRUE(ra->succeeded());
  EXPECT_NE(rr->header().revision(), ra->header().revision());
  EXPECT_EQ(Batches(), (std::vector<int>{1, 1, 1}));
}

TEST_F(GroupCommitTest, ARiderWithNoReleaseGoesAloneAfterItsBound) {
  auto rider = Rider(2, "/w/a", std::chrono::milliseconds(50));
  auto ra = rider.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_TRUE(ra->succeeded());
  EXPECT_EQ(CreateRevision("/w/a"), ra->header().revision());
  EXPECT_EQ(Batches(), std::vector<int>{1});
  // A later release of the key goes alone: nobody waits to ride.
  Put("/h/b");
  auto rr = Release(1, "/h/b", "/h/c").get();
  ASSERT_TRUE(rr.ok());
  EXPECT_TRUE(rr->succeeded());
  EXPECT_EQ(Batches(), (std::vector<int>{1, 1}));
}

TEST_F(GroupCommitTest, RidersOfOneKeyRideInTheirOrderOnePerRelease) {
  Put("/h/b");
  Put("/h/c");
  auto first = Rider(2, "/w/a", seconds(20));
  auto second = Rider(3, "/w/d", seconds(20));
  auto r1 = Release(1, "/h/b", "/h/x").get();
  auto a = first.get();
  ASSERT_TRUE(r1.ok() && a.ok());
  EXPECT_EQ(a->header().revision(), r1->header().revision());
  // Two riders in one revision would tie in the queue: the second waits on.
  EXPECT_EQ(second.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  auto r2 = Release(4, "/h/c", "/h/y").get();
  auto d = second.get();
  ASSERT_TRUE(r2.ok() && d.ok());
  EXPECT_TRUE(d->succeeded());
  EXPECT_EQ(d->header().revision(), r2->header().revision());
  EXPECT_LT(CreateRevision("/w/a"), CreateRevision("/w/d"));
  EXPECT_EQ(Batches(), (std::vector<int>{2, 2}));
}

TEST_F(GroupCommitTest, ARiderOfABatchThatFailsIsAnsweredByItsOwnTransaction) {
  // The release's hold is gone (its compare fails): the batch fails, and each
  // member goes alone, the release to its else branch, the rider to its put.
  auto rider = Rider(2, "/w/a", seconds(20));
  auto rr = Release(1, "/h/gone", "/h/c").get();
  auto ra = rider.get();
  ASSERT_TRUE(rr.ok() && ra.ok());
  EXPECT_FALSE(rr->succeeded());
  ASSERT_EQ(rr->responses_size(), 1);
  EXPECT_EQ(rr->responses(0).response_range().kvs_size(), 0);
  EXPECT_TRUE(ra->succeeded());
  EXPECT_EQ(CreateRevision("/w/a"), ra->header().revision());
  EXPECT_EQ(CreateRevision("/h/c"), 0);
  EXPECT_EQ(Batches(), std::vector<int>{2});
}

TEST_F(GroupCommitTest, ARiderNeverRidesWithItsOwnSessionOrAReleaseThatWritesWhatItCompares) {
  Put("/h/b");
  // Same session as the release: it waits on and goes alone after its bound.
  auto own = Rider(1, "/w/a", std::chrono::milliseconds(300));
  auto r1 = Release(1, "/h/b", "/h/c").get();
  auto ra = own.get();
  ASSERT_TRUE(r1.ok() && ra.ok());
  EXPECT_NE(ra->header().revision(), r1->header().revision());
  // The release puts the key the rider compares: not the same as one after the
  // other, so no ride.
  auto clash = Rider(2, "/h/d", std::chrono::milliseconds(300));
  auto r2 = Release(3, "/h/c", "/h/d").get();
  auto rc = clash.get();
  ASSERT_TRUE(r2.ok() && rc.ok());
  EXPECT_TRUE(r2->succeeded());
  EXPECT_FALSE(rc->succeeded()) << "alone, after the release put /h/d, its compare fails";
  EXPECT_EQ(Batches(), (std::vector<int>{1, 1, 1, 1}));
}

TEST(RidesAfterTest, OnlyDisjointSingleKeyWritesPair) {
  auto txn = [](std::vector<std::string> compares, std::vector<std::string> puts,
                std::vector<std::string> deletes) {
    pb::TxnRequest t;
    for (const auto& c : compares) {
      auto* cmp = AddCompare(&t, c, pb::Compare::CREATE, pb::Compare::EQUAL);
      if (c.back() == '/') cmp->set_range_end(c.substr(0, c.size() - 1) + "0");
    }
    for (const auto& k : puts) t.add_success()->mutable_request_put()->set_key(k);
    for (const auto& k : deletes) t.add_success()->mutable_request_delete_range()->set_key(k);
    return t;
  };
  const auto release = txn({"/h/b", "/epoch"}, {"/h/c", "/mark"}, {"/h/b", "/w/c"});
  EXPECT_TRUE(GroupCommit::RidesAfter(release, txn({"/w/a", "/claims/a/"}, {"/w/a"}, {})));
  // The release writes a key, or a key in a range, that the rider compares.
  EXPECT_FALSE(GroupCommit::RidesAfter(release, txn({"/w/c"}, {"/w/a"}, {})));
  EXPECT_FALSE(GroupCommit::RidesAfter(release, txn({"/h/"}, {"/w/a"}, {})));
  // A compare of every key from one on (range_end "\0"): what the release writes
  // at or after it counts, what it writes before it does not.
  auto from = [&](const std::string& key) {
    auto t = txn({}, {"/w/a"}, {});
    AddCompare(&t, key, pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_range_end(std::string(1, '\0'));
    return t;
  };
  EXPECT_FALSE(GroupCommit::RidesAfter(release, from("/mark")));
  EXPECT_TRUE(GroupCommit::RidesAfter(release, from("/x")));
  // Both write one key (etcd would refuse the transaction).
  EXPECT_FALSE(GroupCommit::RidesAfter(release, txn({"/w/a"}, {"/mark"}, {})));
  EXPECT_FALSE(GroupCommit::RidesAfter(release, txn({"/w/a"}, {}, {"/w/c"})));
  // A range delete is not understood.
  auto ranged = txn({"/w/a"}, {"/w/a"}, {});
  auto* del = ranged.add_success()->mutable_request_delete_range();
  del->set_key("/x/");
  del->set_range_end("/x0");
  EXPECT_FALSE(GroupCommit::RidesAfter(release, ranged));
  // The rider compares keys the release only compares: fine.
  EXPECT_TRUE(GroupCommit::RidesAfter(release, txn({"/epoch"}, {"/w/a"}, {})));
}

}  // namespace
}  // namespace holdfast::lock
