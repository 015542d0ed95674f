// Holds forced open, told to their holders (ARCHITECTURE §8). An approved
// force-release deletes a hold while its holder may still be running; this
// replica learns of it from the request's deletion and tells the holder's
// client on that session's next keepalive answers (KeepAliveResponse.ended),
// so libholdfast marks the Hold lost within one renewal interval (TTL/3)
// instead of the holder learning it only from a fenced write refused.
//
// Every replica watches /holdfast/force/ (requests are rare: the watch costs
// nothing under lock traffic), with previous values. A request deleted by its
// approval took its hold in the same commit; one that expired left the hold. So
// for each deleted request the hold key is read at the deletion's revision: if
// the hold the request named (by its grant revision) is gone by then, the
// session is told "ended" for that token (also when the holder had released it
// itself before the request expired: the client ignores a token it no longer
// holds). Any replica can serve the session's stream, so each replica keeps
// what it learned for kKeep and repeats it on every answer for that session:
// an answer lost with a broken stream is repeated on the next one.
//
// A watch that ends (compaction, etcd restarting) is started again from the
// current revision after a pause; requests deleted in between are not told
// (the holder still learns from the fence or its next release: best effort,
// never a safety mechanism). Bounded: kMaxEntries.
//
// Thread-safe. Callbacks hold only the shared state, so none outlives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "etcd/client.h"
#include "holdfast/v1/session.pb.h"

namespace holdfast::lock {

class ForcedHolds {
 public:
  static constexpr std::chrono::minutes kKeep{10};
  static constexpr size_t kMaxEntries = 10'000;
  static constexpr std::chrono::seconds kRewatchAfter{1};

  // Starts watching at once.
  explicit ForcedHolds(etcd::Client* etcd);
  // Stop() unless it has run.
  ~ForcedHolds();
  // Ends the watch; before the etcd client goes (which may be before this object).
  // Idempotent.
  void Stop();
  ForcedHolds(const ForcedHolds&) = delete;
  ForcedHolds& operator=(const ForcedHolds&) = delete;

  // The holds of `session` in `ns` that this replica learned were forced open
  // (within kKeep), oldest first; empty for nearly every call.
  std::vector<v1::EndedHold> For(const std::string& ns, int64_t session) const;

  // Records one (the watch does; public for tests of the bounds).
  void Note(const std::string& ns, int64_t session, v1::EndedHold ended);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace holdfast::lock
