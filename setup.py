"""The one compiled part: harness.collect._scan, the native event tabler and merged-trace rewriter
(see their sources). It is optional: where no C compiler is found the install goes on and the
collector decodes and rewrites in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("harness.collect._scan", ["harness/collect/_scan.c", "harness/collect/_rewrite.c"],
                             depends=["harness/collect/_json.h"], optional=True,
                             extra_compile_args=["-O2"])])
