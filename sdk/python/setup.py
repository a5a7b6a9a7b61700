"""The native part: setuptools' Extension, which pyproject.toml cannot declare on its own."""

import platform

from setuptools import Extension, setup

# TLS descriptors, the model OTEP 4947 recommends (aarch64 uses them already): a reader finds the
# variable at a fixed offset from the thread pointer once the first access resolved it.
TLS_DIALECT = ["-mtls-dialect=gnu2"] if platform.machine() in ("x86_64", "AMD64") else []

setup(ext_modules=[Extension("pycollector_otel_context._native", ["src/pycollector_otel_context/_native.c"],
                             extra_compile_args=["-O2", *TLS_DIALECT])])
