// libholdfast: the C++ client of holdfast.
//
//   auto client = holdfast::Client::Connect({.endpoints = {"127.0.0.1:7420"}});
//   auto session = (*client)->OpenSession("default", {.ttl = std::chrono::seconds(10)});
//   auto hold = (*session)->Acquire("jobs/nightly", {.wait = std::chrono::seconds(30)});
//   if (hold.ok()) {
//     Write(resource, hold->token());        // pass the fencing token along
//     if (hold->lost()) { /* stop at once */ }
//   }                                        // released when `hold` goes away
//
// Thread-safety: Client and Session are thread-safe. A Hold is thread-compatible
// (one owner), but its lost()/lost_token() may be read from any thread.
//
// Liveness: a Client runs one keepalive stream and two threads for all of its
// sessions, and a third for their on_lost callbacks. Each session is renewed every ttl/3. The library keeps a local
// deadline per session: the send time of the last renewal etcd confirmed, plus the
// TTL etcd reported, minus a safety margin for clock drift (ARCHITECTURE §5).
//   - The server reports the lease gone: the session and all its holds are lost.
//   - The server reports etcd unreachable, or the local deadline passes: holds of
//     classes with on_quorum_loss = closed (the default) are lost at once; holds
//     of open classes stay usable but unprotected() until a renewal is confirmed.
//     Past the deadline with no open hold left, the session counts as lost.
//   - Two admins force-released a hold: that hold alone is lost, with
//     FAILED_PRECONDITION and the request's reason, on the first renewal answer
//     after the approval (within ttl/3 or so). Best effort: the fencing token is
//     what stops a write; this tells the holder to stop working.
// Lost is final: the hold's stop token is stopped at once (on the keepalive
// thread that saw the loss), and on_lost runs on the Client's callback thread:
// one at a time, in order, never under a lock of libholdfast. A callback may
// block (take the lock again, say): that delays only the callbacks after it, not
// the renewals and deadline checks of the Client's other sessions. The callbacks
// of sessions left when their Client is destroyed, and any still queued, have
// run when ~Client returns (a callback may destroy the Client: then those run
// after it returns). Session::Close (and ~Session) returns only once no on_lost
// call of the session is running, and none starts after, so on_lost may use what
// its owner frees after closing; on_lost itself may call Close, of its own
// session or another (it does not wait for the on_lost call it is made from).
// From inside any on_lost, a CloseSession, and a Release (a Hold released or
// dropped there), is asked for at most 1 s in all, retries included, without
// waiting for a connection, so that the other sessions' callbacks are not held
// up by a holdfastd that does not answer; an unanswered close leaves the lease to
// expire, or to a Close called again from another thread, and an unanswered
// release leaves the hold to its session. So do not close a session while holding a lock its on_lost takes. Closing a session
// ends its holds: each Hold then says lost ("was closed"), also one whose
// Acquire answered after the Close. Sessions are renewed only while their Client exists: destroy
// Sessions and Holds before their Client; those left count as lost when it goes.
#pragma once

#include <chrono>
#include <optional>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/v1/admin.pb.h"
#include "holdfast/v1/lock.pb.h"

namespace holdfast {

namespace internal {
class ClientCore;
class HoldState;
class SessionState;
}  // namespace internal

// The order in which a Client tries its endpoints (ClientOptions).
enum class EndpointOrder {
  // A random order, drawn once per Client: clients given the same list spread
  // over the replicas, and the clients of a replica that fails spread over the
  // others instead of all moving to the next one listed (each new connection
  // costs the replica that takes it a TLS handshake on its one event loop:
  // docs/operations.md, "Sizing").
  kShuffled,
  // As listed: the first that answers (a preferred replica first).
  kAsListed,
};

struct ClientOptions {
  // holdfastd endpoints (host:port: host names or addresses), one channel each.
  // Calls go to the first that answers, in `endpoint_order`; a Client stays on it
  // while it answers. One that refuses its connection is passed over at once, one
  // that does not answer it within a second is passed over then (docs/cli.md,
  // "Endpoints").
  std::vector<std::string> endpoints = {"127.0.0.1:7420"};
  EndpointOrder endpoint_order = EndpointOrder::kShuffled;
  // Deadline of calls that do not wait for a lock. While no holdfastd is
  // reachable, a call waits for one up to this deadline (then DEADLINE_EXCEEDED)
  // instead of failing at once, so a holdfastd restart is invisible to callers.
  std::chrono::milliseconds rpc_timeout{10'000};
  // mTLS, which holdfastd requires unless it runs --insecure on loopback: PEM
  // files of the CA bundle that signed the server, and this client's SVID and
  // key (whose SPIFFE ID is the caller's identity). Re-read when they change, so
  // rotated SVIDs are picked up. Empty ca_file: plaintext, which Connect refuses
  // for an endpoint that is not a loopback address (127.0.0.0/8, ::1, localhost)
  // unless `allow_plaintext`: holdfastd serves plaintext only on loopback, so
  // anything answering plaintext elsewhere is not it, and could grant locks that
  // are not held.
  std::string ca_file, cert_file, key_file;
  // Told when the mTLS files change (they are read every 2 s; gRPC is given
  // copies that only a whole set replaces, common/tls_files.h): OK once a
  // changed set is used for new connections; INVALID_ARGUMENT with the reason
  // when a changed set cannot be used ("cert_file and key_file do not belong
  // together: ...", a chain cut off, a file gone), and the previous set goes on
  // being used until the files are fixed. A set seen half written once (a
  // rotation between its writes) is waited out, not told. Files not there at
  // Connect are told once the same way (no connection succeeds until they are
  // there; OK is told when they are). Called on libholdfast's file-checking
  // thread, once per change: must not throw or call the Client, and should be
  // quick.
  std::function<void(const absl::Status&)> on_tls_files;
  bool allow_plaintext = false;
  // Name the server certificate must carry (default: the endpoint's host).
  std::string server_name;
};

struct SessionOptions {
  // Session TTL: how long holds outlive the last renewal. Rounded up to whole
  // seconds; holdfastd's sessions.ttl_min (at least 1s) and ttl_max bound it
  // (INVALID_ARGUMENT from holdfastd, naming its bounds).
  std::chrono::milliseconds ttl{10'000};
  // Fraction of the TTL kept as a margin for clock drift (local deadline): 0 to
  // 0.5; anything else is refused by OpenSession (INVALID_ARGUMENT).
  double safety_margin = 0.1;
  // Called when the session, or any hold on it, is lost, with the reason (check
  // Hold::lost() to see which), on the Client's callback thread (see the top of
  // this file). Must not throw: it runs on libholdfast's thread, where an
  // exception ends the process.
  std::function<void(const absl::Status&)> on_lost;
};

struct AcquireOptions {
  // How long to wait for the lock; 0 tries once.
  std::chrono::milliseconds wait{0};
  // Ask for a shared hold (classes of mode S).
  bool shared = false;
  // Opaque bytes shown to operators by `holdfast holders` (at most 1 KiB).
  std::string holder_meta;
};

class Session;

// A granted lock. Releases itself when destroyed, or when assigned over; a
// release that fails there (holdfastd or etcd unreachable) is asked again by the
// Client's keepalive thread, without blocking it, 1 s later, then each pause
// twice the last up to 30 s, until done, no longer current, refused (see
// Release), or the session ends. Once it is done, every handle of the hold says
// lost() ("was released").
class Hold {
 public:
  Hold(Hold&&) noexcept;
  Hold& operator=(Hold&&) noexcept;
  ~Hold();

  // epoch << 48 | grant revision: pass it to every resource the lock protects.
  int64_t token() const { return info_.token(); }
  const std::string& key() const { return info_.lock_key(); }
  const v1::HoldInfo& info() const { return info_; }

  // True once the hold is lost: stop using the resource at once. Final.
  bool lost() const;
  absl::Status lost_reason() const;
  std::stop_token lost_token() const;
  // Holds of classes with on_quorum_loss = open only: etcd cannot confirm the
  // session right now; the hold is still usable, at the class owner's risk, and
  // becomes protected again when a renewal is confirmed (or lost, if the lease
  // expired meanwhile).
  bool unprotected() const;

  // Releases the hold. FAILED_PRECONDITION if it is no longer current (then, as
  // after OK, Release() answers OK and the hold is done with). Races
  // with the queue, lost connections and streams reset under the call (INTERNAL
  // or UNKNOWN, as a proxy may send), a replica that went silent and one that says
  // it is stopping (then on the next endpoint at once) are retried a few times, all within one
  // rpc timeout from the call (also when no holdfastd answers); after such an
  // unknown outcome, "not current" means the release went through. If it still
  // fails transiently (ABORTED, UNAVAILABLE, INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, or
  // RESOURCE_EXHAUSTED over the op_rate_quota: see RetryAfter), Release() may be
  // called again, and a hold whose release failed so is released by the
  // Client's keepalive thread once the Hold is destroyed or assigned over (see
  // the class comment). A refusal (PERMISSION_DENIED: the identity the client now
  // presents may not use the namespace; INVALID_ARGUMENT, UNIMPLEMENTED) leaves
  // the hold held: Release() answers it again, never OK, and once the Hold is
  // dropped the keepalive thread asks once more, then leaves the hold to its
  // session's end.
  // Once released (or not current), every handle of the hold says
  // lost() ("was released"), also one an Acquire returned after this handle was
  // lost locally.
  absl::Status Release();

 private:
  friend class Session;
  Hold(std::shared_ptr<internal::SessionState> session,
       std::shared_ptr<internal::HoldState> state, v1::HoldInfo info)
      : session_(std::move(session)), state_(std::move(state)), info_(std::move(info)) {}
  // Release(), all within `bound` (nullopt: the rpc timeout from now).
  absl::Status ReleaseBy(std::optional<std::chrono::system_clock::time_point> bound);
  // Leaves a release not done yet to the keepalive pump (OweRelease), at once:
  // the destructor then asks nothing itself.
  void LeaveReleaseToPump();
  std::shared_ptr<internal::SessionState> session_;  // null once released
  std::shared_ptr<internal::HoldState> state_;
  v1::HoldInfo info_;
};

class Session {
 public:
  // Closes the session (ignoring errors) if it was not closed already. A Close()
  // that failed is not sent again here: that session ends with its TTL.
  ~Session();
  // One handle per session (OpenSession's unique_ptr): a copy would close it
  // when either went.
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t id() const;
  const std::string& ns() const;

  // Acquires `lock_key`. Blocks up to options.wait plus the rpc timeout, counted
  // from the call: a retry after a lost connection to holdfastd (UNAVAILABLE), a
  // stream reset under the call (INTERNAL, UNKNOWN), a replica that went silent
  // and was passed over, or one that said it is stopping (docs/cli.md,
  // "Endpoints": then at once on the next endpoint) asks again within that same
  // bound (the call is idempotent per session and key: a grant already made is
  // returned again, a queued waiter is taken over in place and keeps its place).
  // A hold never changes mode: asking for a key this session holds in the other
  // mode (exclusive while it holds it shared, or the other way round) is refused
  // with FAILED_PRECONDITION; release it first.
  // Errors as the Lock.Acquire RPC: ABORTED (held, try), DEADLINE_EXCEEDED (not
  // granted in time), INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
  // UNAVAILABLE; FAILED_PRECONDITION too when this session is already lost.
  // After UNAVAILABLE, INTERNAL, UNKNOWN, CANCELLED or a DEADLINE_EXCEEDED that is
  // not holdfastd's "was not granted within" (no holdfastd could be reached to ask
  // again in time, the answer was lost), the grant may have been made: the
  // session would then hold the key with no Hold to release it, for as long as
  // it lives. So the Client's keepalive thread asks holdfastd (Lock.Describe)
  // 3 s later, past the 2 s a cancelled waiter keeps its place, and releases a
  // hold of this session's on the key that it finds (asking again, 1 s doubling
  // to 30 s, while holdfastd cannot be reached or the session's waiter is still
  // queued, or while another Acquire of the key is out). An Acquire of the key
  // answered with a Hold meanwhile ends the lookup: that Hold is the session's
  // hold of the key. A hold released so that an Acquire sent before was
  // answered with is treated as lost here: released (not current) and asked
  // for anew within that Acquire's bounds.
  absl::StatusOr<Hold> Acquire(const std::string& lock_key, const AcquireOptions& options = {});

  // Ends the session: every hold on it is released by etcd. Renewals stop, and
  // its Holds say lost, at once, whatever the answer. CloseSession is idempotent,
  // so a lost connection or a stream reset under the call (UNAVAILABLE, INTERNAL,
  // UNKNOWN), a replica that went silent and one that says it is stopping (then on
  // the next endpoint at once) are asked again, like a Release, all within the
  // rpc timeout from the call (waiting for a connection to holdfastd included).
  // If it still fails (those codes, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED over the
  // op_rate_quota: see RetryAfter, or a refusal), Close may be called again and
  // sends CloseSession again; once one was answered OK, Close returns OK at once.
  // A session holdfastd never hears closed ends when its TTL runs out, and its
  // holds with it.
  absl::Status Close();
  // The same, all within `timeout` (capped at the rpc timeout): for a caller on
  // its way out that must not wait for a holdfastd gone away.
  absl::Status Close(std::chrono::milliseconds timeout);

  bool lost() const;
  // OK while not lost.
  absl::Status lost_reason() const;
  std::stop_token lost_token() const;
  // Local deadline: when the session counts as lost unless a renewal confirms.
  std::chrono::steady_clock::time_point deadline() const;
  // Renewals etcd has confirmed so far.
  int64_t renewals() const;

 private:
  friend class Client;
  explicit Session(std::shared_ptr<internal::SessionState> state) : state_(std::move(state)) {}
  // Acquire() with its bounds fixed by the first call: every attempt ends by
  // `call_deadline`, and the wait (`wait_ms` asked of holdfastd) ends at `wait_until`.
  absl::StatusOr<Hold> AcquireBy(const std::string& lock_key, const AcquireOptions& options,
                                 int64_t wait_ms,
                                 std::chrono::system_clock::time_point call_deadline,
                                 std::chrono::steady_clock::time_point wait_until);
  // `send_again`: a session closed already whose CloseSession failed sends it again.
  absl::Status CloseWithin(std::optional<std::chrono::milliseconds> timeout, bool send_again);
  std::shared_ptr<internal::SessionState> state_;
};

// When a call was refused with RESOURCE_EXHAUSTED because its namespace is over
// its op_rate_quota, how long to wait before asking again (the server's
// `retry-after-ms` hint); nullopt for any other status. libholdfast does not retry
// such calls itself: the caller decides whether to wait or to give up.
std::optional<std::chrono::milliseconds> RetryAfter(const absl::Status& s);

// Whether a call failed for want of a connection to holdfastd: it ended
// (UNAVAILABLE, or DEADLINE_EXCEEDED after waiting for a connection up to
// ClientOptions::rpc_timeout) while the client had no connection to any endpoint,
// because none answered, its TLS handshake failed, or the connection was lost
// during the call. The status's message then begins "no connection to holdfastd at
// ...". False for everything holdfastd itself answered, UNAVAILABLE included (etcd
// unreachable from holdfastd, say). The outcome of a write that was under way when
// the connection was lost is unknown, as with any failed write. The label comes
// from the channel's state when the call ended: a holdfastd that answered and then
// went away, or a connection another call made in between, can tip it either way.
bool Unreachable(const absl::Status& s);

class Client {
 public:
  // Creates the channels; does not wait for a connection. INVALID_ARGUMENT for no
  // endpoint, or one that is empty or has spaces, commas or control characters in
  // it; an rpc_timeout outside (0, 24h]; plaintext to an endpoint off loopback (see ca_file); cert_file without
  // key_file or either without ca_file; an mTLS file that is there but is not
  // what it is named for ("key_file PATH holds no PEM private key ...", a
  // directory, unreadable); and files that are all there but cannot be used
  // together ("cert_file and key_file do not belong together: ...", a chain or
  // a CA bundle cut off; read again half a second later before that is said, in
  // case a rotation is caught between its writes). A file not there yet is not
  // an error: it is read once it appears (an SVID agent that writes it after the
  // process starts), and calls fail as unreachable until then. INTERNAL when the
  // checked copies of the files cannot be made (memfd) or read (/proc).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();
  // One per Connect (its unique_ptr): the first copy destroyed would stop the
  // renewals of every session of the others.
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const std::string& ns,
                                                       const SessionOptions& options = {});

  // Describe and CheckToken check the namespace name and the key, as Acquire
  // does, before sending (INVALID_ARGUMENT).
  absl::StatusOr<v1::DescribeResponse> Describe(const std::string& ns, const std::string& key);
  absl::StatusOr<v1::CheckTokenResponse> CheckToken(const std::string& ns,
                                                    const std::string& key, int64_t token);

  // Admin API (namespaces, classes, epoch).
  absl::StatusOr<v1::Namespace> CreateNamespace(const v1::CreateNamespaceRequest& req);
  absl::StatusOr<v1::Namespace> GetNamespace(const std::string& name);
  // Every namespace (ListClasses: every class of `ns`), asked for a page at a
  // time (admin.proto); a list made of several pages is not one snapshot.
  absl::StatusOr<std::vector<v1::Namespace>> ListNamespaces();
  absl::StatusOr<v1::Namespace> UpdateNamespace(const v1::UpdateNamespaceRequest& req);
  absl::Status DeleteNamespace(const std::string& name);
  absl::StatusOr<v1::LockClass> CreateClass(const v1::LockClass& cls);
  absl::StatusOr<v1::LockClass> GetClass(const std::string& ns, const std::string& class_id);
  absl::StatusOr<std::vector<v1::LockClass>> ListClasses(const std::string& ns);
  absl::Status DeleteClass(const std::string& ns, const std::string& class_id);
  // The control cluster's epoch (or `cluster`'s, by its name in the config).
  absl::StatusOr<v1::Epoch> GetEpoch(const std::string& cluster = "");
  absl::StatusOr<v1::Epoch> AdvanceEpoch(const v1::AdvanceEpochRequest& req);
  // Moves a namespace to another etcd cluster; blocks until it is done (its
  // deadline is the rpc timeout plus req.deadline_ms, or 60 s when unset).
  absl::StatusOr<v1::RehomeNamespaceResponse> RehomeNamespace(
      const v1::RehomeNamespaceRequest& req);

  // --- Audit and force-release (admin) ---
  absl::StatusOr<v1::QueryAuditResponse> QueryAudit(const v1::QueryAuditRequest& req);
  absl::StatusOr<v1::AuditStatus> GetAuditStatus(const v1::GetAuditStatusRequest& req = {});
  absl::StatusOr<v1::ForceRequest> RequestForceRelease(const v1::RequestForceReleaseRequest& req);
  absl::StatusOr<v1::ApproveForceReleaseResponse> ApproveForceRelease(
      const v1::ApproveForceReleaseRequest& req);
  absl::StatusOr<v1::ListForceRequestsResponse> ListForceRequests();

 private:
  explicit Client(std::shared_ptr<internal::ClientCore> core) : core_(std::move(core)) {}
  std::shared_ptr<internal::ClientCore> core_;
};

}  // namespace holdfast
