"""What a parsed rank keeps, compacted (compact.py, model.compact): the same values as the dicts and
lists it replaces, read, compared, pickled (parsing workers) and written (summaries) the same."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from harness.traces.model import CommOp, RankTrace, Shared, Step, StepCover, compact
from harness.traces.read.compact import Named, Pieces, RankValues
from harness.traces.read.summary import read_summary, write_summary


def test_a_named_reads_as_the_dict_it_was_made_from() -> None:
    d = {"op:gemm": 4.5, "op:relu": 0.25, "idle (waiting on the host)": 7.0}
    n = Named.of(d)
    assert n == d and d == n and dict(n) == d
    assert list(n) == list(d) and list(n.items()) == list(d.items()) and list(n.values()) == list(d.values())
    assert len(n) == 3 and len(n.items()) == 3 and ("op:relu", 0.25) in n.items()
    assert n["op:relu"] == 0.25 and n.get("op:none", 0.0) == 0.0 and "op:gemm" in n
    with pytest.raises(KeyError):
        n["op:none"]
    assert n != {**d, "op:gemm": 4.0} and Named.of({}) == {}
    back = pickle.loads(pickle.dumps(n))
    assert back == d and back.names == n.names


def test_named_times_of_the_same_names_share_one_tuple_and_one_copy_of_each_name() -> None:
    strings: dict[str, str] = {}
    tuples: dict[tuple, tuple] = {}
    a = Named.of({"".join(["op:", "gemm"]): 1.0, "idle": 2.0}, tuples, strings)
    b = Named.of({"".join(["op:", "gemm"]): 3.0, "idle": 4.0}, tuples, strings)
    c = Named.of({"idle": 4.0, "op:gemm": 3.0}, tuples, strings)  # other order: its own tuple
    assert a.names is b.names and c.names is not a.names and c.names[1] is a.names[0]
    assert b == {"op:gemm": 3.0, "idle": 4.0} and list(c) == ["idle", "op:gemm"]


def test_pieces_read_as_the_list_of_intervals() -> None:
    ivs = [(0.0, 1.5), (2.0, 2.25), (10.0, 11.0)]
    p = Pieces.of(ivs)
    assert p == ivs and ivs == p and list(p) == ivs and len(p) == 3
    assert p[0] == (0.0, 1.5) and p[-1] == (10.0, 11.0) and p[1:] == ivs[1:]
    with pytest.raises(IndexError):
        p[3]
    assert p != ivs[:2] and p != [(0.0, 1.5), (2.0, 2.5), (10.0, 11.0)] and Pieces.of([]) == []
    assert pickle.loads(pickle.dumps(p)) == ivs


def _rank(r: int) -> RankTrace:
    kernel = "".join(["void gemm<float, 128>", "(int)"])  # built at run time: a new string each call
    cover = StepCover(
        lo_us=0.0,
        hi_us=10.0,
        window_us=10.0,
        compute_us=4.0,
        memcpy_us=0.0,
        overlapped_us=1.0,
        busy_us=8.0,
        compute_in_comm=[(5.0, 6.0)],
        idle=[(8.0, 10.0)],
        work_end_us=6.0,
    )
    return RankTrace(
        rank=r,
        world_size=2,
        host="node0",
        run_id=None,
        device="gpu",
        steps=[Step(number=1, start_us=0.0, end_us=10.0, compute_by_name_us={kernel: 4.0, "x": 0.5}, cover=cover)],
        comms=[
            CommOp(
                name="allreduce",
                pg="0",
                start_us=5.0,
                end_us=9.0,
                thread=(1, 7),
                step=1,
                run_up_start_us=0.0,
                run_up_us={"op:" + kernel: 4.0, "idle": 1.0},
            )
        ],
    )


def test_a_compacted_rank_is_written_read_and_shifted_as_before(tmp_path: Path) -> None:
    plain, shared = _rank(0), Shared()
    small = compact(_rank(0), shared)
    other = compact(_rank(1), shared)
    assert isinstance(small.comms[0].run_up_us, Named) and isinstance(small.steps[0].cover.idle, Pieces)
    assert small.comms[0].thread is other.comms[0].thread
    assert small.comms[0].run_up_us.names is other.comms[0].run_up_us.names
    assert small == plain  # the same values, compared as mappings and sequences
    a, b = write_summary(plain, tmp_path / "a.summary.json"), write_summary(small, tmp_path / "b.summary.json")
    assert a.read_bytes() == b.read_bytes()
    assert read_summary(b).steps[0].cover.compute_in_comm == [(5.0, 6.0)]
    moved = small.shifted(2.5)
    assert moved.steps[0].cover.idle == [(5.5, 7.5)] and moved.steps[0].cover.compute_in_comm == [(2.5, 3.5)]
    assert moved == plain.shifted(2.5)


def test_rank_values_read_as_the_dict_in_the_order_of_their_index() -> None:
    index = {3: 0, 1: 1, 2: 2}
    d = {2: 0.5, 3: 1.5, 1: 2.5}  # any order in, the index's order out
    v = RankValues.of(d, index)
    assert v == d and d == v and list(v) == [3, 1, 2] and list(v.values()) == [1.5, 2.5, 0.5]
    assert list(v.items()) == [(3, 1.5), (1, 2.5), (2, 0.5)] and len(v) == 3 and 1 in v and 0 not in v
    assert v[1] == 2.5 and v.get(0, -1.0) == -1.0 and sum(v.values()) == 4.5
    with pytest.raises(KeyError):
        v[0]
    back = pickle.loads(pickle.dumps(v))
    assert back == d and list(back) == [3, 1, 2]
    w = RankValues.of({3: 0.0, 1: 0.0, 2: 0.0}, index)
    assert w.index is v.index and w != v
