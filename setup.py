"""The one compiled part: harness.traces.native._scan, the native event tabler, merged-trace
rewriter and interval nesting (harness/traces/native/__init__.py). It is optional: where no C
compiler is found the install goes on and the collector does all three in Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "harness.traces.native._scan",
            ["harness/traces/native/_scan.c", "harness/traces/native/_rewrite.c", "harness/traces/native/_nest.c"],
            depends=["harness/traces/native/_json.h"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
        )
    ]
)
