// Subprocess against real child processes (sh, sleep); no server.
#include "dev/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace holdfast::dev
