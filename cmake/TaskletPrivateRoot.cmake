# tasklet_private_root(<target> <name> <folder> PUBLIC|PRIVATE)
# An include root of <target>'s own (build/layers/<name>) that holds <folder> as <name>/: a
# component outside src/ (rules, etcd) includes its private headers by component and file name
# ("etcd/gateway.hpp"), as the engine's layers include theirs ("scheduler/domain.hpp"). PUBLIC
# where the component's tests reach its private headers too.
function(tasklet_private_root target name folder scope)
  set(root ${PROJECT_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${root})
  if(NOT IS_SYMLINK ${root}/${name})
    file(CREATE_LINK ${folder} ${root}/${name} SYMBOLIC)
  endif()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${root}>)
endfunction()
