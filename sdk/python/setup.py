"""The native part: setuptools' Extensions, which pyproject.toml cannot declare on its own, and the
.pth file that starts the heap sampler."""

import os
import platform

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# TLS descriptors, the model OTEP 4947 recommends (aarch64 uses them already): a reader finds the
# variable at a fixed offset from the thread pointer once the first access resolved it.
TLS_DIALECT = ["-mtls-dialect=gnu2"] if platform.machine() in ("x86_64", "AMD64") else []

# The heap sampler's probes, sampling and set of sampled blocks are the native sampler's
# (sdk/native/heap_sampling.h, sampled_set.h), reached through the `native` link beside this file.
HEAP_SAMPLER = Extension("pycollector_heap", ["src/pycollector_heap.c"], include_dirs=["native"], libraries=["m"],
                         depends=["native/heap_sampling.h", "native/sampled_set.h"],
                         extra_compile_args=["-O2", "-std=gnu11", "-fno-strict-aliasing"])

# Run by site at every interpreter start-up from site-packages: it imports pycollector_heap and
# starts it only when PYCOLLECTOR_HEAP_SAMPLE_BYTES is set (otherwise one dictionary look-up).
PTH = "pycollector_heap.pth"


class BuildPyWithPth(build_py):
    """build_py, and the .pth at the top of the build, where a wheel puts it into site-packages."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(ext_modules=[Extension("pycollector_otel_context._native", ["src/pycollector_otel_context/_native.c"],
                             extra_compile_args=["-O2", *TLS_DIALECT]),
                   HEAP_SAMPLER],
      cmdclass={"build_py": BuildPyWithPth})
