"""Writing a file so that no reader (the collector, the TensorBoard plugin, a rank's peers after a
crash) ever sees half of it: write under a temporary name, then rename over the final one."""

from __future__ import annotations

import os
from pathlib import Path

from harness.paths import PARTIAL_SUFFIX


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all; a failed write leaves no temporary file."""
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder is gone or read-only: there is no temporary file to see either
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
