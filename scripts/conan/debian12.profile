# Conan profile for building deft offline on Debian 12: the compiler detected
# by `conan profile detect`, C++20, and every xsimd requirement served by
# xsimd/system (scripts/conan/xsimd-system), which stands for Debian's
# libxsimd-dev instead of a download from a remote.
include(default)

[settings]
compiler.cppstd=20

[replace_requires]
xsimd/*: xsimd/system
