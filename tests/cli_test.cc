// Integration tests of the `holdfast` CLI: the built binary runs as a real
// process against real etcd and holdfastd processes (TestCluster).
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/listen.h"
#include "dev/certs.h"
#include "dev/refusing_endpoint.h"
#include "dev/subprocess.h"
#include "etcd/client.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "harness/cluster.h"
#include "holdfast/client.h"
#include "lock/keyspace.h"

namespace holdfast::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

constexpr milliseconds kCliTimeout = seconds(60);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileExists(const std::string& path) { return std::filesystem::exists(path); }

// Waits up to `timeout` for `condition`, checking every 20 ms.
bool WaitFor(const std::function<bool()>& condition, milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// A command that waits for the test without forking: `read _ < FIFO` blocks in
// the kernel (interruptibly) until GoOn writes a line. (A shell loop polling a
// file forks a child per turn, and a job stopped while one was between vfork and
// exec leaves the shell waiting for it uninterruptibly, never seen stopped.)
std::string MakeGoFifo(const std::string& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  return path;
}
void GoOn(const std::string& fifo) {
  int fd = -1;
  // The command may not have opened it yet: no reader is ENXIO.
  WaitFor([&] { return (fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) >= 0; },
          seconds(10));
  ASSERT_GE(fd, 0) << "nobody reads " << fifo;
  EXPECT_EQ(::write(fd, "\n", 1), 1);
  ::close(fd);
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// One run of the holdfast binary, with its stdout and stderr in files.
class CliProcess {
 public:
  // Starts `holdfast [--endpoint ENDPOINT] ARGS...`; `dir` receives the output
  // files. HOLDFAST_DEV_DIR is `dev_dir` ("": a directory that does not exist,
  // so no dev credentials are picked up), and `env` is added (it may replace
  // HF_TEST_OUT or HF_TEST_ERR, the files stdout and stderr go to).
  static std::unique_ptr<CliProcess> Start(
      const std::string& dir, const std::string& endpoint, const std::vector<std::string>& args,
      const std::string& dev_dir = "",
      const std::vector<std::pair<std::string, std::string>>& env = {}) {
    static int counter = 0;
    auto p = std::unique_ptr<CliProcess>(new CliProcess());
    p->out_path_ = absl::StrCat(dir, "/cli-", ++counter, ".out");
    p->err_path_ = absl::StrCat(dir, "/cli-", counter, ".err");
    dev::SpawnOptions so;
    // sh only sets up the redirections, then becomes holdfast (same pid).
    so.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >\"$HF_TEST_OUT\" 2>\"$HF_TEST_ERR\"",
               BinDir() + "/holdfast"};
    if (!endpoint.empty()) {
      so.argv.push_back("--endpoint");
      so.argv.push_back(endpoint);
    }
    for (const auto& a : args) so.argv.push_back(a);
    so.env = {{"HF_TEST_OUT", p->out_path_},
              {"HF_TEST_ERR", p->err_path_},
              {"HOLDFAST_DEV_DIR", dev_dir.empty() ? dir + "/no-dev-dir" : dev_dir}};
    for (const auto& e : env) so.env.push_back(e);
    auto proc = dev::Subprocess::Spawn(std::move(so));
    EXPECT_TRUE(proc.ok()) << proc.status();
    if (!proc.ok()) return nullptr;
    p->process_ = std::move(*proc);
    return p;
  }

  // What holdfast has written to stdout so far.
  std::string Output() const { return ReadFile(out_path_); }

  // Sends `sig` to holdfast alone (the command it runs has its own group).
  void Signal(int sig) { ::kill(process_->pid(), sig); }
  pid_t pid() const { return process_->pid(); }

  // Waits for the exit (killing it after `timeout`, which fails the test).
  CliResult Finish(milliseconds timeout = kCliTimeout) {
    CliResult r;
    auto code = process_->Wait(timeout);
    if (!code) {
      ADD_FAILURE() << "holdfast did not exit within " << timeout.count() << " ms";
      process_->Stop(seconds(1));
      code = process_->Wait();
    }
    r.exit_code = *code;
    r.out = ReadFile(out_path_);
    r.err = ReadFile(err_path_);
    return r;
  }

 private:
  CliProcess() = default;
  std::unique_ptr<dev::Subprocess> process_;
  std::string out_path_;
  std::string err_path_;
};

template <typename Message>
Message ParseJson(const std::string& json) {
  Message m;
  auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << json;
  return m;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c = TestCluster::Start();
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c).release();
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
  }

  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    auto c = cluster_->NewClient();
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  CliResult Run(const std::vector<std::string>& args) {
    auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(), args);
    if (!p) return {};
    return p->Finish();
  }

  std::string Path(const std::string& name) const { return cluster_->dir() + "/" + name; }

  static TestCluster* cluster_;
  std::unique_ptr<Client> client_;
};

TestCluster* CliTest::cluster_ = nullptr;

TEST_F(CliTest, LockRunsCommandWithTokenAndExitsWithItsCode) {
  std::string file = Path("token-exit");
  CliResult r = Run({"lock", "default/cli/exit", "--", "sh", "-c",
                     "echo $HOLDFAST_TOKEN > '" + file + "'; echo $HOLDFAST_LOCK >> '" + file +
                         "'; exit 3"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  std::vector<std::string> lines = absl::StrSplit(ReadFile(file), '\n');
  ASSERT_GE(lines.size(), 2u);
  int64_t token = 0;
  ASSERT_TRUE(absl::SimpleAtoi(lines[0], &token)) << lines[0];
  EXPECT_GT(token, 0);
  EXPECT_EQ(lines[1], "default/cli/exit");
  // Released on exit.
  auto d = client_->Describe("default", "cli/exit");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0);
}

// Started with SIGCHLD ignored (a launcher may leave it so, and exec keeps it),
// holdfast would have its children reaped by the kernel and never hear of
// them: it waited on with the lock after the command had exited.
TEST_F(CliTest, ACommandsExitIsSeenWhenHoldfastIsStartedWithSigchldIgnored) {
  dev::SpawnOptions so;
  so.argv = {"perl", "-e", "$SIG{CHLD} = 'IGNORE'; exec @ARGV or die \"exec: $!\"",
             BinDir() + "/holdfast", "--endpoint", cluster_->endpoint(), "lock",
             "default/cli/sigchld-ignored", "--", "sh", "-c", "exit 7"};
  so.env = {{"HOLDFAST_DEV_DIR", cluster_->dir() + "/no-dev-dir"}};
  so.log_file = Path("sigchld-ignored.log");
  auto p = dev::Subprocess::Spawn(std::move(so));
  ASSERT_TRUE(p.ok()) << p.status();
  auto code = (*p)->Wait(kCliTimeout);
  if (!code) (*p)->Stop(seconds(1));
  EXPECT_EQ(code, 7) << ReadFile(Path("sigchld-ignored.log"));
  auto d = client_->Describe("default", "cli/sigchld-ignored");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
}

TEST_F(CliTest, LockHeldElsewhereExits75WithoutRunningTheCommand) {
  auto session = client_->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  auto hold = (*session)->Acquire("cli/busy");
  ASSERT_TRUE(hold.ok()) << hold.status();

  std::string file = Path("busy-ran");
  CliResult r = Run({"lock", "--wait", "0", "default/cli/busy", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_NE(r.err.find("not acquired"), std::string::npos) << r.err;
  EXPECT_FALSE(FileExists(file));

  // A bounded wait that ends without the lock: 75 too.
  r = Run({"lock", "--wait", "300ms", "default/cli/busy", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_FALSE(FileExists(file));

  // The other session's hold is untouched.
  auto d = client_->Describe("default", "cli/busy");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).token(), hold->token());
}

TEST_F(CliTest, HoldersShowsTheHolderAsJsonAndTable) {
  auto session = client_->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  AcquireOptions options;
  options.holder_meta = "cli-test";
  auto hold = (*session)->Acquire("cli/holders", options);
  ASSERT_TRUE(hold.ok()) << hold.status();

  CliResult r = Run({"holders", "default/cli/holders", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto response = ParseJson<v1::DescribeResponse>(r.out);
  ASSERT_EQ(response.holders_size(), 1) << r.out;
  EXPECT_EQ(response.holders(0).token(), hold->token());
  EXPECT_EQ(response.holders(0).session_id(), (*session)->id());
  EXPECT_EQ(response.holders(0).lock_key(), "cli/holders");

  r = Run({"holders", "default/cli/holders"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("TOKEN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(absl::StrCat(hold->token())), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cli-test"), std::string::npos) << r.out;
}

TEST_F(CliTest, NamespaceCreateGetListDelete) {
  CliResult r = Run({"ns", "create", "cli-team", "--tenant", "acme", "--held-lease-quota", "5",
                     "--mode", "S", "--ttl-max", "10m"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The text says who may use it: anyone, until members are set.
  EXPECT_NE(r.out.find("- (any authenticated caller)"), std::string::npos) << r.out;

  r = Run({"ns", "get", "cli-team", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ns = ParseJson<v1::Namespace>(r.out);
  EXPECT_EQ(ns.name(), "cli-team");
  EXPECT_EQ(ns.tenant_id(), "acme");
  EXPECT_EQ(ns.held_lease_quota(), 5);

  r = Run({"ns", "list", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto list = ParseJson<v1::ListNamespacesResponse>(r.out);
  bool listed = false;
  for (const auto& n : list.namespaces()) listed |= n.name() == "cli-team";
  EXPECT_TRUE(listed) << r.out;

  // The class flags of `ns create` shaped the catch-all class.
  r = Run({"class", "list", "cli-team", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto classes = ParseJson<v1::ListClassesResponse>(r.out);
  ASSERT_EQ(classes.classes_size(), 1) << r.out;
  EXPECT_EQ(classes.classes(0).key_prefix(), "");
  EXPECT_EQ(classes.classes(0).mode(), v1::LOCK_MODE_SHARED);
  EXPECT_EQ(classes.classes(0).ttl_max_ms(), 600'000);

  // New members, ending the sessions they leave out (none here: the CLI is an admin).
  r = Run({"ns", "set", "cli-team", "--member", "spiffe://holdfast.dev/team/*",
           "--end-sessions-of-removed", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ns = ParseJson<v1::Namespace>(r.out);
  ASSERT_EQ(ns.members_size(), 1) << r.out;
  EXPECT_EQ(ns.members(0), "spiffe://holdfast.dev/team/*");
  r = Run({"ns", "get", "cli-team"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("spiffe://holdfast.dev/team/*"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("any authenticated caller"), std::string::npos) << r.out;

  r = Run({"ns", "delete", "cli-team"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run({"ns", "get", "cli-team"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
}

TEST_F(CliTest, BadInputIsRefusedBeforeReachingTheServer) {
  auto before = client_->ListNamespaces();
  ASSERT_TRUE(before.ok()) << before.status();

  CliResult r = Run({"ns", "create", "Bad Name!"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"Bad Name!\" is invalid"), std::string::npos) << r.err;

  r = Run({"ns", "create", "cli-bad-mode", "--mode", "Q"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--mode"), std::string::npos) << r.err;

  r = Run({"ns", "set", "default", "--end-sessions-of-removed"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--end-sessions-of-removed goes with --member or --clear-members"),
            std::string::npos)
      << r.err;
  auto quota_before = client_->GetNamespace("default");
  ASSERT_TRUE(quota_before.ok()) << quota_before.status();
  r = Run({"ns", "set", "default"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "holdfast: ns set default: nothing to change (give --held-lease-quota, "
            "--op-rate-quota, --member or --clear-members)\n");
  r = Run({"ns", "set", "default", "--held-lease-quota", "-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--held-lease-quota"), std::string::npos) << r.err;
  for (const char* deadline : {"0", "25h"}) {
    r = Run({"ns", "rehome", "default", "--to", "elsewhere", "--deadline", deadline});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, absl::StrCat("holdfast: --deadline ", deadline,
                                  " is out of range: more than 0, at most 24h (how long the move "
                                  "waits for the namespace's holds to end)\n"));
  }
  auto unchanged = client_->GetNamespace("default");
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_EQ(unchanged->held_lease_quota(), quota_before->held_lease_quota());

  auto after = client_->ListNamespaces();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->size(), before->size());

  std::string file = Path("bad-input-ran");
  r = Run({"lock", "no-slash", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("expected NS/KEY"), std::string::npos) << r.err;
  r = Run({"lock", "--ttl", "10", "default/cli/bad", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--ttl"), std::string::npos) << r.err;
  // Without `--`, the command's own --wait would be taken for holdfast's.
  r = Run({"lock", "default/cli/bad", "touch", file, "--wait", "5s"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("put the command after --: holdfast lock [OPTIONS] default/cli/bad -- "
                       "touch ..."),
            std::string::npos)
      << r.err;
  auto bad = client_->Describe("default", "cli/bad");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->holders_size(), 0);
  r = Run({"holders", "default/"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"ns", "list", "-o", "yaml"});
  EXPECT_EQ(r.exit_code, 2);
  // Words of the command on both sides of `--` (the options between would be
  // holdfast's): refused, nothing run.
  r = Run({"lock", "default/cli/bad", "touch", file, "--ttl", "1h", "--", "-c"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("holdfast: The following argument was not expected: -c"),
            std::string::npos)
      << r.err;
  // --wait: the CLI's bound is the most any server allows; this one (the default
  // acquire.max_wait, 1h) names its own.
  r = Run({"lock", "--wait", "25h", "default/cli/bad", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "holdfast: --wait must be at most 24h\n");
  r = Run({"lock", "--grace", "25d", "default/cli/bad", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "holdfast: --grace must be at most 1h\n");
  // A `--` that does not stand right before the command: at the end (the
  // options before it would be holdfast's), or as an option's value.
  for (const auto& args : {std::vector<std::string>{"lock", "default/cli/bad", "touch", file,
                                                    "--shared", "--"},
                           std::vector<std::string>{"lock", "--meta", "--", "default/cli/bad",
                                                    "touch", file}}) {
    r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("put the command after --"), std::string::npos) << r.err;
  }
  r = Run({"lock", "--wait", "2h", "default/cli/bad", "--", "touch", file});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("wait 7200000ms is outside [0, 3600000ms] (this server's acquire.max_wait)"),
            std::string::npos)
      << r.err;
  r = Run({"lock", "default/cli/bad", "--"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no command given: holdfast lock NS/KEY -- CMD [ARGS...]"),
            std::string::npos)
      << r.err;
  bad = client_->Describe("default", "cli/bad");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->holders_size(), 0);
  EXPECT_FALSE(FileExists(file)) << "a refused command ran";
  // mTLS files that cannot be used, named by their flag, before any connection.
  const std::string not_pem = Path("not-a-cert.txt");
  std::ofstream(not_pem) << "hello\n";
  // A certificate with another certificate's key (one renewed without its key).
  auto pki = dev::MakeCa("cli-test");
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto one = dev::MakeLeaf(*pki, {}), other = dev::MakeLeaf(*pki, {});
  ASSERT_TRUE(one.ok() && other.ok());
  const std::string pki_dir = cluster_->dir();
  ASSERT_TRUE(dev::WritePem(pki_dir, "pki-ca", *pki).ok());
  ASSERT_TRUE(dev::WritePem(pki_dir, "pki-one", *one).ok());
  ASSERT_TRUE(dev::WritePem(pki_dir, "pki-other", *other).ok());
  for (const auto& [flags, reason] :
       {std::pair{std::vector<std::string>{"--ca", Path("ca.pme"), "--cert", not_pem, "--key",
                                           not_pem},
                  "--ca " + Path("ca.pme") + ": cannot read: No such file or directory"},
        std::pair{std::vector<std::string>{"--ca", not_pem, "--cert", not_pem, "--key", not_pem},
                  "--ca " + not_pem +
                      " holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)"},
        std::pair{std::vector<std::string>{"--ca", Path("pki-ca.pem"), "--cert",
                                           Path("pki-one.pem"), "--key",
                                           Path("pki-other_key.pem")},
                  "--cert and --key do not belong together: " + Path("pki-other_key.pem") +
                      " is not the key of the certificate in " + Path("pki-one.pem") +
                      " (a certificate renewed without its key, or the other way round?)"}}) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), {"lock", "default/cli/bad", "--", "touch", file});
    r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, "holdfast: " + reason + "\n");
  }
  // Plaintext (no --ca/--cert/--key, no dev credentials) to a holdfastd off
  // this machine: refused before anything is sent.
  auto remote = CliProcess::Start(cluster_->dir(), "10.0.0.5:7420",
                                  {"lock", "default/cli/bad", "--", "touch", file});
  ASSERT_NE(remote, nullptr);
  r = remote->Finish();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("holdfastd endpoint 10.0.0.5:7420 is not a loopback address and no CA "
                       "bundle is given"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(FileExists(file));
}

TEST_F(CliTest, ClassCreateGetListDelete) {
  CliResult r = Run({"class", "create", "default", "cli-jobs", "--prefix", "cli-jobs/", "--mode",
                     "X", "--enforcement", "advisory", "--ttl-min", "2s"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  r = Run({"class", "get", "default", "cli-jobs", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto cls = ParseJson<v1::LockClass>(r.out);
  EXPECT_EQ(cls.key_prefix(), "cli-jobs/");
  EXPECT_EQ(cls.mode(), v1::LOCK_MODE_EXCLUSIVE);
  EXPECT_EQ(cls.enforcement(), v1::ENFORCEMENT_ADVISORY);
  EXPECT_EQ(cls.ttl_min_ms(), 2000);

  r = Run({"class", "list", "default"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cli-jobs"), std::string::npos) << r.out;

  r = Run({"class", "delete", "default", "cli-jobs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run({"class", "get", "default", "cli-jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;

  // A --ttl-min above the --ttl-max it did not give: the message names the
  // default it ran into, and nothing is created.
  r = Run({"class", "create", "default", "cli-long", "--prefix", "cli-long/", "--ttl-min", "2h"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--ttl-min 7200000ms > --ttl-max 3600000ms (the default)"),
            std::string::npos)
      << r.err;
  r = Run({"class", "get", "default", "cli-long"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
}

TEST_F(CliTest, LockForwardsSigtermToTheCommandAndReleases) {
  std::string started = Path("signal-started");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "default/cli/signal", "--", "sh", "-c",
                              "echo up > '" + started + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(WaitFor([&] { return FileExists(started); }, seconds(30)));
  p->Signal(SIGTERM);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  auto d = client_->Describe("default", "cli/signal");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0);
}

// Needs its own cluster: it kills holdfastd.
TEST_F(CliTest, AuditPrintsJsonLinesInRevisionOrder) {
  ASSERT_EQ(Run({"lock", "default/cli/audited", "--", "true"}).exit_code, 0);
  ASSERT_EQ(Run({"lock", "default/cli/audited", "--", "true"}).exit_code, 0);
  // The auditor records asynchronously: poll until both cycles are there.
  CliResult r;
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i) {
    r = Run({"audit", "--ns", "default", "--key", "cli/audited", "-o", "json"});
    lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
    if (r.exit_code == 0 && lines.size() >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(lines.size(), 4u) << r.out;
  const char* types[] = {"\"type\":\"grant\"", "\"type\":\"release\"", "\"type\":\"grant\"",
                         "\"type\":\"release\""};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_NE(lines[i].find(types[i]), std::string::npos) << lines[i];
    // 64-bit integers are decimal strings, as in every -o json.
    for (const char* field : {"\"cluster_id\":\"", "\"revision\":\"", "\"namespace\":\"default\"",
                              "\"lock_key\":\"cli/audited\"", "\"spiffe_id\":", "\"token\":\"",
                              "\"session_id\":\"",
                              "\"unprotected\":false", "\"time\":\"20"}) {
      EXPECT_NE(lines[i].find(field), std::string::npos) << field << " in " << lines[i];
    }
  }
  // Filters: grants only.
  r = Run({"audit", "--ns", "default", "--key", "cli/audited", "--type", "grant", "-o", "json"});
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;

  // Paged one event at a time, the same lines.
  r = Run({"audit", "--ns", "default", "--key", "cli/audited", "--limit", "1", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(r.out, '\n', absl::SkipEmpty())), lines);
  // Only this cluster: all of them; another cluster: none.
  std::string cluster_id = lines[0].substr(lines[0].find("\"cluster_id\":\"") + 14);
  cluster_id = cluster_id.substr(0, cluster_id.find('"'));
  ASSERT_FALSE(cluster_id.empty()) << lines[0];
  r = Run({"audit", "--ns", "default", "--key", "cli/audited", "--cluster", cluster_id, "-o",
           "json"});
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4) << r.out << r.err;
  r = Run({"audit", "--ns", "default", "--key", "cli/audited", "--cluster", "42", "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  // The table names each row's cluster (revisions of two clusters are
  // unrelated), unless --cluster chose one.
  r = Run({"audit", "--ns", "default", "--key", "cli/audited"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> rows = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 5u) << r.out;
  EXPECT_EQ(rows[0].rfind("CLUSTER ", 0), 0u) << rows[0];
  EXPECT_NE(rows[0].find(" REVISION "), std::string::npos) << rows[0];
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].rfind(cluster_id + " ", 0), 0u) << rows[i];
    EXPECT_NE(rows[i].find(i % 2 == 1 ? " grant " : " release "), std::string::npos) << rows[i];
  }
  r = Run({"audit", "--ns", "default", "--key", "cli/audited", "--cluster", cluster_id});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rows = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 5u) << r.out;
  EXPECT_EQ(rows[0].rfind("REVISION ", 0), 0u) << rows[0];
  EXPECT_EQ(r.out.find(cluster_id), std::string::npos) << r.out;
  // The id as the server writes it, however given: followed, each event once.
  auto follow = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                                  {"audit", "--follow", "--ns", "default", "--key", "cli/audited",
                                   "--cluster", "00" + cluster_id, "-o", "json"});
  ASSERT_NE(follow, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two polls and more
  follow->Signal(SIGTERM);
  r = follow->Finish();
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(r.out, '\n', absl::SkipEmpty())), lines)
      << r.err;
  // A client key given after `audit` is its --key filter: said so.
  r = Run({"audit", "--ca", Path("ca.pem"), "--cert", Path("me.pem"), "--key", Path("me.key")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "holdfast: --key \"" + Path("me.key") +
                       "\" after `audit` is its lock-key filter, and --ca/--cert came without a "
                       "client key: put --ca, --cert and --key before `audit`\n");
  // Filters no event could match are refused, not answered with nothing.
  for (const auto& [args, reason] :
       {std::pair{std::vector<std::string>{"--ns", "Default"}, "--ns: namespace \"Default\""},
        std::pair{std::vector<std::string>{"--identity", "alice"}, "--identity: "},
        std::pair{std::vector<std::string>{"--key", std::string(600, 'k')}, "--key: "}}) {
    std::vector<std::string> audit = {"audit"};
    audit.insert(audit.end(), args.begin(), args.end());
    r = Run(audit);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("holdfast: " + std::string(reason), 0), 0u) << r.err;
  }
  r = Run({"audit", "--cluster", "x"});
  EXPECT_EQ(r.exit_code, 2);  // usage
  EXPECT_NE(r.err.find("--cluster \"x\" is not a decimal etcd cluster id"), std::string::npos)
      << r.err;

  r = Run({"audit", "--type", "bogus"});
  EXPECT_EQ(r.exit_code, 2);  // usage
  EXPECT_NE(r.err.find("use grant, release, expire or force"), std::string::npos) << r.err;
  r = Run({"audit", "--since", "yesterday-ish"});
  EXPECT_EQ(r.exit_code, 2);  // usage
  EXPECT_NE(r.err.find("RFC 3339"), std::string::npos) << r.err;

  // The status names the retention: the test cluster keeps every event.
  r = Run({"audit", "status"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> status;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    status[kv.first] = std::string(absl::StripAsciiWhitespace(kv.second));
  }
  EXPECT_EQ(status["retention"], "forever") << r.out;
  EXPECT_EQ(status["pruned_events"], "0") << r.out;
  EXPECT_EQ(status["store"], "sqlite") << r.out;
  EXPECT_EQ(status["durability"], "synchronous=FULL") << r.out;
  EXPECT_EQ(status["audited_clusters"], cluster_id) << r.out;
}

TEST_F(CliTest, AuditFollowPrintsNewEventsOnceEachAcrossPages) {
  auto follow = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                                  {"audit", "--follow", "--ns", "default", "--key",
                                   "cli/followed", "--limit", "1", "-o", "json"});
  ASSERT_NE(follow, nullptr);
  // A hand-over: A's release and B's grant share one revision, which a page
  // of one event has to split.
  auto a = client_->OpenSession("default");
  auto b = client_->OpenSession("default");
  ASSERT_TRUE(a.ok() && b.ok());
  auto h = (*a)->Acquire("cli/followed");
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<Hold> bh = absl::UnknownError("not run");
  std::thread waiter(
      [&] { bh = (*b)->Acquire("cli/followed", testing::Waiting(std::chrono::seconds(30))); });
  ASSERT_TRUE(WaitFor(
      [&] {
        auto d = client_->Describe("default", "cli/followed");
        return d.ok() && d->waiters_size() == 1;
      },
      std::chrono::seconds(30)));
  ASSERT_TRUE(h->Release().ok());
  waiter.join();
  ASSERT_TRUE(bh.ok()) << bh.status();
  ASSERT_TRUE(bh->Release().ok());

  std::vector<std::string> lines;
  WaitFor(
      [&] {
        lines = absl::StrSplit(follow->Output(), '\n', absl::SkipEmpty());
        return lines.size() >= 4;
      },
      std::chrono::seconds(60));
  // Long enough for more polls: nothing is printed twice.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  follow->Signal(SIGTERM);
  CliResult r = follow->Finish();
  lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out << r.err;
  auto has = [](const std::string& line, const std::string& type, int64_t session) {
    return line.find("\"type\":\"" + type + "\"") != std::string::npos &&
           line.find(absl::StrCat("\"session_id\":\"", session, "\"")) != std::string::npos;
  };
  EXPECT_TRUE(has(lines[0], "grant", (*a)->id())) << lines[0];
  // Same revision: release of A and grant of B, in either order.
  EXPECT_TRUE((has(lines[1], "release", (*a)->id()) && has(lines[2], "grant", (*b)->id())) ||
              (has(lines[1], "grant", (*b)->id()) && has(lines[2], "release", (*a)->id())))
      << lines[1] << "\n" << lines[2];
  EXPECT_TRUE(has(lines[3], "release", (*b)->id())) << lines[3];
}

TEST_F(CliTest, EpochShowsTheRecordAndHistoryAndAdvanceChecksItsReason) {
  CliResult r = Run({"epoch", "show", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.ends_with("}\n")) << "one document, one newline: " << r.out;
  auto e = ParseJson<v1::Epoch>(r.out);
  EXPECT_GE(e.epoch(), 1);
  EXPECT_EQ(e.etcd_cluster_id(), e.observed_cluster_id());
  EXPECT_TRUE(e.restore_detected().empty());
  ASSERT_GE(e.history_size(), 1);
  EXPECT_EQ(e.history(0).reason(), "init");
  r = Run({"epoch", "show"});
  EXPECT_NE(r.out.find("grants:               allowed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("T"), std::string::npos);  // RFC 3339 times
  r = Run({"epoch", "advance", "--reason", "because"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("use restore or rehome"), std::string::npos) << r.err;
  auto after = client_->GetEpoch();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->epoch(), e.epoch());  // nothing changed
}

TEST_F(CliTest, ForceReleaseRefusesTheRequesterAsApprover) {
  auto session = client_->OpenSession("default");
  ASSERT_TRUE(session.ok());
  auto hold = (*session)->Acquire("cli/stuck");
  ASSERT_TRUE(hold.ok());
  CliResult r = Run({"force", "request", "default/cli/stuck", "--reason", "hung", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.ends_with("}\n")) << "one document, one newline: " << r.out;
  auto req = ParseJson<v1::ForceRequest>(r.out);
  ASSERT_EQ(req.request_id().size(), 16u);
  r = Run({"force", "list"});
  EXPECT_NE(r.out.find(req.request_id()), std::string::npos) << r.out;
  // Without TLS every caller is the one dev identity: it cannot be the second person.
  r = Run({"force", "approve", req.request_id()});
  EXPECT_EQ(r.exit_code, 1);  // refused
  EXPECT_NE(r.err.find("PERMISSION_DENIED"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("two people"), std::string::npos) << r.err;
  auto d = client_->Describe("default", "cli/stuck");
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).token(), hold->token());
  r = Run({"force", "request", "default/cli/nobody", "--reason", "x"});
  EXPECT_EQ(r.exit_code, 1);  // refused
  EXPECT_NE(r.err.find("nobody holds"), std::string::npos) << r.err;
}

// The pid the locked command wrote to `pid_file` (a whole line), or 0 if it did
// not within 30 s.
pid_t CommandPid(const std::string& pid_file) {
  auto written = [&] {
    std::string text = ReadFile(pid_file);
    return !text.empty() && text.back() == '\n';
  };
  pid_t pid = 0;
  if (!WaitFor(written, seconds(30)) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(pid_file)), &pid)) {
    return 0;
  }
  return pid;
}

// No holdfastd at the endpoint: after waiting the call's timeout for one to come
// up (a restart is ridden out), the error names the endpoint and says what to check.
TEST(CliReachTest, NoHoldfastdAtTheEndpointNamesItAndHints) {
  char tmpl[] = "/tmp/hf-cli-reach-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  // Held bound for the test: a port only picked free could be taken meanwhile by
  // an etcd of a test running beside, which answers "unknown service".
  dev::RefusingEndpoint nobody;
  ASSERT_NE(nobody.port(), 0);
  const std::string endpoint = nobody.address();
  auto p = CliProcess::Start(dir, endpoint, {"ns", "list"});
  ASSERT_NE(p, nullptr);
  CliResult r = p->Finish(seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("ns list: DEADLINE_EXCEEDED: no connection to holdfastd at " + endpoint),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("is holdfastd running at the endpoint?"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// holdfastd's own UNAVAILABLE (here: its etcd is gone) is shown as it is: holdfastd
// is running, so the hint would mislead.
TEST(CliReachTest, HoldfastdsOwnUnavailableComesWithoutTheHint) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  (*cluster)->etcd().Stop();
  auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                             {"lock", "--wait", "0", "default/cli/no-etcd", "--", "true"});
  ASSERT_NE(p, nullptr);
  CliResult r = p->Finish(seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("no connection to holdfastd"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("is holdfastd running"), std::string::npos) << r.err;
}

// `audit --follow` outlives a holdfastd restart longer than the call timeout
// (10 s): it says so once, then goes on from the last event it printed.
TEST(CliReachTest, AuditFollowWaitsOutAHoldfastdRestart) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  const std::string dir = (*cluster)->dir();
  const std::string endpoint = (*cluster)->endpoint();
  auto follow = CliProcess::Start(dir, endpoint,
                                  {"audit", "--follow", "--key", "cli/restarted", "-o", "json"});
  ASSERT_NE(follow, nullptr);
  auto lock = [&] {
    auto p = CliProcess::Start(dir, endpoint, {"lock", "default/cli/restarted", "--", "true"});
    return p ? p->Finish().exit_code : -1;
  };
  auto lines = [&] {
    std::string out = follow->Output();
    return std::count(out.begin(), out.end(), '\n');
  };
  ASSERT_EQ(lock(), 0);
  ASSERT_TRUE(WaitFor([&] { return lines() >= 2; }, seconds(60))) << follow->Output();
  (*cluster)->holdfastd().Stop();
  std::this_thread::sleep_for(seconds(12));
  ASSERT_TRUE((*cluster)->holdfastd().Restart().ok());
  ASSERT_EQ(lock(), 0);
  EXPECT_TRUE(WaitFor([&] { return lines() >= 4; }, seconds(60))) << follow->Output();
  follow->Signal(SIGTERM);
  CliResult r = follow->Finish();
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4) << r.out;
  EXPECT_NE(r.err.find("retrying every second"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("following again"), std::string::npos) << r.err;
}

// A --wait that ends because holdfastd went away is an error (1), not "held
// elsewhere" (75): nothing answered that the lock was busy. The call gives up
// after --wait plus the call timeout for a reconnect, here long before the
// session's local deadline (a 60 s TTL); a session lost first ends the wait with
// "session lost while waiting", also 1. It then closes the session within 2 s,
// not the call timeout: at most 8 + 10 + 2 s after it started. (It took 28 s
// after the kill when a retry waited anew and the close waited 10 s.)
TEST(CliReachTest, AWaitThatLostHoldfastdIsAnErrorNotABusyLock) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  const std::string pid_file = (*cluster)->dir() + "/holder-pid";
  auto holder = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                                  {"lock", "default/cli/gone", "--", "sh", "-c",
                                   "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(holder, nullptr);
  ASSERT_GT(CommandPid(pid_file), 0) << "the holder's command never ran";
  const std::string ran = (*cluster)->dir() + "/waiter-ran";
  auto waiter = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                                  {"lock", "--ttl", "60s", "--wait", "8s", "default/cli/gone", "--",
                                   "touch", ran});
  ASSERT_NE(waiter, nullptr);
  // Killed only once the waiter is queued behind the holder: before, the CLI
  // would fail opening its session (1 with the old code too).
  auto client = (*cluster)->NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto d = (*client)->Describe("default", "cli/gone");
        return d.ok() && d->waiters_size() == 1;
      },
      seconds(7)))
      << "the waiter never queued";
  (*cluster)->holdfastd().Kill();
  const auto killed_at = std::chrono::steady_clock::now();
  CliResult r = waiter->Finish(seconds(60));
  const auto took = std::chrono::steady_clock::now() - killed_at;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(took, seconds(23)) << r.err;
  EXPECT_NE(r.err.find("no connection to holdfastd"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("not granted within --wait"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(ran));
  holder->Finish(seconds(60));
}

TEST(CliLostHoldTest, LostHoldStopsTheCommandAndExits74) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  std::string pid_file = (*cluster)->dir() + "/lost-pid";
  auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                             {"lock", "--ttl", "2s", "--grace", "1s", "default/cli/lost", "--",
                              "sh", "-c", "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;

  // With holdfastd gone no renewal is confirmed: the session is lost once its
  // local deadline (under 2s after the last renewal) passes.
  (*cluster)->holdfastd().Kill();
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("lost the hold on default/cli/lost"), std::string::npos) << r.err;
  EXPECT_EQ(::kill(command_pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// Whether `pid` has ended: gone, or a zombie waiting for whoever adopted it.
bool Ended(pid_t pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  auto p = dev::ReadProcState(pid);
  return p && p->state == 'Z';
}

// The command's process group, killed if a test left it running.
void KillLeftover(pid_t command_pid) {
  if (command_pid > 0 && !Ended(command_pid)) ::kill(-command_pid, SIGKILL);
}

// A signal holdfast passes on stops the whole group, not only CMD: the lock is
// released once the group is gone. A process still finishing its work after the
// SIGTERM (a worker flushing a batch) ends before the release; one that ignores
// the signal gets SIGKILL after --grace. holdfast used to release as soon as CMD
// (the shell) died, with both still running.
TEST_F(CliTest, ASignalPassedOnIsFollowedByTheWholeGroupBeforeTheRelease) {
  const std::string pid_file = Path("group-stop-pid");
  const std::string done = Path("group-stop-done");
  // The shell started by the command flushes for a second after SIGTERM.
  const std::string flushing = "trap 'sleep 1; echo flushed > \"" + done +
                               "\"; exit 0' TERM; echo $$ > '" + pid_file +
                               "'; while :; do sleep 0.1; done";
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--grace", "20s", "default/cli/group-stop", "--", "sh",
                              "-c", "sh -c \"$0\" & wait", flushing});
  ASSERT_NE(p, nullptr);
  pid_t worker = CommandPid(pid_file);
  ASSERT_GT(worker, 0) << "the worker never wrote its pid to " << pid_file;
  p->Signal(SIGTERM);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(FileExists(done)) << "the lock was let go while the worker still flushed";
  EXPECT_TRUE(Ended(worker));
  auto d = client_->Describe("default", "cli/group-stop");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  if (!Ended(worker)) ::kill(worker, SIGKILL);

  // One that ignores SIGTERM: SIGKILL after --grace, then the release.
  std::filesystem::remove(pid_file);
  const std::string stubborn = "trap '' TERM; echo $$ > '" + pid_file + "'; exec sleep 60";
  p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                        {"lock", "--grace", "1s", "default/cli/group-stop", "--", "sh", "-c",
                         "sh -c \"$0\" & wait", stubborn});
  ASSERT_NE(p, nullptr);
  worker = CommandPid(pid_file);
  ASSERT_GT(worker, 0) << "the worker never wrote its pid to " << pid_file;
  p->Signal(SIGTERM);
  r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(WaitFor([&] { return Ended(worker); }, seconds(5)))
      << "pid " << worker << " outlived the release";
  d = client_->Describe("default", "cli/group-stop");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  if (!Ended(worker)) ::kill(worker, SIGKILL);
}

// A hold that ended in etcd while CMD ran (released, expired or forced), before
// any renewal answer said so: the release at CMD's exit finds it not current, and
// the exit code is 74, not CMD's 0: CMD may have run without the lock.
TEST_F(CliTest, AHoldFoundNotCurrentAtTheReleaseExits74) {
  const std::string go = MakeGoFifo(Path("not-current-go"));
  // Renewals every 10 s: the command ends long before one says the hold ended.
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--ttl", "30s", "default/cli/not-current", "--", "sh",
                              "-c", "read _ < '" + go + "'"});
  ASSERT_NE(p, nullptr);
  int64_t session = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto d = client_->Describe("default", "cli/not-current");
        if (!d.ok() || d->holders_size() != 1) return false;
        session = d->holders(0).session_id();
        return true;
      },
      seconds(30)));
  pb::DeleteRangeRequest del;
  del.set_key(keyspace::HoldKey("default", "cli/not-current", session));
  auto deleted = cluster_->etcd_client().DeleteRangeSync(del, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ASSERT_EQ(deleted->deleted(), 1);
  GoOn(go);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("the hold on default/cli/not-current was no longer current when the "
                       "command ended"),
            std::string::npos)
      << r.err;
}

// Output that cannot be written is an error, not a listing cut short that exits
// 0: a full disk, a reader that went away. A follow whose reader went away
// (`audit -f | grep -m1 force`) ends instead of polling on forever.
TEST_F(CliTest, OutputThatCannotBeWrittenIsAnErrorAndEndsAFollow) {
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(), {"ns", "list", "-o", "json"},
                             "", {{"HF_TEST_OUT", "/dev/full"}});
  ASSERT_NE(p, nullptr);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "holdfast: writing the output failed (stdout closed or full): it is "
                   "incomplete\n");

  ASSERT_EQ(Run({"lock", "default/cli/follow-gone", "--", "true"}).exit_code, 0);
  const std::string fifo = Path("follow-gone");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(), {"audit", "-f", "-o", "json"}, "",
                        {{"HF_TEST_OUT", fifo}});
  ASSERT_NE(p, nullptr);
  // Following (it has written the cycle above), then the reader goes.
  pollfd readable{reader, POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 30'000), 1) << "the follow wrote nothing";
  ::close(reader);
  ASSERT_EQ(Run({"lock", "default/cli/follow-gone", "--", "true"}).exit_code, 0);
  r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("writing the output failed"), std::string::npos) << r.err;
}

// The CLI session's lease revoked straight on etcd: holdfastd reports the session
// gone on its next renewal, and the hold is lost, with holdfastd still answering
// (the shared cluster stays usable).
void RevokeHoldersSession(TestCluster& cluster, Client& client, const std::string& key) {
  auto d = client.Describe("default", key);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1) << d->DebugString();
  pb::LeaseRevokeRequest revoke;
  revoke.set_id(d->holders(0).session_id());
  ASSERT_TRUE(etcd::Await<pb::LeaseRevokeResponse>([&](auto cb) {
                cluster.etcd_client().LeaseRevoke(revoke, etcd::DeadlineIn(seconds(5)), cb);
              }).ok());
}

// With stderr a pipe nobody reads any more, the message about the loss cannot be
// written. holdfast used to print it before stopping the command, and died of
// SIGPIPE there: the command ran on without the lock. It stops the command first,
// and ignores SIGPIPE.
TEST_F(CliTest, ALostHoldStopsTheCommandEvenWithStderrABrokenPipe) {
  const std::string fifo = Path("broken-stderr");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // A reader, so that holdfast's shell can open the FIFO for writing.
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  const std::string pid_file = Path("broken-stderr-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--ttl", "2s", "--grace", "1s", "default/cli/broken-stderr",
                              "--", "sh", "-c", "echo $$ > '" + pid_file + "'; exec sleep 60"},
                             "", {{"HF_TEST_ERR", fifo}});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ::close(reader);  // holdfast's stderr is now a broken pipe
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;

  ASSERT_NO_FATAL_FAILURE(RevokeHoldersSession(*cluster_, *client_, "cli/broken-stderr"));
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << "128+13 is death by SIGPIPE";
  EXPECT_TRUE(WaitFor([&] { return Ended(command_pid); }, seconds(5)))
      << "the command outlived the lost hold";
  KillLeftover(command_pid);
}

// With stderr a pipe nobody reads that is full (a pager not paging, a stalled
// journal), the message about the loss blocks holdfast's main thread. The
// SIGKILL after --grace comes from a thread of its own: the command, which
// ignores SIGTERM, does not run on without the lock while holdfast waits to
// write.
TEST_F(CliTest, ALostHoldKillsTheCommandEvenWithStderrAFullPipe) {
  const std::string fifo = Path("full-stderr");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // never read
  ASSERT_GE(reader, 0) << std::strerror(errno);
  const std::string pid_file = Path("full-stderr-pid");
  // The command fills the pipe (a writer in its group blocks once it is full),
  // then sleeps, ignoring SIGTERM.
  auto p = CliProcess::Start(
      cluster_->dir(), cluster_->endpoint(),
      {"lock", "--ttl", "2s", "--grace", "1s", "default/cli/full-stderr", "--", "sh", "-c",
       "trap '' TERM; head -c 200000 /dev/zero >&2 & echo $$ > '" + pid_file +
           "'; exec sleep 60"},
      "", {{"HF_TEST_ERR", fifo}});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;
  ASSERT_NO_FATAL_FAILURE(RevokeHoldersSession(*cluster_, *client_, "cli/full-stderr"));
  EXPECT_TRUE(WaitFor([&] { return Ended(command_pid); }, seconds(15)))
      << "the command outlived the lost hold while holdfast could not write";
  ::close(reader);  // holdfast's write fails now, and it goes on
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74);
  KillLeftover(command_pid);
}

// holdfast killed outright cannot stop its command: the kernel does
// (PR_SET_PDEATHSIG). Without that, the command ran on, orphaned, without the lock.
TEST_F(CliTest, ACommandDoesNotOutliveAKilledHoldfast) {
  const std::string pid_file = Path("sigkill-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--ttl", "2s", "default/cli/sigkill", "--", "sh", "-c",
                              "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;
  p->Signal(SIGKILL);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return Ended(command_pid); }, seconds(5)))
      << "pid " << command_pid << " outlived holdfast";
  KillLeftover(command_pid);
}

// Nor does what the command started in its group: a guard holdfast put there
// kills the group when holdfast dies.
TEST_F(CliTest, WhatTheCommandStartedDoesNotOutliveAKilledHoldfast) {
  const std::string pid_file = Path("sigkill-grandchild-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--ttl", "2s", "default/cli/sigkill-group", "--", "sh",
                              "-c", "sleep 60 & echo $! > '" + pid_file + "'; wait"});
  ASSERT_NE(p, nullptr);
  const pid_t worker = CommandPid(pid_file);
  ASSERT_GT(worker, 0) << "the command never wrote its worker's pid to " << pid_file;
  p->Signal(SIGKILL);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return Ended(worker); }, seconds(5)))
      << "pid " << worker << ", started by the command, outlived holdfast";
  if (!Ended(worker)) ::kill(worker, SIGKILL);
}

// Ctrl-Z (SIGTSTP) stops the command and then holdfast, as a shell's job control
// expects: nothing runs on under a lock nobody renews. Continued soon, both run
// on with the lock; continued past the session's deadline, the command gets its
// SIGTERM before it runs again, and holdfast exits 74.
TEST_F(CliTest, JobControlStopsTheCommandWithHoldfast) {
  const std::string pid_file = Path("tstp-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "--ttl", "2s", "default/cli/tstp", "--", "sh", "-c",
                              "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;
  auto state = [](pid_t pid) {
    auto s = dev::ReadProcState(pid);
    return s ? s->state : '?';
  };
  auto both_stopped = [&] { return state(command_pid) == 'T' && state(p->pid()) == 'T'; };
  p->Signal(SIGTSTP);
  ASSERT_TRUE(WaitFor(both_stopped, seconds(10)))
      << "holdfast " << state(p->pid()) << ", command " << state(command_pid);
  p->Signal(SIGCONT);
  ASSERT_TRUE(WaitFor([&] { return state(command_pid) == 'S' && state(p->pid()) != 'T'; },
                      seconds(10)))
      << "holdfast " << state(p->pid()) << ", command " << state(command_pid);
  auto d = client_->Describe("default", "cli/tstp");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 1);

  p->Signal(SIGTSTP);
  ASSERT_TRUE(WaitFor(both_stopped, seconds(10)));
  std::this_thread::sleep_for(milliseconds(2500));  // past the 2 s session's deadline
  EXPECT_EQ(state(command_pid), 'T') << "the command ran on while holdfast was stopped";
  p->Signal(SIGCONT);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("lost the hold on default/cli/tstp"), std::string::npos) << r.err;
  EXPECT_TRUE(Ended(command_pid));
  KillLeftover(command_pid);
}

// How the test's stand-in for an interactive shell runs holdfast on a terminal
// of its own (a pty).
enum class Job {
  kForeground,     // a job: a process group of its own, the terminal's foreground
  kBackground,     // a job started with `&`: a group of its own, in the background
  kWithGroupMate,  // foreground, with another process in its group (a pipeline)
  kSessionLeader,  // no shell: holdfast leads the terminal's session (`ssh -t host ...`)
  kShellExitsLater,  // a job started with `&` by a shell that exits while it runs
  kForegroundShellExitsLater,  // the same, but a job in the foreground
  kScript,           // run by a script, itself the shell's job: in the script's group
};

// For Job::k*ShellExitsLater: the forkpty child stays the terminal's session
// leader and starts a shell (a process group of its own, as a nested shell),
// which starts holdfast as a job, in the background or the foreground, and writes
// its pid to `report_fd`. On 'x' the shell is killed: holdfast's group is
// orphaned, its parent now in another session. The session leader then waits to
// be killed.
[[noreturn]] void RunShellThatExits(bool foreground, char** argv, char** envp, int report_fd,
                                    int control_fd) {
  const pid_t leader = ::getpid();
  const pid_t shell = ::fork();
  if (shell == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left paused when the leader is killed
    if (::getppid() != leader) ::_exit(0);
    ::setpgid(0, 0);
    ::signal(SIGTTOU, SIG_IGN);  // it gives the terminal away from the background
    const pid_t holdfast = ::fork();
    if (holdfast == 0) {
      ::setpgid(0, 0);
      if (foreground) ::tcsetpgrp(STDIN_FILENO, ::getpid());
      ::signal(SIGTTOU, SIG_DFL);
      ::execve(argv[0], argv, envp);
      ::_exit(127);
    }
    ::setpgid(holdfast, holdfast);
    if (foreground) ::tcsetpgrp(STDIN_FILENO, holdfast);
    (void)!::write(report_fd, &holdfast, sizeof holdfast);
    for (;;) ::pause();
  }
  char c = 0;
  while (::read(control_fd, &c, 1) == 1 && c != 'x') {
  }
  ::kill(shell, SIGKILL);
  ::waitpid(shell, nullptr, 0);
  for (;;) ::pause();
}

// The forkpty child: the terminal's session leader and a job-control shell with
// one job, holdfast. It writes holdfast's pid to `report_fd`, then a 'T' each
// time the job stops, when it takes the terminal back, as a shell does; on 'f'
// (`fg`) it gives the terminal to the job and continues it if it is stopped, on
// 'b' (`bg`) continues it alone if it is stopped, as bash and zsh do; on 'F'
// (`fg` of a shell that continues a running job too) it gives the terminal and
// sends SIGCONT either way. It exits as holdfast exits (dies of the same signal).
// Only async-signal-safe calls: the test process has threads.
[[noreturn]] void RunShell(Job job, char** argv, char** envp, int report_fd, int control_fd) {
  if (job == Job::kShellExitsLater || job == Job::kForegroundShellExitsLater) {
    RunShellThatExits(job == Job::kForegroundShellExitsLater, argv, envp, report_fd,
                      control_fd);
  }
  ::signal(SIGTTOU, SIG_IGN);  // it hands the terminal around from any group
  const pid_t shell_group = ::getpgrp();
  const pid_t holdfast = ::fork();
  if (holdfast == 0) {
    ::setpgid(0, 0);
    if (job != Job::kBackground) ::tcsetpgrp(STDIN_FILENO, ::getpid());
    ::signal(SIGTTOU, SIG_DFL);
    ::execve(argv[0], argv, envp);
    ::_exit(127);
  }
  ::setpgid(holdfast, holdfast);
  if (job != Job::kBackground) ::tcsetpgrp(STDIN_FILENO, holdfast);
  if (job == Job::kWithGroupMate) {
    const pid_t shell = ::getpid();
    const pid_t mate = ::fork();
    if (mate == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left paused when the shell is killed
      if (::getppid() != shell) ::_exit(0);
      ::setpgid(0, holdfast);
      for (;;) ::pause();
    }
    ::setpgid(mate, holdfast);  // by both, as shells do: whichever runs first
  }
  (void)!::write(report_fd, &holdfast, sizeof holdfast);
  bool stopped = false;
  for (;;) {
    pollfd p{control_fd, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      char c = 0;
      if (::read(control_fd, &c, 1) != 1) control_fd = -1;  // the test is gone
      if (c == 'f' || c == 'F') ::tcsetpgrp(STDIN_FILENO, holdfast);
      if (((c == 'f' || c == 'b') && stopped) || c == 'F') ::kill(-holdfast, SIGCONT);
      if (c == 'f' || c == 'b' || c == 'F') stopped = false;
    }
    int status = 0;
    if (::waitpid(holdfast, &status, WNOHANG | WUNTRACED) != holdfast) continue;
    if (WIFSTOPPED(status)) {
      stopped = true;
      ::tcsetpgrp(STDIN_FILENO, shell_group);
      (void)!::write(report_fd, "T", 1);
      continue;
    }
    if (job == Job::kWithGroupMate) ::kill(-holdfast, SIGKILL);  // the mate
    if (WIFSIGNALED(status)) {
      ::signal(WTERMSIG(status), SIG_DFL);
      ::kill(::getpid(), WTERMSIG(status));
    }
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
}

// holdfast on a terminal of its own, as run by RunShell (or alone, as the
// session's leader). The test types into the terminal and reads what it shows.
class TerminalProcess {
 public:
  static std::unique_ptr<TerminalProcess> Start(const std::string& endpoint,
                                                const std::string& dir,
                                                const std::vector<std::string>& args,
                                                Job job = Job::kForeground) {
    std::vector<std::string> argv = {BinDir() + "/holdfast", "--endpoint", endpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    if (job == Job::kScript) {
      // The script waits for holdfast (it does not exec it: more follows).
      argv.insert(argv.begin(), {"/bin/sh", "-c", "\"$0\" \"$@\"; exit $?"});
    }
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!absl::StartsWith(*e, "HOLDFAST_DEV_DIR=")) env.push_back(*e);
    }
    env.push_back("HOLDFAST_DEV_DIR=" + dir + "/no-dev-dir");
    // Built before the fork: the child may only exec.
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    int report[2], control[2];
    if (::pipe2(report, O_CLOEXEC) != 0 || ::pipe2(control, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return nullptr;
    }
    int master = -1;
    const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
    if (pid == 0) {
      if (job == Job::kSessionLeader) {
        ::execve(cargv[0], cargv.data(), cenv.data());
        ::_exit(127);
      }
      RunShell(job, cargv.data(), cenv.data(), report[1], control[0]);
    }
    ::close(report[1]);
    ::close(control[0]);
    EXPECT_GT(pid, 0) << std::strerror(errno);
    if (pid <= 0) {
      ::close(report[0]);
      ::close(control[1]);
      return nullptr;
    }
    auto p = std::unique_ptr<TerminalProcess>(new TerminalProcess());
    p->pid_ = p->holdfast_ = pid;
    p->master_ = master;
    p->control_ = control[1];
    if (job != Job::kSessionLeader &&
        ::read(report[0], &p->holdfast_, sizeof p->holdfast_) != sizeof p->holdfast_) {
      ADD_FAILURE() << "the shell did not start holdfast";
    }
    p->report_ = report[0];
    return p;
  }
  ~TerminalProcess() {
    if (!exit_code_) {
      ::kill(holdfast_, SIGKILL);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(master_);
    ::close(control_);
    ::close(report_);
  }

  pid_t pid() const { return holdfast_; }
  // The terminal's foreground group (-1 when unknown).
  pid_t ForegroundGroup() const {
    auto s = dev::ReadProcState(pid_);
    return s ? s->terminal_group : -1;
  }
  // Whether the shell saw its job (holdfast) stop, once per stop, within `timeout`.
  bool JobStopped(milliseconds timeout = seconds(10)) {
    pollfd p{report_, POLLIN, 0};
    char c = 0;
    return ::poll(&p, 1, static_cast<int>(timeout.count())) > 0 && ::read(report_, &c, 1) == 1 &&
           c == 'T';
  }
  // The shell's `fg` and `bg` of holdfast; FgWithSigcont(), `fg` of a shell
  // that continues a running job too.
  void Fg() { EXPECT_EQ(::write(control_, "f", 1), 1); }
  void FgWithSigcont() { EXPECT_EQ(::write(control_, "F", 1), 1); }
  // Job::kShellExitsLater: the shell that started holdfast exits.
  void ExitShell() { EXPECT_EQ(::write(control_, "x", 1), 1); }
  void Bg() { EXPECT_EQ(::write(control_, "b", 1), 1); }
  void Type(const std::string& text) {
    EXPECT_EQ(::write(master_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // Reads what the terminal shows until it has shown `want` (true), or until
  // `timeout` (a liveness bound) passes.
  bool Shows(const std::string& want, milliseconds timeout = seconds(30)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (shown_.find(want) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= until) return false;
      ReadFor(milliseconds(50));
    }
    return true;
  }
  const std::string& shown() const { return shown_; }
  // After Wait(): the signal holdfast died of (0: it exited).
  int killed_by() const { return killed_by_; }
  // The exit code (128 + signal when killed), reading the terminal meanwhile;
  // nullopt if it did not exit within `timeout`.
  std::optional<int> Wait(milliseconds timeout = seconds(30)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (!exit_code_ && std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        killed_by_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      } else {
        ReadFor(milliseconds(20));
      }
    }
    return exit_code_;
  }

 private:
  TerminalProcess() = default;
  void ReadFor(milliseconds timeout) {
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return;
    char buf[4096];
    const ssize_t n = ::read(master_, buf, sizeof buf);
    if (n > 0) {
      shown_.append(buf, static_cast<size_t>(n));
    } else {
      std::this_thread::sleep_for(timeout);  // EIO: the terminal's last process is gone
    }
  }

  pid_t pid_ = -1;       // the forkpty child: the shell, or holdfast as session leader
  pid_t holdfast_ = -1;
  int master_ = -1;
  int control_ = -1;
  int report_ = -1;
  std::string shown_;
  std::optional<int> exit_code_;
  int killed_by_ = 0;
};

// A process's state letter from /proc ('T': stopped; '?': gone).
char StateOf(pid_t pid) {
  auto s = dev::ReadProcState(pid);
  return s ? s->state : '?';
}

// `holdfast lock default/cli/KEY` on a terminal of its own, its command running
// `before_asking` (shell code), then asking a question ("proceed? ") and echoing
// the answer ("got:ANSWER"). Returned with the command's pid (null and 0 when it
// did not start) once the command runs, and when `before_asking` is empty and
// the job is in the foreground, once the question shows.
std::pair<std::unique_ptr<TerminalProcess>, pid_t> LockAndAsk(
    TestCluster& cluster, const std::string& key, Job job = Job::kForeground,
    const std::string& before_asking = "") {
  const std::string pid_file = cluster.dir() + "/" + key + "-pid";
  auto p = TerminalProcess::Start(cluster.endpoint(), cluster.dir(),
                                  {"lock", "default/cli/" + key, "--", "sh", "-c",
                                   "echo $$ > '" + pid_file + "'; " + before_asking +
                                       "printf 'proceed? '; read answer; echo \"got:$answer\""},
                                  job);
  if (p == nullptr) return {nullptr, 0};
  const pid_t command_pid = CommandPid(pid_file);
  const bool asks_at_once = before_asking.empty() && job != Job::kBackground;
  if (command_pid <= 0 || (asks_at_once && !p->Shows("proceed? "))) {
    ADD_FAILURE() << "the command did not ask: " << p->shown();
    return {std::move(p), 0};
  }
  return {std::move(p), command_pid};
}

// Run by a shell as a job in the foreground, holdfast lends the terminal to the
// command: a command that asks a question reads the answer. (It used to run in a
// background group of the terminal, so its read stopped it, SIGTTIN, holding the
// lock.)
TEST_F(CliTest, TheCommandReadsTheTerminalHoldfastWasStartedIn) {
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto d = client_->Describe("default", "cli/tty");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 1);
  // (Lent just after the command starts: it may ask before that.)
  EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)));
  p->Type("yes\n");
  EXPECT_TRUE(p->Shows("got:yes")) << p->shown() << " (command state " << StateOf(command_pid)
                                   << ")";
  EXPECT_EQ(p->Wait(), 0) << p->shown();
  d = client_->Describe("default", "cli/tty");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// Ctrl-Z typed in the terminal goes to the command (the foreground group): the
// command stops, and holdfast stops with it, as the shell's job; `fg` continues
// holdfast, which lends the terminal to the command again and continues it.
TEST_F(CliTest, CtrlZInTheTerminalStopsTheCommandAndHoldfast) {
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty-tstp");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto state = StateOf;
  p->Type("\x1a");  // Ctrl-Z
  EXPECT_TRUE(p->JobStopped()) << "the shell did not see its job stop";
  EXPECT_TRUE(WaitFor([&] { return state(command_pid) == 'T' && state(p->pid()) == 'T'; },
                      seconds(10)))
      << "holdfast " << state(p->pid()) << ", command " << state(command_pid);
  p->Fg();
  EXPECT_TRUE(WaitFor([&] { return state(command_pid) != 'T' && state(p->pid()) != 'T'; },
                      seconds(10)))
      << "holdfast " << state(p->pid()) << ", command " << state(command_pid);
  EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)));
  p->Type("yes\n");
  EXPECT_TRUE(p->Shows("got:yes")) << p->shown();
  EXPECT_EQ(p->Wait(), 0) << p->shown();
  auto d = client_->Describe("default", "cli/tty-tstp");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// After Ctrl-Z and `bg`, the command runs on in the background; its read of the
// terminal stops it, and holdfast with it, as any background job; `fg` lends the
// terminal again.
TEST_F(CliTest, AfterBgAReadOfTheTerminalStopsTheJobUntilFg) {
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty-bg");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto both_stopped = [&] { return StateOf(command_pid) == 'T' && StateOf(p->pid()) == 'T'; };
  p->Type("\x1a");  // Ctrl-Z
  ASSERT_TRUE(p->JobStopped());
  ASSERT_TRUE(WaitFor(both_stopped, seconds(10)));
  p->Bg();  // the command's `read` runs on in the background, and is stopped (SIGTTIN)
  EXPECT_TRUE(p->JobStopped()) << "holdfast " << StateOf(p->pid()) << ", command "
                               << StateOf(command_pid);
  EXPECT_TRUE(WaitFor(both_stopped, seconds(10)))
      << "holdfast " << StateOf(p->pid()) << ", command " << StateOf(command_pid);
  EXPECT_NE(p->ForegroundGroup(), command_pid);
  p->Fg();
  EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)));
  p->Type("yes\n");
  EXPECT_TRUE(p->Shows("got:yes")) << p->shown();
  EXPECT_EQ(p->Wait(), 0) << p->shown();
  KillLeftover(command_pid);
}

// Started with `&`, holdfast leaves the terminal to the shell; `fg` of it while
// the command runs lends the terminal to the command, which can then read it,
// with no stop of the job: at once from a shell that sends the running job
// SIGCONT, else when the command reads the terminal (bash and zsh only give a
// running job the terminal: the command's read, stopped for it, used to stop the
// job, and only a second `fg` lent the terminal).
class CliFgOfARunningJobTest : public CliTest, public ::testing::WithParamInterface<bool> {};

TEST_P(CliFgOfARunningJobTest, LendsTheTerminalToTheCommand) {
  const bool sigcont = GetParam();
  const std::string key = sigcont ? "tty-fg-cont" : "tty-fg";
  const std::string go = Path(key + "-go");
  auto [p, command_pid] = LockAndAsk(*cluster_, key, Job::kBackground,
                                     "until [ -e '" + go + "' ]; do sleep 0.05; done; ");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto d = client_->Describe("default", "cli/" + key);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 1);
  EXPECT_NE(p->ForegroundGroup(), command_pid) << "taken from the shell";
  EXPECT_NE(p->ForegroundGroup(), p->pid()) << "taken from the shell";
  if (sigcont) {
    p->FgWithSigcont();
    EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)))
        << p->ForegroundGroup();
  } else {
    p->Fg();
    EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == p->pid(); }, seconds(10)))
        << p->ForegroundGroup();
  }
  std::ofstream(go).put('\n');
  EXPECT_TRUE(p->Shows("proceed? ")) << p->shown();
  EXPECT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)))
      << p->ForegroundGroup();
  p->Type("yes\n");
  EXPECT_TRUE(p->Shows("got:yes")) << p->shown() << " (command state " << StateOf(command_pid)
                                   << ")";
  EXPECT_EQ(p->Wait(), 0) << p->shown();
  EXPECT_FALSE(p->JobStopped(milliseconds(0))) << "the job stopped";
  KillLeftover(command_pid);
}

INSTANTIATE_TEST_SUITE_P(StartedInTheBackground, CliFgOfARunningJobTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "ShellSendsSigcont" : "ShellSendsNoSigcont";
                         });

// Ctrl-C typed in the terminal goes to the command; holdfast releases and then dies
// of SIGINT itself, so that a shell script running it stops as it would had
// holdfast received the Ctrl-C (an exit code of 130 would tell it "handled").
TEST_F(CliTest, CtrlCInTheTerminalEndsTheCommandAndThenHoldfastBySigint) {
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty-int");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  // (Lent just after the command starts: it may ask before that.)
  ASSERT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)))
      << "the terminal was not lent";
  p->Type("\x03");  // Ctrl-C
  EXPECT_EQ(p->Wait(), 128 + SIGINT) << p->shown();
  EXPECT_EQ(p->killed_by(), SIGINT) << p->shown();
  EXPECT_EQ(p->shown().find("got:"), std::string::npos) << p->shown();
  auto d = client_->Describe("default", "cli/tty-int");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// Where lending the terminal could stop holdfast with no shell to continue it
// (the session's leader), or stop it through a process of its group (a pipeline
// mate reading the terminal from the background), holdfast keeps the terminal:
// the command runs in a background group of it, where its read stops it alone,
// the lock held; Ctrl-C goes to holdfast, which passes it on and exits 130.
class CliTerminalKeptTest : public CliTest, public ::testing::WithParamInterface<Job> {};

TEST_P(CliTerminalKeptTest, TheCommandsReadStopsItAloneAndCtrlCIsForwarded) {
  const std::string key = GetParam() == Job::kSessionLeader ? "tty-leader" : "tty-mate";
  auto [p, command_pid] = LockAndAsk(*cluster_, key, GetParam());
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  EXPECT_TRUE(WaitFor([&] { return StateOf(command_pid) == 'T'; }, seconds(10)))
      << "command " << StateOf(command_pid);
  EXPECT_EQ(p->ForegroundGroup(), p->pid()) << "lent";
  std::this_thread::sleep_for(milliseconds(300));  // a stop to mirror would be seen by now
  EXPECT_NE(StateOf(p->pid()), 'T') << "holdfast stopped with its command";
  if (GetParam() == Job::kSessionLeader) {
    // No shell could continue holdfast: Ctrl-Z, to its group, stops nothing, as
    // the kernel would not stop an orphaned group. (It used to stop holdfast, for
    // good, and the lock lapsed.)
    p->Type("\x1a");
    std::this_thread::sleep_for(milliseconds(300));  // a stop would be seen by now
    EXPECT_NE(StateOf(p->pid()), 'T') << "stopped with nobody to continue it";
  }
  auto d = client_->Describe("default", "cli/" + key);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 1);
  p->Type("\x03");  // Ctrl-C, to holdfast's group
  EXPECT_EQ(p->Wait(), 128 + SIGINT) << p->shown();
  EXPECT_EQ(p->killed_by(), 0) << "holdfast died of the signal it had to pass on";
  d = client_->Describe("default", "cli/" + key);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

INSTANTIATE_TEST_SUITE_P(NotAJobOfItsOwn, CliTerminalKeptTest,
                         ::testing::Values(Job::kSessionLeader, Job::kWithGroupMate),
                         [](const auto& info) {
                           return info.param == Job::kSessionLeader ? "SessionLeader"
                                                                    : "PipelineMate";
                         });

// Run by a script that a shell runs as a job, holdfast shares the script's
// process group and keeps the terminal (not a job of its own). Ctrl-Z, to that
// group, stops the command and holdfast with the script: the group is not
// orphaned, the script's parent (the shell) can continue it, and `fg` continues
// all three. (For a while holdfast judged by its own parent alone, in the same
// group, and ignored Ctrl-Z there.)
TEST_F(CliTest, RunByAScriptCtrlZStopsTheCommandHoldfastAndTheScript) {
  const std::string pid_file = Path("tty-script-pid");
  const std::string go = MakeGoFifo(Path("tty-script-go"));
  auto p = TerminalProcess::Start(
      cluster_->endpoint(), cluster_->dir(),
      {"lock", "default/cli/tty-script", "--", "sh", "-c",
       "echo $$ > '" + pid_file + "'; read _ < '" + go + "'; echo finished"},
      Job::kScript);
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto command = dev::ReadProcState(command_pid);
  ASSERT_TRUE(command.has_value());
  const pid_t holdfast = command->parent;
  ASSERT_NE(holdfast, p->pid()) << "holdfast is the script's child";
  EXPECT_EQ(p->ForegroundGroup(), p->pid()) << "the script's group has the terminal";
  p->Type("\x1a");  // Ctrl-Z
  EXPECT_TRUE(p->JobStopped()) << "the shell did not see the script stop";
  EXPECT_TRUE(WaitFor([&] { return StateOf(command_pid) == 'T' && StateOf(holdfast) == 'T'; },
                      seconds(10)))
      << "holdfast " << StateOf(holdfast) << ", command " << StateOf(command_pid);
  p->Fg();
  EXPECT_TRUE(WaitFor([&] { return StateOf(command_pid) != 'T' && StateOf(holdfast) != 'T'; },
                      seconds(10)))
      << "holdfast " << StateOf(holdfast) << ", command " << StateOf(command_pid);
  GoOn(go);
  EXPECT_TRUE(p->Shows("finished")) << p->shown();
  EXPECT_EQ(p->Wait(), 0) << p->shown();
  auto d = client_->Describe("default", "cli/tty-script");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// Once the shell that started holdfast has exited (holdfast's group orphaned: no
// shell could continue it), the command's read of the terminal stops the command
// alone: holdfast runs on, keeps the lock, and still passes signals on. (It used
// to stop itself with the command, for good, and the lock lapsed.)
TEST_F(CliTest, AfterItsShellExitedTheCommandsReadStopsTheCommandAlone) {
  const std::string go = Path("tty-orphan-go");
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty-orphan", Job::kShellExitsLater,
                                     "until [ -e '" + go + "' ]; do sleep 0.05; done; ");
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  auto parent = [&] {
    auto s = dev::ReadProcState(p->pid());
    return s ? s->parent : 0;
  };
  const pid_t shell = parent();
  ASSERT_GT(shell, 0);
  p->ExitShell();
  ASSERT_TRUE(WaitFor([&] { return parent() != shell; }, seconds(10)));
  std::ofstream(go).put('\n');
  EXPECT_TRUE(WaitFor([&] { return StateOf(command_pid) == 'T'; }, seconds(10)))
      << "command " << StateOf(command_pid);
  std::this_thread::sleep_for(milliseconds(300));  // a stop to mirror would be seen by now
  EXPECT_NE(StateOf(p->pid()), 'T') << "holdfast stopped with nobody to continue it";
  auto d = client_->Describe("default", "cli/tty-orphan");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 1);
  ASSERT_EQ(::kill(p->pid(), SIGTERM), 0);  // passed on with SIGCONT: the command ends
  EXPECT_TRUE(WaitFor([&] { char s = StateOf(p->pid()); return s == 'Z' || s == '?'; },
                      seconds(30)))
      << "holdfast " << StateOf(p->pid()) << ", command " << StateOf(command_pid);
  d = client_->Describe("default", "cli/tty-orphan");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// Once the shell that ran holdfast as a job in the foreground has exited, a
// Ctrl-Z sent to holdfast stops nothing (no shell could continue it) and leaves
// the terminal to the command, which goes on reading it. (A Ctrl-Z to be ignored
// used to take the terminal from the command first.)
TEST_F(CliTest, AfterItsShellExitedCtrlZStopsNothingAndTheCommandKeepsTheTerminal) {
  auto [p, command_pid] = LockAndAsk(*cluster_, "tty-orphan-fg", Job::kForegroundShellExitsLater);
  ASSERT_NE(p, nullptr);
  ASSERT_GT(command_pid, 0) << p->shown();
  // (Lent just after the command starts: it may ask before that.)
  ASSERT_TRUE(WaitFor([&] { return p->ForegroundGroup() == command_pid; }, seconds(10)))
      << "the terminal was not lent";
  auto parent = [&] {
    auto s = dev::ReadProcState(p->pid());
    return s ? s->parent : 0;
  };
  const pid_t shell = parent();
  ASSERT_GT(shell, 0);
  p->ExitShell();
  ASSERT_TRUE(WaitFor([&] { return parent() != shell; }, seconds(10)));
  ASSERT_EQ(::kill(p->pid(), SIGTSTP), 0);
  std::this_thread::sleep_for(milliseconds(300));  // a stop would be seen by now
  EXPECT_NE(StateOf(p->pid()), 'T') << "holdfast stopped with nobody to continue it";
  EXPECT_NE(StateOf(command_pid), 'T') << "the command stopped";
  EXPECT_EQ(p->ForegroundGroup(), command_pid) << "the terminal was taken from the command";
  p->Type("yes\n");
  EXPECT_TRUE(p->Shows("got:yes")) << p->shown() << " (command state " << StateOf(command_pid)
                                   << ")";
  EXPECT_TRUE(WaitFor([&] { char s = StateOf(p->pid()); return s == 'Z' || s == '?'; },
                      seconds(30)))
      << "holdfast " << StateOf(p->pid());
  auto d = client_->Describe("default", "cli/tty-orphan-fg");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// With no holdfastd answering, opening the session waits up to the client's call
// timeout (10 s); Ctrl-C ends that wait at once, as it ends the wait for the lock.
TEST_F(CliTest, ASignalEndsTheWaitForASessionWhenNoHoldfastdAnswers) {
  const std::string file = Path("no-holdfastd-ran");
  auto p = CliProcess::Start(cluster_->dir(), "127.0.0.1:1",
                             {"lock", "default/cli/nobody-home", "--", "touch", file});
  ASSERT_NE(p, nullptr);
  std::this_thread::sleep_for(milliseconds(500));  // well into the session's call
  p->Signal(SIGINT);
  CliResult r = p->Finish(seconds(20));
  // (It used to wait out the call and exit 1 with DEADLINE_EXCEEDED.)
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("SIGINT while opening a session in namespace default; "
                       "default/cli/nobody-home not acquired"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(FileExists(file));
}

// A command stopped on its own (as one reading the terminal is, by SIGTTIN) acts
// on a forwarded signal: SIGCONT follows it. It used to stay stopped, the signal
// pending, and to hold the lock until killed by hand.
TEST_F(CliTest, AForwardedSignalReachesACommandThatStoppedItself) {
  const std::string pid_file = Path("stopped-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "default/cli/stopped", "--", "sh", "-c",
                              "echo $$ > '" + pid_file + "'; kill -STOP $$; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto s = dev::ReadProcState(command_pid);
        return s && s->state == 'T';
      },
      seconds(10)));
  p->Signal(SIGINT);
  CliResult r = p->Finish(seconds(20));
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(Ended(command_pid));
  auto d = client_->Describe("default", "cli/stopped");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// SIGQUIT is forwarded like SIGTERM: holdfast waits for the command, releases and
// exits with its code. It used to end holdfast itself (a core dump), leaving the
// command running and the key held until the session's TTL.
TEST_F(CliTest, LockForwardsSigquitToTheCommandAndReleases) {
  const std::string pid_file = Path("sigquit-pid");
  auto p = CliProcess::Start(cluster_->dir(), cluster_->endpoint(),
                             {"lock", "default/cli/sigquit", "--", "sh", "-c",
                              "ulimit -c 0; echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;
  p->Signal(SIGQUIT);
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGQUIT) << r.err;
  EXPECT_TRUE(Ended(command_pid)) << "holdfast exited before its command";
  auto d = client_->Describe("default", "cli/sigquit");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0) << "not released";
  KillLeftover(command_pid);
}

// A command that cannot be run exits as in a shell, 127 or 126, with a plain
// message (it was "INTERNAL: spawn: ..." and 1), and the key is free again. It is
// looked up before anything is sent: with no holdfastd at the endpoint, the
// answer is the same, not "no connection".
TEST_F(CliTest, ACommandThatCannotBeRunExits127Or126AndReleases) {
  for (const char* endpoint : {"127.0.0.1:1", ""}) {
    auto p = CliProcess::Start(cluster_->dir(), *endpoint ? endpoint : cluster_->endpoint(),
                               {"lock", "--wait", "30m", "default/cli/no-command", "--",
                                "hf-no-such-command", "arg"});
    ASSERT_NE(p, nullptr);
    CliResult early = p->Finish();
    EXPECT_EQ(early.exit_code, 127) << endpoint << ": " << early.err;
    EXPECT_EQ(early.err, "holdfast: cannot run hf-no-such-command: No such file or directory\n")
        << endpoint;
  }
  CliResult r = Run({"lock", "default/cli/no-command", "--", "hf-no-such-command", "arg"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("holdfast: cannot run hf-no-such-command: No such file or directory\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("INTERNAL"), std::string::npos) << r.err;
  r = Run({"holders", "default/cli/no-command", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ParseJson<v1::DescribeResponse>(r.out).holders_size(), 0) << r.out;

  const std::string script = Path("not-executable.sh");
  std::ofstream(script) << "#!/bin/sh\ntrue\n";
  ASSERT_EQ(::chmod(script.c_str(), 0644), 0);
  r = Run({"lock", "default/cli/not-executable", "--", script});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(r.err.find("holdfast: cannot run " + script + ": Permission denied\n"),
            std::string::npos)
      << r.err;
  r = Run({"holders", "default/cli/not-executable", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ParseJson<v1::DescribeResponse>(r.out).holders_size(), 0) << r.out;
}

// Without an audit store, `audit` says so, followed or not: with no cluster in the
// trail to read each on its own, the server is asked as it is, for its answer.
TEST(CliNoAuditTest, AuditWithoutAStoreSaysSoAlsoWhenFollowing) {
  testing::TestCluster::Options o;
  o.holdfastd_args = {"--audit-store", "none"};
  auto cluster = TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const auto& args : {std::vector<std::string>{"audit"},
                           std::vector<std::string>{"audit", "--follow"}}) {
    auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(), args);
    ASSERT_NE(p, nullptr);
    CliResult r = p->Finish(std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 1) << args.size() << ": " << r.err;
    EXPECT_NE(r.err.find("this holdfastd has no audit store"), std::string::npos) << r.err;
  }
}

// A lost hold stops every process of the command's group, also one that ignores
// SIGTERM after the command itself has exited: it ran under the hold too.
TEST(CliLostHoldTest, LostHoldStopsEveryProcessOfTheCommand) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  std::string pid_file = (*cluster)->dir() + "/stubborn-pid";
  // The command (sh) dies of SIGTERM; the process it started ignores it.
  const std::string inner = "trap '' TERM; echo $$ > '" + pid_file + "'; exec sleep 60";
  auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                             {"lock", "--ttl", "2s", "--grace", "1s", "default/cli/group", "--",
                              "sh", "-c", "sh -c \"$0\" & wait", inner});
  ASSERT_NE(p, nullptr);
  const pid_t stubborn = CommandPid(pid_file);
  ASSERT_GT(stubborn, 0) << "the inner process never wrote its pid to " << pid_file;

  (*cluster)->holdfastd().Kill();
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("lost the hold on default/cli/group"), std::string::npos) << r.err;
  EXPECT_TRUE(WaitFor([&] { return Ended(stubborn); }, seconds(5)))
      << "pid " << stubborn << " outlived the lost hold";
  if (!Ended(stubborn)) ::kill(stubborn, SIGKILL);
}

TEST(CliLostHoldTest, AForceReleasedHoldStopsTheCommandAndExits74) {
  TestCluster::Options o;
  o.tls = true;
  auto cluster = TestCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  ASSERT_TRUE((*cluster)->MakeIdentity("admin2", "spiffe://test.holdfast/ops/bob").ok());
  ASSERT_TRUE((*cluster)->MakeIdentity("alice", "spiffe://test.holdfast/team/alice").ok());
  const std::string certs = (*cluster)->certs_dir();
  std::string pid_file = (*cluster)->dir() + "/forced-pid";
  auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                             {"--ca", certs + "/ca.pem", "--cert", certs + "/alice.pem", "--key",
                              certs + "/alice_key.pem", "lock", "--ttl", "3s", "--grace", "1s",
                              "default/cli/forced", "--", "sh", "-c",
                              "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  const pid_t command_pid = CommandPid(pid_file);
  ASSERT_GT(command_pid, 0) << "the command never wrote its pid to " << pid_file;

  auto admin = (*cluster)->NewClientAs("admin");
  auto admin2 = (*cluster)->NewClientAs("admin2");
  ASSERT_TRUE(admin.ok() && admin2.ok());
  v1::RequestForceReleaseRequest req;
  req.set_namespace_("default");
  req.set_lock_key("cli/forced");
  req.set_reason("wedged, ticket OPS-7");
  auto requested = (*admin)->RequestForceRelease(req);
  ASSERT_TRUE(requested.ok()) << requested.status();
  v1::ApproveForceReleaseRequest approve;
  approve.set_request_id(requested->request_id());
  ASSERT_TRUE((*admin2)->ApproveForceRelease(approve).ok());

  // The session lives on, but the hold is gone: told on the next renewal (every
  // second here), the command is stopped and holdfast exits 74.
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("lost the hold on default/cli/forced"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("force-released"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ticket OPS-7"), std::string::npos) << r.err;
  EXPECT_EQ(::kill(command_pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// The file mode bits of `path` (-1 when it does not exist).
int FileMode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 0777);
}

// `holdfast dev` on a free port and its own data directory.
class CliDevTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto port = dev::PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    endpoint_ = absl::StrCat("127.0.0.1:", *port);
    data_dir_ = dir_.path() + "/data";
  }

  // Starts `holdfast dev` and waits for its banner, which comes once holdfastd
  // answers and namespace `default` exists.
  std::unique_ptr<CliProcess> StartDev(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"dev", "--listen", endpoint_, "--data-dir", data_dir_};
    for (const auto& a : extra) args.push_back(a);
    auto dev = CliProcess::Start(dir_.path(), "", args);
    EXPECT_NE(dev, nullptr);
    if (!dev) return nullptr;
    bool up = WaitFor(
        [&] { return dev->Output().find("holdfast dev is running") != std::string::npos; },
        seconds(60));
    if (!up) {
      ADD_FAILURE() << "holdfast dev did not come up: " << dev->Finish(seconds(1)).err;
      return nullptr;
    }
    return dev;
  }

  // The CLI against the dev endpoint; with HOLDFAST_DEV_DIR = the dev data
  // directory unless `dev_dir` says otherwise.
  CliResult Run(const std::vector<std::string>& args, const std::string& dev_dir = "") {
    auto p = CliProcess::Start(dir_.path(), endpoint_, args, dev_dir.empty() ? data_dir_ : dev_dir);
    return p ? p->Finish() : CliResult{};
  }

  // The CLI without a dev server (issue-cert, usage errors).
  CliResult RunOffline(const std::vector<std::string>& args) {
    auto p = CliProcess::Start(dir_.path(), "", args);
    return p ? p->Finish() : CliResult{};
  }

  // libholdfast with the identity in `svid_dir` (svid.pem, svid_key.pem,
  // svid_bundle.pem), or plaintext when empty.
  std::unique_ptr<Client> ClientWith(const std::string& svid_dir) {
    ClientOptions o;
    o.endpoints = {endpoint_};
    o.rpc_timeout = seconds(3);
    if (!svid_dir.empty()) {
      o.ca_file = svid_dir + "/svid_bundle.pem";
      o.cert_file = svid_dir + "/svid.pem";
      o.key_file = svid_dir + "/svid_key.pem";
    }
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir dir_;
  std::string endpoint_;
  std::string data_dir_;
};

TEST_F(CliDevTest, DevServesMtlsAndKeepsItsDataAndCaAcrossRestarts) {
  auto dev = StartDev();
  ASSERT_NE(dev, nullptr);

  // The dev PKI: private keys readable by the owner only.
  for (const char* f : {"/ca/ca.pem", "/cli/svid.pem", "/cli/svid_bundle.pem",
                        "/server/svid.pem"}) {
    EXPECT_TRUE(FileExists(data_dir_ + f)) << f;
  }
  for (const char* f : {"/ca/ca_key.pem", "/cli/svid_key.pem", "/server/svid_key.pem"}) {
    EXPECT_EQ(FileMode(data_dir_ + f), 0600) << f;
  }
  auto cli_cert = dev::InspectCert(ReadFile(data_dir_ + "/cli/svid.pem"));
  ASSERT_TRUE(cli_cert.ok()) << cli_cert.status();
  EXPECT_EQ(cli_cert->uris, std::vector<std::string>{"spiffe://holdfast.dev/dev/cli"});
  const std::string ca_pem = ReadFile(data_dir_ + "/ca/ca.pem");
  const std::string cli_pem = ReadFile(data_dir_ + "/cli/svid.pem");

  // The CLI with no credentials given uses the dev ones: `default` takes locks,
  // and the CLI is a dev admin.
  CliResult r = Run({"lock", "default/demo", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // ... and that hold is in the audit trail, kept in the data dir.
  for (int i = 0; i < 300; ++i) {
    r = Run({"audit", "--key", "demo", "--type", "release", "-o", "json"});
    if (r.exit_code != 0 || !r.out.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"spiffe_id\":\"spiffe://holdfast.dev/dev/cli\""), std::string::npos)
      << r.out;
  EXPECT_TRUE(FileExists(data_dir_ + "/audit.db"));
  r = Run({"ns", "create", "kept"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    auto cli = ClientWith(data_dir_ + "/cli");
    ASSERT_NE(cli, nullptr);
    auto session = cli->OpenSession("default");
    ASSERT_TRUE(session.ok()) << session.status();
    auto hold = (*session)->Acquire("who");
    ASSERT_TRUE(hold.ok()) << hold.status();
    EXPECT_EQ(hold->info().identity(), "spiffe://holdfast.dev/dev/cli");
  }
  // A plaintext client gets nowhere, and changes nothing.
  {
    auto plain = ClientWith("");
    ASSERT_NE(plain, nullptr);
    EXPECT_FALSE(plain->ListNamespaces().ok());
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name("plaintext");
    EXPECT_FALSE(plain->CreateNamespace(req).ok());
  }
  r = Run({"ns", "get", "plaintext"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;

  // A second `holdfast dev` on the same directory is refused.
  auto second = CliProcess::Start(dir_.path(), "",
                                  {"dev", "--listen", "127.0.0.1:1", "--data-dir", data_dir_});
  ASSERT_NE(second, nullptr);
  r = second->Finish();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("another `holdfast dev`"), std::string::npos) << r.err;

  dev->Signal(SIGTERM);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(endpoint_), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("spiffe://holdfast.dev/dev/cli"), std::string::npos) << r.out;
  EXPECT_TRUE(FileExists(data_dir_ + "/ports"));

  // --insecure: loud, plaintext, and the CLI speaks plaintext to it although
  // the dev credentials are there.
  dev = StartDev({"--insecure"});
  ASSERT_NE(dev, nullptr);
  r = Run({"ns", "get", "kept"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  dev->Signal(SIGINT);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("WARNING: --insecure"), std::string::npos) << r.err;

  // mTLS again: the same CA and CLI identity, the same data.
  dev = StartDev();
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(ReadFile(data_dir_ + "/ca/ca.pem"), ca_pem);
  EXPECT_EQ(ReadFile(data_dir_ + "/cli/svid.pem"), cli_pem);
  r = Run({"ns", "get", "kept"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  dev->Signal(SIGINT);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Whether nothing listens on 127.0.0.1:`port`.
bool LoopbackPortFree(int port) {
  return net::CheckCanListen(absl::StrCat("127.0.0.1:", port)).ok();
}

// The etcd ports `holdfast dev` saved in DIR/ports: {client, peer}.
std::pair<int, int> SavedEtcdPorts(const std::string& data_dir) {
  std::pair<int, int> ports{0, 0};
  std::istringstream in(ReadFile(data_dir + "/ports"));
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "client_port=")) {
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(12), &ports.first)) << line;
    }
    if (absl::StartsWith(line, "peer_port=")) {
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(10), &ports.second)) << line;
    }
  }
  return ports;
}

// A port in use is said at once, before anything starts (a second holdfastd on
// it would not share it, and the banner would come from the first); a `holdfast
// dev` killed outright takes etcd and holdfastd with it; and a saved etcd client
// port another program took meanwhile is picked anew.
TEST_F(CliDevTest, APortInUseIsRefusedAtOnceAndAKilledDevLeavesNothingRunning) {
  auto dev = StartDev();
  ASSERT_NE(dev, nullptr);
  EXPECT_NE(dev->Output().find("lock default/demo -- echo hi"), std::string::npos);
  const std::string other_dir = dir_.path() + "/other";
  auto second = CliProcess::Start(dir_.path(), "",
                                  {"dev", "--listen", endpoint_, "--data-dir", other_dir});
  ASSERT_NE(second, nullptr);
  CliResult r = second->Finish(seconds(15));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(absl::StrCat("dev: UNAVAILABLE: cannot listen on ", endpoint_,
                                    ": Address already in use (on 127.0.0.1) (another `holdfast dev`, or "
                                    "another program, listens there? give another address "
                                    "with --listen HOST:PORT)")),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(other_dir + "/etcd"));
  EXPECT_EQ(r.out.find("holdfast dev is running"), std::string::npos) << r.out;

  const auto [client_port, peer_port] = SavedEtcdPorts(data_dir_);
  ASSERT_GT(client_port, 0);
  ASSERT_GT(peer_port, 0);
  int api_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(endpoint_.substr(endpoint_.rfind(':') + 1), &api_port));
  EXPECT_FALSE(LoopbackPortFree(client_port));
  dev->Signal(SIGKILL);
  dev->Finish();
  EXPECT_TRUE(WaitFor(
      [&] {
        return LoopbackPortFree(api_port) && LoopbackPortFree(client_port) &&
               LoopbackPortFree(peer_port);
      },
      seconds(10)))
      << "etcd or holdfastd outlived a SIGKILLed holdfast dev";

  // Another program on the saved client port: the next start picks another.
  auto squatter = net::ListenTcp(absl::StrCat("127.0.0.1:", client_port), 1);
  ASSERT_TRUE(squatter.ok()) << squatter.status();
  dev = StartDev();
  ASSERT_NE(dev, nullptr);
  EXPECT_NE(SavedEtcdPorts(data_dir_).first, client_port);
  EXPECT_EQ(SavedEtcdPorts(data_dir_).second, peer_port);
  r = Run({"lock", "default/demo", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ::close(squatter->fd);
  dev->Signal(SIGTERM);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliDevTest, IssueCertMintsIdentitiesHoldfastdAccepts) {
  auto dev = StartDev();
  ASSERT_NE(dev, nullptr);
  const std::string alice = dir_.path() + "/alice";
  const std::string bob = dir_.path() + "/bob";
  CliResult r = Run({"dev", "issue-cert", "--spiffe-id", "spiffe://holdfast.dev/ops/alice",
                     "--out", alice, "--data-dir", data_dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("a dev admin"), std::string::npos) << r.out;
  EXPECT_EQ(FileMode(alice + "/svid_key.pem"), 0600);
  // --data-dir before the subcommand works too.
  r = Run({"dev", "--data-dir", data_dir_, "issue-cert", "--spiffe-id",
           "spiffe://holdfast.dev/team/bob", "--out", bob});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("a dev admin"), std::string::npos) << r.out;

  // Explicit credentials win over the dev ones: ops/* is a dev admin...
  auto as = [&](const std::string& svid_dir) {
    return std::vector<std::string>{"--ca", svid_dir + "/svid_bundle.pem", "--cert",
                                    svid_dir + "/svid.pem", "--key", svid_dir + "/svid_key.pem"};
  };
  std::vector<std::string> args = as(alice);
  for (const char* a : {"ns", "create", "alices"}) args.push_back(a);
  r = Run(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // ... team/bob is not (and the environment works like the flags).
  auto p = CliProcess::Start(dir_.path(), endpoint_, {"ns", "create", "bobs"}, data_dir_,
                             {{"HOLDFAST_CA", bob + "/svid_bundle.pem"},
                              {"HOLDFAST_CERT", bob + "/svid.pem"},
                              {"HOLDFAST_KEY", bob + "/svid_key.pem"}});
  ASSERT_NE(p, nullptr);
  r = p->Finish();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("PERMISSION_DENIED"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("spiffe://holdfast.dev/team/bob is not an admin"), std::string::npos)
      << r.err;
  r = Run({"ns", "get", "bobs"});
  EXPECT_EQ(r.exit_code, 1);

  // holdfastd knows each by the SPIFFE ID in its certificate.
  for (const auto& [svid_dir, id] :
       {std::pair{alice, "spiffe://holdfast.dev/ops/alice"},
        std::pair{bob, "spiffe://holdfast.dev/team/bob"}}) {
    auto client = ClientWith(svid_dir);
    ASSERT_NE(client, nullptr);
    auto session = client->OpenSession("default");
    ASSERT_TRUE(session.ok()) << session.status();
    auto hold = (*session)->Acquire("identity/" + svid_dir.substr(svid_dir.rfind('/') + 1));
    ASSERT_TRUE(hold.ok()) << hold.status();
    EXPECT_EQ(hold->info().identity(), id);
  }
  dev->Signal(SIGINT);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliDevTest, IssueCertRefusesBadIdsAndAMissingCaAndWritesNothing) {
  const std::string out = dir_.path() + "/out";
  struct Case {
    std::string id;
    int exit_code;
    std::string error;
  } cases[] = {
      {"not-a-spiffe-id", 2, "--spiffe-id: \"not-a-spiffe-id\" is not a SPIFFE ID"},
      {"spiffe://holdfast.dev/a//b", 2, "empty segment"},
      {"spiffe://holdfast.dev:443/x", 2, "no port"},
      {"spiffe://acme.org/ops/alice", 2, "signs only trust domain holdfast.dev, not \"acme.org\""},
      {"spiffe://holdfast.dev", 2, "names only the trust domain"},
      // A valid ID, but no `holdfast dev` has made a CA in the data dir yet.
      {"spiffe://holdfast.dev/ops/alice", 1, "run `holdfast dev --data-dir"},
  };
  for (const auto& c : cases) {
    CliResult r = RunOffline(
        {"dev", "issue-cert", "--spiffe-id", c.id, "--out", out, "--data-dir", data_dir_});
    EXPECT_EQ(r.exit_code, c.exit_code) << c.id << ": " << r.err;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.id << ": " << r.err;
    EXPECT_FALSE(FileExists(out)) << c.id;
  }
  EXPECT_FALSE(FileExists(data_dir_));
  CliResult r = RunOffline({"dev", "issue-cert", "--out", out});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--spiffe-id"), std::string::npos) << r.err;

  // --insecure is for loopback only.
  r = RunOffline({"dev", "--insecure", "--listen", "0.0.0.0:7420", "--data-dir", data_dir_});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("only on a loopback address"), std::string::npos) << r.err;
  EXPECT_FALSE(FileExists(data_dir_));
}

}  // namespace
}  // namespace holdfast::testing
