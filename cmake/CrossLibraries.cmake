# A cross build (cmake/aarch64-linux-gnu.cmake): the SDK and the libraries it is made of (schemas,
# common, ipc) as static libraries for the target, nothing that would need the target's shared
# libraries to link. Included from the top-level CMakeLists.txt instead of the full build.
set(BUILD_SHARED_LIBS OFF)
# The packages' CMake configs are the host's (under /usr/lib/<host multiarch>/cmake): only their
# include directories matter for static libraries.
execute_process(COMMAND gcc -print-multiarch OUTPUT_VARIABLE host_multiarch
                OUTPUT_STRIP_TRAILING_WHITESPACE)
list(APPEND CMAKE_PREFIX_PATH /usr/lib/${host_multiarch}/cmake /usr/share/cmake)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
# Neither ZMQ, msgpack nor glog: the components that use them (zmq/, events/, master/, agent/)
# are not part of the SDK side.
find_package(Threads REQUIRED)
find_package(FlatBuffers REQUIRED)   # the host's flatc generates the headers
find_package(PkgConfig REQUIRED)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
# The host's /usr/include holds the (architecture-independent) headers of those packages. As an
# -isystem directory it would come before the target's C library headers, so it is declared
# implicit (CMake then never passes it) and searched after every system directory instead.
list(APPEND CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
list(APPEND CMAKE_C_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
add_compile_options(-idirafter /usr/include)
add_subdirectory(schemas)
add_subdirectory(common)
add_subdirectory(ipc)
add_subdirectory(sdk)

# The tests of the code with per-architecture paths (CRC32C, the rings' pause, yield and wake
# words, futex_waitv, streaming copies), built as one static executable for the target with
# GoogleTest from the host's sources (libgtest-dev ships them), to run under qemu-aarch64-static.
# It takes the sources it tests directly: kvagent_common carries the link requirement of
# libsodium, which would need the target's library.
if(EXISTS /usr/src/googletest/CMakeLists.txt)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  set(src ${PROJECT_SOURCE_DIR})
  add_executable(cross_unit_tests
    ${src}/common/src/checksum.cc
    ${src}/common/src/checksum_x86.cc
    ${src}/common/src/status.cc
    ${src}/ipc/src/cpu_yield.cc
    ${src}/ipc/src/frame_ring.cc
    ${src}/ipc/src/futex.cc
    ${src}/agent/src/stream_copy.cc
    ${src}/tests/common/checksum_test.cc
    ${src}/tests/ipc/cpu_yield_test.cc
    ${src}/tests/ipc/frame_ring_test.cc
    ${src}/tests/ipc/futex_test.cc
    ${src}/tests/agent/stream_copy_test.cc)
  target_include_directories(cross_unit_tests PRIVATE
    ${src}/common/include ${src}/ipc/include ${src}/agent/src)
  target_link_libraries(cross_unit_tests PRIVATE gtest_main Threads::Threads)
  target_link_options(cross_unit_tests PRIVATE -static)
  kvagent_target_defaults(cross_unit_tests)
endif()
