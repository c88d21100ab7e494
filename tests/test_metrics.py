"""Always-on Prometheus metrics (harness/run/metrics.py): a real 2-rank torchrun job on loopback
whose endpoints are scraped over HTTP while it runs, with an injected straggler and the watch on;
the textfile variant read back the same way; the naming rules and a port already in use."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.run.metrics import Metrics, MetricsTarget, rank_file
from harness.write_faults import FaultLog

from jobs import REPO, harness_cmd, job_env

pytestmark = pytest.mark.timing


def samples(text: str) -> dict[str, float]:
    """`name{rank=..}` (`name{rank=..,phase=..}` for a phase's) -> value for every sample; the
    labels run, local_rank and host dropped."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            phase = f",phase={s.labels['phase']}" if "phase" in s.labels else ""
            out[f"{s.name}{{rank={s.labels.get('rank')}{phase}}}"] = s.value
    return out


def free_port_pair() -> int:
    """A port P with P and P + 1 both free on loopback (each local rank serves on P + local rank)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two free consecutive ports")


def scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return samples(resp.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.mark.slow
def test_every_rank_is_scraped_while_it_runs_and_the_straggler_is_flagged(tmp_path: Path) -> None:
    """2 ranks, rank 1 sleeping 40 ms in its data phase every step, the watch every 5 steps:
    both endpoints answer during the run, their step counters move, and the straggler flag is
    set on rank 1's endpoint only; after the run each rank's textfile holds its final values."""
    port = free_port_pair()
    prom = tmp_path / "textfiles" / "harness.prom"
    prom.parent.mkdir()
    args = ["--mode", "torch", "--steps", "120", "--warmup-steps", "5", "--watch-every", "5", "--no-profile"]
    args += ["--slow-rank", "1", "--slow-ms", "40", "--slow-phase", "data"]
    # the default address (every interface), as the README shows it: scraped on loopback
    args += ["--metrics-port", str(port), "--metrics-file", str(prom)]
    cmd = harness_cmd(args, tmp_path / "logs", run_name="metrics")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(), cwd=REPO)
    seen: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for rank in (0, 1):
                got = scrape(port + rank)
                if got is not None:
                    seen[rank].append(got)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    for rank in (0, 1):
        steps = [s.get(f"harness_steps_total{{rank={rank}}}") for s in seen[rank]]
        moving = sorted({v for v in steps if v is not None})
        assert len(moving) >= 2, (rank, moving)  # the counter moved while it was scraped
        assert all(s[f"harness_step_last_seconds{{rank={rank}}}"] > 0 for s in seen[rank] if steps[0])
    flagged = [s["harness_watch_straggler{rank=1}"] for s in seen[1]]
    assert 1.0 in flagged, flagged
    assert all(s["harness_watch_straggler{rank=0}"] == 0.0 for s in seen[0])
    assert any(s.get("harness_phase_last_seconds{rank=1,phase=data}", 0) >= 0.04 for s in seen[1])
    # The textfiles: one per rank, their final state.
    for rank in (0, 1):
        final = samples((prom.parent / f"harness.rank{rank}.prom").read_text())
        assert final[f"harness_steps_total{{rank={rank}}}"] == 120
        assert final[f"harness_watch_straggler{{rank={rank}}}"] == (1.0 if rank == 1 else 0.0)
        assert final[f"harness_watch_intervals_total{{rank={rank}}}"] >= 10
        assert final[f"harness_tracing_recording{{rank={rank}}}"] == 0.0
        # the run's own counts, read when the file is written (--no-profile: no window)
        assert final[f"harness_tracing_windows_written{{rank={rank}}}"] == 0.0
        assert final[f"harness_write_failures{{rank={rank}}}"] == 0.0
    assert list(prom.parent.glob("*.tmp*")) == []  # rewritten atomically: no temporary file left


def test_rank_files_are_named_per_rank() -> None:
    assert rank_file("/m/harness.prom", 3, 1, 8) == Path("/m/harness.rank3.prom")
    assert rank_file("/m/harness.prom", 0, 0, 1) == Path("/m/harness.prom")
    assert rank_file("/m/r{rank}-{local_rank}.prom", 5, 1, 8) == Path("/m/r5-1.prom")


def test_a_port_in_use_is_one_line_and_the_rank_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The port taken: one warning line, no endpoint, and the metrics still go to the file."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        labels = {"run": "r", "rank": "0", "local_rank": "0", "host": "h"}
        m = Metrics.start(
            labels, MetricsTarget(port=port, addr="127.0.0.1", file=tmp_path / "m.prom"), FaultLog(rank=0)
        )
        m.step({"step": 0, "step_ms": 12.0, "data_ms": 2.0, "phases_ms": {"data": 2.0, "forward": 10.0}, "samples": 6})
        m.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot serve on 127.0.0.1:{port}" in err[0] and "goes on" in err[0], err
    final = samples((tmp_path / "m.prom").read_text())
    assert final["harness_steps_total{rank=0}"] == 1
    assert final["harness_throughput_samples_per_second{rank=0}"] == 500.0
    assert final["harness_data_wait_seconds{rank=0}"] == 0.002


def test_a_port_past_the_last_one_is_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    """PORT + local_rank past 65535 (a high --metrics-port on an 8-GPU node): one line, no endpoint."""
    labels = {"run": "r", "rank": "7", "local_rank": "7", "host": "h"}
    m = Metrics.start(labels, MetricsTarget(port=65535 + 7, addr="127.0.0.1", file=None), FaultLog(rank=7))
    m.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot serve on 127.0.0.1:65542" in err[0], err


def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    from harness.run.run_config import load_run_config

    cfg = load_run_config(environ={})
    assert cfg.output.metrics_port is None and cfg.output.metrics_file is None
    cfg = load_run_config(options={"metrics_port": 9400}, environ={"HARNESS_METRICS_FILE": str(tmp_path / "x.prom")})
    assert cfg.output.metrics_port == 9400 and cfg.output.metrics_file == str(tmp_path / "x.prom")


def test_the_grafana_dashboard_reads_only_metrics_the_ranks_export() -> None:
    """Every metric a panel queries is one a rank exports (a renamed metric breaks its panel),
    and the panels the issue asks for are there."""
    import json
    import re

    dash = json.loads((REPO / "launch" / "grafana-dashboard.json").read_text())
    m = Metrics(
        {"run": "r", "rank": "0", "local_rank": "0", "host": "h"}, MetricsTarget(None, "", None), FaultLog(rank=0)
    )
    # a GPU rank's full record (glibc's heap fields too), a judged watch interval, a traced window:
    # every series a rank can export
    full = {"step": 0, "step_ms": 12.0, "data_ms": 2.0, "outside_step_ms": 0.1, "phases_ms": {"data": 2.0}}
    full |= {"samples": 8, "rss_bytes": 1, "gpu_peak_allocated_bytes": 1, "gpu_peak_reserved_bytes": 1}
    full |= {"heap_in_use_bytes": 1, "heap_free_bytes": 1}
    m.step(full | {"host_cpu_util_pct": 1.0, "proc_cpu_pct": 1.0, "profiler": "record"})
    m.watch(1.0, True, 2.0)
    m.tracing_source = lambda: (1, 0, 0)
    exported = {s.name for family in m.registry.collect() for s in family.samples} | {
        f.name for f in m.registry.collect()
    }
    queried = {
        name for p in dash["panels"] for t in p["targets"] for name in re.findall(r"\b(harness_[a-z_]+)\b", t["expr"])
    }
    assert queried and queried <= exported, queried - exported
    titles = " ".join(p["title"] for p in dash["panels"])
    for needed in ("Step time per rank", "Straggler flag", "memory", "Phases, stacked"):
        assert needed in titles


def test_a_summarized_window_gives_syncs_and_launches_per_step(tmp_path: Path) -> None:
    """With --trace-summary, each window's parsed rank sets the syncs, their device cost and the
    launches per step: here a real DLRM GPU trace's, their means over its steps."""
    from harness.traces.read.parse import parse_trace

    from jobs import REAL_TRACES

    trace = parse_trace(REAL_TRACES / "dlrm_8rank_v100" / "worker0_step_12.1694128201545.pt.trace.json.gz")
    labels = {"run": "r", "rank": "0", "local_rank": "0", "host": "h"}
    m = Metrics(labels, MetricsTarget(None, "", tmp_path / "m.prom"), FaultLog(rank=0))
    m.window(trace)
    m.close()
    got = samples((tmp_path / "m.prom").read_text())
    n = len(trace.steps)
    assert n > 0
    assert got["harness_trace_syncs_per_step{rank=0}"] == sum(s.syncs for s in trace.steps) / n
    assert got["harness_trace_launches_per_step{rank=0}"] == sum(s.launches for s in trace.steps) / n > 0
    assert got["harness_trace_sync_cost_seconds{rank=0}"] == sum(s.sync_cost_us for s in trace.steps) / n / 1e6
