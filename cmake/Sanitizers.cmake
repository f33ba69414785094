# KVAGENT_SANITIZE=ON builds everything with AddressSanitizer + UndefinedBehaviorSanitizer.
option(KVAGENT_SANITIZE "Build with ASan + UBSan" OFF)
if(KVAGENT_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(KVAGENT_SANITIZE=1)
endif()
