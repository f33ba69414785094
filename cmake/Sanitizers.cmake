# KVAGENT_SANITIZE=ON builds everything with AddressSanitizer + UndefinedBehaviorSanitizer.
option(KVAGENT_SANITIZE "Build with ASan + UBSan" OFF)
# KVAGENT_TSAN=ON builds everything with ThreadSanitizer (`make tsan-test`).
option(KVAGENT_TSAN "Build with ThreadSanitizer" OFF)
if(KVAGENT_SANITIZE AND KVAGENT_TSAN)
  message(FATAL_ERROR "KVAGENT_SANITIZE and KVAGENT_TSAN exclude each other; use two build dirs")
endif()
if(KVAGENT_SANITIZE)
  # Without the vptr check: on a cache miss it tests that the vtable is readable by writing it to
  # a pipe(2), which fails when the process is out of descriptors -- the state the EMFILE attack
  # tests put the agent in -- and then reports a false "invalid vptr" (seen: the acceptor's
  # FlatBufferBuilder, refusing a client whose memfd_create failed with EMFILE) and aborts.
  add_compile_options(-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(KVAGENT_SANITIZE=1)
endif()
if(KVAGENT_TSAN)
  # -Wno-tsan: TSan does not model standalone fences (GCC warns at each). Ours (ipc/frame_ring.cc,
  # the sleep protocol's Dekker pairs) only order a sleep flag against a re-check; every byte they
  # guard is published with release/acquire atomics, which TSan does follow.
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer -Wno-tsan)
  add_link_options(-fsanitize=thread)
  add_compile_definitions(KVAGENT_TSAN=1)
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
