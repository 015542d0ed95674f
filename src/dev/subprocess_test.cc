// Subprocess against real child processes (sh, sleep); no server.
#include "dev/subprocess.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "dev/refusing_endpoint.h"
#include "dev/temp_dir.h"

namespace holdfast::dev {
namespace {

using std::chrono::milliseconds;

bool WaitUntil(const std::function<bool()>& condition, milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

char StateOf(pid_t pid) {
  auto p = ReadProcState(pid);
  return p ? p->state : 0;
}

// A refusing endpoint refuses connects, and no other socket can bind its port
// while it lives, whatever reuse options it sets (etcd's and gRPC's listeners set
// SO_REUSEADDR and SO_REUSEPORT); once it is gone the port can be bound.
TEST(RefusingEndpointTest, RefusesConnectsAndKeepsThePortFromOthers) {
  auto socket_on = [](int port, bool reuse) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (reuse) {
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return std::make_pair(fd, a);
  };
  int port = 0;
  {
    RefusingEndpoint refusing;
    port = refusing.port();
    ASSERT_NE(port, 0);
    EXPECT_EQ(refusing.address(), "127.0.0.1:" + std::to_string(port));
    auto [c, to] = socket_on(port, false);
    EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&to), sizeof to), -1);
    EXPECT_EQ(errno, ECONNREFUSED);
    ::close(c);
    for (bool reuse : {false, true}) {
      auto [b, at] = socket_on(port, reuse);
      EXPECT_EQ(::bind(b, reinterpret_cast<sockaddr*>(&at), sizeof at), -1) << reuse;
      EXPECT_EQ(errno, EADDRINUSE) << reuse;
      ::close(b);
    }
  }
  auto [b, at] = socket_on(port, true);
  EXPECT_EQ(::bind(b, reinterpret_cast<sockaddr*>(&at), sizeof at), 0) << std::strerror(errno);
  ::close(b);
}

// A port picked in one process is reserved against every other process that
// picks ports here, for as long as the first one lives: two tests running side
// by side are not given one port because the kernel handed it out twice.
TEST(PickFreePortTest, APortPickedByALiveProcessIsReservedAgainstOthersUntilItEnds) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    auto port = PickFreePort();
    const int sent = port.ok() ? *port : 0;
    (void)!::write(to_parent[1], &sent, sizeof sent);
    char c;
    (void)!::read(to_child[0], &c, 1);  // until the parent closes its end
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  int port = 0;
  ASSERT_EQ(::read(to_parent[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ::close(to_parent[0]);
  ASSERT_NE(port, 0);
  EXPECT_FALSE(ReservePort(port)) << "the child holds " << port;
  ::close(to_child[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(ReservePort(port)) << "the child that held " << port << " is gone";
  EXPECT_TRUE(ReservePort(port)) << "a process's own reservation stands for it";
}

// `holdfast lock` stops what CMD left in its group after CMD exited. Exited()
// leaves CMD unreaped, so its pid (the group's id) stays taken while the group is
// signalled; GroupAlive() counts the others, not that zombie (kill(-pgid, 0)
// still succeeds on it), nor the killed sleep if nobody reaps it (a container's
// init may not). Wait() then reaps the leader.
TEST(SubprocessTest, AnExitedLeaderKeepsItsGroupsIdUntilReaped) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "sleep 30 & exit 3"};
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  Subprocess& child = **p;
  const pid_t leader = child.pid();
  ASSERT_TRUE(WaitUntil([&] { return child.Exited(); }, milliseconds(10'000)));
  EXPECT_EQ(StateOf(leader), 'Z') << "Exited() reaped the child";
  EXPECT_TRUE(child.GroupAlive()) << "the background sleep is in the group";

  child.SignalGroup(SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return !child.GroupAlive(); }, milliseconds(10'000)))
      << "the group's sleep outlived SIGKILL";
  EXPECT_EQ(StateOf(leader), 'Z');
  EXPECT_EQ(::kill(-leader, 0), 0) << "the unreaped leader keeps the group's id";
  EXPECT_TRUE(child.Exited());

  EXPECT_EQ(child.Wait(), 3);
  EXPECT_EQ(StateOf(leader), 0) << "Wait() reaps the leader";
}

// GroupHasOtherLiveMember over a made-up /proc: live members count, zombies,
// the excepted process, other groups and entries that are not processes do not;
// COMM may hold ") " and spaces. A /proc that cannot be listed answers "a member
// may be there" (it used to answer "alone", and holdfast lock lent the terminal).
TEST(SubprocessTest, GroupMembersAreReadFromProcAndAnUnreadableProcIsNotAlone) {
  auto dir = MakeTempDir("hf-proc");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto process = [&](pid_t pid, const std::string& comm, char state, pid_t pgrp) {
    std::filesystem::create_directory(*dir + "/" + std::to_string(pid));
    std::ofstream(*dir + "/" + std::to_string(pid) + "/stat")
        << pid << " (" << comm << ") " << state << " 1 " << pgrp << " 7 34816 " << pgrp
        << " 4194560 0 0\n";
  };
  process(100, "holdfast", 'S', 100);
  process(101, "zombie mate", 'Z', 100);
  process(200, "odd) R 1 100 (name", 'S', 200);
  std::filesystem::create_directory(*dir + "/self");
  std::filesystem::create_directory(*dir + "/300");  // gone meanwhile: no stat
  EXPECT_FALSE(GroupHasOtherLiveMember(100, 100, *dir)) << "a zombie or itself counted";
  EXPECT_TRUE(GroupHasOtherLiveMember(100, 1, *dir));
  EXPECT_TRUE(GroupHasOtherLiveMember(200, 100, *dir));
  process(102, "sleep", 'T', 100);  // a stopped mate is a live one
  EXPECT_TRUE(GroupHasOtherLiveMember(100, 100, *dir));
  std::filesystem::remove_all(*dir);
  EXPECT_TRUE(GroupHasOtherLiveMember(100, 100, *dir)) << "an unreadable /proc said alone";
}

// GroupOrphaned as POSIX has it, over a made-up /proc: a group is not orphaned
// while a live member's parent is in the same session and another group (a
// shell's job; a script's child in the script's group, through the script), and
// is once no parent links it so (a session's leader; the shell gone, its members
// now children of init in another session). A /proc that cannot be listed
// answers "not orphaned": holdfast lock then stops on Ctrl-Z as it always did.
TEST(SubprocessTest, AGroupIsOrphanedWhenNoMembersParentLinksItToItsSession) {
  auto dir = MakeTempDir("hf-proc");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto process = [&](pid_t pid, char state, pid_t parent, pid_t pgrp, pid_t session) {
    std::filesystem::create_directories(*dir + "/" + std::to_string(pid));
    std::ofstream(*dir + "/" + std::to_string(pid) + "/stat")
        << pid << " (p" << pid << ") " << state << " " << parent << " " << pgrp << " "
        << session << " 34816 " << pgrp << " 4194560 0 0\n";
  };
  process(1, 'S', 0, 1, 1);        // init
  process(10, 'S', 1, 10, 10);     // the terminal's session leader, a shell
  process(20, 'S', 10, 20, 10);    // a script the shell runs as a job
  process(21, 'S', 20, 20, 10);    // holdfast, in the script's group
  process(30, 'S', 10, 30, 10);    // holdfast as the shell's job
  process(40, 'S', 1, 40, 40);     // holdfast leading a session of its own
  process(50, 'S', 1, 50, 10);     // holdfast whose shell exited
  process(60, 'Z', 10, 60, 10);    // a zombie does not link its group
  EXPECT_FALSE(GroupOrphaned(20, 10, *dir));
  EXPECT_FALSE(GroupOrphaned(30, 10, *dir));
  EXPECT_TRUE(GroupOrphaned(40, 40, *dir));
  EXPECT_TRUE(GroupOrphaned(50, 10, *dir));
  EXPECT_TRUE(GroupOrphaned(60, 10, *dir));
  process(20, 'S', 1, 20, 10);  // the script's shell exited too
  EXPECT_TRUE(GroupOrphaned(20, 10, *dir));
  process(51, 'S', 10, 50, 10);  // a member the shell still parents links the group
  EXPECT_FALSE(GroupOrphaned(50, 10, *dir));
  std::filesystem::remove_all(*dir);
  EXPECT_FALSE(GroupOrphaned(50, 10, *dir)) << "an unreadable /proc said orphaned";
  // The real /proc: a child in a group of its own, this process its parent.
  SpawnOptions o;
  o.argv = {"sleep", "30"};
  o.new_process_group = true;
  auto child = Subprocess::Spawn(std::move(o));
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_FALSE(GroupOrphaned((*child)->pid(), ::getsid(0)));
  EXPECT_TRUE(GroupOrphaned((*child)->pid(), ::getsid(0) + 1)) << "of another session";
}

TEST(SubprocessTest, ExitedIsFalseWhileTheChildRuns) {
  SpawnOptions o;
  o.argv = {"sleep", "30"};
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE((*p)->Exited());
  EXPECT_FALSE((*p)->GroupAlive()) << "the child alone is no other member";
  EXPECT_EQ((*p)->Stop(milliseconds(1000)), 128 + SIGTERM);
  EXPECT_TRUE((*p)->Exited());
}

// The environment is built before fork (no setenv in the child): `env` replaces
// the parent's entry of a name, and of two entries the later wins.
TEST(SubprocessTest, EnvReplacesTheParentsEntriesAndTheLaterWins) {
  ASSERT_EQ(::setenv("HF_SUBPROCESS_TEST", "parent", 1), 0);
  SpawnOptions o;
  o.argv = {"sh", "-c",
            "[ \"$(env | grep -c '^HF_SUBPROCESS_TEST=')\" = 1 ] && "
            "[ \"$HF_SUBPROCESS_TEST\" = second ] && [ \"$HF_SUBPROCESS_OTHER\" = x ] && "
            "[ -n \"$PATH\" ]"};
  o.env = {{"HF_SUBPROCESS_TEST", "first"},
           {"HF_SUBPROCESS_OTHER", "x"},
           {"HF_SUBPROCESS_TEST", "second"}};
  auto p = Subprocess::Spawn(o);
  ::unsetenv("HF_SUBPROCESS_TEST");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(milliseconds(10'000)), 0);
}

TEST(SubprocessTest, DroppedPrefixesLeaveTheParentsEntriesOutButNotTheOverrides) {
  ASSERT_EQ(::setenv("HF_DROP_ONE", "parent", 1), 0);
  ASSERT_EQ(::setenv("HF_DROPX", "parent", 1), 0);
  SpawnOptions o;
  o.argv = {"sh", "-c",
            "[ -z \"${HF_DROP_ONE+set}\" ] && [ \"$HF_DROPX\" = parent ] && "
            "[ \"$HF_DROP_MINE\" = child ] && [ -n \"$PATH\" ]"};
  o.drop_env_prefixes = {"HF_DROP_"};
  o.env = {{"HF_DROP_MINE", "child"}};
  auto p = Subprocess::Spawn(o);
  ::unsetenv("HF_DROP_ONE");
  ::unsetenv("HF_DROPX");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(milliseconds(10'000)), 0);
}

// `holdfast lock` tells "not found" (127) from "cannot run" (126) by the code.
TEST(SubprocessTest, AFailedExecSaysWhetherTheProgramExists) {
  SpawnOptions o;
  o.argv = {"hf-no-such-program"};
  auto p = Subprocess::Spawn(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_EQ(p.status().message(), "cannot run hf-no-such-program: No such file or directory");
  o.argv = {"/"};  // a directory: EACCES
  p = Subprocess::Spawn(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
  EXPECT_EQ(p.status().message(), "cannot run /: Permission denied");
}

// FindProgram says beforehand what Spawn's exec would say: found, not found
// (PATH searched as execvp does), or found but not runnable.
TEST(SubprocessTest, FindProgramSaysWhatExecWould) {
  auto dir = MakeTempDir("hf-find");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string plain = *dir + "/plain.sh";  // not executable
  std::ofstream(plain) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod(plain.c_str(), 0644), 0);
  std::filesystem::create_directory(*dir + "/later");
  const std::string runnable = *dir + "/later/plain.sh";
  std::ofstream(runnable) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod(runnable.c_str(), 0755), 0);

  const char* old_path = std::getenv("PATH");
  const std::optional<std::string> saved =
      old_path != nullptr ? std::optional<std::string>(old_path) : std::nullopt;
  auto set_path = [](const std::optional<std::string>& value) {
    value ? ::setenv("PATH", value->c_str(), 1) : ::unsetenv("PATH");
  };
  const std::string loop = *dir + "/loop";  // a symbolic link loop: ELOOP ends the search
  std::filesystem::create_directory(loop);
  std::filesystem::create_symlink(loop + "/true", loop + "/true");
  struct Case {
    std::optional<std::string> path_env;  // nullopt: PATH unset (/bin:/usr/bin)
    std::string program;
  } cases[] = {
      {saved, "true"},
      {saved, "/bin/true"},
      {saved, "hf-no-such-program"},
      {saved, "/"},
      {saved, plain},
      {saved, *dir + "/missing.sh"},
      {*dir, "plain.sh"},                        // found, not executable: EACCES
      {*dir + ":" + *dir + "/later", "plain.sh"},  // a later directory's runs
      {*dir + "/nowhere", "true"},               // not on this PATH
      {std::nullopt, "true"},
      {"", "true"},                              // the current directory only
      {loop + ":/usr/bin", "true"},
  };
  for (const auto& c : cases) {
    set_path(c.path_env);
    auto found = FindProgram(c.program);
    SpawnOptions o;
    o.argv = {c.program};
    auto spawned = Subprocess::Spawn(o);
    set_path(saved);
    EXPECT_EQ(found.code(), spawned.status().code())
        << c.program << " on " << c.path_env.value_or("(unset)") << ": " << found << " / "
        << spawned.status();
    if (!spawned.ok()) {
      EXPECT_EQ(found.message(), spawned.status().message()) << c.program;
    } else {
      EXPECT_EQ((*spawned)->Wait(std::chrono::milliseconds(10'000)), 0) << c.program;
    }
  }
  EXPECT_EQ(FindProgram("hf-no-such-program").message(),
            "cannot run hf-no-such-program: No such file or directory");
  EXPECT_EQ(FindProgram(plain).code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(*dir);
}

// PR_SET_PDEATHSIG is tied to the thread that forked: when it ends, the child
// gets SIGKILL although the process lives on. So a supervisor must spawn from a
// thread that lives as long as the child should.
TEST(SubprocessTest, KillWithParentKillsTheChildWhenTheSpawningThreadEnds) {
  std::unique_ptr<Subprocess> child;
  std::thread([&] {
    SpawnOptions o;
    o.argv = {"sleep", "30"};
    o.kill_with_parent = true;
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok()) << p.status();
    child = *std::move(p);
  }).join();
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->Wait(milliseconds(10'000)), 128 + SIGKILL);
}

// The pid a shell wrote to `file`, once it has (0 if it never did).
pid_t PidFrom(const std::string& file) {
  pid_t pid = 0;
  WaitUntil(
      [&] {
        std::ifstream in(file);
        return static_cast<bool>(in >> pid) && pid > 0;
      },
      milliseconds(10'000));
  return pid;
}

// A thread that spawns a child and lives until End() (or its destruction): the
// spawning thread whose end kill_with_parent watches.
class SpawningThread {
 public:
  explicit SpawningThread(SpawnOptions options) {
    std::promise<void> spawned;
    thread_ = std::thread([this, &spawned, options = std::move(options)]() mutable {
      auto p = Subprocess::Spawn(std::move(options));
      if (p.ok()) child_ = *std::move(p);
      spawned.set_value();
      end_.get_future().wait();
    });
    spawned.get_future().wait();
  }
  ~SpawningThread() { End(); }
  Subprocess* child() { return child_.get(); }
  void End() {
    if (!thread_.joinable()) return;
    end_.set_value();
    thread_.join();
  }

 private:
  std::unique_ptr<Subprocess> child_;
  std::promise<void> end_;
  std::thread thread_;
};

// kill_with_parent alone covers the child, not what it starts: the sleep here
// would run on. The group's guard kills it too, and is left be by the signals
// sent to the group meanwhile (the shell and its sleep ignore them), its own
// wake-up signal among them, sent by its parent process itself.
TEST(SubprocessTest, KillGroupWithParentKillsTheWholeGroupWhenTheSpawningThreadEnds) {
  auto dir = MakeTempDir("hf-guard");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string pid_file = *dir + "/sleep-pid";
  SpawnOptions o;
  o.argv = {"sh", "-c",
            "trap '' INT TERM HUP USR1; sleep 30 & echo $! > '" + pid_file + "'; wait"};
  o.kill_with_parent = true;
  o.kill_group_with_parent = true;
  SpawningThread spawner(std::move(o));
  ASSERT_NE(spawner.child(), nullptr);
  Subprocess& child = *spawner.child();
  EXPECT_TRUE(child.guarded());
  const pid_t sleep_pid = PidFrom(pid_file);
  ASSERT_GT(sleep_pid, 0) << "the shell never wrote its sleep's pid";
  const pid_t group = child.pid();
  EXPECT_TRUE(GroupHasOtherLiveMember(group, group, "/proc", sleep_pid))
      << "no guard in the group";
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::kill(-group, sig);
  ::usleep(200'000);
  EXPECT_TRUE(child.GroupAlive()) << "the sleep ignores the signals";
  EXPECT_TRUE(GroupHasOtherLiveMember(group, group, "/proc", sleep_pid))
      << "the guard did not outlive the group's signals";

  spawner.End();
  // Not reaped before the sleep is seen gone: reaping the child ends the guard
  // (after doing its kill itself, the next test's case).
  ASSERT_TRUE(WaitUntil([&] { return child.Exited(); }, milliseconds(10'000)));
  auto ended = [&] {
    const char state = StateOf(sleep_pid);
    return state == 0 || state == 'Z';
  };
  EXPECT_TRUE(WaitUntil(ended, milliseconds(10'000)))
      << "the shell's sleep outlived the spawning thread";
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  if (!ended()) ::kill(sleep_pid, SIGKILL);
  std::filesystem::remove_all(*dir);
}

// The guard of `group`: its member named holdfast-guard (0 if none).
pid_t GuardOf(pid_t group) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    try {
      pid = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    auto state = ReadProcState(pid);
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (state && state->pgrp == group && name == "holdfast-guard") return pid;
  }
  return 0;
}

// A process that reaps the child after its spawning thread ended, before the
// guard acted (here: the guard is stopped), kills the group itself.
TEST(SubprocessTest, ReapingAfterTheSpawningThreadEndedKillsTheGroup) {
  auto dir = MakeTempDir("hf-guard");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string pid_file = *dir + "/sleep-pid";
  SpawnOptions o;
  o.argv = {"sh", "-c", "sleep 30 & echo $! > '" + pid_file + "'; wait"};
  o.kill_with_parent = true;
  o.kill_group_with_parent = true;
  SpawningThread spawner(std::move(o));
  ASSERT_NE(spawner.child(), nullptr);
  Subprocess& child = *spawner.child();
  const pid_t sleep_pid = PidFrom(pid_file);
  ASSERT_GT(sleep_pid, 0) << "the shell never wrote its sleep's pid";
  const pid_t guard = GuardOf(child.pid());
  ASSERT_GT(guard, 0) << "no guard in the group";
  ASSERT_EQ(::kill(guard, SIGSTOP), 0);
  ASSERT_TRUE(WaitUntil([&] { return StateOf(guard) == 'T'; }, milliseconds(10'000)));

  spawner.End();
  ASSERT_TRUE(WaitUntil([&] { return child.Exited(); }, milliseconds(10'000)));
  EXPECT_EQ(StateOf(sleep_pid), 'S') << "the stopped guard cannot have killed it";
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  auto ended = [&] {
    const char state = StateOf(sleep_pid);
    return state == 0 || state == 'Z';
  };
  EXPECT_TRUE(WaitUntil(ended, milliseconds(10'000))) << "the sleep outlived the reaping";
  EXPECT_EQ(StateOf(guard), 0) << "the guard was not reaped";
  if (!ended()) ::kill(sleep_pid, SIGKILL);
  std::filesystem::remove_all(*dir);
}

// The guard is no member GroupAlive() waits for, and it ends when the child is
// reaped: the group is then empty.
TEST(SubprocessTest, TheGroupsGuardEndsWhenTheChildIsReaped) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "exit 3"};
  o.kill_with_parent = true;
  o.kill_group_with_parent = true;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  Subprocess& child = **p;
  EXPECT_TRUE(child.guarded());
  const pid_t group = child.pid();
  ASSERT_TRUE(WaitUntil([&] { return child.Exited(); }, milliseconds(10'000)));
  EXPECT_TRUE(GroupHasOtherLiveMember(group, group)) << "no guard in the group";
  EXPECT_FALSE(child.GroupAlive()) << "the guard was counted";
  EXPECT_EQ(child.Wait(), 3);
  EXPECT_FALSE(GroupHasOtherLiveMember(group, -1)) << "the guard outlived the reaped child";
}

}  // namespace
}  // namespace holdfast::dev
