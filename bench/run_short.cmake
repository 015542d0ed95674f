# Runs `holdfast-bench --short`; passes when it exits 0 and prints a `bench:` line.
# Usage: cmake -DBENCH=/path/to/holdfast-bench -P run_short.cmake
if(NOT BENCH)
  message(FATAL_ERROR "run_short.cmake: set -DBENCH=<holdfast-bench>")
endif()
execute_process(COMMAND "${BENCH}" --short
                OUTPUT_VARIABLE out
                RESULT_VARIABLE rc
                TIMEOUT 280)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "holdfast-bench --short exited with ${rc}")
endif()
if(NOT out MATCHES "(^|\n)bench: uncontended_vs_raw_cycle=[^\n]* contended_vs_etcd_lock=[^\n]* p99_uncontended_vs_raw=[^\n]* keepalive_vs_raw=")
  message(FATAL_ERROR "holdfast-bench --short printed no `bench:` line")
endif()
