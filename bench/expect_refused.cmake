# expect_refused(EXPECTED ARG...): runs ${TOOL} ARG... and fails the test unless it
# exits non-zero with EXPECTED in its output and without ${STARTED} in its output
# (what the tool prints once it has started real work).
# Set before including: TOOL (the binary), TOOL_NAME (for messages), STARTED.
function(expect_refused expected)
  execute_process(COMMAND ${TOOL} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 20)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${TOOL_NAME} ${ARGN}: accepted (exit 0)")
  endif()
  string(FIND "${out}${err}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${TOOL_NAME} ${ARGN}: exit ${rc} without \"${expected}\":\n${out}${err}")
  endif()
  string(FIND "${out}${err}" "${STARTED}" started)
  if(NOT started EQUAL -1)
    message(FATAL_ERROR "${TOOL_NAME} ${ARGN}: started:\n${out}${err}")
  endif()
  message(STATUS "${TOOL_NAME} ${ARGN}: refused (exit ${rc}): ${expected}")
endfunction()
