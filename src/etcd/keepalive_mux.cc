#include "etcd/keepalive_mux.h"

#include <vector>

#include "etcd/errors.h"

namespace holdfast::etcd {

class KeepAliveMux::Stream
    : public BidiStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> {
 public:
  Stream(KeepAliveMux* mux, size_t index) : mux_(mux), index_(index) {}

 protected:
  void OnResponse(const pb::LeaseKeepAliveResponse& resp) override {
    mux_->OnResponse(this, resp);
  }
  void OnFinished(const grpc::Status& status) override {
    mux_->OnFinished(this, status, index_);
  }

 private:
  KeepAliveMux* const mux_;
  const size_t index_;

 public:
  size_t index() const { return index_; }
};

KeepAliveMux::KeepAliveMux(Client* client) : client_(client) {}

void KeepAliveMux::Shutdown() {
  std::shared_ptr<Stream> s;
  {
    absl::MutexLock l(&mu_);
    shutting_down_ = true;
    s = std::move(current_);
  }
  if (s) s->Cancel();
  s.reset();  // our reference must not keep it from being destroyed
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &KeepAliveMux::GoneLocked));
}

void KeepAliveMux::CancelTimerLocked(const Pending& p) {
  if (p.timer != 0 && client_->timers().Cancel(p.timer)) --timers_armed_;
}

void KeepAliveMux::KeepAlive(int64_t lease_id, Deadline d,
                             Callback<pb::LeaseKeepAliveResponse> cb) {
  std::shared_ptr<Stream> stream;
  bool fresh = false;
  size_t index = 0;
  uint64_t id = 0;
  {
    absl::MutexLock l(&mu_);
    if (!shutting_down_) {
      if (current_ == nullptr) {
        Client::Endpoint* endpoint;
        std::tie(endpoint, index) = client_->PickEndpoint();
        current_ = std::make_shared<Stream>(this, index);
        ++live_streams_;
        current_->OnDestroyed([this] {
          absl::MutexLock l(&mu_);
          --live_streams_;
        });
        fresh = true;
        current_->Prepare(&client_->loop(),
                          [endpoint](grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
                            Client::RequireLeader(ctx);
                            return endpoint->lease->PrepareAsyncLeaseKeepAlive(ctx, cq);
                          });
      }
      stream = current_;
      id = next_id_++;
      auto now_steady = std::chrono::steady_clock::now();
      auto timer = client_->timers().Schedule(
          now_steady + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           d - std::chrono::system_clock::now()),
          [this, lease_id, id] { OnTimeout(lease_id, id); });
      if (timer != 0) ++timers_armed_;
      const bool silence_counts =
          d - std::chrono::system_clock::now() >= Client::kSilentEndpoint;
      pending_[stream.get()][lease_id].push_back(
          Pending{id, std::move(cb), timer, d, silence_counts});
      by_id_[id] = stream;
    }
  }
  if (fresh) stream->Go();
  if (!stream) {
    cb(absl::UnavailableError("etcd client is shutting down"));
    return;
  }
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease_id);
  stream->Send(std::move(req));  // a refused send is failed by OnFinished
}

void KeepAliveMux::OnResponse(Stream* s, const pb::LeaseKeepAliveResponse& resp) {
  Callback<pb::LeaseKeepAliveResponse> cb;
  {
    absl::MutexLock l(&mu_);
    auto& per_lease = pending_[s];
    auto it = per_lease.find(resp.id());
    if (it != per_lease.end() && !it->second.empty()) {
      Pending p = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) per_lease.erase(it);
      by_id_.erase(p.id);
      if (p.cb) {
        CancelTimerLocked(p);
        cb = std::move(p.cb);
      }
    }
  }
  client_->ObserveHeader(resp.header());
  if (cb) cb(resp);
}

void KeepAliveMux::OnFinished(Stream* s, const grpc::Status& status, size_t endpoint_index) {
  absl::Status why = status.ok() ? absl::UnavailableError("etcd: keepalive stream ended")
                                 : FromEtcd(status);
  bool cancelled = why.code() == absl::StatusCode::kCancelled;
  if (cancelled) why = absl::UnavailableError("etcd: keepalive stream reset");
  std::vector<Callback<pb::LeaseKeepAliveResponse>> failed;
  struct Again {
    int64_t lease;
    Deadline deadline;
    Callback<pb::LeaseKeepAliveResponse> cb;
  };
  std::vector<Again> again;  // left behind by a move: sent on the new stream
  {
    absl::MutexLock l(&mu_);
    if (current_.get() == s) current_.reset();
    const bool moved = moved_.erase(s) > 0 && !shutting_down_;
    auto node = pending_.extract(s);
    if (!node.empty()) {
      for (auto& [lease, q] : node.mapped()) {
        for (auto& p : q) {
          by_id_.erase(p.id);
          if (p.cb) {
            CancelTimerLocked(p);
            if (moved && std::chrono::system_clock::now() < p.deadline) {
              again.push_back(Again{lease, p.deadline, std::move(p.cb)});
            } else {
              failed.push_back(std::move(p.cb));
            }
          }
        }
      }
    }
  }
  // Outside mu_: moving the client calls MoveFrom().
  if (!cancelled) client_->ReportUnavailable(endpoint_index);
  for (auto& cb : failed) cb(why);
  for (auto& a : again) KeepAlive(a.lease, a.deadline, std::move(a.cb));
}

void KeepAliveMux::MoveFrom(size_t index) {
  std::shared_ptr<Stream> left;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_ || current_ == nullptr || current_->index() != index) return;
    left = std::move(current_);
    moved_[left.get()] = true;
  }
  left->Cancel();
}

void KeepAliveMux::OnTimeout(int64_t lease_id, uint64_t id) {
  Callback<pb::LeaseKeepAliveResponse> cb;
  std::shared_ptr<Stream> suspect;
  bool silence_counts = false;
  {
    absl::MutexLock l(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
      --timers_armed_;  // answered or failed already; the last use of this mux
      return;
    }
    suspect = it->second;
    auto& q = pending_[suspect.get()][lease_id];
    for (auto& p : q) {
      if (p.id == id) {
        cb = std::move(p.cb);  // the slot stays to absorb a late answer
        silence_counts = p.silence_counts;
      }
    }
    if (current_ == suspect) {
      current_.reset();
      // Its other requests go again on the next stream: only this one is late.
      moved_[suspect.get()] = true;
    }
  }
  suspect->Cancel();
  auto fail = [cb = std::move(cb)]() mutable {
    if (cb) cb(absl::DeadlineExceededError("etcd: no keepalive answer before the deadline"));
  };
  // Is the member there at all? The answer comes after the check (etcd/client.h),
  // which the client waits for before it goes.
  if (silence_counts && client_->endpoint_count() > 1) {
    client_->CheckSilent(suspect->index(), std::move(fail));
  } else {
    fail();
  }
  suspect.reset();  // the stream's end may be what the destructor waits for
  absl::MutexLock l(&mu_);
  --timers_armed_;  // the last use of this mux: its destructor may go on now
}

}  // namespace holdfast::etcd
