"""Writing a file so that no reader (the collector, the TensorBoard plugin, a rank's peers after a
crash) ever sees half of it: write under a temporary name, then rename over the final one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from harness.paths import PARTIAL_SUFFIX


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through, in pieces: renamed over `path` when the block ends
    normally; on any error the temporary file is removed and `path` is left as it was."""
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        with tmp.open("wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder is gone or read-only: there is no temporary file to see either
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all; a failed write leaves no temporary file."""
    with atomic_file(path) as fh:
        fh.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
