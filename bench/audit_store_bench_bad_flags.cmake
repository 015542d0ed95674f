# Bad flags of audit-store-bench: each is refused with a message that names it and a
# non-zero exit, and nothing is written.
# Usage: cmake -DTOOL=/path/to/audit-store-bench -DWORK=/scratch/dir -P audit_store_bench_bad_flags.cmake
if(NOT TOOL OR NOT WORK)
  message(FATAL_ERROR "audit_store_bench_bad_flags.cmake: set -DTOOL=<audit-store-bench> -DWORK=<dir>")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

set(TOOL_NAME audit-store-bench)
set(STARTED " events ")  # a measured line
include(${CMAKE_CURRENT_LIST_DIR}/expect_refused.cmake)

expect_refused("--keys: Value 0 not in range 1 to 10000000" --keys 0)
expect_refused("--events: Value 10 not in range 1600 to 1000000000" --events 10)
expect_refused("--batch: Value 1 not in range 2 to 100000" --batch 1)
expect_refused("--commits: Value 0 not in range 1 to 100000" --commits 0)
expect_refused("--prune-batch: Value 0 not in range 1 to 100000" --prune-batch 0)
expect_refused("sqlite audit store: open ${WORK}/missing/audit.db"
               --store "sqlite:${WORK}/missing/audit.db" --events 1600)
expect_refused("audit store URL scheme \"mysql\" is not supported" --store "mysql://nowhere/audit" --events 1600)

# Nothing was written where the refused runs pointed.
file(GLOB_RECURSE left "${WORK}/*")
if(left)
  message(FATAL_ERROR "refused runs left files behind: ${left}")
endif()
file(REMOVE_RECURSE "${WORK}")
