"""What a parsed rank keeps, held compactly: times by name, and a step's cover's intervals.

A rank's per-name aggregates (each collective's run-up by kernel, each step's compute by
kernel or op) and its steps' covers are most of what a parsed rank holds: tens of names or
pieces, times every collective and step of every rank. As dicts of floats and lists of tuples
they would cost about 75 bytes a time with the containers. `Named` keeps the names as one
tuple, shared by every mapping that holds the same names in the same order (the ranks of one job
run the same kernels in the same order), and the values as one array of doubles; `Pieces` keeps
intervals as one array: 8 bytes a time.
"""

from __future__ import annotations

from array import array
from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import Any


class _ArrayMapping(Mapping):
    """A read-only mapping whose keys are `_keys()` (a tuple or a dict, in order) and whose values
    are the array `values_`, in the same order."""

    __slots__ = ()
    values_: array

    def _keys(self) -> tuple | dict:
        raise NotImplementedError

    def __iter__(self) -> Iterator:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def items(self) -> ItemsView:
        return _Items(self)

    def values(self) -> ValuesView[float]:
        return _Values(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


class Named(_ArrayMapping, Mapping[str, float]):
    """A read-only mapping of name -> float, in the order the names were given. Lookups by name
    are linear in its length (readers iterate; the names of one mapping are tens, not
    thousands)."""

    __slots__ = ("names", "values_")

    def __init__(self, names: tuple[str, ...] = (), values: array | None = None) -> None:
        self.names = names
        self.values_ = array("d") if values is None else values

    @classmethod
    def of(
        cls,
        items: Mapping[str, float],
        tuples: dict[tuple[str, ...], tuple[str, ...]] | None = None,
        strings: dict[str, str] | None = None,
    ) -> Named:
        """`items` as a Named; with `strings`, each name replaced by its first copy there (added when
        new); with `tuples`, the names' tuple likewise (one tuple for every mapping of the same names)."""
        names = tuple(items) if strings is None else tuple(strings.setdefault(k, k) for k in items)
        if tuples is not None:
            names = tuples.setdefault(names, names)
        return cls(names, array("d", list(items.values())))  # from a list: no room left over

    def _keys(self) -> tuple[str, ...]:
        return self.names

    def __getitem__(self, key: str) -> float:
        try:
            return self.values_[self.names.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __reduce__(self) -> tuple:
        return Named, (self.names, self.values_)


EMPTY = Named()  # what a released rank's run-ups become (analysis.analyze_aligned(release=True))


class RankValues(_ArrayMapping, Mapping[int, float]):
    """A read-only mapping of rank -> float (one collective instance's arrivals, waits, shares),
    in the order of `index`: rank -> position, one dict shared by every instance of the same ranks
    in the same order (a data-parallel job's instances all have the same ranks), the values as
    one array. A dict of 1024 ranks holds ~60 kB, this 8 kB."""

    __slots__ = ("index", "values_")

    def __init__(self, index: dict[int, int], values: array) -> None:
        self.index = index
        self.values_ = values

    @classmethod
    def of(cls, items: Mapping[int, float], index: dict[int, int]) -> RankValues:
        """`items` (of the ranks of `index`, in any order) in `index`'s order."""
        return cls(index, array("d", [items[r] for r in index]))

    def __getitem__(self, rank: int) -> float:
        return self.values_[self.index[rank]]

    def __contains__(self, rank: object) -> bool:
        return rank in self.index

    def _keys(self) -> dict[int, int]:
        return self.index

    def __reduce__(self) -> tuple:
        return RankValues, (self.index, self.values_)


class _Items(ItemsView):
    def __iter__(self) -> Iterator[tuple]:
        m: Any = self._mapping  # type: ignore[attr-defined]  # ItemsView's own field, not in its stub
        return zip(m, m.values_)


class _Values(ValuesView):
    def __iter__(self) -> Iterator[float]:
        return iter(self._mapping.values_)  # type: ignore[attr-defined]


class Pieces(Sequence[tuple[float, float]]):
    """Intervals (start_us, end_us) held as one array of their ends, start, end, start, ...;
    equal to a list of the same tuples."""

    __slots__ = ("flat",)

    def __init__(self, flat: array | None = None) -> None:
        self.flat = array("d") if flat is None else flat

    @classmethod
    def of(cls, intervals: Iterable[tuple[float, float]]) -> Pieces:
        return cls(array("d", [x for pair in intervals for x in pair]))  # from a list: no room left over

    def __len__(self) -> int:
        return len(self.flat) // 2

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("Pieces index out of range")
        return self.flat[2 * i], self.flat[2 * i + 1]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        ends = iter(self.flat)
        return zip(ends, ends)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Pieces):
            return self.flat == other.flat
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == [tuple(x) for x in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Pieces({list(self)!r})"

    def __reduce__(self) -> tuple:
        return Pieces, (self.flat,)


def as_plain(obj: object) -> object:
    """msgspec's encoder hook: a Named is written as the JSON object it stands for, a Pieces as
    the list of [start, end] pairs."""
    if isinstance(obj, Named):
        return dict(obj.items())
    if isinstance(obj, Pieces):
        return [list(p) for p in obj]
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")
