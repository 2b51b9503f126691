"""Conan 2 recipe for deft, a header-only C++20 tensor library.

Offline on Debian (xsimd from libxsimd-dev): scripts/conan_create.sh, which
uses the profile scripts/conan/debian12.profile. See docs/install.md.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout


class DeftConan(ConanFile):
    name = "deft"
    description = "Deferred tensors: compile-time expressions on a parallel task engine"
    topics = ("tensor", "expression-templates", "simd", "header-only", "deferred-execution")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {
        # False: xsimd is not a Conan requirement; the consumer's compiler must find
        # <xsimd/xsimd.hpp> by itself (say, from a system package).
        "with_xsimd": [True, False],
        # True: adds the deft::cuda component (deft plus the CUDA runtime) for nvcc-compiled code.
        "with_cuda": [True, False],
        # True: adds the deft::dist component (deft plus the system's MPI, as its
        # `mpicxx --showme` reports it) for programs that include deft/dist.hpp.
        "with_mpi": [True, False],
    }
    default_options = {"with_xsimd": True, "with_cuda": False, "with_mpi": False}
    exports_sources = "include/*"
    no_copy_source = True

    def set_version(self):
        # One source of truth: the macros in core/config.hpp.
        text = load(self, os.path.join(self.recipe_folder, "include", "deft", "core", "config.hpp"))
        parts = [re.search(rf"#define DEFT_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        if self.options.with_xsimd:
            # deft's kernels are written and tested against the xsimd 8 API.
            self.requires("xsimd/[>=8.1.0 <9]")
        # gunzip for data files (data/gzip.hpp) inflates with zlib.
        self.requires("zlib/[>=1.2.11 <2]")

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "deft")
        self.cpp_info.set_property("pkg_config_name", "deft")
        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "deft::deft")
        core.set_property("pkg_config_name", "deft")
        core.bindirs = []
        core.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]
        core.requires = ["zlib::zlib"]
        if self.options.with_xsimd:
            core.requires.append("xsimd::xsimd")
        if self.options.with_cuda:
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "deft::cuda")
            cuda.requires = ["core"]
            cuda.bindirs = []
            cuda.libdirs = []
            # NCCL is loaded with dlopen when allreduce first sums across GPUs.
            cuda.system_libs = ["cudart", "cublas"] + (["dl"] if self.settings.os in ("Linux", "FreeBSD") else [])
            cuda.defines = ["DEFT_CUDA_BACKEND"]
        if self.options.with_mpi:
            dist = self.cpp_info.components["dist"]
            dist.set_property("cmake_target_name", "deft::dist")
            dist.set_property("pkg_config_name", "deft-dist")
            dist.requires = ["core"]
            dist.bindirs = []
            dist.includedirs, dist.libdirs, dist.system_libs = self._system_mpi()

    def _system_mpi(self):
        # The system's MPI, as its compiler wrapper reports it (Open MPI and
        # MPICH both answer --showme / -show); Conan Center's MPI packages
        # would replace the system one that mpirun starts.
        import shlex
        import subprocess
        try:
            flags = shlex.split(subprocess.run(["mpicxx", "--showme"], capture_output=True, text=True,
                                               check=True).stdout)[1:]
        except (OSError, subprocess.CalledProcessError) as e:
            raise ConanInvalidConfiguration(f"deft with_mpi: no usable mpicxx on PATH ({e}); install MPI "
                                            "(Debian: libopenmpi-dev)")
        incdirs = [f[2:] for f in flags if f.startswith("-I")]
        libdirs = [f[2:] for f in flags if f.startswith("-L")]
        libs = [f[2:] for f in flags if f.startswith("-l")]
        return incdirs, libdirs, libs
