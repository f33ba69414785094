# kvagent_target_defaults(<target>): the flags every target of ours is built with.
# Third-party headers are included as SYSTEM so -Werror only judges our code.
function(kvagent_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  # The fuzz build (clang) warns differently on third-party macros (infiniband/verbs.h); the
  # gcc builds, which CI and every developer run, keep -Werror.
  if(NOT KVAGENT_FUZZ)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # In a unity build gcc takes every .cc but the first for a header, and warns that a class
  # defined in a .cc has a member whose type is in that .cc's anonymous namespace; compiled
  # alone (KVAGENT_UNITY_BUILD=OFF) the same code draws no warning.
  if(KVAGENT_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
endfunction()
