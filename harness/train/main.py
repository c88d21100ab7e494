"""`python -m harness.train` / `torchrun ... -m harness.train`: run one lab workload.

Parse and validate the config (exit 2 before any process group on a bad value), build the
workload, wrap it, train under the profiler, then write run.json and print the per-rank table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from harness.collect.watch_log import watch_line
from harness.paths import RUN_FILE, run_file, scalars_dir, steps_path, watch_path
from harness.scalars import ScalarWriter
from harness.train import flight
from harness.train.cli import fail_config, parse_config
from harness.train.config import ConfigError, LaunchEnv, TrainConfig, resolve_environment
from harness.train.parallel import build_optimizer, destroy_process_group, init_process_group, pick_device, wrap_model
from harness.train.profiling import TraceRecorder
from harness.train.run_info import RunIdentity, agree_identity, check_output, gather, host_name, write_run_json
from harness.train.run_status import RankStatus, Terminated, raise_on_sigterm, sigterm_deferred
from harness.train.stats import StepLog, format_rank_table, step_statistics
from harness.train.trainer import Trainer, build_loader
from harness.train.watch import Watch
from harness.train.workloads import build_workload
from harness.write_faults import FaultLog

PROG = "harness.train"


def configure(argv: list[str] | None) -> tuple[TrainConfig, LaunchEnv]:
    try:
        env = LaunchEnv.from_environ()
        cfg = resolve_environment(parse_config(argv, PROG), env)
        check_output(cfg.output)
    except ConfigError as exc:
        fail_config(PROG, exc)
    return cfg, env


def train(cfg: TrainConfig, env: LaunchEnv) -> None:
    device = pick_device(env)
    if cfg.speed.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    recorder_on = env.distributed and cfg.parallel.flight_recorder > 0
    if recorder_on:
        flight.enable(cfg.parallel.flight_recorder, cfg.parallel.backend)
    init_process_group(cfg.parallel, env, device)
    ident = agree_identity(cfg, env)
    if recorder_on:
        flight.point_nccl_dumps(ident.dir, cfg.parallel.backend)
    host = host_name()
    workload = build_workload(cfg.workload, cfg.data, env.rank)
    model = wrap_model(workload.model, cfg.parallel, cfg.speed, device)
    # Profiler-side outputs never stop training: their write failures are said once and recorded.
    faults = FaultLog(rank=env.rank)
    scalars = ScalarWriter(scalars_dir(ident.dir, env.rank), faults=faults) if cfg.output.scalars else None
    trainer = Trainer(cfg=cfg, model=model, optimizer=build_optimizer(model, cfg.workload.optimizer, cfg.speed),
                      workload=workload, loader=build_loader(workload, cfg, device), device=device, rank=env.rank,
                      host=host, scalars=scalars)
    metadata = {"run_id": ident.run_id, "run_name": ident.name, "attempt": ident.attempt, "rank": env.rank,
                "local_rank": env.local_rank,
                "world_size": env.world_size, "host": host, "mode": cfg.workload.mode,
                "parallel": cfg.parallel.parallel}
    log = StepLog(steps_path(ident.dir, env.rank), faults)
    status = RankStatus(ident.dir, rank=env.rank, host=host, attempt=ident.attempt, faults=faults)
    rec = TraceRecorder(cfg.profiler, run_dir=ident.dir, rank=env.rank, host=host, cuda=device.type == "cuda",
                        metadata=metadata, faults=faults)
    built: Watch | None = None
    try:
        # Inside the try: connecting the watch's group talks to every peer and can fail like a
        # collective (a dead peer, the wrong network interface, SIGTERM meanwhile).
        built = Watch(cfg, rank=env.rank, world_size=env.world_size, host=host, cpu=device.type == "cpu",
                      run_dir=ident.dir, recorder=rec, scalars=scalars, faults=faults)
        with rec:
            trainer.run(rec, log, built)
    except BaseException as exc:
        with sigterm_deferred():  # torchrun's SIGTERM after a peer failed must not cut this short
            if built:
                built.close()
            _close_outputs(log, scalars, faults)
            state = "hung" if flight.is_timeout(exc) else "failed"
            where = {"step": trainer.progress.step, "phase": trainer.progress.phase}
            dump = None
            if recorder_on:
                dump = flight.write_dump(ident.dir, rank=env.rank, world_size=env.world_size,
                                         backend=cfg.parallel.backend, reason=_dump_reason(state, exc),
                                         progress=trainer.progress, host=host, faults=faults)
            status.end(state, _last_step(log), exc, tracing=_tracing(rec, faults), where=where,
                       flight=str(dump.relative_to(ident.dir)) if dump else None)
        raise
    watch: Watch = built
    watch.close()
    _close_outputs(log, scalars, faults)
    status.end("finished", _last_step(log), tracing=_tracing(rec, faults))
    row = {"rank": env.rank, "local_rank": env.local_rank, "host": host, **step_statistics(log.records),
           "final_loss": trainer.last_loss, "traces": [p.name for p in rec.written if p.exists()],
           "trace_summaries": [p.name for p in rec.summaries], "trace_summary_s": round(rec.summary_s, 3),
           "steps_file": str(log.path.relative_to(ident.dir)), "skipped_windows": rec.skipped,
           "unwritten_step_records": log.unwritten, "write_failures": _failures(faults)}
    rows = gather(row)
    if env.rank == 0:
        try:
            path: Path | None = write_run_json(ident, cfg, env, device, rows, watch.summary())
        except OSError as exc:
            faults.report(RUN_FILE, exc, "the per-rank table below is the run's only summary", run_file(ident.dir))
            path = None
        report(ident, rows, path, watch.summary())


def _close_outputs(log: StepLog, scalars: ScalarWriter | None, faults: FaultLog) -> None:
    """Write what waits in memory; say what could not be written at all."""
    if not log.close():
        faults.note(f"{log.unwritten} step record(s) could not be written to {log.path}; the run's summary "
                    "(run.json, the table) still counts them")
    if scalars and not scalars.close():
        faults.note(f"TensorBoard scalars could not all be written to {scalars.path}")


def _failures(faults: FaultLog) -> list[dict]:
    """Each distinct write failure once: {what, reason, count}."""
    counts: dict[tuple[str, str], int] = {}
    for e in faults.events:
        counts[(e["what"], e["reason"])] = counts.get((e["what"], e["reason"]), 0) + 1
    return [{"what": w, "reason": r, "count": n} for (w, r), n in counts.items()]


def _tracing(rec: TraceRecorder, faults: FaultLog) -> dict:
    return {**rec.tracing, "write_failures": _failures(faults)}


def _dump_reason(state: str, exc: BaseException) -> str:
    """Why a rank dumps its Flight Recorder, in a few words: `hung` (a collective timed out),
    `terminated` (a signal), or `failed: <exception type>`."""
    if isinstance(exc, (Terminated, KeyboardInterrupt)):
        return "terminated"
    return state if state == "hung" else f"failed: {type(exc).__name__}"


def _last_step(log: StepLog) -> int | None:
    return log.records[-1].get("step") if log.records else None


def report(ident: RunIdentity, rows: list[dict], run_json: Path | None, watch: dict[str, Any] | None = None) -> None:
    n_traces = sum(len(r["traces"]) for r in rows)
    print(f"\n{PROG}: run {ident.name} finished ({len(rows)} rank(s), steady state, warm-up excluded)")
    print(format_rank_table(rows))
    print(f"traces:  {ident.dir}/ ({n_traces} file(s), one per rank per profiler window)")
    n_summaries = sum(len(r.get("trace_summaries", [])) for r in rows)
    if n_summaries:
        worst_s = max(r.get("trace_summary_s", 0.0) for r in rows)
        print(f"summaries: {n_summaries} in-job trace summaries (<trace>.summary.json; condensing took at most "
              f"{worst_s:.2f} s on a rank); the collector reads them instead of the traces")
    for r in rows:
        for w in r.get("skipped_windows", []):
            windows = f"window {w['first']}" if w["first"] == w["last"] else f"windows {w['first']}-{w['last']}"
            print(f"skipped: rank {r['rank']} trace {windows}: {w['reason']}")
        if r.get("unwritten_step_records"):
            print(f"skipped: rank {r['rank']}: {r['unwritten_step_records']} step record(s) not on disk")
    print(f"steps:   {ident.dir}/steps/rank<R>.jsonl")
    if watch and watch["every"]:
        print(f"watch:   {watch_line(watch)} ({watch_path(ident.dir)})")
    print(f"run:     {run_json or 'not written (see the warnings above)'}")
    if len(rows) > 1:
        print(f"who waits for whom: python -m harness.collect {ident.dir}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    cfg, env = configure(argv)
    raise_on_sigterm()
    clean = False
    try:
        train(cfg, env)
        clean = True
    finally:
        destroy_process_group(clean_exit=clean)
    if clean and env.distributed:
        # Every output is written and closed by now. Interpreter teardown of a gloo/Kineto
        # process sometimes aborts in a C++ destructor ("terminate called without an active
        # exception", ~1 run in 16 here), turning a successful run into a torchrun failure; so
        # a clean distributed run leaves without running those destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
