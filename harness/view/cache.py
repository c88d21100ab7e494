"""Serving a report folder's files (and pages made from them) to many readers at once from one
bounded cache of gzip-compressed bodies."""

from __future__ import annotations

import gzip
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from harness.view.runs import parse_json_object, read_report_file, unless_missing

CACHE_ENTRIES = 8
CACHE_BYTES = 64 * 2**20  # compressed bytes kept, all entries together
GZIP_LEVEL = 6


@dataclass(frozen=True)
class FileKey:
    """One version of a file: its path and what stat says of its contents."""

    path: str
    mtime_ns: int
    size: int


def file_key(path: Path) -> FileKey | None:
    """The key of the file `path` leads to (a link followed) now; None when there is none,
    ValueError when it cannot be looked at."""
    st = unless_missing(path.stat, path)
    return None if st is None else FileKey(str(path), st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class Body:
    """A response made once: status, content type and the content, gzip-compressed."""

    code: int
    content_type: str
    gzipped: bytes


Maker = Callable[[], tuple[int, str, bytes]]


class BodyCache:
    """The last few responses made from report files, gzip-compressed, the least recently used
    dropped beyond `max_entries` or `max_bytes` in all (a larger one is made and not kept).

    Bodies are made one at a time, and a request that waited finds the body the one before it
    made: a burst of requests for a new file costs one read, one parse and one compressed copy,
    not one each. `made` and `hits` count what happened (for tests and curious admins)."""

    def __init__(self, max_entries: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.made = 0
        self.hits = 0
        self._bodies: OrderedDict[Hashable, Body] = OrderedDict()
        self._lock = threading.Lock()
        self._making = threading.Lock()

    @property
    def stored_bytes(self) -> int:
        with self._lock:
            return sum(len(b.gzipped) for b in self._bodies.values())

    def get(self, key: Hashable, make: Maker) -> Body:
        """The body kept under `key`, or the one `make` returns (code, content type, content)."""
        body = self._lookup(key)
        if body is not None:
            return body
        with self._making:
            body = self._lookup(key)
            if body is None:
                code, content_type, content = make()
                body = Body(code, content_type, gzip.compress(content, compresslevel=GZIP_LEVEL, mtime=0))
                self._keep(key, body)
        return body

    def _lookup(self, key: Hashable) -> Body | None:
        with self._lock:
            body = self._bodies.get(key)
            if body is not None:
                self._bodies.move_to_end(key)
                self.hits += 1
            return body

    def _keep(self, key: Hashable, body: Body) -> None:
        with self._lock:
            self.made += 1
            if len(body.gzipped) > self.max_bytes:
                return
            self._bodies[key] = body
            total = sum(len(b.gzipped) for b in self._bodies.values())
            while len(self._bodies) > self.max_entries or total > self.max_bytes:
                _, dropped = self._bodies.popitem(last=False)
                total -= len(dropped.gzipped)


def json_file_body(cache: BodyCache, path: Path, content_type: str = "application/json") -> Body | None:
    """A report folder's JSON file as written, byte for byte, once it is known to hold a JSON
    object (else a 500 saying why); None when there is no such file. ValueError when it cannot
    be looked at."""
    key = file_key(path)
    if key is None:
        return None
    return cache.get(("json", key), lambda: _checked_json(path, content_type))


def _checked_json(path: Path, content_type: str) -> tuple[int, str, bytes]:
    try:
        data = read_report_file(path)
        parse_json_object(data, path.name)
    except FileNotFoundError:
        return 404, "text/plain", f"{path.name} disappeared; reload".encode()
    except OSError as exc:
        return 500, "text/plain", f"cannot read {path.name}: {exc.strerror}".encode()
    except ValueError as exc:
        return 500, "text/plain", str(exc).encode()
    return 200, content_type, data


def static_file_body(cache: BodyCache, path: Path, content_type: str) -> Body:
    """An installed asset (plotly.min.js), read once per version of the file."""
    key = file_key(path)
    return cache.get(("static", key), lambda: (200, content_type, path.read_bytes()))
