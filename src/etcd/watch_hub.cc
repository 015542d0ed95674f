#include "etcd/watch_hub.h"

#include "absl/strings/str_cat.h"
#include "etcd/errors.h"

namespace holdfast::etcd {

class WatchHub::Stream : public BidiStream<pb::WatchRequest, pb::WatchResponse> {
 public:
  Stream(WatchHub* hub, size_t index) : hub_(hub), index_(index) {}

 protected:
  void OnResponse(const pb::WatchResponse& resp) override { hub_->OnResponse(this, resp); }
  void OnFinished(const grpc::Status& status) override {
    hub_->OnFinished(this, status, index_);
  }

 private:
  WatchHub* const hub_;
  const size_t index_;

 public:
  size_t index() const { return index_; }
};

WatchHub::WatchHub(Client* client) : client_(client) {}

WatchHub::~WatchHub() {
  std::shared_ptr<Stream> s;
  {
    absl::MutexLock l(&mu_);
    shutting_down_ = true;
    watchers_.clear();
    if (reconnect_scheduled_) client_->timers().Cancel(reconnect_timer_);
    s = std::move(current_);
  }
  if (s) s->Cancel();
  s.reset();  // our reference must not keep it from being destroyed
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(+[](int* live) { return *live == 0; }, &live_streams_));
}

size_t WatchHub::size() {
  absl::MutexLock l(&mu_);
  return watchers_.size();
}

pb::WatchRequest WatchHub::CreateRequestLocked(WatchId id, const Watcher& w) {
  pb::WatchRequest req;
  auto* c = req.mutable_create_request();
  c->set_watch_id(id);
  c->set_key(w.spec.key);
  c->set_range_end(w.spec.range_end);
  c->set_start_revision(w.next_revision != 0 ? w.next_revision : w.spec.start_revision);
  c->set_prev_kv(w.spec.prev_kv);
  if (w.spec.no_put) c->add_filters(pb::WatchCreateRequest::NOPUT);
  if (w.spec.no_delete) c->add_filters(pb::WatchCreateRequest::NODELETE);
  return req;
}

std::pair<std::shared_ptr<WatchHub::Stream>, bool> WatchHub::EnsureStreamLocked() {
  if (current_) return {current_, false};
  auto [endpoint, index] = client_->PickEndpoint();
  current_ = std::make_shared<Stream>(this, index);
  ++live_streams_;
  current_->OnDestroyed([this] {
    absl::MutexLock l(&mu_);
    --live_streams_;
  });
  current_->Prepare([endpoint](grpc::ClientContext* ctx, Stream::Reactor* r) {
    endpoint->watch->async()->Watch(ctx, r);
  });
  return {current_, true};
}

WatchId WatchHub::Watch(WatchSpec spec, WatchCallback cb) {
  std::shared_ptr<Stream> stream;
  bool fresh = false;
  pb::WatchRequest req;
  WatchId id;
  {
    absl::MutexLock l(&mu_);
    id = next_id_++;
    Watcher w{std::move(spec), std::make_shared<WatchCallback>(std::move(cb)), 0};
    req = CreateRequestLocked(id, w);
    watchers_.emplace(id, std::move(w));
    if (shutting_down_) return id;
    if (reconnect_scheduled_) return id;  // Reconnect() will create it
    std::tie(stream, fresh) = EnsureStreamLocked();
  }
  if (fresh) stream->Go();
  stream->Send(std::move(req));  // if refused, OnFinished reconnects and re-creates
  return id;
}

void WatchHub::Cancel(WatchId id) {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock l(&mu_);
    if (watchers_.erase(id) == 0) return;
    stream = current_;
  }
  if (stream) {
    pb::WatchRequest req;
    req.mutable_cancel_request()->set_watch_id(id);
    stream->Send(std::move(req));
  }
}

void WatchHub::OnResponse(Stream* s, const pb::WatchResponse& resp) {
  client_->ObserveHeader(resp.header());
  std::shared_ptr<WatchCallback> cb;
  absl::StatusOr<WatchBatch> delivery;
  {
    absl::MutexLock l(&mu_);
    if (current_.get() != s) return;  // a stream left behind (MoveFrom)
    auto it = watchers_.find(resp.watch_id());
    if (it == watchers_.end()) return;  // cancelled meanwhile
    Watcher& w = it->second;
    if (resp.canceled()) {
      if (resp.compact_revision() > 0) {
        delivery = absl::OutOfRangeError(
            absl::StrCat("etcd: watch start revision was compacted (compact revision ",
                         resp.compact_revision(), ")"));
      } else {
        delivery = absl::AbortedError(absl::StrCat("etcd: watch cancelled: ",
                                                   resp.cancel_reason()));
      }
      cb = std::move(w.cb);
      watchers_.erase(it);
    } else if (resp.created()) {
      // A watch from "now" resumes after the revision it was created at.
      if (w.next_revision == 0 && w.spec.start_revision == 0) {
        w.next_revision = resp.header().revision() + 1;
      }
      return;
    } else {
      if (resp.events_size() == 0) return;  // progress notification
      WatchBatch batch;
      batch.header_revision = resp.header().revision();
      batch.events.assign(resp.events().begin(), resp.events().end());
      w.next_revision = resp.events(resp.events_size() - 1).kv().mod_revision() + 1;
      delivery = std::move(batch);
      cb = w.cb;
    }
  }
  if (cb && *cb) (*cb)(std::move(delivery));
}

void WatchHub::OnFinished(Stream* s, const grpc::Status& status, size_t endpoint_index) {
  {
    absl::MutexLock l(&mu_);
    if (s == leaving_) {
      // Left behind by MoveFrom: every answer it read has been delivered (gRPC
      // finishes a stream after its last read reaction), so the watchers can be
      // created again without two streams delivering to one watcher.
      leaving_ = nullptr;
      if (!shutting_down_ && !watchers_.empty()) {
        reconnect_timer_ = client_->timers().ScheduleAfter(std::chrono::milliseconds(0),
                                                           [this] { Reconnect(); });
      } else {
        reconnect_scheduled_ = false;
      }
      return;
    }
    if (current_.get() != s) return;
    current_.reset();
    if (shutting_down_) return;
    if (!watchers_.empty() && !reconnect_scheduled_) {
      reconnect_scheduled_ = true;
      reconnect_timer_ = client_->timers().ScheduleAfter(std::chrono::milliseconds(200),
                                                         [this] { Reconnect(); });
    }
  }
  // Outside mu_: moving the client calls MoveFrom().
  if (status.error_code() != grpc::StatusCode::CANCELLED) {
    client_->ReportUnavailable(endpoint_index);
  }
}

void WatchHub::MoveFrom(size_t index) {
  std::shared_ptr<Stream> left;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_ || current_ == nullptr || current_->index() != index) return;
    if (reconnect_scheduled_) return;  // a break is being handled already
    left = std::move(current_);
    leaving_ = left.get();
    reconnect_scheduled_ = true;  // new watchers wait for the reconnect
  }
  left->Cancel();  // its OnFinished reconnects
}

void WatchHub::Reconnect() {
  std::shared_ptr<Stream> stream;
  bool fresh = false;
  std::vector<pb::WatchRequest> creates;
  {
    absl::MutexLock l(&mu_);
    reconnect_scheduled_ = false;
    if (shutting_down_ || watchers_.empty()) return;
    std::tie(stream, fresh) = EnsureStreamLocked();
    for (const auto& [id, w] : watchers_) creates.push_back(CreateRequestLocked(id, w));
  }
  if (fresh) stream->Go();
  for (auto& r : creates) stream->Send(std::move(r));
}

}  // namespace holdfast::etcd
