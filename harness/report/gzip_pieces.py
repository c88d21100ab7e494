"""One gzip file from pieces compressed separately (in parallel processes), as pigz does.

Each piece is a raw deflate stream ended with a sync flush (byte-aligned, not final), so pieces
concatenate into one deflate stream; the file gets a single gzip header, a final empty block,
and a trailer whose CRC-32 is combined from the pieces' CRCs without seeing their bytes again.
Any gzip reader (Python's gzip, zlib, browsers' DecompressionStream, Perfetto) reads it as one
ordinary member.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown


@dataclass
class Piece:
    """Raw deflate bytes of `size` uncompressed bytes whose CRC-32 is `crc`."""

    deflate: bytes
    crc: int
    size: int


class PieceWriter:
    """Compresses what is written into one Piece (`finish`)."""

    def __init__(self, level: int) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._out: list[bytes] = []
        self.crc = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        self._out.append(self._z.compress(data))

    def finish(self) -> Piece:
        self._out.append(self._z.flush(zlib.Z_SYNC_FLUSH))
        return Piece(b"".join(self._out), self.crc, self.size)


def _gf2_times(matrix: list[int], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, row) for row in matrix]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A+B from crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B).

    1. CRC-32 is linear over GF(2): crc(A+B) = crc(A followed by len2 zero bytes) ^ crc(B);
    2. appending zero bits to a message multiplies its CRC register by a fixed 32x32 matrix
       (the polynomial 0xEDB88320 in its first row, a shift in the others);
    3. len2 zero bytes = that matrix raised to 8*len2, applied by repeated squaring over the
       bits of len2 (log2(len2) squarings, each 32 matrix-vector products)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)  # first pass: eight zero bits, one byte
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def write_gzip(fh: BinaryIO, pieces: Iterable[Piece]) -> int:
    """Write the pieces, in order, as one gzip member; returns the uncompressed size."""
    fh.write(GZIP_HEADER)
    crc, size = 0, 0
    for p in pieces:
        fh.write(p.deflate)
        crc = crc32_combine(crc, p.crc, p.size)
        size += p.size
    fh.write(zlib.compressobj(1, zlib.DEFLATED, -15).flush(zlib.Z_FINISH))  # the final (empty) block
    fh.write(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return size
