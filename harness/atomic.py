"""Writing a file so that no reader (the collector, the TensorBoard plugin, a rank's peers after a
crash) ever sees half of it: write under a temporary name, then rename over the final one."""

from __future__ import annotations

import os
from pathlib import Path

from harness.paths import PARTIAL_SUFFIX


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
