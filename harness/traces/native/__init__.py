"""The collector's C code behind one loader.

One extension module, `_scan`, is built by the install from `_scan.c` (the event tabler, for
read/decode.py), `_rewrite.c` (merged-trace blocks, for report/merged.py) and `_nest.c` (interval
nesting, for read/host_ops.py), with `_json.h` shared. It is optional: without a C compiler the install
goes on, and each caller runs its Python twin, which gives the same answers
(tests/test_native_scan.py, tests/test_native_merged.py, tests/test_runup.py).

`function(name)` is the native function `name`, or None where the extension is not built or the
function is switched off. The switches are read at each call, so they apply to a running process:
1. HARNESS_NATIVE_SCAN=0 switches off every native function;
2. HARNESS_NATIVE_OFF=<names> (comma-separated: scan, rewrite, nest) switches off those named.

HARNESS_NATIVE_PATH=<file>, read once at import, loads the extension from that file instead of the
installed one (launch/sanitize.sh: a build with AddressSanitizer and UBSan); a file that does not
load is an ImportError, never a quiet fall-back to Python.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

PATH_ENV = "HARNESS_NATIVE_PATH"

if not os.environ.get(PATH_ENV):
    try:  # built by the install when a C compiler is there (setup.py)
        from harness.traces.native import _scan as extension  # type: ignore[attr-defined]  # a C extension: no stub
    except ImportError:
        extension = None
else:  # this file, under the installed module's name
    _spec = importlib.util.spec_from_file_location(f"{__name__}._scan", os.environ[PATH_ENV])
    if _spec is None or _spec.loader is None:
        raise ImportError(f"{PATH_ENV}={os.environ[PATH_ENV]} is not an extension module")
    extension = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(extension)

ALL_ENV = "HARNESS_NATIVE_SCAN"
OFF_ENV = "HARNESS_NATIVE_OFF"
FUNCTIONS = ("scan", "rewrite", "nest")


def function(name: str) -> Callable[..., Any] | None:
    """The native function `name` (one of FUNCTIONS), or None: not built, or switched off."""
    if name not in FUNCTIONS:
        raise ValueError(f"no native function {name!r}; there are {', '.join(FUNCTIONS)}")
    if extension is None or os.environ.get(ALL_ENV, "1") == "0":
        return None
    if name in {n.strip() for n in os.environ.get(OFF_ENV, "").split(",")}:
        return None
    return getattr(extension, name)
