#include "server/health_service.h"

#include <optional>
#include <utility>

namespace holdfast::server {

namespace hv1 = grpc::health::v1;

// One Watch call. Writes one status at a time: the newest one not yet sent.
class HealthService::Watch {
 public:
  explicit Watch(HealthService* health) : health_(health) {
    ctx_.AsyncNotifyWhenDone(&done_);
    grpc::ServerCompletionQueue* cq = health_->rpc_->loop()->server_cq();
    health_->service_.RequestWatch(&ctx_, &req_, &writer_, cq, cq, &arrived_);
  }

  const std::string& service() const { return req_.service(); }

  // Queues `status` unless it is the one queued or sent last (with `last`, the
  // call ends after it). Under health_->mu_.
  void Send(Status status, bool last) {
    absl::MutexLock l(&mu_);
    if (status != latest_) {
      latest_ = status;
      pending_ = status;
    }
    end_ = end_ || last;
    NextLocked();
  }

 private:
  // Starts the next write, or the finish, if nothing is in flight.
  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finishing_) return;
    if (pending_ && !cancelled_) {
      out_.set_status(*pending_);
      pending_.reset();
      writing_ = true;
      writer_.Write(out_, &written_);
    } else if (end_ || cancelled_) {
      finishing_ = true;
      writer_.Finish(grpc::Status::OK, &finished_);
    }
  }

  void OnArrived(bool ok) {
    if (!ok) {  // the server is shutting down; never matched, so no done either
      delete this;
      return;
    }
    if (!health_->rpc_->stopped()) health_->RequestWatch();
    health_->AddWatch(this);
  }
  void OnWritten(bool ok) {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;  // the stream is gone
    NextLocked();
  }
  void OnFinished(bool) {
    bool gone;
    {
      absl::MutexLock l(&mu_);
      finish_back_ = true;
      gone = done_back_;
    }
    if (gone) delete this;
  }
  void OnDone(bool) {
    health_->RemoveWatch(this);  // outside mu_ (lock order)
    bool gone;
    {
      absl::MutexLock l(&mu_);
      done_back_ = true;
      cancelled_ = cancelled_ || ctx_.IsCancelled();
      NextLocked();
      gone = finish_back_;
    }
    if (gone) delete this;
  }

  HealthService* const health_;
  grpc::ServerContext ctx_;
  hv1::HealthCheckRequest req_;
  hv1::HealthCheckResponse out_;  // owned by the write in flight
  grpc::ServerAsyncWriter<hv1::HealthCheckResponse> writer_{&ctx_};
  absl::Mutex mu_;
  std::optional<Status> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<Status> latest_ ABSL_GUARDED_BY(mu_);  // queued or sent last
  bool end_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_back_ ABSL_GUARDED_BY(mu_) = false;
  bool done_back_ ABSL_GUARDED_BY(mu_) = false;
  EventLoop::MemberTag<Watch> arrived_{this, &Watch::OnArrived};
  EventLoop::MemberTag<Watch> written_{this, &Watch::OnWritten};
  EventLoop::MemberTag<Watch> finished_{this, &Watch::OnFinished};
  EventLoop::MemberTag<Watch> done_{this, &Watch::OnDone};
};

HealthService::HealthService() {
  absl::MutexLock l(&mu_);
  for (const char* name : {"", "holdfast.v1.Session", "holdfast.v1.Lock", "holdfast.v1.Admin"}) {
    statuses_[name] = hv1::HealthCheckResponse::SERVING;
  }
}

HealthService::~HealthService() = default;

void HealthService::Serve(RpcServer* rpc) {
  rpc_ = rpc;
  rpc->ServeUnary<hv1::Health::AsyncService, hv1::HealthCheckRequest, hv1::HealthCheckResponse>(
      &service_, &hv1::Health::AsyncService::RequestCheck,
      [this](UnaryCall<hv1::HealthCheckRequest, hv1::HealthCheckResponse>* call) {
        Status status;
        {
          absl::MutexLock l(&mu_);
          status = StatusOfLocked(call->request().service());
        }
        if (status == hv1::HealthCheckResponse::SERVICE_UNKNOWN) {
          return call->Finish(absl::NotFoundError(
              "unknown service \"" + call->request().service() + "\""));
        }
        call->response()->set_status(status);
        call->Finish(absl::OkStatus());
      });
  RequestWatch();
}

void HealthService::RequestWatch() { new Watch(this); }

void HealthService::SetServingStatus(bool serving, const std::map<std::string, bool>& overrides) {
  auto of = [](bool on) {
    return on ? hv1::HealthCheckResponse::SERVING : hv1::HealthCheckResponse::NOT_SERVING;
  };
  absl::MutexLock l(&mu_);
  if (shut_down_) return;
  for (auto& [name, status] : statuses_) status = of(serving);
  for (const auto& [name, on] : overrides) statuses_[name] = of(on);
  StatusChangedLocked();
}

void HealthService::Shutdown() {
  absl::MutexLock l(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, status] : statuses_) status = hv1::HealthCheckResponse::NOT_SERVING;
  StatusChangedLocked();
}

void HealthService::StatusChangedLocked() {
  for (Watch* w : watches_) w->Send(StatusOfLocked(w->service()), shut_down_);
}

HealthService::Status HealthService::StatusOfLocked(const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? hv1::HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::AddWatch(Watch* w) {
  absl::MutexLock l(&mu_);
  watches_.insert(w);
  w->Send(StatusOfLocked(w->service()), shut_down_);
}

void HealthService::RemoveWatch(Watch* w) {
  absl::MutexLock l(&mu_);
  watches_.erase(w);
}

}  // namespace holdfast::server
