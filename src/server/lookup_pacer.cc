#include "server/lookup_pacer.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace holdfast::server {

struct LookupPacer::State {
  State(Options o, Schedule s, Clock c)
      : options(o), schedule(std::move(s)), clock(std::move(c)) {
    options.burst = std::max(options.burst, 1.0);
  }

  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at;  // when `tokens` was right
    std::deque<std::function<void()>> waiting;
    bool timer = false;     // a timer will drain it
    bool draining = false;  // a Drain is running its lookups (Drain)
  };

  Options options;
  const Schedule schedule;
  const Clock clock;
  mutable absl::Mutex mu;
  std::map<std::string, Bucket> buckets ABSL_GUARDED_BY(mu);
  size_t waiting ABSL_GUARDED_BY(mu) = 0;
  size_t sweep_at ABSL_GUARDED_BY(mu) = 64;
  bool stopped ABSL_GUARDED_BY(mu) = false;

  Bucket& Refilled(const std::string& identity) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const auto now = clock();
    auto [it, fresh] = buckets.try_emplace(identity);
    Bucket& b = it->second;
    if (fresh) {
      b.tokens = options.burst;
    } else {
      const double secs = std::chrono::duration<double>(now - b.at).count();
      b.tokens = std::min(options.burst, b.tokens + std::max(secs, 0.0) * options.per_second);
    }
    b.at = now;
    return b;
  }
  bool Idle(const Bucket& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return b.waiting.empty() && !b.timer && !b.draining && b.tokens >= options.burst;
  }

  // Takes the waiting lookups of `b` that have a token now; when some are left
  // and no timer is armed, arms one: returns the delay after which it should
  // look again (else zero).
  std::chrono::steady_clock::duration Take(Bucket& b, std::vector<std::function<void()>>* run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!b.waiting.empty() && b.tokens >= 1) {
      b.tokens -= 1;
      run->push_back(std::move(b.waiting.front()));
      b.waiting.pop_front();
      --waiting;
    }
    if (b.waiting.empty() || b.timer) return std::chrono::steady_clock::duration::zero();
    b.timer = true;
    const double secs = (1 - b.tokens) / options.per_second;
    return std::max<std::chrono::steady_clock::duration>(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(secs)),
        std::chrono::milliseconds(1));
  }
};

namespace {
void RunAll(std::vector<std::function<void()>>& run) {
  for (auto& fn : run) fn();
}
}  // namespace

// One drain at a time per identity, looping until nothing more can run: a lookup
// run here may give its token back at once (it answered without a read, or was
// dropped), and a drain nested in that call would run the next one a stack
// frame deeper, as deep as the queue is long. The nested call (or one on another
// thread) only finds the drain under way and leaves the token to it.
void LookupPacer::Drain(const std::shared_ptr<State>& state, const std::string& identity,
                        bool from_timer) {
  {
    absl::MutexLock l(&state->mu);
    if (state->stopped) return;
    State::Bucket& b = state->Refilled(identity);
    if (from_timer) b.timer = false;
    if (b.draining) return;
    b.draining = true;
  }
  while (true) {
    std::vector<std::function<void()>> run;
    std::chrono::steady_clock::duration again{};
    {
      absl::MutexLock l(&state->mu);
      if (state->stopped) return;  // Stop ran (or runs) every waiting lookup
      State::Bucket& b = state->Refilled(identity);
      again = state->Take(b, &run);
      if (run.empty()) {
        b.draining = false;
        if (state->Idle(b)) state->buckets.erase(identity);
      }
    }
    if (again > std::chrono::steady_clock::duration::zero()) {
      std::weak_ptr<State> weak = state;
      state->schedule(again, [weak, identity] {
        if (auto s = weak.lock()) Drain(s, identity, /*from_timer=*/true);
      });
    }
    if (run.empty()) return;
    RunAll(run);
  }
}

LookupPacer::LookupPacer(Options options, Schedule schedule, Clock clock)
    : state_(std::make_shared<State>(options, std::move(schedule), std::move(clock))) {}

LookupPacer::~LookupPacer() = default;

LookupPacer::Admission LookupPacer::Run(const std::string& identity,
                                        std::function<void()> lookup) {
  {
    absl::MutexLock l(&state_->mu);
    if (!state_->stopped && state_->options.per_second > 0) {
      if (state_->buckets.size() >= state_->sweep_at) {
        std::vector<std::string> idle;
        for (auto& [id, b] : state_->buckets) {
          if (state_->Idle(state_->Refilled(id))) idle.push_back(id);
        }
        for (const auto& id : idle) state_->buckets.erase(id);
        state_->sweep_at = 2 * state_->buckets.size() + 64;
      }
      State::Bucket& b = state_->Refilled(identity);
      if (!b.waiting.empty() || b.tokens < 1) {
        if (b.waiting.size() >= state_->options.max_waiting) return Admission::kFull;
        b.waiting.push_back(std::move(lookup));
        ++state_->waiting;
        lookup = nullptr;
      } else {
        b.tokens -= 1;
      }
    }
  }
  if (lookup) {
    lookup();
    return Admission::kRan;
  }
  Drain(state_, identity, /*from_timer=*/false);  // arms the timer when none is
  return Admission::kWaits;
}

void LookupPacer::GiveBack(const std::string& identity) {
  {
    absl::MutexLock l(&state_->mu);
    if (state_->stopped || state_->options.per_second <= 0) return;
    State::Bucket& b = state_->Refilled(identity);
    b.tokens = std::min(state_->options.burst, b.tokens + 1);
  }
  Drain(state_, identity, /*from_timer=*/false);
}

void LookupPacer::Stop() {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock l(&state_->mu);
    state_->stopped = true;
    for (auto& [id, b] : state_->buckets) {
      for (auto& fn : b.waiting) run.push_back(std::move(fn));
      b.waiting.clear();
    }
    state_->buckets.clear();
    state_->waiting = 0;
  }
  RunAll(run);
}

size_t LookupPacer::waiting() const {
  absl::MutexLock l(&state_->mu);
  return state_->waiting;
}

size_t LookupPacer::identities() const {
  absl::MutexLock l(&state_->mu);
  return state_->buckets.size();
}

}  // namespace holdfast::server
