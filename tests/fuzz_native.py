"""Fuzz the native extension's three functions (harness/traces/native: scan, rewrite, nest) for a
bounded time: each call must return or raise a Python exception, never crash. Run by
launch/sanitize.sh on the ASan + UBSan build, where any memory error or undefined behaviour aborts
the process; it works on the installed build too (only Python-visible failures are seen then).
Not a pytest file (tests/test_sanitize.py runs it through launch/sanitize.sh).

    python tests/fuzz_native.py [--seconds 60] [--seed N] [--out build/sanitize] [--only scan,nest]
    python tests/fuzz_native.py --replay build/sanitize/crash-scan-0123abcd.bin
    python tests/fuzz_native.py --make-corpus     # rewrite tests/data/fuzz's seeds from tests/data/traces

How it works:
1. inputs start from the seeds in tests/data/fuzz (blocks cut from real Kineto traces, and
   hand-made edge cases) and are mutated, 1-4 mutations stacked: bit flips, byte insertions and
   deletions, truncation after each kind of byte (quote, backslash, colon, digit, UTF-8 lead...)
   and inside each kind of token (an escape, a number, a UTF-8 sequence), splicing two blocks,
   values swapped for odd ones (every JSON type, numbers at the edges of int64 and double and of
   the 64-char conversion buffer, escaped keys), invalid UTF-8, unterminated escapes (\\u12), NUL
   bytes, and rarely the giants: nesting 100k deep, multi-MB strings, 5000-digit numbers;
2. the calls vary the other arguments too, now and then out of their normal range: ranges
   outside the buffer, the block inside a longer buffer (which must give the same answer),
   pre-filled or odd `names`/`tids` dicts, a new_thread callback that raises or misbehaves,
   span and interval arrays of odd length, type or alignment, NaN/inf times;
3. with the sanitized build, gcc's trace-pc coverage (tests/fuzz_cov.c) keeps every input that
   reaches a new edge of the C code, or an edge a new number of times, as a further parent
   (without it, or with --blind: blind mutation). Not atheris: its libFuzzer sees C coverage only
   in code built by clang with -fsanitize=fuzzer-no-link, and wants clang's ASan runtime, not gcc's;
   random bytes (hypothesis' st.binary) reach about 4% of the edges this reaches;
4. checks on each answer: its shape; rewrite's output is JSON with as many events as it says;
   nest's parents are the Python walk's; with normal arguments no exception at all, with odd
   ones any but SystemError (a NULL return without an exception set is a C bug).
A finding stops the run: a worker process does the calls and writes each input to a mapped file
before the call, so when it aborts (a sanitizer report) or fails a check this process saves that
input as <out>/crash-<function>-<hash>.bin (the raw bytes; the other arguments in the .call.json
beside it), prints it and exits 1. --replay runs one saved call again (tests/data/fuzz/regress-*.bin
are such inputs of fixed findings, kept as seeds).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import hashlib
import json
import math
import mmap
import os
import random
import re
import struct
import subprocess
import sys
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "fuzz"
TRACES = ROOT / "tests" / "data" / "traces"
FUNCTIONS = ("scan", "rewrite", "nest")
WEIGHTS = (0.45, 0.4, 0.15)
MAX_INPUT = 8 << 20  # bytes of data in one call
RECORD_BYTES = MAX_INPUT + (1 << 20)  # the mapped file holding the call being made
KEEP_LIMIT = 64 << 10  # inputs larger than this are not kept as parents (slow to mutate)
PARENTS_LIMIT = 4000  # per function


@dataclass
class Call:
    """One native call: its function, its raw input bytes and the other arguments (JSON)."""

    function: str
    data: bytes
    params: dict[str, Any] = field(default_factory=dict)

    def odd(self) -> bool:
        """Whether an argument other than the data is out of its normal range (exceptions allowed)."""
        return bool(self.params.get("odd"))


class Finding(Exception):
    """A check failed on a call's answer."""


# ---------------------------------------------------------------------------------------------
# Mutation

TOKENS = [
    b'"', b"\\", b"\\u", b"\\u12", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b'\\"', b"\\\\", b"{", b"}", b"[",
    b"]", b",", b":", b"null", b"true", b"false", b"nul", b"tru", b"-", b"0", b"-0", b"00", b"1e999", b"1e-999",
    b"-1e308", b"9007199254740993", b"99999999999999999999", b"1.", b".5", b"1e", b"1e+", b"0.1e1", b"\x00", b"\xff",
    b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98\x80", b"\xc3\xa9", b" ", b"\t",
    b"\n", b"\r", b"\x0b", b'"ph"', b'"X"', b'"M"', b'"i"', b'"s"', b'"f"', b'"ts"', b'"dur"', b'"pid"', b'"tid"',
    b'"name"', b'"cat"', b'"args"', b'"id"', b'"bp"', b'"tts"', b'"cname"', b'"correlation"', b'"Collective name"',
    b'"Process Group Name"', b'"In msg nelems"', b'"dtype"', b'"cpu_op"', b'"kernel"', b'"user_annotation"',
    b'"gpu_memcpy"', b'"cuda_runtime"', b'"ProfilerStep#1"', b'"p\\u0068"', b'"t\\u0073"',
]  # fmt: skip
NUMBERS = [
    b"0", b"-0", b"0.0", b"-0.0", b"1", b"-1", b"1.5", b"1e3", b"1E+2", b"1.5e-7", b"5e-324",
    b"2.2250738585072014e-308", b"1.7976931348623157e308", b"1e309", b"-1e309", b"9007199254740992",
    b"9007199254740993", b"-9007199254740993", b"999999999999999999", b"9999999999999999999", b"9223372036854775807",
    b"9223372036854775808", b"-9223372036854775808", b"123456789012345678901234567890",
    b"0.1234567890123456789012345", b"1694128201545123.25", b"1694128201545123.123456", b"0.000000000000000000000001",
]  # fmt: skip
VALUES = NUMBERS + [
    b'""', b'"X"', b'"M"', b'"1"', b'"-1"', b'"\\u0058"', b'"\\ud800"', b'"a\\"b"', b'"\xc3\xa9"', b'"\xff"', b"null",
    b"true", b"false", b"[]", b"{}", b"[1]", b'{"a":1}', b'{"correlation":1}', b'{"correlation":-1}',
    b'{"correlation":1.5}', b'{"correlation":"1"}', b'{"correlation":99999999999999999999}',
    b'{"Collective name":"allreduce"}', b'{"Collective name":null}', b'{"In msg nelems":1,"dtype":"Float"}',
    b'{"Process Group Name":"0"}', b"[[[[[[[[]]]]]]]]",
]  # fmt: skip
CUT_KINDS = (b'"', b"\\", b":", b",", b"{}", b"[]", b"0123456789", b"-.eE", b"u", bytes(range(0x80, 0x100)))
TRUNCATE_AT = [re.compile(b"[" + re.escape(kind) + b"]") for kind in CUT_KINDS]
VALUE_START = re.compile(rb":\s*")
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
KEY = re.compile(rb'"([^"\\]{1,20})"\s*:')
OTHER = re.compile(rb"[^,}\]]*")  # up to the end of a value that is neither a string nor a number


def _pos(rng: random.Random, data: bytes) -> int:
    return rng.randint(0, len(data))


def _span(rng: random.Random, data: bytes) -> tuple[int, int]:
    i = _pos(rng, data)
    return i, min(len(data), i + rng.choice((1, 2, 4, 8, 16, 64, 256)))


def _match(rng: random.Random, pattern: re.Pattern[bytes], data: bytes) -> re.Match[bytes] | None:
    found = list(pattern.finditer(data))
    return rng.choice(found) if found else None


INTERESTING = (0, 0x20, 0x22, 0x5C, 0x2C, 0x3A, 0x7B, 0x7D, 0x5B, 0x5D, 0x7F, 0x80, 0xBF, 0xC0, 0xE0, 0xED, 0xF0, 0xFF)


def flip_bits(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def set_bytes(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.choice((1, 2, 3))):
        out[rng.randrange(len(out))] = rng.choice(INTERESTING + (rng.randrange(256),))
    return bytes(out)


def insert_token(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    i = _pos(rng, data)
    return data[:i] + rng.choice(TOKENS) + data[i:]


def insert_random(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    i = _pos(rng, data)
    return data[:i] + rng.randbytes(rng.choice((1, 2, 3, 8, 32))) + data[i:]


def delete_range(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    i, j = _span(rng, data)
    return data[:i] + data[j:]


def duplicate_range(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    i, j = _span(rng, data)
    return data[:j] + data[i:j] * rng.choice((1, 2, 8)) + data[j:]


def truncate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Cut just before or after a byte of one kind (a quote, a backslash, a digit, a UTF-8 byte...)."""
    m = _match(rng, rng.choice(TRUNCATE_AT), data)
    i = m.start() + rng.randint(0, 1) if m else _pos(rng, data)
    return data[:i] if rng.random() < 0.8 else data[i:]


INSIDE = [
    re.compile(rb"\\u[0-9a-fA-F]{0,4}|\\."),  # an escape
    re.compile(rb"-?\d+(?:\.\d*)?(?:[eE][+-]?\d*)?"),  # a number
    re.compile(rb'"(?:[^"\\]|\\.){0,12}"'),  # a short string
    re.compile(rb"true|false|null"),
    re.compile(rb"[\xc2-\xf4][\x80-\xbf]{1,3}"),  # a UTF-8 sequence
]


def truncate_inside(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """End the block inside a token: an escape (\\u12), a number, a short string, a literal, a UTF-8 sequence."""
    m = _match(rng, rng.choice(INSIDE), data)
    if m is None:
        return truncate(rng, data, pool)
    return data[: rng.randint(m.start() + 1, m.end())]


def splice(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    other = rng.choice(pool)
    if rng.random() < 0.5:  # at event boundaries
        cuts = [m.end() for m in re.finditer(rb"\},\s*", data)] or [_pos(rng, data)]
        others = [m.start() for m in re.finditer(rb"\{", other)] or [0]
        return data[: rng.choice(cuts)] + other[rng.choice(others) :]
    return data[: _pos(rng, data)] + other[_pos(rng, other) :]


def swap_events(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    parts = re.split(rb"(?<=\}),\s*(?=\{)", data)
    if len(parts) < 2:
        return data + b"," + data
    rng.shuffle(parts)
    if rng.random() < 0.3:
        parts.append(rng.choice(parts))
    return b",".join(parts)


def replace_value(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    m = _match(rng, VALUE_START, data)
    if m is None:
        return insert_token(rng, data, pool)
    end = m.end()
    old = STRING.match(data, end) or NUMBER.match(data, end) or OTHER.match(data, end)
    return data[:end] + rng.choice(VALUES) + data[old.end() if old else end :]


def rename_key(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    m = _match(rng, KEY, data)
    if m is None:
        return insert_token(rng, data, pool)
    key = rng.choice((b"ph", b"ts", b"dur", b"pid", b"tid", b"name", b"cat", b"args", b"id", b"s", b"bp", b"tts",
                      b"cname", b"correlation", b"Collective name", b"p\\u0068", b"t\\u0073", b"x"))  # fmt: skip
    return data[: m.start(1)] + key + data[m.end(1) :]


def change_number(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    m = _match(rng, NUMBER, data)
    if m is None:
        return insert_token(rng, data, pool)
    choice = rng.random()
    if choice < 0.25:  # a length at the edge of the fast path (19 digits) or of the 64-char conversion buffer
        length = rng.choice((17, 18, 19, 20, 21, 22, 23, 24, 62, 63, 64, 65, 66))
        head = rng.choice((b"1", b"-1", b"0.", b"-1.", b"1.5e-", b"1E+"))
        new = head + b"7" * (length - len(head))
    elif choice < 0.45:
        new = rng.choice(NUMBERS)
    elif choice < 0.6:
        new = m.group() + rng.choice((b"0", b"000", b"9" * 12, b".5", b"e10", b"e-10", b"e400"))
    else:
        new = str(rng.choice((-1, 1)) * rng.getrandbits(rng.choice((8, 31, 53, 54, 63, 64, 70)))).encode()
    return data[: m.start()] + new + data[m.end() :]


BROKEN = [
    b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xc2", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf0\x9f\x98", b"\x00", b"\x00" * 8, b"\x1f", b"\\u12", b"\\u",
    b"\\", b"\\x41", b"\\U0041", b"\\u00G0", b"\\ud800\\u0041",
]  # fmt: skip


def break_utf8(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Invalid UTF-8, NULs or an unterminated escape inside a string."""
    m = _match(rng, STRING, data)
    i = rng.randint(m.start() + 1, m.end() - 1) if m else _pos(rng, data)
    bad = rng.choice(BROKEN)
    return data[:i] + bad + (data[i:] if rng.random() < 0.8 else b"")


def deep_nesting(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A value nested k deep, closed or not: k around the scanner's depth limit, or huge."""
    k = rng.choice((62, 63, 64, 65, 66, 200, 1000, 100_000))
    opening, closing = rng.choice(((b"[", b"]"), (b'{"a":', b"}"), (b'[{"a":', b"}]")))
    inner = rng.choice((b"1", b'"x"', b"null", b"[]", b"{}", b""))
    close = closing * k if rng.random() < 0.7 else closing * rng.randint(0, k)
    m = _match(rng, VALUE_START, data)
    if m is None or rng.random() < 0.2:
        return opening * k + inner + close
    stop = rng.randint(m.end(), min(len(data), m.end() + 64))
    return data[: m.end()] + opening * k + inner + close + data[stop:]


def giant(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A string of up to 4 MB (plain, escapes, multi-byte, or unterminated), or a number of up to 5000 digits."""
    if rng.random() < 0.3:
        value = b"-" * rng.randint(0, 1) + b"1" + b"7" * rng.choice((18, 19, 63, 64, 400, 5000))
        value += rng.choice((b"", b".5", b"e5", b"e-99999", b"." + b"3" * 5000))
    else:
        unit = rng.choice((b"a", b"\\n", b'\\"', b"\\u00e9", b"\\ud83d\\ude00", b"\xc3\xa9", b"\xf0\x9f\x98\x80"))
        size = rng.choice((1000, 65_536, 1 << 20, 4 << 20)) // len(unit)
        value = b'"' + unit * size + (b'"' if rng.random() < 0.8 else b"")
    m = _match(rng, VALUE_START, data)
    if m is None:
        return value
    n = NUMBER.match(data, m.end()) or STRING.match(data, m.end())
    return data[: m.end()] + value + data[n.end() if n else m.end() :]


MUTATORS: list[tuple[Callable[[random.Random, bytes, list[bytes]], bytes], float]] = [
    (flip_bits, 1.0), (set_bytes, 1.0), (insert_token, 2.0), (insert_random, 0.5), (delete_range, 1.0),
    (duplicate_range, 0.5), (truncate, 1.0), (splice, 1.0), (swap_events, 0.5), (replace_value, 3.0),
    (rename_key, 1.5), (change_number, 2.0), (truncate_inside, 1.0), (break_utf8, 1.0), (deep_nesting, 0.05),
    (giant, 0.03),
]  # fmt: skip


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    funcs, weights = zip(*MUTATORS)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        f = rng.choices(funcs, weights)[0]
        data = f(rng, data, pool)
        if len(data) > 1 << 20:
            break
    return data[:MAX_INPUT]


# ---------------------------------------------------------------------------------------------
# The calls: arguments drawn (mostly normal, sometimes odd), invoked, answers checked

ODD_INTS = (-1, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -(2**63))
JUNK = b'{"ph": "X", "cat": "cpu_op", "name": "junk", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, \xff\x00"\\'


BUFFERS = ("exact", "exact", "exact", "bytes", "bytearray")  # exact: ASan sees a read one past the end


def draw_scan(rng: random.Random, data: bytes) -> Call:
    p: dict[str, Any] = {"buffer": rng.choice(BUFFERS)}
    if rng.random() < 0.2:
        p["pad"] = [rng.choice((1, 7, 100)), rng.choice((0, 1, 100))]
    p["args_base"] = rng.choice((0, 0, 1, 5, 1000))
    if rng.random() < 0.5:  # dicts already numbering names and threads, as on a later block
        p["names"] = [["ProfilerStep#1", 0], ["aten::mm", 1]]
        p["threads"] = [[[1, 1], 0], [[2, 3], 1]]
    if rng.random() < 0.05:
        p["odd"] = True
        what = rng.randrange(4)
        if what == 0:
            p["range"] = rng.choice(
                ([-1, 0], [0, len(data) + 1], [1, 0], [len(data), len(data)], [-(2**63), 2**63 - 1])
            )
        elif what == 1:
            p["args_base"] = rng.choice(ODD_INTS)
        elif what == 2:
            p["names"] = [["aten::mm", rng.choice((-1, -5, "x", None, 2**40, 2**70))], ["n", 0]]
        else:
            p["threads"] = [[[1, 1], rng.choice((-1, -5, "x", None, 2**40, 2**70))]]
    return Call("scan", data, p)


def draw_rewrite(rng: random.Random, data: bytes) -> Call:
    p: dict[str, Any] = {"buffer": rng.choice(BUFFERS)}
    if rng.random() < 0.2:
        p["pad"] = [rng.choice((1, 7, 100)), rng.choice((0, 1, 100))]
    p["rank"] = rng.choice((0, 3, 127))
    p["shift"] = rng.choice((0.0, 0.0, 0.5, -1694128201545000.0, 1e9 / 8, 3.3))
    if rng.random() < 0.6:  # the window: spans around the block's own times, or anywhere
        times = [float(m.group(1)) for m in re.finditer(rb'"ts":\s*(-?\d+(?:\.\d+)?)', data[:100_000])] or [0.0]
        times = [t for t in times if math.isfinite(t)] or [0.0]
        edges = sorted(rng.choice(times) + rng.uniform(-50, 50) for _ in range(2 * rng.randint(0, 4)))
        p["spans"] = [[edges[i], edges[i + 1]] for i in range(0, len(edges), 2)]
    if rng.random() < 0.3:
        p["tids"] = [[[1, 1], 7], [["Spans", "x"], 8]]
    p["callback"] = "normal"
    if rng.random() < 0.06:
        p["odd"] = True
        what = rng.randrange(5)
        if what == 0:
            p["range"] = rng.choice(([-1, 0], [0, len(data) + 1], [1, 0], [-(2**63), 2**63 - 1]))
        elif what == 1:
            p["rank"] = rng.choice((-1, 2**31, 2**63 - 1, -(2**63)))
            p["shift"] = rng.choice((math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324))
        elif what == 2:
            p["spans_layout"] = rng.choice(("mismatch", "misaligned", "float32", "none_one", "nan", "unsorted"))
            p.setdefault("spans", [[0.0, 1.0], [2.0, 3.0]])
        elif what == 3:
            p["callback"] = rng.choice(("raise", "str", "noadd", "badvalue", "bigvalue", "clear", "mutate", "empty"))
        else:
            p["tids"] = [[[1, 1], rng.choice((-1, "x", None, 2**70))], [[[1], 2], 3]]
    return Call("rewrite", data, p)


def _times(data: bytes) -> list[tuple[float, float]]:
    """(ts, dur) of the complete events in a block, read loosely."""
    out = []
    for m in re.finditer(rb'"ts":\s*(-?\d+(?:\.\d+)?)[^{}]*?"dur":\s*(-?\d+(?:\.\d+)?)', data[:200_000]):
        try:
            out.append((float(m.group(1)), float(m.group(2))))
        except ValueError:
            pass
    return out


def draw_nest(rng: random.Random, data: bytes) -> Call:
    """Intervals from a block's events (else random), in walk order, now and then with odd values,
    lengths, types or alignment."""
    g = NP
    rows = _times(data)
    if rows and rng.random() < 0.7:
        starts, durs = np.array(rows, dtype=np.float64).T.copy()
    else:
        n = rng.choice((0, 1, 2, 3, 10, 100, 1000, 1000, 100_000))
        starts = g.uniform(0, 1000, n).round(rng.choice((0, 3, 9)))
        durs = np.where(g.random(n) < 0.3, 0.0, g.exponential(100, n).round(rng.choice((0, 3, 9))))
    with np.errstate(all="ignore"):
        ends = starts + durs
        if rng.random() < 0.2 and len(starts):
            odd = np.array([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e308, 5e-324])
            for arr in (starts, ends):
                pick = g.random(len(arr)) < rng.choice((0.01, 0.1, 0.5))
                arr[pick] = g.choice(odd, int(pick.sum()))
        order = np.lexsort((starts - ends, starts)) if rng.random() < 0.9 else np.arange(len(starts))
    starts, ends = starts[order], ends[order]
    own = (g.random(len(starts)) < 0.3).astype(np.uint8)
    if rng.random() < 0.05:
        own = own * np.uint8(rng.choice((2, 255)))
    n = len(starts)
    p: dict[str, Any] = {"n": [n] * 5, "offset": 0, "types": "numpy", "out": "numpy"}
    if rng.random() < 0.1:
        p["odd"] = True
        what = rng.randrange(3)
        if what == 0:
            p["n"] = [max(0, n + rng.choice((-1, 0, 0, 1))) for _ in range(5)]
            starts = np.resize(starts, p["n"][0])
            ends = np.resize(ends, p["n"][1])
            own = np.resize(own, p["n"][2])
        elif what == 1:
            p["offset"] = rng.choice((1, 3, 4))
            p["types"] = rng.choice(("memoryview", "bytearray"))
        else:
            p["out"] = rng.choice(("bytes", "bytearray", "float64", "misaligned"))
    return Call("nest", starts.tobytes() + ends.tobytes() + own.tobytes(), p)


NP = np.random.default_rng(0)  # draw_nest's arrays; reseeded by the worker
DRAW = {"scan": draw_scan, "rewrite": draw_rewrite, "nest": draw_nest}


def _buffer(call: Call) -> tuple[Any, int, int]:
    """The data as the buffer the call passes, and its range."""
    before, after = call.params.get("pad", [0, 0])
    raw = JUNK * (before // len(JUNK) + 1)
    data = raw[:before] + call.data + raw[:after]
    kind = call.params.get("buffer", "bytes")
    if kind == "exact":  # exactly len(data) bytes of malloc: ASan sees a read one past the end
        buf: Any = np.frombuffer(data, dtype=np.uint8).copy() if data else np.empty(0, dtype=np.uint8)
    elif kind == "bytearray":
        buf = bytearray(data)
    else:
        buf = data
    start, end = call.params.get("range", [before, before + len(call.data)])
    return buf, start, end


def _nest_arrays(call: Call) -> list[Any]:
    ns, ne, no, np_, nf = call.params["n"]
    offset, types, out = call.params["offset"], call.params["types"], call.params["out"]
    d = call.data
    pieces = [d[: 8 * ns], d[8 * ns : 8 * ns + 8 * ne], d[8 * (ns + ne) : 8 * (ns + ne) + no]]
    args: list[Any] = []
    for raw, dtype in zip(pieces, (np.float64, np.float64, np.uint8)):
        if types == "numpy":
            args.append(np.frombuffer(raw, dtype=dtype).copy())
        else:  # the bytes `offset` into a buffer: misaligned for doubles
            holder = bytearray(offset) + bytearray(raw)
            args.append(memoryview(holder)[offset:] if types == "memoryview" else holder[offset:])
    if out == "numpy":
        args += [np.empty(np_, dtype=np.int64), np.empty(nf, dtype=bool)]
    elif out == "bytes":
        args += [bytes(8 * np_), bytes(nf)]
    elif out == "bytearray":
        args += [bytearray(8 * np_), bytearray(nf)]
    elif out == "float64":
        args += [np.empty(np_, dtype=np.float64), np.empty(nf, dtype=np.float64)]
    else:  # writable, misaligned
        holder = bytearray(8 * np_ + 1)
        args += [memoryview(holder)[1:], bytearray(nf)]
    return args


def _walk(starts: list[float], ends: list[float], own: list[int]) -> tuple[list[int], list[bool]]:
    """host_ops.nest's Python walk."""
    up, flag, stack = [-1] * len(starts), [False] * len(starts), []
    for i, t in enumerate(starts):
        while stack and ends[stack[-1]] <= t:
            stack.pop()
        if stack:
            up[i], flag[i] = stack[-1], flag[stack[-1]] or bool(own[i])
        else:
            flag[i] = bool(own[i])
        stack.append(i)
    return up, flag


class _NewThread:
    """rewrite's new_thread callback: merged._Mover._new_thread's contract, or a misbehaving one."""

    def __init__(self, mode: str, tids: dict[Any, Any], rank: int, buf: Any) -> None:
        self.mode, self.tids, self.rank, self.buf = mode, tids, rank, buf

    def __call__(self, key: tuple[Any, Any]) -> Any:
        mode = self.mode
        if mode == "raise":
            raise RuntimeError("new_thread failed")
        if mode == "str":
            return "not bytes"
        if mode == "clear":
            self.tids.clear()
        if mode == "mutate" and isinstance(self.buf, bytearray) and self.buf:
            self.buf[: len(self.buf) // 2] = b"\xff" * (len(self.buf) // 2)
        if mode != "noadd":
            self.tids[key] = {"badvalue": "x", "bigvalue": 2**70}.get(mode, 1000 + len(self.tids))
        if mode == "empty":
            return b""
        return json.dumps({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": 1000 + len(self.tids),
                           "args": {"name": f"{key[0]} / {key[1]}"}}).encode()  # fmt: skip


def _key(part: Any) -> Any:
    return tuple(_key(p) for p in part) if isinstance(part, list) else part


MISUSE: list[tuple[str, Callable[[Any], Any]]] = [  # wrong types and shapes: each must raise, never crash
    ("scan", lambda ext: ext.scan("str", 0, 3, {}, {}, 0)),
    ("scan", lambda ext: ext.scan(b"{}", 0, 2, [], {}, 0)),
    ("scan", lambda ext: ext.scan(b"{}", 0, 2, {}, {})),
    ("scan", lambda ext: ext.scan(np.zeros(8)[::2], 0, 8, {}, {}, 0)),  # not contiguous
    ("scan", lambda ext: ext.scan(b"{}", 0, 2, {}, {}, 2**64)),
    ("rewrite", lambda ext: ext.rewrite(b"{}", 0, 2, 0, 0.0, b"x", None, {}, len)),
    ("rewrite", lambda ext: ext.rewrite(b"{}", 0, 2, 0, 0.0, np.zeros(4)[::2], np.zeros(2), {}, len)),
    ("rewrite", lambda ext: ext.rewrite(b"{}", 0, 2, 2**64, 0.0, None, None, {}, len)),
    ("rewrite", lambda ext: ext.rewrite(b"{}", 0, 2, 0, "0", None, None, {}, len)),
    ("rewrite", lambda ext: ext.rewrite(b"{}", 0, 2, 0, 0.0, None, None, [], len)),
    ("nest", lambda ext: ext.nest(np.zeros(2), np.zeros(2), np.zeros(2, np.uint8), bytes(16), bytearray(2))),
    ("nest", lambda ext: ext.nest(np.zeros(2), np.zeros(2), np.zeros(2, np.uint8), np.zeros(2, np.int64))),
    ("nest", lambda ext: ext.nest(np.zeros(4)[::2], np.zeros(2), np.zeros(2, np.uint8), np.zeros(2), bytearray(2))),
    ("nest", lambda ext: ext.nest(np.zeros(2), np.zeros(2), np.zeros(2, np.uint8), np.zeros(4)[::2], bytearray(2))),
    ("nest", lambda ext: ext.nest(np.zeros(2), np.zeros(3), np.zeros(2, np.uint8), np.zeros(2), bytearray(2))),
]


def invoke(ext: Any, call: Call) -> tuple[Any, dict[str, Any]]:
    """Make the call; its answer, and the state it worked on (for the checks)."""
    p = call.params
    if "misuse" in p:
        return MISUSE[p["misuse"]][1](ext), {}
    if call.function == "scan":
        buf, start, end = _buffer(call)
        names = {k: v for k, v in p.get("names", [])}
        threads = {_key(k): v for k, v in p.get("threads", [])}
        got = ext.scan(buf, start, end, names, threads, p["args_base"])
        return got, {"names": names, "threads": threads, "start": start}
    if call.function == "rewrite":
        buf, start, end = _buffer(call)
        tids = {_key(k): v for k, v in p.get("tids", [])}
        before = dict(tids)
        spans = p.get("spans")
        starts: Any = None
        ends: Any = None
        if spans is not None:
            starts, ends = array("d", [s[0] for s in spans]), array("d", [s[1] for s in spans])
            layout = p.get("spans_layout")
            if layout == "mismatch":
                ends.append(1.0)
            elif layout == "misaligned":
                holder = bytearray(1) + bytearray(starts.tobytes()) + bytearray(1) + bytearray(ends.tobytes())
                n = 8 * len(starts)
                starts, ends = memoryview(holder)[1 : 1 + n], memoryview(holder)[2 + n :]
            elif layout == "float32":
                starts, ends = array("f", list(starts) * 2), array("f", list(ends) * 2)
            elif layout == "none_one":
                ends = None
            elif layout == "nan":
                starts[0] = math.nan
            elif layout == "unsorted":
                starts.reverse()
            if p.get("buffer") == "exact" and isinstance(starts, array) and isinstance(ends, array):
                starts, ends = np.array(starts), np.array(ends)  # exact-size: ASan sees a read past the last span
        callback = _NewThread(p.get("callback", "normal"), tids, p["rank"], buf)
        got = ext.rewrite(buf, start, end, p["rank"], p["shift"], starts, ends, tids, callback)
        return got, {"tids": tids, "before": before}
    args = _nest_arrays(call)
    return ext.nest(*args), {"args": args}


def _no(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def check(call: Call, got: Any, state: dict[str, Any]) -> None:  # noqa: C901
    """The answer's shape and what can be known of it without the Python twin."""
    p = call.params
    if "misuse" in p:
        raise Finding(f"{call.function}: misuse {p['misuse']} answered {got!r:.200} instead of raising")
    if call.function == "scan":
        if got is None:
            return
        count, first, last, meta, groups, marks, spans = got
        if not (isinstance(count, int) and isinstance(first, float) and isinstance(last, float)):
            raise Finding(f"scan: odd head {got[:3]!r}")
        if meta not in (True, False) or len(groups) != 4 or any(len(g) != 6 for g in groups):
            raise Finding("scan: odd groups")
        for g in groups:
            rows = len(g[0]) // 8
            if [len(c) for c in g] != [8 * rows, 8 * rows, 4 * rows, 4 * rows, 8 * rows, 4 * rows]:
                raise Finding(f"scan: columns of unequal length {[len(c) for c in g]}")
        start = state["start"]
        for a, b in spans:
            if not start <= a < b <= start + len(call.data):
                raise Finding(f"scan: args span {a, b} outside the block")
        if not p.get("odd") and sorted(state["names"].values()) != list(range(len(state["names"]))):
            raise Finding("scan: names not numbered 0..n-1")
        return
    if call.function == "rewrite":
        if p.get("callback") != "normal":
            if got is not None and not (isinstance(got[0], bytes) and got[1] >= 0):
                raise Finding(f"rewrite: odd answer {got!r:.200}")
            return
        if got is None:
            if state["tids"] != state["before"]:
                raise Finding("rewrite: a declined block left new threads behind")
            return
        out, kept = got
        if out and not out.startswith(b",\n"):
            raise Finding(f"rewrite: output does not start with ',\\n': {out[:40]!r}")
        try:
            events = (
                json.loads(b"[" + out[2:] + b"]", parse_int=str, parse_float=str, parse_constant=_no) if out else []
            )
        except ValueError as exc:
            raise Finding(f"rewrite: output is not JSON ({exc})") from None
        if len(events) != kept:
            raise Finding(f"rewrite: {len(events)} events written, {kept} said")
        return
    if got is not None:
        raise Finding(f"nest: answered {got!r}")
    starts, ends, own, parent, flag = state["args"]
    if not p.get("odd") and len(starts) <= 5000:
        up, inherited = _walk(starts.tolist(), ends.tolist(), own.tolist())
        if parent.tolist() != up or flag.tolist() != inherited:
            raise Finding("nest: not the Python walk's parents and flags")


def _same_elsewhere(ext: Any, call: Call, got: Any) -> None:
    """The block inside a longer buffer gives the same answer as on its own (no read outside its range)."""
    if call.odd() or "pad" not in call.params or call.function == "nest":
        return
    alone = Call(call.function, call.data, {k: v for k, v in call.params.items() if k != "pad"})
    again, _ = invoke(ext, alone)
    if call.function == "scan" and got is not None:
        shift = call.params["pad"][0]
        got = got[:6] + ([(a - shift, b - shift) for a, b in got[6]],)
    if got != again:
        raise Finding(f"{call.function}: another answer for the same block inside a longer buffer")


def run_one(ext: Any, call: Call) -> None:
    """Invoke and check; a Finding for a failed check or an exception a normal call must not raise."""
    try:
        got, state = invoke(ext, call)
    except SystemError as exc:  # NULL returned without an exception set, or a C-API misuse
        raise Finding(f"{call.function}: SystemError: {exc}") from exc
    except Exception as exc:
        if not call.odd():
            raise Finding(f"{call.function}: raised {type(exc).__name__}: {exc}") from exc
        return
    check(call, got, state)
    _same_elsewhere(ext, call, got)


# ---------------------------------------------------------------------------------------------
# The fixed extremes, run first on every run whatever the seed


def extremes() -> list[Call]:
    event = b'{"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": '
    blocks = [
        b"",
        b" ",
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        event + b'{"a":' * 100_000 + b"1" + b"}" * 100_001,
        event + b"[" * 100_000 + b"]" * 100_000 + b"}",
        event + b'"' + b"a" * (4 << 20) + b'"}',
        event + b'"' + b"\\u00e9" * 200_000 + b'"}',
        b'{"ph": "X", "name": "' + b"\xf0\x9f\x98\x80" * 250_000 + b'", "pid": 1, "tid": 1, "ts": 1}',
        b'{"ph": "X", "pid": 1, "tid": 1, "ts": 1' + b"0" * 5000 + b"}",
        b'{"ph": "X", "pid": 1, "tid": 1, "ts": 1.' + b"0" * 5000 + b'1, "dur": 1e99999}',
        b'{"ph": "X", "pid": ' + b"9" * 5000 + b', "tid": 1, "ts": 1}',
        event + b'{"correlation": ' + b"9" * 5000 + b"}}",
        *(b'{"ph": "X", "name": "' + b"\\u00e9"[:i] for i in range(7)),  # a block ending inside an escape
        b'{"ph": "X", "name": "\\u12',
        b'{"ph": "X", "name": "\\u12"}',
        b'{"ph": "X", "name": "\\',
        b'{"ph": "X", "name": "a\x00b", "pid": 1, "tid": 1, "ts": 1}',
        b"\x00" * 64,
        b'{"ph": "X", "name": "\xed\xa0\x80", "pid": 1, "tid": 1, "ts": 1}',
        b'{"ph": "s", "id": ' + b"7" * 5000 + b', "pid": 1, "tid": 1, "ts": 1}',
        b'{"ph": "i", "pid": "' + b"p" * 100_000 + b'", "tid": 1, "ts": 1}',
    ]
    calls = []
    for data in blocks:
        for buffer in ("bytes", "exact"):
            calls.append(Call("scan", data, {"buffer": buffer, "args_base": 0}))
            calls.append(Call("rewrite", data, {"buffer": buffer, "rank": 0, "shift": 0.0, "callback": "normal"}))
            calls.append(Call("rewrite", data, {"buffer": buffer, "rank": 0, "shift": 0.0, "callback": "normal",
                                                "spans": [[0.0, 10.0], [20.0, 30.0]]}))  # fmt: skip
    n = 200_000  # one long nest each way: all nested (the stack's full depth), all disjoint
    for starts, ends in ((np.arange(n, dtype=np.float64), np.full(n, 1e9)),
                         (np.arange(n, dtype=np.float64), np.arange(n, dtype=np.float64) + 1)):  # fmt: skip
        data = starts.tobytes() + ends.tobytes() + bytes(n)
        calls.append(Call("nest", data, {"n": [n] * 5, "offset": 0, "types": "numpy", "out": "numpy"}))
    return calls


# ---------------------------------------------------------------------------------------------
# The worker (makes the calls) and the supervisor (saves what crashed it)


class Record:
    """The call being made, written to a mapped file before it is made: it survives an abort."""

    HEAD = struct.Struct("<4sII")

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.truncate(RECORD_BYTES)
        self.fh = open(path, "r+b")  # open for the worker's life
        self.map = mmap.mmap(self.fh.fileno(), RECORD_BYTES)

    def write(self, call: Call) -> None:
        params = json.dumps({"function": call.function, "params": call.params}).encode()
        end = self.HEAD.size + len(params) + len(call.data)
        self.map[self.HEAD.size : end] = params + call.data
        self.map[: self.HEAD.size] = self.HEAD.pack(b"HFZ1", len(params), len(call.data))

    @staticmethod
    def read(path: Path) -> Call | None:
        raw = path.read_bytes()
        magic, n_params, n_data = Record.HEAD.unpack_from(raw)
        if magic != b"HFZ1":
            return None
        head = json.loads(raw[Record.HEAD.size : Record.HEAD.size + n_params])
        start = Record.HEAD.size + n_params
        return Call(head["function"], raw[start : start + n_data], head["params"])


class Coverage:
    """tests/fuzz_cov.c's counters in the loaded extension (the sanitized build); absent elsewhere."""

    def __init__(self, ext: Any) -> None:
        lib = ctypes.CDLL(ext.__file__)
        self.collect: Callable[[], int] = lib.harness_fuzz_collect
        self.features: Callable[[], int] = lib.harness_fuzz_features

    @staticmethod
    def of(ext: Any) -> Coverage | None:
        try:
            return Coverage(ext)
        except (AttributeError, OSError):
            return None


def load_seeds(corpus: Path) -> list[bytes]:
    """The seed files' bytes (a regression's .call.json, its other arguments, is not one)."""
    return [
        p.read_bytes() for p in sorted(corpus.iterdir()) if p.suffix in (".json", ".bin") and ".call" not in p.suffixes
    ]


def worker(args: argparse.Namespace) -> int:
    from harness.traces import native
    from harness.traces.read import decode  # noqa: F401  # configures scan's categories

    ext = native.extension
    if ext is None:
        print("fuzz: the native extension is not built", file=sys.stderr)
        return 2
    only = [f for f in FUNCTIONS if f in args.only.split(",")]
    weights = [w for f, w in zip(FUNCTIONS, WEIGHTS) if f in only]
    rng = random.Random(args.seed)
    NP.bit_generator.state = np.random.default_rng(args.seed).bit_generator.state
    record = Record(args.out / "last-input")
    coverage = Coverage.of(ext)  # --blind: counted, not used
    seeds = load_seeds(args.corpus)
    if not seeds:
        print(f"fuzz: no seeds in {args.corpus}", file=sys.stderr)
        return 2
    parents = {f: list(seeds) for f in FUNCTIONS}
    runs = dict.fromkeys(FUNCTIONS, 0)
    kept = dict.fromkeys(FUNCTIONS, 0)
    started = time.monotonic()

    def one(call: Call, keep: bool) -> None:
        record.write(call)
        run_one(ext, call)
        runs[call.function] += 1
        if coverage is not None and coverage.collect() and keep and not args.blind and len(call.data) <= KEEP_LIMIT:
            pool = parents[call.function]
            if len(pool) < PARENTS_LIMIT:
                pool.append(call.data)
            else:
                pool[rng.randrange(len(seeds), len(pool))] = call.data
            kept[call.function] += 1

    try:
        fixed = [Call(f, b"", {"misuse": i, "odd": True}) for i, (f, _) in enumerate(MISUSE) if f in only]
        fixed += [c for c in extremes() if c.function in only]
        fixed += [DRAW[f](random.Random(i), s) for f in only for i, s in enumerate(seeds)]
        for call in fixed:
            one(call, keep=False)
        deadline = started + args.seconds
        while time.monotonic() < deadline:
            f = rng.choices(only, weights)[0]
            pool = parents[f]
            data = mutate(rng, rng.choice(pool), pool)
            one(DRAW[f](rng, data), keep=True)
    except Finding as exc:
        print(f"fuzz: FINDING: {exc}", file=sys.stderr)
        return 3
    except Exception:  # the fuzzer's own failure, not the extension's
        traceback.print_exc()
        return 4
    took = time.monotonic() - started
    features = f", {coverage.features()} coverage features" if coverage is not None else " (blind: no coverage build)"
    print(f"fuzz: {sum(runs.values())} calls in {took:.1f}s (seed {args.seed}){features}")
    for f in only:
        print(f"fuzz:   {f}: {runs[f]} calls, {kept[f]} inputs kept for new coverage")
    return 0


def describe(call: Call, limit: int = 600) -> str:
    data = call.data
    shown = repr(data[:limit]) + (f" ... ({len(data)} bytes; last 80: {data[-80:]!r})" if len(data) > limit else "")
    return f"{call.function}(data={shown}, params={json.dumps(call.params)})"


def supervise(args: argparse.Namespace) -> int:
    argv = [sys.executable, __file__, "--worker", "--seconds", str(args.seconds), "--seed", str(args.seed),
            "--out", str(args.out), "--corpus", str(args.corpus), "--only", args.only]  # fmt: skip
    if args.blind:
        argv.append("--blind")
    rc = subprocess.run(argv).returncode
    if rc == 0:
        return 0
    call = Record.read(args.out / "last-input")
    if rc == 2 or call is None:
        print(f"fuzz: the worker failed (exit {rc}) before any call", file=sys.stderr)
        return 1
    digest = hashlib.sha1(json.dumps(call.params).encode() + call.data).hexdigest()[:10]
    path = args.out / f"crash-{call.function}-{digest}.bin"
    path.write_bytes(call.data)
    path.with_suffix(".call.json").write_text(json.dumps({"function": call.function, "params": call.params}) + "\n")
    how = {3: "a check failed", 4: "the fuzzer itself failed (traceback above)"}.get(
        rc, f"the process died (exit {rc}: a sanitizer report above)"
    )
    print(f"fuzz: {how} on {describe(call)}", file=sys.stderr)
    print(f"fuzz: input saved as {path} (+ .call.json); run again: python tests/fuzz_native.py --replay {path}",
          file=sys.stderr)  # fmt: skip
    return 1


def replay(path: Path) -> int:
    from harness.traces import native
    from harness.traces.read import decode  # noqa: F401  # configures scan's categories

    head = json.loads(path.with_suffix(".call.json").read_text())
    call = Call(head["function"], path.read_bytes(), head["params"])
    print(f"fuzz: replaying {describe(call, 200)}")
    run_one(native.extension, call)
    print("fuzz: no finding")
    return 0


# ---------------------------------------------------------------------------------------------
# The seed corpus


def _raw_events(path: Path, limit: int = 60 << 20) -> list[bytes]:
    """Each event of a trace's traceEvents as its raw bytes in the file (the file's own spacing)."""
    text = gzip.open(path).read(limit).decode()
    start = text.index("[", text.index('"traceEvents"')) + 1
    decoder, out = json.JSONDecoder(), []
    i = start
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] != "{":
            break
        try:
            _, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:  # cut by the read limit
            break
        out.append(text[i:end].encode())
        i = end
    return out


def _kind(raw: bytes) -> str:
    e = json.loads(raw)
    ph, cat, name, args = e.get("ph"), e.get("cat"), str(e.get("name", "")), e.get("args") or {}
    if name == "record_param_comms":
        return "record_param_comms"
    if cat == "kernel" and any(k in args for k in ("Collective name", "In msg nelems", "Process Group Name")):
        return "collective_kernel"
    if name.startswith("ProfilerStep#"):
        return "profiler_step"
    return f"{ph}-{cat}" if cat else f"{ph}"


SOURCES = {
    "dlrm": "dlrm_8rank_v100/worker0_step_12.1694128201545.pt.trace.json.gz",
    "nccl": "hta_single_rank/nccl_data_a100_rank0of2.json.gz",
    "sampled": "hta_trace_filter_2of128/sampled_rank-0.json.gz",
    "torchrec": "hta_single_rank/torchrec_a100_rank0of16.json.gz",
    "df": "hta_single_rank/df_index_resolver_v100_rank1of2.json.gz",
}

HANDMADE: dict[str, bytes] = {
    "escapes": b'{"ph": "X", "cat": "cpu_op", "name": "a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00", '
    b'"pid": 1, "tid": 1, "ts": 1.5, "dur": 2}, {"p\\u0068": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, '
    b'"ts": 2, "dur": 1}, {"ph": "\\u0058", "name": "x", "pid": 1, "tid": 1, "ts": 3, "dur": 1}',
    "utf8": '{"ph": "X", "cat": "kernel", "name": "ядро_é_😀_中", "pid": 0, "tid": 7, "ts": 10, "dur": 5, '
    '"args": {"note": "ü"}}, {"ph": "i", "name": "ß", "pid": "процесс", "tid": "поток", "ts": 11, "s": "t"}'.encode(),
    "invalid-utf8": b'{"ph": "X", "cat": "cpu_op", "name": "\xff\xfe", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "name": "\xc0\xaf", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, {"ph": "X", "name": "\xed\xa0\x80", '
    b'"pid": 1, "tid": 1, "ts": 1, "dur": 1}, {"ph": "X", "name": "\xf4\x90\x80\x80\xe2\x82"}',
    "numbers": b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": -0}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": -0.0, "dur": 1E+2}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 1.7976931348623157e308, "dur": 5e-324}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "d", "pid": 1, "tid": 1, "ts": 9007199254740993, "dur": 1.5e-7}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "e", "pid": 1, "tid": 1, "ts": 123456789012345678901234, "dur": 1e309}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 0.1234567890123456789012, "dur": 0}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "g", "pid": 999999999999999999, "tid": -999999999999999999, '
    b'"ts": 1694128201545123.25, "dur": 0.001}',
    "key-types": b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": "1", "tid": "main", "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1.5, "tid": null, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "c", "pid": [1], "tid": {"a": 1}, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "d", "pid": 12345678901234567890, "tid": true, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "e", "pid": "p\\u0031", "tid": 1, "ts": 1, "dur": 1}',
    "field-types": b'{"ph": 1, "name": "a"}, {"ph": null}, {"ph": ["X"]}, {"ph": "X", "ts": "1", "dur": "2", '
    b'"pid": 1, "tid": 1}, {"ph": "X", "ts": null, "dur": true, "pid": 1, "tid": 1}, {"ph": "X", "ts": {}, '
    b'"pid": 1, "tid": 1}, {"ph": "X", "cat": null, "name": 5, "pid": 1, "tid": 1, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": []}, '
    b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": "x"}, {}',
    "collectives": b'{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, '
    b'"tid": 7, "ts": 100, "dur": 50, "args": {"correlation": 12, "Collective name": "allreduce", '
    b'"In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Process Group Name": "0", '
    b'"Process Group Ranks": "[0, 1]", "Group size": 2}}, {"ph": "X", "cat": "cpu_op", "name": '
    b'"record_param_comms", "pid": 1, "tid": 1, "ts": 90, "dur": 5, "args": {"Collective name": "allreduce", '
    b'"correlation": -1}}, {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 160, "dur": 1, '
    b'"args": {"Collective name": null, "dtype": null, "correlation": 1.5}}, {"ph": "X", "cat": "kernel", '
    b'"name": "k2", "pid": 0, "tid": 7, "ts": 170, "dur": 1, "args": {"correlation": 99999999999999999999, '
    b'"correlation": "x", "In msg nelems": 0}}',
    "flows": b'{"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g", "name": "ac2g"}, {"ph": "f", '
    b'"id": 1, "pid": 0, "tid": 7, "ts": 2, "cat": "ac2g", "name": "ac2g", "bp": "e"}, {"ph": "t", "id": "a1", '
    b'"pid": 1, "tid": 1, "ts": 3}, {"ph": "b", "id": 1.5, "pid": 1, "tid": 1, "ts": 4}, {"ph": "e", "id": null, '
    b'"pid": 1, "tid": 1, "ts": 5}, {"ph": "n", "id": -0, "pid": 1, "tid": 1, "ts": 6}, {"ph": "s", "id": '
    b'"a\\"b", "pid": 1, "tid": 1, "ts": 7}, {"ph": "C", "name": "mem", "pid": 1, "tid": 1, "ts": 8, "args": '
    b'{"bytes": 1}}, {"ph": "I", "s": "g", "pid": 1, "tid": 1, "ts": 9, "tts": 1, "cname": "good"}',
    "duplicate-keys": b'{"ph": "X", "ph": "M", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "ts": 2, '
    b'"dur": 1}, {"ph": "X", "cat": "cpu_op", "cat": "kernel", "name": "b", "name": "c", "pid": 1, "pid": 2, '
    b'"tid": 1, "ts": 1, "dur": 1, "dur": -1}',
    "metadata": b'{"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}}, '
    b'{"name": "thread_name", "ph": "M", "ts": 0, "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}, '
    b'{"name": "process_sort_index", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"sort_index": 5000000}}',
    "nesting": b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"a": '
    + b"[" * 62
    + b"]" * 62
    + b"}}, "
    + b'{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"a": '
    + b'{"b":' * 63
    + b"1"
    + b"}" * 63
    + b"}}, "
    + b'{"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "x": '
    + b"[" * 64
    + b"]" * 64
    + b"}",
    "whitespace": b' \t\r\n{ \t"ph"\r\n: "X" ,\n"cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1 }\n,\t{}'
    b' , { "ph" : "i" , "pid" : 1 , "tid" : 1 , "ts" : 2 , "args" : { } }  \n',
    "marks": b'{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 10, '
    b'"dur": 100}, {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7, '
    b'"ts": 20, "dur": 90}, {"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 1, "tid": 1, '
    b'"ts": 11, "dur": 20}, {"ph": "X", "cat": "python_function", "name": "ProfilerStep#4", "pid": 1, "tid": 1, '
    b'"ts": 120, "dur": 1}',
    "truncated": b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "\\u12',
    "nul": b'{"ph": "X", "cat": "cpu_op", "name": "a\x00b", "pid": 1, "tid": 1, "ts": 1, "dur": 1},\x00{"ph": "X"\x00}',
    "literals": b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "x": [true, '
    b'false, null, tru, nul]}, {"ph": "X", "args": {"a": 1., "b": .5, "c": 01, "d": -, "e": 1e}}',
}


def make_corpus(out: Path) -> int:
    """Write the seeds: per source trace, a run of events from the first of each kind (a few per
    kind over all sources) and a run from the middle; then the hand-made edge cases."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.json"), *out.glob("*.bin")]:
        if not old.name.startswith("regress-"):  # the fixed findings' inputs stay
            old.unlink()
    taken: dict[str, int] = {}
    written = 0
    for short, rel in SOURCES.items():
        events = _raw_events(TRACES / rel)
        firsts: dict[str, int] = {}
        for i, raw in enumerate(events):
            firsts.setdefault(_kind(raw), i)
        runs = {k: i for k, i in firsts.items() if taken.get(k, 0) < 2}
        runs["middle"] = len(events) // 2
        for kind, i in sorted(runs.items()):
            taken[kind] = taken.get(kind, 0) + 1
            block = [events[i]]
            while i + len(block) < len(events) and len(block) < 6 and sum(map(len, block)) < 1500:
                block.append(events[i + len(block)])
            name = re.sub(r"[^a-z0-9_]+", "_", kind.lower()).strip("_")
            (out / f"{short}-{name}.json").write_bytes(b",\n  ".join(block))
            written += 1
    for name, data in HANDMADE.items():
        try:
            data.decode()
            suffix = ".json"
        except UnicodeDecodeError:
            suffix = ".bin"
        (out / f"edge-{name}{suffix}").write_bytes(data)
        written += 1
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"fuzz: {written} seeds written; {out} holds {total} bytes")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 60)))
    parser.add_argument("--seed", type=int, default=None, help="default: a new one, printed")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "sanitize")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--only", default=",".join(FUNCTIONS), help="comma-separated: scan, rewrite, nest")
    parser.add_argument("--blind", action="store_true", help="no coverage guidance (to compare)")
    parser.add_argument("--replay", type=Path, help="run one saved crash-*.bin again")
    parser.add_argument("--make-corpus", action="store_true", help="rewrite the seeds from tests/data/traces")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.make_corpus:
        return make_corpus(args.corpus)
    if args.replay:
        return replay(args.replay)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    if args.worker:
        return worker(args)
    print(f"fuzz: seed {args.seed}, {args.seconds:g}s, functions {args.only}")
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
