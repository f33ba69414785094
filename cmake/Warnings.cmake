# kvagent_target_defaults(<target>): the flags every target of ours is built with.
# Third-party headers are included as SYSTEM so -Werror only judges our code.
function(kvagent_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()
