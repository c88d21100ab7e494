"""Two torchrun agents x 1 process on loopback with --nnodes 2 and a c10d rendezvous.

Each agent runs in its own UTS namespace with its own host name (where `unshare` is allowed),
so the two "nodes" are told apart by host name exactly as on a real cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import TRACE_METADATA_KEY, status_path

from jobs import QUICK, REPO, Run, free_port, fresh_run_owed, load_trace

pytestmark = pytest.mark.slow


def _can_unshare() -> bool:
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


def launch_two_nodes(log_dir: Path, hosts: list[str], run_name: str) -> tuple[bool, str]:
    """Both agents of one job; (whether both exited 0, both outputs and the ranks' statuses). A
    rank that died in native code gets the job one fresh run (jobs.fresh_run_owed)."""
    ok, told = _launch_two_nodes_once(log_dir, hosts, run_name)
    if not ok and fresh_run_owed("launch_two_nodes", told, log_dir / run_name):
        ok, told = _launch_two_nodes_once(log_dir, hosts, run_name)
    teardown_only = (
        not ok
        and "RendezvousConnectionError" in told
        and all(
            s.exists() and json.loads(s.read_text())["state"] == "finished"
            for s in (status_path(log_dir / run_name, r) for r in (0, 1))
        )
    )
    if teardown_only:
        print(f"torchrun teardown race after every rank finished:\n{told}", file=sys.stderr)
    assert ok or teardown_only, told
    return ok, told


def _launch_two_nodes_once(log_dir: Path, hosts: list[str], run_name: str) -> tuple[bool, str]:
    port = free_port()
    procs = []
    for node_rank, host in enumerate(hosts):
        env = dict(
            os.environ,
            NNODES="2",
            NODE_RANK=str(node_rank),
            NPROC_PER_NODE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            LOCAL_ADDR="127.0.0.1",
            RDZV_ID=f"test-{port}",
            TORCHRUN=str(Path(sys.executable).with_name("torchrun")),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            "bash",
            "launch/multinode.sh",
            "--mode",
            "comm",
            "--table-rows",
            "4000",
            *QUICK,
            "--log-dir",
            str(log_dir),
            "--run-name",
            run_name,
        ]
        if hosts[0] != hosts[1]:
            cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    statuses = [status_path(log_dir / run_name, r) for r in (0, 1)]
    told = "\n".join(
        f"--- node {i} (exit {p.returncode}) ---\n{out[-4000:]}" for i, (p, out) in enumerate(zip(procs, outputs))
    )
    told += "\n" + "\n".join(f"{s}: {s.read_text() if s.exists() else 'missing'}" for s in statuses)
    # torchrun's c10d rendezvous store lives in one of the two agents; once, in a CI run, an agent
    # still polling it after the other had gone failed with RendezvousConnectionError. That is
    # the launcher's teardown, not the job: launch_two_nodes accepts it where every rank finished.
    return all(p.returncode == 0 for p in procs), told


def test_two_nodes_on_loopback(log_dir: Path) -> None:
    hosts = ["nodea", "nodeb"] if _can_unshare() else [socket.gethostname()] * 2
    launch_two_nodes(log_dir, hosts, "mn")  # both exited 0, or only the launcher's teardown failed

    run = Run(proc=None, dir=log_dir / "mn")  # type: ignore[arg-type]
    info = run.run_json
    assert info["world_size"] == 2 and info["parallel"] == "ddp"
    assert info["hosts"] == sorted(set(hosts))
    traces = run.traces()
    assert len(traces) == 2
    for rank, path in enumerate(traces):
        meta = load_trace(path)[TRACE_METADATA_KEY]
        row = info["ranks"][rank]
        assert meta["rank"] == rank and meta["host"] == row["host"]
        assert path.name.startswith(f"rank{rank:05d}-{row['host']}.")
        assert len(run.steps(rank)) == 8
    if hosts[0] != hosts[1]:
        assert {r["host"] for r in info["ranks"]} == set(hosts)
