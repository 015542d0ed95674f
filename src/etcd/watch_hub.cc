#include "etcd/watch_hub.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
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

namespace {

// Whether a shared watch's event is one `spec` would have been sent by etcd.
bool Matches(const WatchSpec& spec, const mvccpb::Event& e) {
  if (e.kv().mod_revision() < spec.start_revision) return false;
  if (spec.no_put && e.type() == mvccpb::Event::PUT) return false;
  if (spec.no_delete && e.type() == mvccpb::Event::DELETE) return false;
  const std::string& k = e.kv().key();
  if (spec.range_end.empty()) return k == spec.key;
  if (spec.range_end == std::string(1, '\0')) return k >= spec.key;  // every key from `key`
  return k >= spec.key && k < spec.range_end;
}

// Where CompactedError keeps the revision, so that readers need not parse the
// message.
constexpr char kCompactRevisionPayload[] = "holdfast.etcd/compact_revision";

}  // namespace

absl::Status CompactedError(int64_t compact_revision) {
  absl::Status s = absl::OutOfRangeError(absl::StrCat(
      "etcd: watch start revision was compacted (compact revision ", compact_revision, ")"));
  s.SetPayload(kCompactRevisionPayload, absl::Cord(absl::StrCat(compact_revision)));
  return s;
}

int64_t CompactRevisionOf(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kOutOfRange) return 0;
  auto payload = s.GetPayload(kCompactRevisionPayload);
  int64_t revision = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &revision)) return 0;
  return revision;
}

WatchHub::WatchHub(Client* client) : client_(client) {}

void WatchHub::Shutdown() {
  std::shared_ptr<Stream> s;
  {
    absl::MutexLock l(&mu_);
    shutting_down_ = true;
    watchers_.clear();
    groups_.clear();
    member_group_.clear();
    ended_unsent_.clear();
    // A reconnect not yet taken by the timer thread never runs. One taken runs
    // Reconnect(), which clears the flag and returns; one that MoveFrom() asked
    // for waits for the stream it left, whose OnFinished clears it. Either way
    // the flag is cleared under mu_ after the last use of this hub.
    if (reconnect_scheduled_ && client_->timers().Cancel(reconnect_timer_)) {
      reconnect_scheduled_ = false;
    }
    s = std::move(current_);
  }
  if (s) s->Cancel();
  s.reset();  // our reference must not keep it from being destroyed
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &WatchHub::GoneLocked));
}

bool WatchHub::GoneLocked() const { return live_streams_ == 0 && !reconnect_scheduled_; }

size_t WatchHub::size() {
  absl::MutexLock l(&mu_);
  // A shared watch whose error is being delivered has left watchers_ already.
  int64_t own = static_cast<int64_t>(watchers_.size()) - static_cast<int64_t>(groups_.size());
  return static_cast<size_t>(std::max<int64_t>(own, 0)) + member_group_.size();
}

size_t WatchHub::etcd_watches() {
  absl::MutexLock l(&mu_);
  return watchers_.size();
}

pb::WatchRequest WatchHub::CreateRequestLocked(WatchId id, Watcher& w) {
  // Created anew (a new stream): the parts of a split response it had are sent
  // again whole, from next_revision.
  w.fragments.clear();
  pb::WatchRequest req;
  auto* c = req.mutable_create_request();
  // A catch-up of many large revisions (an auditor behind) would otherwise come
  // as one response past the channel's receive limit, refused every time it was
  // asked again: etcd splits it into parts under its request size limit instead.
  c->set_fragment(true);
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
  current_->Prepare(&client_->loop(), [endpoint](grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
    // (Not Client::RequireLeader: the Watch stream is on the hand-over path, and
    // it needs no such mark. On a member without a leader it moves with the
    // client, which renewals move off it (CheckSilent): the sessions', the
    // auditor's, and on the control cluster holdfastd's own replica lease's.)
    return endpoint->watch->PrepareAsyncWatch(ctx, cq);
  });
  return {current_, true};
}

WatchHub::Pending WatchHub::AddWatcherLocked(WatchId id, WatchSpec spec, WatchCallback cb) {
  Pending p;
  Watcher w{std::move(spec), std::make_shared<WatchCallback>(std::move(cb)), 0};
  auto [it, inserted] = watchers_.emplace(id, std::move(w));
  p.req = CreateRequestLocked(id, it->second);
  if (shutting_down_) return p;
  if (reconnect_scheduled_) return p;  // Reconnect() will create it
  std::tie(p.stream, p.fresh) = EnsureStreamLocked();
  p.send = true;
  return p;
}

void WatchHub::SendPending(Pending p) {
  if (!p.send) return;
  if (p.fresh) p.stream->Go();
  p.stream->Send(std::move(p.req));  // if refused, OnFinished reconnects and re-creates
}

WatchId WatchHub::Watch(WatchSpec spec, WatchCallback cb) {
  Pending p;
  WatchId id;
  {
    absl::MutexLock l(&mu_);
    id = next_id_++;
    p = AddWatcherLocked(id, std::move(spec), std::move(cb));
  }
  SendPending(std::move(p));
  return id;
}

WatchId WatchHub::WatchWithin(const std::string& group_key, const std::string& group_end,
                              WatchSpec spec, WatchCallback cb) {
  if (spec.prev_kv || spec.start_revision <= 0) return Watch(std::move(spec), std::move(cb));
  Pending p;
  WatchId id;
  WatchId created = 0;
  GroupRange created_range;
  {
    absl::MutexLock l(&mu_);
    id = next_id_++;
    GroupRange range{group_key, group_end};
    auto it = groups_.find(range);
    const int64_t start = spec.start_revision;
    if (shutting_down_ ||
        (it != groups_.end() && (it->second.start > start || it->second.last_delivered >= start))) {
      // The shared watch may have passed events this watcher needs: one of its own.
      p = AddWatcherLocked(id, std::move(spec), std::move(cb));
    } else {
      if (it == groups_.end()) {
        const WatchId etcd_id = next_id_++;
        WatchSpec shared;
        shared.key = group_key;
        shared.range_end = group_end;
        shared.start_revision = start;
        it = groups_.emplace(range, Group{}).first;
        it->second.etcd_id = etcd_id;
        it->second.start = start;
        p = AddWatcherLocked(etcd_id, std::move(shared),
                             [this, range, etcd_id](absl::StatusOr<WatchBatch> b) {
                               OnGroupBatch(range, etcd_id, std::move(b));
                             });
        it->second.sent = !p.send;
      }
      it->second.members.emplace(
          id, Member{std::move(spec), std::make_shared<WatchCallback>(std::move(cb))});
      if (p.send) {
        // This call sends the shared watch's create (else Reconnect() will: sent).
        created = it->second.etcd_id;
        created_range = range;
      }
      member_group_.emplace(id, std::move(range));
    }
  }
  SendPending(std::move(p));
  if (created != 0) {
    std::shared_ptr<Stream> stream;
    {
      absl::MutexLock l(&mu_);
      if (ended_unsent_.erase(created) > 0) {
        // Its watchers all left meanwhile: cancel it, after its create.
        if (watchers_.erase(created) > 0) stream = current_;
      } else if (auto g = groups_.find(created_range);
                 g != groups_.end() && g->second.etcd_id == created) {
        g->second.sent = true;
      }
    }
    if (stream) {
      pb::WatchRequest req;
      req.mutable_cancel_request()->set_watch_id(created);
      stream->Send(std::move(req));
    }
  }
  return id;
}

void WatchHub::Cancel(WatchId id) {
  std::shared_ptr<Stream> stream;
  WatchId etcd_id = id;
  {
    absl::MutexLock l(&mu_);
    if (auto m = member_group_.find(id); m != member_group_.end()) {
      auto g = groups_.find(m->second);
      member_group_.erase(m);
      if (g == groups_.end()) return;
      g->second.members.erase(id);
      if (!g->second.members.empty()) return;
      etcd_id = g->second.etcd_id;  // the last one out ends the shared watch
      const bool sent = g->second.sent;
      groups_.erase(g);
      if (!sent) {
        ended_unsent_.insert(etcd_id);  // its creator cancels it once the create is out
        return;
      }
    }
    if (watchers_.erase(etcd_id) == 0) return;
    stream = current_;
  }
  if (stream) {
    pb::WatchRequest req;
    req.mutable_cancel_request()->set_watch_id(etcd_id);
    stream->Send(std::move(req));
  }
}

void WatchHub::OnGroupBatch(const GroupRange& range, WatchId etcd_id,
                            absl::StatusOr<WatchBatch> batch) {
  std::vector<std::pair<std::shared_ptr<WatchCallback>, absl::StatusOr<WatchBatch>>> out;
  {
    absl::MutexLock l(&mu_);
    auto it = groups_.find(range);
    if (it == groups_.end() || it->second.etcd_id != etcd_id) return;  // ended meanwhile
    Group& g = it->second;
    if (!batch.ok()) {
      // The shared watch ended (the hub has dropped it): so does every watcher in it.
      for (auto& [id, m] : g.members) {
        out.emplace_back(m.cb, batch.status());
        member_group_.erase(id);
      }
      groups_.erase(it);
    } else {
      for (const auto& e : batch->events) {
        g.last_delivered = std::max(g.last_delivered, e.kv().mod_revision());
      }
      for (auto& [id, m] : g.members) {
        WatchBatch mine;
        mine.header_revision = batch->header_revision;
        mine.cluster_id = batch->cluster_id;
        for (const auto& e : batch->events) {
          if (Matches(m.spec, e)) mine.events.push_back(e);
        }
        if (!mine.events.empty()) out.emplace_back(m.cb, std::move(mine));
      }
    }
  }
  for (auto& [cb, b] : out) {
    if (cb && *cb) (*cb)(std::move(b));
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
        delivery = CompactedError(resp.compact_revision());
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
      if (resp.fragment()) {  // more parts of this response follow
        w.fragments.insert(w.fragments.end(), resp.events().begin(), resp.events().end());
        return;
      }
      if (resp.events_size() == 0 && w.fragments.empty()) return;  // progress notification
      WatchBatch batch;
      batch.header_revision = resp.header().revision();
      batch.cluster_id = resp.header().cluster_id();
      batch.events = std::move(w.fragments);
      w.fragments.clear();
      batch.events.insert(batch.events.end(), resp.events().begin(), resp.events().end());
      w.next_revision = batch.events.back().kv().mod_revision() + 1;
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
  {
    absl::MutexLock l(&mu_);
    reconnect_scheduled_ = false;
    if (shutting_down_ || watchers_.empty()) return;
    std::tie(stream, fresh) = EnsureStreamLocked();
    // Queued under mu_ (Send only queues): a Cancel of one of them, which takes
    // mu_ to find the stream, then sends its cancel after the create. Sent after
    // it, etcd would ignore the cancel of a watch it did not know yet, and then
    // create the watch, which would live as long as the stream.
    for (auto& [id, w] : watchers_) stream->Send(CreateRequestLocked(id, w));
  }
  if (fresh) stream->Go();
}

}  // namespace holdfast::etcd
