# KVAGENT_SANITIZE=ON builds everything with AddressSanitizer + UndefinedBehaviorSanitizer.
option(KVAGENT_SANITIZE "Build with ASan + UBSan" OFF)
if(KVAGENT_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(KVAGENT_SANITIZE=1)
endif()

# KVAGENT_FUZZ=ON (clang): every library instrumented for libFuzzer, with ASan + UBSan, and the
# harnesses in fuzz/ built (`make fuzz`).
option(KVAGENT_FUZZ "Build the libFuzzer harnesses in fuzz/ (clang only)" OFF)
if(KVAGENT_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=all
                      # GCC-only warning names in `#pragma GCC diagnostic` lines
                      -Wno-unknown-warning-option)
  add_link_options(-fsanitize=address,undefined)
endif()
