// A chaos client: one process with libholdfast that contends on a few lock keys and
// writes to the fenced register with its token while it believes it holds.
//
//   hf_chaos_client --id c3.0 --endpoints H1,H2 --register PORT --history FILE
//                   --keys x/0:s,x/1,adv/0 --seed N --ttl-ms 2000 [--run-ms 600000]
//
// A key with ":s" may be acquired shared. Each round: acquire a random key (try
// once, or wait up to 3 s), hold it for a random time writing every ~100 ms (each
// write is prepared first, then sent: a pause between the check of lost() and the
// write is the classic stale write), then release; sometimes close the session
// instead, sometimes exit at once while holding (the driver starts a successor).
// Everything it does is recorded in FILE (history.h). Exits 0 after --run-ms.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "history.h"
#include "holdfast/client.h"

namespace holdfast::chaos {
namespace {

using std::chrono::milliseconds;

struct Flags {
  std::string id;
  std::vector<std::string> endpoints;
  int register_port = 0;
  std::string history;
  std::vector<std::pair<std::string, bool>> keys;  // key, may be shared
  uint64_t seed = 1;
  int64_t ttl_ms = 2000;
  int64_t run_ms = 600'000;
};

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    if (name == "--id") {
      f.id = value;
    } else if (name == "--endpoints") {
      f.endpoints = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (name == "--register") {
      if (!absl::SimpleAtoi(value, &f.register_port)) return false;
    } else if (name == "--history") {
      f.history = value;
    } else if (name == "--keys") {
      for (absl::string_view k : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        const bool shared = absl::EndsWith(k, ":s");
        f.keys.emplace_back(std::string(shared ? k.substr(0, k.size() - 2) : k), shared);
      }
    } else if (name == "--seed") {
      if (!absl::SimpleAtoi(value, &f.seed)) return false;
    } else if (name == "--ttl-ms") {
      if (!absl::SimpleAtoi(value, &f.ttl_ms)) return false;
    } else if (name == "--run-ms") {
      if (!absl::SimpleAtoi(value, &f.run_ms)) return false;
    } else {
      return false;
    }
  }
  return !f.id.empty() && !f.endpoints.empty() && f.register_port > 0 && !f.history.empty() &&
         !f.keys.empty();
}

// A connection to the fenced register. Thread-compatible.
class RegisterConnection {
 public:
  explicit RegisterConnection(int port) : port_(port) {}
  ~RegisterConnection() { Close(); }

  // "OK", "STALE ...", or "ERR ..." (also when the register cannot be reached).
  std::string Write(const std::string& writer, const std::string& key, int64_t token,
                    bool shared, const std::string& value) {
    if (fd_ < 0 && !Connect()) return "ERR register unreachable";
    const std::string line =
        absl::StrCat("W ", writer, " ", key, " ", token, " ", shared ? "s" : "x", " ", value, "\n");
    if (send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
      Close();
      return "ERR send failed";
    }
    std::string answer;
    char c;
    for (int i = 0; i < 4096; ++i) {  // bounded: answers are short
      ssize_t n = read(fd_, &c, 1);
      if (n <= 0) {
        Close();
        return "ERR no answer";
      }
      if (c == '\n') return answer;
      answer.push_back(c);
    }
    Close();
    return "ERR answer too long";
  }

 private:
  bool Connect() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Close();
      return false;
    }
    return true;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  const int port_;
  int fd_ = -1;
};

// The client's main loop. Thread-compatible: run by main(); only the on_lost
// callback (keepalive thread) touches the thread-safe HistoryWriter besides it.
class ChaosClient {
 public:
  ChaosClient(Flags flags, std::unique_ptr<HistoryWriter> history)
      : f_(std::move(flags)), history_(std::move(history)), rng_(f_.seed), reg_(f_.register_port) {}

  int Run() {
    ClientOptions co;
    co.endpoints = f_.endpoints;
    co.endpoint_order = EndpointOrder::kAsListed;  // the driver chose which replica each prefers
    co.rpc_timeout = milliseconds(3000);
    auto client = Client::Connect(co);
    if (!client.ok()) {
      std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
      return 3;
    }
    const auto end = std::chrono::steady_clock::now() + milliseconds(f_.run_ms);
    std::unique_ptr<Session> session;
    for (int round = 0; round < 1'000'000 && std::chrono::steady_clock::now() < end; ++round) {
      if (session == nullptr || session->lost()) {
        session.reset();
        session = OpenSession(**client);
        if (session == nullptr) {
          std::this_thread::sleep_for(milliseconds(200));
          continue;
        }
      }
      if (!Round(*session)) session.reset();
      std::this_thread::sleep_for(milliseconds(Uniform(0, 300)));
    }
    session.reset();
    return 0;
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  Event NewEvent(const char* type) {
    Event e;
    e.type = type;
    return e;
  }

  std::unique_ptr<Session> OpenSession(Client& client) {
    SessionOptions so;
    so.ttl = milliseconds(f_.ttl_ms);
    HistoryWriter* h = history_.get();
    // Runs on the library's keepalive thread; HistoryWriter is thread-safe.
    so.on_lost = [h](const absl::Status& why) {
      Event e;
      e.type = "lost_notice";
      e.detail = std::string(why.message());
      h->Record(std::move(e));
    };
    auto s = client.OpenSession("default", so);
    if (!s.ok()) return nullptr;
    Event e = NewEvent("session_open");
    e.session = (*s)->id();
    history_->Record(std::move(e));
    return *std::move(s);
  }

  // One acquire/hold/release round. Returns false when the session was closed.
  bool Round(Session& session) {
    const auto& [key, may_share] = f_.keys[Uniform(0, f_.keys.size() - 1)];
    AcquireOptions ao;
    ao.shared = may_share && Uniform(0, 9) < 4;
    ao.wait = milliseconds(Uniform(0, 4) == 0 ? 0 : Uniform(200, 3000));
    const int64_t op = ++op_;
    Event inv = NewEvent("acquire_invoke");
    inv.op = op;
    inv.session = session.id();
    inv.key = key;
    inv.shared = ao.shared;
    inv.wait_ms = ao.wait.count();
    inv.unix_ms = UnixMillis();
    history_->Record(inv);
    auto hold = session.Acquire(key, ao);
    if (!hold.ok()) {
      Event e = NewEvent("acquire_fail");
      e.op = op;
      e.session = session.id();
      e.key = key;
      e.detail = absl::StatusCodeToString(hold.status().code());
      history_->Record(std::move(e));
      return true;
    }
    Event ok = NewEvent("acquire_ok");
    ok.op = op;
    ok.session = session.id();
    ok.key = key;
    ok.shared = ao.shared;
    ok.token = hold->token();
    ok.granted_unix_ms = hold->info().granted_at_unix_ms();
    history_->Record(std::move(ok));

    const auto until = std::chrono::steady_clock::now() + milliseconds(Uniform(300, 2500));
    bool fenced_off = false;
    for (int i = 0; i < 1000 && std::chrono::steady_clock::now() < until; ++i) {
      if (hold->lost()) break;
      // Prepare the write (a pause here is the GC pause the fence exists for),
      // then send it without looking at lost() again.
      std::this_thread::sleep_for(milliseconds(Uniform(50, 150)));
      const std::string answer =
          reg_.Write(f_.id, key, hold->token(), ao.shared, absl::StrCat(f_.id, "#", i));
      if (absl::StartsWith(answer, "STALE")) {
        fenced_off = true;  // superseded: stop, do not retry
        break;
      }
    }
    if (hold->lost()) {
      Event e = NewEvent("lost");
      e.session = session.id();
      e.key = key;
      e.token = hold->token();
      e.session_lost = session.lost();
      e.detail = std::string(hold->lost_reason().message());
      history_->Record(std::move(e));
      return true;
    }
    const int64_t ending = fenced_off ? 0 : Uniform(0, 99);
    if (ending < 4) {
      std::_Exit(9);  // dies holding the lock; its lease ends it
    }
    if (ending < 10) {
      Event e = NewEvent("session_close");
      e.session = session.id();
      history_->Record(std::move(e));
      (void)session.Close();
      return false;
    }
    Event rel = NewEvent("release_invoke");
    rel.op = ++op_;
    rel.session = session.id();
    rel.key = key;
    rel.token = hold->token();
    history_->Record(rel);
    absl::Status s = hold->Release();
    rel.type = s.ok() ? "release_ok" : "release_fail";
    rel.ts = 0;
    rel.detail = s.ok() ? "" : absl::StatusCodeToString(s.code());
    history_->Record(rel);
    return true;
  }

  const Flags f_;
  std::unique_ptr<HistoryWriter> history_;
  std::mt19937_64 rng_;
  RegisterConnection reg_;
  int64_t op_ = 0;
};

}  // namespace
}  // namespace holdfast::chaos

int main(int argc, char** argv) {
  holdfast::chaos::Flags flags;
  if (!holdfast::chaos::ParseFlags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: %s --id ID --endpoints H:P[,H:P] --register PORT --history FILE "
                 "--keys K[:s],... [--seed N] [--ttl-ms MS] [--run-ms MS]\n",
                 argv[0]);
    return 2;
  }
  auto history = holdfast::chaos::HistoryWriter::Open(flags.history, flags.id);
  if (!history.ok()) {
    std::fprintf(stderr, "%s\n", history.status().ToString().c_str());
    return 2;
  }
  holdfast::chaos::ChaosClient client(flags, *std::move(history));
  return client.Run();
}
