# tasklet_set_warnings(<target>): the project's warning set, applied PRIVATE to our own targets.
function(tasklet_set_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Woverloaded-virtual -Wconversion -Wsign-conversion -Wimplicit-fallthrough)
  if(TASKLET_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
