#include "server/allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace holdfast::server {
namespace {

TEST(AllocatorTest, LimitsGlibcArenasUnlessTheOperatorChose) {
  EXPECT_EQ(MallocArenasToSet(nullptr, nullptr), kMallocArenas);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.tcache_count=0"), kMallocArenas);
  EXPECT_EQ(MallocArenasToSet("8", nullptr), 0);
  EXPECT_EQ(MallocArenasToSet("", nullptr), 0);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.arena_max=4"), 0);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.check=0:glibc.malloc.arena_max=1"), 0);
}

#ifdef HOLDFAST_WITH_JEMALLOC
// This test binary links jemalloc as holdfastd does: its malloc_conf must have been
// read, or holdfastd would run on jemalloc's default of four arenas per core.
// (Run with MALLOC_CONF=narenas:N set, jemalloc reports N: the operator's setting.)
TEST(AllocatorTest, RunsOnJemallocWithTwoArenas) {
  if (const char* conf = std::getenv("MALLOC_CONF");
      conf != nullptr && std::string(conf).find("narenas") != std::string::npos) {
    GTEST_SKIP() << "MALLOC_CONF sets the arenas";
  }
  SetUpAllocator();
  const std::string in_use = AllocatorInUse();
  EXPECT_EQ(in_use.rfind("jemalloc 5.", 0), 0u) << in_use;
  EXPECT_NE(in_use.find(", 2 arenas"), std::string::npos) << in_use;
}
#else
TEST(AllocatorTest, RunsOnGlibcWithTwoArenas) {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr || std::getenv("GLIBC_TUNABLES") != nullptr) {
    GTEST_SKIP() << "the environment sets glibc's arenas";
  }
  SetUpAllocator();
  EXPECT_EQ(AllocatorInUse(), "glibc malloc, 2 arenas");
}
#endif

}  // namespace
}  // namespace holdfast::server
