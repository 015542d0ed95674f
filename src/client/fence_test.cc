#include "holdfast/fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace holdfast {
namespace {

constexpr int64_t Token(int32_t epoch, int64_t revision) {
  return (int64_t{epoch} << kTokenRevisionBits) | revision;
}
constexpr int64_t kMaxRevision = kTokenRevisionMask;

bool Contains(const absl::Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

TEST(FenceTokenTest, DecodesEpochAndRevision) {
  static_assert(TokenEpoch(Token(3, 42)) == 3);
  static_assert(TokenRevision(Token(3, 42)) == 42);
  EXPECT_EQ(TokenEpoch(std::numeric_limits<int64_t>::max()), (1 << 15) - 1);
  EXPECT_EQ(TokenRevision(std::numeric_limits<int64_t>::max()), kMaxRevision);
  EXPECT_EQ(TokenEpoch(Token(1, kMaxRevision)), 1);
  EXPECT_EQ(TokenRevision(Token(2, 1)), 1);
}

TEST(FenceVerifierTest, AdmitsIncreasingTokens) {
  FenceVerifier fence;
  EXPECT_EQ(fence.Highest("jobs/nightly"), 0);
  for (int64_t rev : {10, 11, 250}) {
    EXPECT_TRUE(fence.Admit("jobs/nightly", Token(1, rev)).ok()) << rev;
    EXPECT_EQ(fence.Highest("jobs/nightly"), Token(1, rev));
  }
  EXPECT_EQ(fence.RememberedKeys(), 1u);
}

TEST(FenceVerifierTest, AdmitsTheSameTokenAgain) {
  // The same holder writing twice.
  FenceVerifier fence;
  ASSERT_TRUE(fence.Admit("k", Token(1, 7)).ok());
  EXPECT_TRUE(fence.Admit("k", Token(1, 7)).ok());
  EXPECT_EQ(fence.Highest("k"), Token(1, 7));
}

TEST(FenceVerifierTest, RejectsLowerTokenNamingBoth) {
  FenceVerifier fence;
  ASSERT_TRUE(fence.Admit("jobs/nightly", Token(1, 144)).ok());
  absl::Status stale = fence.Admit("jobs/nightly", Token(1, 44));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(stale, std::to_string(Token(1, 44)))) << stale;
  EXPECT_TRUE(Contains(stale, std::to_string(Token(1, 144)))) << stale;
  EXPECT_TRUE(Contains(stale, "\"jobs/nightly\"")) << stale;
  EXPECT_TRUE(Contains(stale, "superseded")) << stale;
  EXPECT_EQ(fence.Highest("jobs/nightly"), Token(1, 144));
}

TEST(FenceVerifierTest, KeysAreIndependent) {
  FenceVerifier fence;
  ASSERT_TRUE(fence.Admit("a", Token(1, 900)).ok());
  // Not a prefix match: "a/b" and "A" are other locks.
  EXPECT_TRUE(fence.Admit("a/b", Token(1, 5)).ok());
  EXPECT_TRUE(fence.Admit("A", Token(1, 6)).ok());
  EXPECT_TRUE(fence.Admit("a/b", Token(1, 6)).ok());
  EXPECT_FALSE(fence.Admit("a", Token(1, 899)).ok());
  EXPECT_EQ(fence.Highest("a"), Token(1, 900));
  EXPECT_EQ(fence.Highest("a/b"), Token(1, 6));
  EXPECT_EQ(fence.Highest("b"), 0);
}

TEST(FenceVerifierTest, LaterEpochBeatsAnyRevision) {
  // After an etcd restore, revisions start low again; the epoch advance keeps
  // new tokens above every old one, and old holders stay fenced out.
  FenceVerifier fence;
  ASSERT_TRUE(fence.Admit("k", Token(1, kMaxRevision)).ok());
  EXPECT_TRUE(fence.Admit("k", Token(2, 1)).ok());
  absl::Status old = fence.Admit("k", Token(1, kMaxRevision));
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(old, "(epoch 2, revision 1)")) << old;
  EXPECT_TRUE(Contains(old, "(epoch 1, revision 281474976710655)")) << old;
}

TEST(FenceVerifierTest, RejectsWhatIsNotAToken) {
  FenceVerifier fence;
  for (int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min(),
                      Token(0, 5) /* a bare revision */, Token(1, 0)}) {
    absl::Status status = fence.Admit("k", bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(status, std::to_string(bad))) << status;
    bool ran = false;
    status = fence.CheckAndApply("k", bad, [&] {
      ran = true;
      return absl::OkStatus();
    });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(ran) << bad;
  }
  EXPECT_EQ(fence.RememberedKeys(), 0u);
  EXPECT_EQ(fence.Highest("k"), 0);
}

TEST(FenceVerifierTest, AdmitsEveryKeyByteString) {
  FenceVerifier fence;
  const std::string odd("x\0y\n\"", 5);
  EXPECT_TRUE(fence.Admit("", Token(1, 2)).ok());
  EXPECT_TRUE(fence.Admit(odd, Token(1, 3)).ok());
  EXPECT_EQ(fence.Highest(std::string("x")), 0);
  absl::Status stale = fence.Admit(odd, Token(1, 1));
  EXPECT_TRUE(Contains(stale, "x\\x00y\\n\\\"")) << stale;  // escaped in the message
}

TEST(FenceVerifierTest, CheckAndApplyWritesOnlyWhenAdmitted) {
  FenceVerifier fence;
  std::vector<std::string> log;
  auto write = [&](std::string what) {
    return [&log, what] {
      log.push_back(what);
      return absl::OkStatus();
    };
  };
  EXPECT_TRUE(fence.CheckAndApply("k", Token(1, 20), write("new")).ok());
  EXPECT_EQ(fence.CheckAndApply("k", Token(1, 10), write("stale")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fence.CheckAndApply("k", Token(1, 20), write("again")).ok());
  EXPECT_EQ(log, (std::vector<std::string>{"new", "again"}));
}

TEST(FenceVerifierTest, FailedWriteReturnsItsStatusAndKeepsTheToken) {
  FenceVerifier fence;
  absl::Status status =
      fence.CheckAndApply("k", Token(1, 30), [] { return absl::UnavailableError("disk full"); });
  EXPECT_EQ(status, absl::UnavailableError("disk full"));
  EXPECT_EQ(fence.Highest("k"), Token(1, 30));
  EXPECT_FALSE(fence.Admit("k", Token(1, 29)).ok());
}

TEST(FenceVerifierTest, ThrowingWriteReleasesTheKey) {
  FenceVerifier fence;
  EXPECT_THROW(static_cast<void>(fence.CheckAndApply(
                   "k", Token(1, 5), []() -> absl::Status { throw std::runtime_error("boom"); })),
               std::runtime_error);
  // The key's slot is free again (this would deadlock otherwise).
  EXPECT_TRUE(fence.Admit("k", Token(1, 5)).ok());
}

TEST(FenceVerifierTest, SharedHoldsCoexistUntilAWriterComes) {
  FenceVerifier fence;
  // Two readers of one key hold at once with different tokens, in any order.
  EXPECT_TRUE(fence.Admit("k", Token(1, 12), FenceMode::kShared).ok());
  EXPECT_TRUE(fence.Admit("k", Token(1, 10), FenceMode::kShared).ok());
  EXPECT_EQ(fence.Highest("k"), Token(1, 12));
  // An exclusive token below a shared one is older than that reader's grant.
  EXPECT_EQ(fence.Admit("k", Token(1, 11)).code(), absl::StatusCode::kFailedPrecondition);
  // A writer granted after the readers fences both of them out.
  EXPECT_TRUE(fence.Admit("k", Token(1, 20)).ok());
  absl::Status reader = fence.Admit("k", Token(1, 12), FenceMode::kShared);
  EXPECT_EQ(reader.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(reader, "exclusive token " + std::to_string(Token(1, 20)))) << reader;
  // Readers granted after the writer are admitted, and fence the writer out.
  EXPECT_TRUE(fence.Admit("k", Token(1, 25), FenceMode::kShared).ok());
  EXPECT_TRUE(fence.Admit("k", Token(1, 21), FenceMode::kShared).ok());
  EXPECT_EQ(fence.Admit("k", Token(1, 20)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FenceVerifierTest, ForgetsLeastRecentlyAdmittedKeysBehindAFloor) {
  FenceVerifier fence({.max_keys = 2, .shards = 1});
  ASSERT_TRUE(fence.Admit("a", Token(1, 100)).ok());
  ASSERT_TRUE(fence.Admit("b", Token(1, 50)).ok());
  ASSERT_TRUE(fence.Admit("a", Token(1, 100)).ok());  // "a" is now the most recent
  ASSERT_TRUE(fence.Admit("c", Token(1, 60)).ok());   // forgets "b"
  EXPECT_EQ(fence.RememberedKeys(), 2u);
  EXPECT_EQ(fence.Highest("a"), Token(1, 100));
  EXPECT_EQ(fence.Highest("b"), Token(1, 50));  // the floor now
  // Safety: the forgotten key's stale holders stay out.
  absl::Status stale = fence.Admit("b", Token(1, 49));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(stale, "no longer remembers")) << stale;
  // What to do: a new hold (the same one, asked for again, keeps its token).
  EXPECT_TRUE(Contains(stale, "release the lock and acquire it again")) << stale;
  EXPECT_EQ(fence.RememberedKeys(), 2u);  // a rejected key is not kept
  // Its current holder still writes.
  EXPECT_TRUE(fence.Admit("b", Token(1, 50)).ok());  // forgets "a"
  EXPECT_EQ(fence.Highest("a"), Token(1, 100));
  // The liveness cost: a key never seen, whose holder was granted before the
  // floor's token, is turned away until it acquires again.
  EXPECT_EQ(fence.Admit("d", Token(1, 70)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fence.Admit("d", Token(1, 101)).ok());
  EXPECT_EQ(fence.RememberedKeys(), 2u);
}

TEST(FenceVerifierTest, ShardCapacitiesAddUpToMaxKeys) {
  FenceVerifier fence({.max_keys = 10, .shards = 4});
  for (int i = 1; i <= 100; ++i) {
    ASSERT_TRUE(fence.Admit("key" + std::to_string(i), Token(1, 1000 + i)).ok());
  }
  EXPECT_LE(fence.RememberedKeys(), 10u);
  EXPECT_GE(fence.RememberedKeys(), 4u);
}

TEST(FenceVerifierTest, KeyInUseIsNeverForgottenAndOtherKeysProceed) {
  FenceVerifier fence({.max_keys = 1, .shards = 1});
  std::promise<void> entered;
  std::promise<void> release;
  std::thread writer([&] {
    absl::Status status = fence.CheckAndApply("a", Token(1, 10), [&] {
      entered.set_value();
      release.get_future().wait();
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
  });
  entered.get_future().wait();
  // The admission is visible while the write runs, and Highest does not wait.
  EXPECT_EQ(fence.Highest("a"), Token(1, 10));
  // Another key proceeds while "a" is being written (same shard, capacity 1): it
  // is admitted, then forgotten in place of the pinned "a".
  EXPECT_TRUE(fence.Admit("b", Token(1, 20)).ok());
  EXPECT_EQ(fence.Highest("a"), Token(1, 10));
  release.set_value();
  writer.join();
  EXPECT_EQ(fence.RememberedKeys(), 1u);
  EXPECT_EQ(fence.Highest("a"), Token(1, 10));
  EXPECT_FALSE(fence.Admit("a", Token(1, 9)).ok());
}

// Many threads admit random tokens for a few keys. Each admitted write records its
// token inside CheckAndApply; the record of each key must never go down, writes of
// one key must never overlap, and the verifier's answer must match the record.
void CheckConcurrentAdmission(FenceVerifierOptions options, int key_count) {
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 3000;
  FenceVerifier fence(options);
  struct Record {
    std::vector<int64_t> admitted;  // written only inside the key's write slot
    std::atomic<int> writers{0};
    std::atomic<bool> overlapped{false};
  };
  std::vector<Record> records(key_count);
  std::atomic<int64_t> rejected{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      std::uniform_int_distribution<int> pick_key(0, key_count - 1);
      std::uniform_int_distribution<int64_t> pick_rev(1, 400);  // many ties and inversions
      std::uniform_int_distribution<int> pick_epoch(1, 3);
      for (int i = 0; i < kOpsPerThread; ++i) {
        const int k = pick_key(rng);
        const int64_t token = Token(pick_epoch(rng), pick_rev(rng));
        const std::string key = "key/" + std::to_string(k);
        absl::Status status = fence.CheckAndApply(key, token, [&] {
          Record& record = records[k];
          if (record.writers.fetch_add(1) != 0) record.overlapped = true;
          std::this_thread::yield();  // widens the window a broken slot would leave open
          record.admitted.push_back(token);
          record.writers.fetch_sub(1);
          return absl::OkStatus();
        });
        if (status.code() == absl::StatusCode::kFailedPrecondition) {
          ++rejected;
        } else {
          ASSERT_TRUE(status.ok()) << status;
        }
        if (i % 7 == 0) fence.Highest(key);  // readers alongside
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  int64_t admitted = 0;
  for (int k = 0; k < key_count; ++k) {
    const Record& record = records[k];
    EXPECT_FALSE(record.overlapped) << "writes of key " << k << " overlapped";
    admitted += static_cast<int64_t>(record.admitted.size());
    for (size_t i = 1; i < record.admitted.size(); ++i) {
      ASSERT_LE(record.admitted[i - 1], record.admitted[i])
          << "key " << k << " admitted a lower token at write " << i;
    }
    if (options.max_keys == 0 && !record.admitted.empty()) {
      EXPECT_EQ(fence.Highest("key/" + std::to_string(k)), record.admitted.back());
    }
  }
  EXPECT_EQ(admitted + rejected.load(), int64_t{kThreads} * kOpsPerThread);
  EXPECT_GT(rejected.load(), 0);
  EXPECT_GT(admitted, key_count);
}

TEST(FenceVerifierConcurrencyTest, AdmittedTokensOfEachKeyNeverDecrease) {
  CheckConcurrentAdmission({}, 4);
}

TEST(FenceVerifierConcurrencyTest, StaysMonotonicWhileForgettingKeys) {
  CheckConcurrentAdmission({.max_keys = 3, .shards = 2}, 8);
}

}  // namespace
}  // namespace holdfast
