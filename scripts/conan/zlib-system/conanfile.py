"""zlib/system: stands for the zlib a system package installed (Debian's
zlib1g-dev), so that deft's Conan package builds without a remote. The
profile scripts/conan/debian12.profile swaps every zlib requirement for it.
"""
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class ZlibSystemConan(ConanFile):
    name = "zlib"
    version = "system"
    description = "zlib from a system package"
    package_type = "shared-library"
    settings = "os"

    def package_id(self):
        self.info.clear()

    def validate(self):
        header = "/usr/include/zlib.h"
        if not os.path.isfile(header):
            raise ConanInvalidConfiguration(f"zlib/system needs {header}: install zlib1g-dev (apt-get install zlib1g-dev)")

    def package_info(self):
        # Header and library are on the compiler's and linker's default paths:
        # no directories of our own, only the library's name.
        self.cpp_info.includedirs = []
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.system_libs = ["z"]
        self.cpp_info.set_property("cmake_file_name", "ZLIB")
        self.cpp_info.set_property("cmake_target_name", "ZLIB::ZLIB")
        self.cpp_info.set_property("pkg_config_name", "zlib")
