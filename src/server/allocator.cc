#include "server/allocator.h"

#include <malloc.h>

#include <cstddef>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"

// jemalloc's control interface, present when holdfastd is linked with it (or it is
// preloaded): weak, so that a build without jemalloc links and finds it null.
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                       size_t newlen) __attribute__((weak));

#ifdef HOLDFAST_WITH_JEMALLOC
// Read by jemalloc when it initialises, before main; MALLOC_CONF in the environment
// is read after it and wins (server/allocator.h). It reaches holdfastd's executable
// (from the static hf_server) because main calls SetUpAllocator in this file, and
// the linker exports it there because libjemalloc defines it too.
extern "C" const char* malloc_conf = "narenas:2";
static_assert(holdfast::server::kMallocArenas == 2, "keep malloc_conf's narenas in step");
#endif

namespace holdfast::server {
namespace {

int glibc_arenas_set = 0;

}  // namespace

int MallocArenasToSet(const char* malloc_arena_max, const char* glibc_tunables) {
  if (malloc_arena_max != nullptr) return 0;
  if (glibc_tunables != nullptr &&
      std::string_view(glibc_tunables).find("glibc.malloc.arena_max") != std::string_view::npos) {
    return 0;
  }
  return kMallocArenas;
}

void SetUpAllocator() {
  if (mallctl != nullptr) return;
  const int arenas =
      MallocArenasToSet(std::getenv("MALLOC_ARENA_MAX"), std::getenv("GLIBC_TUNABLES"));
  if (arenas > 0 && mallopt(M_ARENA_MAX, arenas) == 1) glibc_arenas_set = arenas;
}

std::string AllocatorInUse() {
  if (mallctl != nullptr) {
    const char* version = nullptr;
    size_t size = sizeof(version);
    unsigned narenas = 0;
    size_t nsize = sizeof(narenas);
    if (mallctl("version", &version, &size, nullptr, 0) != 0 || version == nullptr) {
      version = "(version unknown)";
    }
    std::string out = absl::StrCat("jemalloc ", version);
    if (mallctl("opt.narenas", &narenas, &nsize, nullptr, 0) == 0) {
      absl::StrAppend(&out, ", ", narenas, narenas == 1 ? " arena" : " arenas");
    }
    return out;
  }
  if (glibc_arenas_set > 0) return absl::StrCat("glibc malloc, ", glibc_arenas_set, " arenas");
  return "glibc malloc, arenas as its environment sets them";
}

}  // namespace holdfast::server
