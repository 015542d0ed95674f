#include "server/malloc_arenas.h"

#include <malloc.h>

#include <cstdlib>
#include <string_view>

namespace holdfast::server {

int MallocArenasToSet(const char* malloc_arena_max, const char* glibc_tunables) {
  if (malloc_arena_max != nullptr) return 0;
  if (glibc_tunables != nullptr &&
      std::string_view(glibc_tunables).find("glibc.malloc.arena_max") != std::string_view::npos) {
    return 0;
  }
  return kMallocArenas;
}

void LimitMallocArenas() {
  const int arenas =
      MallocArenasToSet(std::getenv("MALLOC_ARENA_MAX"), std::getenv("GLIBC_TUNABLES"));
  if (arenas > 0) mallopt(M_ARENA_MAX, arenas);
}

}  // namespace holdfast::server
