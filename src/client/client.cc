#include "holdfast/client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <tuple>
#include <thread>

#include <pthread.h>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "client/internal.h"
#include "common/grpc_status.h"
#include "common/loopback.h"
#include "common/names.h"
#include "common/pem_file.h"

namespace holdfast {

namespace {
constexpr char kRetryAfterPayload[] = "type.holdfast.dev/retry-after-ms";
constexpr char kUnreachablePayload[] = "type.holdfast.dev/unreachable";
constexpr char kStoppingPayload[] = "type.holdfast.dev/stopping";

// FromGrpcStatus, keeping the server's retry-after-ms trailer (op_rate_quota) as a
// payload that RetryAfter() reads, and naming a call that found no connection to
// holdfastd (Unreachable()). gRPC tells that apart only by the channel: a call
// that waits for a connection ends at its deadline with "Deadline Exceeded", and
// holdfastd's own UNAVAILABLE comes over a connection that is still READY.
absl::Status FromCall(const internal::ClientCore& core,
                      const internal::ClientCore::Endpoint& endpoint,
                      const grpc::ClientContext& ctx, const grpc::Status& g) {
  absl::Status s = FromGrpcStatus(g);
  if (s.code() == absl::StatusCode::kUnavailable && internal::SaysStopping(ctx)) {
    s.SetPayload(kStoppingPayload, absl::Cord());
    return s;
  }
  if ((s.code() == absl::StatusCode::kUnavailable ||
       s.code() == absl::StatusCode::kDeadlineExceeded) &&
      endpoint.channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    absl::Status unreachable(
        s.code(), absl::StrCat("no connection to holdfastd at ",
                               absl::StrJoin(core.options().endpoints, ","), ": ", s.message()));
    unreachable.SetPayload(kUnreachablePayload, absl::Cord());
    return unreachable;
  }
  if (s.code() != absl::StatusCode::kResourceExhausted) return s;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    s.SetPayload(kRetryAfterPayload, absl::Cord(absl::string_view(it->second.data(),
                                                                    it->second.size())));
  }
  return s;
}

// A call that ended this way may or may not have reached holdfastd and done its
// work: the connection broke (UNAVAILABLE), or the stream was reset under the call
// (INTERNAL or UNKNOWN: what gRPC reports for an HTTP/2 RST_STREAM, as a proxy or
// a load balancer between the client and holdfastd may send). Acquire, Release
// and Close are idempotent (per session and key; by token; by session id), so
// they ask again.
bool OutcomeUnknown(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kInternal ||
         code == absl::StatusCode::kUnknown;
}

// An Acquire that ended so may have been granted all the same: its outcome is
// unknown, it was cancelled, or its deadline passed here (holdfastd's own answer
// to a wait that ran out, "... was not granted within ...", says it was not:
// the waiter leaves the queue with it).
bool MayHaveBeenGranted(const absl::Status& s) {
  return OutcomeUnknown(s.code()) || s.code() == absl::StatusCode::kCancelled ||
         (s.code() == absl::StatusCode::kDeadlineExceeded &&
          !absl::StrContains(s.message(), "was not granted within"));
}

// A release that ended so is over: done, or the hold is not current any more
// (released already, expired, forced). Its handles let go of the session.
bool ReleaseIsOver(absl::StatusCode code) {
  return code == absl::StatusCode::kOk || code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kNotFound;
}

// A release that ended so would be refused again, however often asked: the
// identity the client presents may not use the namespace (PERMISSION_DENIED),
// or holdfastd cannot take the request (INVALID_ARGUMENT, UNIMPLEMENTED). A
// Release() answers it again when asked; the pump asks once and gives up,
// leaving the hold to its session's end.
bool ReleaseIsRefused(absl::StatusCode code) {
  return code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnimplemented;
}

// A call cancelled because its replica was passed over (ClientCore::Moveable)
// ended with its outcome unknown: said as UNAVAILABLE, so that it is asked again
// (and, when it cannot be any more, answered so). True if it was.
bool Moved(const internal::ClientCore::Moveable& m, absl::Status* s) {
  if (!m.moved() || s->code() != absl::StatusCode::kCancelled) return false;
  *s = absl::UnavailableError("holdfastd stopped answering (the call was moved to another replica)");
  return true;
}

// The call's replica is stopping and said so (FromCall): with another endpoint
// to go to, it becomes current and the call is asked again there at once.
bool SkipStopping(internal::ClientCore& core, const internal::ClientCore::Endpoint& e,
                  const absl::Status& s) {
  if (!s.GetPayload(kStoppingPayload).has_value() || core.endpoint_count() < 2) return false;
  core.Skip(e);
  return true;
}

// How an idempotent call (Release by token, Close by session id) is asked again.
struct Retry {
  // Every attempt ends by then, the waits between them included: with no
  // holdfastd to answer, each would otherwise wait that long for a connection.
  std::chrono::system_clock::time_point bound;
  // ABORTED is asked again too (a Release that raced with the queue). It says the
  // call was not done, so it is no unknown outcome.
  bool aborted_too = false;
  // False: no waiting for a connection (a Close from inside on_lost, on the
  // callback thread the other sessions' callbacks wait for): each
  // attempt goes to an endpoint connected now or fails at once, and one that
  // found no connection ends the call.
  bool wait_for_connection = true;
};

// From inside an on_lost, on the Client's callback thread, which the other
// sessions' callbacks wait for: at most a second, retries included, and no
// waiting for a connection that is not there.
Retry FromInsideOnLost(const internal::ClientCore& core, bool aborted_too) {
  constexpr std::chrono::milliseconds kFromOnLostTimeout{1000};
  return Retry{.bound = std::chrono::system_clock::now() +
                        std::min<std::chrono::milliseconds>(core.options().rpc_timeout,
                                                            kFromOnLostTimeout),
               .aborted_too = aborted_too,
               .wait_for_connection = false};
}

// Sends an idempotent call until its outcome is known, at most five times, all
// within `retry.bound`. An unknown outcome (OutcomeUnknown), a call moved off a
// replica that went silent (Moveable) and DEADLINE_EXCEEDED are asked again; a
// replica that says it is stopping is left for the next endpoint at once
// (SkipStopping), the others after a short back-off. `send(endpoint, ctx)` makes
// one attempt. `*unknown` says whether an attempt before the last one ended with
// its outcome unknown: it may have been done, which can explain the last answer.
template <class Send>
absl::Status AskIdempotent(internal::ClientCore& core, const Retry& retry, Send send,
                           bool* unknown) {
  *unknown = false;
  absl::Status s;
  for (int attempt = 0; attempt < 5; ++attempt) {
    grpc::ClientContext ctx;
    internal::ClientCore::Endpoint* endpoint;
    if (retry.wait_for_connection) {
      endpoint = &core.Prepare(&ctx, {}, retry.bound);
    } else {
      ctx.set_deadline(retry.bound);
      endpoint = &core.Connected(std::chrono::system_clock::now());
    }
    bool moved;
    {
      internal::ClientCore::Moveable moveable(core, *endpoint, &ctx);
      s = FromCall(core, *endpoint, ctx, send(*endpoint, &ctx));
      moved = Moved(moveable, &s);
    }
    const bool aborted = retry.aborted_too && s.code() == absl::StatusCode::kAborted;
    if (!aborted && !OutcomeUnknown(s.code()) && s.code() != absl::StatusCode::kDeadlineExceeded) {
      break;
    }
    *unknown = *unknown || !aborted;
    if (!retry.wait_for_connection && Unreachable(s)) break;
    if (moved || SkipStopping(core, *endpoint, s)) continue;  // the next endpoint is current
    const auto backoff = std::chrono::milliseconds(10 * (attempt + 1));
    if (std::chrono::system_clock::now() + backoff >= retry.bound) break;
    std::this_thread::sleep_for(backoff);
  }
  return s;
}

}  // namespace

bool Unreachable(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kUnreachablePayload).has_value();
}

std::optional<std::chrono::milliseconds> RetryAfter(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kResourceExhausted) return std::nullopt;
  auto payload = s.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return std::nullopt;
  return std::chrono::milliseconds(ms);
}

namespace internal {

namespace {
constexpr std::chrono::milliseconds kConnectPoll{10};
// How often the mTLS files are read (and gRPC reads its copies of them).
constexpr std::chrono::seconds kTlsRefresh{2};
}  // namespace

absl::StatusOr<std::unique_ptr<TlsFiles>> StartTlsFiles(const ClientOptions& o) {
  if (o.ca_file.empty()) return nullptr;
  TlsFiles::Options to;
  to.configured = {o.key_file, o.cert_file, o.ca_file};
  to.prefix = "";
  to.where = "";  // "cert_file PATH ...", as Connect's other messages
  to.reader = "libholdfast";
  to.wait_for_files = true;
  to.check = kTlsRefresh;
  if (o.on_tls_files) {
    to.told = [tell = o.on_tls_files](TlsFiles::Outcome outcome, const std::string& reason) {
      tell(outcome == TlsFiles::Outcome::kTaken ? absl::OkStatus()
                                                : absl::InvalidArgumentError(reason));
    };
  }
  return TlsFiles::Start(std::move(to));
}

std::shared_ptr<grpc::ChannelCredentials> Credentials(const ClientOptions& o,
                                                      const TlsFiles* files) {
  if (o.ca_file.empty()) return grpc::InsecureChannelCredentials();
  // gRPC reads the copies that `files` keeps whole (common/tls_files.h), as
  // often as they are checked, so a rotation is used within twice kTlsRefresh.
  // (A core made without them, as unit tests make one: the files themselves.)
  const auto refresh = static_cast<unsigned>(
      std::chrono::duration_cast<std::chrono::seconds>(kTlsRefresh).count());
  const TlsFiles::Paths served =
      files != nullptr ? files->served() : TlsFiles::Paths{o.key_file, o.cert_file, o.ca_file};
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (served.cert.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        served.ca, refresh);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        served.key, served.cert, served.ca, refresh);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!served.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

ClientCore::ClientCore(ClientOptions options, std::unique_ptr<TlsFiles> tls_files)
    : options_(std::move(options)), tls_files_(std::move(tls_files)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1'000);
  if (!options_.server_name.empty()) args.SetSslTargetNameOverride(options_.server_name);
  std::vector<std::string> order = options_.endpoints;
  if (options_.endpoint_order == EndpointOrder::kShuffled) {
    std::random_device seed;
    std::shuffle(order.begin(), order.end(), std::mt19937(seed()));
  }
  const auto credentials = Credentials(options_, tls_files_.get());
  for (const auto& address : order) {
    auto e = std::make_unique<Endpoint>();
    e->index = endpoints_.size();
    e->channel = grpc::CreateCustomChannel(address, credentials, args);
    e->session = v1::Session::NewStub(e->channel);
    e->lock = v1::Lock::NewStub(e->channel);
    e->admin = v1::Admin::NewStub(e->channel);
    endpoints_.push_back(std::move(e));
  }
  pump_ = std::make_unique<KeepAlivePump>(this);
}

ClientCore::~ClientCore() { pump_.reset(); }

OnLostRunner::OnLostRunner() : thread_([q = q_] { Run(q); }) {}

void OnLostRunner::Run(const std::shared_ptr<Queue>& q) {
  ::pthread_setname_np(::pthread_self(), "holdfast-onlost");
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&q->mu);
      q->mu.Await(absl::Condition(
          +[](Queue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS { return q->stopping || !q->fns.empty(); },
          q.get()));
      if (q->fns.empty()) {  // stopping, and all run
        q->ended = true;
        return;
      }
      fn = std::move(q->fns.front());
      q->fns.pop_front();
    }
    fn();
  }
}

void OnLostRunner::Post(std::function<void()> fn) {
  {
    absl::MutexLock l(&q_->mu);
    // Also while stopping: a thread still running (one detached by a Stop from a
    // callback) keeps them one at a time, in order.
    if (!q_->ended) {
      q_->fns.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void OnLostRunner::Stop() {
  {
    absl::MutexLock l(&q_->mu);
    q_->stopping = true;
  }
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // runs the rest after the callback that called this
  } else {
    thread_.join();
  }
}

ClientCore::Endpoint& ClientCore::Connected(std::chrono::system_clock::time_point deadline,
                                            bool* connected) {
  const size_t n = endpoints_.size();
  const size_t start = current_.load();
  auto found = [&](size_t i) -> Endpoint& {
    size_t expected = start;
    // Another caller may have moved on already; either endpoint is connected.
    if (i != start) current_.compare_exchange_strong(expected, i);
    if (connected != nullptr) *connected = true;
    return *endpoints_[i];
  };
  if (endpoints_[start]->channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
    return found(start);
  }
  size_t asked = 1;  // endpoints asked to connect, from `start` on
  auto next_ask = std::chrono::system_clock::now() + kConnectGrace;
  while (true) {
    grpc_connectivity_state newest = GRPC_CHANNEL_IDLE;
    for (size_t k = 0; k < asked; ++k) {
      const size_t i = (start + k) % n;
      newest = endpoints_[i]->channel->GetState(/*try_to_connect=*/true);
      if (newest == GRPC_CHANNEL_READY) return found(i);
      // The newest one asked refused (or failed its handshake): ask the next now.
      if (k + 1 == asked && newest == GRPC_CHANNEL_TRANSIENT_FAILURE && asked < n) {
        ++asked;
        next_ask = std::chrono::system_clock::now() + kConnectGrace;
      }
    }
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) break;
    if (asked < n && now >= next_ask) {
      ++asked;
      next_ask = now + kConnectGrace;
      continue;
    }
    // Wait on the newest one asked; the others are looked at again every poll.
    endpoints_[(start + asked - 1) % n]->channel->WaitForStateChange(
        newest, std::min({deadline, next_ask, now + kConnectPoll}));
  }
  if (connected != nullptr) *connected = false;
  return *endpoints_[start];
}

void ClientCore::Skip(const Endpoint& e) {
  size_t expected = e.index;
  current_.compare_exchange_strong(expected, (e.index + 1) % endpoints_.size());
}

void ClientCore::PassOver(const Endpoint& e) {
  Skip(e);
  absl::MutexLock l(&moveable_mu_);
  for (Moveable* m : moveable_) {
    if (m->endpoint_ != e.index) continue;
    m->moved_.store(true);
    m->ctx_->TryCancel();  // does not block; the context outlives its entry here
  }
}

ClientCore::Moveable::Moveable(ClientCore& core, const Endpoint& e, grpc::ClientContext* ctx)
    : core_(core), endpoint_(e.index), ctx_(ctx) {
  absl::MutexLock l(&core_.moveable_mu_);
  core_.moveable_.push_back(this);
}

ClientCore::Moveable::~Moveable() {
  absl::MutexLock l(&core_.moveable_mu_);
  auto& v = core_.moveable_;
  v.erase(std::find(v.begin(), v.end(), this));
}

ClientCore::Endpoint& ClientCore::Prepare(
    grpc::ClientContext* ctx, std::chrono::milliseconds extra,
    std::optional<std::chrono::system_clock::time_point> deadline) {
  const auto until =
      deadline.value_or(std::chrono::system_clock::now() + options_.rpc_timeout + extra);
  ctx->set_deadline(until);
  if (endpoints_.size() == 1) {
    // gRPC 1.51 reconnects a channel whose connection was refused only slowly (up
    // to ~10 s) unless a call waits for it; these calls all carry a deadline.
    ctx->set_wait_for_ready(true);
    return *endpoints_[0];
  }
  bool connected = false;
  Endpoint& e = Connected(until, &connected);
  ctx->set_wait_for_ready(!connected);
  return e;
}

SessionState::SessionState(std::shared_ptr<ClientCore> core, std::string ns, int64_t id,
                           std::chrono::milliseconds ttl, const SessionOptions& options,
                           SteadyClock::time_point opened_at)
    : core_(std::move(core)),
      ns_(std::move(ns)),
      id_(id),
      ttl_(ttl),
      margin_(std::chrono::milliseconds(static_cast<int64_t>(
          static_cast<double>(ttl.count()) * std::clamp(options.safety_margin, 0.0, 0.5)))),
      on_lost_(options.on_lost),
      deadline_(opened_at + ttl - margin_) {}

bool HoldState::lost() const {
  absl::MutexLock l(&mu_);
  return lost_;
}

bool HoldState::unprotected() const {
  absl::MutexLock l(&mu_);
  return unprotected_ && !lost_;
}

absl::Status HoldState::lost_reason() const {
  absl::MutexLock l(&mu_);
  return reason_;
}

bool HoldState::MarkLost(const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (lost_) return false;
    lost_ = true;
    reason_ = why;
  }
  stop_.request_stop();
  return true;
}

void HoldState::SetUnprotected(bool unprotected) {
  absl::MutexLock l(&mu_);
  unprotected_ = unprotected;
}

bool SessionState::lost() const {
  absl::MutexLock l(&mu_);
  return lost_;
}

absl::Status SessionState::lost_reason() const {
  absl::MutexLock l(&mu_);
  return lost_reason_;
}

SteadyClock::time_point SessionState::deadline() const {
  absl::MutexLock l(&mu_);
  return deadline_;
}

int64_t SessionState::renewals() const {
  absl::MutexLock l(&mu_);
  return renewals_;
}

std::shared_ptr<HoldState> SessionState::HoldFor(const std::string& lock_key, bool open_class,
                                                 int64_t token) {
  absl::MutexLock l(&mu_);
  std::shared_ptr<HoldState> found;
  std::erase_if(holds_, [&](const std::weak_ptr<HoldState>& w) {
    auto h = w.lock();
    if (h && !found && h->token() == token && h->lock_key() == lock_key && !h->lost()) {
      found = std::move(h);
    }
    return w.expired();
  });
  if (found) return found;
  auto made = std::make_shared<HoldState>(lock_key, open_class, token);
  holds_.push_back(made);
  return made;
}

bool SessionState::LostHere(const std::string& lock_key, int64_t token) const {
  absl::MutexLock l(&mu_);
  return std::find(lost_here_.begin(), lost_here_.end(), std::pair(lock_key, token)) !=
         lost_here_.end();
}

void SessionState::EndHold(const std::string& lock_key, int64_t token, const absl::Status& why) {
  std::vector<std::shared_ptr<HoldState>> ended;
  {
    absl::MutexLock l(&mu_);
    std::erase(lost_here_, std::pair(lock_key, token));
    for (auto& w : holds_) {
      auto h = w.lock();
      if (h && h->token() == token && h->lock_key() == lock_key) ended.push_back(std::move(h));
    }
  }
  for (auto& h : ended) h->MarkLost(why);
}

void SessionState::Confirm(SteadyClock::time_point sent_at, std::chrono::milliseconds ttl) {
  std::vector<std::shared_ptr<HoldState>> holds;
  {
    absl::MutexLock l(&mu_);
    if (lost_) return;  // never revived
    ++renewals_;
    deadline_ = std::max(deadline_, sent_at + ttl - margin_);
    deadline_passed_ = false;
    for (auto& w : holds_) {
      if (auto h = w.lock()) holds.push_back(std::move(h));
    }
  }
  for (auto& h : holds) h->SetUnprotected(false);
}

void SessionState::Suspect(const absl::Status& why, bool deadline_passed) {
  std::vector<std::shared_ptr<HoldState>> holds;
  {
    absl::MutexLock l(&mu_);
    if (lost_ || closed_) return;
    // A renewal confirmed since the pump saw the deadline pass moved it on.
    if (deadline_passed && SteadyClock::now() < deadline_) return;
    if (deadline_passed) deadline_passed_ = true;
    for (auto& w : holds_) {
      if (auto h = w.lock()) holds.push_back(std::move(h));
    }
  }
  bool any_lost = false, open_alive = false;
  for (auto& h : holds) {
    if (h->open_class()) {
      h->SetUnprotected(true);
      open_alive = open_alive || !h->lost();
    } else if (h->MarkLost(why)) {
      any_lost = true;
      absl::MutexLock l(&mu_);
      lost_here_.emplace_back(h->lock_key(), h->token());
      if (lost_here_.size() > kMaxLostHere) lost_here_.pop_front();
    }
  }
  // Past its deadline with nothing that may run unprotected, the session itself
  // counts as lost: its lease may expire at any moment.
  if (deadline_passed && !open_alive) return MarkLost(why);
  if (any_lost) RunOnLost(why);
}

void SessionState::HoldsEnded(const google::protobuf::RepeatedPtrField<v1::EndedHold>& ended) {
  std::vector<std::pair<std::shared_ptr<HoldState>, absl::Status>> lost;
  {
    absl::MutexLock l(&mu_);
    if (lost_ || closed_) return;
    for (const auto& e : ended) {
      for (auto& w : holds_) {
        auto h = w.lock();
        if (h && h->token() == e.token() && h->lock_key() == e.lock_key()) {
          lost.emplace_back(std::move(h), absl::FailedPreconditionError(absl::StrCat(
                                              "hold on \"", e.lock_key(), "\" (token ", e.token(),
                                              ") was ", e.reason())));
        }
      }
    }
  }
  for (auto& [h, why] : lost) {
    if (h->MarkLost(why)) RunOnLost(why);
  }
}

void SessionState::MarkLost(absl::Status why) {
  std::vector<std::shared_ptr<HoldState>> holds;
  {
    absl::MutexLock l(&mu_);
    if (lost_ || closed_) return;
    lost_ = true;
    lost_reason_ = why;
    for (auto& w : holds_) {
      if (auto h = w.lock()) holds.push_back(std::move(h));
    }
  }
  for (auto& h : holds) h->MarkLost(why);
  stop_.request_stop();
  RunOnLost(why);
}

namespace {
// The on_lost calls this thread is running, innermost first: a Close from inside
// a callback must not wait for the callbacks it is called from.
struct OnLostFrame {
  const SessionState* session;
  bool counted;  // still in the session's on_lost_running_
  OnLostFrame* outer;
};
thread_local OnLostFrame* running_on_lost = nullptr;
}  // namespace

bool SessionState::RunningAnyOnLost() { return running_on_lost != nullptr; }

void SessionState::OweRelease(const std::string& lock_key, int64_t token) {
  absl::MutexLock l(&mu_);
  if (lost_ || closed_) return;  // the lease is gone, or going with its holds
  for (const auto& o : owed_) {
    if (o.lock_key == lock_key && o.token == token) return;
  }
  owed_.push_back({lock_key, token, 0, SteadyClock::now() + std::chrono::seconds(1)});
  owes_ = true;
}

SessionState::TakeBack SessionState::TakeBackRelease(const std::string& lock_key,
                                                     int64_t token) {
  absl::MutexLock l(&mu_);
  if (std::find(released_by_pump_.begin(), released_by_pump_.end(),
                std::pair(lock_key, token)) != released_by_pump_.end()) {
    return TakeBack::kInFlight;  // went through: the answer was sent before it
  }
  for (auto it = owed_.begin(); it != owed_.end(); ++it) {
    if (it->lock_key != lock_key || it->token != token) continue;
    if (it->in_flight) return TakeBack::kInFlight;
    owed_.erase(it);
    owes_ = !owed_.empty();
    return TakeBack::kTakenBack;
  }
  return TakeBack::kNotOwed;
}

size_t SessionState::owed_releases() const {
  absl::MutexLock l(&mu_);
  return std::count_if(owed_.begin(), owed_.end(), [](const OwedRelease& o) { return o.token != 0; });
}

size_t SessionState::doubted_acquires() const {
  absl::MutexLock l(&mu_);
  return std::count_if(owed_.begin(), owed_.end(), [](const OwedRelease& o) { return o.token == 0; });
}

void SessionState::AcquireStarts(const std::string& lock_key) {
  absl::MutexLock l(&mu_);
  ++acquiring_[lock_key];
}

void SessionState::AcquireEnds(const std::string& lock_key, bool held) {
  absl::MutexLock l(&mu_);
  auto it = acquiring_.find(lock_key);
  if (it != acquiring_.end() && --it->second <= 0) acquiring_.erase(it);
  if (held) {
    std::erase_if(owed_, [&](const OwedRelease& o) { return o.token == 0 && o.lock_key == lock_key; });
    owes_ = !owed_.empty();
  }
}

void SessionState::DoubtAcquire(const std::string& lock_key) {
  absl::MutexLock l(&mu_);
  if (lost_ || closed_) return;  // its holds end with it
  const uint64_t doubt = ++doubts_made_;
  const auto next = SteadyClock::now() + kDoubtAfter;
  for (auto& o : owed_) {
    if (o.token != 0 || o.lock_key != lock_key) continue;
    // Doubted already: starts over from this failure (a Describe out now may
    // have read before this call's grant).
    o.doubt = doubt;
    o.in_flight = false;
    o.next = next;
    o.backoff = std::chrono::seconds(1);
    return;
  }
  owed_.push_back({lock_key, 0, doubt, next});
  owes_ = true;
}

void SessionState::AnswerDoubt(const std::string& key, uint64_t doubt,
                               const absl::StatusOr<v1::DescribeResponse>& r) {
  absl::MutexLock l(&mu_);
  auto it = std::find_if(owed_.begin(), owed_.end(), [&](const OwedRelease& o) {
    return o.token == 0 && o.lock_key == key && o.doubt == doubt && o.in_flight;
  });
  // Ended by an Acquire answered with the hold, made again since, or the
  // session ended.
  if (it == owed_.end()) return;
  auto drop = [&] {
    owed_.erase(it);
    owes_ = !owed_.empty();
  };
  auto later = [&] {
    it->in_flight = false;
    it->next = SteadyClock::now() + it->backoff;
    it->backoff = std::min<std::chrono::milliseconds>(it->backoff * 2, std::chrono::seconds(30));
  };
  if (!r.ok()) {
    // Asked in vain for good (no longer a member, the namespace gone): the
    // session's holds are beyond this session's reach. Anything else: later.
    const absl::StatusCode code = r.status().code();
    if (ReleaseIsRefused(code) || code == absl::StatusCode::kNotFound) return drop();
    return later();
  }
  // An Acquire of the key out now may be answered with the hold: asked again
  // after it (which ends the doubt if it is answered with a Hold).
  if (acquiring_.contains(key)) return later();
  for (const auto& h : r->holders()) {
    if (h.session_id() != id_) continue;
    for (const auto& w : holds_) {
      auto held = w.lock();
      // A handle of it is about: held knowingly (an Acquire answered with it).
      if (held && held->lock_key() == key && held->token() == h.token() && !held->lost()) {
        return drop();
      }
    }
    for (const auto& o : owed_) {
      if (o.lock_key == key && o.token == h.token()) return drop();  // owed already
    }
    // Owed from now on, as the release of a dropped Hold is: sent at the
    // pump's next turn, and taken back by an Acquire answered with it.
    it->token = h.token();
    it->in_flight = false;
    it->next = SteadyClock::now();
    it->backoff = std::chrono::seconds(1);
    return;
  }
  for (const auto& w : r->waiters()) {
    if (w.session_id() == id_) return later();  // still queued: it may yet be granted
  }
  drop();  // neither held nor queued: nothing to do
}

void SessionState::SendOwedReleases(const std::shared_ptr<SessionState>& self,
                                    SteadyClock::time_point now) {
  std::vector<std::tuple<std::string, int64_t, uint64_t>> due;
  {
    absl::MutexLock l(&self->mu_);
    if (self->lost_ || self->closed_) {
      self->owed_.clear();
      self->owes_ = false;
      return;
    }
    for (auto& o : self->owed_) {
      if (o.in_flight || now < o.next) continue;
      o.in_flight = true;
      due.emplace_back(o.lock_key, o.token, o.doubt);
    }
  }
  if (due.empty()) return;
  auto& core = *self->core_;
  // The endpoint current now, without waiting for one to connect: a call that
  // finds no connection fails and is tried again later.
  auto& endpoint = core.Connected(std::chrono::system_clock::now());
  for (auto& [key, token, doubt] : due) {
    if (token == 0) {  // a doubted acquire: is the key held by this session?
      struct Ask {
        grpc::ClientContext ctx;
        v1::DescribeRequest req;
        v1::DescribeResponse resp;
      };
      auto ask = std::make_shared<Ask>();
      ask->ctx.set_deadline(std::chrono::system_clock::now() + core.options().rpc_timeout);
      ask->req.set_namespace_(self->ns_);
      ask->req.set_lock_key(key);
      std::weak_ptr<SessionState> weak = self;
      endpoint.lock->async()->Describe(
          &ask->ctx, &ask->req, &ask->resp, [weak, ask, key = key, doubt = doubt](grpc::Status st) {
            auto state = weak.lock();
            if (!state) return;
            if (st.ok()) {
              state->AnswerDoubt(key, doubt, ask->resp);
            } else {
              state->AnswerDoubt(key, doubt, FromGrpcStatus(st));
            }
          });
      continue;
    }
    struct Call {
      grpc::ClientContext ctx;
      v1::ReleaseRequest req;
      v1::ReleaseResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(std::chrono::system_clock::now() + core.options().rpc_timeout);
    call->req.set_namespace_(self->ns_);
    call->req.set_session_id(self->id_);
    call->req.set_lock_key(key);
    call->req.set_token(token);
    std::weak_ptr<SessionState> weak = self;
    endpoint.lock->async()->Release(
        &call->ctx, &call->req, &call->resp,
        [weak, call, key = key, token = token](grpc::Status st) {
          auto state = weak.lock();
          if (!state) return;
          const absl::StatusCode code = FromGrpcStatus(st).code();
          {
            absl::MutexLock l(&state->mu_);
            for (auto it = state->owed_.begin(); it != state->owed_.end(); ++it) {
              if (it->lock_key != key || it->token != token) continue;
              // Done, not current any more (released, expired, forced), or
              // refused for good: no longer owed. Anything else: later, each
              // pause twice the last.
              if (ReleaseIsOver(code) || ReleaseIsRefused(code)) {
                state->owed_.erase(it);
                state->owes_ = !state->owed_.empty();
                if (ReleaseIsOver(code)) {
                  state->released_by_pump_.emplace_back(key, token);
                  if (state->released_by_pump_.size() > kMaxLostHere) {
                    state->released_by_pump_.pop_front();
                  }
                }
              } else {
                it->in_flight = false;
                it->next = SteadyClock::now() + it->backoff;
                it->backoff = std::min<std::chrono::milliseconds>(it->backoff * 2,
                                                                  std::chrono::seconds(30));
              }
              break;
            }
          }
          // Every handle of the hold still about (an Acquire of the key returned
          // it again) says it ended, as a Release() that went through does.
          if (ReleaseIsOver(code)) {
            state->EndHold(key, token,
                           absl::FailedPreconditionError(absl::StrCat(
                               "hold on \"", key, "\" (token ", token, ") was released")));
          }
        });
  }
}

bool SessionState::RunningOwnOnLost() const {
  for (const OnLostFrame* f = running_on_lost; f != nullptr; f = f->outer) {
    if (f->session == this) return true;
  }
  return false;
}

void SessionState::RunOnLost(const absl::Status& why) {
  if (!on_lost_) return;
  core_->on_lost_runner().Post([weak = weak_from_this(), why] {
    if (auto self = weak.lock()) self->RunOnLostNow(why);
  });
}

void SessionState::RunOnLostNow(const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (closed_) return;
    ++on_lost_running_;
  }
  OnLostFrame frame{this, true, running_on_lost};
  running_on_lost = &frame;
  absl::Cleanup done = [this, &frame] {  // also if on_lost throws
    running_on_lost = frame.outer;
    absl::MutexLock l(&mu_);
    if (frame.counted) --on_lost_running_;
  };
  on_lost_(why);
}

bool SessionState::WantsRenewal() const {
  absl::MutexLock l(&mu_);
  return !lost_ && !closed_;
}

bool SessionState::MarkClosed() {
  std::vector<std::shared_ptr<HoldState>> holds;
  {
    absl::MutexLock l(&mu_);
    // A callback already running finishes before Close returns (what it
    // captured may go right after), also when it is the callback that closed
    // the session; the ones this call is made from are not waited for. They
    // leave the count now, so that two callbacks on two threads that each
    // close the session do not wait for each other.
    // (They count again once the wait is over: a Close or ~Session on another
    // thread still waits for them to end.)
    std::vector<OnLostFrame*> own;
    for (OnLostFrame* f = running_on_lost; f != nullptr; f = f->outer) {
      if (f->session == this && f->counted) {
        f->counted = false;
        --on_lost_running_;
        own.push_back(f);
      }
    }
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &on_lost_running_));
    for (OnLostFrame* f : own) {
      f->counted = true;
      ++on_lost_running_;
    }
    if (closed_) return false;
    closed_ = true;
    for (auto& w : holds_) {
      if (auto h = w.lock()) holds.push_back(std::move(h));
    }
  }
  // Closing ends every hold of the session: a Hold still in the caller's hands
  // must say so (and stop its lost_token) like any other end. No on_lost: the
  // caller closed it.
  const absl::Status why = ClosedReason();
  for (auto& h : holds) h->MarkLost(why);
  return true;
}

absl::Status SessionState::ClosedReason() const {
  return absl::FailedPreconditionError(
      absl::StrCat("session ", id_, " was closed: its holds ended with it"));
}

bool SessionState::closed() const {
  absl::MutexLock l(&mu_);
  return closed_;
}

void SessionState::CloseAnswered() {
  absl::MutexLock l(&mu_);
  close_answered_ = true;
}

bool SessionState::close_answered() const {
  absl::MutexLock l(&mu_);
  return close_answered_;
}

}  // namespace internal

// --- Hold -------------------------------------------------------------------

Hold::Hold(Hold&& o) noexcept
    : session_(std::move(o.session_)), state_(std::move(o.state_)), info_(std::move(o.info_)) {
  o.session_.reset();
}

Hold& Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    // As the destructor: a release not done here is the pump's. Unless `o` is
    // a handle of this same hold (an Acquire of the held key returned it
    // again): that one goes on being held.
    if (state_ != o.state_) {
      (void)Release();
      LeaveReleaseToPump();
    }
    session_ = std::move(o.session_);
    state_ = std::move(o.state_);
    info_ = std::move(o.info_);
    o.session_.reset();
    o.info_.Clear();  // not the hold this one had, released above
  }
  return *this;
}

Hold::~Hold() {
  (void)Release();
  // Not done, and nobody left to ask again (Release keeps the session on any
  // failure but a hold not current): the pump does.
  LeaveReleaseToPump();
}

bool Hold::lost() const { return state_ ? state_->lost() : true; }

bool Hold::unprotected() const { return state_ && state_->unprotected(); }

absl::Status Hold::lost_reason() const {
  if (!state_) return absl::FailedPreconditionError("this Hold was moved from");
  return state_->lost_reason();
}

std::stop_token Hold::lost_token() const {
  if (state_) return state_->lost_token();
  std::stop_source gone;
  gone.request_stop();
  return gone.get_token();
}

absl::Status Hold::Release() { return ReleaseBy(std::nullopt); }

void Hold::LeaveReleaseToPump() {
  if (!session_) return;
  session_->OweRelease(info_.lock_key(), info_.token());
  session_.reset();
}

absl::Status Hold::ReleaseBy(std::optional<std::chrono::system_clock::time_point> bound) {
  if (!session_) return absl::OkStatus();
  // A lost session's lease is gone (nothing to release). A hold lost only locally
  // (etcd was unreachable) is released, so the key frees up as soon as it can.
  if (session_->lost() || session_->closed()) {
    session_.reset();
    return absl::OkStatus();
  }
  const std::shared_ptr<internal::SessionState> session = session_;
  v1::ReleaseRequest req;
  req.set_namespace_(session_->ns());
  req.set_session_id(session_->id());
  req.set_lock_key(info_.lock_key());
  req.set_token(info_.token());
  // ABORTED (the release raced with the queue), an unknown outcome
  // (OutcomeUnknown) and DEADLINE_EXCEEDED are asked again (AskIdempotent), all
  // within the rpc timeout from here; after an unknown outcome, "no such hold"
  // means it went.
  // (From inside an on_lost, a hold dropped there: FromInsideOnLost's bound; a
  // release not answered then leaves the hold to a later Release, or its session.)
  auto& core = session_->core();
  bool unknown = false;
  absl::Status s = AskIdempotent(
      core,
      internal::SessionState::RunningAnyOnLost()
          ? FromInsideOnLost(core, /*aborted_too=*/true)
          : Retry{.bound = bound.value_or(std::chrono::system_clock::now() +
                                          core.options().rpc_timeout),
                  .aborted_too = true},
      [&req](internal::ClientCore::Endpoint& endpoint, grpc::ClientContext* ctx) {
        v1::ReleaseResponse resp;
        return endpoint.lock->Release(ctx, req, &resp);
      },
      &unknown);
  if (unknown && s.code() == absl::StatusCode::kFailedPrecondition) s = absl::OkStatus();
  // Let go once the release is done or the hold is not current any more; the
  // hold's other handles (an Acquire of the held key returned it again) then say
  // so. Keep the session on any other failure, so the caller (or the
  // destructor, through the pump) can ask again: a transient one, one over the
  // namespace's op_rate_quota (RetryAfter says when), and a refusal too
  // (PERMISSION_DENIED), whose hold is still in etcd: let go, a second Release()
  // would answer OK and the hold would say it is not lost.
  if (ReleaseIsOver(s.code())) session_.reset();
  // Released, or not current any more: every handle of the hold says it ended,
  // also one whose Acquire came after this handle's hold was lost here (a state
  // of its own: a lost state is never shared again).
  if (ReleaseIsOver(s.code())) {
    const absl::Status why = absl::FailedPreconditionError(absl::StrCat(
        "hold on \"", info_.lock_key(), "\" (token ", info_.token(), ") was released"));
    session->EndHold(info_.lock_key(), info_.token(), why);  // this handle's state too
  }
  return s;
}

// --- Session ----------------------------------------------------------------

// Closes a session not closed yet; one whose Close failed is left to its TTL.
Session::~Session() { (void)CloseWithin(std::nullopt, /*send_again=*/false); }

int64_t Session::id() const { return state_->id(); }
const std::string& Session::ns() const { return state_->ns(); }
bool Session::lost() const { return state_->lost(); }
absl::Status Session::lost_reason() const { return state_->lost_reason(); }
std::stop_token Session::lost_token() const { return state_->lost_token(); }
std::chrono::steady_clock::time_point Session::deadline() const { return state_->deadline(); }
int64_t Session::renewals() const { return state_->renewals(); }

absl::StatusOr<Hold> Session::Acquire(const std::string& lock_key, const AcquireOptions& options) {
  if (state_->closed()) return absl::FailedPreconditionError("session is closed");
  if (state_->lost()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session is lost: ", state_->lost_reason().message()));
  }
  // Bad keys never leave the process (and a string field cannot carry invalid
  // UTF-8 anyway): the same rules and messages as the server's.
  if (auto s = names::ValidateLockKey(lock_key); !s.ok()) return s;
  // holdfastd refuses a wait out of range (INVALID_ARGUMENT); clamped here only so
  // that the deadlines cannot overflow before it says so.
  const auto wait = std::clamp<std::chrono::milliseconds>(options.wait, std::chrono::milliseconds(0),
                                                          std::chrono::hours(24));
  // One deadline for the whole call, retries included: the wait plus the rpc
  // timeout, counted from here. A retry after a lost connection waits for a new
  // one (wait_for_ready) only within it, so a holdfastd that went away ends the
  // call when the first attempt would have ended, not a wait later.
  state_->AcquireStarts(lock_key);
  auto hold = AcquireBy(lock_key, options, options.wait.count(),
                        std::chrono::system_clock::now() + state_->core().options().rpc_timeout + wait,
                        std::chrono::steady_clock::now() + wait);
  state_->AcquireEnds(lock_key, hold.ok());
  return hold;
}

absl::StatusOr<Hold> Session::AcquireBy(const std::string& lock_key,
                                        const AcquireOptions& options, int64_t wait_ms,
                                        std::chrono::system_clock::time_point call_deadline,
                                        std::chrono::steady_clock::time_point wait_until) {
  v1::AcquireRequest req;
  req.set_namespace_(state_->ns());
  req.set_session_id(state_->id());
  req.set_lock_key(lock_key);
  req.set_wait_ms(wait_ms);
  req.set_shared(options.shared);
  req.set_holder_meta(options.holder_meta);
  // The call is idempotent per (session, key): when the connection to holdfastd
  // breaks mid-call, or the stream is reset under it (OutcomeUnknown), or its
  // replica went silent (the keepalive pump passed it over: Moveable), ask again,
  // on whichever replica answers now, with what is left of the wait. The new
  // attempt takes the queued waiter over in place (its place in the queue), and a
  // grant already made is returned again.
  v1::AcquireResponse resp;
  absl::Status s;
  for (int attempt = 0; attempt < 10; ++attempt) {
    grpc::ClientContext ctx;
    auto& core = state_->core();
    auto& endpoint = core.Prepare(&ctx, {}, call_deadline);
    bool moved;
    {
      internal::ClientCore::Moveable moveable(core, endpoint, &ctx);
      s = FromCall(core, endpoint, ctx, endpoint.lock->Acquire(&ctx, req, &resp));
      moved = Moved(moveable, &s);
    }
    if (!OutcomeUnknown(s.code()) || state_->lost()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        wait_until - std::chrono::steady_clock::now());
    // A wait asked again stays a wait, if only of 1 ms: 0 would make it a try,
    // answered ABORTED instead of the wait's DEADLINE_EXCEEDED.
    req.set_wait_ms(std::max<int64_t>(left.count(), wait_ms > 0 ? 1 : 0));
    if (moved || SkipStopping(core, endpoint, s)) continue;  // the next endpoint is current
    const auto backoff = std::chrono::milliseconds(50 * (attempt + 1));
    if (std::chrono::system_clock::now() + backoff >= call_deadline) break;
    std::this_thread::sleep_for(backoff);
  }
  if (!s.ok()) {
    // No answer that says what became of the call: holdfastd may have granted
    // it; the pump finds out, and releases what it finds (DoubtAcquire).
    if (MayHaveBeenGranted(s)) state_->DoubtAcquire(lock_key);
    return s;
  }
  // The session's hold of the key that was lost here (etcd could not confirm
  // renewals) and is still in etcd: a lost hold is final, so it is released and
  // the key asked for anew with what is left of the wait (a new grant, a new
  // token; FIFO behind whoever queued meanwhile), all within the call's bounds.
  // So too a hold whose owed release (its Hold dropped while holdfastd could not
  // release it) is on its way now: it may end the hold just returned. One not
  // sent yet is no longer owed: the caller holds the key again.
  if (state_->LostHere(resp.hold().lock_key(), resp.hold().token()) ||
      state_->TakeBackRelease(resp.hold().lock_key(), resp.hold().token()) ==
          internal::SessionState::TakeBack::kInFlight) {
    Hold stale(state_,
               state_->HoldFor(resp.hold().lock_key(),
                               resp.hold().on_quorum_loss() == v1::ON_QUORUM_LOSS_OPEN,
                               resp.hold().token()),
               resp.hold());
    // FAILED_PRECONDITION / NOT_FOUND: it is not held any more (gone since the
    // answer): asked for anew all the same.
    absl::Status released = stale.ReleaseBy(std::min(
        call_deadline, std::chrono::system_clock::now() + state_->core().options().rpc_timeout));
    if (!released.ok() && released.code() != absl::StatusCode::kFailedPrecondition &&
        released.code() != absl::StatusCode::kNotFound) {
      // Not asked again here, past the call's bound (as ~Hold would): later.
      stale.LeaveReleaseToPump();
      return absl::UnavailableError(absl::StrCat(
          "\"", lock_key, "\" is still held by this session with token ", resp.hold().token(),
          ", a hold lost while etcd could not confirm renewals; releasing it failed (",
          released.message(), "); try again"));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        wait_until - std::chrono::steady_clock::now());
    return AcquireBy(lock_key, options, std::max<int64_t>(left.count(), 0), call_deadline,
                     wait_until);
  }
  auto hold_state = state_->HoldFor(resp.hold().lock_key(),
                                    resp.hold().on_quorum_loss() == v1::ON_QUORUM_LOSS_OPEN,
                                    resp.hold().token());
  // A session lost or closed while the call was out: the hold ended with it (a
  // Close that came first did not see this state).
  if (state_->lost()) {
    hold_state->MarkLost(state_->lost_reason());
  } else if (state_->closed()) {
    hold_state->MarkLost(state_->ClosedReason());
  }
  return Hold(state_, std::move(hold_state), resp.hold());
}

absl::Status Session::Close() { return CloseWithin(std::nullopt, /*send_again=*/true); }

absl::Status Session::Close(std::chrono::milliseconds timeout) {
  return CloseWithin(timeout, /*send_again=*/true);
}

absl::Status Session::CloseWithin(std::optional<std::chrono::milliseconds> timeout,
                                  bool send_again) {
  // Renewals stop and the holds end at the first Close, whatever its answer.
  if (!state_->MarkClosed()) {
    // Closed already. A CloseSession that failed (no holdfastd answered, say) is
    // sent again, so that the caller can still end the lease before its TTL runs
    // out; not by ~Session, which closes only a session not closed yet (a
    // Close(timeout) on the way out is not followed by a wait of an rpc timeout).
    if (!send_again || state_->close_answered()) return absl::OkStatus();
  }
  state_->core().pump().Remove(state_->id());
  v1::CloseSessionRequest req;
  req.set_namespace_(state_->ns());
  req.set_session_id(state_->id());
  auto& core = state_->core();
  Retry retry;
  if (internal::SessionState::RunningAnyOnLost()) {
    // From inside an on_lost (its own, or another session's): FromInsideOnLost's
    // bound. A close not answered leaves the lease to expire (or to a Close
    // called again later, from another thread).
    retry = FromInsideOnLost(core, /*aborted_too=*/false);
  } else {
    retry.bound = std::chrono::system_clock::now() +
                  (timeout ? std::min(core.options().rpc_timeout,
                                      std::max(*timeout, std::chrono::milliseconds(0)))
                           : core.options().rpc_timeout);
  }
  // CloseSession is idempotent (a session gone already is closed, OK), so an
  // unknown outcome is asked again, on another replica too, like a Release.
  bool unknown = false;
  absl::Status s = AskIdempotent(
      core, retry,
      [&req](internal::ClientCore::Endpoint& endpoint, grpc::ClientContext* ctx) {
        v1::CloseSessionResponse resp;
        return endpoint.session->Close(ctx, req, &resp);
      },
      &unknown);
  if (s.ok()) state_->CloseAnswered();
  return s;
}

// --- Client -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no holdfastd endpoint given");
  // Every call's deadline is now + rpc_timeout: zero or less fails each call at
  // once (as if no holdfastd answered), and a huge one overflows the clock.
  if (options.rpc_timeout <= std::chrono::milliseconds(0) ||
      options.rpc_timeout > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc_timeout ", options.rpc_timeout.count(),
                                                   "ms is outside (0, 24h]"));
  }
  for (const auto& e : options.endpoints) {
    if (e.empty() || std::any_of(e.begin(), e.end(), [](unsigned char c) {
          return c <= ' ' || c == 0x7f || c == ',';
        })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "holdfastd endpoint \"", absl::CEscape(e),
          "\" is not host:port (an empty one, or spaces, commas or control characters in it)"));
    }
    if (options.ca_file.empty() && !options.allow_plaintext && !net::IsLoopbackEndpoint(e)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "holdfastd endpoint ", e, " is not a loopback address and no CA bundle is given: "
          "plaintext there would trust whatever answers (holdfastd serves plaintext only on "
          "loopback); give the mTLS files (--ca/--cert/--key, HOLDFAST_CA/HOLDFAST_CERT/"
          "HOLDFAST_KEY; ClientOptions::ca_file, cert_file, key_file)"));
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("cert_file and key_file go together");
  }
  if (options.ca_file.empty() && !options.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "cert_file and key_file need ca_file (the CA bundle that signed holdfastd's "
        "certificate): without it the client would speak plaintext");
  }
  // Read once here: gRPC's watcher only logs a file it cannot use, and every
  // call would then fail as if holdfastd were unreachable. A file not there yet
  // is waited for as before (an SVID agent beside the process may write it
  // after the process starts); one that is there must be what it is named for.
  for (auto [name, path, kind] :
       {std::tuple{"ca_file", &options.ca_file, PemKind::kCertificates},
        std::tuple{"cert_file", &options.cert_file, PemKind::kCertificates},
        std::tuple{"key_file", &options.key_file, PemKind::kPrivateKey}}) {
    if (path->empty()) continue;
    if (struct stat st {}; ::stat(path->c_str(), &st) != 0 && errno == ENOENT) continue;
    if (auto s = CheckPemFile(*path, kind); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " ", s.message()));
    }
  }
  // gRPC reads copies of the files that only a whole set replaces; a set that
  // is all there must pass the checks holdfastd's own files do.
  auto tls_files = internal::StartTlsFiles(options);
  if (!tls_files.ok()) return tls_files.status();
  return std::unique_ptr<Client>(new Client(
      std::make_shared<internal::ClientCore>(std::move(options), *std::move(tls_files))));
}

Client::~Client() {
  core_->pump().Stop();  // sessions it renewed count as lost
  // Their callbacks, and any still queued, run before it returns (but for the
  // one this is called from, if it is).
  core_->on_lost_runner().Stop();
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession(const std::string& ns,
                                                             const SessionOptions& options) {
  if (auto s = names::ValidateNamespaceName(ns); !s.ok()) return s;
  // Not NaN, which passes any comparison's clamp and poisons the local deadline.
  if (!(options.safety_margin >= 0.0 && options.safety_margin <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safety_margin ", options.safety_margin, " is outside [0, 0.5] (the fraction of the "
        "TTL kept as a margin for clock drift)"));
  }
  v1::OpenSessionRequest req;
  req.set_namespace_(ns);
  req.set_ttl_ms(options.ttl.count());
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  auto& endpoint = core_->Prepare(&ctx);
  // Sent (for the session's local deadline) once an endpoint is connected.
  auto sent_at = std::chrono::steady_clock::now();
  auto s = FromCall(*core_, endpoint, ctx, endpoint.session->Open(&ctx, req, &resp));
  if (!s.ok()) return s;
  auto state = std::make_shared<internal::SessionState>(
      core_, ns, resp.session_id(), std::chrono::milliseconds(resp.ttl_ms()), options, sent_at);
  core_->pump().Add(state, sent_at);
  return std::unique_ptr<Session>(new Session(std::move(state)));
}

namespace {
template <class Stub, class Req, class Resp>
absl::StatusOr<Resp> Call(internal::ClientCore& core,
                          std::unique_ptr<Stub> internal::ClientCore::Endpoint::*stub,
                          grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                          const Req& req) {
  Resp resp;
  grpc::ClientContext ctx;
  auto& endpoint = core.Prepare(&ctx);
  auto s = FromCall(core, endpoint, ctx, ((*(endpoint.*stub)).*method)(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}
}  // namespace

absl::StatusOr<v1::DescribeResponse> Client::Describe(const std::string& ns,
                                                      const std::string& key) {
  // Checked here as Acquire does: a key that is not UTF-8 cannot even be sent.
  if (auto s = names::ValidateNamespaceName(ns); !s.ok()) return s;
  if (auto s = names::ValidateLockKey(key); !s.ok()) return s;
  v1::DescribeRequest req;
  req.set_namespace_(ns);
  req.set_lock_key(key);
  return Call(*core_, &internal::ClientCore::Endpoint::lock, &v1::Lock::Stub::Describe, req);
}

absl::StatusOr<v1::CheckTokenResponse> Client::CheckToken(const std::string& ns,
                                                          const std::string& key, int64_t token) {
  if (auto s = names::ValidateNamespaceName(ns); !s.ok()) return s;
  if (auto s = names::ValidateLockKey(key); !s.ok()) return s;
  v1::CheckTokenRequest req;
  req.set_namespace_(ns);
  req.set_lock_key(key);
  req.set_token(token);
  return Call(*core_, &internal::ClientCore::Endpoint::lock, &v1::Lock::Stub::CheckToken, req);
}

absl::StatusOr<v1::Namespace> Client::CreateNamespace(const v1::CreateNamespaceRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::CreateNamespace, req);
}

absl::StatusOr<v1::Namespace> Client::GetNamespace(const std::string& name) {
  v1::GetNamespaceRequest req;
  req.set_name(name);
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::GetNamespace, req);
}

namespace {

// Every page of a list call: asks with each page's next_page_token until one
// comes back empty. A token that does not move on ends it with INTERNAL (a
// server that would otherwise be asked for ever).
template <class Req, class Resp, class Item>
absl::StatusOr<std::vector<Item>> AllPages(
    Req req, const std::function<absl::StatusOr<Resp>(const Req&)>& call,
    const std::function<const google::protobuf::RepeatedPtrField<Item>&(const Resp&)>& items) {
  std::vector<Item> out;
  while (true) {
    auto r = call(req);
    if (!r.ok()) return r.status();
    out.insert(out.end(), items(*r).begin(), items(*r).end());
    if (r->next_page_token().empty()) return out;
    if (r->next_page_token() <= req.page_token() && !req.page_token().empty()) {
      return absl::InternalError(absl::StrCat("the list's next page token \"",
                                              r->next_page_token(), "\" does not move on from \"",
                                              req.page_token(), "\""));
    }
    req.set_page_token(r->next_page_token());
  }
}

}  // namespace

absl::StatusOr<std::vector<v1::Namespace>> Client::ListNamespaces() {
  return AllPages<v1::ListNamespacesRequest, v1::ListNamespacesResponse, v1::Namespace>(
      v1::ListNamespacesRequest(),
      [this](const v1::ListNamespacesRequest& req) {
        return Call(*core_, &internal::ClientCore::Endpoint::admin,
                    &v1::Admin::Stub::ListNamespaces, req);
      },
      [](const v1::ListNamespacesResponse& r) -> const auto& { return r.namespaces(); });
}

absl::StatusOr<v1::Namespace> Client::UpdateNamespace(const v1::UpdateNamespaceRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::UpdateNamespace, req);
}

absl::Status Client::DeleteNamespace(const std::string& name) {
  v1::DeleteNamespaceRequest req;
  req.set_name(name);
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::DeleteNamespace, req).status();
}

absl::StatusOr<v1::LockClass> Client::CreateClass(const v1::LockClass& cls) {
  v1::CreateClassRequest req;
  *req.mutable_class_() = cls;
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::CreateClass, req);
}

absl::StatusOr<v1::LockClass> Client::GetClass(const std::string& ns, const std::string& id) {
  v1::GetClassRequest req;
  req.set_namespace_(ns);
  req.set_class_id(id);
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::GetClass, req);
}

absl::StatusOr<std::vector<v1::LockClass>> Client::ListClasses(const std::string& ns) {
  v1::ListClassesRequest req;
  req.set_namespace_(ns);
  return AllPages<v1::ListClassesRequest, v1::ListClassesResponse, v1::LockClass>(
      req,
      [this](const v1::ListClassesRequest& req) {
        return Call(*core_, &internal::ClientCore::Endpoint::admin,
                    &v1::Admin::Stub::ListClasses, req);
      },
      [](const v1::ListClassesResponse& r) -> const auto& { return r.classes(); });
}

absl::Status Client::DeleteClass(const std::string& ns, const std::string& id) {
  v1::DeleteClassRequest req;
  req.set_namespace_(ns);
  req.set_class_id(id);
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::DeleteClass, req).status();
}

absl::StatusOr<v1::Epoch> Client::GetEpoch(const std::string& cluster) {
  v1::GetEpochRequest req;
  req.set_cluster(cluster);
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::GetEpoch, req);
}

absl::StatusOr<v1::RehomeNamespaceResponse> Client::RehomeNamespace(
    const v1::RehomeNamespaceRequest& req) {
  v1::RehomeNamespaceResponse resp;
  grpc::ClientContext ctx;
  // The drain may take the whole deadline; the steps after it take a few round trips.
  auto& endpoint = core_->Prepare(
      &ctx, std::chrono::milliseconds(req.deadline_ms() > 0 ? req.deadline_ms() : 60'000) +
                std::chrono::seconds(30));
  auto s = FromCall(*core_, endpoint, ctx, endpoint.admin->RehomeNamespace(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Epoch> Client::AdvanceEpoch(const v1::AdvanceEpochRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::AdvanceEpoch, req);
}

absl::StatusOr<v1::QueryAuditResponse> Client::QueryAudit(const v1::QueryAuditRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::QueryAudit, req);
}

absl::StatusOr<v1::AuditStatus> Client::GetAuditStatus(const v1::GetAuditStatusRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::GetAuditStatus,
              req);
}

absl::StatusOr<v1::ForceRequest> Client::RequestForceRelease(
    const v1::RequestForceReleaseRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::RequestForceRelease, req);
}

absl::StatusOr<v1::ApproveForceReleaseResponse> Client::ApproveForceRelease(
    const v1::ApproveForceReleaseRequest& req) {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::ApproveForceRelease, req);
}

absl::StatusOr<v1::ListForceRequestsResponse> Client::ListForceRequests() {
  return Call(*core_, &internal::ClientCore::Endpoint::admin, &v1::Admin::Stub::ListForceRequests,
              v1::ListForceRequestsRequest());
}

}  // namespace holdfast
