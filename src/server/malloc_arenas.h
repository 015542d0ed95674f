// How many malloc arenas holdfastd lets glibc make.
//
// glibc gives a thread that finds the arenas it tried locked an arena of its own,
// up to 8 per core. holdfastd's gRPC and etcd-client threads then each allocate
// from their own heap, and a session's few small allocations spread over many
// partly used pages: in the sessions workload of holdfast-bench, 10,000 sessions
// cost 779 – 870 bytes of RSS each with glibc's default against 688 – 734 with two
// arenas, at no throughput cost measurable on two cores (docs/performance.md,
// "Two malloc arenas"). holdfastd therefore asks for kMallocArenas at start, unless
// the operator chose a number through glibc's own MALLOC_ARENA_MAX or the
// glibc.malloc.arena_max tunable of GLIBC_TUNABLES, which are left to glibc.
#pragma once

namespace holdfast::server {

inline constexpr int kMallocArenas = 2;

// The arena limit holdfastd sets, given the two environment variables (nullptr
// when unset): kMallocArenas, or 0 when the operator's setting stands.
int MallocArenasToSet(const char* malloc_arena_max, const char* glibc_tunables);

// Applies MallocArenasToSet to this process's environment (mallopt). Call first
// thing in main, before any thread starts.
void LimitMallocArenas();

}  // namespace holdfast::server
