# Bad flags of holdfast-bench: each is refused with a message that names it and a
# non-zero exit, before anything is started.
# Usage: cmake -DBENCH=/path/to/holdfast-bench -P bad_flags.cmake
if(NOT BENCH)
  message(FATAL_ERROR "bad_flags.cmake: set -DBENCH=<holdfast-bench>")
endif()

set(TOOL "${BENCH}")
set(TOOL_NAME holdfast-bench)
set(STARTED "holdfast-bench: etcd ")  # the run's first progress line
include(${CMAKE_CURRENT_LIST_DIR}/expect_refused.cmake)

expect_refused("--only: nonsense not in {baselines,uncontended,contended,shared,sessions,connect}"
               --only nonsense)
expect_refused("--only: sessionz not in" --only baselines,sessionz)
expect_refused("--duration: invalid duration \"banana\"" --duration banana)
expect_refused("--rounds: Value 0 not in range 1 to 20" --rounds 0)
expect_refused("--concurrency: Value 0 not in range 1 to 4096" --concurrency 1,0)
expect_refused("--tls starts holdfastd with a dev PKI of its own: it cannot be combined with --endpoint"
               --tls --etcd 127.0.0.1:1 --endpoint 127.0.0.1:2)
