# Bad flags of holdfast-bench: each is refused with a message that names it and a
# non-zero exit, before anything is started.
# Usage: cmake -DBENCH=/path/to/holdfast-bench -P bad_flags.cmake
if(NOT BENCH)
  message(FATAL_ERROR "bad_flags.cmake: set -DBENCH=<holdfast-bench>")
endif()

function(expect_refused expected)
  execute_process(COMMAND ${BENCH} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 20)
  if(rc EQUAL 0)
    message(FATAL_ERROR "holdfast-bench ${ARGN}: accepted (exit 0)")
  endif()
  string(FIND "${out}${err}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "holdfast-bench ${ARGN}: exit ${rc} without \"${expected}\":\n${out}${err}")
  endif()
  string(FIND "${out}${err}" "holdfast-bench: etcd " started)
  if(NOT started EQUAL -1)
    message(FATAL_ERROR "holdfast-bench ${ARGN}: started a run:\n${out}${err}")
  endif()
  message(STATUS "holdfast-bench ${ARGN}: refused (exit ${rc}): ${expected}")
endfunction()

expect_refused("--only: nonsense not in {baselines,uncontended,contended,shared,sessions}"
               --only nonsense)
expect_refused("--only: sessionz not in" --only baselines,sessionz)
expect_refused("--duration: invalid duration \"banana\"" --duration banana)
expect_refused("--rounds: Value 0 not in range 1 to 20" --rounds 0)
