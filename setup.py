"""The one compiled part: harness.collect.native._scan, the native event tabler, merged-trace
rewriter and interval nesting (harness/collect/native/__init__.py). It is optional: where no C
compiler is found the install goes on and the collector does all three in Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "harness.collect.native._scan",
            ["harness/collect/native/_scan.c", "harness/collect/native/_rewrite.c", "harness/collect/native/_nest.c"],
            depends=["harness/collect/native/_json.h"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
        )
    ]
)
