// libholdfast's retries of Acquire, Release and Close, against a scripted stand-in for
// holdfastd in this process: it answers each call as the test scripts it (a reset
// stream, then an answer), which a real holdfastd behind a real network cannot be
// made to do on cue. No etcd is involved: what is tested is the client's side.
#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/internal.h"
#include "holdfast/client.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast {
namespace {

constexpr int64_t kSession = 7;
constexpr int64_t kToken = (int64_t{1} << 48) | 1234;

// Statuses to answer the next calls with, in order; OK once the script is spent.
class Script {
 public:
  void Push(grpc::Status s) {
    std::lock_guard l(mu_);
    next_.push_back(std::move(s));
  }
  grpc::Status Next() {
    std::lock_guard l(mu_);
    ++calls_;
    if (next_.empty()) return grpc::Status::OK;
    grpc::Status s = next_.front();
    next_.pop_front();
    return s;
  }
  int calls() {
    std::lock_guard l(mu_);
    return calls_;
  }
  void Clear() {
    std::lock_guard l(mu_);
    next_.clear();
  }

 private:
  std::mutex mu_;
  std::deque<grpc::Status> next_;
  int calls_ = 0;
};

class FakeSessions final : public v1::Session::Service {
 public:
  Script close;
  std::atomic<int64_t> ttl_ms{30'000};
  // Renewal answers say etcd could not confirm them (closed holds are lost).
  std::atomic<bool> etcd_unavailable{false};

 private:
  grpc::Status Open(grpc::ServerContext*, const v1::OpenSessionRequest*,
                    v1::OpenSessionResponse* resp) override {
    resp->set_session_id(kSession);
    resp->set_ttl_ms(ttl_ms.load());
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest>* stream) override {
    v1::KeepAliveRequest req;
    while (stream->Read(&req)) {
      v1::KeepAliveResponse resp;
      resp.set_session_id(req.session_id());
      resp.set_sequence(req.sequence());
      resp.set_ttl_ms(ttl_ms.load());
      resp.set_etcd_unavailable(etcd_unavailable.load());
      stream->Write(resp);
    }
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext*, const v1::CloseSessionRequest*,
                     v1::CloseSessionResponse*) override {
    return close.Next();
  }
};

class FakeLocks final : public v1::Lock::Service {
 public:
  Script acquire, release;
  std::atomic<int> acquire_delay_ms{0};  // each Acquire answers this late
  std::atomic<int> release_delay_ms{0};  // each Release answers this late
  std::mutex mu;
  std::vector<int64_t> released_tokens;  // guarded by mu
  std::vector<std::string> released_keys;  // guarded by mu
  // How long each Release had left of its deadline when it arrived (guarded by mu).
  std::vector<std::chrono::milliseconds> release_deadline_left;
  // The deadline of each Acquire and each Release (guarded by mu).
  std::vector<std::chrono::system_clock::time_point> acquire_deadlines, release_deadlines;
  // Describe: the keys asked about, and the answers to give in turn (the last
  // one again and again; none: nothing held or queued). Guarded by mu.
  std::vector<std::string> described_keys;
  std::deque<v1::DescribeResponse> describe_answers;
  std::deque<std::chrono::milliseconds> describe_delays;  // of the next Describes, in turn

 private:
  grpc::Status Acquire(grpc::ServerContext* ctx, const v1::AcquireRequest* req,
                       v1::AcquireResponse* resp) override {
    {
      std::lock_guard l(mu);
      acquire_deadlines.push_back(ctx->deadline());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(acquire_delay_ms.load()));
    grpc::Status s = acquire.Next();
    auto* hold = resp->mutable_hold();
    hold->set_lock_key(req->lock_key());
    hold->set_session_id(req->session_id());
    hold->set_token(kToken);
    return s;
  }
  grpc::Status Describe(grpc::ServerContext*, const v1::DescribeRequest* req,
                        v1::DescribeResponse* resp) override {
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard l(mu);
      described_keys.push_back(req->lock_key());
      if (!describe_answers.empty()) {
        *resp = describe_answers.front();
        if (describe_answers.size() > 1) describe_answers.pop_front();  // the last one stays
      }
      if (!describe_delays.empty()) {
        delay = describe_delays.front();
        describe_delays.pop_front();
      }
    }
    std::this_thread::sleep_for(delay);
    return grpc::Status::OK;
  }
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse*) override {
    {
      std::lock_guard l(mu);
      released_tokens.push_back(req->token());
      released_keys.push_back(req->lock_key());
      release_deadlines.push_back(ctx->deadline());
      release_deadline_left.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
          ctx->deadline() - std::chrono::system_clock::now()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(release_delay_ms.load()));
    return release.Next();
  }
};

// What gRPC reports to a client when an HTTP/2 stream is reset under its call.
grpc::Status ResetStream() {
  return grpc::Status(grpc::StatusCode::INTERNAL, "Received RST_STREAM with error code 2");
}

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&sessions_);
    b.RegisterService(&locks_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port != 0);
    port_ = port;
    ClientOptions o;
    o.endpoints = {"127.0.0.1:" + std::to_string(port)};
    o.rpc_timeout = std::chrono::seconds(5);
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto s = client_->OpenSession("default");
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    server_->Shutdown();
  }

  FakeSessions sessions_;
  FakeLocks locks_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(RetryTest, AnAcquireWhoseStreamWasResetIsAskedAgain) {
  locks_.acquire.Push(ResetStream());
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_EQ(hold->token(), kToken);
  EXPECT_EQ(locks_.acquire.calls(), 2);
}

TEST_F(RetryTest, AReleaseWhoseStreamWasResetIsAskedAgainWithTheSameToken) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  locks_.release.Push(ResetStream());
  locks_.release.Push(grpc::Status(grpc::StatusCode::UNKNOWN, "Stream removed"));
  EXPECT_TRUE(hold->Release().ok());
  EXPECT_EQ(locks_.release.calls(), 3);
  std::lock_guard l(locks_.mu);
  EXPECT_EQ(locks_.released_tokens, (std::vector<int64_t>{kToken, kToken, kToken}));
}

TEST_F(RetryTest, NotCurrentAfterAnUnknownOutcomeMeansTheReleaseWent) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  locks_.release.Push(ResetStream());
  locks_.release.Push(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "token is not the current hold"));
  EXPECT_TRUE(hold->Release().ok());
  EXPECT_EQ(locks_.release.calls(), 2);
  EXPECT_TRUE(hold->lost());  // released: every handle says it ended
}

TEST_F(RetryTest, ARefusalIsNotAskedAgain) {
  locks_.acquire.Push(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lock key \"\" is empty"));
  auto hold = session_->Acquire("jobs/a");
  ASSERT_FALSE(hold.ok());
  EXPECT_EQ(hold.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hold.status().message(), "lock key \"\" is empty");
  EXPECT_EQ(locks_.acquire.calls(), 1);
  // And a stale token on release, with no unknown outcome before it, is final.
  auto held = session_->Acquire("jobs/b");
  ASSERT_TRUE(held.ok()) << held.status();
  locks_.release.Push(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "token is not the current hold"));
  absl::Status r = held->Release();
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(locks_.release.calls(), 1);
}

// CloseSession is idempotent: a close whose outcome is unknown is asked again,
// as a release is, rather than left to the lease's TTL.
TEST_F(RetryTest, ACloseWhoseStreamWasResetIsAskedAgain) {
  auto hold = session_->Acquire("jobs/a");
  ASSERT_TRUE(hold.ok()) << hold.status();
  sessions_.close.Push(ResetStream());
  sessions_.close.Push(grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcd unreachable"));
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 3);
  EXPECT_TRUE(hold->lost());  // closing ended it
  // Answered: nothing is sent again.
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 3);
}

// A close that failed (here over the namespace's op_rate_quota, which the
// library leaves to the caller) is sent again by a Close called again, not
// reported OK with the lease still there.
TEST_F(RetryTest, ACloseCalledAgainAfterAFailedOneSendsItAgain) {
  sessions_.close.Push(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "retry after 40 ms"));
  absl::Status first = session_->Close();
  EXPECT_EQ(first.code(), absl::StatusCode::kResourceExhausted) << first;
  EXPECT_EQ(sessions_.close.calls(), 1);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(sessions_.close.calls(), 2);
  // Destroying the session sends nothing more.
  session_.reset();
  EXPECT_EQ(sessions_.close.calls(), 2);
}

// ~Session does not send again a close that failed: a Close(timeout) on the way
// out is not followed by a wait of the whole rpc timeout.
TEST_F(RetryTest, DestroyingASessionWhoseCloseFailedSendsNothingMore) {
  sessions_.close.Push(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not yours"));
  EXPECT_EQ(session_->Close(std::chrono::milliseconds(500)).code(),
            absl::StatusCode::kPermissionDenied);
  session_.reset();
  EXPECT_EQ(sessions_.close.calls(), 1);
}

// A hold dropped inside on_lost (lost because etcd could not confirm renewals)
// is released from the keepalive thread: asked for at most a second, so that the
// thread gets back to the other sessions' deadlines, not for the whole rpc
// timeout (5 s here) while holdfastd is slow to answer.
TEST_F(RetryTest, AReleaseFromInsideOnLostIsAskedForAtMostASecond) {
  sessions_.ttl_ms = 3000;  // renewed every second
  locks_.release_delay_ms = 3000;
  ClientOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port_)};
  o.rpc_timeout = std::chrono::seconds(5);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  std::mutex m;
  std::optional<Hold> held;
  std::promise<void> ran;
  SessionOptions so;
  so.on_lost = [&](const absl::Status&) {
    std::optional<Hold> dropped;
    {
      std::lock_guard l(m);
      dropped.swap(held);
    }
    dropped.reset();  // ~Hold releases it
    ran.set_value();
  };
  auto session = (*client)->OpenSession("default", so);
  ASSERT_TRUE(session.ok()) << session.status();
  {
    auto h = (*session)->Acquire("jobs/lost");
    ASSERT_TRUE(h.ok()) << h.status();
    std::lock_guard l(m);
    held.emplace(std::move(*h));
  }
  sessions_.etcd_unavailable = true;
  ASSERT_EQ(ran.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "on_lost never ran";
  std::lock_guard l(locks_.mu);
  ASSERT_FALSE(locks_.release_deadline_left.empty()) << "the dropped hold was not released";
  // At most 1 s (the server reads it a little late or early; 5 s before). Only
  // the first: the release asked again later, off the keepalive thread's turn
  // (OweRelease), has the whole rpc timeout.
  const auto left = locks_.release_deadline_left.front();
  EXPECT_LE(left.count(), 1500) << "a release from on_lost was given " << left.count() << " ms";
}

// A hold lost here (etcd could not confirm renewals) and dropped while holdfastd
// could not release it either would stay in etcd for as long as its session
// lives, keeping the key from everyone: the pump asks the release again until it
// is done, and then no more.
TEST_F(RetryTest, AHoldDroppedWhileItsReleaseFailsIsReleasedOnceHoldfastdCan) {
  sessions_.ttl_ms = 3000;  // renewed every second
  ClientOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port_)};
  o.rpc_timeout = std::chrono::seconds(2);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  auto held = (*session)->Acquire("jobs/owed");
  ASSERT_TRUE(held.ok()) << held.status();
  sessions_.etcd_unavailable = true;
  for (int i = 0; i < 100 && !held->lost(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(held->lost());
  const grpc::Status unreachable(grpc::StatusCode::UNAVAILABLE, "etcd: no leader");
  for (int i = 0; i < 5; ++i) locks_.release.Push(unreachable);
  held = absl::UnknownError("dropped");  // ~Hold: every try fails
  const int tried = locks_.release.calls();
  ASSERT_EQ(tried, 5);
  sessions_.etcd_unavailable = false;
  for (int i = 0; i < 100 && locks_.release.calls() == tried; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(locks_.release.calls(), tried + 1) << "the dropped hold's release was not asked again";
  {
    std::lock_guard l(locks_.mu);
    EXPECT_EQ(locks_.released_tokens.back(), kToken);
  }
  // Done: not asked again.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(locks_.release.calls(), tried + 1);
}

// A Hold assigned over releases the hold it had, as its destructor would: a
// release that fails there is left to the pump, not forgotten with the key
// held for the rest of the session.
TEST_F(RetryTest, AHoldAssignedOverWhileItsReleaseFailsIsReleasedByThePump) {
  auto first = session_->Acquire("jobs/first");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = session_->Acquire("jobs/second");
  ASSERT_TRUE(second.ok()) << second.status();
  const grpc::Status unreachable(grpc::StatusCode::UNAVAILABLE, "etcd: no leader");
  for (int i = 0; i < 5; ++i) locks_.release.Push(unreachable);
  *first = std::move(*second);  // releases jobs/first: every try fails
  const int tried = locks_.release.calls();
  ASSERT_EQ(tried, 5);
  EXPECT_EQ(first->key(), "jobs/second");
  // The moved-from handle holds nothing, and says why.
  EXPECT_EQ(second->key(), "");
  EXPECT_EQ(second->lost_reason().message(), "this Hold was moved from");
  EXPECT_TRUE(second->Release().ok());
  EXPECT_EQ(locks_.release.calls(), tried);
  for (int i = 0; i < 100 && locks_.release.calls() == tried; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(locks_.release.calls(), tried + 1) << "the assigned-over hold was not released";
  {
    std::lock_guard l(locks_.mu);
    EXPECT_EQ(locks_.released_keys.back(), "jobs/first");
  }
  EXPECT_FALSE(first->lost());  // jobs/second is held still
}

// A handle assigned the same hold again (an Acquire of a key this session holds
// is answered with its hold) keeps it: nothing is released.
TEST_F(RetryTest, AHoldAssignedItsOwnHoldAgainKeepsIt) {
  auto held = session_->Acquire("jobs/same");
  ASSERT_TRUE(held.ok()) << held.status();
  auto again = session_->Acquire("jobs/same");
  ASSERT_TRUE(again.ok()) << again.status();
  *held = std::move(*again);
  EXPECT_EQ(locks_.release.calls(), 0);
  EXPECT_FALSE(held->lost()) << held->lost_reason();
  EXPECT_EQ(held->key(), "jobs/same");
  EXPECT_EQ(held->token(), kToken);
}

// A release the pump gets through ends the hold's other handles too, as a
// Release() does: one still about must not go on using a key another client
// may now hold.
TEST_F(RetryTest, AReleaseThePumpGetsThroughEndsEveryHandleOfTheHold) {
  auto first = session_->Acquire("jobs/shared-handle");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = session_->Acquire("jobs/shared-handle");
  ASSERT_TRUE(second.ok()) << second.status();
  const grpc::Status unreachable(grpc::StatusCode::UNAVAILABLE, "etcd: no leader");
  for (int i = 0; i < 5; ++i) locks_.release.Push(unreachable);
  first = absl::UnknownError("dropped");  // ~Hold: every try fails; the pump's then
  ASSERT_EQ(locks_.release.calls(), 5);
  EXPECT_FALSE(second->lost());
  for (int i = 0; i < 100 && !second->lost(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(locks_.release.calls(), 6);
  ASSERT_TRUE(second->lost()) << "the other handle of a released hold does not say so";
  EXPECT_EQ(second->lost_reason().message(),
            absl::StrCat("hold on \"jobs/shared-handle\" (token ", kToken, ") was released"));
}

// A refused release (the identity the client now presents may not use the
// namespace) leaves the hold held: Release() answers the refusal again rather
// than OK, the hold does not claim to be released, and once dropped, the pump
// asks until holdfastd says.
TEST_F(RetryTest, ARefusedReleaseIsAnsweredAgainAndNotTakenForDone) {
  auto hold = session_->Acquire("jobs/refused");
  ASSERT_TRUE(hold.ok()) << hold.status();
  const grpc::Status refused(grpc::StatusCode::PERMISSION_DENIED,
                             "spiffe://t/other may not use namespace \"default\"");
  locks_.release.Push(refused);
  locks_.release.Push(refused);
  EXPECT_EQ(hold->Release().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(hold->lost());
  const absl::Status again = hold->Release();
  EXPECT_EQ(again.code(), absl::StatusCode::kPermissionDenied) << again;
  EXPECT_EQ(again.message(), "spiffe://t/other may not use namespace \"default\"");
  EXPECT_EQ(locks_.release.calls(), 2);
  EXPECT_FALSE(hold->lost());
  hold = absl::UnknownError("dropped");  // ~Hold asks once more: answered OK
  EXPECT_EQ(locks_.release.calls(), 3);
  std::lock_guard l(locks_.mu);
  EXPECT_EQ(locks_.released_keys.back(), "jobs/refused");
}

// An Acquire answered with the session's own hold that was lost here releases
// it and asks anew (a lost hold is final). All of that stays within the call's
// own bound, the wait plus the rpc timeout from the call: the release is not
// given a fresh rpc timeout of its own, nor is the new ask.
TEST_F(RetryTest, AnAcquireThatReleasesItsStaleHoldFirstKeepsItsBound) {
  sessions_.ttl_ms = 3000;  // renewed every second
  auto opened = client_->OpenSession("default");
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto session = std::move(*opened);
  auto held = session->Acquire("jobs/stale");
  ASSERT_TRUE(held.ok()) << held.status();
  sessions_.etcd_unavailable = true;
  for (int i = 0; i < 100 && !held->lost(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(held->lost());
  sessions_.etcd_unavailable = false;
  // The fake answers with the same token: the hold lost here. Its release is
  // answered UNAVAILABLE (asked again, until the bound).
  locks_.acquire_delay_ms = 1000;
  for (int i = 0; i < 5; ++i) {
    locks_.release.Push(grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcd: no leader"));
  }
  locks_.release_delay_ms = 300;
  size_t releases_before;
  {
    std::lock_guard l(locks_.mu);
    releases_before = locks_.release_deadlines.size();
  }
  auto again = session->Acquire("jobs/stale");
  size_t releases_by_the_answer;
  {
    std::lock_guard l(locks_.mu);
    releases_by_the_answer = locks_.release_deadlines.size();
  }
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  EXPECT_NE(again.status().message().find("a hold lost while etcd could not confirm renewals"),
            std::string::npos)
      << again.status();
  // (The handle dropped after the failed release owes it: the pump asks again
  // later, after the answer, with a timeout of its own; not counted here.)
  std::lock_guard l(locks_.mu);
  ASSERT_GT(releases_by_the_answer, releases_before);
  const auto call_deadline = locks_.acquire_deadlines.back();
  for (size_t i = releases_before; i < releases_by_the_answer; ++i) {
    const auto d = locks_.release_deadlines[i];
    // (The same clock on both sides; a few ms for the deadline's trip.)
    EXPECT_LE(d, call_deadline + std::chrono::milliseconds(50))
        << "a release was given "
        << std::chrono::duration_cast<std::chrono::milliseconds>(d - call_deadline).count()
        << " ms past the Acquire's bound";
  }
}

// What holdfastd answers a Describe of `key` with: held by session `session`
// with `token` (0: not held), and this session's waiter queued if `queued`.
v1::DescribeResponse Described(const std::string& key, int64_t session, int64_t token,
                               bool queued = false) {
  v1::DescribeResponse r;
  if (token != 0) {
    auto* h = r.add_holders();
    h->set_lock_key(key);
    h->set_session_id(session);
    h->set_token(token);
  }
  if (queued) {
    auto* w = r.add_waiters();
    w->set_lock_key(key);
    w->set_session_id(kSession);
  }
  return r;
}

class DoubtTest : public RetryTest {
 protected:
  // An Acquire of `key` whose every attempt loses its answer (the stream reset
  // under it) until its bound: it fails, and holdfastd may have granted it.
  absl::Status AcquireWithoutAnswer(const std::string& key) {
    for (int i = 0; i < 40; ++i) locks_.acquire.Push(ResetStream());
    auto hold = session_->Acquire(key);
    locks_.acquire.Clear();
    return hold.status();
  }
  size_t DescribeCalls() {
    std::lock_guard l(locks_.mu);
    return locks_.described_keys.size();
  }
  std::vector<std::pair<std::string, int64_t>> Released() {
    std::lock_guard l(locks_.mu);
    std::vector<std::pair<std::string, int64_t>> out;
    for (size_t i = 0; i < locks_.released_keys.size(); ++i) {
      out.emplace_back(locks_.released_keys[i], locks_.released_tokens[i]);
    }
    return out;
  }
  template <class Pred>
  bool WaitFor(Pred pred, std::chrono::seconds bound = std::chrono::seconds(15)) {
    const auto until = std::chrono::steady_clock::now() + bound;
    while (!pred() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
  }
};

// An Acquire that ended without an answer was granted all the same: the pump
// looks the key up once the cancel's grace is past and releases the session's
// hold it finds, once. Without it the key would stay held for as long as the
// session lives, by a session that does not know it.
TEST_F(DoubtTest, AnAcquireWhoseAnswerWasLostIsLookedUpAndItsGrantReleased) {
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {Described("jobs/doubt", kSession, kToken)};
  }
  const absl::Status s = AcquireWithoutAnswer("jobs/doubt");
  const auto failed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  ASSERT_TRUE(WaitFor([&] { return !Released().empty(); })) << "the grant was never released";
  EXPECT_GE(std::chrono::steady_clock::now() - failed_at,
            internal::SessionState::kDoubtAfter);  // not within the cancel's grace
  EXPECT_EQ(Released(), (std::vector<std::pair<std::string, int64_t>>{{"jobs/doubt", kToken}}));
  {
    std::lock_guard l(locks_.mu);
    EXPECT_EQ(locks_.described_keys, (std::vector<std::string>{"jobs/doubt"}));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // done: not asked again
  EXPECT_EQ(Released().size(), 1u);
  EXPECT_EQ(DescribeCalls(), 1u);
}

// The doubt is over without a release when the key is not held by the session
// (another session's hold is left alone), and asked about again while the
// session's waiter is still queued.
TEST_F(DoubtTest, NothingHeldIsReleasedAndAWaiterStillQueuedIsAskedAboutAgain) {
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {Described("jobs/q", kSession + 1, kToken, /*queued=*/true),
                               Described("jobs/q", kSession + 1, kToken)};
  }
  ASSERT_FALSE(AcquireWithoutAnswer("jobs/q").ok());
  ASSERT_TRUE(WaitFor([&] { return DescribeCalls() >= 2; })) << DescribeCalls();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(DescribeCalls(), 2u);  // over once nothing of the session's is there
  EXPECT_TRUE(Released().empty());
}

// An Acquire of the key answered with a Hold after the failed one ends the
// doubt: the session's hold of the key is the caller's now; nothing releases it
// behind the caller's back.
TEST_F(DoubtTest, AnAcquireOfTheKeyAnsweredWithAHoldEndsTheDoubt) {
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {Described("jobs/again", kSession, kToken)};
  }
  ASSERT_FALSE(AcquireWithoutAnswer("jobs/again").ok());
  auto hold = session_->Acquire("jobs/again");
  ASSERT_TRUE(hold.ok()) << hold.status();
  std::this_thread::sleep_for(internal::SessionState::kDoubtAfter + std::chrono::seconds(2));
  EXPECT_EQ(DescribeCalls(), 0u);
  EXPECT_TRUE(Released().empty());
  EXPECT_FALSE(hold->lost());
}

// A wait that ran out on holdfastd ("was not granted within": the waiter left
// the queue with the answer) and a refusal are answers: nothing is looked up.
TEST_F(DoubtTest, AnAnswerThatSaysWhatBecameOfTheCallIsNotDoubted) {
  locks_.acquire.Push(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                   "\"jobs/late\" was not granted within 100ms"));
  EXPECT_EQ(session_->Acquire("jobs/late", {.wait = std::chrono::milliseconds(100)}).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  locks_.acquire.Push(grpc::Status(grpc::StatusCode::ABORTED, "\"jobs/busy\" is held"));
  EXPECT_EQ(session_->Acquire("jobs/busy").status().code(), absl::StatusCode::kAborted);
  std::this_thread::sleep_for(internal::SessionState::kDoubtAfter + std::chrono::seconds(2));
  EXPECT_EQ(DescribeCalls(), 0u);
  EXPECT_TRUE(Released().empty());
}

// A try of the key after the failed call (ABORTED: it does not take the
// session's waiter over, nor is it answered with a grant the waiter gets in its
// grace) does not end the doubt: the grant is still found and released.
TEST_F(DoubtTest, ATryRefusedAfterTheFailedCallDoesNotEndTheDoubt) {
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {Described("jobs/try", kSession, kToken)};
  }
  ASSERT_FALSE(AcquireWithoutAnswer("jobs/try").ok());
  locks_.acquire.Push(grpc::Status(grpc::StatusCode::ABORTED, "\"jobs/try\" is held"));
  EXPECT_EQ(session_->Acquire("jobs/try").status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(WaitFor([&] { return !Released().empty(); })) << "the grant was never released";
  EXPECT_EQ(Released(), (std::vector<std::pair<std::string, int64_t>>{{"jobs/try", kToken}}));
}

// Two calls of the key on one session that both fail (holdfastd gone for
// both) leave one doubt, not none: the grant is found and released once.
TEST_F(DoubtTest, TwoCallsOfTheKeyThatBothFailLeaveADoubt) {
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {Described("jobs/two", kSession, kToken)};
  }
  for (int i = 0; i < 80; ++i) locks_.acquire.Push(ResetStream());
  auto other = std::async(std::launch::async, [&] { return session_->Acquire("jobs/two"); });
  auto mine = session_->Acquire("jobs/two");
  ASSERT_FALSE(mine.ok());
  ASSERT_FALSE(other.get().ok());
  locks_.acquire.Clear();
  ASSERT_TRUE(WaitFor([&] { return !Released().empty(); })) << "the grant was never released";
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(Released(), (std::vector<std::pair<std::string, int64_t>>{{"jobs/two", kToken}}));
}

// A doubt made again (a second call failed) starts over: the answer to the
// first doubt's Describe, slow to come and read before the second call's
// grant ("nothing held"), is not taken for the second doubt's, whose own
// Describe finds the grant and has it released.
TEST_F(DoubtTest, TheAnswerToAnEarlierDoubtIsNotTakenForALaterOnes) {
  // Calls (and so the pump's Describes) given 12 s, so that the slow answer
  // comes as an answer, not as a deadline.
  ClientOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port_)};
  o.rpc_timeout = std::chrono::seconds(12);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto opened = (*client)->OpenSession("default");
  ASSERT_TRUE(opened.ok()) << opened.status();
  session_ = std::move(*opened);
  {
    std::lock_guard l(locks_.mu);
    locks_.describe_answers = {v1::DescribeResponse(), Described("jobs/late", kSession, kToken)};
    // The first Describe answers after the second doubt's is out (about 3 s +
    // 2.3 s after it was sent); the second answers after a while too, so that
    // the first answer comes while it is out.
    locks_.describe_delays = {std::chrono::milliseconds(7000), std::chrono::milliseconds(3000)};
  }
  ASSERT_FALSE(AcquireWithoutAnswer("jobs/late").ok());
  ASSERT_TRUE(WaitFor([&] { return DescribeCalls() >= 1; }));  // the first doubt's, slow
  ASSERT_FALSE(AcquireWithoutAnswer("jobs/late").ok());         // ~2.3 s: the doubt again
  ASSERT_TRUE(WaitFor([&] { return !Released().empty(); }, std::chrono::seconds(30)))
      << "the first doubt's answer ended the second doubt";
  EXPECT_EQ(Released(), (std::vector<std::pair<std::string, int64_t>>{{"jobs/late", kToken}}));
  session_.reset();  // before its Client
}

}  // namespace
}  // namespace holdfast
