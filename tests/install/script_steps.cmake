# What the install tests' cmake -P scripts share. Set `test_name` ("install test", ...) first.

# require(<variable>...): stops the script unless each -D<variable>=... was given.
function(require)
  foreach(required IN LISTS ARGN)
    if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
      message(FATAL_ERROR "${test_name}: -D${required}=... is required")
    endif()
  endforeach()
endfunction()

# step(<description> COMMAND <args...>): runs a command and stops the test when it fails.
function(step description)
  message(STATUS "${test_name}: ${description}")
  execute_process(${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${test_name}: ${description} failed (${result})")
  endif()
endfunction()
