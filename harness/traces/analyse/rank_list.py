"""Many ranks named in a few words: what the verdict, the diagnosis line and the next steps say of
a group of ranks on a 1024-rank job (one slow rank per host is 128 ranks, too many to list one
by one)."""

from __future__ import annotations

from collections.abc import Iterable

# Up to this many ranks are listed one by one (two hosts of eight); beyond, as runs. Runs named
# before "and N more": about one terminal line.
SPELLED = 16
RUNS_SHOWN = 8


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def rank_runs(ranks: Iterable[int]) -> list[tuple[int, int, int]]:
    """The sorted, distinct ranks as runs (first, last, stride): 1. from the first rank not yet
    in a run, the longest stretch with one stride; 2. three ranks or more make a run, else the
    first rank stands alone (stride 1) and the next is tried."""
    rs = sorted(set(ranks))
    out: list[tuple[int, int, int]] = []
    i = 0
    while i < len(rs):
        j = i
        if i + 2 < len(rs):
            stride = rs[i + 1] - rs[i]
            while j + 1 < len(rs) and rs[j + 1] - rs[j] == stride:
                j += 1
            if j - i < 2:
                j = i
        out.append((rs[i], rs[j], rs[j] - rs[j - 1] if j > i else 1))
        i = j + 1
    return out


def _runs_text(runs: list[tuple[int, int, int]]) -> str:
    words = []
    for first, last, stride in runs[:RUNS_SHOWN]:
        if first == last:
            words.append(str(first))
        else:
            words.append(f"{first}-{last}" + ("" if stride == 1 else f" every {_ordinal(stride)}"))
    rest = sum((last - first) // stride + 1 for first, last, stride in runs[RUNS_SHOWN:])
    return ", ".join(words) + (f" and {rest} more" if rest else "")


def ranks_phrase(ranks: Iterable[int], present: Iterable[int] = ()) -> str:
    """'rank 3', 'ranks 0, 1, 5' (up to SPELLED ranks, in the order given), else '<n> ranks [<runs>]', the runs those
    of the ranks or, when fewer, 'all but <runs>' of the others among `present` (the ranks the
    report holds)."""
    given = list(dict.fromkeys(ranks))
    if len(given) == 1:
        return f"rank {given[0]}"
    if len(given) <= SPELLED:
        return f"ranks {', '.join(map(str, given))}"
    rs = sorted(given)
    runs = rank_runs(rs)
    others = sorted(set(present) - set(rs))
    if set(rs) <= set(present) and others and len(rank_runs(others)) < len(runs):
        return f"{len(rs)} ranks [all but {_runs_text(rank_runs(others))}]"
    return f"{len(rs)} ranks [{_runs_text(runs)}]"


def groups_text(groups: list[list[int]], most: int = 3) -> str:
    """Process groups by their ranks, the first `most` and how many more ("[0, 1], [0, 2]")."""
    text = ", ".join(str(g) for g in groups[:most])
    return text + (f" and {len(groups) - most} more" if len(groups) > most else "")


def ranks_listed(ranks: Iterable[int]) -> str:
    """'rank(s) 2, 5' (up to SPELLED ranks, in the order given), else as `ranks_phrase`."""
    given = list(ranks)
    return f"rank(s) {', '.join(map(str, given))}" if len(given) <= SPELLED else ranks_phrase(given)
