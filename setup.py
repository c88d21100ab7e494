"""The one compiled part: harness.collect._scan, the native event tabler (see its source). It is
optional: where no C compiler is found the install goes on and the collector decodes in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("harness.collect._scan", ["harness/collect/_scan.c"], optional=True,
                             extra_compile_args=["-O2"])])
