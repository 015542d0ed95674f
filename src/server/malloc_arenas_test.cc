#include "server/malloc_arenas.h"

#include <gtest/gtest.h>

namespace holdfast::server {
namespace {

TEST(MallocArenasTest, LimitsArenasUnlessTheOperatorChose) {
  EXPECT_EQ(MallocArenasToSet(nullptr, nullptr), kMallocArenas);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.tcache_count=0"), kMallocArenas);
  EXPECT_EQ(MallocArenasToSet("8", nullptr), 0);
  EXPECT_EQ(MallocArenasToSet("", nullptr), 0);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.arena_max=4"), 0);
  EXPECT_EQ(MallocArenasToSet(nullptr, "glibc.malloc.check=0:glibc.malloc.arena_max=1"), 0);
}

}  // namespace
}  // namespace holdfast::server
