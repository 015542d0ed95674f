// holdfast-chaos: the Jepsen-style safety suite (issue 8, docs/safety.md).
//
//   holdfast-chaos [--seed S] [--duration SECONDS] [--clients N] [--keys K]
//                  [--short] [--no-fence] [--expect-violations] [--nemesis KIND,...]
//                  [--ttl-ms MS] [--out DIR] [--keep] [--no-pre-vote]
//   holdfast-chaos --check HISTORY.jsonl
//
// Starts a 3-member etcd cluster (each member in its own network namespace where
// the machine allows it, so that a partition can cut one off; else on loopback)
// and 2 holdfastd replicas (replica 1 reaches etcd through TCP proxies that can cut
// it off: another partition; chaos_cluster.h), a fenced register, and N chaos
// clients (hf_chaos_client); runs a seeded nemesis schedule for the duration;
// merges the history of every process into DIR/history.jsonl; then, before the
// cluster goes, waits until every session has ended and the
// auditor has caught up with etcd and reads the audit store and etcd's own history
// of hold keys into DIR/audit.jsonl; checks both (checker.h) and prints the
// counters, the measured timings and, last,
//   chaos: seed=S ops=N grants=G faults=F stale_writes_rejected=R violations=V
// Exits 1 when V > 0 (the seed and the kept history are printed), 2 when the run
// could not be set up. --no-fence makes the register admit every write (a control
// run: with --expect-violations it exits 0 only when V > 0). --no-pre-vote runs the
// members without --pre-vote (etcd 3.4's default), to compare. --check only checks a
// recorded history (and the audit.jsonl beside it, if there is one).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "audit/store.h"
#include "chaos_cluster.h"
#include "checker.h"
#include "common/timer_queue.h"
#include "dev/subprocess.h"
#include "etcd/client.h"
#include "etcd/watch_hub.h"
#include "fenced_register.h"
#include "history.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"

namespace holdfast::chaos {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

const std::vector<std::string> kFaultKinds = {
    "client_pause",      "client_kill",         "holdfastd_kill",     "holdfastd_pause",
    "etcd_leader_pause", "etcd_majority_pause", "holdfastd_partition",
    "etcd_member_partition", "force_release", "holdfastd_restart"};
// Relative weights, in kFaultKinds order.
const std::vector<int> kFaultWeights = {3, 2, 1, 1, 1, 1, 1, 1, 1, 1};

struct Flags {
  uint64_t seed = 0;
  bool seed_given = false;
  int duration_s = 300;
  int clients = 8;
  int keys = 3;
  bool short_mode = false;
  bool no_fence = false;
  bool no_pre_vote = false;
  bool expect_violations = false;
  std::vector<std::string> nemesis = kFaultKinds;
  int64_t ttl_ms = 2000;
  std::string out;
  bool keep = false;
  std::string check;
};

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--seed S] [--duration SECONDS] [--clients N] [--keys K] [--short]\n"
               "          [--no-fence] [--expect-violations] [--nemesis KIND,...] [--ttl-ms MS]\n"
               "          [--out DIR] [--keep] [--no-pre-vote]\n"
               "       %s --check HISTORY.jsonl\n"
               "fault kinds: %s\n",
               argv0, argv0, absl::StrJoin(kFaultKinds, ",").c_str());
}

bool ParseFlags(int argc, char** argv, Flags& f) {
  bool duration_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    auto number = [&](auto& out) {
      auto v = value();
      return v.has_value() && absl::SimpleAtoi(*v, &out);
    };
    if (name == "--short") {
      f.short_mode = true;
    } else if (name == "--no-fence") {
      f.no_fence = true;
    } else if (name == "--no-pre-vote") {
      f.no_pre_vote = true;
    } else if (name == "--expect-violations") {
      f.expect_violations = true;
    } else if (name == "--keep") {
      f.keep = true;
    } else if (name == "--seed") {
      if (!number(f.seed)) return false;
      f.seed_given = true;
    } else if (name == "--duration") {
      if (!number(f.duration_s) || f.duration_s < 5) return false;
      duration_given = true;
    } else if (name == "--clients") {
      if (!number(f.clients) || f.clients < 1 || f.clients > 64) return false;
    } else if (name == "--keys") {
      if (!number(f.keys) || f.keys < 1 || f.keys > 64) return false;
    } else if (name == "--ttl-ms") {
      if (!number(f.ttl_ms) || f.ttl_ms < 1000) return false;
    } else if (name == "--nemesis") {
      auto v = value();
      if (!v) return false;
      f.nemesis = absl::StrSplit(*v, ',', absl::SkipEmpty());
      for (const std::string& k : f.nemesis) {
        if (std::find(kFaultKinds.begin(), kFaultKinds.end(), k) == kFaultKinds.end() &&
            k != "none") {
          return false;
        }
      }
    } else if (name == "--out") {
      auto v = value();
      if (!v) return false;
      f.out = *v;
    } else if (name == "--check") {
      auto v = value();
      if (!v) return false;
      f.check = *v;
    } else {
      return false;
    }
  }
  if (f.short_mode && !duration_given) f.duration_s = 60;
  return true;
}

std::string Summary(const std::string& seed, const CheckReport& r) {
  return absl::StrCat("chaos: seed=", seed, " ops=", r.ops, " grants=", r.grants,
                      " faults=", r.faults, " stale_writes_rejected=", r.stale_writes_rejected,
                      " violations=", r.violations.size());
}

int CheckOnly(const std::string& path) {
  auto events = ReadHistories({path});
  if (!events.ok()) {
    std::fprintf(stderr, "chaos: %s\n", events.status().ToString().c_str());
    return 2;
  }
  std::string seed = "-";
  for (const Event& e : *events) {
    if (e.type == "run") seed = e.target;
  }
  CheckReport r = CheckHistory(*events);
  // The audit the run captured, if it kept one beside the history.
  const std::string audit_path =
      (std::filesystem::path(path).parent_path() / "audit.jsonl").string();
  if (std::filesystem::exists(audit_path)) {
    auto audit = ReadAuditCapture(audit_path);
    if (!audit.ok()) {
      std::fprintf(stderr, "chaos: %s\n", audit.status().ToString().c_str());
      return 2;
    }
    CheckAudit(*events, *audit, r);
  } else {
    CheckAudit(*events, AuditCapture{}, r);
  }
  std::printf("%s%s\n", r.Describe().c_str(), Summary(seed, r).c_str());
  return r.violations.empty() ? 0 : 1;
}

// One run of the suite. Thread-compatible (one thread drives it).
class ChaosRun {
 public:
  explicit ChaosRun(Flags flags) : f_(std::move(flags)), rng_(f_.seed) {}

  ~ChaosRun() {
    // Nothing may stay stopped: SIGCONT whatever a fault left paused, then the
    // Subprocess and ChaosCluster destructors kill every process.
    ResumeAll();
    clients_.clear();
    if (register_ != nullptr) register_->Stop();
  }

  int Run() {
    if (f_.out.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      f_.out = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/holdfast-chaos-", f_.seed,
                            "-", getpid());
    }
    std::error_code ec;
    std::filesystem::create_directories(f_.out, ec);
    if (ec) return SetupError(absl::InternalError(absl::StrCat("mkdir ", f_.out)));
    auto history = HistoryWriter::Open(f_.out + "/driver.jsonl", "nemesis");
    if (!history.ok()) return SetupError(history.status());
    history_ = *std::move(history);
    Event run;
    run.type = "run";
    run.kind = f_.no_fence ? "no-fence" : "fenced";
    run.target = absl::StrCat(f_.seed);
    history_->Record(run);

    std::printf("chaos: seed=%llu duration=%ds clients=%d keys=%d ttl=%lldms%s, out %s\n",
                static_cast<unsigned long long>(f_.seed), f_.duration_s, f_.clients, f_.keys,
                static_cast<long long>(f_.ttl_ms), f_.no_fence ? " NO FENCE (control)" : "",
                f_.out.c_str());
    std::fflush(stdout);
    if (absl::Status s = Setup(); !s.ok()) return SetupError(s);
    const auto started = Clock::now();
    Workload();
    std::printf("chaos: workload done after %llds, %d faults; checking\n",
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - started)
                        .count()),
                faults_);
    std::fflush(stdout);
    Teardown();
    CaptureAudit();
    return Check();
  }

 private:
  struct Slot {
    int index = 0;
    int incarnation = -1;
    std::string id;
    std::unique_ptr<dev::Subprocess> process;
    bool paused = false;
    Clock::time_point spawned_at;
  };

  int SetupError(const absl::Status& s) {
    std::fprintf(stderr, "chaos: setup failed (seed %llu): %s\n",
                 static_cast<unsigned long long>(f_.seed), s.ToString().c_str());
    return 2;
  }

  int Error(const absl::Status& s) {
    std::fprintf(stderr, "chaos: run failed (seed %llu, files kept in %s): %s\n",
                 static_cast<unsigned long long>(f_.seed), f_.out.c_str(), s.ToString().c_str());
    return 2;
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  absl::Status Setup() {
    auto cluster = ChaosCluster::Start(ChaosCluster::Options{.pre_vote = !f_.no_pre_vote});
    if (!cluster.ok()) return cluster.status();
    cluster_ = *std::move(cluster);
    if (!cluster_->stale_removed().empty()) {
      std::printf("chaos: removed what an earlier run left: %s\n",
                  absl::StrJoin(cluster_->stale_removed(), " ").c_str());
    }
    std::vector<std::string> members;
    for (int m = 0; m < cluster_->etcd_members(); ++m) {
      members.push_back(cluster_->etcd(m).endpoint());
    }
    std::printf("chaos: etcd members %s (%s)\n", absl::StrJoin(members, ",").c_str(),
                cluster_->members_cuttable() ? "each in its own network namespace"
                                             : "on loopback");
    if (absl::Status s = cluster_->CreateNamespace(); !s.ok()) return s;
    auto admin = cluster_->NewClient(0);
    if (!admin.ok()) return admin.status();
    v1::LockClass adv;
    adv.set_namespace_("default");
    adv.set_class_id("advisory");
    adv.set_key_prefix("adv/");
    adv.set_mode(v1::LOCK_MODE_EXCLUSIVE);
    adv.set_enforcement(v1::ENFORCEMENT_ADVISORY);
    adv.set_on_quorum_loss(v1::ON_QUORUM_LOSS_CLOSED);
    adv.set_ttl_min_ms(1000);
    adv.set_ttl_max_ms(3'600'000);
    if (auto c = (*admin)->CreateClass(adv); !c.ok()) return c.status();
    v1::LockClass open = adv;  // fenced, and usable (unprotected) without quorum
    open.set_class_id("open");
    open.set_key_prefix("open/");
    open.set_enforcement(v1::ENFORCEMENT_FENCED);
    open.set_on_quorum_loss(v1::ON_QUORUM_LOSS_OPEN);
    if (auto c = (*admin)->CreateClass(open); !c.ok()) return c.status();

    for (int m = 0; m < cluster_->etcd_members(); ++m) {
      etcd::ClientOptions eo;
      eo.endpoints = {cluster_->etcd(m).endpoint()};
      auto member = etcd::Client::Create(eo, timers_);
      if (!member.ok()) return member.status();
      members_.push_back(*std::move(member));
    }
    auto reg = FencedRegister::Start(history_.get(), !f_.no_fence);
    if (!reg.ok()) return reg.status();
    register_ = *std::move(reg);

    // Key i: mode S (shared allowed) / exclusive-only use / an advisory class /
    // an open class (from the fourth key on).
    std::vector<std::string> keys;
    for (int i = 0; i < f_.keys; ++i) {
      switch (i % 4) {
        case 0: keys.push_back(absl::StrCat("x/", i, ":s")); break;
        case 1: keys.push_back(absl::StrCat("x/", i)); break;
        case 2: keys.push_back(absl::StrCat("adv/", i)); break;
        default: keys.push_back(absl::StrCat("open/", i)); break;
      }
    }
    keys_arg_ = absl::StrJoin(keys, ",");
    std::printf("chaos: keys %s (\":s\": may be taken shared)\n", keys_arg_.c_str());
    endpoints_[0] = cluster_->endpoint(0);
    endpoints_[1] = cluster_->endpoint(1);
    for (int i = 0; i < f_.clients; ++i) {
      clients_.push_back(std::make_unique<Slot>());
      clients_.back()->index = i;
      if (absl::Status s = Spawn(*clients_.back()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Spawn(Slot& slot) {
    ++slot.incarnation;
    slot.id = absl::StrCat("c", slot.index, ".", slot.incarnation);
    slot.paused = false;
    slot.spawned_at = Clock::now();
    history_files_.push_back(absl::StrCat(f_.out, "/", slot.id, ".jsonl"));
    dev::SpawnOptions so;
    so.argv = {dev::SelfDir() + "/hf_chaos_client",
               "--id", slot.id,
               // Half the clients prefer each replica.
               "--endpoints", absl::StrCat(endpoints_[slot.index % 2], ",",
                                           endpoints_[1 - slot.index % 2]),
               "--register", absl::StrCat(register_->port()),
               "--history", history_files_.back(),
               "--keys", keys_arg_,
               "--seed", absl::StrCat(f_.seed * 7919 + slot.index * 104729 + slot.incarnation),
               "--ttl-ms", absl::StrCat(f_.ttl_ms),
               "--run-ms", absl::StrCat((f_.duration_s + 120) * 1000)};
    so.log_file = absl::StrCat(f_.out, "/", slot.id, ".log");
    auto p = dev::Subprocess::Spawn(so);
    if (!p.ok()) return p.status();
    slot.process = *std::move(p);
    return absl::OkStatus();
  }

  // Sleeps up to `d` in 50 ms steps, starting successors of clients that died
  // (at most one per slot every 500 ms, so a client that cannot start does not spin).
  void Tick(milliseconds d) {
    const auto until = Clock::now() + d;
    while (Clock::now() < until && !g_interrupted.load()) {
      for (auto& slot : clients_) {
        if (slot->paused || Clock::now() - slot->spawned_at < milliseconds(500) ||
            slot->process->Running()) {
          continue;
        }
        if (absl::Status s = Spawn(*slot); !s.ok()) {
          std::fprintf(stderr, "chaos: restart client %d: %s\n", slot->index,
                       s.ToString().c_str());
        }
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
  }

  void RecordFault(const std::string& kind, const std::string& target, const std::string& key,
                   const char* phase, const std::string& detail = "", int64_t session = 0) {
    Event e;
    e.type = "fault";
    e.kind = kind;
    e.target = target;
    e.key = key;
    e.phase = phase;
    e.detail = detail;
    e.session = session;
    history_->Record(std::move(e));
  }

  // The etcd members that report themselves leader / follower right now.
  void EtcdRoles(std::vector<int>& leaders, std::vector<int>& followers) {
    for (int m = 0; m < static_cast<int>(members_.size()); ++m) {
      auto st = members_[m]->StatusSync(etcd::DeadlineIn(milliseconds(2000)));
      if (!st.ok()) continue;
      (st->leader() == st->header().member_id() ? leaders : followers).push_back(m);
    }
  }

  void PauseEtcd(const std::vector<int>& members, const std::string& kind, milliseconds d) {
    std::vector<std::string> names;
    for (int m : members) names.push_back(absl::StrCat("etcd", m));
    const std::string target = absl::StrJoin(names, "+");
    RecordFault(kind, target, "", "start");
    for (int m : members) {
      etcd_paused_.push_back(m);
      cluster_->etcd(m).process()->Signal(SIGSTOP);
    }
    Tick(d);
    for (int m : members) cluster_->etcd(m).process()->Signal(SIGCONT);
    etcd_paused_.clear();
    RecordFault(kind, target, "", "end");
  }

  // Waits (at most 10 s) until every member names one leader in one term. A
  // member cut off keeps calling elections (etcd 3.4 runs without --pre-vote), and
  // when it returns its higher term makes the leader step down: a partition lasts
  // until that election is over too.
  void WaitEtcdSettled() {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until && !g_interrupted.load()) {
      std::set<std::pair<uint64_t, uint64_t>> views;  // leader, term
      for (auto& member : members_) {
        auto st = member->StatusSync(etcd::DeadlineIn(milliseconds(1000)));
        views.insert(st.ok() ? std::pair<uint64_t, uint64_t>{st->leader(), st->raftterm()}
                             : std::pair<uint64_t, uint64_t>{0, 0});
      }
      if (views.size() == 1 && views.begin()->first != 0) return;
      Tick(milliseconds(100));
    }
  }

  // Member m (its role: "leader" or "follower") cut off from its peers and every
  // client for `d`. The history names the role in the fault's detail.
  bool CutMember(int m, const std::string& role, milliseconds d) {
    const std::string kind = "etcd_member_partition";
    const std::string target = absl::StrCat("etcd", m);
    RecordFault(kind, target, "", "start", role);
    absl::Status cut = cluster_->CutMember(m, true);
    if (cut.ok()) Tick(d);
    absl::Status healed = cluster_->CutMember(m, false);
    WaitEtcdSettled();
    RecordFault(kind, target, "", "end", role);
    for (const absl::Status& s : {cut, healed}) {
      if (!s.ok()) std::fprintf(stderr, "chaos: %s %s: %s\n", kind.c_str(), target.c_str(),
                                s.ToString().c_str());
    }
    ++member_partitions_[role];
    return true;
  }

  // Two admins force-release a current hold (the last writer's): replica 0's
  // caller asks, a short-lived admin replica with another identity approves (with
  // the acknowledgement an advisory hold needs). The history gets a `force` event
  // with the release's revision. False if no hold was found to force.
  bool ForceRelease() {
    auto approver = cluster_->StartAdminReplica("spiffe://holdfast.dev/chaos-approver");
    if (!approver.ok()) {
      std::fprintf(stderr, "chaos: force_release: %s\n", approver.status().ToString().c_str());
      return false;
    }
    const bool forced = ForceReleaseVia(**approver);
    (*approver)->Stop();  // SIGTERM: it hands back what it led (the auditor)
    return forced;
  }

  bool ForceReleaseVia(testing::HoldfastdProcess& approver) {
    const std::string kind = "force_release";
    ClientOptions o;
    o.endpoints = {approver.endpoint()};
    auto second = Client::Connect(o);
    auto first = cluster_->NewClient(0);
    if (!first.ok() || !second.ok()) {
      std::fprintf(stderr, "chaos: %s: no admin client: %s\n", kind.c_str(),
                   (first.ok() ? second.status() : first.status()).ToString().c_str());
      return false;
    }
    // The approver is up: pick the hold now, so the fault is timed from the force.
    FencedRegister::LastWrite w =
        register_->RecentWriter(500'000'000, static_cast<uint64_t>(Uniform(0, 1 << 20)));
    if (w.writer.empty()) {
      std::printf("chaos: %s: no current holder\n", kind.c_str());
      return false;
    }
    auto described = (*first)->Describe("default", w.key);
    int64_t session = 0;
    for (int i = 0; described.ok() && i < described->holders_size(); ++i) {
      if (described->holders(i).token() == w.token) session = described->holders(i).session_id();
    }
    if (session == 0) {  // that hold has ended already
      std::printf("chaos: %s: the hold of %s token %lld is gone: %s\n", kind.c_str(),
                  w.key.c_str(), static_cast<long long>(w.token),
                  described.ok() ? "not among the holders" : described.status().ToString().c_str());
      return false;
    }
    v1::RequestForceReleaseRequest request;
    request.set_namespace_("default");
    request.set_lock_key(w.key);
    request.set_session_id(session);
    request.set_reason("chaos nemesis: force_release");
    auto requested = (*first)->RequestForceRelease(request);
    if (!requested.ok()) {
      std::fprintf(stderr, "chaos: %s %s: %s\n", kind.c_str(), w.key.c_str(),
                   requested.status().ToString().c_str());
      return false;
    }
    RecordFault(kind, w.writer, w.key, "start", "", session);
    v1::ApproveForceReleaseRequest approve;
    approve.set_request_id(requested->request_id());
    approve.set_ack_unfenced(!requested->class_is_fenced());
    auto approved = (*second)->ApproveForceRelease(approve);
    if (approved.ok()) {
      Event force;
      force.type = "force";
      force.target = w.writer;
      force.key = w.key;
      force.session = approved->request().session_id();
      force.token = approved->request().token();
      force.revision = approved->revision();
      history_->Record(std::move(force));
      ++forces_;
    } else {
      std::fprintf(stderr, "chaos: %s %s: %s\n", kind.c_str(), w.key.c_str(),
                   approved.status().ToString().c_str());
    }
    RecordFault(kind, w.writer, w.key, "end", "", session);
    return true;
  }

  // Runs one fault of `kind`, from start to heal. False if it found no target.
  bool RunFault(const std::string& kind) {
    if (kind == "client_pause" || kind == "client_kill") {
      // A current holder: the writer of a recent admitted write.
      FencedRegister::LastWrite w =
          register_->RecentWriter(500'000'000, static_cast<uint64_t>(Uniform(0, 1 << 20)));
      Slot* victim = nullptr;
      for (auto& slot : clients_) {
        if (!w.writer.empty() && slot->id == w.writer) victim = slot.get();
      }
      if (victim == nullptr) return false;
      if (kind == "client_kill") {
        RecordFault(kind, victim->id, w.key, "start");
        victim->process->Signal(SIGKILL);
        victim->process->Wait(milliseconds(5000));
        RecordFault(kind, victim->id, w.key, "end");
        return true;
      }
      RecordFault(kind, victim->id, w.key, "start");
      victim->paused = true;
      victim->process->Signal(SIGSTOP);
      Tick(milliseconds(f_.ttl_ms + Uniform(1000, 3000)));  // beyond its TTL
      victim->process->Signal(SIGCONT);
      victim->paused = false;
      RecordFault(kind, victim->id, w.key, "end");
      return true;
    }
    if (kind == "holdfastd_kill") {
      const int r = static_cast<int>(Uniform(0, 1));
      const std::string target = absl::StrCat("holdfastd", r);
      RecordFault(kind, target, "", "start");
      Replica(r).Kill();
      Tick(milliseconds(Uniform(500, 3000)));
      absl::Status s = Replica(r).Restart();
      if (!s.ok()) std::fprintf(stderr, "chaos: restart %s: %s\n", target.c_str(), s.ToString().c_str());
      RecordFault(kind, target, "", "end");
      return true;
    }
    if (kind == "holdfastd_restart") {
      // One step of a rolling restart: SIGTERM (the replica sends its waits and
      // renewal streams elsewhere at once), its exit, and a start on the same port.
      const int r = static_cast<int>(Uniform(0, 1));
      const std::string target = absl::StrCat("holdfastd", r);
      RecordFault(kind, target, "", "start");
      absl::Status s = Replica(r).Restart();
      if (!s.ok()) std::fprintf(stderr, "chaos: restart %s: %s\n", target.c_str(), s.ToString().c_str());
      RecordFault(kind, target, "", "end");
      return true;
    }
    if (kind == "holdfastd_pause") {
      const int r = static_cast<int>(Uniform(0, 1));
      const std::string target = absl::StrCat("holdfastd", r);
      RecordFault(kind, target, "", "start");
      holdfastd_paused_ = r;
      Replica(r).process()->Signal(SIGSTOP);
      Tick(milliseconds(Uniform(1000, 4000)));
      Replica(r).process()->Signal(SIGCONT);
      holdfastd_paused_ = -1;
      RecordFault(kind, target, "", "end");
      return true;
    }
    if (kind == "holdfastd_partition") {
      // Replica 1 cut off from every etcd member; its clients stay connected to it.
      RecordFault(kind, "holdfastd1", "", "start");
      cluster_->CutReplica1(true);
      Tick(milliseconds(Uniform(2000, 5000)));
      cluster_->CutReplica1(false);
      RecordFault(kind, "holdfastd1", "", "end");
      ++partitions_;
      return true;
    }
    if (kind == "force_release") return ForceRelease();
    if (kind == "etcd_member_partition" && !cluster_->members_cuttable()) return false;
    std::vector<int> leaders, followers;
    EtcdRoles(leaders, followers);
    if (kind == "etcd_member_partition") {
      // The leader about half the time (an election follows), else a follower.
      const bool leader = leaders.size() == 1 && (followers.empty() || Uniform(0, 1) == 0);
      if (!leader && followers.empty()) return false;
      const int m = leader ? leaders[0]
                           : followers[Uniform(0, static_cast<int64_t>(followers.size()) - 1)];
      return CutMember(m, leader ? "leader" : "follower", milliseconds(Uniform(2000, 5000)));
    }
    if (kind == "etcd_leader_pause") {
      if (leaders.size() != 1) return false;
      PauseEtcd(leaders, kind, milliseconds(Uniform(1500, 4000)));
      return true;
    }
    if (kind == "etcd_majority_pause") {
      std::vector<int> all = {0, 1, 2};
      std::shuffle(all.begin(), all.end(), rng_);
      all.resize(2);
      std::sort(all.begin(), all.end());
      PauseEtcd(all, kind, milliseconds(Uniform(1500, 4000)));
      return true;
    }
    return false;
  }

  void Workload() {
    const auto end = Clock::now() + std::chrono::seconds(f_.duration_s);
    std::vector<int> weights;
    std::vector<std::string> kinds;
    for (size_t i = 0; i < kFaultKinds.size(); ++i) {
      if (std::find(f_.nemesis.begin(), f_.nemesis.end(), kFaultKinds[i]) != f_.nemesis.end()) {
        kinds.push_back(kFaultKinds[i]);
        weights.push_back(kFaultWeights[i]);
      }
    }
    // Every kind once, in a seeded order, then weighted picks: a short run still
    // meets every fault.
    std::vector<std::string> first = kinds;
    std::shuffle(first.begin(), first.end(), rng_);
    Tick(milliseconds(3000));  // let the clients get going
    for (size_t i = 0; i < 100'000 && Clock::now() < end && !g_interrupted.load(); ++i) {
      if (!kinds.empty()) {
        std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
        const std::string kind = i < first.size() ? first[i] : kinds[pick(rng_)];
        if (RunFault(kind)) {
          ++faults_;
          std::printf("chaos: fault %d: %s\n", faults_, kind.c_str());
          std::fflush(stdout);
        }
      }
      // Quiet time: lets the victims notice and the cluster recover.
      Tick(milliseconds(Uniform(1000, f_.short_mode ? 2500 : 4000)));
    }
  }

  void ResumeAll() {
    for (auto& slot : clients_) {
      if (slot->paused && slot->process != nullptr) slot->process->Signal(SIGCONT);
      slot->paused = false;
    }
    if (cluster_ != nullptr) {
      for (int m : etcd_paused_) cluster_->etcd(m).process()->Signal(SIGCONT);
      if (holdfastd_paused_ >= 0) Replica(holdfastd_paused_).process()->Signal(SIGCONT);
    }
    etcd_paused_.clear();
    holdfastd_paused_ = -1;
    if (cluster_ != nullptr) cluster_->HealAll();
  }

  testing::HoldfastdProcess& Replica(int r) { return cluster_->holdfastd(r); }

  void Teardown() {
    ResumeAll();
    for (auto& slot : clients_) slot->process->Signal(SIGKILL);
    for (auto& slot : clients_) slot->process->Wait(milliseconds(5000));
    register_->Stop();
    history_.reset();  // flushed and closed
  }

  // --- Check (f)'s input, read while the cluster still runs ---------------------

  // Waits until no session (and so no hold) of the run's namespace is left in
  // etcd: the clients are dead, so each lease expires within its TTL (plus a
  // leader change's reset). False, with the problem recorded, after `bound`.
  bool WaitSessionsEnded(std::chrono::seconds bound) {
    etcd::Client& etcd = cluster_->etcd_client();
    const std::string ns = audit_.ns;
    const auto until = Clock::now() + bound;
    std::string left;
    while (!g_interrupted.load()) {
      left.clear();
      for (const auto& [what, begin] : {std::pair{"session", keyspace::SessionPrefix(ns)},
                                        std::pair{"hold", keyspace::HoldPrefix(ns, "")}}) {
        etcd::pb::RangeRequest r;
        r.set_key(begin);
        r.set_range_end(keyspace::PrefixEnd(begin));
        r.set_count_only(true);
        auto got = etcd.RangeSync(r, etcd::DeadlineIn(milliseconds(2000)));
        if (!got.ok()) {
          left = absl::StrCat("etcd unreadable: ", got.status().ToString());
          break;
        }
        if (got->count() > 0) {
          absl::StrAppend(&left, left.empty() ? "" : " and ", got->count(), " ", what, " keys");
        }
      }
      if (left.empty()) return true;
      if (Clock::now() >= until) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    audit_.problems.push_back(absl::StrCat(
        "sessions did not end: ", left, " still in etcd ", bound.count(),
        " s after every client was stopped (leases outliving their TTL); the audit cannot be "
        "complete"));
    return false;
  }

  // What each replica's auditor says (for a run whose audit fell behind).
  void PrintAuditStatus() {
    for (int r = 0; r < 2; ++r) {
      ClientOptions o;
      o.endpoints = {cluster_->endpoint(r)};
      o.rpc_timeout = milliseconds(3000);
      auto client = Client::Connect(o);
      if (!client.ok()) continue;
      auto st = (*client)->GetAuditStatus();
      if (!st.ok()) {
        std::printf("chaos: holdfastd%d audit status: %s\n", r, st.status().ToString().c_str());
        continue;
      }
      std::printf("chaos: holdfastd%d audit status: leader=%s this_replica_leads=%d cursor=%lld "
                  "etcd_revision=%lld last_error=%s\n",
                  r, st->leader().c_str(), st->this_replica_leads() ? 1 : 0,
                  static_cast<long long>(st->cursor()),
                  static_cast<long long>(st->etcd_revision()), st->last_error().c_str());
    }
  }

  // Every audit row of the cluster, in revision order. Pages of at most 10000
  // rows; a full page may end inside a revision, so its last revision is read
  // again from the start on the next page.
  absl::Status ReadAuditRows(audit::AuditStore& store, uint64_t cluster_id) {
    audit::AuditQuery q;
    q.cluster_id = cluster_id;
    q.limit = 10000;
    for (int page = 0; page < 10'000; ++page) {
      auto rows = store.Query(q);
      if (!rows.ok()) return rows.status();
      const bool last_page = static_cast<int>(rows->size()) < q.limit;
      const int64_t last_revision = rows->empty() ? 0 : rows->back().revision;
      if (!last_page && rows->front().revision == last_revision) {
        return absl::ResourceExhaustedError(
            absl::StrCat("more than ", q.limit, " audit rows at revision ", last_revision));
      }
      for (const audit::AuditEvent& e : *rows) {
        if (!last_page && e.revision == last_revision) break;
        AuditRow row;
        row.revision = e.revision;
        row.ns = e.ns;
        row.key = e.lock_key;
        row.session = e.session_id;
        row.type = audit::EventTypeName(e.type);
        row.token = e.token;
        row.unprotected = e.unprotected;
        audit_.rows.push_back(std::move(row));
      }
      if (last_page) return absl::OkStatus();
      q.after_revision = last_revision - 1;
    }
    return absl::ResourceExhaustedError("too many audit rows");
  }

  // etcd's own history of hold keys up to `through`, by a watch of every key
  // from etcd's first revision (or from the compaction, if etcd was compacted).
  absl::Status ReadEtcdHoldHistory(int64_t through) {
    struct Inbox {
      std::mutex mu;
      std::condition_variable cv;
      std::vector<mvccpb::Event> events;
      int64_t last = 0;
      absl::Status error;
    };
    etcd::Client& etcd = cluster_->etcd_client();
    int64_t from = 1;
    std::vector<mvccpb::Event> events;
    for (int attempt = 0;; ++attempt) {
      auto inbox = std::make_shared<Inbox>();
      etcd::WatchSpec spec;
      spec.key = std::string(1, '\0');  // with range_end "\0": every key
      spec.range_end = std::string(1, '\0');
      spec.start_revision = from;
      spec.prev_kv = true;
      const etcd::WatchId id =
          etcd.watches().Watch(spec, [inbox](absl::StatusOr<etcd::WatchBatch> b) {
            std::lock_guard l(inbox->mu);
            if (!b.ok()) {
              inbox->error = b.status();
            } else {
              for (auto& e : b->events) {
                inbox->last = std::max(inbox->last, e.kv().mod_revision());
                inbox->events.push_back(std::move(e));
              }
            }
            inbox->cv.notify_all();
          });
      absl::Status error;
      {
        std::unique_lock l(inbox->mu);
        const bool done = inbox->cv.wait_for(l, std::chrono::seconds(30), [&] {
          return inbox->last >= through || !inbox->error.ok();
        });
        error = done ? inbox->error
                     : absl::DeadlineExceededError(absl::StrCat("the watch reached revision ",
                                                                inbox->last, " of ", through,
                                                                " in 30 s"));
        events = std::move(inbox->events);
      }
      etcd.watches().Cancel(id);
      if (error.code() == absl::StatusCode::kOutOfRange && attempt == 0) {
        // The history before the compact revision is gone.
        const int64_t compacted = etcd::CompactRevisionOf(error);
        if (compacted <= from) return error;
        from = compacted;
        audit_.etcd_note = absl::StrCat("etcd was compacted at revision ", compacted);
        continue;
      }
      if (!error.ok()) return error;
      break;
    }

    // Per revision: its audit mark, and the sessions it deleted whose record was
    // `closing`; then the hold keys it created and deleted.
    std::map<int64_t, std::string> marks;
    std::set<std::tuple<int64_t, std::string, int64_t>> closed;  // revision, ns, lease
    for (const mvccpb::Event& e : events) {
      const std::string& key = e.kv().key();
      const int64_t rev = e.kv().mod_revision();
      if (e.type() == mvccpb::Event::PUT && key == keyspace::AuditMarkKey()) {
        records::AuditMark mark;
        marks[rev] = mark.ParseFromString(e.kv().value()) ? mark.kind() : "unreadable";
      }
      if (e.type() != mvccpb::Event::DELETE || !e.has_prev_kv()) continue;
      auto ns = keyspace::NamespaceOfKey(key);
      if (!ns) continue;
      auto lease = keyspace::ParseSessionKey(key, *ns);
      records::SessionRecord session;
      if (lease && session.ParseFromString(e.prev_kv().value()) && session.closing()) {
        closed.insert({rev, *ns, *lease});
      }
    }
    for (const mvccpb::Event& e : events) {
      const int64_t rev = e.kv().mod_revision();
      if (rev > through) continue;
      auto hold = keyspace::ParseHoldKey(e.kv().key());
      if (!hold) continue;
      EtcdHoldChange ch;
      ch.revision = rev;
      ch.ns = hold->ns;
      ch.key = hold->lock_key;
      ch.session = hold->lease;
      ch.created = e.type() == mvccpb::Event::PUT;
      // token = epoch << 48 | the hold key's create_revision (README, "Fencing tokens").
      const mvccpb::KeyValue& kv = ch.created ? e.kv() : e.prev_kv();
      records::HoldRecord rec;
      if ((ch.created || e.has_prev_kv()) && rec.ParseFromString(kv.value())) {
        ch.token = (static_cast<int64_t>(rec.epoch()) << 48) | kv.create_revision();
      }
      if (ch.created) {
        if (e.kv().create_revision() != rev) continue;  // a rewrite, not a creation
      } else if (auto m = marks.find(rev); m != marks.end()) {
        ch.cause = m->second;
      } else if (closed.contains({rev, hold->ns, hold->lease})) {
        ch.cause = "close";
      }
      audit_.etcd.push_back(std::move(ch));
    }
    audit_.etcd_from_revision = from;
    return absl::OkStatus();
  }

  bool AuditInterrupted() {
    if (!g_interrupted.load()) return false;
    audit_ = AuditCapture{};  // present = false: (f) is not checked
    std::printf("chaos: interrupted: the audit trail is not checked\n");
    std::fflush(stdout);
    return true;
  }

  // Check (f)'s input (audit_): every session ended, the auditor caught up with
  // etcd (both bounded), then the store's rows and etcd's history of hold keys.
  // An interrupted run (SIGINT, SIGTERM) does not wait for either, so its audit is
  // left unchecked rather than reported as fallen behind.
  void CaptureAudit() {
    if (AuditInterrupted()) return;
    audit_.present = true;
    audit_.advisory_prefixes = {"adv/"};
    const auto started = Clock::now();
    audit_.sessions_ended = WaitSessionsEnded(std::chrono::seconds(30));
    const auto sessions_done = Clock::now();
    auto store = audit::OpenSqliteStore(cluster_->dir() + "/audit.db");
    if (!store.ok()) {
      audit_.problems.push_back(
          absl::StrCat("cannot open the audit store: ", store.status().ToString()));
      return;
    }
    // The auditor records asynchronously: wait until its cursor reaches etcd's
    // revision (nothing writes any more).
    uint64_t cluster_id = 0;
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (!g_interrupted.load()) {
      etcdserverpb::RangeRequest r;
      r.set_key(keyspace::EpochKey());
      auto head = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(milliseconds(2000)));
      if (head.ok()) {
        cluster_id = head->header().cluster_id();
        audit_.etcd_revision = head->header().revision();
      }
      if (cluster_id != 0) {
        auto cursor = (*store)->Cursor(cluster_id);
        if (cursor.ok() && cursor->has_value()) audit_.cursor = **cursor;
      }
      if (audit_.etcd_revision > 0 && audit_.cursor >= audit_.etcd_revision) break;
      if (Clock::now() >= until) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    audit_.waited_ms =
        std::chrono::duration_cast<milliseconds>(Clock::now() - sessions_done).count();
    if (AuditInterrupted()) return;
    if (audit_.cursor < audit_.etcd_revision) PrintAuditStatus();
    if (cluster_id == 0) {
      audit_.problems.push_back("cannot read etcd's cluster id: the audit was not read");
      return;
    }
    if (absl::Status s = ReadAuditRows(**store, cluster_id); !s.ok()) {
      audit_.problems.push_back(absl::StrCat("cannot read the audit rows: ", s.ToString()));
      return;
    }
    // Rows are written with the cursor in one transaction: the cursor read after
    // them is at or past every row read.
    if (auto cursor = (*store)->Cursor(cluster_id); cursor.ok() && cursor->has_value()) {
      audit_.cursor = **cursor;
    }
    if (absl::Status s = ReadEtcdHoldHistory(audit_.cursor); s.ok()) {
      audit_.etcd_present = true;
    } else {
      audit_.etcd_present = false;
      audit_.etcd.clear();
      audit_.etcd_note = absl::StrCat("cannot read etcd's history: ", s.ToString());
    }
    std::printf("chaos: audit: sessions ended in %.1fs, auditor at revision %lld of %lld after "
                "%.1fs; %zu rows, %zu hold changes in etcd's history from revision %lld%s%s\n",
                std::chrono::duration<double>(sessions_done - started).count(),
                static_cast<long long>(audit_.cursor),
                static_cast<long long>(audit_.etcd_revision), audit_.waited_ms / 1000.0,
                audit_.rows.size(), audit_.etcd.size(),
                static_cast<long long>(audit_.etcd_from_revision),
                audit_.etcd_note.empty() ? "" : "; ", audit_.etcd_note.c_str());
    std::fflush(stdout);
  }

  int Check() {
    std::vector<std::string> files = {f_.out + "/driver.jsonl"};
    int silent = 0;  // clients that died before they could record anything
    for (const std::string& file : history_files_) {
      if (std::filesystem::exists(file)) {
        files.push_back(file);
      } else {
        ++silent;
      }
    }
    if (silent > 0) std::printf("chaos: %d client(s) left no history\n", silent);
    auto events = ReadHistories(files);
    if (!events.ok()) return Error(events.status());
    const std::string merged = f_.out + "/history.jsonl";
    if (absl::Status s = WriteHistory(merged, *events); !s.ok()) return Error(s);
    CheckReport r = CheckHistory(*events);
    if (absl::Status s = WriteAuditCapture(f_.out + "/audit.jsonl", audit_); !s.ok()) {
      return Error(s);
    }
    CheckAudit(*events, audit_, r);
    std::printf("%s", r.Describe().c_str());
    std::printf("partitions: holdfastd1 cut off from etcd %d times (loopback proxies)\n",
                partitions_);
    std::printf("forces: %d holds force-released by two admins\n", forces_);
    if (cluster_->members_cuttable()) {
      std::printf("partitions: an etcd member cut off %d times: the leader %d, a follower %d "
                  "(network namespaces)\n",
                  member_partitions_["leader"] + member_partitions_["follower"],
                  member_partitions_["leader"], member_partitions_["follower"]);
    } else {
      std::printf("partitions skipped: cutting one etcd member off: %s\n",
                  cluster_->partitions_skipped().c_str());
    }
    const bool failed = f_.expect_violations ? r.violations.empty() : !r.violations.empty();
    if (f_.expect_violations) {
      std::printf("chaos: control run %s\n", r.violations.empty()
                                                  ? "FAILED: the checker saw no violation"
                                                  : "ok: violations found, as expected");
    }
    // A failing run keeps its history for replay; a control run that found its
    // violations passed, and is cleaned up like any passing run.
    if (failed || f_.keep) {
      std::printf("chaos: history kept in %s (replay: holdfast-chaos --check %s; rerun: "
                  "holdfast-chaos --seed %llu --duration %d --clients %d%s)\n",
                  merged.c_str(), merged.c_str(), static_cast<unsigned long long>(f_.seed),
                  f_.duration_s, f_.clients, f_.no_fence ? " --no-fence" : "");
    } else {
      std::filesystem::remove_all(f_.out);
    }
    std::printf("%s\n", Summary(absl::StrCat(f_.seed), r).c_str());
    std::fflush(stdout);
    if (f_.expect_violations) return failed ? 1 : 0;
    return r.violations.empty() ? 0 : 1;
  }

  Flags f_;
  std::mt19937_64 rng_;
  std::unique_ptr<HistoryWriter> history_;
  std::unique_ptr<ChaosCluster> cluster_;
  std::shared_ptr<TimerQueue> timers_ = std::make_shared<TimerQueue>();
  std::vector<std::unique_ptr<etcd::Client>> members_;
  std::unique_ptr<FencedRegister> register_;
  std::vector<std::unique_ptr<Slot>> clients_;
  std::vector<std::string> history_files_;
  AuditCapture audit_;  // check (f)'s input, captured before the cluster goes
  std::string keys_arg_;
  std::string endpoints_[2];
  std::vector<int> etcd_paused_;
  int holdfastd_paused_ = -1;
  int faults_ = 0;
  int partitions_ = 0;
  std::map<std::string, int> member_partitions_;  // by the role of the member cut
  int forces_ = 0;
};

}  // namespace
}  // namespace holdfast::chaos

int main(int argc, char** argv) {
  holdfast::chaos::Flags flags;
  if (!holdfast::chaos::ParseFlags(argc, argv, flags)) {
    holdfast::chaos::Usage(argv[0]);
    return 2;
  }
  if (!flags.check.empty()) return holdfast::chaos::CheckOnly(flags.check);
  if (!flags.seed_given) {
    flags.seed = std::random_device{}() % 1'000'000;
  }
  std::signal(SIGINT, holdfast::chaos::OnSignal);
  std::signal(SIGTERM, holdfast::chaos::OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  holdfast::chaos::ChaosRun run(flags);
  return run.Run();
}
