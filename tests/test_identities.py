"""The accounting identities (tests/identities.py) over every trace at hand: the real
third-party GPU traces in tests/data/traces, the device-queue simulator's jobs, and hand-built
traces. (The real-run tests check them on their own runs' reports.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_device_timeline import gpu_bound, sync_loop

from harness.report.document import build_report
from harness.report.records import as_document
from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.run_analysis import Analysis, analyze

from devicesim import Sim, write_all
from identities import check_report, check_spans
from jobs import REAL_TRACES
from tracebuild import gpu_docs, ring_docs, write


def analysed(paths: list[Path]) -> Analysis:
    return analyze(group_ranks([parse_trace(p) for p in paths]))


def check(paths: list[Path]) -> Analysis:
    a = analysed(paths)
    check_spans(a)
    check_report(as_document(build_report(a, [str(p) for p in paths])))
    return a


SETS = {
    "dlrm_8rank_v100": ["dlrm_8rank_v100"],
    "hta_trace_filter_2of128": ["hta_trace_filter_2of128"],
    **{
        p: [f"hta_single_rank/{p}"]
        for p in (
            "torchrec_a100_rank0of16.json.gz",
            "nccl_data_a100_rank0of2.json.gz",
            "df_index_resolver_v100_rank1of2.json.gz",
        )
    },
}


@pytest.mark.parametrize("name", sorted(SETS))
def test_identities_on_real_gpu_traces(name: str) -> None:
    where = REAL_TRACES / SETS[name][0]
    paths = sorted(where.glob("*.gz")) if where.is_dir() else [where]
    check(paths)


def test_the_torchrec_trace_reads_without_double_counting() -> None:
    """The real TorchRec rank: its main stream runs a step behind the host (155-162 ms) while
    side streams prefetch for later steps. Windows of each step's own work would overlap and
    count the other step's kernels as idle (step 550: compute 67.0 + idle 237.7 + exposed 55.8 +
    copies 11.8 ms in a 209.7 ms step). Its spans follow the main stream: 216.29, 215.57, 216.52,
    216.21, 212.51 ms, each adding up, step 550's busy 75.09 ms (the union of every kernel, copy
    and memset in it) and idle 141.20."""
    path = REAL_TRACES / "hta_single_rank" / "torchrec_a100_rank0of16.json.gz"
    a = check([path])
    rows = sorted(a.overlap, key=lambda o: o.step)
    assert [o.window_us / 1e3 for o in rows] == pytest.approx([216.289, 215.568, 216.517, 216.211, 212.515], abs=1e-3)
    first = rows[0]
    assert first.step == 550
    assert first.idle_us / 1e3 == pytest.approx(141.198, abs=1e-3)
    assert (first.window_us - first.idle_us) / 1e3 == pytest.approx(75.091, abs=1e-3)
    lags = [(s.cover.lo_us - s.start_us) / 1e3 for s in a.traces[0].steps]
    assert all(155 < lag < 163 for lag in lags)


def simulated() -> dict[str, Sim]:
    straggling = Sim(world_size=3)
    for r in range(3):
        h = straggling.rank(r)
        for n in range(1, 5):
            with h.step(n):
                if r == 2:
                    h.sleep(3000.0 if n % 2 else 500.0)
                ks = [h.launch("ampere_sgemm_128x64_nn", 700.0) for _ in range(3)]
                h.collective("allreduce", 400.0, after=ks[0])
                h.collective("allreduce", 300.0, after=ks[2])
                h.launch("Memcpy HtoD (Pinned -> Device)", 50.0, kind="memcpy")
    return {
        "gpu-bound": gpu_bound(),
        "gpu-bound annotated": gpu_bound(annotations=True),
        "sync 30%": sync_loop(3000.0),
        "sync 1%": sync_loop(0.0, before_us=5000.0),
        "intermittent straggler, two buckets": straggling,
    }


@pytest.mark.parametrize("name", sorted(simulated()))
def test_identities_on_simulated_jobs(name: str, tmp_path: Path) -> None:
    check(write_all(simulated()[name].run(), tmp_path))


@pytest.mark.parametrize(
    "docs",
    [
        gpu_docs(),
        gpu_docs(arrive1_us=2000.0, end_us=2200.0, period_us=3000.0),
        ring_docs(lambda r, s: 100.0 if r == 0 else 1000.0, 2, 2, period_us=1200.0),
        ring_docs(lambda r, s: 300.0 + 400.0 * (r == 3) * (s % 2), 8, 4),
    ],
    ids=["gpu", "gpu straggler", "ring victim", "ring intermittent"],
)
def test_identities_on_hand_built_traces(docs: list[dict], tmp_path: Path) -> None:
    check([write(tmp_path / f"rank{r}.pt.trace.json", d) for r, d in enumerate(docs)])
