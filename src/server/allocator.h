// holdfastd's memory allocator, and how many arenas it may make.
//
// holdfastd is linked with jemalloc (the CMake option HOLDFAST_JEMALLOC, on by
// default; Debian's libjemalloc2). Most of what holdfastd allocates is gRPC's and
// protobuf's: a call's arena of a few KiB, HTTP/2 frames, messages, each freed soon
// and often on another thread than the one that made it. On glibc's malloc that
// cost a fifth of holdfastd's CPU in the uncontended cells of holdfast-bench (a
// profile: malloc_consolidate merging freed small chunks before each call's arena,
// _int_malloc, _int_free); with jemalloc the 256-caller cell ran more lock cycles on
// about a quarter less of holdfastd's CPU per cycle (docs/performance.md,
// "jemalloc"). A build with -DHOLDFAST_JEMALLOC=OFF runs on glibc's malloc.
//
// Either allocator gets kMallocArenas arenas. glibc gives a thread that finds the
// arenas it tried busy an arena of its own, up to 8 per core, and jemalloc spreads
// threads over up to 4 per core; holdfastd's gRPC and etcd-client threads then
// allocate from many heaps, and a session's few small allocations spread over many
// partly used pages. In the sessions workload of holdfast-bench (10,000 sessions),
// glibc's default cost 779 – 870 bytes of RSS per session against 688 – 734 with
// two arenas when that was measured (docs/performance.md, "Two malloc arenas"); in
// later runs within one hour, glibc with two arenas 374 – 395 bytes, jemalloc with
// its default of eight 462 – 645, with two 417 – 497.
//
// The operator's setting stands: with jemalloc, holdfastd's limit is its built-in
// `malloc_conf`, which jemalloc's MALLOC_CONF environment variable overrides
// (e.g. MALLOC_CONF=narenas:8); with glibc, MALLOC_ARENA_MAX or the
// glibc.malloc.arena_max tunable of GLIBC_TUNABLES, which holdfastd leaves to glibc.
#pragma once

#include <string>

namespace holdfast::server {

inline constexpr int kMallocArenas = 2;

// The arena limit holdfastd sets on glibc's malloc, given the two environment
// variables (nullptr when unset): kMallocArenas, or 0 when the operator's setting
// stands.
int MallocArenasToSet(const char* malloc_arena_max, const char* glibc_tunables);

// Sets the allocator up for this process: with glibc's malloc, applies
// MallocArenasToSet to this process's environment (mallopt); with jemalloc,
// nothing (its arenas come from malloc_conf, read at its first allocation).
// Call first thing in main, before any thread starts.
void SetUpAllocator();

// The allocator this process runs on, for holdfastd's start-up line: e.g.
// "jemalloc 5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c, 2 arenas",
// "glibc malloc, 2 arenas", or, when the environment set glibc's arenas,
// "glibc malloc, arenas as its environment sets them".
std::string AllocatorInUse();

}  // namespace holdfast::server
