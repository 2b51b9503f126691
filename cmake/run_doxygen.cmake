# Runs Doxygen and fails, listing the warnings, if it reported any.
file(REMOVE "${LOG}")
execute_process(COMMAND "${DOXYGEN}" "${DOXYFILE}" RESULT_VARIABLE rc)
set(warnings "")
if(EXISTS "${LOG}")
  file(READ "${LOG}" warnings)
endif()
if(NOT rc EQUAL 0 OR NOT warnings STREQUAL "")
  message(FATAL_ERROR "deft_docs: Doxygen reported problems (document the public names below, or move "
                      "internals into a `detail` namespace):\n${warnings}")
endif()
