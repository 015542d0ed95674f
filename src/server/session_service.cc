#include "server/session_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc_util.h"

namespace holdfast::server {

namespace {

// Calls of Open and Close, and KeepAlive streams, kept requested from gRPC at
// once, so that a burst of arrivals does not wait for the loop to ask for each.
constexpr int kHotBacklog = 8;

// A KeepAlive stream reads no further request while this many are being served
// or answered without the answer written yet (a client that sends without
// reading): then HTTP/2 flow control holds the client's sends, and a stream
// costs holdfastd a bounded amount of memory and of etcd calls. Reading resumes
// once half of them are written. Far above what a client's renewals keep in
// flight (one per session per ttl/3, answered in an etcd round trip).
constexpr size_t kMaxUnanswered = 4096;

}  // namespace

// One KeepAlive stream. Requests are read one after another; each is answered
// once etcd has. Every request's session is checked (it exists in the namespace
// named and belongs to the caller): from the engine's table of sessions it has
// seen, or with one read of a session new to it. The stream finishes only when
// reads are over (or the replica stops: Stop) and no engine callback or write is
// outstanding, so no callback outlives it; it is deleted once gRPC has handed
// back the finish, told it done, and ended the read in flight.
class SessionService::KeepAliveStream {
 public:
  explicit KeepAliveStream(SessionService* service) : service_(service) {
    ctx_.AsyncNotifyWhenDone(&done_);
    grpc::ServerCompletionQueue* cq = service_->rpc_->loop()->server_cq();
    service_->service_.RequestKeepAlive(&ctx_, &stream_, cq, cq, &arrived_);
  }
  ~KeepAliveStream() {
    absl::MutexLock l(&service_->streams_mu_);
    service_->streams_.erase(this);
  }

  // The replica is stopping: ends the stream (UNAVAILABLE, kStoppingMetadata)
  // once what is under way is answered; no request is read after this one.
  void Stop() {
    bool finish;
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) FinishStream();
  }

 private:
  void OnArrived(bool ok) {
    if (!ok) {  // the server is shutting down; never matched, so no done either
      delete this;
      return;
    }
    if (!service_->rpc_->stopped()) service_->RequestKeepAlive();
    auto caller = service_->auth_->CallerOf(ctx_);
    if (!caller.ok()) {
      // A stream from a caller without an acceptable identity.
      {
        absl::MutexLock l(&mu_);
        finished_ = true;
      }
      return stream_.Finish(ToGrpcStatus(caller.status()), &finish_tag_);
    }
    caller_ = *std::move(caller);
    bool stopping;
    {
      absl::MutexLock l(&service_->streams_mu_);
      stopping = service_->stopping_;
      service_->streams_.insert(this);  // EndStreams may Stop it from here on
    }
    if (stopping) return Stop();
    ReadNext();
  }

  // Asks for the next request, unless the stream is stopping. Under mu_, so that
  // Stop's finish comes either before (and no read is asked for) or after it.
  void ReadNext() {
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        reads_done_ = true;
        finish = ShouldFinishLocked();
      } else {
        reading_ = true;
        stream_.Read(&req_, &read_tag_);
      }
    }
    if (finish) FinishStream();
  }

  void OnRead(bool ok) {
    bool serve = false, finish = false, read_more = false;
    {
      absl::MutexLock l(&mu_);
      reading_ = false;
      if (!ok || stopping_) {  // a request read after Stop is not served
        reads_done_ = true;
        finish = ShouldFinishLocked();
      } else {
        serve = true;
        ++outstanding_;
        // Decided here, under the lock: once paused, only ResumeLocked reads on,
        // so one read at most is ever asked for.
        if (outstanding_ + writes_.size() >= kMaxUnanswered) read_paused_ = true;
        read_more = !read_paused_;
      }
    }
    if (finish) FinishStream();
    if (!serve) return MaybeDelete();
    v1::KeepAliveRequest req = req_;
    // Pipelined: the next request may come before this answer (unless too many
    // are unanswered: ResumeLocked reads on, from whichever thread sees them fall).
    if (read_more) ReadNext();
    Handle(std::move(req));
  }

  // Reads on when paused and the unanswered requests fell to half the bound, or
  // the stream broke (its next read fails and so ends it). The read is asked for
  // here, under mu_, as ReadNext does: a stream whose finish another thread
  // decides right after must not be deleted while this one still asks. When
  // stopping, reads are over instead.
  void ResumeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!read_paused_ || reading_) return;
    if (!broken_ && outstanding_ + writes_.size() > kMaxUnanswered / 2) return;
    read_paused_ = false;
    if (stopping_) {
      reads_done_ = true;
      return;
    }
    reading_ = true;
    stream_.Read(&req_, &read_tag_);
  }

  void OnWritten(bool ok) {
    bool more = false, finish = false;
    {
      absl::MutexLock l(&mu_);
      if (!ok) {
        broken_ = true;
        writes_.clear();
      }
      if (!broken_ && !writes_.empty()) {
        write_buf_ = std::move(writes_.front());
        writes_.pop_front();
        more = true;
      } else {
        writing_ = false;
      }
      ResumeLocked();
      if (!more) finish = ShouldFinishLocked();
    }
    if (more) stream_.Write(write_buf_, &write_tag_);
    if (finish) FinishStream();
  }

  void OnFinished(bool) {
    finish_back_ = true;
    MaybeDelete();
  }
  void OnDone(bool) {
    done_back_ = true;
    {
      absl::MutexLock l(&mu_);
      ended_ = true;  // cancelled, or finished: its waiting lookups are not made
    }
    MaybeDelete();
  }
  void MaybeDelete() {
    if (!finish_back_ || !done_back_) return;
    {
      absl::MutexLock l(&mu_);
      if (reading_) return;  // its end calls again
    }
    delete this;
  }

  // Once (after ShouldFinishLocked said so): UNAVAILABLE when the replica
  // stops, else OK (the client half-closed).
  void FinishStream() {
    bool stopping;
    {
      absl::MutexLock l(&mu_);
      stopping = stopping_;
    }
    if (!stopping) return stream_.Finish(grpc::Status::OK, &finish_tag_);
    ctx_.AddTrailingMetadata(kStoppingMetadata, "1");
    stream_.Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, kStoppingMessage), &finish_tag_);
  }

  void Handle(v1::KeepAliveRequest req) {
    // Each request goes to its namespace's home cluster. A session is verified
    // per cluster: after a rehome its id means nothing on the new home. The
    // engine knows the sessions it has seen (lock/session_owners.h): those are
    // checked at once, and only a session new to this replica costs a read,
    // paced per identity by what such reads find (server/lookup_pacer.h).
    lock::Engine* engine = service_->router_->RouteFor(req.namespace_()).engine;
    if (engine->IsKnownOwnSession(caller_, req.namespace_(), req.session_id())) {
      return Renew(engine, std::move(req), Deadline(engine));
    }
    // A malformed request costs no read: refused before the pace.
    if (auto s = lock::ValidateSessionRef(req.namespace_(), req.session_id()); !s.ok()) {
      return Refuse(req, s);
    }
    // Whether Run is still running it (at once) or it waited its turn.
    auto in_run = std::make_shared<std::atomic<bool>>(true);
    auto admitted = service_->lookups_.Run(
        caller_.identity, [this, engine, req, in_run]() mutable {
          LookUp(engine, std::move(req), /*waited=*/!in_run->load());
        });
    in_run->store(false);
    if (admitted == LookupPacer::Admission::kFull) {
      // Not answered: "lost" would be false, and "not confirmed" would make
      // libholdfast drop the session's closed-class holds at once. Unanswered,
      // the client renews again (on another replica when it has one, as from a
      // silent one).
      if (auto* observer = engine->options().observer) {
        observer->OnSessionLookup(lock::SessionLookup::kRefused, /*waited=*/false);
      }
      Drop();
    }
  }

  static lock::Deadline Deadline(lock::Engine* engine) {
    return lock::Deadline(std::chrono::system_clock::now() + engine->options().etcd_timeout);
  }

  // The read of a session new to this replica, then the renewal. A lookup whose
  // stream broke, ended or is stopping while it waited is not made: it is
  // dropped unanswered (the client renews on its next stream).
  void LookUp(lock::Engine* engine, v1::KeepAliveRequest req, bool waited) {
    bool drop;
    {
      absl::MutexLock l(&mu_);
      drop = broken_ || stopping_ || ended_;
    }
    if (drop) {
      service_->lookups_.GiveBack(caller_.identity);
      return Drop();
    }
    const auto deadline = Deadline(engine);
    engine->VerifySession(
        caller_, req.namespace_(), req.session_id(), deadline,
        [this, engine, req, deadline, waited](absl::StatusOr<bool> ok) mutable {
          const auto code = ok.status().code();
          const bool missed =
              code == absl::StatusCode::kNotFound || code == absl::StatusCode::kPermissionDenied;
          // Only a lookup that found the caller's session gives its token back
          // (LookupPacer): one that etcd did not answer keeps it too.
          if (ok.ok()) service_->lookups_.GiveBack(caller_.identity);
          if (auto* observer = engine->options().observer) {
            observer->OnSessionLookup(ok.ok()  ? lock::SessionLookup::kFound
                                      : missed ? lock::SessionLookup::kMissed
                                               : lock::SessionLookup::kFailed,
                                      waited);
          }
          if (ok.ok()) return Renew(engine, std::move(req), deadline);
          Refuse(req, ok.status());
        });
  }

  // A request that gets no answer.
  void Drop() {
    bool finish;
    {
      absl::MutexLock l(&mu_);
      --outstanding_;
      ResumeLocked();
      finish = ShouldFinishLocked();
    }
    if (finish) FinishStream();
  }

  // Answers a request whose session did not pass the check: lost when it is not
  // (or not the caller's) to renew, etcd_unavailable when etcd could not tell.
  void Refuse(const v1::KeepAliveRequest& req, const absl::Status& why) {
    v1::KeepAliveResponse resp;
    resp.set_session_id(req.session_id());
    resp.set_sequence(req.sequence());
    const auto code = why.code();
    bool gone = code == absl::StatusCode::kNotFound ||
                code == absl::StatusCode::kInvalidArgument ||
                code == absl::StatusCode::kPermissionDenied;
    resp.set_lost(gone);
    resp.set_etcd_unavailable(!gone);
    resp.set_reason(std::string(why.message()));
    Answer(std::move(resp));
  }

  void Renew(lock::Engine* engine, v1::KeepAliveRequest req, lock::Deadline deadline) {
    engine->Renew(req, deadline, [this](absl::StatusOr<v1::KeepAliveResponse> r) {
      Answer(*std::move(r));  // Renew never fails; errors are in the answer
    });
  }

  // From any thread (the engine's callbacks come on the loop or the timer thread).
  void Answer(v1::KeepAliveResponse resp) {
    bool start = false, finish = false;
    {
      absl::MutexLock l(&mu_);
      --outstanding_;
      if (!broken_) {
        if (writing_) {
          writes_.push_back(std::move(resp));
        } else {
          writing_ = true;
          write_buf_ = std::move(resp);
          start = true;
        }
      }
      ResumeLocked();
      finish = !start && ShouldFinishLocked();
    }
    if (start) stream_.Write(write_buf_, &write_tag_);
    if (finish) FinishStream();
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !(reads_done_ || stopping_) || outstanding_ > 0 || writing_) return false;
    finished_ = true;
    return true;
  }

  SessionService* const service_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest> stream_{&ctx_};
  lock::Caller caller_;               // set on arrival
  v1::KeepAliveRequest req_;          // owned by the read in flight
  v1::KeepAliveResponse write_buf_;   // owned by the write in flight
  absl::Mutex mu_;
  std::deque<v1::KeepAliveResponse> writes_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // gRPC told it done (OnDone)
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a Read is in flight
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // kMaxUnanswered reached
  // Touched on the loop thread only.
  bool finish_back_ = false;
  bool done_back_ = false;
  using Tag = EventLoop::MemberTag<KeepAliveStream>;
  Tag arrived_{this, &KeepAliveStream::OnArrived};
  Tag read_tag_{this, &KeepAliveStream::OnRead};
  Tag write_tag_{this, &KeepAliveStream::OnWritten};
  Tag finish_tag_{this, &KeepAliveStream::OnFinished};
  Tag done_{this, &KeepAliveStream::OnDone};
};


void SessionService::Serve(RpcServer* rpc) {
  using S = v1::Session::AsyncService;
  rpc_ = rpc;
  rpc->ServeUnary<S, v1::OpenSessionRequest, v1::OpenSessionResponse>(
      &service_, &S::RequestOpen, [this](auto* call) { Open(call); }, kHotBacklog);
  rpc->ServeUnary<S, v1::CloseSessionRequest, v1::CloseSessionResponse>(
      &service_, &S::RequestClose, [this](auto* call) { Close(call); }, kHotBacklog);
  for (int i = 0; i < kHotBacklog; ++i) RequestKeepAlive();
}

void SessionService::RequestKeepAlive() { new KeepAliveStream(this); }

SessionService::SessionService(const Router* router, const Authenticator* auth,
                               LookupPacer::Options lookups, std::weak_ptr<TimerQueue> timers)
    : router_(router),
      auth_(auth),
      lookups_(lookups, [timers = std::move(timers)](std::chrono::steady_clock::duration d,
                                                      std::function<void()> fn) {
        if (auto t = timers.lock()) t->ScheduleAfter(d, std::move(fn));
      }) {}

void SessionService::EndStreams() {
  {
    absl::MutexLock l(&streams_mu_);
    stopping_ = true;
    // Stop does not delete (deletion waits for streams_mu_ in the destructor).
    for (KeepAliveStream* s : streams_) s->Stop();
  }
  // The lookups waiting for their pace: each is dropped by its stream, now
  // stopping, which then finishes.
  lookups_.Stop();
}

void SessionService::Open(UnaryCall<v1::OpenSessionRequest, v1::OpenSessionResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  const v1::OpenSessionRequest* req = &call->request();  // lives as long as the call
  const Route route = router_->RouteFor(req->namespace_());
  // A caller gone before the answer (cancelled, or its connection closed) never
  // learns the session's id: an open not begun by then is not begun, and a
  // session opened for it is closed again (Engine::AbandonSession), whether the
  // cancel came before the answer or while it went out (gRPC then reports the
  // call cancelled: the caller did not get an OK).
  struct OpenCall {
    absl::Mutex mu;
    bool gone ABSL_GUARDED_BY(mu) = false;
    int64_t answered ABSL_GUARDED_BY(mu) = 0;  // the session an OK answer carried
  };
  auto state = std::make_shared<OpenCall>();
  lock::Engine* engine = route.engine;
  const std::string ns = req->namespace_();
  call->OnCancel([state, engine, ns] {
    int64_t answered;
    {
      absl::MutexLock l(&state->mu);
      state->gone = true;
      answered = std::exchange(state->answered, 0);
    }
    if (answered != 0) engine->AbandonSession(ns, answered);
  });
  auto finish = FinishInto(call);
  lock::Done<v1::OpenSessionResponse> done =
      [state, engine, ns, finish](absl::StatusOr<v1::OpenSessionResponse> r) {
        if (r.ok()) {
          bool gone;
          {
            absl::MutexLock l(&state->mu);
            gone = state->gone;
            if (!gone) state->answered = r->session_id();
          }
          if (gone) {
            engine->AbandonSession(ns, r->session_id());
            r = absl::CancelledError(
                "the call ended before the session was opened; it was closed again");
          }
        }
        finish(std::move(r));
      };
  AdmitThen(route.quota, call, *caller, req->namespace_(), [=, caller = *caller] {
    engine->OpenSession(caller, *req, RpcDeadline(call->context(), kUnaryCap), done, [state] {
      absl::MutexLock l(&state->mu);
      return state->gone;
    });
  });
}

void SessionService::Close(UnaryCall<v1::CloseSessionRequest, v1::CloseSessionResponse>* call) {
  auto caller = auth_->CallerOf(call->context());
  if (!caller.ok()) return call->Finish(caller.status());
  const v1::CloseSessionRequest* req = &call->request();
  const Route route = router_->RouteFor(req->namespace_());
  // Counted against op_rate_quota, never refused by it (OpQuota::Charge).
  if (route.quota != nullptr) route.quota->Charge(*caller, req->namespace_());
  route.engine->CloseSession(*caller, *req, RpcDeadline(call->context(), kUnaryCap),
                             FinishInto(call));
}

}  // namespace holdfast::server
