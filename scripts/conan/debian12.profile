# Conan profile for building deft offline on Debian 12: the compiler detected
# by `conan profile detect`, C++20, and every xsimd and zlib requirement
# served by xsimd/system and zlib/system (scripts/conan/*-system), which
# stand for Debian's libxsimd-dev and zlib1g-dev instead of a download from
# a remote.
include(default)

[settings]
compiler.cppstd=20

[replace_requires]
xsimd/*: xsimd/system
zlib/*: zlib/system
