#!/usr/bin/env bash
# Package checks (CTest label `package`): deft used the ways a user would.
#   package_test.sh MODE SOURCE_DIR BUILD_DIR WORK_DIR [CMAKE] [CXX]
# MODE: find_package | add_subdirectory | fetchcontent | pkgconfig | conan | cuda
# BUILD_DIR is deft's configured build tree (it holds the install script);
# WORK_DIR is wiped and used for the prefix and the consumer's build.
set -euo pipefail
mode="$1" src="$2" build="$3" work="$4" cmake="${5:-cmake}" cxx="${6:-c++}"
consumer="$src/tests/package/consumer"
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

install_deft() {
  "$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
  for f in include/deft/deft.hpp share/cmake/deft/deftConfig.cmake share/cmake/deft/deftConfigVersion.cmake \
           share/cmake/deft/deftTargets.cmake share/pkgconfig/deft.pc; do
    [ -f "$prefix/$f" ] || { echo "package test: the install lacks $f"; exit 1; }
  done
}

# Configures, builds and runs the consumer; extra arguments go to its configure.
# No optimisation: the point is that it compiles, links and gives the right values.
build_consumer() {
  "$cmake" -S "$consumer" -B "$work/consumer" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE= "$@" >"$work/configure.log" \
    || { cat "$work/configure.log"; exit 1; }
  "$cmake" --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
  "$work/consumer/consumer"
}

case "$mode" in
  find_package)
    install_deft
    build_consumer -DDEFT_CONSUME=find_package -DCMAKE_PREFIX_PATH="$prefix"
    grep -q "consumer: deft 0\.1\.0 from $prefix/share/cmake/deft" "$work/configure.log" \
      || { echo "package test: find_package did not take deft from the test prefix"; cat "$work/configure.log"; exit 1; }
    # The version file must refuse an incompatible request.
    if "$cmake" -S "$consumer" -B "$work/too_new" -DCMAKE_PREFIX_PATH="$prefix" -DDEFT_CONSUME=find_package \
         -DCMAKE_CXX_COMPILER="$cxx" "-DCMAKE_PROJECT_INCLUDE=$src/tests/package/ask_version_9.cmake" \
         >"$work/too_new.log" 2>&1; then
      echo "package test: find_package(deft 9.0) succeeded against deft 0.1"; exit 1
    fi
    grep -q "deftConfig.cmake, version: 0.1.0" "$work/too_new.log" \
      || { echo "package test: find_package(deft 9.0) failed for another reason than the version"; cat "$work/too_new.log"; exit 1; }
    ;;
  add_subdirectory | fetchcontent)
    # FetchContent's consumer links the compiled mode (deft::compiled), add_subdirectory's the headers.
    build_consumer -DDEFT_CONSUME="$mode" -DDEFT_SOURCE_DIR="$src" -DDEFT_CONSUMER_COMPILED=$([ "$mode" = fetchcontent ] && echo ON || echo OFF)
    ;;
  pkgconfig)
    install_deft
    export PKG_CONFIG_PATH="$prefix/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    cflags="$(pkg-config --cflags deft)"
    libs="$(pkg-config --libs deft)"
    echo "pkg-config --cflags deft: $cflags"
    echo "pkg-config --libs deft: $libs"
    [ "$(pkg-config --modversion deft)" = 0.1.0 ] || { echo "package test: deft.pc has the wrong version"; exit 1; }
    # The .pc file is relocatable (${pcfiledir}): its include path must lead to the prefix's headers.
    incdir=""
    for f in $cflags; do case "$f" in -I*) incdir="${f#-I}" ;; esac; done
    [ -n "$incdir" ] && [ "$(realpath "$incdir")" = "$(realpath "$prefix/include")" ] \
      || { echo "package test: --cflags names '$incdir', not $prefix/include"; exit 1; }
    case " $cflags " in *" -std=c++20 "*) ;; *) echo "package test: --cflags lacks -std=c++20"; exit 1 ;; esac
    # shellcheck disable=SC2086
    "$cxx" $cflags "$consumer/main.cpp" -o "$work/consumer_pc" $libs
    "$work/consumer_pc"
    # The compiled mode from installed headers: one .cpp includes deft/src.hpp.
    echo '#include <deft/src.hpp>' >"$work/deft_runtime.cpp"
    # shellcheck disable=SC2086
    "$cxx" $cflags -DDEFT_SEPARATE_COMPILATION "$consumer/main.cpp" "$work/deft_runtime.cpp" -o "$work/consumer_pc_compiled" $libs
    "$work/consumer_pc_compiled"
    ;;
  cuda)
    # deft::cuda: a second configure of deft with DEFT_CUDA=ON, installed, and
    # a .cu consumer. Needs nvcc (skipped without one); a GPU only to run the kernel.
    nvcc="$(command -v nvcc || true)"
    [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
    if [ -z "$nvcc" ]; then
      echo "package test: SKIPPED: no nvcc (the CUDA toolkit) on this machine"
      exit 77
    fi
    "$cmake" -S "$src" -B "$work/deft" -DDEFT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DDEFT_BUILD_TESTS=OFF \
      -DDEFT_BUILD_EXAMPLES=OFF -DDEFT_BUILD_DOCS=OFF -DDEFT_INSTALL=ON >"$work/deft_configure.log" 2>&1 \
      || { cat "$work/deft_configure.log"; exit 1; }
    "$cmake" --install "$work/deft" --prefix "$prefix" >"$work/install.log"
    "$cmake" -S "$src/tests/package/cuda_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CXX_COMPILER="$cxx" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
    "$cmake" --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
    "$work/consumer/cuda_consumer"
    ;;
  conan)
    conan="$(command -v conan || true)"
    for c in "$build/conan-venv/bin/conan" "$src/build/conan-venv/bin/conan"; do
      [ -n "$conan" ] || { [ -x "$c" ] && conan="$c"; } || true
    done
    if [ -z "$conan" ]; then
      echo "package test: SKIPPED: conan is not installed (scripts/setup.sh puts it in build/conan-venv)"
      exit 77
    fi
    exec "$src/scripts/conan_create.sh" "$conan" "$work"
    ;;
  *)
    echo "package test: unknown mode '$mode'"; exit 2 ;;
esac
