"""xsimd/system: stands for the xsimd headers a system package installed
(Debian's libxsimd-dev), so that deft's Conan package builds without a remote.
The profile scripts/conan/debian12.profile swaps every xsimd requirement for it.
"""
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class XsimdSystemConan(ConanFile):
    name = "xsimd"
    version = "system"
    description = "xsimd headers from a system package"
    package_type = "header-library"
    settings = "os"

    def package_id(self):
        self.info.clear()

    def validate(self):
        header = "/usr/include/xsimd/xsimd.hpp"
        if not os.path.isfile(header):
            raise ConanInvalidConfiguration(f"xsimd/system needs {header}: install libxsimd-dev (apt-get install libxsimd-dev)")

    def package_info(self):
        # The headers are on the compiler's default search path: no include dirs
        # of our own, so /usr/include is never added as -I/-isystem.
        self.cpp_info.includedirs = []
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "xsimd")
        self.cpp_info.set_property("cmake_target_name", "xsimd")
        self.cpp_info.set_property("pkg_config_name", "xsimd")
