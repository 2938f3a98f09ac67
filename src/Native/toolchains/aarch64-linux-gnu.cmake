# Cross-compiles libktl_native.so for linux-arm64 with the GNU cross toolchain
# (Debian/Ubuntu: gcc-aarch64-linux-gnu and libc6-dev-arm64-cross; qemu-user to run the tests).
#   cmake -S src/Native -B artifacts/native/obj/linux-arm64 \
#         -DCMAKE_TOOLCHAIN_FILE="$PWD/src/Native/toolchains/aarch64-linux-gnu.cmake"
# A relative path is looked up from the build dir, then from src/Native, never from the
# current directory, hence $PWD.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Headers and libraries come from the target sysroot only; build tools from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# With qemu-user installed, ctest can run the arm64 tests on an x64 host. An emulator given
# on the command line (-DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-L;/usr/aarch64-linux-gnu")
# wins over this default.
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(KTL_QEMU_AARCH64 qemu-aarch64)
  if(KTL_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${KTL_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
  endif()
endif()
