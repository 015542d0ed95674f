// Integration tests of the `holdfast` CLI: the built binary runs as a real
// process against real etcd and holdfastd processes (TestCluster).
#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dev/subprocess.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "harness/cluster.h"
#include "holdfast/client.h"

namespace holdfast::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

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

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// One run of the holdfast binary, with its stdout and stderr in files.
class CliProcess {
 public:
  // Starts `holdfast [--endpoint ENDPOINT] ARGS...`; `dir` receives the output
  // files.
  static std::unique_ptr<CliProcess> Start(const std::string& dir, const std::string& endpoint,
                                           const std::vector<std::string>& args) {
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
    so.env = {{"HF_TEST_OUT", p->out_path_}, {"HF_TEST_ERR", p->err_path_}};
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
  r = Run({"holders", "default/"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"ns", "list", "-o", "yaml"});
  EXPECT_EQ(r.exit_code, 2);
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
TEST(CliLostHoldTest, LostHoldStopsTheCommandAndExits74) {
  auto cluster = TestCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateNamespace("default").ok());
  std::string pid_file = (*cluster)->dir() + "/lost-pid";
  auto p = CliProcess::Start((*cluster)->dir(), (*cluster)->endpoint(),
                             {"lock", "--ttl", "2s", "--grace", "1s", "default/cli/lost", "--",
                              "sh", "-c", "echo $$ > '" + pid_file + "'; exec sleep 60"});
  ASSERT_NE(p, nullptr);
  auto pid_written = [&] {
    std::string text = ReadFile(pid_file);
    return !text.empty() && text.back() == '\n';
  };
  ASSERT_TRUE(WaitFor(pid_written, seconds(30)));
  pid_t command_pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(pid_file)), &command_pid));

  // With holdfastd gone no renewal is confirmed: the session is lost once its
  // local deadline (under 2s after the last renewal) passes.
  (*cluster)->holdfastd().Kill();
  CliResult r = p->Finish(seconds(30));
  EXPECT_EQ(r.exit_code, 74) << r.err;
  EXPECT_NE(r.err.find("lost the hold on default/cli/lost"), std::string::npos) << r.err;
  EXPECT_EQ(::kill(command_pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(CliDevTest, DevServesAndKeepsItsDataAcrossRestarts) {
  TempDir dir;
  auto port = dev::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  std::string data_dir = dir.path() + "/data";
  std::vector<std::string> dev_args = {"dev", "--listen", endpoint, "--data-dir", data_dir};

  // The banner comes once holdfastd answers and namespace `default` exists.
  auto running = [](CliProcess& dev) {
    return WaitFor([&] { return dev.Output().find("holdfast dev is running") != std::string::npos; },
                   seconds(60));
  };
  auto dev = CliProcess::Start(dir.path(), "", dev_args);
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(running(*dev)) << dev->Finish(seconds(1)).err;
  auto run = [&](const std::vector<std::string>& args) {
    auto p = CliProcess::Start(dir.path(), endpoint, args);
    return p ? p->Finish() : CliResult{};
  };
  // `default` exists and takes locks anywhere.
  CliResult r = run({"lock", "default/demo", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run({"ns", "create", "kept"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // A second `holdfast dev` on the same directory is refused.
  auto second = CliProcess::Start(dir.path(), "",
                                  {"dev", "--listen", "127.0.0.1:1", "--data-dir", data_dir});
  ASSERT_NE(second, nullptr);
  r = second->Finish();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("another `holdfast dev`"), std::string::npos) << r.err;

  dev->Signal(SIGTERM);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(endpoint), std::string::npos) << r.out;
  EXPECT_TRUE(FileExists(data_dir + "/ports"));

  dev = CliProcess::Start(dir.path(), "", dev_args);
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(running(*dev)) << dev->Finish(seconds(1)).err;
  r = run({"ns", "get", "kept"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  dev->Signal(SIGINT);
  r = dev->Finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace holdfast::testing
