"""A rank-0 live watch without a process group: tests hand it the other ranks' side of the
exchange by overriding the gather they need (`_all_gather`, `_all_gather_object`)."""

from __future__ import annotations

from pathlib import Path

from harness.run.profiling import TraceRecorder
from harness.train.config import build_config
from harness.watch.exchange import Watch
from harness.write_faults import FaultLog


class GrouplessWatch(Watch):
    """Rank 0's watch of a 40-step DDP job judged every 4 steps, on as if every rank had joined:
    one rank per entry of `hosts` (rank -> host name); `warmup_steps` None keeps the config's."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        hosts: dict[int, str],
        warmup_steps: int | None = None,
        cpu: bool = False,
        capture: bool = False,
    ) -> None:
        cfg = build_config(
            [
                {
                    "watch": {"every": 4, "capture_on_straggler": capture},
                    "workload": {"steps": 40},
                    "parallel": {"parallel": "ddp"},
                }
            ]
        )
        rec = TraceRecorder(cfg.profiler, run_dir=tmp_path, rank=0, host=hosts[0], cuda=False, metadata={})
        super().__init__(
            cfg.watch,
            steps=cfg.workload.steps,
            warmup_steps=cfg.workload.warmup_steps if warmup_steps is None else warmup_steps,
            parallel="ddp",
            collective_timeout_s=600.0,
            rank=0,
            world_size=len(hosts),
            host=hosts[0],
            cpu=cpu,
            run_dir=tmp_path,
            recorder=rec,
            scalars=None,
            faults=FaultLog(rank=0),
        )
        self.on, self.hosts = True, hosts
