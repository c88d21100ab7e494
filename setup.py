"""The one compiled part: harness.collect._scan, the native event tabler, merged-trace rewriter and
interval nesting (see their sources). It is optional: where no C compiler is found the install goes
on and the collector does all three in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("harness.collect._scan", ["harness/collect/_scan.c", "harness/collect/_rewrite.c",
                                                      "harness/collect/_nest.c"],
                             depends=["harness/collect/_json.h"], optional=True,
                             extra_compile_args=["-O2"])])
