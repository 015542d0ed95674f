#include "lock/etcd_health.h"

#include "absl/strings/str_cat.h"
#include "lock/keyspace.h"

namespace holdfast::lock {

EtcdHealth::EtcdHealth(etcd::Client* etcd, Options options,
                       std::function<void(bool, const std::string&)> on_change)
    : etcd_(etcd), options_(options), on_change_(std::move(on_change)) {}

EtcdHealth::~EtcdHealth() { Stop(); }

void EtcdHealth::Start() {
  {
    absl::MutexLock l(&mu_);
    if (!stopped_) return;
    stopped_ = false;
  }
  Probe();
}

void EtcdHealth::Stop() {
  TimerQueue::TimerId timer;
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    timer = timer_;
    timer_ = 0;
  }
  if (timer != 0) etcd_->timers().Cancel(timer);
  absl::MutexLock l(&mu_);
  while (probing_) idle_.Wait(&mu_);
}

absl::Status EtcdHealth::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

void EtcdHealth::Probe() {
  {
    absl::MutexLock l(&mu_);
    timer_ = 0;
    if (stopped_) return;
    probing_ = true;
  }
  Send(/*again=*/false);
}

void EtcdHealth::Send(bool again) {
  etcdserverpb::RangeRequest r;
  r.set_key(keyspace::EpochKey());
  r.set_count_only(true);  // linearizable (not serializable): needs a leader and quorum
  const size_t asked = etcd_->PickEndpoint().second;
  // The second ask is short, and too short to make the client check its member
  // (etcd/client.h): a quorum loss seen first through a silent member is so
  // reported at most kSilenceCheck + ~0.5 s later than through one that answers.
  const auto timeout =
      again ? std::min<std::chrono::milliseconds>(options_.probe_timeout,
                                                  etcd::Client::kSilentEndpoint) -
                  std::chrono::milliseconds(1)
            : options_.probe_timeout;
  etcd_->Range(r, etcd::DeadlineIn(timeout),
               [this, again, asked](absl::StatusOr<etcdserverpb::RangeResponse> resp) {
                 if (!resp.ok() && !again && etcd_->PickEndpoint().second != asked) {
                   // The member asked was silent and the client moved off it
                   // (etcd/client.h): ask the next one before saying etcd is
                   // unhealthy. (No quorum: the member answers its Status, the
                   // client stays, and the failure counts at once.)
                   bool stopped;
                   {
                     absl::MutexLock l(&mu_);
                     stopped = stopped_;
                   }
                   if (!stopped) return Send(/*again=*/true);
                 }
                 OnProbe(resp.status());
               });
}

void EtcdHealth::OnProbe(const absl::Status& result) {
  absl::Status now = result.ok() ? absl::OkStatus()
                                 : absl::UnavailableError(absl::StrCat(
                                       "etcd is unreachable or has no quorum (", result.message(),
                                       ")"));
  bool changed;
  {
    absl::MutexLock l(&mu_);
    changed = now.ok() != status_.ok();
    status_ = now;
    probing_ = false;
    idle_.SignalAll();
    if (!stopped_) {
      timer_ = etcd_->timers().ScheduleAfter(options_.period, [this] { Probe(); });
    }
  }
  if (changed && on_change_) on_change_(now.ok(), std::string(now.message()));
}

}  // namespace holdfast::lock
