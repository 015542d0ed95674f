// The etcd client layer against a real etcd-server process.
#include "etcd/client.h"

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <signal.h>

#include <gtest/gtest.h>
#include "absl/strings/str_cat.h"

#include "dev/etcd_process.h"
#include "dev/scratch_etcd.h"
#include "dev/silent_endpoint.h"
#include "etcd/watch_hub.h"

namespace holdfast::etcd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = dev::ScratchEtcd::Start("etcd");
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    etcd_ = &scratch_->etcd();
    timers_ = std::make_shared<TimerQueue>();
    ClientOptions co;
    co.endpoints = {etcd_->endpoint()};
    auto c = Client::Create(co, timers_);
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();
    etcd_ = nullptr;
    scratch_.reset();
  }

  // Another client of this fixture's etcd, trying `endpoints` in order.
  std::unique_ptr<Client> Connect(std::vector<std::string> endpoints) {
    ClientOptions co;
    co.endpoints = std::move(endpoints);
    auto c = Client::Create(co, timers_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  pb::PutResponse Put(const std::string& k, const std::string& v, int64_t lease = 0) {
    pb::PutRequest p;
    p.set_key(k);
    p.set_value(v);
    p.set_lease(lease);
    auto r = client_->PutSync(p, DeadlineIn(seconds(5)));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or(pb::PutResponse());
  }

  std::unique_ptr<dev::ScratchEtcd> scratch_;
  dev::EtcdProcess* etcd_ = nullptr;  // scratch_'s
  std::shared_ptr<TimerQueue> timers_;
  std::unique_ptr<Client> client_;
};

TEST_F(EtcdClientTest, HeadersCarryClusterIdAndRevision) {
  auto status = client_->StatusSync(DeadlineIn(seconds(5)));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(status->header().cluster_id(), 0u);
  auto put = Put("/t/a", "1");
  EXPECT_EQ(put.header().cluster_id(), status->header().cluster_id());
  EXPECT_GT(put.header().revision(), 0);
  EXPECT_EQ(client_->last_cluster_id(), status->header().cluster_id());
  EXPECT_GE(client_->last_revision(), put.header().revision());
}

TEST_F(EtcdClientTest, CallbacksRunOnTheClientsLoopWhereABlockingCallIsRefused) {
  Put("/t/loop", "1");
  std::promise<std::pair<EventLoop*, absl::Status>> seen;
  pb::RangeRequest r;
  r.set_key("/t/loop");
  client_->Range(r, DeadlineIn(seconds(5)), [&](absl::StatusOr<pb::RangeResponse> got) {
    // A blocking call here would wait for this very thread: refused, not hung.
    pb::RangeRequest again;
    again.set_key("/t/loop");
    auto nested = client_->RangeSync(again, DeadlineIn(seconds(5)));
    seen.set_value({EventLoop::Current(), nested.status()});
  });
  auto f = seen.get_future();
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  auto [loop, nested] = f.get();
  EXPECT_EQ(loop, &client_->loop());
  EXPECT_EQ(nested.code(), absl::StatusCode::kFailedPrecondition) << nested;
  EXPECT_NE(nested.message().find("blocking call on event loop thread"), std::string::npos)
      << nested;
  // The refused call changed nothing and the client goes on serving.
  auto after = client_->RangeSync(r, DeadlineIn(seconds(5)));
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->kvs_size(), 1);
  EXPECT_EQ(after->kvs(0).value(), "1");
}

TEST_F(EtcdClientTest, ClientsMayShareOneLoop) {
  EventLoop loop("shared-loop");
  ClientOptions co;
  co.endpoints = {etcd_->endpoint()};
  co.loop = &loop;
  auto a = Client::Create(co, timers_);
  auto b = Client::Create(co, timers_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(&(*a)->loop(), &loop);
  EXPECT_EQ(&(*b)->loop(), &loop);
  pb::PutRequest p;
  p.set_key("/t/shared");
  p.set_value("x");
  ASSERT_TRUE((*a)->PutSync(p, DeadlineIn(seconds(5))).ok());
  pb::RangeRequest r;
  r.set_key("/t/shared");
  auto got = (*b)->RangeSync(r, DeadlineIn(seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kvs_size(), 1);
  // Watches and renewals on the shared loop too.
  std::promise<void> event;
  std::atomic<bool> told{false};
  WatchSpec spec;
  spec.key = "/t/shared";
  spec.start_revision = got->header().revision() + 1;
  auto id = (*b)->watches().Watch(spec, [&](absl::StatusOr<WatchBatch> batch) {
    if (batch.ok() && !batch->events.empty() && !told.exchange(true)) event.set_value();
  });
  ASSERT_TRUE((*a)->PutSync(p, DeadlineIn(seconds(5))).ok());
  EXPECT_EQ(event.get_future().wait_for(seconds(10)), std::future_status::ready);
  (*b)->watches().Cancel(id);
  a->reset();
  b->reset();  // the clients go first; the loop they used outlives them
}

TEST_F(EtcdClientTest, TxnCompareOverARange) {
  Put("/t/hold/a\x01", "x");  // outside [a\0, a\1)
  pb::TxnRequest txn;
  auto* c = txn.add_compare();
  c->set_key(std::string("/t/hold/a\0", 10));
  c->set_range_end("/t/hold/a\x01");
  c->set_target(pb::Compare::CREATE);
  c->set_result(pb::Compare::EQUAL);
  c->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(std::string("/t/hold/a\0" "1", 11));
  put->set_value("mine");
  auto first = client_->TxnSync(txn, DeadlineIn(seconds(5)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded());  // the empty range compares as create_revision 0
  auto second = client_->TxnSync(txn, DeadlineIn(seconds(5)));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->succeeded());  // now a key in the range exists
}

TEST_F(EtcdClientTest, LeaseGrantKeepAliveRevoke) {
  pb::LeaseGrantRequest g;
  g.set_ttl(5);
  auto lease = client_->LeaseGrantSync(g, DeadlineIn(seconds(5)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  Put("/t/leased", "v", lease->id());
  for (int i = 0; i < 3; ++i) {
    auto ka = Await<pb::LeaseKeepAliveResponse>(
        [&](auto cb) { client_->KeepAlive(lease->id(), DeadlineIn(seconds(5)), cb); });
    ASSERT_TRUE(ka.ok()) << ka.status();
    EXPECT_EQ(ka->id(), lease->id());
    EXPECT_GT(ka->ttl(), 0);
  }
  pb::LeaseRevokeRequest r;
  r.set_id(lease->id());
  auto revoked = Await<pb::LeaseRevokeResponse>(
      [&](auto cb) { client_->LeaseRevoke(r, DeadlineIn(seconds(5)), cb); });
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  pb::RangeRequest get;
  get.set_key("/t/leased");
  EXPECT_EQ(client_->RangeSync(get, DeadlineIn(seconds(5)))->kvs_size(), 0);
  auto gone = Await<pb::LeaseKeepAliveResponse>(
      [&](auto cb) { client_->KeepAlive(lease->id(), DeadlineIn(seconds(5)), cb); });
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->ttl(), 0);  // etcd answers TTL 0 for a lease it does not know
}

TEST_F(EtcdClientTest, ManyWatchersOneStreamWithPrevKv) {
  auto base = Put("/t/w/x", "0").header().revision();
  std::promise<WatchBatch> got_x, got_y;
  auto& hub = client_->watches();
  WatchSpec sx;
  sx.key = "/t/w/x";
  sx.start_revision = base + 1;
  sx.prev_kv = true;
  bool x_done = false, y_done = false;
  hub.Watch(sx, [&](absl::StatusOr<WatchBatch> b) {
    if (!x_done && b.ok()) {
      x_done = true;
      got_x.set_value(*b);
    }
  });
  WatchSpec sy;
  sy.key = "/t/w/";
  sy.range_end = "/t/w0";
  sy.start_revision = base + 1;
  hub.Watch(sy, [&](absl::StatusOr<WatchBatch> b) {
    if (!y_done && b.ok()) {
      y_done = true;
      got_y.set_value(*b);
    }
  });
  Put("/t/w/x", "1");
  auto fx = got_x.get_future();
  auto fy = got_y.get_future();
  ASSERT_EQ(fx.wait_for(seconds(10)), std::future_status::ready);
  ASSERT_EQ(fy.wait_for(seconds(10)), std::future_status::ready);
  auto bx = fx.get();
  ASSERT_EQ(bx.events.size(), 1u);
  EXPECT_EQ(bx.events[0].kv().value(), "1");
  EXPECT_EQ(bx.events[0].prev_kv().value(), "0");
  EXPECT_EQ(fy.get().events.size(), 1u);
  EXPECT_EQ(hub.size(), 2u);
}

// What a watcher was sent, in order: "put a=1", "delete a", ...; or the error.
class Seen {
 public:
  WatchCallback Callback() {
    return [this](absl::StatusOr<WatchBatch> b) {
      std::lock_guard<std::mutex> l(mu_);
      if (!b.ok()) {
        items_.push_back("error " + std::string(absl::StatusCodeToString(b.status().code())));
      } else {
        for (const auto& e : b->events) {
          std::string key = e.kv().key().substr(e.kv().key().rfind('/') + 1);
          items_.push_back(e.type() == mvccpb::Event::PUT ? "put " + key + "=" + e.kv().value()
                                                          : "delete " + key);
        }
      }
      cv_.notify_all();
    };
  }
  // The items once there are `n` (empty after 10 s without).
  std::vector<std::string> Wait(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, seconds(10), [&] { return items_.size() >= n; })) return {};
    return items_;
  }
  std::vector<std::string> Now() {
    std::lock_guard<std::mutex> l(mu_);
    return items_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> items_;
};

TEST_F(EtcdClientTest, WatchersWithinOneRangeShareOneEtcdWatch) {
  const int64_t base = Put("/t/g/a", "0").header().revision();
  auto& hub = client_->watches();
  auto spec = [&](std::string key, std::string end, int64_t start) {
    WatchSpec s;
    s.key = std::move(key);
    s.range_end = std::move(end);
    s.start_revision = start;
    return s;
  };
  Seen a_puts, b_all, deletes, late;
  WatchSpec sa = spec("/t/g/a", "", base + 1);
  sa.no_delete = true;
  WatchSpec sd = spec("/t/g/", "/t/g0", base + 1);
  sd.no_put = true;
  WatchId a = hub.WatchWithin("/t/g/", "/t/g0", sa, a_puts.Callback());
  WatchId b = hub.WatchWithin("/t/g/", "/t/g0", spec("/t/g/b", "", base + 1), b_all.Callback());
  WatchId d = hub.WatchWithin("/t/g/", "/t/g0", sd, deletes.Callback());
  EXPECT_EQ(hub.size(), 3u);
  EXPECT_EQ(hub.etcd_watches(), 1u);

  Put("/t/g/a", "1");
  Put("/t/g/b", "1");
  pb::DeleteRangeRequest del;
  del.set_key("/t/g/a");
  ASSERT_TRUE(client_->DeleteRangeSync(del, DeadlineIn(seconds(5))).ok());
  EXPECT_EQ(deletes.Wait(1), std::vector<std::string>{"delete a"});
  EXPECT_EQ(a_puts.Wait(1), std::vector<std::string>{"put a=1"});
  EXPECT_EQ(b_all.Wait(1), std::vector<std::string>{"put b=1"});

  // The shared watch has delivered revisions after base: a watcher from base + 1
  // gets a watch of its own, and with it every event, none lost.
  WatchId l = hub.WatchWithin("/t/g/", "/t/g0", spec("/t/g/", "/t/g0", base + 1), late.Callback());
  EXPECT_EQ(hub.etcd_watches(), 2u);
  EXPECT_EQ(late.Wait(3), (std::vector<std::string>{"put a=1", "put b=1", "delete a"}));
  // ... and one from after them joins the shared watch.
  const int64_t now = Put("/t/g/c", "1").header().revision();
  Seen joined;
  WatchId j = hub.WatchWithin("/t/g/", "/t/g0", spec("/t/g/c", "", now + 1), joined.Callback());
  EXPECT_EQ(hub.etcd_watches(), 2u);
  Put("/t/g/c", "2");
  EXPECT_EQ(joined.Wait(1), std::vector<std::string>{"put c=2"});  // not c=1: before its start
  EXPECT_EQ(b_all.Now(), std::vector<std::string>{"put b=1"});      // not c's

  for (WatchId id : {a, b, d, l, j}) hub.Cancel(id);
  EXPECT_EQ(hub.size(), 0u);
  EXPECT_EQ(hub.etcd_watches(), 0u);  // the last one out ended the shared watch
  // A new watcher in the range starts a new shared watch from its own start.
  Seen again;
  WatchId n = hub.WatchWithin("/t/g/", "/t/g0", spec("/t/g/c", "", base + 1), again.Callback());
  EXPECT_EQ(hub.etcd_watches(), 1u);
  EXPECT_EQ(again.Wait(2), (std::vector<std::string>{"put c=1", "put c=2"}));
  hub.Cancel(n);
}

TEST_F(EtcdClientTest, AnErrorOfASharedWatchReachesEveryWatcherInIt) {
  Put("/t/e/x", "0");
  const int64_t last = Put("/t/e/x", "1").header().revision();
  pb::CompactionRequest c;
  c.set_revision(last);
  ASSERT_TRUE(Await<pb::CompactionResponse>([&](auto cb) {
                client_->Compact(c, DeadlineIn(seconds(5)), cb);
              }).ok());
  auto& hub = client_->watches();
  Seen x, y;
  WatchSpec sx, sy;
  sx.key = "/t/e/x";
  sy.key = "/t/e/y";
  sx.start_revision = sy.start_revision = 1;  // compacted
  hub.WatchWithin("/t/e/", "/t/e0", sx, x.Callback());
  hub.WatchWithin("/t/e/", "/t/e0", sy, y.Callback());
  EXPECT_EQ(x.Wait(1), std::vector<std::string>{"error OUT_OF_RANGE"});
  EXPECT_EQ(y.Wait(1), std::vector<std::string>{"error OUT_OF_RANGE"});
  EXPECT_EQ(hub.size(), 0u);
  EXPECT_EQ(hub.etcd_watches(), 0u);
}

// A catch-up larger than what the client takes in one answer (an auditor
// behind, large revisions) comes in parts, which the hub delivers together:
// whole revisions, every event once. Asked as one response, it was refused at
// every reconnect (RESOURCE_EXHAUSTED) and the watcher waited forever.
TEST_F(EtcdClientTest, ACatchUpLargerThanTheReceiveLimitArrivesInWholeRevisions) {
  ClientOptions co;
  co.endpoints = {etcd_->endpoint()};
  co.max_receive_bytes = 2 << 20;  // above etcd's 1.5 MiB parts
  auto small = Client::Create(co, timers_);
  ASSERT_TRUE(small.ok()) << small.status();
  const int64_t base = Put("/t/big-base", "0").header().revision();
  constexpr int kRevisions = 4, kKeys = 40;
  for (int r = 0; r < kRevisions; ++r) {  // 800 KiB a revision, 3.2 MiB in all
    pb::TxnRequest txn;
    for (int k = 0; k < kKeys; ++k) {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(absl::StrCat("/t/big/", r, "/", k));
      put->set_value(std::string(20 << 10, static_cast<char>('a' + r)));
    }
    auto t = client_->TxnSync(std::move(txn), DeadlineIn(seconds(10)));
    ASSERT_TRUE(t.ok()) << t.status();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchBatch> batches;
  size_t events = 0;
  WatchSpec spec;
  spec.key = "/t/big/";
  spec.range_end = "/t/big0";
  spec.start_revision = base + 1;
  (*small)->watches().Watch(spec, [&](absl::StatusOr<WatchBatch> b) {
    if (!b.ok()) return;
    std::lock_guard<std::mutex> l(mu);
    events += b->events.size();
    batches.push_back(*std::move(b));
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, seconds(30), [&] { return events >= kRevisions * kKeys; }))
      << events << " events of " << kRevisions * kKeys;
  EXPECT_EQ(events, static_cast<size_t>(kRevisions * kKeys));
  for (const WatchBatch& b : batches) {
    std::map<int64_t, int> per_revision;
    for (const auto& e : b.events) ++per_revision[e.kv().mod_revision()];
    for (const auto& [revision, n] : per_revision) {
      EXPECT_EQ(n, kKeys) << "revision " << revision << " split across batches";
    }
  }
}

TEST_F(EtcdClientTest, WatchResumesFromARevisionAcrossAnEtcdRestart) {
  auto base = Put("/t/r", "0").header().revision();
  std::mutex mu;
  std::vector<std::string> seen;
  std::condition_variable cv;
  WatchSpec s;
  s.key = "/t/r";
  s.start_revision = base + 1;
  client_->watches().Watch(s, [&](absl::StatusOr<WatchBatch> b) {
    if (!b.ok()) return;
    std::lock_guard<std::mutex> l(mu);
    for (auto& e : b->events) seen.push_back(e.kv().value());
    cv.notify_all();
  });
  Put("/t/r", "1");
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, seconds(10), [&] { return seen.size() >= 1; }));
  }
  ASSERT_TRUE(etcd_->Restart().ok());
  // Writes after the restart reach the watcher through a new stream, none twice.
  for (int i = 2; i <= 3; ++i) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      pb::PutRequest p;
      p.set_key("/t/r");
      p.set_value(std::to_string(i));
      if (client_->PutSync(p, DeadlineIn(seconds(2))).ok()) break;
    }
  }
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, seconds(20), [&] { return seen.size() >= 3; }));
  EXPECT_EQ(seen, (std::vector<std::string>{"1", "2", "3"}));
}

TEST_F(EtcdClientTest, CompactedStartRevisionIsAnError) {
  Put("/t/c", "0");
  auto last = Put("/t/c", "1").header().revision();
  pb::CompactionRequest c;
  c.set_revision(last);
  ASSERT_TRUE(Await<pb::CompactionResponse>([&](auto cb) {
                client_->Compact(c, DeadlineIn(seconds(5)), cb);
              }).ok());
  std::promise<absl::Status> err;
  WatchSpec s;
  s.key = "/t/c";
  s.start_revision = 1;
  client_->watches().Watch(s, [&](absl::StatusOr<WatchBatch> b) {
    if (!b.ok()) err.set_value(b.status());
  });
  auto f = err.get_future();
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  auto st = f.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("compacted"), std::string::npos);
}

TEST_F(EtcdClientTest, FailsOverToAnotherEndpoint) {
  auto c = Connect({"127.0.0.1:1", etcd_->endpoint()});  // the first refuses connections
  ASSERT_NE(c, nullptr);
  pb::RangeRequest r;
  r.set_key("/t/none");
  // Reads retry once on the next endpoint.
  auto resp = c->RangeSync(r, DeadlineIn(seconds(5)));
  EXPECT_TRUE(resp.ok()) << resp.status();
  // And later calls start there.
  EXPECT_EQ(c->PickEndpoint().second, 1u);
}

TEST_F(EtcdClientTest, AReadWithNoAnswerMovesTheClientOn) {
  dev::SilentEndpoint silent;
  ASSERT_FALSE(silent.address().empty());
  auto c = Connect({silent.address(), etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  pb::RangeRequest r;
  r.set_key("/t/none");
  auto first = c->RangeSync(r, DeadlineIn(seconds(1)));
  EXPECT_EQ(first.status().code(), absl::StatusCode::kDeadlineExceeded) << first.status();
  EXPECT_EQ(c->PickEndpoint().second, 1u);
  auto second = c->RangeSync(r, DeadlineIn(seconds(5)));
  EXPECT_TRUE(second.ok()) << second.status();
  // A tight deadline says nothing about the endpoint: it does not move the client.
  auto tight = c->RangeSync(r, DeadlineIn(milliseconds(1)));
  EXPECT_EQ(c->PickEndpoint().second, 1u) << tight.status();
}

// A renewal that gets no answer moves the client, and the Watch stream stuck on
// the silent endpoint moves with it: the watcher sees a put made afterwards, and
// renewals go on over the new stream.
TEST_F(EtcdClientTest, StreamsFollowTheClientOffASilentEndpoint) {
  dev::SilentEndpoint silent;
  ASSERT_FALSE(silent.address().empty());
  auto c = Connect({silent.address(), etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  pb::LeaseGrantRequest g;
  g.set_ttl(30);
  auto lease = client_->LeaseGrantSync(g, DeadlineIn(seconds(5)));
  ASSERT_TRUE(lease.ok());

  std::promise<int64_t> seen;
  std::atomic<bool> once{false};
  WatchSpec spec;
  spec.key = "/t/moved";
  spec.start_revision = Put("/t/before", "x").header().revision() + 1;
  c->watches().Watch(spec, [&](absl::StatusOr<WatchBatch> b) {
    if (b.ok() && !b->events.empty() && !once.exchange(true)) {
      seen.set_value(b->events[0].kv().mod_revision());
    }
  });

  std::promise<absl::Status> first;
  c->KeepAlive(lease->id(), DeadlineIn(seconds(1)),
                  [&](absl::StatusOr<pb::LeaseKeepAliveResponse> r) { first.set_value(r.status()); });
  auto f = first.get_future();
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c->PickEndpoint().second, 1u);

  std::promise<absl::StatusOr<pb::LeaseKeepAliveResponse>> second;
  c->KeepAlive(lease->id(), DeadlineIn(seconds(5)),
                  [&](absl::StatusOr<pb::LeaseKeepAliveResponse> r) { second.set_value(r); });
  auto s2 = second.get_future();
  ASSERT_EQ(s2.wait_for(seconds(10)), std::future_status::ready);
  auto renewed = s2.get();
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_GT(renewed->ttl(), 0);

  const int64_t put_rev = Put("/t/moved", "v").header().revision();
  auto w = seen.get_future();
  ASSERT_EQ(w.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(w.get(), put_rev);
}

// A member cut off from its cluster's quorum still answers Status (etcd answers
// it on its own), saying it has no leader. A renewal it cannot serve must move
// the client on, as a silent member does: that answer is no sign of health.
// (Its Watch stream moves with it: StreamsFollowTheClientOffASilentEndpoint.)
TEST_F(EtcdClientTest, AMemberWithoutALeaderIsNoPlaceToStay) {
  std::vector<std::unique_ptr<dev::EtcdProcess>> members;
  auto eos = dev::ClusterMembers(3, (scratch_->dir() / "member").string());
  ASSERT_TRUE(eos.ok()) << eos.status();
  for (const auto& eo : *eos) {
    auto e = dev::EtcdProcess::Start(eo);
    ASSERT_TRUE(e.ok()) << e.status();
    members.push_back(std::move(*e));
  }
  for (auto& m : members) ASSERT_TRUE(m->WaitHealthy().ok());
  auto alone = Connect({members[0]->endpoint()});
  // The next endpoint stands for the rest of the cluster (any member that answers).
  auto c = Connect({members[0]->endpoint(), etcd_->endpoint()});
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(c, nullptr);
  pb::LeaseGrantRequest g;
  g.set_ttl(30);
  auto lease = alone->LeaseGrantSync(g, DeadlineIn(seconds(5)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto renew = [&](std::chrono::milliseconds within) {
    std::promise<absl::Status> done;
    c->KeepAlive(lease->id(), DeadlineIn(within),
                 [&](absl::StatusOr<pb::LeaseKeepAliveResponse> r) { done.set_value(r.status()); });
    auto f = done.get_future();
    EXPECT_EQ(f.wait_for(within + seconds(5)), std::future_status::ready);
    return f.get();
  };
  ASSERT_TRUE(renew(seconds(5)).ok());
  ASSERT_EQ(c->PickEndpoint().second, 0u);

  members[1]->process()->Signal(SIGSTOP);
  members[2]->process()->Signal(SIGSTOP);
  bool leaderless = false;
  for (int i = 0; i < 100 && !leaderless; ++i) {
    auto st = alone->StatusSync(DeadlineIn(seconds(1)));
    leaderless = st.ok() && st->leader() == 0;
    if (!leaderless) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(leaderless) << "member 0 kept a leader";
  const absl::Status unserved = renew(seconds(2));
  EXPECT_FALSE(unserved.ok());
  EXPECT_EQ(c->PickEndpoint().second, 1u) << unserved;
  // A linearizable read (holdfastd's health probe of each cluster) finds such a
  // member too: it cannot serve the read, so no answer comes, and Status says why.
  auto reader = Connect({members[0]->endpoint(), etcd_->endpoint()});
  ASSERT_NE(reader, nullptr);
  pb::RangeRequest probe;
  probe.set_key("/t/probe");
  auto unread = reader->RangeSync(probe, DeadlineIn(seconds(1)));
  EXPECT_FALSE(unread.ok());
  EXPECT_EQ(reader->PickEndpoint().second, 1u) << unread.status();
  members[1]->process()->Signal(SIGCONT);
  members[2]->process()->Signal(SIGCONT);
}

TEST_F(EtcdClientTest, DeadlineIsEnforced) {
  etcd_->process()->Signal(SIGSTOP);
  pb::PutRequest p;
  p.set_key("/t/d");
  auto r = client_->PutSync(p, DeadlineIn(milliseconds(300)));
  etcd_->process()->Signal(SIGCONT);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace holdfast::etcd
