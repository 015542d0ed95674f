#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/internal.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace holdfast::internal {

namespace {
constexpr std::chrono::milliseconds kMaxBackoff{1000};
constexpr std::chrono::milliseconds kIdleWait{100};
}  // namespace

KeepAlivePump::KeepAlivePump(ClientCore* core) : core_(core), thread_([this] { Run(); }) {}

void KeepAlivePump::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
  // Nothing renews the sessions left here any more (the Client went first): they
  // count as lost now, so a Session or Hold that outlives its Client does not go
  // on saying it holds while its lease runs out.
  std::vector<std::shared_ptr<SessionState>> left;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, e] : sessions_) {
      if (auto s = e.state.lock()) left.push_back(std::move(s));
    }
    sessions_.clear();
  }
  for (auto& s : left) {
    s->MarkLost(absl::UnavailableError(
        absl::StrCat("session ", s->id(), " is no longer renewed: its Client was destroyed")));
  }
}

void KeepAlivePump::Add(std::shared_ptr<SessionState> s, SteadyClock::time_point opened_at) {
  absl::MutexLock l(&mu_);
  // The first renewal goes out a third of the TTL after the open, like every other.
  sessions_[s->id()] = Entry{s, opened_at + s->ttl() / 3};
  cv_.Signal();
}

void KeepAlivePump::Remove(int64_t session_id) {
  absl::MutexLock l(&mu_);
  sessions_.erase(session_id);
}

void KeepAlivePump::SetTurnObserverForTest(TurnObserver observer) {
  absl::MutexLock l(&mu_);
  observer_ = std::make_shared<const TurnObserver>(std::move(observer));
}

void KeepAlivePump::Run() {
  while (true) {
    std::shared_ptr<const TurnObserver> observer;
    {
      absl::MutexLock l(&mu_);
      if (stop_) break;
      observer = observer_;
    }
    // Turns start kIdleWait apart (or sooner, for a renewal due), however long
    // their steps block.
    const auto turn_start = SteadyClock::now();
    if (stream_ && stream_->broken.load()) {
      CloseStream();  // may wait for a silence check (up to its timeout) and the reader
      if (observer && observer->blocking_step_ended) observer->blocking_step_ended();
    }
    bool want_stream;
    {
      absl::MutexLock l(&mu_);
      want_stream = !sessions_.empty();
    }
    // Open a stream only on a connected endpoint (any of the Client's: holdfastd
    // keeps no state of its own, so the renewals need not go where the calls go):
    // waiting briefly here also makes gRPC reconnect promptly after holdfastd
    // restarts. The wait is short so that local deadlines are still checked often.
    bool connected = false;
    ClientCore::Endpoint* endpoint = nullptr;
    if (!stream_ && want_stream && SteadyClock::now() >= next_connect_) {
      endpoint = &core_->Connected(std::chrono::system_clock::now() + kIdleWait, &connected);
      if (observer && observer->blocking_step_ended) observer->blocking_step_ended();
    }
    if (connected) {
      auto s = std::make_unique<Stream>();
      s->endpoint = endpoint;
      s->rw = endpoint->session->KeepAlive(&s->ctx);
      Stream* raw = s.get();
      s->reader = std::thread([this, raw] { ReadLoop(raw); });
      stream_ = std::move(s);
    }
    // Read after the steps above, which can block (up to kIdleWait waiting for a
    // connection, up to a silence check's timeout closing a stream): a time read
    // before them would let a deadline that passed meanwhile go unseen until the
    // next turn, up to twice kIdleWait late.
    const auto now = SteadyClock::now();
    if (observer && observer->ticked) observer->ticked(now);
    Tick(now);
    if (stream_ && !stream_->broken.load()) CheckSilence(now);
    // Sleep until the next renewal is due (or something changes), at most kIdleWait
    // after this turn started, so local deadlines are checked at least that often.
    absl::MutexLock l(&mu_);
    auto wake = turn_start + kIdleWait;
    for (const auto& [id, e] : sessions_) wake = std::min(wake, e.next_send);
    auto wait = std::max(wake - SteadyClock::now(), SteadyClock::duration::zero());
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(wait));
  }
  CloseStream();
}

void KeepAlivePump::Tick(SteadyClock::time_point now) {
  std::vector<std::shared_ptr<SessionState>> expired, owing;
  std::vector<v1::KeepAliveRequest> due;
  {
    absl::MutexLock l(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      auto state = it->second.state.lock();
      if (!state || !state->WantsRenewal()) {
        it = sessions_.erase(it);
        continue;
      }
      // Past the local deadline: suspect it (and keep renewing while open-class
      // holds may live on unprotected).
      if (now >= state->deadline()) expired.push_back(state);
      if (state->owes_releases()) owing.push_back(state);  // SendOwedReleases
      if (stream_ && now >= it->second.next_send) {
        v1::KeepAliveRequest req;
        req.set_namespace_(state->ns());
        req.set_session_id(state->id());
        req.set_sequence(next_seq_++);
        sent_[req.sequence()] = {state->id(), now};
        due.push_back(std::move(req));
        it->second.next_send = now + state->ttl() / 3;
      }
      ++it;
    }
  }
  for (auto& s : owing) SessionState::SendOwedReleases(s, now);
  for (auto& s : expired) {
    s->Suspect(absl::UnavailableError(
                   "no renewal was confirmed before the session's local deadline (TTL minus "
                   "safety margin): holdfastd or etcd unreachable"),
               /*deadline_passed=*/true);
  }
  for (auto& req : due) {
    if (!stream_->rw->Write(req)) {
      stream_->broken = true;
      break;
    }
  }
}

void KeepAlivePump::ReadLoop(Stream* s) {
  v1::KeepAliveResponse resp;
  while (s->rw->Read(&resp)) {
    std::shared_ptr<SessionState> state;
    SteadyClock::time_point sent_at{};
    bool known = false;
    {
      absl::MutexLock l(&mu_);
      auto it = sent_.find(resp.sequence());
      if (it != sent_.end()) {
        sent_at = it->second.second;
        known = true;
        sent_.erase(it);
      }
      auto e = sessions_.find(resp.session_id());
      if (e != sessions_.end()) state = e->second.state.lock();
    }
    s->answers.fetch_add(1);
    if (!state || !known) continue;
    if (resp.lost()) {
      state->MarkLost(absl::NotFoundError(absl::StrCat("session lost: ", resp.reason())));
    } else if (resp.etcd_unavailable()) {
      // ARCHITECTURE §5: a closed-class holder stops at once when holdfastd cannot
      // confirm renewals with etcd; an open-class holder goes on, unprotected.
      state->Suspect(absl::UnavailableError(absl::StrCat("etcd unreachable: ", resp.reason())),
                     /*deadline_passed=*/false);
    } else {
      state->Confirm(sent_at, std::chrono::milliseconds(resp.ttl_ms()));
      if (resp.ended_size() > 0) state->HoldsEnded(resp.ended());
    }
  }
  s->read_ended = true;
  s->broken = true;
  absl::MutexLock l(&mu_);
  cv_.Signal();
}

std::chrono::milliseconds KeepAlivePump::SilenceAfter(std::chrono::milliseconds ttl) {
  return std::clamp<std::chrono::milliseconds>(ttl / 6, std::chrono::milliseconds(300),
                                               std::chrono::milliseconds(2000));
}

std::chrono::milliseconds KeepAlivePump::CheckTimeout(std::chrono::milliseconds ttl) {
  return std::clamp<std::chrono::milliseconds>(ttl / 10, std::chrono::milliseconds(200),
                                               std::chrono::milliseconds(1000));
}

void KeepAlivePump::CheckSilence(SteadyClock::time_point now) {
  if (core_->endpoint_count() < 2) return;  // nowhere else to go
  Stream& s = *stream_;
  if (s.check) {
    if (!s.check->done.load()) return;
    s.check->thread.join();
    const bool answered = s.check->answered;
    s.check.reset();
    if (answered) return;
    core_->PassOver(*s.endpoint);
    // Closed on the next turn, and opened again at once, on the next endpoint.
    s.passed_over = true;
    s.broken = true;
    return;
  }
  if (now < s.next_check) return;
  // The oldest renewal not answered yet, of a session still renewed here.
  std::optional<std::chrono::milliseconds> ttl;
  SteadyClock::time_point sent_at;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [seq, sent] : sent_) {
      auto e = sessions_.find(sent.first);
      if (e == sessions_.end()) continue;
      if (auto state = e->second.state.lock()) {
        ttl = state->ttl();
        sent_at = sent.second;
        break;
      }
    }
  }
  if (!ttl || now - sent_at < SilenceAfter(*ttl)) return;
  // A check per silence: one its replica answered is not repeated before
  // another SilenceAfter without an answer.
  s.next_check = now + SilenceAfter(*ttl);
  auto check = std::make_unique<SilenceCheck>();
  SilenceCheck* c = check.get();
  const auto timeout = CheckTimeout(*ttl);
  check->thread = std::thread([this, c, channel = s.endpoint->channel, timeout] {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    // Any answer of the server's counts, an error too (a server without the
    // health service says UNIMPLEMENTED); only none in time (or no connection)
    // does not.
    const grpc::StatusCode code = stub->Check(&ctx, req, &resp).error_code();
    c->answered = code != grpc::StatusCode::DEADLINE_EXCEEDED &&
                  code != grpc::StatusCode::UNAVAILABLE;
    c->done = true;
    absl::MutexLock l(&mu_);
    cv_.Signal();  // the pump acts on it now, not at its next turn
  });
  s.check = std::move(check);
}

void KeepAlivePump::CloseStream() {
  if (!stream_) return;
  if (stream_->check) stream_->check->thread.join();  // ends within its timeout
  // A stream its server ended has its status (and trailers) to read; one ended
  // here is cancelled first, or Finish would wait for the server.
  if (!stream_->read_ended.load()) stream_->ctx.TryCancel();
  if (stream_->reader.joinable()) stream_->reader.join();
  stream_->rw->Finish();
  bool was_broken = stream_->broken.load();
  // Its replica is stopping (Server::Shutdown): renew on the next endpoint now.
  const bool stopping =
      core_->endpoint_count() > 1 && SaysStopping(stream_->ctx);
  if (stopping) core_->Skip(*stream_->endpoint);
  const bool passed_over = stream_->passed_over || stopping;
  if (stream_->answers.load() > 0) backoff_ = std::chrono::milliseconds(50);
  stream_.reset();
  {
    absl::MutexLock l(&mu_);
    sent_.clear();  // answers to these will never come
    // Renew at once on the next stream: the old one may have lost answers.
    for (auto& [id, e] : sessions_) e.next_send = SteadyClock::now();
  }
  if (was_broken && !passed_over) {
    next_connect_ = SteadyClock::now() + backoff_;
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }
}

}  // namespace holdfast::internal
