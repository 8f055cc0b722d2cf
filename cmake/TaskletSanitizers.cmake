# Sanitizers are chosen by the explicit cache variable TASKLET_SANITIZER (set by the presets) and
# applied to tasklet's own targets only, PRIVATE for compilation; the link flags must reach every
# executable, so tasklet_sanitize() is called on each of our targets.
set(_tasklet_san_compile "")
set(_tasklet_san_link "")
if(TASKLET_SANITIZER STREQUAL "address")
  set(_tasklet_san_compile -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  set(_tasklet_san_link -fsanitize=address,undefined)
elseif(TASKLET_SANITIZER STREQUAL "fuzzer")
  # The fuzz preset (clang): libFuzzer's coverage on all of our code, ASan + UBSan; the fuzz
  # targets themselves link libFuzzer's main (fuzz/CMakeLists.txt).
  set(_tasklet_san_compile -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                           -fno-sanitize-recover=undefined)
  set(_tasklet_san_link -fsanitize=address,undefined)
elseif(TASKLET_SANITIZER STREQUAL "thread")
  set(_tasklet_san_compile -fsanitize=thread -fno-omit-frame-pointer)
  set(_tasklet_san_link -fsanitize=thread)
elseif(NOT TASKLET_SANITIZER STREQUAL "")
  message(FATAL_ERROR "TASKLET_SANITIZER must be '', address, thread or fuzzer (got '${TASKLET_SANITIZER}')")
endif()

function(tasklet_sanitize target)
  if(_tasklet_san_compile)
    target_compile_options(${target} PRIVATE ${_tasklet_san_compile})
    target_link_options(${target} PRIVATE ${_tasklet_san_link})
  endif()
endfunction()
