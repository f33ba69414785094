# Toolchain for `make cross-aarch64`: Debian's g++-aarch64-linux-gnu. The cross build compiles the
# client side (the SDK and the libraries it uses: schemas, common, ipc) as static libraries, which
# is what an engine on an aarch64 node (Grace, GH200) links. Target headers and libraries come
# from the toolchain's /usr/aarch64-linux-gnu; the headers of the host's Debian -dev packages
# (FlatBuffers, libsodium) are architecture-independent and are searched after it (-idirafter,
# set in the top-level CMakeLists.txt).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # flatc runs on the host
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
