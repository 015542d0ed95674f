#include "etcd/client.h"

#include <thread>
#include <utility>

#include "etcd/errors.h"
#include "etcd/keepalive_mux.h"
#include "etcd/watch_hub.h"

namespace holdfast::etcd {

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options,
                                                       std::shared_ptr<TimerQueue> timers) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd client: no endpoints configured");
  }
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(timers)));
}

Client::Client(ClientOptions options, std::shared_ptr<TimerQueue> timers)
    : options_(std::move(options)), timers_(std::move(timers)) {
  loop_ = options_.loop;
  if (loop_ == nullptr) {
    own_loop_ = std::make_unique<EventLoop>("etcd-client");
    loop_ = own_loop_.get();
  }
  auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  for (const auto& address : options_.endpoints) {
    grpc::ChannelArguments args;
    // Detect a dead member quickly on idle streams (watch, keepalive).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
    args.SetMaxReceiveMessageSize(options_.max_receive_bytes);
    auto e = std::make_unique<Endpoint>();
    e->address = address;
    e->channel = grpc::CreateCustomChannel(address, creds, args);
    e->kv = pb::KV::NewStub(e->channel);
    e->lease = pb::Lease::NewStub(e->channel);
    e->watch = pb::Watch::NewStub(e->channel);
    e->maintenance = pb::Maintenance::NewStub(e->channel);
    endpoints_.push_back(std::move(e));
  }
  keepalive_mux_ = std::make_unique<KeepAliveMux>(this);
  watch_hub_ = std::make_unique<WatchHub>(this);
}

Client::~Client() {
  closing_.store(true);
  while (moving_.load() > 0) std::this_thread::yield();
  // Streams first: they call back into the client. Then wait for unary calls,
  // so no callback runs after the channels are gone. The hub and the mux stay
  // (shut down) until then: a unary call's callback may still ask them for a
  // watch or a renewal (an acquire whose read comes back as holdfastd stops),
  // which they refuse.
  watch_hub_->Shutdown();
  keepalive_mux_->Shutdown();
  {
    absl::MutexLock l(&idle_mu_);
    while (calls_in_flight_.load() > 0) idle_cv_.Wait(&idle_mu_);
  }
  watch_hub_.reset();
  keepalive_mux_.reset();
  own_loop_.reset();  // nothing is left on it
}

std::pair<Client::Endpoint*, size_t> Client::PickEndpoint() {
  size_t i = current_.load() % endpoints_.size();
  return {endpoints_[i].get(), i};
}

void Client::ReportUnavailable(size_t index) {
  size_t expected = index;
  const size_t next = (index + 1) % endpoints_.size();
  if (next == index || !current_.compare_exchange_strong(expected, next)) return;
  moving_.fetch_add(1);
  if (!closing_.load()) {
    watch_hub_->MoveFrom(index);
    keepalive_mux_->MoveFrom(index);
  }
  moving_.fetch_sub(1);
}

namespace {

// One unary call on the async API: the call's state is its own completion tag.
// `finished` runs once, on the loop thread, when the call has ended.
template <class Req, class Resp>
struct UnaryCall final : EventLoop::Tag {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> rpc;  // alive until the call ends
  std::function<void()> finished;

  // `finished` may hold the last reference to this call; it is moved out first.
  void Proceed(bool) override {
    auto f = std::move(finished);
    f();
  }
  // Starts the call made by `rpc` and asks for its end on the loop.
  void Go() {
    rpc->StartCall();
    rpc->Finish(&resp, &status, this);
  }
};

}  // namespace

void Client::CheckSilent(size_t index, std::function<void()> then) {
  using Call = UnaryCall<pb::StatusRequest, pb::StatusResponse>;
  auto call = std::make_shared<Call>();
  call->ctx.set_deadline(DeadlineIn(kSilenceCheck));
  calls_in_flight_.fetch_add(1);
  call->rpc = endpoints_[index]->maintenance->PrepareAsyncStatus(&call->ctx, call->req,
                                                                  loop_->cq());
  call->finished = [this, call, index, then = std::move(then)]() mutable {
    // A member cut off from its cluster's quorum answers Status on its own, with
    // no leader (0): it serves no write, renewal or linearizable read, so it is
    // no place to stay. (With the whole cluster leaderless, the client moves from
    // member to member until one has a leader again.)
    const bool ok = call->status.ok() && call->resp.leader() != 0;
    call.reset();  // on this thread, before ~Client may drop the channels
    if (!ok) ReportUnavailable(index);
    then();
    CallDone();
  };
  call->Go();
}

void Client::RequireLeader(grpc::ClientContext* ctx) { ctx->AddMetadata("hasleader", "true"); }

void Client::ObserveHeader(const pb::ResponseHeader& h) {
  if (h.cluster_id() != 0) last_cluster_id_.store(h.cluster_id());
  int64_t seen = last_revision_.load();
  while (h.revision() > seen && !last_revision_.compare_exchange_weak(seen, h.revision())) {
  }
}

template <class Req, class Resp, class PrepareFn>
void Client::Unary(const char* method, PrepareFn prepare, Req req, Deadline d, Callback<Resp> cb,
                   bool retry_unavailable) {
  using Call = UnaryCall<Req, Resp>;
  auto [endpoint, index] = PickEndpoint();
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  call->ctx.set_deadline(d);
  calls_in_flight_.fetch_add(1);
  const auto started = std::chrono::steady_clock::now();
  // A read silent for this long names a cut-off endpoint, not a tight deadline.
  const bool silence_counts = d - std::chrono::system_clock::now() >= kSilentEndpoint;
  call->rpc = prepare(endpoint, &call->ctx, call->req, loop_->cq());
  call->finished = [this, method, started, call, index, d, cb = std::move(cb), prepare,
                    retry_unavailable, silence_counts]() mutable {
    absl::Status st = FromEtcd(call->status);
    if (options_.observer != nullptr) {
      options_.observer->OnEtcdCall(method, st, std::chrono::steady_clock::now() - started);
    }
    Req req = std::move(call->req);
    Resp resp = std::move(call->resp);
    // The context (and its channel reference) goes here, before the callback,
    // which may be what lets ~Client release the channels.
    call.reset();
    if (st.ok()) {
      ObserveHeader(resp.header());
      cb(std::move(resp));
    } else if (retry_unavailable && silence_counts && endpoints_.size() > 1 &&
               st.code() == absl::StatusCode::kDeadlineExceeded) {
      // A read that got no answer: is the member there at all? (header)
      CheckSilent(index, [cb = std::move(cb), st]() mutable { cb(st); });
    } else if (EndpointUnavailable(st) && (ReportUnavailable(index), true) &&
               retry_unavailable && endpoints_.size() > 1 &&
               std::chrono::system_clock::now() < d) {
      Unary<Req, Resp>(method, prepare, std::move(req), d, std::move(cb), false);
    } else if (ClusterWideUnavailable(st) && endpoints_.size() > 1) {
      // Every member says this during an election, and a member may say it of
      // itself: the Status check moves the client only in the second case. A
      // read is then asked once more, wherever the client is, within its deadline.
      CheckSilent(index, [this, method, prepare, req = std::move(req), d, cb = std::move(cb),
                          st, retry_unavailable]() mutable {
        if (retry_unavailable && std::chrono::system_clock::now() < d) {
          Unary<Req, Resp>(method, prepare, std::move(req), d, std::move(cb), false);
        } else {
          cb(st);
        }
      });
    } else {
      cb(st);
    }
    CallDone();
  };
  call->Go();
}

void Client::CallDone() {
  if (calls_in_flight_.fetch_sub(1) == 1) {
    absl::MutexLock l(&idle_mu_);
    idle_cv_.SignalAll();
  }
}

// Issues METHOD on the picked endpoint's STUB; RESP names the response type.
#define HF_ETCD_UNARY(STUB, METHOD, RESP, RETRY)                                \
  Unary<decltype(req), pb::RESP>(                                              \
      #METHOD,                                                                  \
      [](Endpoint* e, grpc::ClientContext* ctx, const decltype(req)& rq,        \
         grpc::CompletionQueue* cq) { return e->STUB->PrepareAsync##METHOD(ctx, rq, cq); }, \
      std::move(req), d, std::move(cb), RETRY)

void Client::Range(pb::RangeRequest req, Deadline d, Callback<pb::RangeResponse> cb) {
  HF_ETCD_UNARY(kv, Range, RangeResponse, true);
}
void Client::Put(pb::PutRequest req, Deadline d, Callback<pb::PutResponse> cb) {
  HF_ETCD_UNARY(kv, Put, PutResponse, false);
}
void Client::DeleteRange(pb::DeleteRangeRequest req, Deadline d,
                         Callback<pb::DeleteRangeResponse> cb) {
  HF_ETCD_UNARY(kv, DeleteRange, DeleteRangeResponse, false);
}
void Client::Txn(pb::TxnRequest req, Deadline d, Callback<pb::TxnResponse> cb) {
  HF_ETCD_UNARY(kv, Txn, TxnResponse, false);
}
void Client::Compact(pb::CompactionRequest req, Deadline d, Callback<pb::CompactionResponse> cb) {
  HF_ETCD_UNARY(kv, Compact, CompactionResponse, false);
}
void Client::LeaseGrant(pb::LeaseGrantRequest req, Deadline d,
                        Callback<pb::LeaseGrantResponse> cb) {
  HF_ETCD_UNARY(lease, LeaseGrant, LeaseGrantResponse, false);
}
void Client::LeaseRevoke(pb::LeaseRevokeRequest req, Deadline d,
                         Callback<pb::LeaseRevokeResponse> cb) {
  HF_ETCD_UNARY(lease, LeaseRevoke, LeaseRevokeResponse, false);
}
void Client::LeaseTimeToLive(pb::LeaseTimeToLiveRequest req, Deadline d,
                             Callback<pb::LeaseTimeToLiveResponse> cb) {
  HF_ETCD_UNARY(lease, LeaseTimeToLive, LeaseTimeToLiveResponse, true);
}
void Client::Status(Deadline d, Callback<pb::StatusResponse> cb) {
  pb::StatusRequest req;
  HF_ETCD_UNARY(maintenance, Status, StatusResponse, true);
}
#undef HF_ETCD_UNARY

void Client::KeepAlive(int64_t lease_id, Deadline d, Callback<pb::LeaseKeepAliveResponse> cb) {
  keepalive_mux_->KeepAlive(lease_id, d, std::move(cb));
}

absl::StatusOr<pb::RangeResponse> Client::RangeSync(pb::RangeRequest req, Deadline d) {
  return Await<pb::RangeResponse>([&](auto cb) { Range(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::PutResponse> Client::PutSync(pb::PutRequest req, Deadline d) {
  return Await<pb::PutResponse>([&](auto cb) { Put(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::DeleteRangeResponse> Client::DeleteRangeSync(pb::DeleteRangeRequest req,
                                                                Deadline d) {
  return Await<pb::DeleteRangeResponse>(
      [&](auto cb) { DeleteRange(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::TxnResponse> Client::TxnSync(pb::TxnRequest req, Deadline d) {
  return Await<pb::TxnResponse>([&](auto cb) { Txn(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::LeaseGrantResponse> Client::LeaseGrantSync(pb::LeaseGrantRequest req,
                                                              Deadline d) {
  return Await<pb::LeaseGrantResponse>(
      [&](auto cb) { LeaseGrant(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::LeaseRevokeResponse> Client::LeaseRevokeSync(pb::LeaseRevokeRequest req,
                                                                Deadline d) {
  return Await<pb::LeaseRevokeResponse>(
      [&](auto cb) { LeaseRevoke(std::move(req), d, std::move(cb)); });
}
absl::StatusOr<pb::StatusResponse> Client::StatusSync(Deadline d) {
  return Await<pb::StatusResponse>([&](auto cb) { Status(d, std::move(cb)); });
}

}  // namespace holdfast::etcd
