"""The native part: setuptools' Extension, which pyproject.toml cannot declare on its own.

pycollector.pdata.serialized._native: the gateway's hot loops over serialized profiles. Without
it (no compiler at install time) pycollector runs the same pipelines in pure Python, slower."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("pycollector.pdata.serialized._native", ["pycollector/pdata/serialized/_native.c"],
                             extra_compile_args=["-O3"], optional=True)])
