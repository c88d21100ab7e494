"""Two torchrun agents x 1 process on loopback with --nnodes 2 and a c10d rendezvous.

Each agent runs in its own UTS namespace with its own host name (where `unshare` is allowed),
so the two "nodes" are told apart by host name exactly as on a real cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import TRACE_METADATA_KEY

from conftest import QUICK, REPO, Run, free_port, load_trace

pytestmark = pytest.mark.slow


def _can_unshare() -> bool:
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


def test_two_nodes_on_loopback(log_dir: Path) -> None:
    port = free_port()
    hosts = ["nodea", "nodeb"] if _can_unshare() else [socket.gethostname()] * 2
    procs = []
    for node_rank, host in enumerate(hosts):
        env = dict(os.environ, NNODES="2", NODE_RANK=str(node_rank), NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LOCAL_ADDR="127.0.0.1", RDZV_ID=f"test-{port}",
                   TORCHRUN=str(Path(sys.executable).with_name("torchrun")), OMP_NUM_THREADS="1")
        cmd = ["bash", "launch/multinode.sh", "--mode", "comm", "--table-rows", "4000", *QUICK,
               "--log-dir", str(log_dir), "--run-name", "mn"]
        if hosts[0] != hosts[1]:
            cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-5000:]

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
