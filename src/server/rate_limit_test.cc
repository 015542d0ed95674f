#include "server/rate_limit.h"

#include <gtest/gtest.h>

#include <cmath>

namespace holdfast::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A clock the test moves by hand.
struct FakeClock {
  std::chrono::steady_clock::time_point now{std::chrono::hours(1)};
  RateLimiter::Clock AsClock() {
    return [this] { return now; };
  }
};

TEST(RateLimiterTest, UnlimitedNamespacesAreAlwaysAdmittedAndNotMeasured) {
  FakeClock clock;
  RateLimiter limiter({}, clock.AsClock());
  for (int i = 0; i < 10'000; ++i) EXPECT_TRUE(limiter.Admit("ns", 0).admitted);
  EXPECT_TRUE(limiter.Demand().empty());
}

TEST(RateLimiterTest, OneReplicaAdmitsTheBurstThenTheQuotaPerSecond) {
  FakeClock clock;
  RateLimiter limiter({}, clock.AsClock());
  // Q = 10/s, burst 0.5 s: 5 at once, then one every 100 ms.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(limiter.Admit("ns", 10).admitted) << i;
  auto refused = limiter.Admit("ns", 10);
  EXPECT_FALSE(refused.admitted);
  EXPECT_EQ(refused.retry_after, milliseconds(100));
  clock.now += milliseconds(60);
  refused = limiter.Admit("ns", 10);
  EXPECT_FALSE(refused.admitted);
  EXPECT_NEAR(refused.retry_after.count(), 40, 1);
  clock.now += refused.retry_after;
  EXPECT_TRUE(limiter.Admit("ns", 10).admitted);
  EXPECT_FALSE(limiter.Admit("ns", 10).admitted);

  // Hammered for 10 s (one attempt per ms): at most Q*T + the burst.
  int admitted = 0;
  for (int ms = 0; ms < 10'000; ++ms) {
    clock.now += milliseconds(1);
    admitted += limiter.Admit("ns", 10).admitted;
  }
  EXPECT_LE(admitted, 10 * 10 + 5);
  EXPECT_GE(admitted, 10 * 10 - 1);
  // Namespaces are independent.
  EXPECT_TRUE(limiter.Admit("other", 10).admitted);
}

// Releases and closes are charged, never refused: with the bucket empty they run
// it into debt (at most its capacity), which the refusable operations wait out.
TEST(RateLimiterTest, ChargedOperationsAreNeverRefusedAndTheRestWaitForThem) {
  FakeClock clock;
  RateLimiter limiter({}, clock.AsClock());
  // Q = 10/s, burst 0.5 s: a bucket of 5.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(limiter.Admit("ns", 10).admitted) << i;
  EXPECT_FALSE(limiter.Admit("ns", 10).admitted);
  for (int i = 0; i < 3; ++i) limiter.Charge("ns", 10);  // 3 tokens of debt
  auto refused = limiter.Admit("ns", 10);
  EXPECT_FALSE(refused.admitted);
  EXPECT_EQ(refused.retry_after, milliseconds(400));  // the debt and one token, at 10/s
  clock.now += milliseconds(399);
  EXPECT_FALSE(limiter.Admit("ns", 10).admitted);
  clock.now += milliseconds(1);
  EXPECT_TRUE(limiter.Admit("ns", 10).admitted);

  // The debt is bounded by the bucket: 100 charges cost at most 5 tokens more.
  for (int i = 0; i < 100; ++i) limiter.Charge("ns", 10);
  refused = limiter.Admit("ns", 10);
  EXPECT_FALSE(refused.admitted);
  EXPECT_EQ(refused.retry_after, milliseconds(600));
  // Charges count towards the demand that replicas publish.
  EXPECT_GT(limiter.Demand().at("ns"), 0.0);
  // Unlimited namespaces are not measured.
  limiter.Charge("free", 0);
  EXPECT_EQ(limiter.Demand().count("free"), 0u);
}

TEST(RateLimiterTest, AQuotaChangeTakesEffectAtTheNextOperation) {
  FakeClock clock;
  RateLimiter limiter({}, clock.AsClock());
  EXPECT_TRUE(limiter.Admit("ns", 1).admitted);
  EXPECT_FALSE(limiter.Admit("ns", 1).admitted);
  EXPECT_TRUE(limiter.Admit("ns", 0).admitted);  // lifted
  EXPECT_TRUE(limiter.Admit("ns", 0).admitted);
  // Raised: a fresh bucket of the new size.
  int admitted = 0;
  for (int i = 0; i < 100; ++i) admitted += limiter.Admit("ns", 100).admitted;
  EXPECT_EQ(admitted, 50);
  // Lowered: the bucket shrinks to the new capacity (one operation).
  clock.now += seconds(1);
  admitted = 0;
  for (int i = 0; i < 100; ++i) admitted += limiter.Admit("ns", 2).admitted;
  EXPECT_EQ(admitted, 1);
}

TEST(RateLimiterTest, SharesAreMaxMinFairOverPublishedDemandAndSumToTheQuota) {
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 0, {}, 1), 100);
  // Nobody has published demand: equal shares.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 0, {}, 2), 50);
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 0, {}, 4), 25);
  // Both want more than half: half each.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 1000, {300}, 2), 50);
  // A light replica gets its demand plus a fifth; the heavy one the rest.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 10, {1000}, 2), 12);
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 1000, {10}, 2), 88);
  // An idle replica keeps the floor Q/(10N) = 5.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 0, {1000}, 2), 5);
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 1000, {}, 2), 95);
  // Less demand than the quota: each gets its need, plus the surplus evenly.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 10, {20}, 2), 12 + (100 - 12 - 24) / 2.0);
  // More entries than replicas counted: the entries win.
  EXPECT_DOUBLE_EQ(RateLimiter::ShareOf(100, 0, {0, 0, 0}, 1), 25);

  // Replicas that see the same published demands split exactly Q.
  for (const std::vector<double>& demands :
       {std::vector<double>{0, 3, 40, 500, 7}, std::vector<double>{1, 2, 3},
        std::vector<double>{80, 90, 100, 1000}}) {
    for (int replicas : {static_cast<int>(demands.size()), 6, 9}) {
      double total = 0;
      for (size_t i = 0; i < demands.size(); ++i) {
        std::vector<double> others;
        for (size_t j = 0; j < demands.size(); ++j) {
          if (j != i) others.push_back(demands[j]);
        }
        total += RateLimiter::ShareOf(100, demands[i], others, replicas);
      }
      // Replicas without any published demand hold the same share each.
      total += (replicas - static_cast<int>(demands.size())) *
               RateLimiter::ShareOf(100, 0, demands, replicas);
      EXPECT_NEAR(total, 100, 1e-9) << replicas;
    }
  }
}

// Two replicas publish to each other every 500 ms, as ReplicaSet does through etcd.
class TwoReplicas {
 public:
  explicit TwoReplicas(FakeClock* clock) : a_({}, clock->AsClock()), b_({}, clock->AsClock()) {
    Publish();
  }
  RateLimiter& a() { return a_; }
  RateLimiter& b() { return b_; }
  void Publish() {
    auto da = a_.Demand();
    auto db = b_.Demand();
    a_.SetView(View(da, db));
    b_.SetView(View(db, da));
  }

 private:
  static RateLimiter::PeerView View(const std::map<std::string, double>& self,
                                    const std::map<std::string, double>& other) {
    RateLimiter::PeerView v;
    v.replicas = 2;
    v.self = self;
    for (const auto& [ns, d] : other) v.others[ns].push_back(d);
    return v;
  }
  RateLimiter a_, b_;
};

TEST(RateLimiterTest, TwoHammeredReplicasTogetherStayWithinTheQuota) {
  FakeClock clock;
  TwoReplicas replicas(&clock);
  constexpr int64_t kQuota = 100;
  constexpr int kSeconds = 20;
  // A is asked 1000 times a second, B 300 times: both want more than Q.
  int admitted_a = 0, admitted_b = 0;
  for (int ms = 1; ms <= kSeconds * 1000; ++ms) {
    clock.now += milliseconds(1);
    admitted_a += replicas.a().Admit("ns", kQuota).admitted;
    if (ms % 10 < 3) admitted_b += replicas.b().Admit("ns", kQuota).admitted;
    if (ms % 500 == 0) replicas.Publish();
  }
  const int total = admitted_a + admitted_b;
  EXPECT_LE(total, kQuota * kSeconds + kQuota / 2 + 2) << admitted_a << " + " << admitted_b;
  EXPECT_GE(total, kQuota * kSeconds * 9 / 10) << admitted_a << " + " << admitted_b;
  // Both asked for more than half: about half each.
  EXPECT_GE(admitted_a, total * 4 / 10) << admitted_a << " + " << admitted_b;
  EXPECT_GE(admitted_b, total * 4 / 10) << admitted_a << " + " << admitted_b;
}

TEST(RateLimiterTest, AReplicaAskedLittleGetsWhatItAsksAndTheOtherTheRest) {
  FakeClock clock;
  TwoReplicas replicas(&clock);
  constexpr int64_t kQuota = 100;
  int admitted_a = 0, admitted_b = 0, asked_b = 0;
  for (int ms = 1; ms <= 20'000; ++ms) {
    clock.now += milliseconds(1);
    admitted_a += replicas.a().Admit("ns", kQuota).admitted;
    if (ms % 100 == 0) {  // B: 10 a second, well under its share
      ++asked_b;
      admitted_b += replicas.b().Admit("ns", kQuota).admitted;
    }
    if (ms % 500 == 0) replicas.Publish();
  }
  EXPECT_EQ(admitted_b, asked_b);
  EXPECT_LE(admitted_a + admitted_b, kQuota * 20 + kQuota / 2 + 2);
  // A gets the rest, not half.
  EXPECT_GE(admitted_a, (kQuota - 12) * 20 * 9 / 10);
}

TEST(RateLimiterTest, DemandIsAnAverageThatDecaysAndIdleNamespacesAreDropped) {
  FakeClock clock;
  RateLimiter limiter({}, clock.AsClock());
  for (int ms = 0; ms < 300; ++ms) {
    clock.now += milliseconds(1);
    if (ms % 20 == 0) limiter.Admit("ns", 1000);  // 50/s
  }
  // Young, the average is corrected for the weight it has not gathered yet.
  EXPECT_NEAR(limiter.Demand()["ns"], 50, 15);
  for (int ms = 300; ms < 5000; ++ms) {
    clock.now += milliseconds(1);
    if (ms % 20 == 0) limiter.Admit("ns", 1000);
  }
  auto demand = limiter.Demand();
  ASSERT_EQ(demand.count("ns"), 1u);
  EXPECT_NEAR(demand["ns"], 50, 5);
  clock.now += seconds(1);
  EXPECT_NEAR(limiter.Demand()["ns"], 50 * std::exp(-1.0), 3);
  clock.now += seconds(30);
  EXPECT_TRUE(limiter.Demand().empty());
  // Dropped state is a fresh, full bucket next time.
  int admitted = 0;
  for (int i = 0; i < 1000; ++i) admitted += limiter.Admit("ns", 1000).admitted;
  EXPECT_EQ(admitted, 500);
}

}  // namespace
}  // namespace holdfast::server
