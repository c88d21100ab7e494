"""The native extension under AddressSanitizer and UBSan (launch/sanitize.sh, `make sanitize`): its
tests and a short fuzz run (tests/fuzz_native.py) on a sanitized build must finish clean. Here the
fuzz budget is 5 s and the two largest real traces' rewrite comparisons (about 45 s under ASan)
are left out; `make sanitize` runs them all and fuzzes for 60 s."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = os.environ.get("SANITIZE_CC", "gcc")


def _missing() -> str | None:
    """Why the sanitized build cannot be made here, or None."""
    if shutil.which(CC) is None:
        return f"no {CC}: the sanitized build needs gcc and its libasan"
    lib = subprocess.run([CC, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(lib) or not os.path.exists(lib):
        return f"{CC} has no libasan.so (Debian: apt-get install libasan8)"
    if not (Path(sys.prefix) / "bin" / "python").exists():
        return f"no {sys.prefix}/bin/python: launch/sanitize.sh runs $VENV/bin/python"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_native_code_is_clean_under_sanitizers():
    # a fixed seed: the same inputs on every CI run (make sanitize draws a new one each time)
    env = dict(os.environ, VENV=sys.prefix, FUZZ_SECONDS="5", FUZZ_SEED="1")
    env["PYTEST_ADDOPTS"] = '-k "not (rewrite_the_same and (df_index_resolver or torchrec))"'
    for name in ("HARNESS_NATIVE_SCAN", "HARNESS_NATIVE_OFF", "HARNESS_NATIVE_PATH", "LD_PRELOAD"):
        env.pop(name, None)
    done = subprocess.run(
        ["bash", str(ROOT / "launch" / "sanitize.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (
        f"launch/sanitize.sh exit {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    )
    assert "sanitize: clean" in done.stdout
